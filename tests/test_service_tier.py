"""OpenAI service tiers: ``"flex"`` (the batch price, synchronously) and ``"priority"``.

Which models take a tier, and at what multiple of the standard price, is price
table data (``service_tiers``). The backend sends the tier, the estimator and
``semframe.last_run()`` price it, and the emulator reads it from the request and
bills it; a model without the tier is a ``ConfigError`` before anything is sent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import openai
import pandas as pd
import pytest

import semframe
from semframe.backends import reset_backends
from semframe.backends.openai import OpenAIBackend, _batch_body
from semframe.core.wire import Request
from semframe.cost.models import openai_cost
from semframe.cost.pricing import cost, load_prices, price_for, tier_models
from semframe.cost.seeded import seeded_fields
from semframe.errors import ConfigError
from semframe.testing.emulator import Latency, ProviderEmulator

KEY = "sk-test-abcdefghijklmnop0123"
RUBRIC = " ".join(f"Rule {i}: weigh the evidence." for i in range(250))  # ~1,800 tokens
PER = 1_000_000


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server
        reset_backends()


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {"movie": ["Alien", "Alien", "Heat", "Heat"], "review": ["tense", "dark", "long", "slow"]}
    )


def _settings(**extra: Any) -> dict[str, Any]:
    return {
        "backend": "openai",
        "cache": False,
        "max_tokens": 4,
        "truncated": "keep",
        "max_concurrency": 1,
        **extra,
    }


# -- the table --------------------------------------------------------------------


def test_flex_is_model_data() -> None:
    flex = tier_models("flex")
    assert {"gpt-5", "gpt-5-mini", "gpt-5.5", "gpt-5.6", "gpt-5.6-luna", "o3", "o4-mini"} <= set(
        flex
    )
    assert not {"gpt-4.1-mini", "gpt-4o-mini", "gpt-4o"} & set(flex)
    assert dict(price_for("gpt-5.5").service_tiers) == {"flex": 0.5, "priority": 2.5}
    assert price_for("claude-haiku-4-5").service_tiers == ()


def test_flex_costs_the_batch_price_on_every_component() -> None:
    base = price_for("gpt-5.6")
    flex = base.at_tier("flex")
    counts = {
        "uncached_input_tokens": 1_000,
        "cached_input_tokens": 20_000,
        "cache_write_5m_tokens": 3_000,
        "output_tokens": 500,
    }
    live, batch = cost(flex, **counts), cost(base, **counts, batch=True)
    assert live == pytest.approx(batch)
    assert live.cache_writes == pytest.approx(3_000 * 2.50 / PER)  # 5.00 x 0.5
    assert live.total == pytest.approx(cost(base, **counts).total / 2)
    # a batch request goes without a tier: the batch price, not half of it
    assert cost(flex, **counts, batch=True) == pytest.approx(batch)
    assert base.at_tier("priority").tier_multiplier == 2.0
    assert base.at_tier(None) == base.at_tier("default") == base


def test_a_tier_the_model_lacks_is_refused_by_the_price() -> None:
    with pytest.raises(ConfigError, match=r"'flex' is not offered for 'gpt-4\.1-mini'"):
        price_for("gpt-4.1-mini").at_tier("flex")


def test_an_entry_may_list_its_tiers() -> None:
    table = {"gpt-4.1-mini": {"service_tiers": {"flex": 0.5}}}
    assert price_for("gpt-4.1-mini", table).at_tier("flex").tier_multiplier == 0.5
    assert "gpt-4.1-mini" in tier_models("flex", table)
    with pytest.raises(ConfigError, match="valid tiers: flex, priority"):
        load_prices({"gpt-4.1-mini": {"service_tiers": {"turbo": 0.5}}})
    with pytest.raises(ConfigError, match="multiplier > 0"):
        load_prices({"gpt-4.1-mini": {"service_tiers": {"flex": 0}}})


@pytest.mark.skipif(importlib.util.find_spec("genai_prices") is None, reason="genai-prices")
def test_a_seeded_price_takes_flex_where_genai_prices_has_it() -> None:
    # gpt-5.4-mini is not in the shipped table; genai-prices 0.2.3 prices its flex tier
    price = price_for("gpt-5.4-mini")
    assert "genai-prices" in price.source
    assert dict(price.service_tiers).get("flex") == 0.5


# -- settings and the backend -------------------------------------------------------


def test_the_setting() -> None:
    assert semframe.config()["service_tier"] is None
    assert semframe.config(service_tier="FLEX")["service_tier"] == "flex"
    with pytest.raises(ConfigError, match="service_tier"):
        semframe.config(service_tier="turbo")


def test_an_unsupported_model_is_an_error_before_anything_is_sent(emu: ProviderEmulator) -> None:
    settings = _settings(model="gpt-4.1-mini", service_tier="flex", base_url=emu.openai_url)
    for call in (
        lambda: _frame().llm.map(RUBRIC + " {movie} {review}", **settings),
        lambda: _frame().llm.estimate(RUBRIC + " {movie} {review}", op="map", **settings),
    ):
        with pytest.raises(ConfigError) as info:
            call()
        message = str(info.value)
        assert "service_tier='flex' is not offered for 'gpt-4.1-mini'" in message
        assert "gpt-5-mini" in message and "gpt-5.6" in message  # the models that take it
    assert emu.ledger.entries() == []


def test_the_backend_sends_the_tier_live_and_not_in_batch_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    backend = OpenAIBackend("gpt-5-mini", service_tier="flex")
    request = Request(0, 0, "Hello", None, 8, 0.0, None, 0)
    assert backend.body(request)["service_tier"] == "flex"
    assert "service_tier" not in OpenAIBackend("gpt-5-mini").body(request)
    assert "service_tier" not in _batch_body(backend.body(request))
    assert backend.cost.price is not None and backend.cost.price.service_tier == "flex"
    assert openai_cost("gpt-5-mini", None, concurrency=1).price == price_for("gpt-5-mini")


# -- the emulator -------------------------------------------------------------------


def test_the_emulator_reads_the_tier_from_the_request(emu: ProviderEmulator) -> None:
    client = openai.OpenAI(api_key=KEY, base_url=emu.openai_url, max_retries=0)
    messages = [{"role": "user", "content": "Say yes."}]
    bills = {}
    for tier in (None, "flex", "priority"):
        extra = {} if tier is None else {"service_tier": tier}
        r = client.chat.completions.create(
            model="gpt-5-mini", messages=messages, max_completion_tokens=4, **extra
        )
        assert r.service_tier == (tier or "default")
        bills[tier] = emu.ledger.entries()[-1].cost.total
    assert bills["flex"] == pytest.approx(bills[None] / 2)
    assert bills["priority"] == pytest.approx(bills[None] * 1.8)
    with pytest.raises(openai.BadRequestError, match="service_tier"):
        client.chat.completions.create(model="gpt-4.1-mini", messages=messages, service_tier="flex")
    with pytest.raises(openai.BadRequestError, match="service_tier"):
        client.chat.completions.create(
            model="gpt-5-mini", messages=messages, extra_body={"service_tier": "turbo"}
        )
    client.close()


# -- a run: billed, counted and estimated at the tier -----------------------------------


def _run(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> tuple[float, float, float]:
    """(emulator bill, last_run dollars, estimate) of one run from a cold emulator."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    template = RUBRIC + " {movie} {review}"
    est = _frame().llm.estimate(template, op="map", **settings)
    with ProviderEmulator(latency=Latency(0)) as server:
        try:
            _frame().llm.map(template, base_url=server.openai_url, **settings)
        finally:
            reset_backends()
        billed = server.ledger.totals().dollars
    run = semframe.last_run()
    assert run is not None
    return billed, run.dollars, est.dollars


@pytest.mark.parametrize("model", ["gpt-5-mini", "gpt-5.6-luna"])
def test_a_flex_run_costs_half_and_all_three_agree(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = _run(monkeypatch, **_settings(model=model))
    flex = _run(monkeypatch, **_settings(model=model, service_tier="flex"))
    assert default[0] == pytest.approx(default[1], rel=1e-9)
    assert flex[0] == pytest.approx(flex[1], rel=1e-9)
    assert flex[0] == pytest.approx(default[0] / 2, rel=1e-9)
    assert flex[2] == pytest.approx(default[2] / 2, rel=1e-9)


def test_the_estimate_says_what_flex_means(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    est = _frame().llm.estimate(
        RUBRIC + " {movie} {review}", op="map", **_settings(model="gpt-5", service_tier="flex")
    )
    assert any("flex tier" in n and "429" in n for n in est.notes)
    assert est.price is not None and est.price.service_tier == "flex"


def test_flex_wall_time_is_a_lower_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flex answers come slower than the modelled default tier: the estimate says "at least"."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    template = RUBRIC + " {movie} {review}"
    flex = _frame().llm.estimate(
        template, op="map", **_settings(model="gpt-5", service_tier="flex")
    )
    plain = _frame().llm.estimate(template, op="map", **_settings(model="gpt-5"))
    assert flex.wall_at_least and not plain.wall_at_least
    assert flex.planned.wall_seconds is not None
    assert "≥ " in repr(flex) and "≥" not in repr(plain)
    assert flex.timing is not None and "at least" in flex.timing.describe()
    assert plain.timing is not None and "at least" not in plain.timing.describe()


def test_flex_waits_longer_for_an_answer(emu: ProviderEmulator) -> None:
    """OpenAI's flex guide raises the client timeout to 15 minutes; an explicit one wins."""
    url = emu.openai_url
    flex = OpenAIBackend("gpt-5", base_url=url, service_tier="flex")
    plain = OpenAIBackend("gpt-5", base_url=url)
    assert flex.capabilities.answer_timeout == 900.0
    assert plain.capabilities.answer_timeout == 120.0
    assert flex._client.timeout.read == 900.0 and plain._client.timeout.read == 120.0
    own = OpenAIBackend("gpt-5", base_url=url, service_tier="flex", timeout=30.0)
    assert own._client.timeout.read == 30.0
    assert semframe.config(backend="openai")["timeout"] is None  # the backend's own


def test_a_batch_run_with_a_tier_is_billed_at_the_batch_price(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Batch lines go without the tier; the batch price applies, not the tier's on top of it."""
    batch = {"batch": True, "batch_poll_seconds": 0.01, "cache_dir": str(tmp_path)}
    plain = _run(monkeypatch, **_settings(model="gpt-5-mini", **batch))
    flex = _run(monkeypatch, **_settings(model="gpt-5-mini", service_tier="flex", **batch))
    assert flex[0] == pytest.approx(plain[0], rel=1e-9)
    assert flex[1] == pytest.approx(plain[1], rel=1e-9)
    assert flex[2] == pytest.approx(plain[2], rel=1e-9)


@pytest.mark.skipif(importlib.util.find_spec("genai_prices") is None, reason="genai-prices")
@pytest.mark.parametrize(
    "model", sorted(m for m, p in load_prices().items() if p.provider == "openai")
)
def test_shipped_flex_tiers_agree_with_genai_prices(model: str) -> None:
    """A shipped model takes flex exactly where genai-prices prices it, at its ratio."""
    theirs = seeded_fields(model, "openai")
    if theirs is None:
        pytest.skip(f"genai-prices does not know {model}")
    assert dict(price_for(model).service_tiers).get("flex") == theirs.get("flex_discount")
