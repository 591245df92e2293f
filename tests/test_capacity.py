"""Cache capacity: declared by each cost model, carried by the plan, said by ``explain``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest

from semframe.backends.fake import FakeBackend
from semframe.core.capacity import Capacity
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, fingerprint, make_plan
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.cost.models import AnthropicCost, BlockCost, OpenAICost, SlotCost
from semframe.errors import ConfigError


def _count(texts: Sequence[str]) -> list[int]:
    return [len(t) // 4 for t in texts]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tokens": 0},
        {"tokens": 64, "block": 0},
        {"tokens": 64, "concurrency": 0},
        {"tokens": True},
        {"tokens": 64, "block": 1.5},
    ],
)
def test_capacity_refuses_what_is_not_a_size(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="Capacity"):
        Capacity(**kwargs)  # type: ignore[arg-type]


def test_capacity_blocks_and_phrases() -> None:
    assert Capacity(100, block=16).blocks == 6
    assert Capacity(None).blocks is None
    assert Capacity(None, concurrency=1).describe() == (
        "one shared cache, unbounded, 1 request in flight"
    )
    assert Capacity(1000, concurrency=2, ttl_s=45.0).describe() == (
        "one shared cache of 1,000 tokens, entries dropped 45 s after their last use, "
        "2 requests in flight"
    )
    assert Capacity(None, concurrency=1, slots=True, source="x").describe() == (
        "1 request in flight, each on a slot keeping its last prompt (x)"
    )


def _plan() -> tuple[RelQuery, Plan]:
    t = Table.from_columns({"movie": ["Alien", "Alien"], "review": ["tense", "slow"]})
    rq = RelQuery("map", parse_template("Summarize {review} of {movie}."), t, TEXT)
    return rq, make_plan(rq, Ordering.identity(2, ("movie", "review")), "none")


def test_explain_says_the_capacity_assumed() -> None:
    rq, plan = _plan()
    assert plan.capacity is None
    assert "  cache assumed: not known (planned without a backend)" in plan.explain()
    cap = Capacity(32_768, block=16, concurrency=8, source="measured")
    planned = dataclasses.replace(plan, capacity=cap)
    assert f"  cache assumed: {cap.describe()}" in planned.explain()
    assert "cache assumed" in planned._repr_html_()
    # The capacity changes no request: the call's cache key stays the same.
    assert planned.requests == plan.requests
    assert fingerprint(rq, "none") == fingerprint(rq, planned.reorder)


def test_engine_cost_models_declare_their_capacity(tmp_path: Path) -> None:
    block = BlockCost("m", _count, 64, engine="vllm", block_size=16, num_blocks=2048)
    cap = block.capacity(64, tmp_path)
    assert (cap.tokens, cap.block, cap.concurrency, cap.slots) == (32_768, 16, 64, False)
    assert "num_gpu_blocks_override" in cap.source
    unknown = BlockCost("m", _count, 64, engine="vllm", engine_model=lambda _: None)
    assert unknown.capacity(8, tmp_path).tokens is None
    assert "calibrate_vllm" in unknown.capacity(8, tmp_path).describe()
    slot = SlotCost("m", _count, 4, engine="local", context=4096).capacity(4, tmp_path)
    assert (slot.tokens, slot.slots, slot.concurrency) == (4096, True, 4)


def test_api_cost_models_declare_an_unbounded_cache_with_a_lifetime(tmp_path: Path) -> None:
    from semframe.cost.models import TYPICAL_LATENCY

    anthropic = AnthropicCost("claude", None, 32, TYPICAL_LATENCY["anthropic"], ttl="1h")
    cap = anthropic.capacity(32, tmp_path)
    assert (cap.tokens, cap.ttl_s) == (None, 3600.0)
    openai = OpenAICost("gpt", None, 64, TYPICAL_LATENCY["openai"], retention="24h")
    assert openai.capacity(64, tmp_path).ttl_s == 86_400.0
    assert "24 h" in openai.capacity(64, tmp_path).describe()


def test_a_planned_call_carries_its_backends_capacity(fake: FakeBackend) -> None:
    df = pd.DataFrame({"m": ["x", "y", "x"], "r": ["1", "2", "3"]})
    plan = df.llm.plan("Is {r} about {m} good?", op="filter", backend="fake")
    assert plan.capacity == Capacity(None, concurrency=1, slots=True)  # the fake: one slot
    assumed = "cache assumed: 1 request in flight, each on a slot keeping its last prompt"
    assert assumed in plan.explain()
    assert fake.history == []
