"""The dated price table and billing arithmetic (semframe.cost.pricing)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semframe.cost.pricing import Cost, cost, known_models, load_prices, price_for
from semframe.errors import ConfigError


def test_every_entry_is_dated_and_sourced() -> None:
    prices = load_prices()
    assert len(prices) >= 15
    for p in prices.values():
        assert dt.date.fromisoformat(p.as_of) <= dt.date.today()
        assert p.source.startswith("https://")
        assert p.output >= p.input > p.cache_read >= 0
        assert p.batch_discount == 0.5
        assert p.batch_stacks_cache is (p.provider != "gemini")
        if p.provider == "openai" and p.caching == "breakpoints":
            # GPT-5.6 on: breakpoints matched exactly, writes billed at 1.25x input
            assert (p.min_cacheable_tokens, p.cache_step_tokens) == (1024, 1)
            assert p.cache_write_5m == p.cache_write_1h == pytest.approx(1.25 * p.input)
            assert p.retention == ()
        elif p.provider == "openai":
            assert (p.min_cacheable_tokens, p.cache_step_tokens) == (1024, 128)
            assert p.cache_write_5m == p.input  # writes are free: billed as input
            assert p.retention in (("in_memory", "24h"), ("24h",))
        elif p.provider == "gemini":
            # cached tokens 10% of input; a write is creation (input) + storage for the TTL
            assert p.cache_read == pytest.approx(0.1 * p.input)
            assert p.cache_storage_per_hour > 0
            assert p.cache_write_5m == pytest.approx(p.input + p.cache_storage_per_hour / 12)
            assert p.cache_write_1h == pytest.approx(p.input + p.cache_storage_per_hour)
        else:
            # 1.25x / 2x / 0.1x input (Claude 3 Haiku's published figures are rounded)
            assert p.cache_write_5m == pytest.approx(1.25 * p.input, abs=0.015)
            assert p.cache_write_1h == pytest.approx(2.0 * p.input)
            assert p.cache_read == pytest.approx(0.1 * p.input, abs=0.006)


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("claude-sonnet-4-5", 1024),
        ("claude-opus-4-1", 1024),
        ("claude-3-5-haiku", 2048),
        ("claude-3-haiku", 2048),
        ("claude-haiku-4-5", 4096),
        ("claude-opus-4-5", 4096),
        ("claude-opus-4-6", 4096),
        ("claude-sonnet-4-6", 2048),
        ("gpt-5.2", 1024),
        ("gpt-4o", 1024),
        ("gemini-2.5-flash", 2048),
        ("gemini-2.5-pro", 2048),
        ("gemini-2.5-flash-lite", 2048),
        ("gemini-3-pro-preview", 4096),
    ],
)
def test_minimum_cacheable_tokens(model: str, minimum: int) -> None:
    assert price_for(model).min_cacheable_tokens == minimum


def test_snapshot_names_resolve() -> None:
    assert price_for("gpt-4.1-mini-2025-04-14").model == "gpt-4.1-mini"
    assert price_for("claude-3-5-haiku-latest").model == "claude-3-5-haiku"
    assert price_for("claude-opus-4-5-20251101").model == "claude-opus-4-5"
    assert price_for("openai/gpt-4o-mini").model == "gpt-4o-mini"


def test_unknown_model_error_lists_models_and_how_to_add() -> None:
    with pytest.raises(ConfigError) as info:
        price_for("gpt-9")
    msg = str(info.value)
    assert "gpt-4o-mini" in msg and "claude-haiku-4-5" in msg
    assert '[prices."gpt-9"]' in msg and "semframe.toml" in msg


def test_overrides_replace_and_add() -> None:
    over = {
        "gpt-4o": {"input": 2.0},
        "local-llama": {"provider": "openai", "input": 0.0, "output": 0.0},
        "claude-new": {"provider": "anthropic", "input": 2.0, "output": 10.0},
    }
    p = price_for("gpt-4o", over)
    assert (p.input, p.output, p.cache_read) == (2.0, 10.0, 1.25)
    assert "overridden" in p.source
    assert price_for("local-llama", over).cache_read == 0.0
    new = price_for("claude-new", over)
    assert (new.cache_write_5m, new.cache_write_1h, new.min_cacheable_tokens) == (2.5, 4.0, 1024)
    assert new.cache_read == pytest.approx(0.2)  # Anthropic's rule: reads at 0.1x input
    assert "local-llama" in known_models(over)


def test_cache_prices_an_entry_omits_follow_the_providers_rule() -> None:
    over = {
        "claude-new": {"provider": "anthropic", "input": 4.0, "output": 20.0},
        "gpt-new": {"provider": "openai", "input": 4.0, "output": 20.0},
        "gpt-stated": {
            "provider": "openai",
            "input": 4.0,
            "output": 20.0,
            "cache_read_multiplier": 0.1,
        },
    }
    claude = price_for("claude-new", over)
    assert (claude.cache_read, claude.cache_write_5m, claude.cache_write_1h) == pytest.approx(
        (0.4, 5.0, 8.0)
    )
    # OpenAI's discount differs by model family: without one stated, none (the high side)
    assert price_for("gpt-new", over).cache_read == 4.0
    assert price_for("gpt-stated", over).cache_read == pytest.approx(0.4)
    with pytest.raises(ConfigError, match="'cache_read_multiplier' must be a number >= 0"):
        price_for(
            "x", {"x": {"provider": "openai", "input": 1, "output": 1, "cache_read_multiplier": -1}}
        )


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"provider": "openai", "input": 1.0}, "'output'"),
        ({"provider": "azure", "input": 1.0, "output": 1.0}, "provider"),
        ({"provider": "openai", "input": -1.0, "output": 1.0}, "'input'"),
        ({"provider": "openai", "input": 1.0, "output": 1.0, "inptu": 2}, "unknown field"),
        ({"provider": "openai", "input": 1.0, "output": 1.0, "min_cacheable_tokens": 0}, "min_"),
    ],
)
def test_bad_overrides_are_config_errors(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        price_for("x", {"x": fields})


def test_gemini_batch_discount_does_not_stack_with_the_cache_price() -> None:
    p = price_for("gemini-2.5-pro")  # 1.25 in, 0.125 cached, 10 out, 4.50 storage
    c = cost(
        p,
        uncached_input_tokens=1_000_000,
        cached_input_tokens=1_000_000,
        cache_write_1h_tokens=1_000_000,
        output_tokens=1_000_000,
        batch=True,
    )
    assert c.uncached_input == pytest.approx(0.625)
    assert c.output == pytest.approx(5.0)
    assert c.cached_input == pytest.approx(0.125)  # the cache price, not half of it
    assert c.cache_writes == pytest.approx(1.25 + 4.50)  # creation + an hour of storage


def test_storage_price_is_validated_and_folded_into_writes() -> None:
    new = {"gemini-new": {"provider": "gemini", "input": 1.0, "output": 4.0,
                          "cache_storage_per_hour": 3.0}}  # fmt: skip
    p = price_for("gemini-new", new)
    assert (p.cache_read, p.cache_write_5m, p.cache_write_1h) == (0.1, 1.25, 4.0)
    assert p.batch_stacks_cache is False and p.min_cacheable_tokens == 2048
    bad = {"gemini-new": {**new["gemini-new"], "cache_storage_per_hour": -1}}
    with pytest.raises(ConfigError, match="cache_storage_per_hour"):
        price_for("gemini-new", bad)
    with pytest.raises(ConfigError, match="batch_stacks_cache"):
        price_for("gemini-new", {"gemini-new": {**new["gemini-new"], "batch_stacks_cache": 1}})


def test_cost_components() -> None:
    p = price_for("claude-opus-4-1")  # 15 in, 18.75 / 30 writes, 1.50 reads, 75 out
    c = cost(
        p,
        uncached_input_tokens=1_000_000,
        cached_input_tokens=2_000_000,
        cache_write_5m_tokens=1_000_000,
        cache_write_1h_tokens=1_000_000,
        output_tokens=100_000,
    )
    assert c == Cost(uncached_input=15.0, cached_input=3.0, cache_writes=48.75, output=7.5)
    assert c.total == pytest.approx(74.25)
    half = cost(p, uncached_input_tokens=1_000_000, output_tokens=100_000, batch=True)
    assert half.total == pytest.approx((15.0 + 7.5) / 2)
    with pytest.raises(ValueError, match=">= 0"):
        cost(p, output_tokens=-1)


@given(
    u=st.integers(0, 10**8),
    r=st.integers(0, 10**8),
    o=st.integers(0, 10**7),
    model=st.sampled_from(["gpt-4o-mini", "gpt-5", "claude-haiku-4-5"]),
)
def test_cache_never_costs_more_than_uncached(u: int, r: int, o: int, model: str) -> None:
    p = price_for(model)
    cached = cost(p, uncached_input_tokens=u, cached_input_tokens=r, output_tokens=o)
    plain = cost(p, uncached_input_tokens=u + r, output_tokens=o)
    assert cached.total <= plain.total + 1e-9
    assert cost(p, uncached_input_tokens=u, batch=True).total == pytest.approx(
        0.5 * cost(p, uncached_input_tokens=u).total
    )


def test_a_model_the_table_lacks_is_priced_from_genai_prices_with_our_rules() -> None:
    pytest.importorskip("genai_prices")
    p = price_for("o3-mini")  # not in the shipped table
    assert p.source.startswith("genai-prices")
    assert (p.provider, p.min_cacheable_tokens, p.cache_step_tokens) == ("openai", 1024, 128)
    assert p.caching == "automatic" and p.cache_write_5m == p.input  # writes free before 5.6
    cyber = price_for("gpt-5.6-cyber")  # a GPT-5.6 model: writes billed, breakpoints
    assert cyber.caching == "breakpoints"
    assert cyber.cache_write_5m == pytest.approx(1.25 * cyber.input)
    # the shipped table and a user's own entry still win
    assert price_for("gpt-4o-mini").source == "https://platform.openai.com/docs/pricing"
    mine = {"o3-mini": {"provider": "openai", "input": 9.0, "output": 9.0}}
    assert price_for("o3-mini", mine).input == 9.0


def test_without_genai_prices_an_unknown_model_names_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "genai_prices", None)
    import semframe.cost.seeded as seeded

    seeded._lookup.cache_clear()
    with pytest.raises(ConfigError, match=r"semframe\[prices\]"):
        price_for("o3-mini")
    seeded._lookup.cache_clear()
