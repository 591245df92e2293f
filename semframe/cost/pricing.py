"""Dated API prices as data, and the billing arithmetic.

The table lives in ``semframe/data/prices.toml``: per model its provider, prices
per million tokens (input, cached input / cache reads, cache writes for the 5
minute and 1 hour TTLs, output, Gemini's explicit-cache storage per hour), the
batch discount and whether it stacks with cache prices, the minimum cacheable
prompt length, the date the price is known to have been in effect and the page
it was taken from. Users add or override models with ``[prices."model-name"]``
tables in ``semframe.toml``; :func:`price_for` takes those tables as a mapping.

Examples
--------
>>> p = price_for("gpt-4.1-mini")
>>> p.input, p.cached_input, p.output, p.min_cacheable_tokens
(0.4, 0.1, 1.6, 1024)
>>> c = cost(p, uncached_input_tokens=1_000_000, cached_input_tokens=1_000_000)
>>> round(c.total, 6)
0.5
>>> price_for("claude-sonnet-4-5-20250929").model
'claude-sonnet-4-5'
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from semframe.cost.seeded import seeded_fields
from semframe.errors import ConfigError

__all__ = [
    "Cost",
    "EmbeddingPrice",
    "Price",
    "cost",
    "embedding_models",
    "embedding_price",
    "known_models",
    "load_prices",
    "price_for",
    "tier_models",
]

Provider = Literal["openai", "anthropic", "gemini"]
_PROVIDERS = ("openai", "anthropic", "gemini")
_PER = 1_000_000


@dataclass(frozen=True)
class Price:
    """The price of one model, in US dollars per million tokens.

    Attributes
    ----------
    model : str
        Canonical model name (dated snapshots map to it).
    provider : {"openai", "anthropic", "gemini"}
        Which API serves it; decides the caching rules.
    input : float
        Uncached input tokens.
    output : float
        Output tokens.
    cache_read : float
        Input tokens served from the prompt cache (OpenAI "cached input",
        Anthropic "cache reads", Gemini "context caching").
    cache_write_5m : float
        Anthropic cache writes with the 5-minute TTL. OpenAI: cache writes at
        any TTL (1.25x input from GPT-5.6; ``input`` before, where writes are
        free and cached prompts are billed as ordinary input); a table entry
        gives it as ``cache_write``. Gemini: an explicit cache with a 5-minute
        TTL, per token: its creation (the input price) plus its storage for 5
        minutes.
    cache_write_1h : float
        Anthropic cache writes with the 1-hour TTL (OpenAI: as
        ``cache_write_5m``; Gemini: creation plus one hour of storage).
    min_cacheable_tokens : int
        Shortest prefix the provider caches.
    cache_step_tokens : int
        Cached prefixes grow in steps of this many tokens (OpenAI 128, Anthropic 1).
    batch_discount : float
        Multiplier for batch requests (0.5 = 50% off): on every component, or
        only on uncached input and output where it does not stack with cache
        prices (``batch_stacks_cache``).
    as_of : str
        ISO date the price is known to have been in effect.
    source : str
        Where the price is published.
    note : str or None
        Caveats (e.g. long-context surcharges not modelled).
    cache_storage_per_hour : float
        Gemini explicit caches: storage, dollars per million tokens per hour
        (0 where the provider charges none). Folded into the cache write prices
        an entry does not state.
    batch_stacks_cache : bool
        Whether the batch discount applies on top of cache prices. Gemini: no,
        a cached token in a batch is billed at the cache price (and explicit
        cache writes are never part of a batch).
    caching : {"automatic", "breakpoints"}
        How the model caches: ``"automatic"``, every prompt's prefixes on the
        provider's grid (OpenAI before GPT-5.6, Gemini's implicit caching);
        ``"breakpoints"``, only up to the breakpoints a request marks, or the
        provider's own implicit one, and matched exactly there (Anthropic;
        OpenAI from GPT-5.6, whose cache writes are billed).
    retention : tuple of str
        OpenAI ``prompt_cache_retention`` values the model takes (``in_memory``,
        ``24h``); empty where the parameter does not apply.
    service_tiers : tuple of (str, float)
        OpenAI service tiers the model takes besides ``"default"`` (``"flex"``,
        ``"priority"``), each with its price as a multiple of the standard one,
        on every component (flex: 0.5, the batch price).
    service_tier : str
        The tier this price bills synchronous requests at (``"default"``; see
        :meth:`at_tier`). Batch requests are billed at ``batch_discount``
        whatever the tier: the batch API takes none.
    """

    model: str
    provider: Provider
    input: float
    output: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float
    min_cacheable_tokens: int
    cache_step_tokens: int
    batch_discount: float
    as_of: str
    source: str
    note: str | None = None
    cache_storage_per_hour: float = 0.0
    batch_stacks_cache: bool = True
    caching: Literal["automatic", "breakpoints"] = "automatic"
    retention: tuple[str, ...] = ()
    service_tiers: tuple[tuple[str, float], ...] = ()
    service_tier: str = "default"

    @property
    def cached_input(self) -> float:
        """OpenAI's name for :attr:`cache_read`."""
        return self.cache_read

    @property
    def tier_multiplier(self) -> float:
        """Prices of :attr:`service_tier` as a multiple of the standard ones (1.0 for default)."""
        return dict(self.service_tiers).get(self.service_tier, 1.0)

    def at_tier(self, tier: str | None) -> Price:
        """The price of synchronous requests sent with ``service_tier=tier``.

        Raises
        ------
        ConfigError
            A tier the model does not take.

        Examples
        --------
        >>> flex = price_for("gpt-5-mini").at_tier("flex")
        >>> flex.tier_multiplier, round(cost(flex, output_tokens=1_000_000).total, 6)
        (0.5, 1.0)
        """
        if tier is None or tier == "default":
            return replace(self, service_tier="default")
        if tier not in dict(self.service_tiers):
            takes = ", ".join(repr(t) for t, _ in self.service_tiers) or "none"
            msg = (
                f"service_tier={tier!r} is not offered for {self.model!r} "
                f"(its tiers besides 'default': {takes})."
            )
            raise ConfigError(msg)
        return replace(self, service_tier=tier)


@dataclass(frozen=True)
class Cost:
    """Dollars of one request or a sum of requests, by component.

    Examples
    --------
    >>> a = Cost(uncached_input=1.0, cached_input=0.5, cache_writes=0.0, output=2.0)
    >>> (a + a).total
    7.0
    """

    uncached_input: float = 0.0
    cached_input: float = 0.0
    cache_writes: float = 0.0
    output: float = 0.0

    @property
    def total(self) -> float:
        """Sum of all components."""
        return self.uncached_input + self.cached_input + self.cache_writes + self.output

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.uncached_input + other.uncached_input,
            self.cached_input + other.cached_input,
            self.cache_writes + other.cache_writes,
            self.output + other.output,
        )


def cost(
    price: Price,
    *,
    uncached_input_tokens: int = 0,
    cached_input_tokens: int = 0,
    cache_write_5m_tokens: int = 0,
    cache_write_1h_tokens: int = 0,
    output_tokens: int = 0,
    batch: bool = False,
) -> Cost:
    """Bill token counts at ``price``.

    Token counts are disjoint: OpenAI's ``prompt_tokens`` is
    ``uncached_input_tokens + cached_input_tokens``; Anthropic's ``input_tokens``
    is ``uncached_input_tokens`` and its cache counts are given separately.

    Parameters
    ----------
    price : Price
        From :func:`price_for`.
    uncached_input_tokens, cached_input_tokens : int
        Input tokens billed at ``input`` and at ``cache_read``.
    cache_write_5m_tokens, cache_write_1h_tokens : int
        Anthropic cache writes (always 0 on OpenAI).
    output_tokens : int
        Generated tokens.
    batch : bool
        Apply the batch discount: to every component, or, where the price says
        it does not stack with cache prices (Gemini), to uncached input and
        output only. Otherwise the price's service tier multiplier applies to
        every component (:meth:`Price.at_tier`; 1.0 for the default tier).

    Returns
    -------
    Cost

    Examples
    --------
    >>> p = price_for("claude-sonnet-4-5")
    >>> c = cost(p, uncached_input_tokens=100, cache_write_5m_tokens=2000,
    ...          cached_input_tokens=0, output_tokens=10)
    >>> round(c.cache_writes, 6), round(c.total, 6)
    (0.0075, 0.00795)
    >>> round(cost(p, output_tokens=1_000_000, batch=True).total, 2)
    7.5

    On Gemini the batch discount does not stack with the cache price:

    >>> g = price_for("gemini-2.5-flash")
    >>> c = cost(g, uncached_input_tokens=1_000_000, cached_input_tokens=1_000_000, batch=True)
    >>> round(c.uncached_input, 6), round(c.cached_input, 6)
    (0.15, 0.03)

    OpenAI's flex tier costs the batch price, synchronously:

    >>> f = price_for("gpt-5").at_tier("flex")
    >>> c = cost(f, uncached_input_tokens=1_000_000, cached_input_tokens=1_000_000)
    >>> round(c.uncached_input, 6), round(c.cached_input, 6)
    (0.625, 0.0625)
    """
    counts = (
        uncached_input_tokens,
        cached_input_tokens,
        cache_write_5m_tokens,
        cache_write_1h_tokens,
        output_tokens,
    )
    if any(n < 0 for n in counts):
        msg = f"token counts must be >= 0, got {counts}"
        raise ValueError(msg)
    k = price.batch_discount if batch else price.tier_multiplier
    kc = k if price.batch_stacks_cache or not batch else 1.0  # on cache reads and writes
    return Cost(
        uncached_input=uncached_input_tokens * price.input * k / _PER,
        cached_input=cached_input_tokens * price.cache_read * kc / _PER,
        cache_writes=(
            cache_write_5m_tokens * price.cache_write_5m
            + cache_write_1h_tokens * price.cache_write_1h
        )
        * kc
        / _PER,
        output=output_tokens * price.output * k / _PER,
    )


# ---------------------------------------------------------------- the table

_FLOAT_KEYS = (
    "input",
    "output",
    "cache_read",
    "cache_write_5m",
    "cache_write_1h",
    "batch_discount",
    "cache_storage_per_hour",
)
_INT_KEYS = ("min_cacheable_tokens", "cache_step_tokens")
_BOOL_KEYS = ("batch_stacks_cache",)
_STR_KEYS = ("as_of", "source", "note")
_CACHING = ("automatic", "breakpoints")
_RETENTION = ("in_memory", "24h")
_TIERS = ("flex", "priority")
"""OpenAI service tiers besides ``"default"`` a model's entry may list (``service_tiers``)."""
_ALIASES = {"cached_input": "cache_read"}
_CACHE_WRITE = "cache_write"
"""A write price for every TTL (OpenAI from GPT-5.6: one price whatever the lifetime)."""
_MULTIPLIERS = {
    "cache_read": "cache_read_multiplier",
    "cache_write_5m": "cache_write_5m_multiplier",
    "cache_write_1h": "cache_write_1h_multiplier",
}
"""A cache price a model's entry does not give: its input price times the provider's rule."""
_STORED_HOURS = {"cache_write_5m": 5 / 60, "cache_write_1h": 1.0}
"""Hours of storage a cache write buys, per TTL (Gemini: ``cache_storage_per_hour`` times these)."""
_VALID_KEYS = (
    "provider",
    *_FLOAT_KEYS,
    *_INT_KEYS,
    *_BOOL_KEYS,
    *_STR_KEYS,
    *_ALIASES,
    *_MULTIPLIERS.values(),
    _CACHE_WRITE,
    "caching",
    "retention",
    "service_tiers",
)
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


@functools.cache
def _table() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    text = importlib.resources.files("semframe").joinpath("data/prices.toml").read_text("utf-8")
    doc = tomllib.loads(text)
    return doc.get("defaults", {}), doc["prices"]


def _make(model: str, raw: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]]) -> Price:
    where = f"price of {model!r}"
    unknown = sorted(set(raw) - set(_VALID_KEYS))
    if unknown:
        msg = f"{where}: unknown field(s) {unknown}; valid fields: {', '.join(_VALID_KEYS)}"
        raise ConfigError(msg)
    provider = raw.get("provider")
    if provider not in _PROVIDERS:
        msg = f"{where}: provider must be one of {_PROVIDERS}, got {provider!r}"
        raise ConfigError(msg)
    values: dict[str, Any] = dict(defaults.get(provider, {}))
    for key, value in raw.items():
        values[_ALIASES.get(key, key)] = value
    for key in ("input", "output"):
        if key not in values:
            msg = f"{where}: {key!r} (dollars per million tokens) is required"
            raise ConfigError(msg)
    inp = values["input"]
    write = raw.get(_CACHE_WRITE)
    values.pop(_CACHE_WRITE, None)
    if write is not None:
        for key in ("cache_write_5m", "cache_write_1h"):
            if key not in raw:
                values[key] = write
    caching = values.setdefault("caching", "automatic")
    if caching not in _CACHING:
        msg = f"{where}: 'caching' must be one of {_CACHING}, got {caching!r}"
        raise ConfigError(msg)
    retention = values.setdefault("retention", [])
    if not isinstance(retention, list | tuple) or any(r not in _RETENTION for r in retention):
        msg = f"{where}: 'retention' must be a list of {_RETENTION}, got {retention!r}"
        raise ConfigError(msg)
    values["retention"] = tuple(retention)
    values["service_tiers"] = _service_tiers(where, values.get("service_tiers", {}))
    storage = values.setdefault("cache_storage_per_hour", 0.0)
    if isinstance(storage, bool) or not isinstance(storage, int | float) or storage < 0:
        msg = f"{where}: 'cache_storage_per_hour' must be a number >= 0, got {storage!r}"
        raise ConfigError(msg)
    for key, rule in _MULTIPLIERS.items():
        factor = values.pop(rule, 1.0)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor < 0:
            msg = f"{where}: {rule!r} must be a number >= 0, got {factor!r}"
            raise ConfigError(msg)
        if isinstance(inp, int | float) and not isinstance(inp, bool):
            values.setdefault(key, factor * inp + storage * _STORED_HOURS.get(key, 0.0))
    values.setdefault("min_cacheable_tokens", 1024)
    values.setdefault("cache_step_tokens", 1)
    values.setdefault("batch_discount", 0.5)
    values.setdefault("batch_stacks_cache", True)
    values.setdefault("as_of", "unknown")
    values.setdefault("source", "user override")
    for key in _FLOAT_KEYS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            msg = f"{where}: {key!r} must be a number >= 0, got {v!r}"
            raise ConfigError(msg)
        values[key] = float(v)
    for key in _INT_KEYS:
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            msg = f"{where}: {key!r} must be an integer >= 1, got {v!r}"
            raise ConfigError(msg)
    for key in _BOOL_KEYS:
        if not isinstance(values[key], bool):
            msg = f"{where}: {key!r} must be true or false, got {values[key]!r}"
            raise ConfigError(msg)
    for key in _STR_KEYS:
        v = values.get(key)
        if v is not None:
            values[key] = str(v)
    return Price(model=model, **values)


def _service_tiers(where: str, tiers: object) -> tuple[tuple[str, float], ...]:
    """An entry's ``service_tiers`` table, checked: tier name -> multiplier > 0."""
    if not isinstance(tiers, Mapping):
        msg = f"{where}: 'service_tiers' must be a table of tier = multiplier, got {tiers!r}"
        raise ConfigError(msg)
    out = []
    for tier, factor in tiers.items():
        if tier not in _TIERS:
            msg = f"{where}: 'service_tiers' names {tier!r}; valid tiers: {', '.join(_TIERS)}"
            raise ConfigError(msg)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0:
            msg = f"{where}: service tier {tier!r} must be a multiplier > 0, got {factor!r}"
            raise ConfigError(msg)
        out.append((str(tier), float(factor)))
    return tuple(sorted(out))


def tier_models(tier: str, overrides: Mapping[str, Any] | None = None) -> list[str]:
    """The known models that take service tier ``tier``, sorted.

    Examples
    --------
    >>> "gpt-5-mini" in tier_models("flex"), "gpt-4.1-mini" in tier_models("flex")
    (True, False)
    """
    return sorted(m for m, p in load_prices(overrides).items() if tier in dict(p.service_tiers))


def load_prices(overrides: Mapping[str, Any] | None = None) -> dict[str, Price]:
    """All known prices: the shipped table with ``overrides`` applied.

    Parameters
    ----------
    overrides : mapping of model name to mapping, optional
        ``[prices."model-name"]`` tables from ``semframe.toml``. For a model in
        the shipped table, the given fields replace the shipped ones; a new
        model needs at least ``provider``, ``input`` and ``output``.

    Examples
    --------
    >>> ps = load_prices({"my-model": {"provider": "openai", "input": 1, "output": 2}})
    >>> ps["my-model"].cache_read, ps["my-model"].source
    (1.0, 'user override')
    """
    defaults, table = _table()
    merged: dict[str, dict[str, Any]] = {m: dict(v) for m, v in table.items()}
    for model, fields_ in (overrides or {}).items():
        if not isinstance(fields_, Mapping):
            msg = f'[prices."{model}"] must be a table of fields, got {fields_!r}'
            raise ConfigError(msg)
        base = merged.get(model, {})
        update = dict(fields_)
        if not base:
            update.setdefault("source", "user override")
        elif "source" not in update:
            shipped = base.get("source") or defaults.get(base.get("provider", ""), {}).get("source")
            update["source"] = f"{shipped} (overridden in semframe.toml)"
        merged[model] = {**base, **update}
    return {m: _make(m, raw, defaults) for m, raw in merged.items()}


def known_models(overrides: Mapping[str, Any] | None = None) -> list[str]:
    """Model names with a price, sorted.

    Examples
    --------
    >>> "gpt-4o-mini" in known_models()
    True
    """
    return sorted(load_prices(overrides))


def price_for(model: str, overrides: Mapping[str, Any] | None = None) -> Price:
    """The price of ``model``.

    Dated snapshots and ``-latest`` aliases resolve to the base model
    (``gpt-4o-2024-08-06`` -> ``gpt-4o``), and a ``provider/`` prefix is ignored.

    Raises
    ------
    ConfigError
        For an unknown model; the message lists the known models and how to
        add one.

    Examples
    --------
    >>> price_for("gpt-4o-2024-08-06").model
    'gpt-4o'
    >>> price_for("no-such-model")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.ConfigError: no price for model 'no-such-model'; known models: ...
    """
    prices = load_prices(overrides)
    name = model.rsplit("/", 1)[-1] if model not in prices else model
    for candidate in (model, name, _SNAPSHOT.sub("", name)):
        if candidate in prices:
            return prices[candidate]
    seeded = _seeded(name)
    if seeded is not None:
        return seeded
    msg = (
        f"no price for model {model!r}; known models: {', '.join(sorted(prices))}. "
        f'Add one with a [prices."{model}"] table in semframe.toml, e.g. '
        f'provider = "openai", input = 0.40, cached_input = 0.10, output = 1.60 '
        f"(dollars per million tokens), or install the maintained price table that "
        f'prices hundreds more: pip install "semframe[prices]"'
    )
    raise ConfigError(msg)


def _seeded(model: str) -> Price | None:
    """``model``'s price from genai-prices (when installed), with semframe's caching rules on top.

    The provider's rules come from ``[defaults.<provider>]``; an OpenAI model
    with a cache-write price caches by breakpoints (GPT-5.6 and later).
    """
    raw = seeded_fields(model)
    if raw is None:
        return None
    flex = raw.pop("flex_discount", None)
    if flex is not None and raw["provider"] == "openai":  # flex input price over standard
        raw["service_tiers"] = {"flex": flex}
    if raw["provider"] == "openai" and "cache_write" in raw:
        raw.update(caching="breakpoints", cache_step_tokens=1, retention=[])
    raw["source"] = (
        f"{raw.get('source', 'genai-prices')} (https://github.com/pydantic/genai-prices)"
    )
    defaults, _ = _table()
    return _make(model, raw, defaults)


# ---------------------------------------------------------------- embedding models


@dataclass(frozen=True)
class EmbeddingPrice:
    """An API embedding model: its price and the provider's limits (``[embeddings."model"]``).

    Attributes
    ----------
    model : str
        The model's name at its provider.
    provider : {"openai", "gemini"}
        Which API serves it.
    input : float
        Dollars per million input tokens.
    batch_discount : float
        Multiplier of the provider's batch API (semframe sends embeddings live).
    dimensions : int
        The model's full vector size.
    max_input_tokens : int
        Longest text the model takes, in tokens.
    max_inputs : int
        Texts per request.
    max_request_tokens : int
        Tokens per request, summed over its texts (0: no such limit).
    as_of, source : str
        When the price is known to have held, and where it is published.
    note : str or None
        Caveats.

    Examples
    --------
    >>> p = embedding_price("text-embedding-3-small")
    >>> p.dimensions, p.max_inputs, round(p.dollars(1_000_000), 6)
    (1536, 2048, 0.02)
    """

    model: str
    provider: str
    input: float
    batch_discount: float
    dimensions: int
    max_input_tokens: int
    max_inputs: int
    max_request_tokens: int
    as_of: str
    source: str
    note: str | None = None

    def dollars(self, tokens: int, *, batch: bool = False) -> float:
        """What ``tokens`` input tokens cost (at the batch price with ``batch``)."""
        return tokens * self.input * (self.batch_discount if batch else 1.0) / _PER


_EMBED_INTS = ("dimensions", "max_input_tokens", "max_inputs")
_EMBED_FIELDS = (
    "provider",
    "input",
    "batch_discount",
    *_EMBED_INTS,
    "max_request_tokens",
    "as_of",
    "source",
    "note",
)


@functools.cache
def _embedding_table() -> dict[str, dict[str, Any]]:
    text = importlib.resources.files("semframe").joinpath("data/prices.toml").read_text("utf-8")
    table: dict[str, dict[str, Any]] = tomllib.loads(text).get("embeddings", {})
    return table


def _make_embedding(model: str, raw: Mapping[str, Any]) -> EmbeddingPrice:
    where = f"embedding price of {model!r}"
    unknown = sorted(set(raw) - set(_EMBED_FIELDS))
    if unknown:
        msg = f"{where}: unknown field(s) {unknown}; valid fields: {', '.join(_EMBED_FIELDS)}"
        raise ConfigError(msg)
    values: dict[str, Any] = {"batch_discount": 0.5, "max_request_tokens": 0, "as_of": "unknown"}
    values |= {"source": "user override", **raw}
    if values.get("provider") not in ("openai", "gemini"):
        msg = f"{where}: provider must be 'openai' or 'gemini', got {values.get('provider')!r}"
        raise ConfigError(msg)
    for key in ("input", "batch_discount"):
        v = values.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            msg = f"{where}: {key!r} must be a number >= 0, got {v!r}"
            raise ConfigError(msg)
    for key in (*_EMBED_INTS, "max_request_tokens"):
        v = values.get(key)
        low = 0 if key == "max_request_tokens" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            msg = f"{where}: {key!r} must be an integer >= {low}, got {v!r}"
            raise ConfigError(msg)
    return EmbeddingPrice(
        model=model,
        provider=str(values["provider"]),
        input=float(values["input"]),
        batch_discount=float(values["batch_discount"]),
        dimensions=values["dimensions"],
        max_input_tokens=values["max_input_tokens"],
        max_inputs=values["max_inputs"],
        max_request_tokens=values["max_request_tokens"],
        as_of=str(values["as_of"]),
        source=str(values["source"]),
        note=None if values.get("note") is None else str(values["note"]),
    )


def embedding_models(provider: str | None = None) -> list[str]:
    """The embedding models of the price table (of ``provider``), sorted.

    Examples
    --------
    >>> embedding_models("gemini")
    ['gemini-embedding-001']
    """
    table = _embedding_table()
    return sorted(m for m, raw in table.items() if provider in (None, raw.get("provider")))


def embedding_price(
    model: str, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> EmbeddingPrice:
    """The price and limits of embedding model ``model``.

    ``overrides`` maps model names to fields that replace the shipped ones (a
    new model needs ``provider``, ``input``, ``dimensions``,
    ``max_input_tokens`` and ``max_inputs``).

    Raises
    ------
    ConfigError
        For a model the table does not know, listing the known ones.

    Examples
    --------
    >>> small = {"gemini-embedding-001": {"max_inputs": 4}}
    >>> embedding_price("gemini-embedding-001", small).max_inputs
    4
    """
    table = _embedding_table()
    raw = {**table.get(model, {}), **(overrides or {}).get(model, {})}
    if not raw:
        msg = (
            f"no embedding price for model {model!r}; known embedding models: "
            f"{', '.join(embedding_models())}."
        )
        raise ConfigError(msg)
    return _make_embedding(model, raw)
