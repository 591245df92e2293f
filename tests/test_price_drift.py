"""The shipped price table against genai-prices' maintained one (drift check).

Every row of ``semframe/data/prices.toml`` whose model genai-prices knows is compared
with :func:`semframe.cost.seeded.seeded_fields` for the same model and provider:
input, output and cache-read prices, and cache writes where genai-prices gives them,
must agree within 1%. A model genai-prices does not know is skipped. A pair known to
disagree goes in ``KNOWN_DISAGREEMENTS`` with the reason; it is then checked to still
disagree, so the entry is removed once the two tables agree again.
"""

from __future__ import annotations

from typing import Any

import pytest

from semframe.cost.pricing import Price, load_prices
from semframe.cost.seeded import seeded_fields

pytest.importorskip("genai_prices")

REL = 0.01

KNOWN_DISAGREEMENTS: dict[tuple[str, str], str] = {
    # (model, field): why ours differs from genai-prices'. None as of genai-prices 0.2.3.
}


def _pairs(price: Price, theirs: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Field -> (ours, theirs), for the fields genai-prices prices."""
    read = theirs.get("cached_input", theirs.get("cache_read"))
    candidates = {
        "input": theirs["input"],
        "output": theirs["output"],
        "cache_read": read,
        "cache_write_5m": theirs.get("cache_write"),
        "cache_write_1h": theirs.get("cache_write_1h"),
    }
    return {
        field: (float(getattr(price, field)), float(value))
        for field, value in candidates.items()
        if value is not None
    }


def _agree(ours: float, theirs: float) -> bool:
    return ours == pytest.approx(theirs, rel=REL)


@pytest.mark.parametrize("model", sorted(load_prices()))
def test_shipped_price_agrees_with_genai_prices(model: str) -> None:
    price = load_prices()[model]
    theirs = seeded_fields(model, price.provider)
    if theirs is None:
        pytest.skip(f"genai-prices does not know {model!r} ({price.provider})")
    assert theirs["provider"] == price.provider
    pairs = _pairs(price, theirs)
    assert {"input", "output"} <= set(pairs)
    drift = {
        field: values
        for field, values in pairs.items()
        if not _agree(*values) and (model, field) not in KNOWN_DISAGREEMENTS
    }
    assert not drift, (
        f"{model}: prices.toml differs from {theirs['source']} (field: (ours, theirs)): "
        f"{drift}. Check the provider's page; update prices.toml or add the pair to "
        "KNOWN_DISAGREEMENTS with the reason."
    )


@pytest.mark.parametrize(("model", "field"), sorted(KNOWN_DISAGREEMENTS))
def test_known_disagreements_still_disagree(model: str, field: str) -> None:
    price = load_prices()[model]
    theirs = seeded_fields(model, price.provider)
    assert theirs is not None, f"genai-prices no longer knows {model!r}: drop the entry"
    ours_value, their_value = _pairs(price, theirs)[field]
    assert not _agree(ours_value, their_value), (
        f"{model} {field} agrees again ({ours_value}): drop it from KNOWN_DISAGREEMENTS"
    )


def test_most_of_the_table_is_checked() -> None:
    prices = load_prices()
    known = [m for m, p in prices.items() if seeded_fields(m, p.provider) is not None]
    # genai-prices 0.2.3 knows every shipped model; a lookup that silently finds
    # nothing would turn the drift check into skips
    assert len(known) >= 0.8 * len(prices)
