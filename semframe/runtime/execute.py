"""Run a plan on a backend: group-aware dispatch, retries, progress, statistics.

Dispatch follows the prefix groups of the plan (see "Concurrency meets prefix
caches" in the design). Each worker owns one slot of the backend. A worker takes
the next unstarted prefix group and sends its requests one after another to its
own slot, so the group's shared prefix is computed once and then served from
that slot's cache. When no group is left unstarted, an idle worker helps with
the group that has the most requests left, but only after that group's first
request has finished, so that the shared prefix is cached before anyone else
needs it. Other groups keep the other slots busy meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from semframe.backends import aio as _aio
from semframe.backends.base import Backend, Completion, Request, TokenLogprob, Usage
from semframe.core.parse import ParseError
from semframe.core.plan import Plan, PrefixGroup
from semframe.errors import (
    BudgetExceeded,
    RequestRejected,
    RunAborted,
    SemframeError,
    TransientError,
)
from semframe.runtime.progress import Progress

if TYPE_CHECKING:
    from semframe.cache.store import ResultCache


class Outcome(NamedTuple):
    """What became of one request: a parsed value, or why there is none.

    Attributes
    ----------
    value : object
        The parsed answer (``None`` when ``error`` is set).
    raw : str or None
        The raw answer text of the last attempt.
    error_kind : str or None
        ``"parse"`` or ``"backend"`` when the row failed.
    error : str or None
        Detail of the failure.
    attempts : int
        Times the request was sent.
    logprobs : tuple of TokenLogprob or None
        The answer's tokens with their log probabilities, when the request asked
        for them and the backend gave them.
    """

    value: Any
    raw: str | None
    error_kind: str | None
    error: str | None
    attempts: int
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def ok(self) -> bool:
        """Whether the row has a value."""
        return self.error_kind is None


@dataclass(frozen=True, slots=True)
class RunStats:
    """Statistics of one operator call (``semframe.last_run()``).

    Token figures are what the backend reported, summed over every attempt;
    rows served from the result cache send nothing and count in ``cache_hits``
    only (``cache_saved_dollars`` is what their stored usage would have cost;
    ``None`` where the model has no price).
    """

    op: str
    backend: str
    model: str
    reorder: str
    rows: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    errors: int
    retries: int
    wall_seconds: float
    workers: int
    expected_hit_rate: float
    dollars: float | None = None
    batch: bool = False
    cache_hits: int = 0
    cache_saved_dollars: float | None = None

    @property
    def cached_share(self) -> float:
        """Share of prompt tokens served from the backend's prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def __repr__(self) -> str:
        return (
            f"RunStats({self.op} on {self.backend}/{self.model}, reorder={self.reorder}: "
            f"{self.rows} rows, {self.requests} requests, {self.errors} errors, "
            f"{self.retries} retries; prompt {self.prompt_tokens:,} tok, cached "
            f"{self.cached_tokens:,} ({self.cached_share:.1%}), output {self.output_tokens:,} "
            f"tok; {self.wall_seconds:.2f} s with {self.workers} worker(s)"
            + (f"; ${self.dollars:.4f}" if self.dollars is not None else "")
            + (" (batch)" if self.batch else "")
            + (f"; {self.cache_hits} from the result cache" if self.cache_hits else "")
            + (
                f" (saved ${self.cache_saved_dollars:.4f})"
                if self.cache_hits and self.cache_saved_dollars is not None
                else ""
            )
            + ")"
        )


_last_run: RunStats | None = None

StopWhen = Callable[[Usage, int, int], bool]
"""``stop_when(spent, answered, in_flight)``: asked before each request is dispatched.

``spent`` sums the usage reported so far (every attempt), ``answered`` counts
requests with a final outcome and ``in_flight`` those sent and not yet
answered. Returning True stops dispatching; requests in flight complete and
are kept (see :func:`execute`)."""

stop_when_var: ContextVar[StopWhen | None] = ContextVar("semframe_stop_when", default=None)
"""The ``stop_when`` hook :func:`execute` uses when it is given none (operators set it
for a ``budget=``)."""


def last_run() -> RunStats | None:
    """Statistics of the most recent operator call in this process.

    Examples
    --------
    >>> import pandas as pd, semframe
    >>> _ = pd.DataFrame({"t": ["a"]}).llm.map("Echo {t}", backend="fake")
    >>> semframe.last_run().rows
    1
    """
    return _last_run


@dataclass
class _Totals:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    sent: int = 0
    retries: int = 0
    errors: int = 0
    done: int = 0
    cache_hits: int = 0
    saved: Usage = dataclasses.field(default_factory=Usage)  # usage of rows served from cache

    def add(self, usage: Usage) -> None:
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.output_tokens += usage.output_tokens
        self.sent += 1


@dataclass
class _Group:
    start: int
    stop: int
    next: int
    leader_done: bool = False


class _Dispatcher:
    """Hands out requests to workers, prefix group by prefix group."""

    def __init__(self, plan: Plan) -> None:
        self.groups = [_Group(g.start, g.stop, g.start) for g in plan.groups]
        self.unstarted: deque[int] = deque(range(len(self.groups)))
        self.cond = threading.Condition()
        self.in_flight = 0
        self.stopped = False
        self.should_stop: Callable[[int], bool] | None = None
        self.halted = False  # stopped by ``should_stop``

    def _halt(self) -> bool:
        """Ask ``should_stop``; on True stop handing out requests (call with the lock held)."""
        if self.should_stop is not None and self.should_stop(self.in_flight):
            self.stopped = self.halted = True
            self.cond.notify_all()
        return self.stopped

    def take(self, current: int | None) -> tuple[int, int] | None:
        """Next (group, request) for a worker whose last group was ``current``."""
        with self.cond:
            while not self.stopped:
                if self._halt():
                    return None
                if current is not None:
                    g = self.groups[current]
                    if g.next < g.stop and g.leader_done:
                        return self._pop(current)
                if self.unstarted:
                    return self._pop(self.unstarted.popleft())
                best, best_left = None, 0
                for i, g in enumerate(self.groups):
                    left = g.stop - g.next
                    if g.leader_done and left > best_left:
                        best, best_left = i, left
                if best is not None:
                    return self._pop(best)
                if self.in_flight == 0:
                    return None
                self.cond.wait()
            return None

    def _pop(self, index: int) -> tuple[int, int]:
        g = self.groups[index]
        request = g.next
        g.next += 1
        self.in_flight += 1
        return index, request

    def done(self, index: int, request: int) -> None:
        with self.cond:
            g = self.groups[index]
            if request == g.start:
                g.leader_done = True
            self.in_flight -= 1
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class _NaiveDispatcher(_Dispatcher):
    """Baseline: plan order, first come first served, no group awareness."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.next = 0
        self.total = len(plan.requests)

    def take(self, current: int | None) -> tuple[int, int] | None:
        with self.cond:
            if self.stopped or self.next >= self.total or self._halt():
                return None
            self.next += 1
            self.in_flight += 1
            return 0, self.next - 1

    def done(self, index: int, request: int) -> None:
        with self.cond:
            self.in_flight -= 1


_SEND = None  # what a retry policy yields when it wants the request sent


def _policy(
    request: Request,
    parse: Callable[[str], Any],
    totals: _Totals,
    lock: threading.Lock,
    *,
    max_retries: int,
    parse_retries: int,
    keep: Callable[[Request, Completion], None] | None = None,
) -> Any:
    """Retry policy of one request, as a generator shared by every driver.

    It yields ``_SEND`` when the request should be sent and a number of seconds
    when the driver should wait; it is sent back a :class:`Completion` or the
    :class:`TransientError` / :class:`RequestRejected` the attempt raised; it
    returns the :class:`Outcome`. ``keep`` is given every answer that parsed
    (the result cache stores it).
    """
    attempts = 0
    transient_left = max_retries
    parse_left = parse_retries
    raw: str | None = None
    while True:
        attempts += 1
        result = yield _SEND
        if isinstance(result, TransientError | RequestRejected):
            with lock:
                totals.sent += 1
            if isinstance(result, RequestRejected) or transient_left <= 0:
                return Outcome(None, raw, "backend", str(result), attempts)
            transient_left -= 1
            with lock:
                totals.retries += 1
            yield _backoff(attempts, result.retry_after)
            continue
        raw = result.text
        with lock:
            totals.add(result.usage)
        try:
            value = parse(raw)
        except ParseError as exc:
            if parse_left <= 0:
                return Outcome(None, raw, "parse", str(exc), attempts)
            parse_left -= 1
            with lock:
                totals.retries += 1
            continue
        if keep is not None:
            keep(request, result)
        return Outcome(value, raw, None, None, attempts, result.tokens)


def execute(
    plan: Plan,
    backend: Backend,
    *,
    max_concurrency: int | None = None,
    max_retries: int = 3,
    parse_retries: int = 1,
    progress: str = "auto",
    group_aware: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    rpm: int | None = None,
    tpm: int | None = None,
    deadline: float | None = None,
    prices: Mapping[str, Mapping[str, Any]] | None = None,
    stop_when: StopWhen | None = None,
    cache: ResultCache | None = None,
    cache_keys: Sequence[str | None] | None = None,
) -> tuple[list[Outcome], RunStats]:
    """Send every request of ``plan`` to ``backend``; parse answers; never drop a row.

    Backends with an async ``acomplete`` (the API backends) run on semframe's
    I/O loop with up to ``max_concurrency`` requests in flight, prefix groups
    fanned out as soon as their first request has been answered (so the
    provider has cached the prefix) and client-side rate limits applied. Other
    backends run on worker threads, one slot each (see the module docs).

    Parameters
    ----------
    plan : Plan
        What to send, in order.
    backend : Backend
        Where to send it.
    max_concurrency : int, optional
        Upper bound on requests in flight (the backend's own limit applies too).
    max_retries : int
        Retries of a request that failed with a :class:`TransientError`.
    parse_retries : int
        Re-sends of a request whose answer did not parse.
    progress : {"auto", "on", "off"}
        Progress line mode.
    group_aware : bool
        Dispatch by prefix group (the default). ``False`` is the naive baseline
        kept for benchmarks: requests go out in plan order to whichever worker
        is free, with no slot hint.
    sleep : callable
        Used for backoff on the thread path (tests pass a fake clock).
    rpm, tpm : int, optional
        Client-side limits (async backends): requests and tokens per minute,
        tokens estimated as prompt bytes / 4 plus ``max_tokens``.
    deadline : float, optional
        Seconds after which one attempt of an async request counts as timed out
        (a guard above the SDK's own timeout).
    prices : mapping, optional
        Price overrides for the run's dollar figure (see :mod:`semframe.cost.pricing`).
    stop_when : callable, optional
        Budget hook (:data:`StopWhen`), asked before each request is
        dispatched; default :data:`stop_when_var`. When it returns True no
        further request is sent, requests in flight complete, and
        :class:`~semframe.errors.BudgetExceeded` is raised with ``outcomes``
        (caller's row order, ``None`` for rows never sent) and ``stats``.
    cache : ResultCache, optional
        The result cache (:mod:`semframe.cache.store`): cacheable requests found there
        are answered from it without being sent (an answer that no longer
        parses is sent again), and new answers are stored as they arrive. The
        caller closes it.
    cache_keys : sequence of str or None, optional
        The requests' cache keys (:func:`plan_keys`) when the caller has them.

    Returns
    -------
    outcomes : list of Outcome
        Aligned with ``plan.requests`` (execution order).
    stats : RunStats
        Totals for the run.

    Raises
    ------
    RunAborted
        When the backend fails for every request alike (a rejected key); rows
        answered before the stop are attached to it.
    BudgetExceeded
        When ``stop_when`` stopped the run (see above).
    """
    start = time.monotonic()
    stop_when = stop_when or stop_when_var.get()
    n = len(plan.requests)
    outcomes: list[Outcome | None] = [None] * n
    totals = _Totals()
    lock = threading.Lock()
    parse = plan.relquery.output.parse
    send, keep = plan, None
    if cache is not None:
        send, keep = _serve_cached(plan, backend, cache, outcomes, totals, keys=cache_keys)
    if backend.capabilities.relquery_aware and send.requests:
        send = _tag_relquery(send)
    m = len(send.requests)
    workers = max(1, min(backend.capabilities.max_concurrency, max_concurrency or m or 1, m or 1))
    bar = Progress(n, f"{plan.relquery.op} on {backend.name}", mode=progress)
    if totals.cache_hits and bar.enabled:
        bar.update(totals.done, 0, 0, 0)

    def policy(request: Request) -> Any:
        return _policy(
            request,
            parse,
            totals,
            lock,
            max_retries=max_retries,
            parse_retries=parse_retries,
            keep=keep,
        )

    def run_one(request: Request, slot: int | None) -> Outcome:
        steps = policy(request)
        command = next(steps)
        while True:
            result: Any = None
            if command is _SEND:
                try:
                    result = _one(backend, request, slot)
                except (TransientError, RequestRejected) as exc:
                    result = exc
            else:
                sleep(command)
            try:
                command = steps.send(result)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome

    def record(pos: int, outcome: Outcome) -> None:
        outcomes[pos] = outcome
        with lock:
            totals.done += 1
            if not outcome.ok:
                totals.errors += 1
            if bar.enabled:
                bar.update(totals.done, totals.prompt_tokens, totals.cached_tokens, totals.errors)

    def record_at(pos: int, outcome: Outcome) -> None:  # ``pos`` in ``send``
        record(send.requests[pos].id, outcome)

    should_stop = None
    if stop_when is not None:
        hook = stop_when

        def should_stop(in_flight: int) -> bool:
            with lock:
                spent = Usage(
                    totals.prompt_tokens,
                    totals.cached_tokens,
                    totals.cache_write_tokens,
                    totals.output_tokens,
                )
                answered = totals.done - totals.cache_hits
            return hook(spent, answered, in_flight)

    halted: list[bool] = []
    acomplete = getattr(backend, "acomplete", None)
    try:
        if m == 0:
            pass  # everything came from the result cache
        elif acomplete is not None:
            limiter = _RateLimiter(rpm, tpm) if (rpm or tpm) else None
            _aio.run(
                _run_async(
                    send,
                    workers,
                    acomplete=acomplete,
                    policy=policy,
                    record=record_at,
                    limiter=limiter,
                    deadline=deadline,
                    should_stop=should_stop,
                    halted=halted,
                )
            )
        elif workers == 1:
            for request in send.requests:
                if should_stop is not None and should_stop(0):
                    halted.append(True)
                    break
                record(request.id, run_one(request, 0))
        else:
            _run_threads(
                send,
                workers,
                run_one,
                record_at,
                group_aware=group_aware,
                should_stop=should_stop,
                halted=halted,
            )
    except RunAborted as exc:
        exc.outcomes = plan.restore(outcomes)
        exc.answered = sum(1 for o in outcomes if o is not None and o.ok)
        exc.args = (f"{exc.args[0]} ({exc.answered} of {n} rows had been answered)",)
        raise
    finally:
        bar.close()
        if cache is not None:
            cache.flush()  # answers so far are kept, however the run ended
    done = [o for o in outcomes if o is not None]
    if halted and len(done) != n:
        stats = _stats(plan, backend, totals, start, workers, batch=False, prices=prices)
        record_run(stats)
        stop = BudgetExceeded(
            f"stopped after {len(done)} of {n} requests: the budget hook said stop "
            "(requests in flight were completed and kept)"
        )
        stop.outcomes = plan.restore(outcomes)
        stop.stats = stats
        raise stop
    if len(done) != n:  # pragma: no cover - guarded by the dispatcher
        msg = f"internal error: {n - len(done)} requests were never answered"
        raise SemframeError(msg)
    stats = _stats(plan, backend, totals, start, workers, batch=False, prices=prices)
    record_run(stats)
    return done, stats


def record_run(stats: RunStats) -> None:
    """Make ``stats`` what :func:`last_run` returns."""
    global _last_run
    _last_run = stats


def _stats(
    plan: Plan,
    backend: Backend,
    totals: _Totals,
    start: float,
    workers: int,
    *,
    batch: bool,
    prices: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunStats:
    return RunStats(
        op=plan.relquery.op,
        backend=backend.name,
        model=backend.model,
        reorder=plan.reorder,
        rows=len(plan.requests),
        requests=totals.sent,
        prompt_tokens=totals.prompt_tokens,
        cached_tokens=totals.cached_tokens,
        cache_write_tokens=totals.cache_write_tokens,
        output_tokens=totals.output_tokens,
        errors=totals.errors,
        retries=totals.retries,
        wall_seconds=time.monotonic() - start,
        workers=workers,
        expected_hit_rate=plan.expected_hit_rate,
        dollars=bill(backend, totals, batch=batch, prices=prices),
        batch=batch,
        cache_hits=totals.cache_hits,
        cache_saved_dollars=bill(backend, totals.saved, batch=batch, prices=prices),
    )


def _tag_relquery(plan: Plan) -> Plan:
    """Tag each request with this run's relQuery id and size (relQuery-aware engines)."""
    rel = uuid.uuid4().hex[:16]
    size = len(plan.requests)
    requests = tuple(r._replace(rel=rel, rel_size=size) for r in plan.requests)
    return dataclasses.replace(plan, requests=requests)


def serve_from_cache(
    plan: Plan,
    backend: Backend,
    cache: ResultCache,
    outcomes: list[Outcome | None],
    totals: _Totals,
    *,
    keys: Sequence[str | None] | None = None,
) -> Callable[[Request, Completion], None]:
    """Fill ``outcomes`` (plan order) from ``cache``; returns the hook that stores new answers.

    A stored answer that does not parse (the parser changed, say) is not
    served: its request is sent again and the new answer replaces it. Served
    rows count in ``totals.cache_hits`` and ``totals.saved``. ``keys`` are the
    requests' cache keys when the caller has them (``None`` for a request that
    is not cacheable); they are computed otherwise.
    """
    if keys is None:
        keys = plan_keys(plan, backend)
    try:
        served = serve_stored(cache, keys, plan.relquery.output.parse, outcomes)
    except sqlite3.Error:  # an unreadable cache never stops a run
        served = Served(0, Usage(), [])
    totals.cache_hits = totals.done = served.rows
    totals.saved = served.usage
    with contextlib.suppress(sqlite3.Error):
        cache.touch(dict.fromkeys(served.stale))
        cache.count_hits(backend.name, backend.model, served.rows)

    def keep(request: Request, completion: Completion) -> None:
        key = keys[request.id]
        if key is not None:
            cache.put(key, backend, completion)

    return keep


def plan_keys(plan: Plan, backend: Backend) -> list[str | None]:
    """The cache key of each request of ``plan`` (``None``: not cacheable), in plan order."""
    from semframe.cache.store import cacheable, request_keys

    wanted = [r for r in plan.requests if cacheable(r)]
    if len(wanted) == len(plan.requests):
        return list(request_keys(backend, wanted))
    keys: list[str | None] = [None] * len(plan.requests)
    for r, key in zip(wanted, request_keys(backend, wanted), strict=True):
        keys[r.id] = key
    return keys


class Served(NamedTuple):
    """What :func:`serve_stored` served: rows, their stored usage, keys due a touch."""

    rows: int
    usage: Usage
    stale: list[str]


def serve_stored(
    cache: ResultCache,
    keys: Sequence[str | None],
    parse: Callable[[str], Any],
    outcomes: list[Outcome | None],
) -> Served:
    """Set ``outcomes[i]`` for each ``keys[i]`` whose answer ``cache`` holds and parses.

    Outcomes of keys not stored (or ``None``), or whose answer does not parse,
    stay as they are. Served entries last used more than
    :data:`~semframe.cache.store.TOUCH_SECONDS` ago are listed as stale.

    Raises
    ------
    sqlite3.Error
        When the cache cannot be read.
    """
    from semframe.cache.store import TOUCH_SECONDS, load_tokens

    found = cache.rows([k for k in dict.fromkeys(keys) if k is not None])
    served = 0
    stale: list[str] = []
    p = c = w = o = 0
    if not found:
        return Served(0, Usage(), stale)
    stale_before = cache.clock() - TOUCH_SECONDS
    for i, key in enumerate(keys):
        row = found.get(key) if key is not None else None
        if row is None:
            continue
        text, tokens, prompt, cached, written, output, _, used = row
        try:
            value = parse(text)
        except ParseError:
            continue
        outcomes[i] = Outcome(value, text, None, None, 0, load_tokens(tokens))
        served += 1
        if used < stale_before:
            stale.append(key)  # type: ignore[arg-type]
        p, c, w, o = p + prompt, c + cached, w + written, o + output
    return Served(served, Usage(p, c, w, o), stale)


def _serve_cached(
    plan: Plan,
    backend: Backend,
    cache: ResultCache,
    outcomes: list[Outcome | None],
    totals: _Totals,
    *,
    keys: Sequence[str | None] | None,
) -> tuple[Plan, Callable[[Request, Completion], None]]:
    """:func:`serve_from_cache`, and the plan of what is left to send."""
    keep = serve_from_cache(plan, backend, cache, outcomes, totals, keys=keys)
    if not totals.cache_hits:
        return plan, keep
    return unanswered(plan, outcomes), keep


def unanswered(plan: Plan, outcomes: Sequence[Outcome | None]) -> Plan:
    """The part of ``plan`` whose outcome (plan order) is still ``None``, groups kept.

    Requests keep their ids (positions in ``plan``), so answers still land in
    the right place.
    """
    remaining = tuple(r for r in plan.requests if outcomes[r.id] is None)
    groups: list[PrefixGroup] = []
    pos = 0
    for g in plan.groups:
        left = sum(1 for i in range(g.start, g.stop) if outcomes[i] is None)
        if left:
            groups.append(PrefixGroup(pos, pos + left))
            pos += left
    return dataclasses.replace(
        plan,
        requests=remaining,
        groups=tuple(groups),
        shared_chars=tuple(plan.shared_chars[r.id] for r in remaining),
    )


def bill(
    backend: Backend,
    usage: Any,
    *,
    batch: bool = False,
    prices: Mapping[str, Mapping[str, Any]] | None = None,
) -> float | None:
    """Dollars for ``usage`` (token totals) at the price of ``backend``'s model.

    ``None`` for backends without a price (local engines, unknown models).
    """
    if backend.name not in {"openai", "anthropic"}:
        return None
    from semframe.cost.pricing import cost, price_for
    from semframe.errors import ConfigError

    try:
        price = price_for(backend.model, prices)
    except ConfigError:
        return None
    write_1h = getattr(backend, "cache_ttl", "5m") == "1h"
    writes = usage.cache_write_tokens
    if backend.name == "openai":  # prompt_tokens includes the cached ones
        uncached = usage.prompt_tokens - usage.cached_tokens
    else:
        uncached = usage.prompt_tokens - usage.cached_tokens - writes
    return cost(
        price,
        uncached_input_tokens=max(0, uncached),
        cached_input_tokens=usage.cached_tokens,
        cache_write_5m_tokens=0 if write_1h else writes,
        cache_write_1h_tokens=writes if write_1h else 0,
        output_tokens=usage.output_tokens,
        batch=batch,
    ).total


def _one(backend: Backend, request: Request, slot: int | None) -> Completion:
    for completion in backend.generate([request], slot=slot):
        return completion
    msg = f"backend {backend.name!r} returned no completion for request {request.id}"
    raise TransientError(msg)


class _RateLimiter:
    """Token buckets for requests and tokens per minute (async, first come first served).

    Each bucket holds up to ten seconds of its rate, so a burst cannot exceed
    one sixth of the per-minute limit.
    """

    def __init__(
        self, rpm: int | None, tpm: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.limits = [limit / 60.0 for limit in (rpm, tpm) if limit]
        self.kinds = [kind for kind, limit in (("requests", rpm), ("tokens", tpm)) if limit]
        self.capacity = [max(1.0, rate * 10) for rate in self.limits]
        self.level = list(self.capacity)
        self.last = clock()
        self.lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        elapsed, self.last = now - self.last, now
        for i, rate in enumerate(self.limits):
            self.level[i] = min(self.capacity[i], self.level[i] + rate * elapsed)

    def wait_time(self, tokens: int) -> float:
        """Seconds until a request of ``tokens`` may go (0: now, and taken)."""
        self._refill()
        needs = [1.0 if kind == "requests" else float(tokens) for kind in self.kinds]
        needs = [min(need, cap) for need, cap in zip(needs, self.capacity, strict=True)]
        wait = max(
            ((need - level) / rate if level < need else 0.0)
            for need, level, rate in zip(needs, self.level, self.limits, strict=True)
        )
        if wait <= 0:
            for i, need in enumerate(needs):
                self.level[i] -= need
        return wait

    async def acquire(self, tokens: int) -> None:
        async with self.lock:
            while (wait := self.wait_time(tokens)) > 0:
                await asyncio.sleep(wait)


class _AsyncDispatcher:
    """Prefix groups for a shared cache: leaders first, then each group fanned out.

    A group's first request goes alone; once it has been answered (and the
    provider holds its prefix), the group's other requests are sent ahead of
    any new group, as fast as concurrency allows, so a group's requests reach
    the provider close together in time while other groups' leaders keep the
    remaining capacity busy.
    """

    def __init__(self, plan: Plan) -> None:
        self.groups = [_Group(g.start, g.stop, g.start) for g in plan.groups]
        self.unstarted: deque[int] = deque(range(len(self.groups)))
        self.open: deque[int] = deque()
        self.in_flight = 0
        self.stopped = False
        self.cond = asyncio.Condition()
        self.should_stop: Callable[[int], bool] | None = None
        self.halted = False

    async def take(self) -> tuple[int, int] | None:
        async with self.cond:
            while not self.stopped:
                if self.should_stop is not None and self.should_stop(self.in_flight):
                    self.stopped = self.halted = True
                    self.cond.notify_all()
                    return None
                while (
                    self.open and self.groups[self.open[0]].next >= self.groups[self.open[0]].stop
                ):
                    self.open.popleft()
                if self.open:
                    return self._pop(self.open[0])
                if self.unstarted:
                    return self._pop(self.unstarted.popleft())
                if self.in_flight == 0:
                    return None
                await self.cond.wait()
            return None

    def _left(self, index: int) -> int:
        g = self.groups[index]
        return g.stop - g.next

    def _pop(self, index: int) -> tuple[int, int]:
        g = self.groups[index]
        request = g.next
        g.next += 1
        self.in_flight += 1
        return index, request

    async def done(self, index: int, request: int) -> None:
        async with self.cond:
            g = self.groups[index]
            if request == g.start:
                g.leader_done = True
                if g.next < g.stop:
                    self.open.append(index)
            self.in_flight -= 1
            self.cond.notify_all()

    async def stop(self) -> None:
        async with self.cond:
            self.stopped = True
            self.cond.notify_all()


async def _run_async(
    plan: Plan,
    workers: int,
    *,
    acomplete: Callable[[Request], Awaitable[Completion]],
    policy: Callable[[Request], Any],
    record: Callable[[int, Outcome], None],
    limiter: _RateLimiter | None,
    deadline: float | None,
    should_stop: Callable[[int], bool] | None = None,
    halted: list[bool] | None = None,
) -> None:
    dispatcher = _AsyncDispatcher(plan)
    dispatcher.should_stop = should_stop
    failures: list[BaseException] = []

    async def drive(request: Request) -> Outcome:
        steps = policy(request)
        command = next(steps)
        estimate = (len(request.prompt) + len(request.system or "")) // 4 + request.max_tokens
        while True:
            result: Any = None
            if command is _SEND:
                if limiter is not None:
                    await limiter.acquire(estimate)
                try:
                    result = await asyncio.wait_for(acomplete(request), deadline)
                except (TransientError, RequestRejected) as exc:
                    result = exc
                except TimeoutError:
                    result = TransientError(f"no answer within {deadline:.0f} s")
            else:
                await asyncio.sleep(command)
            try:
                command = steps.send(result)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome

    async def work() -> None:
        while True:
            taken = await dispatcher.take()
            if taken is None:
                return
            index, pos = taken
            try:
                record(pos, await drive(plan.requests[pos]))
            except Exception as exc:
                failures.append(exc)
                await dispatcher.stop()
                return
            finally:
                await dispatcher.done(index, pos)

    await asyncio.gather(*(work() for _ in range(workers)))
    if dispatcher.halted and halted is not None:
        halted.append(True)
    if failures:
        raise failures[0]


def _backoff(attempt: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; ``Retry-After`` wins when given."""
    if retry_after is not None:
        return max(0.0, retry_after)
    return float(random.uniform(0, min(30.0, 0.5 * 2 ** (attempt - 1))))


def _run_threads(
    plan: Plan,
    workers: int,
    run_one: Callable[[Request, int | None], Outcome],
    record: Callable[[int, Outcome], None],
    *,
    group_aware: bool,
    should_stop: Callable[[int], bool] | None = None,
    halted: list[bool] | None = None,
) -> None:
    dispatcher = _Dispatcher(plan) if group_aware else _NaiveDispatcher(plan)
    dispatcher.should_stop = should_stop
    failures: list[BaseException] = []

    def work(slot: int) -> None:
        current: int | None = None
        try:
            while True:
                taken = dispatcher.take(current)
                if taken is None:
                    return
                current, pos = taken
                try:
                    record(pos, run_one(plan.requests[pos], slot if group_aware else None))
                finally:
                    dispatcher.done(current, pos)
        except BaseException as exc:  # a bug or an unexpected backend error: stop all
            failures.append(exc)
            dispatcher.stop()

    threads = [
        threading.Thread(target=work, args=(slot,), name=f"semframe-worker-{slot}", daemon=True)
        for slot in range(workers)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.1)
    except KeyboardInterrupt:
        dispatcher.stop()
        raise
    if dispatcher.halted and halted is not None:
        halted.append(True)
    if failures:
        raise failures[0]
