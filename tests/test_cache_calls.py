"""Whole calls in the result cache: a re-run is served without ordering or rendering."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends.base import Completion, Usage
from semframe.backends.fake import FakeBackend
from semframe.cache.keys import Keys
from semframe.cache.store import FILENAME, ResultCache
from semframe.core.table import ArrowCells
from semframe.core.wire import Answered, Outcome, TokenLogprob, failed, values_of
from semframe.runtime.call import Recipe
from tests.conftest import digest

TEMPLATE = "Summarize {review} of {movie}"


@pytest.fixture(autouse=True)
def _fake_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMFRAME_BACKEND", "fake")


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many plans were built (ordered and rendered) during the test."""
    count = [0]
    original = Recipe.build

    def counting(self: Recipe) -> semframe.Plan:
        count[0] += 1
        return original(self)

    monkeypatch.setattr(Recipe, "build", counting)
    return count


def _frame(n: int = 30) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "movie": [f"movie {i % 4}" for i in range(n)],
            "review": [f"review {i}" for i in range(n)],
        },
        index=[f"id{(i * 7) % n}" for i in range(n)],  # not in sorted order
    )


def _cache_file() -> Path:
    return Path(semframe.config()["cache_dir"]) / FILENAME


def _stats() -> semframe.RunStats:
    stats = semframe.last_run()
    assert stats is not None
    return stats


def test_rerun_is_served_whole_without_planning(fake: FakeBackend, builds: list[int]) -> None:
    df = _frame()
    first = df.llm.map(TEMPLATE, out="s")
    hit_rate = _stats().expected_hit_rate
    assert (builds[0], len(fake.history)) == (1, 30)
    second = df.llm.map(TEMPLATE, out="s")
    assert (builds[0], len(fake.history)) == (1, 30), "neither planned nor sent"
    stats = _stats()
    assert (stats.rows, stats.requests, stats.cache_hits, stats.prompt_tokens) == (30, 0, 30, 0)
    assert stats.expected_hit_rate == hit_rate
    assert (stats.reorder, stats.backend) == ("ggr", "fake")
    assert pickle.dumps(first) == pickle.dumps(second)
    with ResultCache(_cache_file()) as cache:
        info = cache.info()
    assert (info.calls, info.by_model[0][3]) == (1, 30)


def test_a_rerun_turns_no_arrow_cell_into_a_python_string(
    fake: FakeBackend, builds: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrow string columns stay Arrow: only the fingerprint reads them, from their buffers."""
    df = _frame()
    assert all(str(t) == "str" for t in df.dtypes)  # pandas' Arrow-backed strings
    first = df.llm.map(TEMPLATE, out="s")
    read: list[str] = []
    original = ArrowCells.__getitem__

    def reading(self: ArrowCells, column: str) -> tuple[str, ...]:
        read.append(column)
        return original(self, column)

    monkeypatch.setattr(ArrowCells, "__getitem__", reading)
    second = df.llm.map(TEMPLATE, out="s")
    assert (builds[0], len(fake.history), read) == (1, 30, [])
    pd.testing.assert_frame_equal(first, second)
    third = df.assign(review=df["review"].str.replace("review 3", "review three")).llm.map(
        TEMPLATE, out="s"
    )
    assert sorted(set(read)) == ["movie", "review"], "a changed cell: planned, cells read"
    assert (builds[0], len(fake.history)) == (2, 31)
    assert third["s"].iloc[0] == first["s"].iloc[0]


def test_changed_cell_plans_again_and_sends_only_that_row(
    fake: FakeBackend, builds: list[int]
) -> None:
    df = _frame()
    df.llm.map(TEMPLATE)
    changed = df.copy()
    changed.iloc[5, 1] = "an entirely new review"
    out = changed.llm.map(TEMPLATE)
    assert builds[0] == 2
    assert len(fake.history) == 31
    assert "an entirely new review" in fake.history[-1].prompt
    assert (_stats().cache_hits, _stats().requests) == (29, 1)
    assert out.index.equals(df.index)
    changed.llm.map(TEMPLATE)  # now indexed too
    assert (builds[0], len(fake.history)) == (2, 31)


def test_missing_answer_falls_back_to_sending_just_that_row(
    fake: FakeBackend, builds: list[int]
) -> None:
    df = _frame()
    first = df.llm.map(TEMPLATE)
    with sqlite3.connect(_cache_file()) as db:
        (key,) = db.execute("SELECT key FROM results LIMIT 1").fetchone()
        db.execute("DELETE FROM results WHERE key = ?", (key,))
    again = df.llm.map(TEMPLATE)
    assert (builds[0], len(fake.history)) == (2, 31)
    assert (_stats().cache_hits, _stats().requests) == (29, 1)
    assert again.equals(first)
    df.llm.map(TEMPLATE)
    assert (builds[0], len(fake.history)) == (2, 31)


def test_a_rerun_serves_each_answer_as_it_was_parsed(fake: FakeBackend, builds: list[int]) -> None:
    """Free text stripped, records and cut answers kept: the same values as the first run."""
    fake.responder = lambda request: f"  answer to {request.row}\n"
    df = _frame(8)
    first = df.llm.map(TEMPLATE, out="s")
    assert first["s"].tolist() == [f"answer to {i}" for i in range(8)]
    assert df.llm.map(TEMPLATE, out="s").equals(first)
    fake.responder = lambda request: f'{{"title": "t{request.row}"}}'
    extracted = df.llm.extract("From {review}: {movie}", {"title": str})
    assert extracted["title"].tolist() == [f"t{i}" for i in range(8)]
    assert df.llm.extract("From {review}: {movie}", {"title": str}).equals(extracted)
    fake.responder = lambda request: f" kept {request.row}"
    brief = "Summarize {review} of {movie} briefly"
    kept = df.llm.map(brief, out="s", truncated="keep")
    assert df.llm.map(brief, out="s", truncated="keep").equals(kept)
    assert kept["s"].tolist() == [f"kept {i}" for i in range(8)]
    assert (builds[0], len(fake.history)) == (3, 24), "each call planned and sent once"


def test_a_rerun_reports_the_usage_its_rows_were_first_paid_for(
    fake: FakeBackend, builds: list[int]
) -> None:
    """Recorded with the call (sent and served rows), or summed row by row where it is not."""
    df = _frame(30)
    df.iloc[:20].llm.map(TEMPLATE, out="s")
    first = _stats()
    df.llm.map(TEMPLATE, out="s")  # 20 rows served, 10 sent
    mixed = _stats()
    assert (mixed.cache_hits, mixed.requests) == (20, 10)
    df.llm.map(TEMPLATE, out="s")
    recorded = _stats()
    assert (builds[0], recorded.requests, recorded.cache_hits) == (2, 0, 30)
    paid = [
        mixed.prompt_tokens + first.prompt_tokens,
        mixed.cached_tokens + first.cached_tokens,
        mixed.cache_write_tokens + first.cache_write_tokens,
        mixed.output_tokens + first.output_tokens,
    ]
    assert list(mixed.cache_saved_usage) == [
        first.prompt_tokens,
        first.cached_tokens,
        first.cache_write_tokens,
        first.output_tokens,
    ]
    assert paid[0] > 0 and list(recorded.cache_saved_usage) == paid
    with sqlite3.connect(_cache_file()) as db:  # an entry written before usage was recorded
        db.execute("UPDATE calls SET info = json_remove(info, '$.usage')")
    df.llm.map(TEMPLATE, out="s")
    summed = _stats()
    assert (builds[0], summed.cache_hits) == (2, 30), "still served whole"
    assert summed.cache_saved_usage == recorded.cache_saved_usage
    assert summed.cache_saved_dollars == recorded.cache_saved_dollars


def test_answer_that_no_longer_parses_is_not_replayed(fake: FakeBackend, builds: list[int]) -> None:
    df = _frame(6)
    first = df.llm.filter("Is {review} great?")
    with sqlite3.connect(_cache_file()) as db:
        db.execute("UPDATE results SET text = 'garbage'")
    out = df.llm.filter("Is {review} great?")
    assert len(fake.history) == 12
    assert builds[0] == 2
    assert out.equals(first)


@pytest.mark.parametrize(
    "variant",
    [
        {"template": "Summarize {review} about {movie}"},
        {"system": "Be brief."},
        {"max_tokens": 99},
        {"reorder": "none"},
        {"truncate": 5},
        {"examples": [{"review": "r", "movie": "m", "answer": "a"}]},
    ],
    ids=lambda v: next(iter(v)),
)
def test_anything_that_changes_the_requests_is_a_new_call(
    fake: FakeBackend, builds: list[int], variant: dict[str, object]
) -> None:
    df = _frame(8)
    df.llm.map(TEMPLATE)
    kwargs = dict(variant)
    template = str(kwargs.pop("template", TEMPLATE))
    df.llm.map(template, **kwargs)  # type: ignore[arg-type]
    assert builds[0] == 2
    assert _stats().requests > 0


def test_classify_confidences_replay(fake: FakeBackend, builds: list[int]) -> None:
    fake.set_logprobs(True)
    df = _frame(10)
    labels = ["good", "bad"]
    first = df.llm.classify("Is {review} good or bad?", labels, confidence=True)
    assert all(r.logprobs for r in fake.history)
    second = df.llm.classify("Is {review} good or bad?", labels, confidence=True)
    assert (builds[0], len(fake.history)) == (1, 10)
    assert second.equals(first)
    assert second["label_confidence"].notna().all()
    # without confidences the requests differ (no logprobs asked): a new call
    df.llm.classify("Is {review} good or bad?", labels)
    assert (builds[0], len(fake.history)) == (2, 20)


def test_polars_rerun_is_served_whole(fake: FakeBackend, builds: list[int]) -> None:
    df = pl.from_pandas(_frame(12).reset_index(drop=True))
    first = df.llm.map(TEMPLATE)
    second = df.llm.map(TEMPLATE)
    assert (builds[0], len(fake.history)) == (1, 12)
    assert second.equals(first)


def test_sampled_calls_are_not_indexed(fake: FakeBackend) -> None:
    df = _frame(5)
    df.llm.map(TEMPLATE, temperature=0.7)
    df.llm.map(TEMPLATE, temperature=0.7)
    assert len(fake.history) == 10
    with ResultCache(_cache_file()) as cache:
        assert cache.info().calls == 0


def test_clear_removes_call_entries(fake: FakeBackend, builds: list[int]) -> None:
    df = _frame(5)
    df.llm.map(TEMPLATE)
    with ResultCache(_cache_file()) as cache:
        assert cache.info().calls == 1
        cache.clear()
        assert cache.info().calls == 0
    df.llm.map(TEMPLATE)
    assert (builds[0], len(fake.history)) == (2, 10)


def test_eviction_takes_call_entries_least_recently_used_first(tmp_path: Path) -> None:
    now = [1000.0]
    fake = FakeBackend()
    with ResultCache(tmp_path / "c.sqlite", max_mib=0.1, clock=lambda: now[0]) as cache:
        cache.put_call("old call", ["ab" * 32] * 1000, {})  # ~32 kB
        now[0] += 1
        cache.put_call("new call", ["cd" * 32] * 10, {})
        for i in range(9):
            now[0] += 1
            cache.put(digest(f"k{i}"), fake, Completion(0, "x" * 10_000, Usage(1, 0, 0, 1)))
        cache.flush()
        assert cache.get_call("old call") is None, "the least recently used went first"
        found = cache.get_call("new call")
        assert found is not None
        assert found[0] == ["cd" * 32] * 10
        assert cache.info().bytes <= 0.1 * 2**20


@settings(max_examples=25, deadline=None)
@given(
    order=st.lists(st.integers(0, 199), min_size=0, max_size=200, unique=True).map(
        lambda picked: [*picked, *(i for i in range(200) if i not in set(picked))]
    ),
    again=st.integers(0, 300),
)
def test_a_call_entry_gathered_in_row_order_is_the_taken_keys(
    tmp_path_factory: pytest.TempPathFactory, order: list[int], again: int
) -> None:
    """Keys written a chunk at a time from plan order read back as the keys taken in row order.

    The entry of a call that already has one (a longer or shorter one) is replaced whole.
    """
    keys = Keys.of([digest(str(i)) for i in range(200)])
    at = np.array(order, dtype=np.int64)
    stored = []
    for gathered in (True, False):
        path = tmp_path_factory.mktemp("c") / FILENAME
        with ResultCache(path, clock=lambda: 5.0) as cache:
            cache.put_call("call", [digest("x")] * again, {})
            if gathered:
                cache.put_call("call", keys, {"batch": False}, order=at)
            else:
                cache.put_call("call", keys.take(at), {"batch": False})
            assert cache.call_entry("call") == (keys.take(at).joined(), {"batch": False})
        with sqlite3.connect(path) as db:
            stored.append(db.execute("SELECT * FROM calls").fetchall())
            stored.append(db.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchall())
    assert stored[:2] == stored[2:], "the same entry and size as the keys taken first"


def test_rerun_under_budget_sends_nothing(fake: FakeBackend) -> None:
    df = _frame(6)
    first = df.llm.map(TEMPLATE, budget="5000 tokens")
    # The whole call would be over this budget, but every row is answered by the cache.
    second = df.llm.map(TEMPLATE, budget="10 tokens")
    assert len(fake.history) == 6
    assert second.equals(first)


def test_estimate_counts_only_rows_the_cache_cannot_answer(fake: FakeBackend) -> None:
    df = _frame(8)
    semframe.configure(reorder="none")  # a subset's prompts are then the same as in the whole
    full = df.llm.estimate(TEMPLATE)
    df.iloc[:3].llm.map(TEMPLATE)
    part = df.llm.estimate(TEMPLATE)
    assert (full.requests, part.requests) == (8, 5)
    assert 0 < part.tokens < full.tokens
    assert any("3 of 8 rows are answered by the result cache" in n for n in part.notes)
    assert df.llm.estimate(TEMPLATE, cache=False).requests == 8
    df.llm.map(TEMPLATE)
    done = df.llm.estimate(TEMPLATE)
    assert (done.requests, done.tokens) == (0, 0)
    assert len(fake.history) == 8, "estimating sends nothing"


def test_a_large_estimate_probes_the_cache_before_looking_every_key_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above PROBE_ABOVE requests: nothing stored among a fixed draw means nothing is looked up."""
    from semframe.runtime import call as call_module

    monkeypatch.setattr(call_module, "PROBE_ABOVE", 50)
    monkeypatch.setattr(call_module, "PROBE_KEYS", 20)
    df = pd.DataFrame({"review": [f"review {i}" for i in range(200)]})
    kwargs: dict[str, Any] = {"op": "map", "backend": "fake", "cache_dir": str(tmp_path)}
    looked: list[int] = []
    plan_keys = call_module.plan_keys

    def counting(plan: Any, backend: Any) -> Any:
        looked.append(len(plan.requests))
        return plan_keys(plan, backend)

    monkeypatch.setattr(call_module, "plan_keys", counting)
    first = df.llm.estimate("Echo {review}", **kwargs)
    assert looked == [] and first.requests == 200  # an empty cache: no key computed but the draw
    df.iloc[:150].llm.map("Echo {review}", backend="fake", cache_dir=str(tmp_path), progress="off")
    looked.clear()
    second = df.llm.estimate("Echo {review}", **kwargs)
    assert looked == [200]  # the draw found stored answers: every key looked up
    assert second.requests == 50


def _last_used() -> list[float]:
    with sqlite3.connect(_cache_file()) as db:
        used = [row[0] for row in db.execute("SELECT last_used FROM results ORDER BY rowid")]
    db.close()
    return used


def _age_answers() -> None:
    """Mark every stored answer as last used long ago (past the touch threshold)."""
    with sqlite3.connect(_cache_file()) as db:
        db.execute("UPDATE results SET last_used = 0")
    db.close()


def test_a_rerun_marks_answers_unused_for_long_as_used(
    fake: FakeBackend, builds: list[int]
) -> None:
    """Served answers last used over an hour ago are touched, so that LRU eviction keeps them."""
    df = _frame()
    df.llm.map(TEMPLATE)
    _age_answers()
    df.llm.map(TEMPLATE)  # replayed whole
    assert (builds[0], _stats().cache_hits) == (1, 30)
    assert min(_last_used()) > 0


def test_a_partly_cached_call_marks_the_answers_it_serves_as_used(
    fake: FakeBackend, builds: list[int]
) -> None:
    df = _frame()
    df.llm.map(TEMPLATE)
    _age_answers()
    changed = df.copy()
    changed.iloc[3, 1] = "a review never seen"
    changed.llm.map(TEMPLATE)  # planned again: 29 rows served, one sent
    assert (builds[0], _stats().cache_hits, _stats().requests) == (2, 29, 1)
    used = _last_used()
    assert len(used) == 31 and sum(u == 0 for u in used) == 1  # the changed row's old answer


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=5), st.booleans()), max_size=8),
    st.integers(-10, 10),
    st.integers(-10, 10),
)
def test_answered_reads_as_the_outcomes_it_holds(
    rows: list[tuple[str, bool]], start: int, stop: int
) -> None:
    """Indexing, slicing and iterating an Answered give the Outcomes of its columns."""
    values = [text.strip() for text, _ in rows]
    raws = [text for text, _ in rows]
    tokens = [(TokenLogprob(t, -0.5),) if lp else None for t, lp in rows]
    answered = Answered(values, raws, tokens if any(lp for _, lp in rows) else None)
    expected = [
        Outcome(v, r, None, None, 0, lp if answered.logprobs is not None else None)
        for v, r, lp in zip(values, raws, tokens, strict=True)
    ]
    assert list(answered) == expected
    assert [answered[i] for i in range(-len(rows), len(rows))] == expected + expected
    assert answered[start:stop] == expected[start:stop]
    assert values_of(answered) == values == values_of(expected)
    assert failed(answered) == [] == failed(expected)
