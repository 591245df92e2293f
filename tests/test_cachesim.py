"""Provider cache rules (semframe.cost.cachesim), on token sequences with an explicit clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.cost.cachesim import (
    Block,
    BreakpointCacheSim,
    BreakpointRules,
    CacheRuleError,
    OpenAICacheSim,
    OpenAIRules,
    openai_cached_grid,
)

BASE = list(range(5000))


def test_openai_minimum_and_grid() -> None:
    sim = OpenAICacheSim(OpenAIRules(machines=1))
    short = BASE[:1000]
    sim.request(short, arrival=0)
    assert sim.request(short, arrival=1).cached_tokens == 0
    p = BASE[:1500]
    sim.request(p, arrival=2)
    assert sim.request(p, arrival=3).cached_tokens == 1408
    # A prompt sharing 1,300 tokens hits the grid point below: 1,280.
    assert sim.request(BASE[:1300] + [-1] * 400, arrival=4).cached_tokens == 1280


def test_openai_concurrent_requests_miss_until_completion() -> None:
    sim = OpenAICacheSim(OpenAIRules(machines=1))
    tickets = [sim.begin([*BASE[:2048], i], arrival=0.0) for i in range(4)]
    assert [t.result.cached_tokens for t in tickets] == [0, 0, 0, 0]
    sim.complete(tickets[0], at=2.0)
    assert sim.request([*BASE[:2048], 9], arrival=1.9).cached_tokens == 0
    assert sim.request([*BASE[:2048], 9], arrival=2.0).cached_tokens == 2048


def test_openai_ttl_refresh_and_max_lifetime() -> None:
    sim = OpenAICacheSim(OpenAIRules(machines=1, ttl_s=300, max_lifetime_s=3600))
    p = BASE[:1024]
    sim.request(p, arrival=0)
    t = 0.0
    for _ in range(12):  # hits every 299 s keep it alive...
        t += 299
        assert sim.request(p, arrival=t).cached_tokens == 1024
    t += 299  # ...but not beyond one hour after it was written
    assert t > 3600
    assert sim.request(p, arrival=t).cached_tokens == 0


def test_openai_routing_overflow_spills_to_cold_machines() -> None:
    rules = OpenAIRules(machines=4, overflow_per_minute=15)
    sim = OpenAICacheSim(rules)
    results = [sim.request(BASE[:2048], arrival=i * 0.5, cache_key="k") for i in range(40)]
    machines = [r.machine for r in results]
    assert len(set(machines[:15])) == 1
    assert machines[15] != machines[0]
    assert results[15].overflowed and results[15].cached_tokens == 0  # cold machine
    assert results[16].cached_tokens == 2048
    # Different cache keys route the same prefix independently.
    other = OpenAICacheSim(rules)
    spread = {other.request(BASE[:2048], arrival=0, cache_key=f"g{i}").machine for i in range(16)}
    assert len(spread) > 1


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 4000),
    common=st.integers(0, 4000),
    gap=st.floats(0, 1000),
)
def test_openai_properties(n: int, common: int, gap: float) -> None:
    sim = OpenAICacheSim(OpenAIRules(machines=1))
    first = BASE[: max(n, common)]
    second = BASE[:common] + [-1] * max(0, n - common)
    sim.request(first, arrival=0.0)
    r = sim.request(second, arrival=gap)
    assert 0 <= r.cached_tokens <= r.prompt_tokens == len(second)
    assert r.cached_tokens == 0 or (r.cached_tokens - 1024) % 128 == 0
    expected = openai_cached_grid(min(common, len(second))) if gap <= 300 else 0
    assert r.cached_tokens == expected


def _blocks(*sizes: int, bp: dict[int, str] | None = None, offset: int = 0) -> list[Block]:
    out, start = [], offset
    for i, size in enumerate(sizes):
        ttl = (bp or {}).get(i)
        out.append(Block(tuple(range(start, start + size)), ttl))  # type: ignore[arg-type]
        start += size
    return out


def test_anthropic_write_read_and_min_length() -> None:
    sim = BreakpointCacheSim(BreakpointRules(min_tokens=2048))
    small = _blocks(1500, 10, bp={0: "5m"})
    assert sim.request(small, arrival=0).cache_creation_input_tokens == 0
    assert sim.request(small, arrival=1).cache_read_input_tokens == 0
    big = _blocks(2100, 10, bp={0: "5m"})
    r1 = sim.request(big, arrival=2)
    assert (r1.cache_creation_input_tokens, r1.input_tokens) == (2100, 10)
    r2 = sim.request(big, arrival=3)
    assert (r2.cache_read_input_tokens, r2.cache_creation_input_tokens) == (2100, 0)


def test_anthropic_breakpoint_below_minimum_is_ignored_but_later_one_writes() -> None:
    sim = BreakpointCacheSim(BreakpointRules(min_tokens=1024))
    blocks = _blocks(500, 700, 5, bp={0: "1h", 1: "5m"})
    r = sim.request(blocks, arrival=0)
    # The first breakpoint (500 tokens) is too short on its own; the second covers both.
    assert r.cache_creation_input_tokens == 1200
    assert (r.ephemeral_1h_input_tokens, r.ephemeral_5m_input_tokens) == (0, 1200)
    assert r.input_tokens == 5


def test_anthropic_ttl_split_and_expiry() -> None:
    sim = BreakpointCacheSim(BreakpointRules(min_tokens=1024))
    blocks = _blocks(1100, 300, 5, bp={0: "1h", 1: "5m"})
    r = sim.request(blocks, arrival=0)
    assert (r.ephemeral_1h_input_tokens, r.ephemeral_5m_input_tokens) == (1100, 300)
    r = sim.request(blocks, arrival=400)  # the 5m entry expired, the 1h one lives
    assert (r.cache_read_input_tokens, r.ephemeral_5m_input_tokens) == (1100, 300)
    r = sim.request(blocks, arrival=400 + 3601)
    assert r.cache_read_input_tokens == 0


def test_anthropic_lookback_window() -> None:
    rules = BreakpointRules(min_tokens=1024, lookback_blocks=20)
    sim = BreakpointCacheSim(rules)
    sim.request(_blocks(1100, bp={0: "5m"}), arrival=0)
    near = _blocks(1100, *([1] * 18), 1, bp={19: "5m"})
    assert sim.request(near, arrival=1).cache_read_input_tokens == 1100
    sim2 = BreakpointCacheSim(rules)
    sim2.request(_blocks(1100, bp={0: "5m"}), arrival=0)
    far = _blocks(1100, *([1] * 19), 1, bp={20: "5m"})
    r = sim2.request(far, arrival=1)
    assert r.cache_read_input_tokens == 0
    assert r.cache_creation_input_tokens == 1120


def test_anthropic_concurrent_first_requests_miss() -> None:
    sim = BreakpointCacheSim()
    blocks = _blocks(2000, 3, bp={0: "5m"})
    tickets = [sim.begin(blocks, arrival=0.0) for _ in range(3)]
    assert all(t.result.cache_creation_input_tokens == 2000 for t in tickets)
    for t in tickets:
        sim.complete(t, at=1.0)
    assert sim.request(blocks, arrival=1.5).cache_read_input_tokens == 2000


def test_anthropic_breakpoint_rules() -> None:
    sim = BreakpointCacheSim()
    with pytest.raises(CacheRuleError, match="A maximum of 4"):
        sim.begin(_blocks(1, 1, 1, 1, 1, bp=dict.fromkeys(range(5), "5m")), arrival=0)
    with pytest.raises(CacheRuleError, match="1h"):
        sim.begin(_blocks(1, 1, bp={0: "5m", 1: "1h"}), arrival=0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 900), min_size=1, max_size=8),
    marks=st.lists(st.sampled_from([None, "5m", "1h"]), min_size=8, max_size=8),
    repeat=st.booleans(),
)
def test_anthropic_usage_adds_up(sizes: list[int], marks: list[str | None], repeat: bool) -> None:
    bp = {i: m for i, m in enumerate(marks[: len(sizes)]) if m is not None}
    ttls = [bp[i] for i in sorted(bp)]
    if len(ttls) > 4 or ("5m" in ttls and "1h" in ttls[ttls.index("5m") :]):
        return
    sim = BreakpointCacheSim()
    blocks = _blocks(*sizes, bp=bp)
    r = sim.request(blocks, arrival=0)
    if repeat:
        r = sim.request(blocks, arrival=1)
    total = sum(sizes)
    assert r.prompt_tokens == total
    assert min(r.input_tokens, r.cache_read_input_tokens, r.cache_creation_input_tokens) >= 0
    assert (
        r.cache_creation_input_tokens == r.ephemeral_5m_input_tokens + r.ephemeral_1h_input_tokens
    )
    assert r.cache_read_input_tokens == 0 or r.cache_read_input_tokens >= 1024
    if repeat:
        assert r.cache_creation_input_tokens == 0  # everything cacheable was written first
