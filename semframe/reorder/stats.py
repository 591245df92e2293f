"""One field order for every row, then a row sort: the statistics baseline, and the best one.

A column's score is the most it can contribute to the prefix hit count,
``sum(len(v) ** 2 * (count(v) - 1))`` over its values: it grows with how often
values repeat and how long they are. Fields are ordered by decreasing score
(ties: table order) and rows are sorted lexicographically in that field order,
which puts equal leading values next to each other. GGR falls back to the same
rule where its recursion stops.

:func:`fixed_order` finds the field order whose sorted rows a cache serves
most of (the statistics order ranks columns one at a time, which is not it);
GGR keeps it where it beats its own per-row orders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from semframe.reorder._encode import Encoded, FloatArray, IntArray
from semframe.reorder.fds import dependent_codes


def column_scores(enc: Encoded) -> FloatArray:
    """Upper-bound PHC contribution of each column, as floats.

    Examples
    --------
    >>> from semframe.reorder._encode import encode
    >>> from semframe.core.table import Table
    >>> enc = encode(Table.from_columns({"a": ["xx", "xx", "y"], "b": ["1", "2", "3"]}))
    >>> column_scores(enc).tolist()
    [4.0, 0.0]
    """
    out = np.zeros(enc.n_columns, dtype=np.float64)
    for j in range(enc.n_columns):
        counts = enc.value_counts[j]
        lengths = enc.lengths[j].astype(np.float64)
        out[j] = float(np.dot(lengths * lengths, np.maximum(counts - 1, 0)))
    return out


def stats_rank(enc: Encoded) -> list[int]:
    """Column indices by decreasing score, ties broken by table order."""
    scores = column_scores(enc)
    return sorted(range(enc.n_columns), key=lambda j: (-scores[j], j))


def lexsort_rows(enc: Encoded, rows: IntArray, columns: Sequence[int]) -> IntArray:
    """``rows`` sorted by their values in ``columns`` (first column most significant).

    The sort is stable: rows with equal values keep their order in ``rows``.
    """
    if rows.size < 2 or not columns:
        return rows
    return rows[np.lexsort([enc.codes[c][rows] for c in columns[::-1]])]


def stats_order(enc: Encoded) -> tuple[IntArray, tuple[int, ...]]:
    """Row order and the one field order (column indices) of the baseline."""
    rank = stats_rank(enc)
    rows = lexsort_rows(enc, np.arange(enc.n_rows, dtype=np.int64), rank)
    return rows, tuple(rank)


FIXED_ORDER_ROWS = 5_000
"""Rows :func:`fixed_order` looks at: a fixed random sample of a larger table."""

FIXED_ORDER_COLUMNS = 8
"""Most columns :func:`fixed_order` orders exactly (``2 ** 8`` column sets)."""

_PYTHON_ROWS = 128
"""Up to this many rows :func:`fixed_order` groups them in plain Python."""

_DENSE_SPAN = 8
"""A split counts its ``(group, code)`` pairs in place while they span at most this many
numbers a row (beyond, it sorts them)."""

FIXED_ORDER_CELLS = 1_000_000
"""Rows looked at times column sets grouped: what :func:`fixed_order`'s exact search may cost.

It decides how many columns the search orders exactly (``2 ** k`` column sets);
the others are added after them one at a time.
"""


def fixed_order(enc: Encoded, fds: Sequence[tuple[int, int]] = ()) -> tuple[int, ...]:
    """The one field order whose lexicographic row sort a previous-prompt cache serves most of.

    In a table sorted by fields ``c1, c2, ...``, a prompt shares its first
    ``k`` segments with the one before it when the two rows agree on
    ``c1..ck``, and rows that agree on them are next to each other. So what
    column ``c`` serves at depth ``k`` is the sum, over the groups of rows
    that agree on ``c1..ck``, of ``c``'s segment length times the group's
    size less one: it depends on the *set* of columns before ``c``, not on
    their order. The best order is then a longest path over column sets,
    solved exactly by dynamic programming over the ``2 ** k`` sets of the
    ``k`` columns that would serve the most in front, ``k`` as large as
    :data:`FIXED_ORDER_CELLS` allows (at most :data:`FIXED_ORDER_COLUMNS`).
    The other columns are added one at a time, each time the one that serves
    most next; columns whose values are all distinct go last. Columns that
    determine each other (``fds`` holding both ``(a, b)`` and ``(b, a)``: an
    id and a name) count as one and stay side by side: apart, the second
    would serve nothing. Segment lengths are ``lengths + labels``
    (characters, or tokens when the table was encoded with a tokenizer).
    Tables of more than :data:`FIXED_ORDER_ROWS` rows are searched on a fixed
    sample of them.

    GGR keeps this order (rows sorted in it) where it serves more than its
    own; :func:`stats_rank`, the statistics order, ranks columns one at a
    time and can put a column of many mid-sized groups before one of a few
    large groups that would share more under it.

    Examples
    --------
    ``b`` has two large groups, ``a`` four small ones; ``a``'s values are longer,
    so the statistics put it first, but under ``b`` it still groups:

    >>> from semframe.reorder._encode import encode
    >>> from semframe.core.table import Table
    >>> t = Table.from_columns(
    ...     {"a": ["aaaa1", "aaaa1", "aaaa2", "aaaa2", "aaaa3", "aaaa3", "aaaa4", "aaaa4"],
    ...      "b": ["x", "x", "x", "x", "y", "y", "y", "y"]}
    ... )
    >>> enc = encode(t)
    >>> [enc.columns[j] for j in stats_rank(enc)], [enc.columns[j] for j in fixed_order(enc)]
    (['a', 'b'], ['b', 'a'])
    """
    n = enc.n_rows
    units = [enc.segment_units(j) for j in range(enc.n_columns)]
    # Columns that determine each other (an id and a name) go together: the first one
    # stands for them, serving their segments together, and the others follow it.
    given = set(fds)
    twins: dict[int, list[int]] = {}
    taken: set[int] = set()
    for a in range(enc.n_columns):
        if a in taken:
            continue
        for b in range(a + 1, enc.n_columns):
            if b not in taken and (a, b) in given and (b, a) in given:
                twins.setdefault(a, []).append(b)
                taken.add(b)
                units[a] = units[a] + units[b][dependent_codes(enc, a, b)]
    # What each column serves in front of all the others (segment units, not squared).
    alone = [
        int(np.dot(u, np.maximum(c - 1, 0))) for u, c in zip(units, enc.value_counts, strict=True)
    ]
    rank = sorted(range(enc.n_columns), key=lambda j: (-alone[j], j))
    # A column of distinct values serves none; a twin follows the column standing for it.
    live = [j for j in rank if enc.cardinalities[j] < n and j not in taken]
    if n < 2 or len(live) < 2:
        return _with_twins(live, rank, twins)
    rows = None
    if n > FIXED_ORDER_ROWS:
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(n, size=FIXED_ORDER_ROWS, replace=False))
    size = n if rows is None else rows.size
    codes = {j: enc.codes[j] if rows is None else enc.codes[j][rows] for j in live}
    grouping: _Grouping | _PythonGrouping = (
        _Grouping(codes, units, enc.cardinalities)
        if size > _PYTHON_ROWS
        else _PythonGrouping(codes, units)
    )
    split, serves = grouping.split, grouping.serves

    k = min(len(live), FIXED_ORDER_COLUMNS, max(1, int(np.log2(FIXED_ORDER_CELLS / size))))
    searched = live[:k]
    # Each set of searched columns (bit c: searched[c]) grouped from the set without its
    # lowest column; what a column of the set serves after the others is read from the
    # set's groups. The best order of each set: (served, order).
    groups: list[Any] = [grouping.none(size)]
    # Whether a set's groups are single rows: then so are its supersets' (the same
    # groups, numbered alike), and no column serves anything more under them.
    single: list[bool] = [size < 2]
    best: list[tuple[int, tuple[int, ...]]] = [(0, ())]
    for s in range(1, 1 << k):
        low = (s & -s).bit_length() - 1
        members = [c for c in range(k) if s >> c & 1]
        if single[s & (s - 1)]:
            groups.append(groups[s & (s - 1)])
            single.append(True)
            more = [0] * len(members)
        else:
            grouped, at, counts = split(groups[s & (s - 1)], searched[low])
            groups.append(grouped)
            single.append(len(counts) == size)
            more = grouping.serves_each(searched, members, at, counts)
        value = -1
        order: tuple[int, ...] = ()
        for c, add in zip(members, more, strict=True):  # the first in ``live``'s order wins a tie
            before, prefix = best[s & ~(1 << c)]
            if before + add > value:
                value, order = before + add, (*prefix, searched[c])
        best.append((value, order))
    chosen = list(best[-1][1])
    # The other grouping columns one at a time: each time the one that serves most next.
    grouped = groups[-1]
    del groups
    rest = live[k:]
    if single[-1]:  # nothing serves more: each next column would tie at none
        chosen += rest
        rest = []
    while rest:
        options = []
        for j in rest:
            split_j = split(grouped, j)
            options.append((serves(j, split_j[1], split_j[2]), split_j[0], j))
        _, grouped, j = max(options, key=lambda o: o[0])  # the first on a tie
        chosen.append(j)
        rest.remove(j)
    return _with_twins(chosen, rank, twins)


class _Grouping:
    """Rows split into groups by one column more, in numpy (see :func:`fixed_order`)."""

    def __init__(
        self, codes: dict[int, IntArray], units: Sequence[IntArray], cards: Sequence[int]
    ) -> None:
        self.codes, self.units, self.cards = codes, units, cards
        # Each row's segment units in the searched columns (a row per column), once built.
        self._segments: tuple[list[int], IntArray] | None = None

    @staticmethod
    def none(size: int) -> Any:
        """``size`` rows in one group."""
        return np.zeros(size, dtype=np.int64)

    def split(self, groups: Any, j: int) -> tuple[Any, Any, Any]:
        """``groups`` split by column ``j``: each row's group, a row of each, their sizes.

        New groups are numbered in the order of ``(group, code)``. Where those
        pairs span few more numbers than there are rows, they are counted in
        place (no sort).
        """
        key = groups * self.cards[j] + self.codes[j]
        size = key.size
        span = int(key.max()) + 1
        if span > _DENSE_SPAN * size:
            _, at, inverse, counts = np.unique(
                key, return_index=True, return_inverse=True, return_counts=True
            )
            return inverse.astype(np.int64, copy=False), at, counts
        every = np.bincount(key, minlength=span)
        present = np.flatnonzero(every)
        number = np.empty(span, dtype=np.int64)
        number[present] = np.arange(present.size)
        inverse = number[key]
        at = np.empty(present.size, dtype=np.int64)
        at[inverse] = np.arange(size)  # a row of each group: all hold its columns' values
        return inverse, at, every[present]

    def serves(self, j: int, at: Any, counts: Any) -> int:
        """What column ``j`` serves in the groups (a row of each, their sizes) it is part of."""
        return int(np.dot(self.units[j][self.codes[j][at]], counts - 1))

    def serves_each(
        self, columns: Sequence[int], members: Sequence[int], at: Any, counts: Any
    ) -> list[int]:
        """:meth:`serves` of ``columns[i]`` for each ``i`` of ``members``, in one product."""
        if self._segments is None or self._segments[0] != columns:
            per_row = np.stack([self.units[j][self.codes[j]] for j in columns])
            self._segments = (list(columns), per_row)
        per_row = self._segments[1]
        return cast("list[int]", (per_row[members][:, at] @ (counts - 1)).tolist())


class _PythonGrouping:
    """:class:`_Grouping` in plain Python, for a few rows (numpy's per-call cost would dominate)."""

    def __init__(self, codes: dict[int, IntArray], units: Sequence[IntArray]) -> None:
        self.codes = {j: c.tolist() for j, c in codes.items()}
        self.units = {j: units[j].tolist() for j in codes}

    @staticmethod
    def none(size: int) -> Any:
        return [0] * size

    def split(self, groups: Any, j: int) -> tuple[Any, Any, Any]:
        ids: dict[tuple[int, int], int] = {}
        out: list[int] = []
        at: list[int] = []
        counts: list[int] = []
        for r, key in enumerate(zip(groups, self.codes[j], strict=True)):
            i = ids.get(key)
            if i is None:
                i = ids[key] = len(at)
                at.append(r)
                counts.append(0)
            counts[i] += 1
            out.append(i)
        return out, at, counts

    def serves(self, j: int, at: Any, counts: Any) -> int:
        col, units = self.codes[j], self.units[j]
        return sum(units[col[r]] * (c - 1) for r, c in zip(at, counts, strict=True))

    def serves_each(
        self, columns: Sequence[int], members: Sequence[int], at: Any, counts: Any
    ) -> list[int]:
        return [self.serves(columns[i], at, counts) for i in members]


def _with_twins(
    chosen: Sequence[int], rank: Sequence[int], twins: dict[int, list[int]]
) -> tuple[int, ...]:
    """``chosen``, each column followed by its twins, then the rest of ``rank`` (and theirs)."""
    out: list[int] = []
    for j in [*chosen, *(j for j in rank if j not in chosen)]:
        if j not in out:
            out.extend(x for x in (j, *twins.get(j, ())) if x not in out)
    return tuple(out)
