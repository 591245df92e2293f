"""Prices seeded from the maintained table of the optional ``genai-prices`` package.

`genai-prices <https://github.com/pydantic/genai-prices>`_ (pydantic, MIT) bundles
prices for hundreds of models. :func:`seeded_fields` looks a model up in the data
bundled with the installed release and returns a raw entry in the schema of
``semframe/data/prices.toml``, for models the shipped table does not list. It is a
pure lookup: nothing is downloaded (prices fetched by genai-prices' opt-in
``UpdatePrices`` are not used), and nothing is imported until the first call.

Install it with ``pip install "semframe[prices]"``.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genai_prices.types import ConditionalPrice, ModelInfo, ModelPrice, Provider, TieredPrices

__all__ = ["seeded_fields"]

_GENAI_PROVIDER = {"openai": "openai", "anthropic": "anthropic", "gemini": "google"}
"""semframe's provider name -> genai-prices' provider id."""
_HINTS = {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini", "google": "gemini"}
"""Accepted ``provider_hint`` values -> semframe's provider name."""
_CACHE_READ_KEY = {"openai": "cached_input", "anthropic": "cache_read", "gemini": "cached_input"}
_PRICE_KEYS = (
    ("input", "input_mtok"),
    ("output", "output_mtok"),
    ("cache_read", "cache_read_mtok"),
    ("cache_write", "cache_write_mtok"),
    ("cache_write_1h", "cache_write_1h_mtok"),
)
"""semframe's field -> genai-prices' price key (dollars per million tokens)."""


def seeded_fields(model: str, provider_hint: str | None = None) -> dict[str, Any] | None:
    """The price of ``model`` from genai-prices, as a ``[prices."model"]`` entry.

    Parameters
    ----------
    model : str
        Model name as sent to the API (dated snapshots such as
        ``gpt-4o-2024-08-06`` match genai-prices' own patterns); a ``provider/``
        or ``models/`` prefix is ignored. Case-insensitive.
    provider_hint : {"openai", "anthropic", "gemini"}, optional
        semframe's provider (``"google"`` is taken for ``"gemini"``). Without it
        OpenAI, Anthropic and Google are tried in that order. Any other value
        gives ``None``. Google's entries for Claude on Vertex AI are never used:
        the ``"gemini"`` backend serves Gemini models only.

    Returns
    -------
    dict or None
        ``None`` when genai-prices is not installed, the model is unknown to it
        for these providers, or it has no per-token input and output price.
        Otherwise a new dict (safe to modify) with, in dollars per million
        tokens where priced:

        - ``provider``: ``"openai"``, ``"anthropic"`` or ``"gemini"``;
        - ``input``, ``output``;
        - ``cached_input`` (OpenAI, Gemini) or ``cache_read`` (Anthropic), where
          genai-prices gives a cache-read price;
        - ``cache_write``: a cache write at the default TTL (Anthropic's 5
          minutes; OpenAI's GPT-5.6 and later), only where genai-prices gives one;
        - ``cache_write_1h``: Anthropic's 1-hour cache writes, where given;
        - ``batch_discount``: batch input price over standard input price
          (rounded to 3 decimals), where genai-prices has a batch price;
        - ``flex_discount``: OpenAI ``service_tier="flex"`` input price over
          standard input price (rounded to 3 decimals), only where it has one;
        - ``as_of``: ISO start date of the price in effect today, or, for a
          price without one, the data's date (the newest price change the
          bundled data records that has taken effect by today: the package
          records no release date);
        - ``source``: ``"genai-prices <version>"``;
        - ``note``: only where a price is tiered by prompt length (the base,
          shortest-prompt tier is returned; the higher tiers are not modelled)
          or genai-prices marks the model deprecated.

        Prices are those in effect today (UTC); each lookup is cached for the
        process.

    Examples
    --------
    The answer depends on whether genai-prices is installed:

    >>> seeded_fields("no-such-model") is None
    True
    >>> f = seeded_fields("gpt-4o-mini")
    >>> f is None or (f["input"], f["cached_input"], f["output"]) == (0.15, 0.075, 0.6)
    True
    """
    found = _lookup(model, provider_hint, dt.datetime.now(dt.UTC).date())
    return None if found is None else dict(found)


@functools.cache
def _lookup(
    model: str, provider_hint: str | None, day: dt.date
) -> tuple[tuple[str, Any], ...] | None:
    """:func:`seeded_fields` on ``day``, as ``(field, value)`` pairs."""
    if provider_hint is None:
        ours: Iterable[str] = _GENAI_PROVIDER
    elif provider_hint.lower() in _HINTS:
        ours = (_HINTS[provider_hint.lower()],)
    else:
        return None
    try:
        import genai_prices
        from genai_prices.data import providers
    except ImportError:
        return None
    name = model.strip().rsplit("/", 1)[-1].lower()
    if not name:
        return None
    by_id = {p.id: p for p in providers}
    for provider in ours:
        genai_provider = by_id.get(_GENAI_PROVIDER[provider])
        if genai_provider is None:
            continue
        info = _find(genai_provider, name, provider)
        if info is not None:
            fields = _fields(info, provider, day, genai_prices.__version__)
            return None if fields is None else tuple(fields.items())
    return None


def _find(provider: Provider, name: str, ours: str) -> ModelInfo | None:
    # Without ``all_providers``: no fallback to another provider's models.
    info = provider.find_model(name)
    if info is not None and ours == "gemini" and "claude" in info.id:
        return None  # Claude on Vertex AI, not a Gemini API model
    return info


def _fields(info: ModelInfo, provider: str, day: dt.date, version: str) -> dict[str, Any] | None:
    from genai_prices.types import StartDateConstraint

    at = dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC)
    standard = info.get_prices(at)
    prices = {key: _price(standard, theirs) for key, theirs in _PRICE_KEYS}
    if prices["input"] is None or prices["output"] is None:
        return None
    out: dict[str, Any] = {"provider": provider}
    for key, value in prices.items():
        if value is not None:
            out[_CACHE_READ_KEY[provider] if key == "cache_read" else key] = value[0]
    for key, context in (("batch_discount", "processing"), ("flex_discount", "service_tier")):
        wanted = {context: "batch" if key == "batch_discount" else "flex"}
        ratio = _variant_ratio(info, wanted, at, standard)
        if ratio is not None:
            out[key] = ratio
    start = None
    if isinstance(info.prices, list):
        active = _active(info.prices, at)
        if isinstance(active.constraint, StartDateConstraint):
            start = active.constraint.start_date
    out["as_of"] = (start or _data_date(day)).isoformat()
    out["source"] = f"genai-prices {version}"
    notes = []
    tiers = sorted({t for value in prices.values() if value is not None for t in value[1]})
    if tiers:
        above = ", ".join(f"{t:,}" for t in tiers)
        notes.append(
            f"genai-prices bills prompts over {above} input tokens at a higher rate "
            "(tiers not modelled; the base tier is used)"
        )
    if info.deprecated:
        notes.append("genai-prices marks the model deprecated")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def _price(prices: ModelPrice, key: str) -> tuple[float, tuple[int, ...]] | None:
    """A price in dollars per million tokens (the base tier) and its tier thresholds."""
    value: Decimal | TieredPrices | None = getattr(prices, key)
    if value is None:
        return None
    if isinstance(value, Decimal):
        return float(value), ()
    return float(value.base), tuple(t.start for t in value.tiers)


def _variant_ratio(
    info: ModelInfo, when: dict[str, str], at: dt.datetime, standard: ModelPrice
) -> float | None:
    """Input price under the variant ``when`` over the standard one, where there is one."""
    variants = [
        v
        for v in info.price_variants or ()
        if v.when == when and (v.constraint is None or v.constraint.active(at))
    ]
    if not variants:
        return None
    base = _price(standard, "input_mtok")
    varied = _price(info.get_prices(at, when), "input_mtok")
    if base is None or varied is None or base[0] == 0:
        return None
    return round(varied[0] / base[0], 3)


def _active(conditional: list[ConditionalPrice], at: dt.datetime) -> ConditionalPrice:
    """The conditional price in effect at ``at`` (genai-prices' rule: the last active one)."""
    for price in reversed(conditional):
        if price.constraint is None or price.constraint.active(at):
            return price
    return conditional[0]


@functools.cache
def _data_date(day: dt.date) -> dt.date:
    """The newest start date of a bundled price (standard or variant) not after ``day``."""
    from genai_prices.data import providers
    from genai_prices.types import StartDateConstraint

    newest = dt.date.min
    for provider in providers:
        for info in provider.models:
            constraints = (
                [c.constraint for c in info.prices] if isinstance(info.prices, list) else []
            )
            constraints += [v.constraint for v in info.price_variants or ()]
            for c in constraints:
                if isinstance(c, StartDateConstraint) and newest < c.start_date <= day:
                    newest = c.start_date
    return newest
