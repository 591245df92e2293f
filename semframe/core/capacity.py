"""What a backend's prefix cache holds: the capacity a plan and its dispatch assume.

A prefix cache is bounded. An engine's KV cache holds a fixed number of blocks
(vLLM), or one prompt per slot (llama.cpp); an API's cache keeps an entry for
minutes after its last use. Each backend's cost model declares what it knows
of its own as a :class:`Capacity` (``CostModel.capacity``), and
:meth:`semframe.core.plan.Plan.explain` says which one the plan was made for.
"""

from __future__ import annotations

from dataclasses import dataclass

from semframe.errors import ConfigError

__all__ = ["Capacity"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """A prefix cache's size and the concurrency it is shared by.

    Attributes
    ----------
    tokens : int or None
        Tokens the cache holds: the whole shared cache (cached prefixes and the
        KV of the requests in flight), or each slot's context with ``slots``.
        ``None``: no bound known (an API, an engine not measured).
    block : int
        Tokens per cache block: what is evicted and what a hit is made of.
    concurrency : int
        Requests in flight at once.
    slots : bool
        Each request in flight runs in its own slot, which keeps only the
        prefix of its last prompt (llama.cpp), rather than one shared cache.
    ttl_s : float or None
        An entry unused this many seconds is dropped (an API's cache).
    source : str
        Where the figures come from, as :meth:`describe` tells it.

    Examples
    --------
    >>> Capacity(32_768, block=16, concurrency=64, source="calibrated").describe()
    'one shared cache of 32,768 tokens (2,048 blocks of 16), 64 requests in flight (calibrated)'
    >>> Capacity(None, concurrency=32, ttl_s=300.0).describe()
    'one shared cache, unbounded, entries dropped 5 min after their last use, 32 requests in flight'
    >>> Capacity(4096, concurrency=4, slots=True).describe()
    '4 requests in flight, each on a slot keeping its last prompt (up to 4,096 tokens)'
    """

    tokens: int | None
    block: int = 1
    concurrency: int = 1
    slots: bool = False
    ttl_s: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for name, value, low in (
            ("block", self.block, 1),
            ("concurrency", self.concurrency, 1),
            ("tokens", 1 if self.tokens is None else self.tokens, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                msg = f"Capacity.{name} must be an int >= {low}, got {value!r}."
                raise ConfigError(msg)

    @property
    def blocks(self) -> int | None:
        """Whole blocks the cache holds (``None`` when unbounded)."""
        return None if self.tokens is None else self.tokens // self.block

    def describe(self) -> str:
        """The capacity in a phrase (what :meth:`Plan.explain` prints)."""
        if self.slots:
            size = "its last prompt" + (
                "" if self.tokens is None else f" (up to {self.tokens:,} tokens)"
            )
            plural = "s" if self.concurrency != 1 else ""
            text = f"{self.concurrency:,} request{plural} in flight, each on a slot keeping {size}"
        else:
            if self.tokens is None:
                size = "unbounded"
            elif self.block > 1:
                size = f"of {self.tokens:,} tokens ({self.blocks:,} blocks of {self.block})"
            else:
                size = f"of {self.tokens:,} tokens"
            ttl = (
                ""
                if self.ttl_s is None
                else f", entries dropped {_duration(self.ttl_s)} after their last use"
            )
            sep = ", " if self.tokens is None else " "
            text = (
                f"one shared cache{sep}{size}{ttl}, {self.concurrency:,} "
                f"request{'s' if self.concurrency != 1 else ''} in flight"
            )
        return text + (f" ({self.source})" if self.source else "")


def _duration(seconds: float) -> str:
    """``300.0`` -> ``'5 min'``; ``86400.0`` -> ``'24 h'``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
