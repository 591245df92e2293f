"""df.llm.join: candidate pairs as one relQuery, blocking, order, shared prefixes."""

from __future__ import annotations

import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semframe import last_op
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend
from semframe.errors import ColumnError, InputError, RowErrors, TransientError
from tests.conftest import prompt_fields


def divides(request: Request) -> str:
    """Match when the left number divides the right one."""
    f = prompt_fields(request.prompt)
    yes = int(f["right.m"]) % int(f["left.n"]) == 0
    return '{"answer": "yes"}' if yes else '{"answer": "no"}'


LEFT = pd.DataFrame({"n": [3, 2, 5], "tag": ["x", "y", "z"]}, index=["a", "b", "c"])
RIGHT = pd.DataFrame({"m": [10, 6, 4, 9], "tag": ["x", "y", "y", "x"]})


def test_pairs_in_left_then_right_order(fake: FakeBackend) -> None:
    fake.responder = divides
    out = LEFT.llm.join(RIGHT, "Does {n} divide {m}?", backend="fake")
    pairs = [(i, j) for i in range(3) for j in range(4) if RIGHT.m[j] % LEFT.n.iloc[i] == 0]
    assert list(zip(out["n"], out["m"], strict=True)) == [
        (LEFT.n.iloc[i], RIGHT.m[j]) for i, j in pairs
    ]
    assert list(out.columns) == ["n", "tag", "m", "tag_right"]
    assert list(out.index) == list(range(len(pairs)))
    stats = last_op()
    assert stats is not None
    assert stats.counts == {"pairs": 12, "naive_pairs": 12}
    assert len(fake.history) == 12


def test_blocking_on_a_key(fake: FakeBackend) -> None:
    fake.responder = divides
    out = LEFT.llm.join(RIGHT, "Does {n} divide {m}?", on="tag", backend="fake", suffix="_r")
    assert list(zip(out["n"], out["m"], strict=True)) == [(3, 9), (2, 6), (2, 4)]
    assert len(fake.history) == 4, "only pairs with equal tags are asked"
    renamed = RIGHT.rename(columns={"tag": "label"})
    out2 = LEFT.llm.join(renamed, "Does {n} divide {m}?", on=[("tag", "label")], backend="fake")
    assert out2["m"].tolist() == [9, 6, 4]


def test_side_saving_more_characters_leads_the_prompt(fake: FakeBackend) -> None:
    left = pd.DataFrame({"n": [2, 3]})
    right = pd.DataFrame({"m": list(range(1, 21)), "long": ["x" * 50] * 20})
    # Each right row recurs in 2 pairs but carries 50+ characters; each left row
    # recurs in 20 pairs but carries one digit: leading with right saves more.
    plan = left.llm.plan("Does {n} divide {m} {long}?", op="join", other=right, backend="fake")
    assert plan.reorder == "right-first"
    assert len(plan.groups) == 20
    assert all(r.prompt.split("\n\n")[-1].startswith("right.m: ") for r in plan.requests)
    assert plan.expected_hit_rate > 0.5
    wide = pd.DataFrame({"n": [2, 3], "text": ["y" * 400, "z" * 400]})
    plan = wide.llm.plan("Does {n} {text} divide {m}?", op="join", other=right[["m"]])
    assert plan.reorder == "left-first"
    assert len(plan.groups) == 2
    assert all(r.prompt.split("\n\n")[-1].startswith("left.n: ") for r in plan.requests)
    plan = left.llm.plan("Does {n} divide {m} {long}?", op="join", other=right, reorder="none")
    assert plan.reorder == "left-first"
    assert fake.history == []


def test_polars_lazy_and_empty(fake: FakeBackend) -> None:
    fake.responder = divides
    left, right = pl.from_pandas(LEFT), pl.from_pandas(RIGHT)
    out = left.llm.join(right, "Does {n} divide {m}?", backend="fake")
    assert out.columns == ["n", "tag", "m", "tag_right"]
    assert out["m"].to_list() == [6, 9, 10, 6, 4, 10]
    lazy = left.lazy().llm.join(right.lazy(), "Does {n} divide {m}?", backend="fake")
    assert isinstance(lazy, pl.LazyFrame)
    assert lazy.collect().equals(out)
    empty = left.head(0).llm.join(right, "Does {n} divide {m}?", backend="fake")
    assert empty.columns == out.columns
    assert empty.height == 0
    assert len(LEFT.llm.join(RIGHT.head(0), "Does {n} divide {m}?", backend="fake")) == 0


def test_failed_pairs_are_reported(fake: FakeBackend) -> None:
    def respond(request: Request) -> str:
        if prompt_fields(request.prompt)["right.m"] == "6":
            msg = "boom"
            raise TransientError(msg)
        return divides(request)

    fake.responder = respond
    with pytest.raises(RowErrors) as info:
        LEFT.llm.join(RIGHT, "Does {n} divide {m}?", backend="fake", max_retries=0)
    assert [(e.row, e.label) for e in info.value.errors] == [
        (0, ("a", 1)),
        (1, ("b", 1)),
        (2, ("c", 1)),
    ]
    kept = LEFT.llm.join(
        RIGHT, "Does {n} divide {m}?", backend="fake", max_retries=0, errors="keep"
    )
    assert kept.loc[kept["m"] == 6, "llm_error"].str.contains("boom").all()
    assert kept.loc[kept["m"] != 6, "llm_error"].isna().all()


def test_bad_input(fake: FakeBackend) -> None:
    with pytest.raises(ColumnError, match=r"'tag' is in both frames; write \{left.tag\}"):
        LEFT.llm.join(RIGHT, "Is {tag} like {m}?", backend="fake")
    with pytest.raises(ColumnError, match="right frame has no column 'x'"):
        LEFT.llm.join(RIGHT, "Is {n} like {right.x}?", backend="fake")
    with pytest.raises(ColumnError, match="neither frame has"):
        LEFT.llm.join(RIGHT, "Is {n} like {q}?", backend="fake")
    with pytest.raises(ColumnError, match="on names 'nope'"):
        LEFT.llm.join(RIGHT, "Is {n} like {m}?", on="nope", backend="fake")
    with pytest.raises(InputError, match="same library"):
        LEFT.llm.join(pl.from_pandas(RIGHT), "Is {n} like {m}?", backend="fake")
    with pytest.raises(InputError, match="still leaves right columns"):
        LEFT.assign(tag_right=1).llm.join(RIGHT, "Is {n} like {m}?", backend="fake")
    assert fake.history == []


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ns=st.lists(st.integers(1, 6), max_size=8),
    ms=st.lists(st.integers(1, 30), max_size=8),
    reorder=st.sampled_from(["none", "ggr"]),
)
def test_join_equals_brute_force(
    fake: FakeBackend, ns: list[int], ms: list[int], reorder: str
) -> None:
    fake.responder = divides
    left = pd.DataFrame({"n": ns}, dtype="int64")
    right = pd.DataFrame({"m": ms}, dtype="int64")
    out = left.llm.join(right, "Does {n} divide {m}?", backend="fake", reorder=reorder)
    want = [(n, m) for n in ns for m in ms if m % n == 0]
    assert list(zip(out["n"], out["m"], strict=True)) == want
