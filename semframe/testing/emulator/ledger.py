"""The emulator's bill: one entry per request, and totals."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from semframe.cost.pricing import Cost

__all__ = ["Ledger", "LedgerEntry", "Totals"]


@dataclass(frozen=True)
class LedgerEntry:
    """One request the emulator received.

    Attributes
    ----------
    provider : {"openai", "anthropic", "gemini"}
        Which wire format it came in.
    model : str
        Model asked for.
    status : int
        HTTP status answered (or the per-line status inside a batch); requests
        that failed are recorded with zero tokens and cost.
    prompt_tokens : int
        All prompt tokens (cached, written and uncached).
    cached_tokens : int
        Prompt tokens read from the cache.
    cache_write_5m_tokens, cache_write_1h_tokens : int
        Prompt tokens written to the cache (Anthropic; a Gemini explicit cache's
        creation, under 5m for a TTL up to 5 minutes, else 1h; 0 on OpenAI).
    output_tokens : int
        Generated tokens.
    cost : Cost
        Dollars by component, batch discount applied.
    arrival, completion : float
        Emulator clock at arrival and at completion.
    batch : bool
        Whether it was part of a batch (billed at the batch discount).
    custom_id : str or None
        The batch line's ``custom_id``.
    prompt_cache_key : str or None
        OpenAI ``prompt_cache_key`` (or ``user``) sent with the request.
    fault : str or None
        The injected fault, if one fired.
    kind : {"request", "cache"}
        A request, or the creation of a Gemini explicit cache (its tokens at
        the input price and its storage for the TTL, under ``cache_writes``).
    """

    provider: str
    model: str
    status: int
    prompt_tokens: int
    cached_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int
    cost: Cost
    arrival: float
    completion: float
    batch: bool = False
    custom_id: str | None = None
    prompt_cache_key: str | None = None
    fault: str | None = None
    kind: str = "request"

    @property
    def cache_write_tokens(self) -> int:
        """All prompt tokens written to the cache."""
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens billed at the full input price."""
        return self.prompt_tokens - self.cached_tokens - self.cache_write_tokens

    @property
    def dollars(self) -> float:
        """Total cost of the request."""
        return self.cost.total


@dataclass(frozen=True)
class Totals:
    """Sums over ledger entries.

    Attributes
    ----------
    requests : int
        Requests counted (failed ones included; explicit cache creations are not
        requests, but their tokens and cost are in the sums).
    failed : int
        Requests with a status other than 200.
    prompt_tokens, cached_tokens, cache_write_tokens, output_tokens : int
        Token sums.
    cost : Cost
        Dollar sums by component.
    """

    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost: Cost = field(default_factory=Cost)

    @property
    def dollars(self) -> float:
        """Total dollars."""
        return self.cost.total

    @property
    def cached_share(self) -> float:
        """Cached prompt tokens over all prompt tokens (0 when there are none)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Ledger:
    """Thread-safe record of every request the emulator answered."""

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._lock = threading.Lock()

    def record(self, entry: LedgerEntry) -> None:
        """Append one entry."""
        with self._lock:
            self._entries.append(entry)

    def entries(self, provider: str | None = None, model: str | None = None) -> list[LedgerEntry]:
        """A copy of the entries, optionally for one provider and/or model."""
        with self._lock:
            out = list(self._entries)
        return [
            e
            for e in out
            if (provider is None or e.provider == provider) and (model is None or e.model == model)
        ]

    def totals(self, provider: str | None = None, model: str | None = None) -> Totals:
        """Sums over :meth:`entries`.

        Examples
        --------
        >>> Ledger().totals().requests
        0
        """
        entries = self.entries(provider, model)
        total_cost = Cost()
        for e in entries:
            total_cost = total_cost + e.cost
        requests = [e for e in entries if e.kind == "request"]
        return Totals(
            requests=len(requests),
            failed=sum(e.status != 200 for e in requests),
            prompt_tokens=sum(e.prompt_tokens for e in entries),
            cached_tokens=sum(e.cached_tokens for e in entries),
            cache_write_tokens=sum(e.cache_write_tokens for e in entries),
            output_tokens=sum(e.output_tokens for e in entries),
            cost=total_cost,
        )

    def reset(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
