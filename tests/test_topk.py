"""df.llm.topk: the k best rows by pairwise comparison, far fewer than n^2 calls."""

from __future__ import annotations

import random
import re

import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semframe import last_op
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend
from semframe.errors import InputError, RowErrors, TransientError
from semframe.operators.topk import TopkPlan


def value(request: Request, side: str) -> int:
    match = re.search(rf"^{side}\.n: (-?\d+)$", request.prompt, re.MULTILINE)
    assert match is not None
    return int(match.group(1))


def larger(request: Request) -> str:
    """A consistent comparator: the larger n is better."""
    return '{"answer": "B"}' if value(request, "B") > value(request, "A") else '{"answer": "A"}'


def test_top_k_best_first_with_index(fake: FakeBackend) -> None:
    fake.responder = larger
    values = list(range(200))
    random.Random(3).shuffle(values)
    df = pd.DataFrame({"n": values}, index=[f"row{v}" for v in values])
    # cache=False: a comparison repeated in a later round would come from the result cache.
    out = df.llm.topk("The largest number {n}", 5, backend="fake", cache=False)
    assert out["n"].tolist() == [199, 198, 197, 196, 195]
    assert list(out.index) == ["row199", "row198", "row197", "row196", "row195"]
    stats = last_op()
    assert stats is not None
    assert stats.counts["naive_comparisons"] == 200 * 199 // 2
    assert stats.counts["comparisons"] == stats.llm_calls == len(fake.history)
    assert stats.llm_calls < 4 * 200, "about 2n, not n^2"
    assert stats.relqueries == stats.counts["rounds"]


def test_pivot_leads_every_prompt_of_a_round(fake: FakeBackend) -> None:
    fake.responder = larger
    df = pl.DataFrame({"n": list(range(30))})
    plan = df.llm.plan("Largest {n}", op="topk", k=10, backend="fake")
    assert isinstance(plan, TopkPlan)
    assert len(plan.first.requests) == 29, "k = 10 of 30: a random pivot, no knockout"
    assert len(plan.first.groups) == 1, "one pivot: one prefix group"
    assert all(r.prompt.split("\n\n")[-1].startswith("A.n: ") for r in plan.first.requests)
    assert fake.history == []


def test_small_k_picks_its_pivot_by_knockout(fake: FakeBackend) -> None:
    fake.responder = larger
    df = pd.DataFrame({"n": list(range(400))})
    plan = df.llm.plan("Largest {n}", op="topk", k=2, backend="fake")
    assert isinstance(plan, TopkPlan)
    assert len(plan.first.requests) == 400 // (4 * 2) // 2, "first round of the knockout"
    out = df.llm.topk("Largest {n}", 2, backend="fake", cache=False)
    assert out["n"].tolist() == [399, 398]
    stats = last_op()
    assert stats is not None
    assert stats.llm_calls < 1.5 * 400
    # The pivot pass: 399 comparisons sharing one pivot as prefix.
    pivot_pass = max(stats.runs, key=lambda r: r.requests)
    assert pivot_pass.requests == 399
    assert pivot_pass.cached_share > 0.8


def test_polars_lazy_k_larger_than_n_and_empty(fake: FakeBackend) -> None:
    fake.responder = larger
    df = pl.DataFrame({"n": [3, 1, 2], "tag": ["c", "a", "b"]})
    out = df.llm.topk("Largest {n}", 10, backend="fake")
    assert out["tag"].to_list() == ["c", "b", "a"]
    lazy = df.lazy().llm.topk("Largest {n}", 2, backend="fake")
    assert isinstance(lazy, pl.LazyFrame)
    assert lazy.collect()["n"].to_list() == [3, 2]
    assert df.head(0).llm.topk("Largest {n}", 2, backend="fake").height == 0
    assert df.head(1).llm.topk("Largest {n}", 2, backend="fake")["n"].to_list() == [3]
    assert all(r.schema is not None for r in fake.history), "answers constrained to A/B"


def test_failed_comparisons_are_reported(fake: FakeBackend) -> None:
    def respond(request: Request) -> str:
        if value(request, "B") == 7:
            msg = "boom"
            raise TransientError(msg)
        return larger(request)

    fake.responder = respond
    df = pd.DataFrame({"n": [5, 7, 9, 1]})
    with pytest.raises(RowErrors) as info:
        df.llm.topk("Largest {n}", 2, backend="fake", max_retries=0)
    (error,) = info.value.errors
    assert (error.row, error.label) == (1, 1)
    assert 7 not in info.value.result["n"].tolist()
    kept = df.llm.topk("Largest {n}", 2, backend="fake", max_retries=0, errors="keep")
    assert kept["n"].tolist()[-1] == 7
    assert kept["llm_error"].notna().tolist() == [False] * (len(kept) - 1) + [True]


def test_bad_input(fake: FakeBackend) -> None:
    df = pd.DataFrame({"n": [1, 2]})
    for k in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="k must be a positive int"):
            df.llm.topk("Largest {n}", k, backend="fake")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="seed must be an int"):
        df.llm.topk("Largest {n}", 1, seed="x", backend="fake")  # type: ignore[arg-type]
    assert fake.history == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(st.integers(-50, 50), max_size=40),
    k=st.integers(1, 12),
    seed=st.integers(0, 5),
)
def test_matches_sorting_for_a_consistent_comparator(
    fake: FakeBackend, values: list[int], k: int, seed: int
) -> None:
    fake.responder = larger
    fake.history.clear()
    df = pd.DataFrame({"n": values})
    out = df.llm.topk("Largest {n}", k, seed=seed, backend="fake")
    assert out["n"].tolist() == sorted(values, reverse=True)[:k]
    assert set(out.index) <= set(df.index)
    assert len(fake.history) <= max(len(values) * (len(values) - 1) // 2, 0)
