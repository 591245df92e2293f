"""Concurrent dispatch: which request goes next, to which slot, and when.

Dispatch follows the prefix groups of the plan (see "Concurrency meets prefix
caches" in the design). On the thread path each worker owns one slot of the
backend: it takes the next unstarted prefix group and sends its requests one
after another to its own slot, so the group's shared prefix is computed once
and then served from that slot's cache. When no group is left unstarted, an
idle worker helps with the group that has the most requests left, but only
after that group's first request has finished, so that the shared prefix is
cached before anyone else needs it. Other groups keep the other slots busy
meanwhile (:class:`GroupDispatcher`).

Async backends share one cache (an API, vLLM): with a warm start the plan's
first request goes alone, so that the head every request shares is cached
before the first wave; a group's first request goes alone and its followers are fanned
out once it has been answered, ahead of new groups, under client-side rate
limits (:class:`AsyncDispatcher`, :class:`RateLimiter`). Where the plan's
prompts do not all fit in a bounded shared cache (``Plan.capacity``), the
dispatch also keeps to what the cache holds (:class:`Room`, :func:`room_for`),
so that a group's prefix is still cached when its followers run. The per-request
work (attempts, retries, parsing) is the executor's
(:mod:`semframe.runtime.execute`); this module only decides order and
concurrency.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from semframe.backends._api import backoff
from semframe.core.capacity import Capacity
from semframe.core.plan import Plan
from semframe.core.requests import chars_of
from semframe.core.wire import Outcome, Request

__all__ = [
    "AsyncDispatcher",
    "GroupDispatcher",
    "NaiveDispatcher",
    "RateLimiter",
    "Room",
    "backoff",
    "room_for",
    "run_async",
    "run_threads",
]


@dataclass
class Group:
    start: int
    stop: int
    next: int
    leader_done: bool = False


class _Groups:
    """A plan's prefix groups as dispatch state: which request of each goes next."""

    def __init__(self, plan: Plan) -> None:
        self.groups = [Group(g.start, g.stop, g.start) for g in plan.groups]
        self.unstarted: deque[int] = deque(range(len(self.groups)))
        self.in_flight = 0
        self.stopped = False
        self.should_stop: Callable[[int], bool] | None = None
        self.halted = False  # stopped by ``should_stop``

    def _pop(self, index: int) -> tuple[int, int]:
        g = self.groups[index]
        request = g.next
        g.next += 1
        self.in_flight += 1
        return index, request


class GroupDispatcher(_Groups):
    """Hands out requests to workers, prefix group by prefix group."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.cond = threading.Condition()

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


class NaiveDispatcher(GroupDispatcher):
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


@dataclass(frozen=True)
class Room:
    """What a bounded shared cache holds, in blocks, as the async dispatch counts it.

    Attributes
    ----------
    limit : int
        Blocks the cache holds.
    shared : tuple of int
        Per prefix group, the blocks of the prefix all its requests share
        (0 for a group of one request).
    own : tuple of int
        Per request, its own blocks: its prompt beyond its group's shared
        prefix, and its output.
    """

    limit: int
    shared: tuple[int, ...]
    own: tuple[int, ...]


def room_for(
    plan: Plan, capacity: Capacity | None, *, tokens_per_char: float, output_tokens: int
) -> Room | None:
    """The :class:`Room` of ``plan`` in a cache of ``capacity`` (``None``: no need to count).

    Sizes are characters times ``tokens_per_char`` (the backend's tokenizer
    on a sample), in whole ``capacity.block`` blocks: a group's shared prefix
    is its instructions and the fields all its requests share
    (``Request.prefix``). ``None`` (dispatch as without a bound) for per-slot
    or unbounded caches, and where the plan's distinct prompt blocks and the
    output of ``capacity.concurrency`` requests fit in the cache at once:
    then nothing is evicted in any order.

    Examples
    --------
    >>> from semframe.core.ordering import Ordering
    >>> from semframe.core.parse import TEXT
    >>> from semframe.core.plan import RelQuery, make_plan
    >>> from semframe.core.table import Table
    >>> from semframe.core.template import parse_template
    >>> t = Table.from_columns({"doc": ["a" * 64] * 3 + ["b" * 64], "q": ["1", "2", "3", "4"]})
    >>> plan = make_plan(RelQuery("map", parse_template("{doc} {q}"), t, TEXT),
    ...                  Ordering.identity(4, ("doc", "q")), "none")
    >>> [len(g) for g in plan.groups]
    [3, 1]
    >>> room = room_for(plan, Capacity(32, block=4, concurrency=2), tokens_per_char=0.25,
    ...                 output_tokens=4)
    >>> room.limit, room.shared, room.own  # 'doc: aaa...' is the first group's prefix
    (8, (5, 0), (2, 2, 2, 7))
    >>> room_for(plan, Capacity(4096, block=4, concurrency=2), tokens_per_char=0.25,
    ...          output_tokens=4) is None  # everything fits
    True
    """
    if capacity is None or capacity.tokens is None or capacity.slots or not plan.requests:
        return None
    block = capacity.block

    def blocks(chars: float, extra: int = 0) -> int:
        return -(-int(chars * tokens_per_char + extra) // block)

    chars = chars_of(plan.requests).tolist()
    distinct = sum(chars) - sum(plan.shared_chars)
    need = blocks(distinct) + capacity.concurrency * blocks(0, output_tokens)
    limit = capacity.tokens // block
    if need <= limit:
        return None
    shared: list[int] = []
    own: list[int] = []
    for g in plan.groups:
        size = len(g)
        ends = [end for end, by in plan.requests[g.start].prefix if by >= size]
        common = max(ends, default=0) if size > 1 else 0
        full = int(common * tokens_per_char) // block  # whole blocks only are shared
        shared.append(full)
        for length in chars[g.start : g.stop]:
            own.append(max(1, blocks(length, output_tokens) - full))
    return Room(limit, tuple(shared), tuple(own))


class RateLimiter:
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

    def refund(self, tokens: int) -> None:
        """Give back ``tokens`` of a reservation that was not used (negative: take more).

        Examples
        --------
        >>> limiter = RateLimiter(None, 600, clock=lambda: 0.0)  # burst of 100 tokens
        >>> limiter.wait_time(100), limiter.wait_time(100) > 0
        (0.0, True)
        >>> limiter.refund(60)
        >>> limiter.wait_time(50)
        0.0
        """
        self._refill()
        for i, kind in enumerate(self.kinds):
            if kind == "tokens":
                self.level[i] = min(self.capacity[i], self.level[i] + tokens)


class AsyncDispatcher(_Groups):
    """Prefix groups for a shared cache: leaders first, then each group fanned out.

    A group's first request goes alone; once it has been answered (and the
    provider holds its prefix), the group's other requests are sent ahead of
    any new group, as fast as concurrency allows, so a group's requests reach
    the provider close together in time while other groups' leaders keep the
    remaining capacity busy.

    With ``warm``, the whole plan is the root group: its head (system message
    and instructions) is shared by every request, so the plan's first request
    goes alone and nothing else is sent until it has been answered (or
    released, :meth:`release`). Without it the first wave (one leader per
    group, up to the concurrency) would each write the same head.

    With ``room`` (a bounded cache that cannot hold the whole plan,
    :func:`room_for`), a new group starts only when it can keep its prefix
    cached until its followers run: its prefix and its leader must fit beside
    what was sent (the shared prefix of every started group, held from its
    leader until its last request is answered, and the own blocks of every
    request in flight), and the room left must outlast the followers already
    waiting ahead of its own (each evicts about its own blocks' worth while it
    runs). Followers are never held back (they use their group's prefix), and
    with nothing in flight a request always goes. ``workers`` is the
    concurrency the rule counts with.
    """

    def __init__(
        self, plan: Plan, *, warm: bool = False, room: Room | None = None, workers: int = 1
    ) -> None:
        super().__init__(plan)
        self.open: deque[int] = deque()
        self.cond = asyncio.Condition()
        self.warm = warm and len(self.groups) > 1  # one group: its leader goes alone anyway
        self.warming = False  # the root request is on its way, unanswered
        self.room = room
        self.workers = workers
        self.held = 0  # blocks: started groups' shared prefixes and own blocks in flight
        self.waiting = 0  # followers of started groups not yet sent
        self.left = [g.stop - g.start for g in self.groups]  # requests not yet answered
        self.mean_own = sum(room.own) / len(room.own) if room is not None and room.own else 0.0

    async def take(self) -> tuple[int, int] | None:
        async with self.cond:
            while not self.stopped:
                if self.should_stop is not None and self.should_stop(self.in_flight):
                    self.stopped = self.halted = True
                    self.cond.notify_all()
                    return None
                taken = self.next_request()
                if taken is not None:
                    return taken
                if self.in_flight == 0 and not self.warming:
                    return None
                await self.cond.wait()
            return None

    def next_request(self) -> tuple[int, int] | None:
        """The next (group, request) to send now, or ``None`` (call with the lock held).

        The decision of :meth:`take` without waiting: a replay in simulated
        time drives it with :meth:`finished`.
        """
        while self.open and self.groups[self.open[0]].next >= self.groups[self.open[0]].stop:
            self.open.popleft()
        if self.open:
            index = self.open[0]
            return self._send(index) if self._fits(index) else None
        if self.unstarted and not self.warming:
            index = self.unstarted[0]
            if not self._fits(index):
                return None
            self.unstarted.popleft()
            if self.warm:  # the plan's first request: the rest wait for it
                self.warm, self.warming = False, True
            return self._send(index)
        return None

    def _fits(self, index: int) -> bool:
        """Whether group ``index``'s next request may go now (always, without ``room``)."""
        room = self.room
        if room is None or self.in_flight == 0:
            return True
        g = self.groups[index]
        if g.next > g.start:
            return True  # a follower uses its group's prefix: never held back
        free = room.limit - self.held - room.own[g.next] - room.shared[index]
        # The new group's prefix waits behind the followers already waiting; while
        # they run, each evicts about its own blocks: start it only if it outlives them.
        return free >= 0 and (self.waiting - self.workers) * self.mean_own < free

    def _send(self, index: int) -> tuple[int, int]:
        room = self.room
        if room is not None:
            g = self.groups[index]
            if g.next == g.start:
                self.held += room.shared[index]
                self.waiting += g.stop - g.start - 1
            else:
                self.waiting -= 1
            self.held += room.own[g.next]
        return self._pop(index)

    async def done(self, index: int, request: int) -> None:
        async with self.cond:
            self.finished(index, request)
            self.cond.notify_all()

    def finished(self, index: int, request: int) -> None:
        """Request ``request`` of group ``index`` is answered (call with the lock held)."""
        if request == self.groups[index].start:
            self._open(index)
        self.in_flight -= 1
        room = self.room
        if room is not None:
            self.held -= room.own[request]
            self.left[index] -= 1
            if not self.left[index]:
                self.held -= room.shared[index]

    async def release(self, index: int) -> None:
        """Let group ``index``'s other requests go before its leader is answered."""
        async with self.cond:
            self._open(index)
            self.cond.notify_all()

    def _open(self, index: int) -> None:
        if index == 0:
            self.warming = False
        g = self.groups[index]
        if not g.leader_done:
            g.leader_done = True
            if g.next < g.stop:
                self.open.append(index)

    async def stop(self) -> None:
        async with self.cond:
            self.stopped = True
            self.cond.notify_all()


async def run_async(
    plan: Plan,
    workers: int,
    *,
    drive: Callable[[Request], Awaitable[Outcome]],
    record: Callable[[int, Outcome], None],
    should_stop: Callable[[int], bool] | None = None,
    halted: list[bool] | None = None,
    hold: Callable[[Request], float] | None = None,
    warm: bool = False,
    room: Room | None = None,
) -> None:
    """Send ``plan`` with up to ``workers`` requests in flight (:class:`AsyncDispatcher`).

    ``drive(request)`` sends one request until it has an outcome (retries
    included); ``record(position, outcome)`` keeps it. ``should_stop(in_flight)``
    is asked before each request is taken; when it says stop, requests in
    flight complete and ``halted`` gets ``True``. The first unexpected error
    stops the workers and is raised. With ``hold``, a group's other requests
    wait for their leader at most ``hold(leader)`` seconds: a leader that
    hangs does not hold its whole group back. With ``warm``, the plan's first
    request goes alone, before any other group's (its head is everyone's).
    With ``room``, what is sent keeps to what the cache holds (:func:`room_for`).
    """
    dispatcher = AsyncDispatcher(plan, warm=warm, room=room, workers=workers)
    dispatcher.should_stop = should_stop
    failures: list[BaseException] = []

    async def work() -> None:
        while True:
            taken = await dispatcher.take()
            if taken is None:
                return
            index, pos = taken
            request = plan.requests[pos]
            try:
                if hold is not None and pos == dispatcher.groups[index].start:
                    outcome = await _held(drive(request), hold(request), index, dispatcher)
                else:
                    outcome = await drive(request)
                record(pos, outcome)
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


async def _held(
    driving: Awaitable[Outcome], seconds: float, index: int, dispatcher: AsyncDispatcher
) -> Outcome:
    """Await a group leader's outcome; release its group after ``seconds`` without one."""
    task = asyncio.ensure_future(driving)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
        if not done:
            await dispatcher.release(index)
        return await task
    finally:
        if not task.done():
            task.cancel()


def run_threads(
    plan: Plan,
    workers: int,
    run_one: Callable[[Request, int | None], Outcome],
    record: Callable[[int, Outcome], None],
    *,
    group_aware: bool,
    should_stop: Callable[[int], bool] | None = None,
    halted: list[bool] | None = None,
) -> None:
    """Send ``plan`` from ``workers`` threads, one slot each (:class:`GroupDispatcher`).

    ``run_one(request, slot)`` sends one request until it has an outcome;
    ``group_aware=False`` is the naive baseline (plan order, any free worker,
    no slot hint). Stopping and errors as for :func:`run_async`; Ctrl-C stops
    the workers and propagates.
    """
    dispatcher = GroupDispatcher(plan) if group_aware else NaiveDispatcher(plan)
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
