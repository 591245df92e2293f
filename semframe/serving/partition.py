"""Prefix-aware partitioning: which replica of an engine answers which requests.

A planned relQuery (GGR order, :class:`~semframe.core.plan.Plan`) is cut into
*units*: runs of consecutive requests that share a prompt prefix. A unit's
prefix is prefilled once on the replica it lands on; split across two
replicas it is prefilled twice. :func:`partition` therefore moves whole
prefix groups, balancing their estimated work, largest first (LPT); a group
too large for a fair share is split at a sub-prefix boundary (the deeper
levels of ``Request.prefix``), and into runs of rows only when it has no
deeper level. :func:`replica_cache` counts what each replica's prefix cache serves
under a partition: a prefix is paid once per replica it lands on.

Work is counted in prompt characters (a stand-in for prefill tokens) plus a
fixed ``per_request`` cost for each request (its decode and overhead).

Everything here is plain data: the Ray executor
(:mod:`semframe.runtime.ray_executor`) and the benchmarks use the same
functions.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from semframe.core.plan import PrefixGroup
from semframe.core.requests import Requests, chars_of
from semframe.core.wire import Request

__all__ = [
    "CacheFigures",
    "Partition",
    "Unit",
    "assign",
    "partition",
    "plan_units",
    "replica_cache",
    "request_splitter",
]


@dataclass(frozen=True, slots=True)
class Unit:
    """A run of consecutive requests kept on one replica.

    Attributes
    ----------
    start, stop : int
        Requests ``start <= i < stop`` (positions in the partitioned sequence).
    chain : tuple of (int, int, int)
        The shared prefix levels every request of the unit starts with, after
        the instruction block: ``(depth, first position of that level's run,
        characters it adds)``, shallowest first. ``(depth, start)`` names a
        prefix: two units with the same one share it.
    rest : int
        Characters of the unit's prompts beyond the instructions and ``chain``,
        summed over its requests.
    reuse : int
        Of ``rest``, the characters a prefix cache serves inside the unit: the
        deeper prefix levels its consecutive requests share.
    """

    start: int
    stop: int
    chain: tuple[tuple[int, int, int], ...]
    rest: int
    reuse: int = 0

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def shared(self) -> int:
        """Characters every request of the unit shares beyond the instructions."""
        return sum(c for _, _, c in self.chain)

    @property
    def depth(self) -> int:
        """The deepest prefix level every request of the unit shares (0: the instructions)."""
        return self.chain[-1][0] if self.chain else 0

    def work(self, per_request: float = 0.0) -> float:
        """Estimated work on a replica holding none of its prefix: prefix once, rows, overhead."""
        return self.shared + self.rest - self.reuse + per_request * len(self)


Splitter = Callable[[Unit], tuple[tuple[Unit, ...], bool] | None]
"""``split(unit) -> (pieces, at_sub_prefix)``, or ``None`` for a unit of one request.

The pieces cover the unit's requests in order; ``at_sub_prefix`` is ``False``
when the unit has no deeper prefix level and the pieces are its rows."""


@dataclass(frozen=True)
class Partition:
    """Which replica answers which units (the result of :func:`partition`).

    Attributes
    ----------
    units : tuple of tuple of Unit
        Per replica, its units in their original order (a split group's
        pieces that land on one replica stay adjacent, so its prefix is
        served from the cache after the first).
    loads : tuple of float
        Per replica, the summed work of its units.
    per_request : float
        The per-request cost the work was counted with.
    splits : int
        Units split at a sub-prefix boundary.
    row_splits : int
        Units split into runs of rows (they had no deeper prefix level).
    """

    units: tuple[tuple[Unit, ...], ...]
    loads: tuple[float, ...]
    per_request: float = 0.0
    splits: int = 0
    row_splits: int = 0

    @property
    def replicas(self) -> int:
        """Number of replicas."""
        return len(self.units)

    @property
    def total_work(self) -> float:
        """Work summed over every replica."""
        return sum(self.loads)

    @property
    def makespan(self) -> float:
        """The most work any replica has."""
        return max(self.loads, default=0.0)

    @property
    def balance(self) -> float:
        """Makespan over the mean load (1.0: perfectly balanced)."""
        mean = self.total_work / self.replicas if self.replicas else 0.0
        return self.makespan / mean if mean else 1.0

    @property
    def shards(self) -> tuple[tuple[int, ...], ...]:
        """Per replica, the positions of its requests, in their original order."""
        return tuple(
            tuple(i for u in units for i in range(u.start, u.stop)) for units in self.units
        )


Ranked = list[tuple[float, int, Unit]]
"""Units with their negated work and start: sorted, the largest (then the first) come first."""


def _place(ranked: Ranked, replicas: int) -> tuple[list[list[Unit]], list[float]]:
    """Largest first, each unit to the least-loaded replica (ties: lowest index); the loads."""
    bins: list[list[Unit]] = [[] for _ in range(replicas)]
    heap = [(0.0, r) for r in range(replicas)]
    for negative, _, unit in ranked:
        load, r = heapq.heappop(heap)
        bins[r].append(unit)
        heapq.heappush(heap, (load - negative, r))
    loads = [0.0] * replicas
    for load, r in heap:
        loads[r] = load
    return bins, loads


def assign(
    units: Sequence[Unit],
    replicas: int,
    split: Splitter,
    *,
    per_request: float = 0.0,
    tolerance: float = 0.05,
    max_splits: int | None = None,
) -> Partition:
    """Assign ``units`` to ``replicas`` by LPT, splitting the largest only while it helps.

    The units are placed largest first on the least-loaded replica. While the
    most-loaded replica holds more than ``(1 + tolerance)`` times the mean
    load, the largest unit that can be split is replaced by its pieces
    (``split``: sub-prefix runs, or rows when it has no deeper level, joined
    into contiguous runs of about ``tolerance`` times a fair share) and the
    units are placed again. A unit is never split when the placement is
    already balanced, so prefix groups stay whole whenever they can.

    Parameters
    ----------
    units : sequence of Unit
        The prefix groups, in order.
    replicas : int
        Number of replicas (>= 1).
    split : callable
        How a unit splits (:data:`Splitter`).
    per_request : float
        Work of a request beyond its prompt characters.
    tolerance : float
        Imbalance accepted without splitting.
    max_splits : int, optional
        Most splits (default ``4 * replicas + 64``).

    Examples
    --------
    Three equal groups of two rows on two replicas: one group is split (at a
    sub-prefix or, having none, into rows) so that the loads match.

    >>> units = [Unit(0, 2, ((1, 0, 10),), 20), Unit(2, 4, ((1, 2, 10),), 20),
    ...          Unit(4, 6, ((1, 4, 10),), 20)]
    >>> def rows(u):
    ...     if len(u) == 1:
    ...         return None
    ...     one = u.rest // len(u)
    ...     return tuple(Unit(i, i + 1, u.chain, one) for i in range(u.start, u.stop)), False
    >>> p = assign(units, 2, rows)
    >>> p.loads, p.row_splits
    ((50.0, 50.0), 1)
    """
    if replicas < 1:
        msg = f"replicas must be at least 1, got {replicas}"
        raise ValueError(msg)
    limit = 4 * replicas + 64 if max_splits is None else max_splits
    ranked: Ranked = sorted((-u.work(per_request), u.start, u) for u in units)
    done: set[int] = set()  # ids of units that cannot be split
    splits = row_splits = 0
    while True:
        bins, loads = _place(ranked, replicas)
        mean = sum(loads) / replicas
        if max(loads, default=0.0) <= (1 + tolerance) * mean or splits + row_splits >= limit:
            break
        pieces = None
        for at, (_, _, unit) in enumerate(ranked):  # the largest unit that splits
            if len(unit) < 2 or id(unit) in done:
                continue
            found = split(unit)
            if found is None or len(found[0]) < 2:
                done.add(id(unit))
                continue
            pieces, at_sub_prefix = found
            if at_sub_prefix:
                splits += 1
            else:
                row_splits += 1
                pieces = _runs(pieces, tolerance * mean, per_request)
            del ranked[at]
            for piece in pieces:
                bisect.insort(ranked, (-piece.work(per_request), piece.start, piece))
            break
        if pieces is None:
            break
    ordered = tuple(tuple(sorted(b, key=lambda u: u.start)) for b in bins)
    return Partition(ordered, tuple(loads), per_request, splits, row_splits)


def _runs(rows: Sequence[Unit], target: float, per_request: float) -> tuple[Unit, ...]:
    """A unit's ``rows`` (in order) joined into contiguous runs of at least ``target`` work.

    The rows of a unit split row by row share its prefix and nothing deeper, so
    a run of them pays that prefix once and its rows' own characters: placing
    runs of about ``tolerance`` times a replica's fair share balances as well
    as placing single rows (a largest-first placement overshoots by at most
    one piece), without one unit per row. Rows with different prefixes are
    left as they are.

    Examples
    --------
    >>> rows = [Unit(i, i + 1, ((1, 0, 10),), 5) for i in range(6)]
    >>> [(u.start, u.stop, u.rest) for u in _runs(rows, 30.0, 0.0)]
    [(0, 4, 20), (4, 6, 10)]
    """
    chain = rows[0].chain if rows else ()
    if len(rows) < 2 or target <= 0 or any(r.chain != chain for r in rows):
        return tuple(rows)
    shared = rows[0].shared
    out: list[Unit] = []
    first, rest, reuse = 0, 0, 0
    for i, row in enumerate(rows):
        rest += row.rest
        reuse += row.reuse
        if shared + rest - reuse + per_request * (i + 1 - first) >= target:
            out.append(Unit(rows[first].start, row.stop, chain, rest, reuse))
            first, rest, reuse = i + 1, 0, 0
    if first < len(rows):
        out.append(Unit(rows[first].start, rows[-1].stop, chain, rest, reuse))
    return tuple(out)


class _View:
    """What partitioning reads of a plan's requests, read once.

    Requests made one by one are read as they are (their prompts compared
    as text); a plan's columns (:class:`~semframe.core.requests.Requests`)
    without rendering a prompt: lengths from the segments, and two prompts'
    leading segments compared by their codes, which name a field and its
    value (the same text, as the label names the field).
    """

    def __init__(self, requests: Sequence[Request]) -> None:
        n = len(requests)
        self.n = n
        lengths = chars_of(requests)
        self.cum = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.cum[1:])
        self.columns = requests if isinstance(requests, Requests) else None
        self.requests = requests
        if self.columns is not None:
            self.levels: Sequence[tuple[tuple[int, int], ...]] = self.columns.levels
        else:
            self.levels = [r.prefix for r in requests]
        self.depths = np.fromiter(map(len, self.levels), np.int64, n) - 1  # deepest level held
        self.head = self.levels[0][0][0] if n and self.levels[0] else 0
        self.common = self._common_ends()

    def level(self, i: int, depth: int) -> int | None:
        """The end of request ``i``'s prefix level ``depth``, if it has one."""
        prefix = self.levels[i]
        return prefix[depth][0] if len(prefix) > depth else None

    def same_level(self, i: int, j: int, depth: int) -> bool:
        """Whether requests ``i`` and ``j`` share their prefix level ``depth``."""
        a, b = self.levels[i], self.levels[j]
        if len(a) <= depth or len(b) <= depth or a[depth][0] != b[depth][0]:
            return False
        if self.columns is not None:
            codes = self.columns.codes
            return bool((codes[:depth, i] == codes[:depth, j]).all())
        end = a[depth][0]
        return self.requests[j].prompt.startswith(self.requests[i].prompt[:end])

    def chars(self, start: int, stop: int) -> int:
        """Prompt characters of requests ``start .. stop - 1``."""
        return int(self.cum[stop] - self.cum[start])

    def reuse(self, start: int, stop: int, base: int) -> int:
        """Characters past ``base`` that each request after ``start`` shares with the one before."""
        if stop - start < 2:
            return 0
        return int(np.maximum(self.common[start + 1 : stop] - base, 0).sum())

    def _common_ends(self) -> NDArray[np.int64]:
        """Per request, where the deepest prefix level it shares with the one before ends."""
        n = self.n
        common = np.zeros(n, dtype=np.int64)
        if n < 2:
            return common
        if self.columns is None:
            for i in range(1, n):
                common[i] = self._common_end_text(i)
            return common
        # Both hold a level: as deep as their leading segments agree, within their levels;
        # a level ends where its segments do.
        columns = self.columns
        codes = columns.codes
        agree = np.cumprod(codes[:, 1:] == codes[:, :-1], axis=0).sum(axis=0)
        depth = np.minimum(agree, np.minimum(self.depths[1:], self.depths[:-1]))
        ends = np.zeros((codes.shape[0] + 1, n), dtype=np.int64)
        ends[0] = self.head
        np.cumsum(columns.lengths[codes], axis=0, out=ends[1:])
        ends[1:] += self.head
        held = depth >= 0
        at = np.flatnonzero(held) + 1
        common[at] = ends[depth[held], at]
        return common

    def _common_end_text(self, i: int) -> int:
        a, b = self.levels[i - 1], self.levels[i]
        for depth in range(min(len(a), len(b)) - 1, -1, -1):
            if self.same_level(i - 1, i, depth):
                return a[depth][0]
        return 0

    def unit(self, start: int, stop: int, parent: Unit | None, *, depth: int) -> Unit:
        """Requests ``start .. stop - 1`` as a unit, sharing level ``depth`` if two or more."""
        chain = parent.chain if parent is not None else ()
        base = self.head + sum(c for _, _, c in chain)
        if stop - start >= 2:
            end = self.level(start, depth)
            if end is not None and end > base:
                chain = (*chain, (depth, start, end - base))
                base = end
        rest = self.chars(start, stop) - base * (stop - start)
        return Unit(start, stop, chain, rest, self.reuse(start, stop, base))


def _splitter(view: _View) -> Splitter:
    def split(unit: Unit) -> tuple[tuple[Unit, ...], bool] | None:
        if len(unit) < 2:
            return None
        depth = unit.depth + 1
        pieces: list[Unit] = []
        start = unit.start
        deeper = False
        for i in range(unit.start + 1, unit.stop + 1):
            if i < unit.stop and view.same_level(i - 1, i, depth):
                continue
            deeper = deeper or i - start >= 2
            pieces.append(view.unit(start, i, unit, depth=depth))
            start = i
        if deeper and len(pieces) >= 2:
            return tuple(pieces), True
        if deeper:  # one run covering the unit: its deeper level is shared by all of it
            return split(pieces[0])
        rows = tuple(view.unit(i, i + 1, unit, depth=depth) for i in range(*_span(unit)))
        return rows, False

    return split


def request_splitter(requests: Sequence[Request]) -> Splitter:
    """How a unit of ``requests`` splits: into runs at its next prefix level, else rows.

    The runs are those of ``Request.prefix``: consecutive requests whose
    prompts share the next level's prefix. A request that shares that level
    with no neighbour becomes a unit of its own.
    """
    return _splitter(_View(requests))


def _span(unit: Unit) -> tuple[int, int]:
    return unit.start, unit.stop


def _units(view: _View, groups: Sequence[PrefixGroup]) -> list[Unit]:
    return [
        view.unit(g.start, g.stop, None, depth=1 if s else 0)
        for g, s in zip(groups, _share_first_level(view, groups), strict=True)
    ]


def _share_first_level(view: _View, groups: Sequence[PrefixGroup]) -> list[bool]:
    """Per group, whether each of its requests shares its first's level 1.

    From a plan's codes at once where the groups cover its requests in order;
    otherwise (requests made one by one, or a subset of groups) one by one.
    """
    starts = np.fromiter((g.start for g in groups), np.int64, len(groups))
    stops = np.fromiter((g.stop for g in groups), np.int64, len(groups))
    covering = (
        bool(groups)
        and bool((starts[1:] == stops[:-1]).all())
        and starts[0] == 0
        and stops[-1] == view.n
    )
    if view.columns is None or not covering:
        return [all(view.same_level(g.start, i, 1) for i in range(g.start, g.stop)) for g in groups]
    codes = view.columns.codes
    first = np.repeat(starts, stops - starts)  # each request's group's first request
    same = (view.depths >= 1) & (view.depths[first] >= 1)
    if codes.shape[0]:
        same &= codes[0] == codes[0][first]
    shared: list[bool] = np.logical_and.reduceat(same, starts).tolist()
    return shared


def plan_units(requests: Sequence[Request], groups: Sequence[PrefixGroup]) -> list[Unit]:
    """The prefix groups of a plan as units (a group of two or more shares its first level).

    ``requests`` and ``groups`` are a :class:`~semframe.core.plan.Plan`'s (or
    the part of one still to send, :func:`semframe.runtime.execute.unanswered`).
    """
    if not requests:
        return []
    return _units(_View(requests), groups)


def partition(
    requests: Sequence[Request],
    groups: Sequence[PrefixGroup],
    replicas: int,
    *,
    per_request: float = 0.0,
    tolerance: float = 0.05,
) -> Partition:
    """Assign a plan's requests to ``replicas``, prefix groups kept whole where they can be.

    The plan is planned once (its order is GGR's); each prefix group is a
    unit whose work is its shared prefix (prefilled once) plus its rows'
    own characters and ``per_request`` each. Units go largest first to the
    least-loaded replica (LPT); while the loads differ by more than
    ``tolerance``, the largest group is split at its next prefix level
    (``Request.prefix``), and into runs of rows only when it has none
    (:func:`assign`).

    Parameters
    ----------
    requests : sequence of Request
        In plan order (``Plan.requests``).
    groups : sequence of PrefixGroup
        ``Plan.groups``.
    replicas : int
        Number of replicas (>= 1).
    per_request : float
        Work of one request beyond its prompt (in characters).
    tolerance : float
        Imbalance accepted without splitting a group.

    Examples
    --------
    >>> from semframe.core.ordering import Ordering
    >>> from semframe.core.parse import TEXT
    >>> from semframe.core.plan import RelQuery, make_plan
    >>> from semframe.core.table import Table
    >>> from semframe.core.template import parse_template
    >>> t = Table.from_columns({"movie": ["A", "A", "B", "B", "C", "C"],
    ...                         "review": ["a1", "a2", "b1", "b2", "c1", "c2"]})
    >>> rq = RelQuery("map", parse_template("Rate {review} of {movie}"), t, TEXT)
    >>> plan = make_plan(rq, Ordering.identity(6, ("movie", "review")), "none")
    >>> p = partition(plan.requests, plan.groups, 3)
    >>> p.shards
    ((0, 1), (2, 3), (4, 5))
    """
    view = _View(requests)  # read once: the units and every split use it
    return assign(
        _units(view, groups),
        replicas,
        _splitter(view),
        per_request=per_request,
        tolerance=tolerance,
    )


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """What each replica's prefix cache serves under a partition (characters).

    Attributes
    ----------
    prompt : tuple of int
        Prompt characters per replica.
    cached : tuple of int
        Of those, characters served from the replica's prefix cache.
    """

    prompt: tuple[int, ...]
    cached: tuple[int, ...]

    @property
    def cached_share(self) -> float:
        """Cached characters over prompt characters, all replicas together."""
        total = sum(self.prompt)
        return sum(self.cached) / total if total else 0.0


def replica_cache(units: Sequence[Sequence[Unit]], head: int) -> CacheFigures:
    """Prompt and cached characters per replica, each replica's cache holding every prefix.

    A replica pays the instruction block (``head`` characters) once, each
    prefix level of ``Unit.chain`` the first time one of its units carries
    it, and every request's own characters; the rest is served from its
    cache. A prefix split across replicas is paid once on each of them.

    Examples
    --------
    >>> a, b = Unit(0, 2, ((1, 0, 10),), 6), Unit(2, 4, ((1, 0, 10),), 6)
    >>> replica_cache([[a, b]], head=4).cached, replica_cache([[a], [b]], head=4).cached
    ((42,), (14, 14))
    """
    prompt: list[int] = []
    cached: list[int] = []
    for mine in units:
        seen: set[tuple[int, int]] = set()
        total = paid = 0
        for unit in mine:
            total += len(unit) * (head + unit.shared) + unit.rest
            paid += unit.rest - unit.reuse
            for depth, start, chars in unit.chain:
                if (depth, start) not in seen:
                    seen.add((depth, start))
                    paid += chars
        if mine:
            paid += head
        prompt.append(total)
        cached.append(total - paid)
    return CacheFigures(tuple(prompt), tuple(cached))
