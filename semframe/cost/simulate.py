"""The executor's dispatch replayed in simulated time, over prompts cut into pieces.

The estimator prices a plan request by request in the order and timing the
executor would send it. :class:`Pieces` holds each prompt as its pieces (the
shared instructions, each labeled field), tokenized once per distinct piece;
:func:`simulate_async` replays the API executor's group-aware dispatch
(:func:`simulate_clients` that of several clients sharing one provider
cache) and :func:`slots_of` the slot assignment of the thread executor.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semframe.core.plan import Plan, groups_of, row_tails
from semframe.core.requests import byte_lengths, prompts_of, rows_of, subset, utf8_len
from semframe.core.table import MISSING

__all__ = [
    "Encoder",
    "Pieces",
    "bounds",
    "client_bounds",
    "identity_bounds",
    "replay",
    "sequential",
    "simulate_async",
    "simulate_clients",
    "slots_of",
]

Encoder = Callable[[Sequence[str]], list[list[int]]]
"""Texts to token ids (pseudo-ids where only counts are known)."""


IntArray = NDArray[np.int64]

_FILL_CHUNK = 4096
"""Texts tokenized per call to the encoder: the token-id lists of one chunk at a time are alive."""


def _compact(ids: list[int]) -> array[int]:
    """``ids`` as an array of 4-byte ints (8-byte ints when one does not fit)."""
    try:
        return array("i", ids)
    except OverflowError:
        return array("q", ids)


class Pieces:
    """Prompts as pieces (instructions, labeled fields), each distinct piece tokenized once.

    Token counts per request come from per-column counts of distinct values, so
    they cost one lookup per field; the pieces themselves are built only for
    the requests a cache simulation looks at. Token ids are kept as compact
    arrays (a list of Python ints takes several times the memory) and handed
    out as lists. With ``ids=False`` only each piece's count is kept (where no
    cache can be simulated, counts are all an estimate needs):
    :meth:`tokens` and :meth:`span` are then unavailable; with ``sample`` too,
    a field with more distinct values than that has ``sample`` of them
    tokenized (a fixed draw) and the others counted as their UTF-8 bytes times
    the sample's tokens per byte (:attr:`sampled` lists such fields).
    """

    def __init__(
        self,
        plan: Plan,
        encode: Encoder,
        cache: dict[str, array[int]] | None = None,
        *,
        ids: bool = True,
        sample: int = 0,
    ) -> None:
        self.plan = plan
        self.encode = encode
        self.ids = ids
        self.cache: dict[str, array[int]] = {} if cache is None else cache
        self.sizes: dict[str, int] = {}  # without ids: each piece's token count
        self.sampled: dict[str, tuple[int, int]] = {}  # field -> (values tokenized, values)
        rq = plan.relquery
        self.head = plan.instructions + "\n\n"
        # Each field's distinct values and codes: free text held in Arrow stays there.
        self.coded = {f: rq.table.coded(f) for f in rq.fields}
        n = len(plan.requests)
        # A restated question follows each row's fields (RelQuery.restate). It is one
        # piece with the row's last field: tokenized apart, the newline ending that
        # field and the one starting the question would count as two tokens, not one.
        self.rows = rows_of(plan.requests)
        self.tails = list(row_tails(rq, self.rows)) if rq.restate else []
        looked = sorted({0, n // 2, n - 1, *range(min(n, 16))} & set(range(n)))
        self.layout = all("".join(self._parts(i)) == plan.requests[i].prompt for i in looked)
        segments: dict[str, list[str]] = {}
        lasts: list[str] = []  # each request's last piece, where it carries the question
        self.value_counts: dict[str, IntArray] = {}  # per field: tokens of each distinct value
        if self.layout:
            texts = [self.head]
            for f in rq.fields:
                values = rq.table.coded(f)[0]
                if not ids and 0 < sample < len(values):
                    self.value_counts[f] = self._sampled(f, values, sample)
                    continue
                segments[f] = [f"{f}: {v}\n" for v in values]
                texts += segments[f]
            lasts = [self._parts(i)[-1] for i in range(n)] if self.tails else []
            texts += lasts
        else:  # not the planner's layout: whole prompts are the pieces
            texts = prompts_of(plan.requests)
        if rq.system:
            texts.append(rq.system)
        self._fill(texts)
        size = self._size
        self._last_counts = [size(t) for t in lasts]
        for f, pieces in segments.items():
            self.value_counts[f] = np.fromiter(map(size, pieces), np.int64, len(pieces))

    def _sampled(self, field: str, values: Sequence[str], sample: int) -> IntArray:
        """Token counts of ``values``' segments: ``sample`` tokenized, the rest by their bytes."""
        label = utf8_len(f"{field}: \n")
        size = byte_lengths(values) + label
        drawn = np.sort(np.random.default_rng(len(values)).choice(len(values), sample, False))
        counted = np.fromiter(
            map(len, self.encode([f"{field}: {values[i]}\n" for i in drawn.tolist()])),
            np.int64,
            sample,
        )
        per_byte = counted.sum() / max(int(size[drawn].sum()), 1)
        counts: IntArray = np.rint(size * per_byte).astype(np.int64)
        counts[drawn] = counted
        self.sampled[field] = (sample, len(values))
        return counts

    def _size(self, text: str) -> int:
        """The token count of ``text``, tokenized already."""
        return len(self.cache[text]) if self.ids else self.sizes[text]

    def _parts(self, i: int) -> list[str]:
        order = self.plan.ordering.fields[i]
        row = int(self.rows[i])
        coded = self.coded
        parts = [self.head, *(f"{f}: {coded[f][0][coded[f][1][row]]}\n" for f in order)]
        if self.tails:
            parts[-1] += self.tails[i]
        return parts

    def parts(self, i: int) -> list[str]:
        """The pieces of request ``i``'s prompt."""
        return self._parts(i) if self.layout else [self.plan.requests[i].prompt]

    def _fill(self, texts: Sequence[str]) -> None:
        """Tokenize the ``texts`` not yet known, a chunk at a time, in order of first use."""
        known = self.cache if self.ids else self.sizes
        new = list(dict.fromkeys(t for t in texts if t not in known))
        for lo in range(0, len(new), _FILL_CHUNK):
            chunk = new[lo : lo + _FILL_CHUNK]
            if self.ids:
                for text, toks in zip(chunk, self.encode(chunk), strict=True):
                    self.cache[text] = _compact(toks)
            else:
                self.sizes.update(zip(chunk, map(len, self.encode(chunk)), strict=True))

    def tokens(self, text: str) -> list[int]:
        """The token ids of ``text`` (tokenized on first use)."""
        if not self.ids:
            msg = "internal: token ids asked of pieces that keep counts only"
            raise RuntimeError(msg)
        found = self.cache.get(text)
        if found is None:
            self._fill([text])
            found = self.cache[text]
        return found.tolist()

    def count(self, text: str) -> int:
        """The number of tokens of ``text`` (tokenized on first use)."""
        if text not in (self.cache if self.ids else self.sizes):
            self._fill([text])
        return self._size(text)

    def span(self, i: int, start: int, end: int) -> list[int]:
        """Tokens of ``prompt[start:end]`` of request ``i`` (piece boundaries assumed)."""
        out: list[int] = []
        pos = 0
        for p in self.parts(i):
            nxt = pos + len(p)
            if pos >= start and nxt <= end:
                out += self.tokens(p)
            elif pos < end and nxt > start:  # a cut inside a piece: tokenize that slice
                out += self.tokens(p[max(start - pos, 0) : end - pos])
            pos = nxt
        return out

    def counts(self) -> list[int]:
        """Prompt tokens of every request (without chat framing)."""
        plan = self.plan
        if not self.layout:
            return list(map(self._size, prompts_of(plan.requests)))
        n = len(plan.requests)
        rows = self.rows
        total = np.full(n, self._size(self.head), dtype=np.int64)
        table = plan.relquery.table
        for f in plan.relquery.fields:
            total += self.value_counts[f][table.coded(f)[1][rows]]
        if self.tails:  # the last field's piece carries the restated question
            fields, head = plan.ordering.fields, self._size(self.head)

            def own(order: tuple[str, ...], row: int) -> int:  # the last field's count alone
                return int(self.value_counts[order[-1]][table.coded(order[-1])[1][row]])

            total += np.fromiter(
                (
                    last - (own(o, row) if o else head)
                    for last, row, o in zip(self._last_counts, rows.tolist(), fields, strict=True)
                ),
                np.int64,
                n,
            )
        counts: list[int] = total.tolist()
        return counts


@dataclass
class _G:
    start: int
    stop: int
    next: int
    leader_done: bool = False


def simulate_async(  # noqa: PLR0917
    groups_of: Sequence[tuple[int, int]],
    n: int,
    workers: int,
    latency: float,
    send_s: float,
    on_arrive: Callable[[int, float], None] | None = None,
    on_complete: Callable[[int, float], None] | None = None,
    *,
    receive_s: float = 0.0,
    warm: bool = False,
) -> float:
    """The API executor's dispatch (:class:`semframe.runtime.dispatch.AsyncDispatcher`) in time.

    With ``warm`` (and more than one group) the first request goes alone and
    nothing else is sent before it is answered. A prefix group's first request
    goes alone; its followers go once it has been answered, ahead of new
    groups; at most ``workers`` requests are in
    flight; each takes ``latency`` seconds. The client does one thing at a
    time: ``send_s`` to send a request, ``receive_s`` to take in an answer
    (only then is its slot free again). Latency being the same for all,
    requests complete in the order they arrive, so two FIFO queues replace an
    event heap. Returns the time the client has taken in the last answer.
    """
    starts = [a for a, _ in groups_of]
    stops = [b for _, b in groups_of]
    nxt = list(starts)  # each group's next request to send
    group_of = [0] * n
    for gi, (a, b) in enumerate(groups_of):
        if b - a == 1:
            group_of[a] = gi
        else:
            group_of[a:b] = [gi] * (b - a)
    unstarted: deque[int] = deque(range(len(starts)))
    open_: deque[int] = deque()
    arrivals: deque[tuple[float, int]] = deque()
    completions: deque[tuple[float, int]] = deque()
    client_free = 0.0
    idle = workers
    end = 0.0
    warming = warm and len(starts) > 1  # until the first request is answered
    # Without ``on_arrive`` an arrival only becomes its completion, ``latency`` later:
    # it goes to the completions at once (they stay in time order, as arrivals do).
    direct = on_arrive is None
    now = 0.0
    refill = True  # at the start, and after each completion: send what may be sent
    while True:
        while refill and idle > 0 and not (warming and nxt[0] > starts[0]):
            while open_ and nxt[open_[0]] >= stops[open_[0]]:
                open_.popleft()
            if open_:
                gi = open_[0]
            elif unstarted:
                gi = unstarted.popleft()
            else:
                break
            r = nxt[gi]
            nxt[gi] = r + 1
            idle -= 1
            if now > client_free:  # noqa: PLR1730 - max() is a call per request, twice
                client_free = now
            client_free += send_s
            if direct:
                completions.append((client_free + latency, r))
            else:
                arrivals.append((client_free, r))
        refill = False
        if arrivals and (not completions or arrivals[0][0] < completions[0][0]):
            t, r = arrivals.popleft()
            if on_arrive is not None:
                on_arrive(r, t)
            completions.append((t + latency, r))
            continue
        if not completions:
            break
        now, r = completions.popleft()
        if on_complete is not None:
            on_complete(r, now)
        if now > client_free:  # noqa: PLR1730 - as above
            client_free = now
        client_free += receive_s
        end = client_free
        idle += 1
        if r == 0:
            warming = False
        gi = group_of[r]
        if r == starts[gi] and nxt[gi] < stops[gi]:
            open_.append(gi)
        refill = True
    return end


def slots_of(plan: Plan, workers: int) -> list[int]:
    """Slot of each request under the thread executor's group-aware dispatch.

    Service times are taken as equal, so workers take turns in slot order.
    """
    groups = [_G(g.start, g.stop, g.start) for g in plan.groups]
    group_of = [0] * len(plan.requests)
    for gi, g in enumerate(groups):
        for r in range(g.start, g.stop):
            group_of[r] = gi
    unstarted: deque[int] = deque(range(len(groups)))
    slot_of = [0] * len(plan.requests)
    current: list[int | None] = [None] * workers
    pending: list[tuple[int, int]] = []  # (slot, request) in flight, finished next turn
    while True:
        progressed = False
        for _, done in pending:
            if done == groups[group_of[done]].start:
                groups[group_of[done]].leader_done = True
        pending = []
        for slot in range(workers):
            pick = current[slot]
            mine = groups[pick] if pick is not None else None
            if mine is not None and mine.next < mine.stop and mine.leader_done:
                pass
            elif unstarted:
                pick = unstarted.popleft()
            else:
                best = [
                    (x.stop - x.next, i)
                    for i, x in enumerate(groups)
                    if x.leader_done and x.next < x.stop
                ]
                pick = max(best)[1] if best else None
            if pick is None:
                continue
            g = groups[pick]
            if g.next >= g.stop or (g.next > g.start and not g.leader_done):
                continue
            slot_of[g.next] = slot
            pending.append((slot, g.next))
            g.next += 1
            current[slot] = pick
            progressed = True
        if not progressed and not pending:
            return slot_of


def bounds(plan: Plan) -> list[tuple[int, int]]:
    """The plan's prefix groups as ``(start, stop)`` pairs."""
    return [(g.start, g.stop) for g in plan.groups]


def identity_bounds(plan: Plan) -> list[tuple[int, int]]:
    """Prefix groups of the relQuery in the caller's order (as ``make_plan`` forms them)."""
    rq = plan.relquery
    n = rq.table.n_rows
    if not rq.fields or n == 0:
        return [(0, n)] if n else []
    values, codes = rq.table.coded(rq.fields[0])
    new = np.ones(n, dtype=bool)
    new[1:] = codes[1:] != codes[:-1]
    if MISSING in values:  # a missing value shares nothing: each starts a group
        new |= codes == values.index(MISSING)
    starts = np.flatnonzero(new).tolist()
    return list(zip(starts, [*starts[1:], n], strict=True))


def sequential(
    n: int, arrive: Callable[[int, float], None], complete: Callable[[int, float], None]
) -> None:
    """Batch APIs: requests processed one after another, in plan order."""
    for i in range(n):
        arrive(i, float(i))
        complete(i, float(i) + 0.5)


def replay(
    plan: Plan,
    *,
    workers: int,
    batch: bool,
    latency: float,
    send_s: float,
    arrive: Callable[[int, float], None],
    complete: Callable[[int, float], None],
    receive_s: float = 0.0,
    warm: bool = False,
    clients: Sequence[Sequence[int]] | None = None,
) -> float | None:
    """Replay the executor's send order through ``arrive``/``complete``; its wall time.

    Batch runs go one after another with no wall time (``None``); live runs
    follow the async dispatcher's model (``warm``: the first request alone),
    each request taking ``latency`` seconds, and the client ``send_s`` to
    send one and ``receive_s`` to take in an answer. With ``clients`` (the
    plan positions each of several clients sends, in order: ``executor="ray"``
    replicas sharing one endpoint) each is replayed as a client of its own
    with ``workers`` in flight, and their events reach ``arrive`` and
    ``complete`` in time order (:func:`simulate_clients`).
    """
    if batch:
        sequential(len(plan.requests), arrive, complete)
        return None
    if clients is not None and len(clients) > 1:
        return simulate_clients(
            plan,
            clients,
            workers,
            latency,
            send_s,
            arrive,
            complete,
            receive_s=receive_s,
            warm=warm,
        )
    return simulate_async(
        bounds(plan),
        len(plan.requests),
        workers,
        latency,
        send_s,
        arrive,
        complete,
        receive_s=receive_s,
        warm=warm,
    )


def client_bounds(plan: Plan, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Prefix groups of the requests ``ids`` of ``plan`` as one client sends them.

    Runs of consecutive requests with the same prefix group
    (:func:`~semframe.core.plan.groups_of`, as a replica's executor forms
    them), as positions in ``ids``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> plan = SimpleNamespace(requests=[SimpleNamespace(group=g) for g in (0, 0, 0, 1, 1)])
    >>> client_bounds(plan, [1, 2, 4])
    [(0, 2), (2, 3)]
    """
    # A plan's columns stay columns: no prompt is rendered.
    return [(g.start, g.stop) for g in groups_of(subset(plan.requests, ids))]


def simulate_clients(  # noqa: PLR0917
    plan: Plan,
    clients: Sequence[Sequence[int]],
    workers: int,
    latency: float,
    send_s: float,
    arrive: Callable[[int, float], None],
    complete: Callable[[int, float], None],
    *,
    receive_s: float = 0.0,
    warm: bool = False,
) -> float:
    """:func:`simulate_async` for several clients at once, each sending its own requests.

    A client's dispatch does not depend on what a cache serves (every request
    takes ``latency``), so each is replayed alone; their events are then
    handed to ``arrive`` and ``complete`` merged in time order (one shared
    provider cache sees them as the provider would). Returns the time the
    last client has taken in its last answer.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> plan = SimpleNamespace(requests=[SimpleNamespace(group=g) for g in range(4)])
    >>> seen = []
    >>> end = simulate_clients(plan, [[0, 1], [2, 3]], 1, 1.0, 0.0,
    ...                        lambda i, t: seen.append((t, i)), lambda i, t: None)
    >>> end, seen
    (2.0, [(0.0, 0), (0.0, 2), (1.0, 1), (1.0, 3)])
    """
    events: list[list[tuple[float, int, int]]] = []
    end = 0.0
    for ids in clients:
        if not ids:
            continue
        mine: list[tuple[float, int, int]] = []

        def on_arrive(r: int, t: float, ids: Sequence[int] = ids, mine: list[Any] = mine) -> None:
            mine.append((t, 0, ids[r]))

        def on_complete(r: int, t: float, ids: Sequence[int] = ids, mine: list[Any] = mine) -> None:
            mine.append((t, 1, ids[r]))

        wall = simulate_async(
            client_bounds(plan, ids),
            len(ids),
            min(workers, len(ids)),
            latency,
            send_s,
            on_arrive,
            on_complete,
            receive_s=receive_s,
            warm=warm,
        )
        end = max(end, wall)
        events.append(mine)
    for t, kind, i in heapq.merge(*events, key=lambda e: e[0]):
        (arrive if kind == 0 else complete)(i, t)
    return end
