"""The one scheduler interface: requests as policies see them, budgets, decisions.

A :class:`Scheduler` is a *policy*: it owns the waiting queue's order, says
whether the next step should run prefills or decodes, which running request to
preempt first, and learns from finished batches. It never allocates KV blocks
or runs a model; the engine does (the simulator in :mod:`semframe.serving.sim`, or
vLLM's V1 scheduler through a subclass that replaces its waiting queue and
consults :meth:`Scheduler.prefer_prefill` each step). The engine loop is::

    sched.add_waiting(req, now)                 # arrival (or prepend on preemption)
    sched.update(ctx)                           # start of a step: refresh priorities
    for req in sched.iter_waiting(ctx): ...     # admit in this order while budgets allow
    sched.prefer_prefill(prefill, decode, ctx)  # both candidates non-empty: which runs
    sched.remove_waiting(req)                   # for each admitted request
    sched.observe(record, ctx)                  # after the batch, with finished requests

Policies read only :class:`SchedRequest` fields and the :class:`SchedContext`,
so the same code runs over simulated and real engine state.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True, eq=False)
class SchedRequest:
    """One request as a policy sees it: identity, relQuery, sizes, progress.

    The engine owns the progress fields and updates them after each step.

    Attributes
    ----------
    req_id : int
        Unique id.
    rel_id : int
        The relQuery it belongs to.
    rel_size : int
        Requests in that relQuery when it arrived, ``req(R_0)``.
    template : str
        The relQuery's template (its identity for grouping and reporting).
    prompt_len : int
        Prompt tokens.
    max_tokens : int
        Output limit, ``OL(R)``; the true output length is unknown to policies.
    arrival : float
        Arrival time in seconds.
    block_hashes : tuple of int
        Chained hashes of the prompt's full KV blocks (prefix-cache keys).
    num_computed : int
        Tokens whose KV is computed (prompt, then generated tokens).
    num_output : int
        Tokens generated so far.
    num_cached : int
        Prompt tokens found in the prefix cache at the last admission.
    num_preemptions : int
        Times it was preempted and must be recomputed.
    """

    req_id: int
    rel_id: int
    rel_size: int
    template: str
    prompt_len: int
    max_tokens: int
    arrival: float
    block_hashes: tuple[int, ...] = ()
    num_computed: int = 0
    num_output: int = 0
    num_cached: int = 0
    num_preemptions: int = 0

    @property
    def num_known(self) -> int:
        """Prompt plus generated tokens: what a (re)fill must compute."""
        return self.prompt_len + self.num_output

    @property
    def in_prefill(self) -> bool:
        """Whether the next step of this request is (part of) a prefill or refill."""
        return self.num_computed < self.num_known - (1 if self.num_output else 0)


class Phase(enum.Enum):
    """Kind of a batch."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


class BatchMode(enum.Enum):
    """How a policy builds batches.

    ``PREFILL_FIRST``: a prefill-only batch whenever a waiting request can be
    admitted, else a decode batch of all running requests (vLLM's default, v0).
    ``DECODE_FIRST``: every running request decodes, remaining token budget goes
    to (chunked) prefills in the same batch (Sarathi). ``ADAPTIVE``: build both
    candidates and let :meth:`Scheduler.prefer_prefill` choose (RelServe's ABA).
    """

    PREFILL_FIRST = "prefill_first"
    DECODE_FIRST = "decode_first"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True, slots=True)
class Budgets:
    """Per-step limits of the engine.

    Attributes
    ----------
    max_num_seqs : int
        Requests running at once (and per batch).
    max_num_batched_tokens : int
        Tokens processed per batch.
    num_blocks : int
        KV cache blocks in all.
    block_size : int
        Tokens per KV block.
    chunked_prefill : bool
        Whether a prompt may be split across batches.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    num_blocks: int = 2048
    block_size: int = 16
    chunked_prefill: bool = False

    @property
    def kv_tokens(self) -> int:
        """KV cache capacity in tokens (``cap`` in RelServe's Algorithm 1)."""
        return self.num_blocks * self.block_size


class CacheView(Protocol):
    """What policies may ask of the engine's prefix cache."""

    def cached_prefix(self, req: SchedRequest) -> int:
        """Prompt tokens of ``req`` already in the cache (exact walk)."""
        ...

    def probe_prefix(self, req: SchedRequest) -> int:
        """A cheap estimate of :meth:`cached_prefix` (may be approximate)."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks free or evictable right now."""
        ...


@dataclass(slots=True)
class SchedContext:
    """What the engine tells a policy at the start of a step.

    Attributes
    ----------
    now : float
        Simulated (or wall-clock) time.
    running : sequence of SchedRequest
        Requests holding KV cache, in the engine's order.
    cache : CacheView
        The prefix cache.
    budgets : Budgets
        The engine's limits.
    """

    now: float
    running: Sequence[SchedRequest]
    cache: CacheView
    budgets: Budgets


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One request's share of a batch."""

    req_id: int
    rel_id: int
    num_tokens: int
    num_context: int
    prefill: bool


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A finished batch, as the engine reports it to :meth:`Scheduler.observe`.

    Attributes
    ----------
    start, end : float
        Times the batch started and finished.
    items : tuple of BatchItem
        What each request computed: ``num_tokens`` new tokens on top of
        ``num_context`` tokens already in its KV cache.
    admitted : tuple of int
        Requests that left the waiting queue in this batch.
    finished : tuple of int
        Requests that completed in this batch.
    output_lens : tuple of int
        Output lengths of the finished requests (same order).
    preempted : tuple of int
        Requests preempted (sent back to waiting) while forming this batch.
    """

    start: float
    end: float
    items: tuple[BatchItem, ...]
    admitted: tuple[int, ...] = ()
    finished: tuple[int, ...] = ()
    output_lens: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        """Tokens processed by the batch."""
        return sum(i.num_tokens for i in self.items)

    @property
    def phase(self) -> Phase:
        """Prefill, decode or mixed."""
        kinds = {i.prefill for i in self.items}
        if kinds == {True}:
            return Phase.PREFILL
        if kinds == {False}:
            return Phase.DECODE
        return Phase.MIXED


class FifoQueue:
    """Insertion-ordered set of requests: O(1) add, remove and pop-front.

    Examples
    --------
    >>> q = FifoQueue()
    >>> a, b = (SchedRequest(i, 0, 2, "t", 10, 5, 0.0) for i in range(2))
    >>> q.add(a); q.add(b); q.prepend(b)
    >>> [r.req_id for r in q]
    [1, 0]
    >>> q.remove(b); len(q)
    1
    """

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[int, SchedRequest] = {}

    def add(self, req: SchedRequest) -> None:
        """Append at the back."""
        self._items[req.req_id] = req

    def prepend(self, req: SchedRequest) -> None:
        """Put at the front (a preempted request resumes first)."""
        self._items.pop(req.req_id, None)
        self._items = {req.req_id: req, **self._items}

    def remove(self, req: SchedRequest) -> None:
        """Remove (no error when absent)."""
        self._items.pop(req.req_id, None)

    def __iter__(self) -> Iterator[SchedRequest]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def first(self) -> SchedRequest | None:
        """The front request, or None."""
        return next(iter(self._items.values()), None)


@dataclass
class Scheduler(ABC):
    """A scheduling policy.

    Subclasses choose the waiting order (:meth:`iter_waiting`), the batch mode,
    the prefill-vs-decode choice, preemption victims and what to learn from
    finished batches. The base class keeps a FIFO waiting queue.

    Attributes
    ----------
    mode : BatchMode
        How the engine builds batches for this policy.
    single_relquery_prefill : bool
        Whether a prefill batch may only hold requests of one relQuery
        (RelServe's candidate prefill batch).
    """

    mode: BatchMode = BatchMode.PREFILL_FIRST
    single_relquery_prefill: bool = False
    _waiting: FifoQueue = field(default_factory=FifoQueue, init=False, repr=False)

    @property
    @abstractmethod
    def name(self) -> str:
        """The policy's name (an :class:`semframe.serving.sched.Policy` value)."""

    # -- waiting queue -------------------------------------------------------
    def add_waiting(self, req: SchedRequest, now: float) -> None:
        """A request arrived."""
        self._waiting.add(req)

    def prepend_waiting(self, req: SchedRequest) -> None:
        """A preempted request goes back to waiting, ahead of the others."""
        self._waiting.prepend(req)

    def remove_waiting(self, req: SchedRequest) -> None:
        """A request was admitted (it now holds KV cache)."""
        self._waiting.remove(req)

    def num_waiting(self) -> int:
        """Requests waiting."""
        return len(self._waiting)

    def iter_waiting(self, ctx: SchedContext) -> Iterator[SchedRequest]:
        """Waiting requests in admission order (lazy: engines stop early)."""
        return iter(self._waiting)

    # -- per-step decisions ----------------------------------------------------
    def update(self, ctx: SchedContext) -> None:  # noqa: B027 - optional hook
        """Start of a step: refresh priorities. Default: nothing."""

    def prefer_prefill(
        self,
        prefill: Sequence[SchedRequest],
        decode: Sequence[SchedRequest],
        ctx: SchedContext,
    ) -> bool:
        """Both candidate batches are non-empty: run the prefill one? Default: yes."""
        return True

    def running_order(self, running: Sequence[SchedRequest]) -> list[SchedRequest]:
        """Running requests, most important first; preemption takes from the end.

        Default (vLLM): arrival order, so the newest is preempted first.
        """
        return list(running)

    def reserve_tokens(self, req: SchedRequest) -> int:
        """Extra KV tokens to keep free when admitting ``req``. Default: 0."""
        return 0

    def observe(self, record: BatchRecord, ctx: SchedContext) -> None:  # noqa: B027
        """A batch finished. Default: nothing."""

    def on_finished(self, reqs: Iterable[SchedRequest], now: float) -> None:  # noqa: B027
        """Requests completed (called before :meth:`observe`). Default: nothing."""
