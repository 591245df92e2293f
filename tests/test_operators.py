"""df.llm.map / filter / plan on pandas and Polars, with the fake backend."""

from __future__ import annotations

import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend
from semframe.core.table import fence, unfence
from semframe.errors import RowErrors
from tests.conftest import prompt_fields

REORDERS = ["none", "stats", "ggr"]


def echo_id(request: Request) -> str:
    """Answer with the row's own 'key' value, so misplaced answers are caught."""
    return "answer for " + prompt_fields(request.prompt)["key"]


@pytest.mark.parametrize("reorder", REORDERS)
def test_map_pandas_keeps_order_and_index(fake: FakeBackend, reorder: str) -> None:
    fake.responder = echo_id
    df = pd.DataFrame(
        {"key": ["k3", "k1", "k2", "k0"], "movie": ["B", "A", "B", "A"]},
        index=pd.Index(["z", "y", "y", 7], dtype=object),
    )
    out = df.llm.map("Say {key} about {movie}", out="said", backend="fake", reorder=reorder)
    assert list(out.index) == ["z", "y", "y", 7]
    assert out["said"].tolist() == [f"answer for {k}" for k in df["key"]]
    assert df.columns.tolist() == ["key", "movie"], "the input frame is not modified"


@pytest.mark.parametrize("reorder", REORDERS)
def test_map_polars_and_lazy(fake: FakeBackend, reorder: str) -> None:
    fake.responder = echo_id
    df = pl.DataFrame({"key": ["b", "a", "c"], "g": [1, 1, 2]})
    out = df.llm.map("Say {key} {g}", out="said", backend="fake", reorder=reorder)
    assert isinstance(out, pl.DataFrame)
    assert out["said"].to_list() == ["answer for b", "answer for a", "answer for c"]
    lazy = df.lazy().llm.map("Say {key} {g}", out="said", backend="fake", reorder=reorder)
    assert isinstance(lazy, pl.LazyFrame)
    assert lazy.collect().equals(out)


def test_multiindex_and_empty_and_one_row(fake: FakeBackend) -> None:
    fake.responder = echo_id
    idx = pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)])
    df = pd.DataFrame({"key": ["x", "y", "x"]}, index=idx)
    out = df.llm.map("Say {key}", backend="fake")
    assert out.index.equals(idx)
    assert out["llm_output"].tolist() == ["answer for x", "answer for y", "answer for x"]
    empty = df.iloc[:0].llm.map("Say {key}", backend="fake")
    assert len(empty) == 0
    assert "llm_output" in empty.columns
    assert df.iloc[:0].llm.filter("Is {key} ok?", backend="fake").empty
    assert (
        pl.DataFrame({"key": []}, schema={"key": pl.String})
        .llm.filter("Is {key} ok?", backend="fake")
        .height
        == 0
    )
    one = df.iloc[[1]].llm.map("Say {key}", backend="fake")
    assert one["llm_output"].tolist() == ["answer for y"]


def test_filter_pandas_and_polars_agree(fake: FakeBackend) -> None:
    reviews = ["a great film", "dull and long", "I loved it", "meh", "excellent cast"]
    pdf = pd.DataFrame({"review": reviews, "n": range(5)}, index=[10, 3, 3, 1, 0])
    kept = pdf.llm.filter("Is {review} positive?", backend="fake")
    assert kept.index.tolist() == [10, 3, 0]
    assert kept["n"].tolist() == [0, 2, 4]
    pol = pl.DataFrame({"review": reviews, "n": list(range(5))})
    assert pol.llm.filter("Is {review} positive?", backend="fake")["n"].to_list() == [0, 2, 4]


def test_only_named_fields_are_sent_unaltered(fake: FakeBackend) -> None:
    df = pd.DataFrame(
        {
            "title": ["Alien: Covenant", "Heat\nmulti-line"],
            "secret": ["do not send", "nor this"],
            "year": [1979, 1995],
        }
    )
    df.llm.map("About {title} from {year}", backend="fake", reorder="none")
    assert len(fake.history) == 2
    for request, (_, row) in zip(fake.history, df.iterrows(), strict=True):
        assert "do not send" not in request.prompt and "nor this" not in request.prompt
        body = request.prompt.split("\n\n", 1)[1]
        # a multi-line value is fenced (continuation lines indented), its text unaltered
        assert body == f"title: {fence(row['title'])}\nyear: {row['year']}\n"
        assert unfence(body.split("\nyear: ")[0][len("title: ") :]) == row["title"]
        assert request.prompt.startswith("About [title] from [year]")


def test_instructions_come_first_and_are_shared(fake: FakeBackend) -> None:
    df = pd.DataFrame({"m": ["x", "y", "x"], "r": ["1", "2", "3"]})
    df.llm.filter(
        "Is {r} about {m} good?",
        backend="fake",
        system="You grade reviews.",
        examples=[{"m": "q", "r": "fine", "answer": "yes"}],
    )
    prompts = [r.prompt for r in fake.history]
    head = prompts[0].split("\n\n")[0]
    assert all(p.startswith(head) for p in prompts)
    assert "Example:\nr: fine\nm: q\nanswer: yes" in prompts[0]
    assert all(r.system == "You grade reviews." for r in fake.history)
    assert all(r.schema is not None for r in fake.history)


def test_plan_explain(fake: FakeBackend) -> None:
    df = pd.read_csv("https://example.invalid" if False else _movies_path(), nrows=40)
    plan = df.llm.plan("Is {review_content} positive about {movie_title}?", op="filter")
    assert len(plan.requests) == 40
    text = plan.explain()
    assert "prefix groups" in text and "expected prefix reuse" in text
    assert "review_content" in text
    assert fake.history == [], "plan() sends nothing"
    assert sum(len(g) for g in plan.groups) == 40


def _movies_path() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parent / "data" / "movies_slice.csv")


def test_parse_errors_are_reported_not_defaulted(fake: FakeBackend) -> None:
    df = pd.DataFrame({"r": ["good", "bad", "great"]}, index=["a", "b", "c"])
    # Row 'b' answers nonsense twice (first try + one parse retry): an error, not "no".
    fake.responder = lambda req: "perhaps" if "bad" in req.prompt else '{"answer": "yes"}'
    with pytest.raises(RowErrors) as info:
        df.llm.filter("Is {r} good?", backend="fake", reorder="none")
    err = info.value
    assert [(e.row, e.label, e.kind, e.attempts) for e in err.errors] == [(1, "b", "parse", 2)]
    assert "perhaps" in err.errors[0].message
    assert err.result.index.tolist() == ["a", "b", "c"]
    assert err.result["llm_error"].isna().tolist() == [True, False, True]
    kept = df.llm.filter("Is {r} good?", backend="fake", errors="keep")
    assert kept.index.tolist() == ["a", "b", "c"]
    stats = semframe.last_run()
    assert stats is not None and stats.errors == 1


def test_transient_failures_are_retried_then_reported(fake: FakeBackend) -> None:
    from semframe.backends.fake import flaky

    df = pd.DataFrame({"key": ["a", "b", "c"]})
    fake.responder = flaky(echo_id, {0: 2, 2: 10})
    with semframe.using(max_retries=2):
        out = df.llm.map("Say {key}", backend="fake", errors="keep", reorder="none")
    assert out["llm_output"].tolist() == ["answer for a", "answer for b", None]
    assert out["llm_output_error"].isna().tolist() == [True, True, False]
    assert "injected failure" in out["llm_output_error"][2]
    stats = semframe.last_run()
    assert stats is not None
    assert stats.errors == 1
    assert stats.retries == 2 + 2
    assert stats.requests == 3 + 2 + 2


def test_run_stats_after_every_call(fake: FakeBackend) -> None:
    df = pd.DataFrame({"m": ["x"] * 5, "r": list("abcde")})
    out = df.llm.map("Summarize {r} of {m}", backend="fake")
    assert isinstance(out, pd.DataFrame)
    stats = semframe.last_run()
    assert stats is not None
    assert (stats.rows, stats.requests, stats.errors) == (5, 5, 0)
    assert stats.prompt_tokens > 0 and stats.output_tokens > 0
    assert 0 < stats.cached_tokens < stats.prompt_tokens
    assert "5 rows" in repr(stats)


# ---- properties -------------------------------------------------------------------


@st.composite
def frames(draw: st.DrawFn) -> pd.DataFrame:
    n = draw(st.integers(0, 25))
    keys = [f"k{i}" for i in range(n)]
    groups = draw(st.lists(st.sampled_from(["A", "B", "C", ""]), min_size=n, max_size=n))
    nums = draw(
        st.lists(
            st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-(2**53), 2**53)),
            min_size=n,
            max_size=n,
        )
    )
    index = draw(
        st.one_of(
            st.just(pd.RangeIndex(n)),
            st.lists(st.sampled_from([0, 1, "x", 2.5]), min_size=n, max_size=n).map(
                lambda v: pd.Index(v, dtype=object)
            ),
            st.permutations(list(range(n))).map(pd.Index),
        )
    )
    return pd.DataFrame({"key": keys, "g": groups, "num": nums}, index=index)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(df=frames(), reorder=st.sampled_from(REORDERS), concurrency=st.sampled_from([1, 3]))
@example(
    df=pd.DataFrame({"key": ["k0", "k1"], "g": ["A", "A"], "num": [1, 1]}, index=[5, 5]),
    reorder="ggr",
    concurrency=3,
)
def test_results_come_back_in_original_order(
    df: pd.DataFrame, reorder: str, concurrency: int
) -> None:
    backend = FakeBackend(echo_id, max_concurrency=concurrency)
    from semframe.backends import register_backend

    register_backend("fake", lambda model, settings: backend)
    try:
        # Examples share one cache directory; every example must reach the backend.
        out = df.llm.map("{g} {num} {key}", backend="fake", reorder=reorder, cache=False)
        history = list(backend.history)
        as_polars = pl.DataFrame(
            {c: [None if v != v else v for v in df[c].tolist()] for c in df.columns},
            strict=False,
        )
        polars_out = as_polars.llm.map(
            "{g} {num} {key}", backend="fake", reorder=reorder, cache=False
        )
    finally:
        register_backend("fake", "semframe.backends.fake:create")
    assert out.index.equals(df.index)
    assert out["llm_output"].tolist() == [f"answer for {k}" for k in df["key"]]
    assert polars_out["llm_output"].to_list() == out["llm_output"].tolist()
    # every request carries exactly its row's values
    sent = sorted((prompt_fields(r.prompt)["key"], prompt_fields(r.prompt)["g"]) for r in history)
    assert sent == sorted(zip(df["key"], df["g"], strict=True))
    assert sorted(r.row for r in history) == list(range(len(df)))
