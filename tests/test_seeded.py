"""Prices seeded from genai-prices (semframe.cost.seeded)."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator

import pytest

from semframe.cost import seeded
from semframe.cost.seeded import seeded_fields


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    seeded._lookup.cache_clear()
    yield
    seeded._lookup.cache_clear()


@pytest.fixture
def source() -> str:
    """``source`` of a seeded entry; skips the test without genai-prices."""
    genai_prices = pytest.importorskip("genai_prices")
    return f"genai-prices {genai_prices.__version__}"


def _is_date(s: str) -> bool:
    return dt.date.fromisoformat(s) <= dt.datetime.now(dt.UTC).date()


def test_gpt_4o_mini(source: str) -> None:
    f = seeded_fields("gpt-4o-mini")
    assert f is not None
    assert f["provider"] == "openai"
    assert (f["input"], f["cached_input"], f["output"]) == (0.15, 0.075, 0.6)
    assert "cache_read" not in f
    assert "cache_write" not in f  # OpenAI writes are free before GPT-5.6
    assert "flex_discount" not in f  # no flex tier for gpt-4o-mini
    assert f["source"] == source
    assert _is_date(f["as_of"])
    assert "note" not in f
    # a dated snapshot and the provider hint find the same entry
    assert seeded_fields("gpt-4o-mini-2024-07-18", "openai") == f
    assert seeded_fields("openai/gpt-4o-mini") == f


def test_claude_sonnet_4_5_is_tiered(source: str) -> None:
    f = seeded_fields("claude-sonnet-4-5", "anthropic")
    assert f is not None
    assert f["provider"] == "anthropic"
    assert (f["input"], f["cache_read"], f["output"]) == (3.0, 0.3, 15.0)
    assert (f["cache_write"], f["cache_write_1h"]) == (3.75, 6.0)
    assert "cached_input" not in f
    assert "200,000" in f["note"]
    assert "not modelled" in f["note"]
    assert seeded_fields("claude-sonnet-4-5-20250929") == f


def test_gemini_2_5_flash(source: str) -> None:
    f = seeded_fields("gemini-2.5-flash", "gemini")
    assert f is not None
    assert f["provider"] == "gemini"
    assert (f["input"], f["cached_input"], f["output"]) == (0.3, 0.03, 2.5)
    assert "cache_write" not in f
    assert seeded_fields("models/gemini-2.5-flash", "google") == f
    assert seeded_fields("gemini-2.5-flash") == f


def test_gpt_5_6_luna_has_cache_writes_flex_and_a_dated_price(source: str) -> None:
    f = seeded_fields("gpt-5.6-luna")
    assert f is not None
    assert f["provider"] == "openai"
    # the price after OpenAI's 80% cut of 2026-07-30, base tier (<= 272k tokens)
    assert (f["input"], f["cached_input"], f["output"]) == (0.2, 0.02, 1.2)
    assert f["cache_write"] == 0.25  # 1.25x input
    assert f["as_of"] == "2026-07-30"
    assert f["flex_discount"] == 0.5
    assert f["batch_discount"] == 0.5
    assert "272,000" in f["note"]


def test_conditional_price_before_its_start_date(source: str) -> None:
    found = seeded._lookup("gpt-5.6-luna", None, dt.date(2026, 7, 1))
    assert found is not None
    f = dict(found)
    assert (f["input"], f["cache_write"], f["output"]) == (1.0, 1.25, 6.0)
    assert f["as_of"] <= "2026-07-01"


def test_unknown_model_and_unsupported_hints(source: str) -> None:
    assert seeded_fields("no-such-model-xyz") is None
    assert seeded_fields("") is None
    assert seeded_fields("gpt-4o-mini", "vllm") is None
    assert seeded_fields("gpt-4o-mini", "anthropic") is None
    # Google lists Claude on Vertex AI; the Gemini backend serves Gemini only
    assert seeded_fields("claude-sonnet-4-5", "gemini") is None


def test_returns_a_fresh_dict(source: str) -> None:
    f = seeded_fields("gpt-4o-mini")
    assert f is not None
    f["input"] = 99.0
    again = seeded_fields("gpt-4o-mini")
    assert again is not None
    assert again["input"] == 0.15


def test_without_genai_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "genai_prices" or m.startswith("genai_prices.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # import genai_prices -> ImportError
    with pytest.raises(ImportError):
        import genai_prices  # noqa: F401
    assert seeded_fields("gpt-4o-mini") is None
