"""The one narrow backend protocol; the data that crosses it is :mod:`semframe.core.wire`.

A backend answers one request at a time (:meth:`Backend.complete`) and counts
tokens. Everything else the executor, the estimator and batch mode need to
know is declared as data: :class:`Capabilities` (what it can do, how it is
driven) and its cost model (``Backend.cost``, :mod:`semframe.cost.models`: how
it bills and how its prompt cache behaves). Nothing outside ``semframe/backends``
asks a backend its name or probes it for methods: a backend with
``capabilities.async_io`` also implements :class:`AsyncBackend`, one with
``capabilities.batch_api`` implements :class:`BatchBackend`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from semframe.core.wire import Completion, Request, TokenLogprob, Usage
from semframe.cost.models import CostModel
from semframe.errors import RequestRejected, TransientError

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncBackend",
    "Backend",
    "BatchBackend",
    "BatchResult",
    "BatchStatus",
    "Capabilities",
    "Completion",
    "Request",
    "TokenLogprob",
    "Usage",
]

DEFAULT_TIMEOUT = 120.0
"""Seconds one attempt of a request may wait for its answer, unless the backend or the
``timeout`` setting says otherwise."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do and how the executor drives it; read instead of type checks.

    Attributes
    ----------
    prefix_cache : {"none", "per_slot", "shared"}
        Where prefix reuse happens: nowhere, in a per-slot KV cache (llama.cpp:
        route a prefix group to one slot), or in one shared cache (vLLM, APIs).
    json_schema : bool
        Whether ``Request.schema`` constrains decoding.
    logprobs : bool
        Whether completions carry token logprobs.
    max_concurrency : int
        Requests the backend serves at once.
    context_window : int or None
        Tokens per request (prompt + output), when known.
    relquery_aware : bool
        The engine schedules by relQuery (our scheduler inside vLLM): the
        executor tags each request with its run's identity and size
        (``Request.rel``, ``Request.rel_size``).
    async_io : bool
        Requests are awaited (:class:`AsyncBackend`) on semframe's I/O loop:
        up to ``max_concurrency`` in flight, client-side rate limits and a
        deadline per attempt apply. Otherwise the executor runs one thread per
        slot and calls :meth:`Backend.complete`.
    batch_api : bool
        The provider has a batch API (:class:`BatchBackend`), used with
        ``batch=True``.
    batch_limit : int
        Requests per provider batch (with ``batch_api``).
    calibrate : bool
        ``filter`` and ``classify`` decide from calibrated label probabilities
        by default (``calibrate="auto"``, see
        :mod:`semframe.operators.calibration`): engines running a small model
        whose answer text leans to one label. Needs ``logprobs``.
    restate : bool
        The model answers what it read last (a small model): the row-by-row
        operators ask the question again after each row's fields, short values
        inline, and name fields in words rather than ``[brackets]`` it would
        copy (``RelQuery.restate``). The instructions stay first and shared.
    answer_timeout : float
        The most seconds one attempt waits for its answer where the ``timeout``
        setting is not given (:data:`DEFAULT_TIMEOUT`; a slower service tier
        declares more).
    """

    prefix_cache: Literal["none", "per_slot", "shared"] = "none"
    json_schema: bool = False
    logprobs: bool = False
    max_concurrency: int = 1
    context_window: int | None = None
    relquery_aware: bool = False
    async_io: bool = False
    batch_api: bool = False
    batch_limit: int = 0
    calibrate: bool = False
    restate: bool = False
    answer_timeout: float = DEFAULT_TIMEOUT


@runtime_checkable
class Backend(Protocol):
    """What the executor needs from an LLM engine or API.

    Attributes
    ----------
    name : str
        The registry name (``"local"``, ``"openai"``...).
    model : str
        The model it runs.
    endpoint : str or None
        Where requests go beyond name and model (an API's ``base_url``); part
        of the result cache's keys, so answers of two servers never mix.
    capabilities : Capabilities
        What it can do.
    cost : CostModel
        How it bills and how its prompt cache behaves.
    """

    name: str
    model: str
    endpoint: str | None
    capabilities: Capabilities
    cost: CostModel

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        """Answer one request.

        ``slot`` is a routing hint: requests given the same slot should be
        served by the same cache (a llama.cpp slot). A request that fails in a
        retryable way raises :class:`semframe.errors.TransientError`; one the
        backend refuses raises :class:`semframe.errors.RequestRejected`.
        """
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts of ``texts`` under the backend's tokenizer."""
        ...

    def close(self) -> None:
        """Release what the backend holds (connections, an engine); it reopens on use."""
        ...


class AsyncBackend(Backend, Protocol):
    """A backend whose requests are awaited (``capabilities.async_io``)."""

    async def acomplete(self, request: Request) -> Completion:
        """Answer one request on semframe's I/O loop; errors as for ``complete``."""
        ...


@dataclass(frozen=True)
class BatchStatus:
    """Where a provider batch stands.

    Attributes
    ----------
    id : str
        The provider's batch id.
    state : str
        The provider's own status word (``in_progress``, ``ended``...).
    done : bool
        Whether results can be fetched (or the batch ended without them).
    counts : mapping
        Request counts by state, as the provider reports them.
    """

    id: str
    state: str
    done: bool
    counts: Mapping[str, int] = field(default_factory=dict)


BatchResult = Completion | TransientError | RequestRejected
"""One request's batch outcome: an answer, a retryable failure, or a refusal."""


class BatchBackend(Backend, Protocol):
    """A backend with a provider batch API (``capabilities.batch_api``)."""

    def batch_submit(self, requests: Sequence[Request]) -> str:
        """Start a batch of ``requests``; returns its id."""
        ...

    def batch_status(self, batch_id: str) -> BatchStatus:
        """Where the batch stands."""
        ...

    def batch_results(self, batch_id: str) -> dict[int, BatchResult]:
        """Outcomes by plan position; requests missing from the output are absent."""
        ...
