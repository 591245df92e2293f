"""A Polars LazyFrame in, a LazyFrame out: the operator runs at ``collect()``, once.

Each test counts what reaches the fake backend (``fake.history``) and how
often the plan above the call runs (:func:`counted`), before and after
``collect()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend, default_answer
from semframe.core import frames
from semframe.core.frames import NewColumn, Output
from semframe.core.table import Table
from semframe.errors import (
    BudgetExceeded,
    ColumnError,
    ConfigError,
    InputError,
    RowErrors,
    SemframeError,
)
from semframe.operators import registry
from semframe.operators.common import compile_call
from semframe.operators.lazy import LAZY_OPERATORS, ProbeRunner, deferrable
from tests.conftest import prompt_fields

ENGINES: list[dict[str, Any]] = [{}, {"engine": "streaming"}]
"""``collect()`` keyword arguments: the in-memory engine and the streaming one."""

REVIEWS = ["a great film", "dull", "I loved it", "boring", "great fun", "meh"]


class Counter:
    """How often, and on how many rows, the plan above an operator call ran."""

    def __init__(self) -> None:
        self.heights: list[int] = []

    def __call__(self, frame: pl.DataFrame) -> pl.DataFrame:
        self.heights.append(frame.height)
        return frame


def counted(data: dict[str, list[Any]]) -> tuple[pl.LazyFrame, Counter]:
    """A LazyFrame of ``data`` whose plan counts its runs (``Counter.heights``)."""
    lf = pl.LazyFrame(data)
    counter = Counter()
    return (
        lf.map_batches(
            counter,
            schema=lf.collect_schema(),
            predicate_pushdown=False,
            projection_pushdown=False,
            slice_pushdown=False,
            streamable=False,
        ),
        counter,
    )


@pytest.fixture
def invocations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(operator, rows) of every eager run of the driver: what ``collect()`` ran."""
    seen: list[tuple[str, int]] = []
    eager = registry.invoke

    def spy(name: str, frame: Any, template: str, **kwargs: Any) -> Any:
        if isinstance(frame, pl.DataFrame):
            seen.append((name, frame.height))
        return eager(name, frame, template, **kwargs)

    monkeypatch.setattr(registry, "invoke", spy)
    return seen


def fail_on(*bad: str) -> Callable[[Request], str]:
    """The fake model's answers, empty (a row error) for the reviews in ``bad``."""

    def answer(request: Request) -> str:
        empty = prompt_fields(request.prompt).get("review") in bad
        return "" if empty else default_answer(request)

    return answer


CALLS: dict[str, Callable[[Any], Any]] = {
    "map": lambda f: f.llm.map("Say {review}", out="said", backend="fake"),
    "filter": lambda f: f.llm.filter("Is {review} positive?", backend="fake"),
    "extract": lambda f: f.llm.extract(
        "Read {review}", {"stars": int, "why": str, "score": float, "good": bool}, backend="fake"
    ),
    "classify": lambda f: f.llm.classify("Mood of {review}", ["up", "down"], backend="fake"),
    "agg": lambda f: f.llm.agg("Sum up {review}", by="n", out="summary", backend="fake"),
    "topk": lambda f: f.llm.topk("Best {review}", 2, backend="fake"),
    "join": lambda f: f.llm.join(
        pl.DataFrame({"tag": ["x", "y"]}), "Does {review} fit {tag}?", backend="fake"
    ),
}
"""One call of every deferred built-in operator."""


def data() -> dict[str, list[Any]]:
    return {"review": REVIEWS, "n": [1, 2, 1, 2, 1, 3]}


def test_the_built_in_deferred_operators_are_the_llm_ones() -> None:
    assert set(CALLS) == LAZY_OPERATORS
    assert not any(deferrable(n, None) for n in ("search", "sim_join", "dedup", "cluster"))


@pytest.mark.parametrize("engine", ENGINES, ids=["in-memory", "streaming"])
@pytest.mark.parametrize("op", sorted(CALLS))
def test_nothing_runs_at_the_call_and_collect_runs_it_once(
    fake: FakeBackend, invocations: list[tuple[str, int]], op: str, engine: dict[str, Any]
) -> None:
    lazy, counter = counted(data())
    out = CALLS[op](lazy)
    assert isinstance(out, pl.LazyFrame)
    assert fake.history == [], "nothing is sent at the call"
    assert counter.heights == [], "the input's plan does not run at the call"
    assert invocations == []

    result = out.collect(**engine)
    assert counter.heights == [6], "the input's plan ran once"
    assert invocations == [(op, 6)], "the operator ran once, on the whole input"
    assert fake.history, "the relQuery ran at collect()"
    assert result.equals(CALLS[op](pl.DataFrame(data()))), "as the eager call gives"
    assert result.schema == out.collect_schema()


def test_streaming_never_gives_the_operator_a_batch(
    fake: FakeBackend, invocations: list[tuple[str, int]]
) -> None:
    lazy = pl.LazyFrame({"review": [f"review {i}" for i in range(200)]})
    streamable_calls = []

    def batch(frame: pl.DataFrame) -> pl.DataFrame:
        streamable_calls.append(frame.height)
        return frame

    with pl.Config(streaming_chunk_size=10):
        # The control: a streamable function is given batches under these settings.
        lazy.map_batches(batch, streamable=True).collect(engine="streaming")
        out = lazy.llm.map("Say {review}", backend="fake").collect(engine="streaming")
    assert len(streamable_calls) > 1
    assert invocations == [("map", 200)]
    assert len(fake.history) == 200
    assert out["llm_output"].to_list() == [f"fake: review {i}" for i in range(200)]


def test_composes_with_lazy_steps_before_and_after(
    fake: FakeBackend, invocations: list[tuple[str, int]]
) -> None:
    lazy, counter = counted(data())
    out = (
        lazy.filter(pl.col("n") < 3)
        .with_columns(review=pl.col("review").str.to_uppercase())
        .llm.map("Say {review}", out="said", backend="fake")
        .llm.filter("Is {said} positive?", backend="fake")
        .with_columns(chars=pl.col("said").str.len_chars())
        .select("said", "chars")
        .sort("chars")
    )
    assert out.collect_schema() == pl.Schema({"said": pl.String, "chars": pl.UInt32})
    assert fake.history == []
    result = out.collect()
    assert counter.heights == [6]
    assert invocations == [("map", 5), ("filter", 5)]
    assert result.rows() == [
        ("fake: GREAT FUN", 15),
        ("fake: I LOVED IT", 16),
        ("fake: A GREAT FILM", 18),
    ]


def test_steps_after_the_call_do_not_change_what_is_sent(fake: FakeBackend) -> None:
    out = pl.LazyFrame(data()).llm.map("Say {review}", backend="fake")
    head = out.filter(pl.col("n") == 3).head(1).select("llm_output").collect()
    assert head["llm_output"].to_list() == ["fake: meh"]
    assert len(fake.history) == 6, "every row is sent: filter before the call to send fewer"


def test_each_collect_runs_it_again(fake: FakeBackend) -> None:
    out = pl.LazyFrame(data()).llm.map("Say {review}", backend="fake", cache=False)
    first, second = out.collect(), out.collect()
    assert first.equals(second)
    assert len(fake.history) == 12


OPTIONS: dict[str, Callable[[Any], Any]] = {
    "map keep": lambda f: f.llm.map(
        "Say {review}", backend="fake", errors="keep", truncated="keep"
    ),
    "filter keep": lambda f: f.llm.filter(
        "Is {review} good?", backend="fake", errors="keep", truncated="keep"
    ),
    "extract keep": lambda f: f.llm.extract(
        "Read {review}", {"tags": list[str], "year": int | None}, backend="fake", errors="keep"
    ),
    "classify multi confidence": lambda f: f.llm.classify(
        "Mood of {review}", ["up", "down"], multi=True, confidence=True, backend="fake"
    ),
    "classify confidence": lambda f: f.llm.classify(
        "Mood of {review}", ["up", "down"], out="mood", confidence=True, backend="fake"
    ),
    "agg overall keep": lambda f: f.llm.agg(
        "Sum up {review}", backend="fake", errors="keep", truncated="keep"
    ),
    "topk keep": lambda f: f.llm.topk("Best {review}", 3, backend="fake", errors="keep"),
    "join keep": lambda f: f.llm.join(
        pl.DataFrame({"review": ["x"], "n": [1.5]}),
        "{left.review} vs {right.review}",
        backend="fake",
        errors="keep",
        suffix="_r",
    ),
    "cascade": lambda f: f.llm.filter(
        "Is {review} good?",
        cascade=[{"backend": "fake", "model": "small", "samples": 3}, "fake/big"],
        thresholds=[0.9],
    ),
}
"""Calls whose result has more than the plain new column."""


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_the_schema_is_the_result_s_before_anything_runs(fake: FakeBackend, option: str) -> None:
    fake.set_logprobs(-0.1)
    lazy = OPTIONS[option](pl.LazyFrame(data()))
    schema = lazy.collect_schema()
    assert fake.history == []
    eager = OPTIONS[option](pl.DataFrame(data()))
    assert schema == eager.schema
    assert lazy.collect().equals(eager)


def test_new_columns_have_their_dtypes(fake: FakeBackend) -> None:
    fake.set_logprobs(-0.1)
    lazy = pl.LazyFrame(data())
    extract = lazy.llm.extract(
        "Read {review}",
        {"stars": int, "why": str, "score": float, "good": bool, "tags": list[str]},
        backend="fake",
    )
    assert dict(extract.collect_schema()) == {
        "review": pl.String,
        "n": pl.Int64,
        "stars": pl.Int64,
        "why": pl.String,
        "score": pl.Float64,
        "good": pl.Boolean,
        "tags": pl.List(pl.String),
    }
    classify = lazy.llm.classify(
        "Mood of {review}",
        ["up", "down"],
        out="mood",
        confidence=True,
        backend="fake",
        truncated="keep",
    )
    assert dict(classify.collect_schema()) == {
        "review": pl.String,
        "n": pl.Int64,
        "mood": pl.String,
        "mood_confidence": pl.Float64,
        "mood_truncated": pl.Boolean,
    }
    assert fake.history == []


def test_bad_input_fails_at_the_call_before_anything_runs(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    lazy, counter = counted(data())
    with pytest.raises(ColumnError, match="'film'"):
        lazy.llm.map("Say {film}", backend="fake")
    with pytest.raises(InputError, match="max_tokens"):
        lazy.llm.map("Say {review}", max_tokens=0, backend="fake")
    with pytest.raises(InputError, match="overwrite"):
        lazy.llm.map("Say {review}", out="n", backend="fake")
    with pytest.raises(ConfigError, match="reorder"):
        lazy.llm.filter("Is {review} good?", backend="fake", reorder="best")
    with pytest.raises(SemframeError):
        lazy.llm.classify("Mood of {review}", [], backend="fake")
    with pytest.raises(SemframeError):
        lazy.llm.extract("Read {review}", {"stars": complex}, backend="fake")
    with pytest.raises(InputError, match="k must be"):
        lazy.llm.topk("Best {review}", 0, backend="fake")
    with pytest.raises(ColumnError):
        lazy.llm.agg("Sum up {review}", by="film", backend="fake")
    with pytest.raises(InputError, match="probe"):
        lazy.llm.map("Say {review}", probe=-1, backend="fake")
    with pytest.raises(InputError, match="logprobs"):  # the fake backend gives none
        lazy.llm.classify("Mood of {review}", ["up", "down"], confidence=True, backend="fake")
    with pytest.raises(ColumnError):  # a column of the lazy right frame
        lazy.llm.join(pl.LazyFrame({"tag": ["x"]}), "{review} {label}", backend="fake")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        lazy.llm.map("Say {review}", backend="openai", model="gpt-4.1-mini")
    with pytest.raises(ConfigError, match="unknown backend"):
        lazy.llm.map("Say {review}", backend="opnai")
    assert fake.history == []
    assert counter.heights == [], "the checks read the schema only"


def test_a_later_call_is_checked_against_the_deferred_result_s_schema(
    fake: FakeBackend,
) -> None:
    said = pl.LazyFrame(data()).llm.map("Say {review}", out="said", backend="fake")
    said.llm.filter("Is {said} positive?", backend="fake")  # the new column is there
    with pytest.raises(ColumnError, match="'sayd'"):
        said.llm.filter("Is {sayd} positive?", backend="fake")
    assert fake.history == []


@pytest.mark.parametrize("engine", ENGINES, ids=["in-memory", "streaming"])
def test_row_errors_come_out_of_collect(fake: FakeBackend, engine: dict[str, Any]) -> None:
    fake.responder = fail_on("dull", "meh")
    out = pl.LazyFrame(data()).llm.map("Say {review}", backend="fake")
    with pytest.raises(RowErrors, match="2 rows failed") as info:
        out.collect(**engine)
    assert [e.row for e in info.value.errors] == [1, 5]
    assert "empty answer" in str(info.value)
    result = info.value.result
    assert isinstance(result, pl.DataFrame)
    assert result["review"].to_list() == REVIEWS
    assert result["llm_output"].is_null().to_list() == [False, True, False, False, False, True]


def test_errors_keep_gives_the_error_column_at_collect(fake: FakeBackend) -> None:
    fake.responder = fail_on("dull")
    out = pl.LazyFrame(data()).llm.filter("Is {review} good?", backend="fake", errors="keep")
    assert out.collect_schema()["llm_error"] == pl.String
    result = out.collect()
    assert result["review"].to_list() == ["a great film", "dull", "I loved it", "great fun"]
    assert result["llm_error"].is_null().to_list() == [True, False, True, True]


def test_a_polars_that_wraps_errors_is_told_what_was_lost(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frames, "errors_pass_through", lambda: False)
    fake.responder = fail_on("dull")
    out = pl.LazyFrame(data()).llm.map("Say {review}", backend="fake")
    # This Polars raises it as it is; one before 1.30 quotes it in a ComputeError.
    with pytest.raises(RuntimeError, match=r"^RowErrors: 1 row failed") as info:
        out.collect()
    message = str(info.value)
    assert "row 1 (label 1): parse error" in message
    assert "`.result`" in message
    assert "Polars 1.30" in message
    assert isinstance(info.value.__cause__, RowErrors)


def test_budget_is_checked_at_collect(fake: FakeBackend) -> None:
    out = pl.LazyFrame(data()).llm.map("Say {review}", backend="fake", budget="10 tokens")
    assert fake.history == []
    with pytest.raises(BudgetExceeded):
        out.collect()
    assert fake.history == [], "the estimate is over the budget: nothing is sent"


def test_last_run_reports_the_run_at_collect(fake: FakeBackend) -> None:
    pl.DataFrame({"review": ["x"]}).llm.map("Say {review}", backend="fake")
    before = semframe.last_run()
    assert before is not None and before.rows == 1
    out = pl.LazyFrame(data()).llm.filter("Is {review} good?", backend="fake")
    assert semframe.last_run() is before, "the call typing the result records nothing"
    out.collect()
    run = semframe.last_run()
    assert run is not None and run.rows == 6
    op = semframe.last_op()
    assert op is not None and op.op == "filter" and op.llm_calls == 6


def test_settings_are_those_in_force_at_the_call(fake: FakeBackend) -> None:
    with semframe.using(backend="fake", temperature=0.5):
        out = pl.LazyFrame(data()).llm.map("Say {review}")
    out.collect()  # outside the block: still its settings
    assert len(fake.history) == 6
    assert {r.temperature for r in fake.history} == {0.5}
    with semframe.using(temperature=0.25):
        pl.LazyFrame(data()).llm.map("Say {review}", backend="fake", cache=False).collect()
    assert {r.temperature for r in fake.history[6:]} == {0.25}


def test_a_lazy_right_frame_runs_at_collect(fake: FakeBackend) -> None:
    left, lcount = counted({"n": [1, 2, 3, 4]})
    right, rcount = counted({"m": [2, 3]})
    out = left.llm.join(right, "Does {m} divide {n}?", backend="fake")
    assert out.collect_schema() == pl.Schema({"n": pl.Int64, "m": pl.Int64})
    assert (lcount.heights, rcount.heights, fake.history) == ([], [], [])
    result = out.collect()
    assert (lcount.heights, rcount.heights) == ([4], [2])
    assert len(fake.history) == 8
    assert result.equals(
        pl.DataFrame({"n": [1, 2, 3, 4]}).llm.join(
            pl.DataFrame({"m": [2, 3]}), "Does {m} divide {n}?", backend="fake"
        )
    )


def test_plan_estimate_and_dry_run_collect_at_the_call(fake: FakeBackend) -> None:
    lazy, counter = counted(data())
    plan = lazy.llm.plan("Say {review}", backend="fake")
    assert len(plan.requests) == 6
    est = lazy.llm.map("Say {review}", backend="fake", dry_run=True)
    assert est.requests == 6
    assert lazy.llm.estimate("Say {review}", backend="fake").requests == 6
    assert counter.heights == [6, 6, 6]
    assert fake.history == []


def test_embedding_operators_collect_at_the_call(fake: FakeBackend) -> None:
    lazy, counter = counted({"t": ["red apple", "green apple", "fast car", "red car"]})
    out = lazy.llm.cluster("t", k=2, embed_model="tfidf")
    assert counter.heights == [4]
    assert isinstance(out, pl.LazyFrame)
    assert out.collect()["cluster"].to_list() == [0, 0, 1, 1]


class Shout:
    """A registered operator without an LLM: the text of a column in capitals."""

    name: str = "shout_lazy"
    required: tuple[str, ...] = ()
    lazy = True

    def compile(self, frame: Any, template: str, **kwargs: Any) -> Table:
        return frame.table([template])  # type: ignore[no-any-return]

    def plan(self, table: Table) -> None:
        return None

    def estimate(self, table: Table, *, probe: int) -> Any:
        raise NotImplementedError

    def run(self, table: Table, runner: Any) -> Output:
        loud = [v.upper() for v in table.cells[table.columns[0]]]
        return Output(columns=(NewColumn("loud", loud),))


@pytest.mark.parametrize("lazy", [True, False])
def test_a_registered_operator_is_deferred_when_it_says_so(
    monkeypatch: pytest.MonkeyPatch, lazy: bool
) -> None:
    operator = Shout()
    monkeypatch.setattr(operator, "lazy", lazy)
    monkeypatch.setitem(registry.OPERATORS, operator.name, operator)
    frame, counter = counted({"t": ["hi", "yo"]})
    out = frame.llm.shout_lazy("t")
    assert counter.heights == ([] if lazy else [2])
    assert out.collect_schema() == pl.Schema({"t": pl.String, "loud": pl.String})
    assert out.collect()["loud"].to_list() == ["HI", "YO"]


def test_the_probe_runner_sends_nothing_and_refuses_rows(fake: FakeBackend) -> None:
    runner = ProbeRunner("map")
    empty = pl.DataFrame({"t": []}, schema={"t": pl.String})
    assert runner.run(compile_call(empty, "{t}", op="map", backend="fake")) == []
    two = compile_call(pl.DataFrame({"t": ["a", "b"]}), "{t}", op="map", backend="fake")
    with pytest.raises(RuntimeError, match="2 row"):
        runner.run(two)
    assert runner.finish(rows=0).counts == {"rows": 0}
    assert semframe.last_op() is None
    assert fake.history == []


words = st.sampled_from(["a", "b", "great", "dull", "great fun", ""])


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.tuples(words, words, st.integers(-3, 3)), max_size=25),
    streaming=st.booleans(),
    reorder=st.sampled_from(["none", "stats", "ggr"]),
)
def test_order_and_rows_are_the_eager_call_s(
    fake: FakeBackend, rows: list[tuple[str, str, int]], streaming: bool, reorder: str
) -> None:
    frame = pl.DataFrame(
        {"a": [r[0] for r in rows], "b": [r[1] for r in rows], "k": [r[2] for r in rows]},
        schema={"a": pl.String, "b": pl.String, "k": pl.Int64},
    )
    engine: dict[str, Any] = {"engine": "streaming"} if streaming else {}
    for call in (
        lambda f: f.llm.map("Say {a} and {b}", backend="fake", reorder=reorder),
        lambda f: f.llm.filter("Is {a} {b} positive?", backend="fake", reorder=reorder),
    ):
        lazy = call(frame.lazy().filter(pl.col("k") != 0))
        eager = call(frame.filter(pl.col("k") != 0))
        assert lazy.collect(**engine).equals(eager)
