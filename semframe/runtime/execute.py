"""Run a plan on a backend: attempts and retries, parsing, the result cache, statistics.

:func:`execute` sends every request of a plan and never drops a row: each
request is sent until it has an outcome (a parsed value, or the reason it
has none). Answers already in the result cache are served first and not
sent. Which request goes next, and with how many in flight, is the
dispatcher's decision (:mod:`semframe.runtime.dispatch`): a prefix group's
first request goes alone, its followers once it has been answered.

The attempts of one request follow one policy, written once as a generator
(:func:`attempts`) that every driver steps (threads, the async I/O loop, one
request after another): it yields when the request should be sent or the
driver should wait, and returns the :class:`~semframe.core.wire.Outcome`.
Transient failures (timeouts, 429, 5xx) are retried with backoff (honouring
``Retry-After``), refusals are not, and an answer that does not parse is
asked again once before it becomes a row error. On the I/O loop a hung
attempt is given up after its limit, and a row after its deadline
(:mod:`semframe.runtime.deadlines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from semframe.backends import aio
from semframe.backends.base import AsyncBackend, Backend
from semframe.cache.keys import Keys, plan_keys
from semframe.cache.serve import Served, serve_stored
from semframe.core.parse import ParseError, accept
from semframe.core.plan import Plan, PrefixGroup
from semframe.core.requests import ids_of, subset, with_options
from semframe.core.wire import Completion, Outcome, Request, Usage
from semframe.cost.framing import MESSAGE_OVERHEAD, REPLY_PRIMING, ROLE_TOKENS
from semframe.errors import (
    BudgetExceeded,
    RequestRejected,
    RunAborted,
    RunInterrupted,
    SemframeError,
    TransientError,
    plural,
)
from semframe.runtime.deadlines import Deadlines, InFlight
from semframe.runtime.dispatch import Room, backoff, room_for, run_async, run_threads
from semframe.runtime.pacing import Pacer, Ticket, account_of
from semframe.runtime.progress import Progress
from semframe.runtime.stats import RunStats, record_run

if TYPE_CHECKING:
    from semframe.cache.store import ResultCache

__all__ = [
    "StopWhen",
    "Totals",
    "attempts",
    "count_answered",
    "execute",
    "interrupted",
    "interrupted_message",
    "lost_prompt_tokens",
    "run_stats",
    "unanswered",
]

StopWhen = Callable[[Usage, int, int], bool]
"""``stop_when(spent, answered, in_flight)``: asked before each request is sent.

``spent`` sums the usage reported so far (every attempt) and the charge for
answers lost after they were sent (:meth:`Totals.charged`), ``answered`` counts
requests with a final outcome and ``in_flight`` those sent and not yet
answered. Returning True stops dispatching; requests in flight complete and
are kept (see :func:`execute`)."""

Keep = Callable[[int, Completion], None]
"""Given the request id of every answer that parsed, and the answer (the result cache stores it)."""


@dataclass
class Totals:
    """Running sums of a run (every attempt counted)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    sent: int = 0
    retries: int = 0
    errors: int = 0
    done: int = 0
    cache_hits: int = 0
    saved: Usage = field(default_factory=Usage)  # usage of rows served from the result cache
    unconfirmed: int = 0  # answers lost after the provider may have billed them
    unconfirmed_prompt: int = 0  # their prompt tokens, charged without a report
    unconfirmed_output: int = 0  # their output, estimated (see ``output_charge``)
    rate_limited: int = 0  # 429s met (async runs: the pacer's count)
    paced_s: float = 0.0  # seconds requests waited for the pace
    largest_output: int = 0  # the longest answer reported so far, in tokens

    def add(self, usage: Usage) -> None:
        """Count one answered attempt and its usage."""
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.output_tokens += usage.output_tokens
        self.largest_output = max(self.largest_output, usage.output_tokens)
        self.sent += 1

    def usage(self) -> Usage:
        """The usage reported so far."""
        return Usage(
            self.prompt_tokens, self.cached_tokens, self.cache_write_tokens, self.output_tokens
        )

    def output_charge(self, max_tokens: int) -> int:
        """Output tokens to charge for a lost answer: the longest so far, else ``max_tokens``.

        An estimate on the high side: the provider bills the answer it
        produced, which no report shows; answers of one relQuery are alike.
        """
        return min(max_tokens, self.largest_output) if self.largest_output else max_tokens

    def lost(self, prompt_tokens: int, max_tokens: int) -> None:
        """Count an answer lost after it was sent: charged, unconfirmed."""
        self.unconfirmed += 1
        self.unconfirmed_prompt += prompt_tokens
        self.unconfirmed_output += self.output_charge(max_tokens)

    def charged(self) -> Usage:
        """What may have been billed: the reported usage and the unconfirmed charge."""
        return Usage(
            self.prompt_tokens + self.unconfirmed_prompt,
            self.cached_tokens,
            self.cache_write_tokens,
            self.output_tokens + self.unconfirmed_output,
        )


def run_stats(
    plan: Plan, backend: Backend, totals: Totals, start: float, workers: int, *, batch: bool
) -> RunStats:
    """The statistics of a finished run (dollars from the backend's cost model)."""
    bill = backend.cost.bill
    lost = Usage(prompt_tokens=totals.unconfirmed_prompt, output_tokens=totals.unconfirmed_output)
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
        dollars=bill(totals.charged(), batch=batch),
        batch=batch,
        cache_hits=totals.cache_hits,
        cache_saved_dollars=bill(totals.saved, batch=batch),
        cache_saved_usage=totals.saved,
        unconfirmed=totals.unconfirmed,
        unconfirmed_tokens=lost.prompt_tokens + lost.output_tokens,
        unconfirmed_dollars=bill(lost, batch=batch) if totals.unconfirmed else None,
        rate_limited=totals.rate_limited,
        paced_seconds=totals.paced_s,
    )


SEND = None
"""What :func:`attempts` yields when it wants the request sent."""


def attempts(
    request: Request,
    parse: Callable[[str], Any],
    totals: Totals,
    lock: threading.Lock,
    *,
    max_retries: int,
    parse_retries: int,
    keep: Keep | None = None,
    charge: Callable[[Request], int] | None = None,
    may_retry: Callable[[], bool] | None = None,
) -> Generator[float | None, Completion | TransientError | RequestRejected | None, Outcome]:
    """The attempts of one request, as a generator shared by every driver.

    It yields :data:`SEND` when the request should be sent and a number of
    seconds when the driver should wait; it is sent back a
    :class:`~semframe.core.wire.Completion` or the
    :class:`~semframe.errors.TransientError` /
    :class:`~semframe.errors.RequestRejected` the attempt raised; it returns
    the :class:`~semframe.core.wire.Outcome`.

    Each answer goes through :func:`~semframe.core.parse.accept`: an empty
    answer, one that does not parse, and one cut at ``max_tokens`` (finish
    reason ``"length"`` or ``"max_tokens"``) are asked again up to
    ``parse_retries`` times, then become a ``"parse"`` row error saying what
    was wrong. A cut answer that parses is kept instead when ``parse`` keeps
    cut answers (``truncated="keep"``): its outcome has a value and, in
    ``error`` (with ``error_kind`` ``None``), a note starting with
    :data:`~semframe.core.parse.CUT_NOTE`. ``keep`` (the result cache) is
    given every answer that parsed and was not cut: a kept cut answer is
    not stored, so a re-run asks for it again and marks it again.

    ``charge(request)`` gives the prompt tokens to charge for an answer lost
    after it was sent (``TransientError.maybe_billed``), with the output of
    the longest answer so far (:meth:`Totals.output_charge`): the provider
    may have billed it and reported nothing.

    ``may_retry()`` is asked before every attempt after the first (the
    budget): when it says no, the request is not sent again and its outcome
    is a ``"budget"`` error.
    """
    tries = 0
    transient_left = max_retries
    parse_left = parse_retries
    raw: str | None = None
    while True:
        if tries and may_retry is not None and not may_retry():
            why = f"not sent again after {plural(tries, 'attempt')}: the budget was reached"
            return Outcome(None, raw, "budget", why, tries)
        tries += 1
        result = yield SEND
        if isinstance(result, TransientError | RequestRejected):
            lost = isinstance(result, TransientError) and result.maybe_billed
            prompt = charge(request) if lost and charge is not None else 0
            with lock:
                totals.sent += 1
                if lost:
                    totals.lost(prompt, request.max_tokens)
            if isinstance(result, RequestRejected) or transient_left <= 0:
                return Outcome(None, raw, "backend", str(result), tries)
            transient_left -= 1
            with lock:
                totals.retries += 1
            yield backoff(tries, result.retry_after)
            continue
        if result is None:  # pragma: no cover - drivers send an answer or an error
            msg = f"internal error: request {request.id} was stepped without an answer"
            raise SemframeError(msg)
        raw = result.text
        with lock:
            totals.add(result.usage)
        try:
            value, note = accept(parse, raw, result.finish_reason, request.max_tokens)
        except ParseError as exc:
            if parse_left <= 0:
                return Outcome(None, raw, "parse", str(exc), tries)
            parse_left -= 1
            with lock:
                totals.retries += 1
            continue
        if keep is not None and note is None:
            keep(request.id, result)
        return Outcome(value, raw, None, note, tries, result.tokens)


def lost_prompt_tokens(backend: Backend, request: Request) -> int:
    """Prompt tokens to charge for a request whose answer was lost: content and chat framing.

    Framed as OpenAI frames a message (its role's tokens included): on the
    high side for a provider that frames with fewer.
    """
    texts = [request.prompt] if request.system is None else [request.prompt, request.system]
    framing = (MESSAGE_OVERHEAD + ROLE_TOKENS) * len(texts) + REPLY_PRIMING
    return sum(backend.count_tokens(texts)) + framing


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
    timeout: float | None = None,
    row_timeout: float | None = None,
    warm: bool = False,
    stop_when: StopWhen | None = None,
    halt: threading.Event | None = None,
    cache: ResultCache | None = None,
    cache_keys: Sequence[str | None] | None = None,
    on_outcome: Callable[[int, Outcome], None] | None = None,
) -> tuple[list[Outcome], RunStats]:
    """Send every request of ``plan`` to ``backend``; parse answers; never drop a row.

    Backends with ``capabilities.async_io`` (the APIs, vLLM) run on semframe's
    I/O loop with up to ``max_concurrency`` requests in flight, prefix groups
    fanned out as soon as their first request has been answered (so the
    cache holds the prefix) and client-side rate limits applied. Other
    backends run on worker threads, one slot each (see
    :mod:`semframe.runtime.dispatch`).

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
        tokens reserved as prompt bytes / 4 plus ``max_tokens`` and settled to
        each answer's usage. Async runs are also paced by the provider's own
        limits as its response headers report them, and slowed by 429s
        (:class:`~semframe.runtime.pacing.Pacer`).
    timeout : float, optional
        The most one attempt of an async request may wait for its answer; the
        limit of each attempt is scaled below it
        (:class:`~semframe.runtime.deadlines.Deadlines`). ``None``: no limit
        here (the backend's own timeout applies).
    row_timeout : float, optional
        With ``timeout``: the most one row may wait over all its attempts
        (``None``: twice its attempt limit). A row past it is reported as a
        ``"backend"`` error saying so.
    warm : bool
        Async backends: send the plan's first request alone and the rest once
        it is answered, so the head every prompt shares is cached once
        (:class:`~semframe.runtime.dispatch.AsyncDispatcher`).
    stop_when : callable, optional
        Budget hook (:data:`StopWhen`), asked before each request is
        dispatched and before each retry; the spend it is given includes the
        charge for answers lost after they were sent. When it returns True no
        further request is sent (a refused retry ends its row with a
        ``"budget"`` error), requests in flight complete, and
        :class:`~semframe.errors.BudgetExceeded` is raised with ``outcomes``
        (caller's row order, ``None`` for rows never sent) and ``stats``.
    halt : threading.Event, optional
        Once set, as ``stop_when`` returning True (a stop from outside the run,
        such as a Ray driver's: checked without computing the spend).
    cache : ResultCache, optional
        The result cache (:mod:`semframe.cache`): cacheable requests found there
        are answered from it without being sent (an answer that no longer
        parses is sent again), and new answers are stored as they arrive. The
        caller closes it.
    cache_keys : sequence of str or None, optional
        The requests' cache keys (:func:`semframe.cache.keys.plan_keys`), when known.
    on_outcome : callable, optional
        Given each sent request's id and its final outcome as soon as it has
        one (a Ray replica streams them to the driver this way).

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
    n = len(plan.requests)
    outcomes: list[Outcome | None] = [None] * n
    totals = Totals()
    lock = threading.Lock()
    parse = plan.relquery.output.parse
    send, keep = plan, None
    if cache is not None:
        keep = serve_from_cache(plan, backend, cache, outcomes, totals, keys=cache_keys)
        if totals.cache_hits:
            send = unanswered(plan, outcomes)
    caps = backend.capabilities
    if caps.relquery_aware and send.requests:
        send = tag_relquery(send)
    m = len(send.requests)
    workers = max(1, min(caps.max_concurrency, max_concurrency or m or 1, m or 1))
    in_flight = InFlight()
    bar = None
    if progress != "off":
        label = f"{plan.relquery.op} on {backend.name}"
        bar = Progress(
            n,
            label,
            mode=progress,
            waiting=in_flight.waiting,
            dollars=lambda: backend.cost.bill(totals.charged()),
        )
        if not bar.enabled:
            bar = None
        elif totals.cache_hits:
            bar.update(totals.done, 0, 0, 0)

    def charge(request: Request) -> int:
        return lost_prompt_tokens(backend, request)

    should_stop: Callable[[int], bool] | None = None
    if stop_when is not None or halt is not None:
        hook, flag = stop_when, halt

        def should_stop(in_flight: int) -> bool:
            if flag is not None and flag.is_set():
                return True
            if hook is None:
                return False
            with lock:
                spent = totals.charged()
                answered = totals.done - totals.cache_hits
            return hook(spent, answered, in_flight)

    refused: list[bool] = []  # a retry the budget did not allow

    def may_retry() -> bool:
        if should_stop is None or not should_stop(in_flight.waiting()[0]):
            return True
        refused.append(True)
        return False

    def start_attempts(request: Request) -> Generator[Any, Any, Outcome]:
        return attempts(
            request,
            parse,
            totals,
            lock,
            max_retries=max_retries,
            parse_retries=parse_retries,
            keep=keep,
            charge=charge,
            may_retry=may_retry,
        )

    def run_one(request: Request, slot: int | None) -> Outcome:
        first = send_once(request, slot)
        if not isinstance(first, TransientError | RequestRejected):
            # The usual case, without the generator: answered at once, and it parses.
            try:
                value, note = accept(parse, first.text, first.finish_reason, request.max_tokens)
            except ParseError:
                pass  # asked again by the attempts below
            else:
                with lock:
                    totals.add(first.usage)
                if keep is not None and note is None:
                    keep(request.id, first)
                return Outcome(value, first.text, None, note, 1, first.tokens)
        steps = start_attempts(request)
        command = next(steps)  # the first attempt, sent above
        result: Any = first
        while True:
            try:
                command = steps.send(result)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome
            if command is SEND:
                result = send_once(request, slot)
            else:
                sleep(command)
                result = None

    def send_once(
        request: Request, slot: int | None
    ) -> Completion | TransientError | RequestRejected:
        in_flight.start(request.id)
        try:
            return backend.complete(request, slot=slot)
        except (TransientError, RequestRejected) as exc:
            return exc
        finally:
            in_flight.stop(request.id)

    def record(pos: int, outcome: Outcome) -> None:
        outcomes[pos] = outcome
        if on_outcome is not None:
            on_outcome(pos, outcome)
        collect()
        with lock:
            totals.done += 1
            if outcome.error_kind is not None:
                totals.errors += 1
            if bar is not None:
                bar.update(totals.done, totals.prompt_tokens, totals.cached_tokens, totals.errors)

    sent_ids = ids_of(send.requests)

    def record_at(pos: int, outcome: Outcome) -> None:  # ``pos`` in ``send``
        record(sent_ids[pos], outcome)

    halted: list[bool] = []
    pacer = Pacer(workers, rpm=rpm, tpm=tpm, account=account_of(backend))
    with paced_collector() as collect:
        try:
            if m == 0:
                pass  # everything came from the result cache
            elif caps.async_io:
                deadlines = None if timeout is None else Deadlines(timeout, row_timeout)
                drive = _async_driver(
                    cast(AsyncBackend, backend), start_attempts, pacer, deadlines, in_flight
                )
                aio.run(
                    run_async(
                        send,
                        workers,
                        drive=drive,
                        record=record_at,
                        should_stop=should_stop,
                        halted=halted,
                        hold=None if deadlines is None else deadlines.hold,
                        warm=warm,
                        room=_room(send, plan, backend, workers),
                    )
                )
            elif workers == 1:
                for request in send.requests:
                    if should_stop is not None and should_stop(0):
                        halted.append(True)
                        break
                    record(request.id, run_one(request, 0))
            else:
                run_threads(
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
            exc.answered = count_answered(outcomes)
            exc.args = (f"{exc.args[0]} ({exc.answered} of {n} rows had been answered)",)
            raise
        except KeyboardInterrupt as exc:
            raise interrupted(
                plan, outcomes, stored=cache is not None, in_flight=in_flight.waiting()[0]
            ) from exc
        finally:
            if bar is not None:
                bar.close()
            if cache is not None:
                cache.flush()  # answers so far are kept, however the run ended
    done = [o for o in outcomes if o is not None]
    totals.rate_limited, totals.paced_s = pacer.throttled, pacer.paced_s
    stats = run_stats(plan, backend, totals, start, workers, batch=False)
    record_run(stats)
    if refused or (halted and len(done) != n):
        answered = count_answered(done)
        not_retried = sum(1 for o in done if o.error_kind == "budget")
        stop = BudgetExceeded(
            f"stopped after {answered} of {n} requests were answered: the budget hook said "
            f"stop ({n - len(done)} not sent, {not_retried} not sent again after a lost "
            "answer; requests in flight were completed and kept)"
        )
        stop.outcomes = plan.restore(outcomes)
        stop.stats = stats
        raise stop
    if len(done) != n:  # pragma: no cover - guarded by the dispatcher
        msg = f"internal error: {n - len(done)} requests were never answered"
        raise SemframeError(msg)
    return done, stats


COLLECT_EVERY_S = 30.0
"""During a run the cyclic garbage collector runs in full at most this often (seconds)."""


@contextlib.contextmanager
def paced_collector(every: float = COLLECT_EVERY_S) -> Iterator[Callable[[], None]]:
    """The cyclic garbage collector paused; the function given runs it when ``every`` s passed.

    A run makes several objects per row (a request, its completion, usage and
    outcome) and keeps an outcome per row: with the collector on, each full
    collection scans every one of them, and full collections come as the
    objects grow (15% of a 1,000,000-row run's time on the fake backend). The
    objects hold no cycles; what an exception's traceback may tie up is
    collected at the latest ``every`` seconds on (called per answer), and when
    the run ends.

    Examples
    --------
    >>> import gc
    >>> with paced_collector() as collect:
    ...     collect()  # too soon: nothing runs
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    if not gc.isenabled():
        yield _nothing
        return
    gc.disable()
    last = time.monotonic()

    def collect() -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= every:
            last = now
            gc.collect()

    try:
        yield collect
    finally:
        gc.enable()


def _nothing() -> None:
    pass


def count_answered(outcomes: Iterable[Outcome | None]) -> int:
    """How many of ``outcomes`` are answers: a final outcome without an error."""
    return sum(1 for o in outcomes if o is not None and o.error_kind is None)


def interrupted(
    plan: Plan, outcomes: Sequence[Outcome | None], *, stored: bool, in_flight: int = 0
) -> RunInterrupted:
    """What Ctrl-C raises: the answers so far, in the caller's order, and how to resume."""
    answered = count_answered(outcomes)
    return RunInterrupted(
        interrupted_message(answered, len(outcomes), stored=stored, in_flight=in_flight),
        answered=answered,
        outcomes=plan.restore(outcomes),
        stored=stored,
    )


def interrupted_message(answered: int, rows: int, *, stored: bool, in_flight: int = 0) -> str:
    """What a user is told when Ctrl-C stops a run: what is kept, and how to resume.

    Examples
    --------
    >>> interrupted_message(3, 10, stored=True)  # doctest: +NORMALIZE_WHITESPACE
    'interrupted: 3 of 10 rows had been answered; their answers are kept in the
    result cache, so running the same call again sends only the other 7.'
    >>> print(interrupted_message(3, 10, stored=True, in_flight=4).split("7. ")[1])
    4 requests in flight were dropped: the provider may bill them.
    """
    head = f"interrupted: {answered} of {rows} rows had been answered; "
    if stored:
        text = (
            head + "their answers are kept in the result cache, so running the same call "
            f"again sends only the other {rows - answered}."
        )
    else:
        text = head + (
            "with cache=False they are not stored: they are in .outcomes of this exception "
            "(turn the result cache on to resume a run)."
        )
    if in_flight:
        text += (
            f" {plural(in_flight, 'request')} in flight {'was' if in_flight == 1 else 'were'} "
            "dropped: the provider may bill them."
        )
    return text


def _room(send: Plan, plan: Plan, backend: Backend, workers: int) -> Room | None:
    """What the backend's bounded shared cache holds of ``send`` (``None``: no bound to keep).

    The capacity is the one ``plan`` was made for (:attr:`Plan.capacity`),
    shared by ``workers``; sizes in the backend's tokens per character of a
    sample of prompts, outputs at ``max_tokens`` (vLLM grows a request's
    blocks as it decodes; this is the most it can take).
    """
    capacity = plan.capacity
    if capacity is None or capacity.tokens is None or capacity.slots or not send.requests:
        return None
    sample = [r.prompt for r in send.requests[:16]]
    chars = sum(map(len, sample))
    tokens = sum(len(t) for t in backend.cost.tokenizer().encode(sample))
    return room_for(
        send,
        dataclasses.replace(capacity, concurrency=workers),
        tokens_per_char=tokens / chars if chars else 0.25,
        output_tokens=send.relquery.max_tokens,
    )


def _async_driver(
    backend: AsyncBackend,
    start_attempts: Callable[[Request], Generator[Any, Any, Outcome]],
    pacer: Pacer,
    deadlines: Deadlines | None,
    in_flight: InFlight,
) -> Callable[[Request], Any]:
    """``drive(request)``: a coroutine stepping the request's attempts on the I/O loop.

    Each attempt waits for the ``pacer`` (configured rate limits, the
    provider's as its headers report them, 429s) and tells it how it ended.

    With ``deadlines``, an attempt that waits past its limit counts as a
    timeout (retried like one; the provider may have billed it), and a row
    whose attempts have waited its whole row limit is not sent again: it
    ends with a ``"backend"`` error saying how long it waited.
    """

    async def drive(request: Request) -> Outcome:
        steps = start_attempts(request)
        command = next(steps)
        estimate = (len(request.prompt) + len(request.system or "")) // 4
        waited = 0.0  # what this row's attempts have waited (Deadlines.counted)
        tries = 0
        last = ""
        while True:
            result: Any = None
            if command is SEND:
                ticket = await pacer.acquire(estimate, max_tokens=request.max_tokens)
                tries += 1
                in_flight.start(request.id)
                start = time.monotonic()
                try:
                    result = await _attempt(backend, request, deadlines, waited)
                finally:
                    in_flight.stop(request.id)
                    await _paced(pacer, ticket, result)
                if deadlines is not None:
                    waited += deadlines.counted(start, time.monotonic())
                if isinstance(result, TransientError):
                    last = str(result)
            else:
                await asyncio.sleep(command)
            try:
                command = steps.send(result)
            except StopIteration as stop:
                outcome: Outcome = stop.value
                return outcome
            if deadlines is not None and waited >= deadlines.row_limit(request):
                steps.close()
                why = (
                    f"no answer within the row's deadline: its {plural(tries, 'attempt')} waited "
                    f"{waited:.0f} s, and a row may wait {deadlines.row_limit(request):.0f} s "
                    f"({_row_rule(deadlines)})" + (f"; last: {last}" if last else "")
                )
                return Outcome(None, "", "backend", why, tries)

    return drive


async def _paced(pacer: Pacer, ticket: Ticket, result: Any) -> None:
    """Tell the pacer how an attempt ended (``result``: its answer, its error, or ``None``)."""
    if isinstance(result, Completion):
        await pacer.done(ticket, result, limits=result.limits)
    elif isinstance(result, TransientError):
        await pacer.done(
            ticket, None, rate_limited=result.rate_limited, retry_after=result.retry_after
        )
    else:
        await pacer.done(ticket, None)


def _row_rule(deadlines: Deadlines) -> str:
    if deadlines.row_timeout is not None:
        return f"row_timeout={deadlines.row_timeout:g}"
    return "twice its attempt limit; set row_timeout to change it"


async def _attempt(
    backend: AsyncBackend, request: Request, deadlines: Deadlines | None, waited: float
) -> Completion | TransientError | RequestRejected:
    """One attempt of ``request``: its answer, or the error it ended with.

    With ``deadlines`` the wait is given up at the attempt's limit, or when
    the row (whose earlier attempts ``waited``) reaches its limit, whichever
    comes first; both are re-read every second while waiting (the limits
    tighten once the run's first answers arrive).
    """
    if deadlines is None:
        try:
            return await backend.acomplete(request)
        except (TransientError, RequestRejected) as exc:
            return exc
    start = time.monotonic()
    task = asyncio.ensure_future(backend.acomplete(request))
    try:
        while True:
            now = time.monotonic()
            left = min(
                start + deadlines.attempt_limit(request) - now,
                deadlines.row_limit(request) - waited - deadlines.counted(start, now),
            )
            if left <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=min(left, 1.0))
            if done:
                try:
                    completion = task.result()
                except (TransientError, RequestRejected) as exc:
                    return exc
                deadlines.observe(time.monotonic() - start)
                return completion
        # Sent, and perhaps answered and billed after we gave up on it.
        return TransientError(
            f"no answer within {time.monotonic() - start:.0f} s ({deadlines.describe(request)})",
            maybe_billed=True,
        )
    finally:
        if not task.done():
            task.cancel()


def tag_relquery(plan: Plan) -> Plan:
    """Tag each request with this run's relQuery id and size (relQuery-aware engines)."""
    rel = uuid.uuid4().hex[:16]
    size = len(plan.requests)
    return dataclasses.replace(plan, requests=with_options(plan.requests, rel=rel, rel_size=size))


def serve_from_cache(
    plan: Plan,
    backend: Backend,
    cache: ResultCache,
    outcomes: list[Outcome | None],
    totals: Totals,
    *,
    keys: Sequence[str | None] | None = None,
) -> Keep:
    """Fill ``outcomes`` (plan order) from ``cache``; returns the hook that stores new answers.

    A stored answer that does not parse (the parser changed, say) is not
    served: its request is sent again and the new answer replaces it. Served
    rows count in ``totals.cache_hits`` and ``totals.saved``. ``keys`` are the
    requests' cache keys when the caller has them (``None`` for a request that
    is not cacheable); they are computed otherwise.
    """
    keys = plan_keys(plan, backend) if keys is None else Keys.of(keys)
    try:
        served = serve_stored(cache, keys, plan.relquery.output.parse, outcomes)
    except sqlite3.Error:  # an unreadable cache never stops a run
        served = Served(0, Usage(), [])
    totals.cache_hits = totals.done = served.rows
    totals.saved = served.usage
    if served.rows:
        with contextlib.suppress(sqlite3.Error):
            if served.stale:
                cache.touch(dict.fromkeys(served.stale))
            cache.count_hits(backend.name, backend.model, served.rows)
    digest = keys.digest

    def keep(request_id: int, completion: Completion) -> None:
        key = digest(request_id)
        if key is not None:
            cache.put(key, backend, completion)

    return keep


def unanswered(plan: Plan, outcomes: Sequence[Outcome | None]) -> Plan:
    """The part of ``plan`` whose outcome (plan order) is still ``None``, groups kept.

    Requests keep their ids (positions in ``plan``), so answers still land in
    the right place.
    """
    waiting = [i for i, outcome in enumerate(outcomes) if outcome is None]
    remaining = subset(plan.requests, waiting)
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
        shared_chars=tuple(plan.shared_chars[i] for i in waiting),
    )
