"""Greedy Group Recursion (GGR): Algorithm 1 of the GGR paper, on integer codes.

The paper's recursion, for a sub-table ``T`` (rows ``R``, columns ``C``):
pick the ``(column c, value v)`` with the largest
``HITCOUNT = (len(v)**2 + sum of len(d)**2 over the columns d that c determines) * (|R_v| - 1)``,
emit the rows ``R_v`` with ``v`` (and its dependents) in front, recurse into
them without ``c`` (sub-table B), then continue with the other rows (sub-table
A, same columns). Note that the paper's lines 25-29 swap ``L_A`` and ``L_B``:
the rows ``R_v`` get ``[v]`` prepended and come first, then the rest.

What semframe adds to the paper's greedy:

- **Constant columns first.** A column with one value in a sub-table is placed
  in front for all its rows: that is never worse (every row but the first hits
  it, and the rest of each prompt keeps its hits), and it is how functional
  dependents end up directly after their determinant.
- **Functional dependencies** (given, or discovered exactly) credit a value
  with the squared lengths of the values it determines (the paper adds their
  mean length; with an exact FD the dependent value is fixed, so its squared
  length is what the group shares).
- **One-step lookahead on small sub-tables** (at most ``lookahead_cells``
  cells): each candidate group is scored by a rollout, its own PHC plus what
  the plain greedy reaches afterwards on ``R_v`` and on the other rows. This
  fixes the greedy's typical mistake, a group that takes rows away from a
  better pair of groups. A rollout's sub-tables of at most ``exact_cells``
  cells are credited with their exact optimum (OPHR's recursion, memoized)
  instead of the greedy's, so a table that small is solved exactly.
  ``lookahead_cells=0`` is the paper's greedy.
- **High-cardinality columns** (more than ``high_cardinality * n`` distinct
  values) stay out of the recursion and go last, ordered by statistics; they
  are recursed into only where every other column is already in the prefix.
- **Two scores and one fixed order; the objective decides.** ``len(v)``
  above is the value's length (``weigh="value"``, the paper's) or the length
  of the prompt segment that carries it, ``f"{column}: {value}\\n"``
  (``weigh="segment"``), which counts a short value under a long label as the
  prompt does. Neither is right on every table, and a greedy can split large
  groups that one field order for every row keeps whole. So by default
  (``weigh="best"``) both run, the rows sorted in the best single field order
  (:func:`~semframe.reorder.stats.fixed_order`) are a third candidate, each
  solve mixed with it a fourth and fifth (the solve's large top-level groups
  kept, its other rows in the fixed order: :func:`_mixed`), and the
  candidate whose prompts a cache serves more of, in segment units, is
  kept; given an :class:`Objective` (the backend's tokenizer and cache
  granularity), in the tokens the cache serves.
- **Table-statistics early stop.** Where ``max_depth`` or ``max_groups`` is
  reached, or no group scores above ``min_hitcount``, the remaining rows get the
  statistics field order (:mod:`semframe.reorder.stats`) and a lexicographic
  row sort.

How it runs fast:

- **A-chains instead of A-recursion.** Sub-table A keeps the columns of T and
  loses the rows ``R_v``, so the chain ``T -> A -> A' -> ...`` is one loop over
  the candidate groups, best score first. Removing ``R_v`` can only lower other
  groups' counts, so stored scores are upper bounds and are re-scored lazily
  when they reach the top (lazy greedy). Each row leaves a node once, so a node
  costs one sort of its cells, however many groups it splits off.
- **Integer codes and numpy** for large sub-tables (one sort of ``(code,
  position)`` keys; group counts updated with ``np.subtract.at``), plain
  Python for small ones (numpy's per-call cost dominates there), making the
  same decisions.
- **An explicit stack** of sub-tables instead of recursion: depth never
  depends on the number of rows (the paper's A-recursion is as deep as the
  number of groups). Plain-Python sub-tables recurse at most once per column.

Ties are broken by a fixed rule: higher score, then the column earlier in the
statistics order, then the lexicographically smaller value. The output depends
only on the cell strings.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from semframe.core.ordering import Ordering
from semframe.core.table import Codes, code_dtype
from semframe.errors import ConfigError
from semframe.reorder._encode import (
    Encoded,
    FloatArray,
    IntArray,
    Tokenizer,
    encode,
    pack_positions,
    run_changes,
    to_table,
)
from semframe.reorder.fds import check_fds, dependent_codes, fd_pairs
from semframe.reorder.metrics import Granularity, served_by_prompt, served_tokens
from semframe.reorder.stats import fixed_order, lexsort_rows, stats_rank
from semframe.reorder.trie import depth_first

DEFAULT_HIGH_CARDINALITY = 0.9
"""Columns with more than this share of distinct values stay out of the recursion."""

WEIGHS = ("best", "value", "segment")
"""Valid ``weigh`` values: how a value's length enters its group's score."""

DEFAULT_LOOKAHEAD_CELLS = 64
"""Sub-tables up to this many cells are solved with a one-step lookahead."""

DEFAULT_EXACT_CELLS = 16
"""The lookahead credits a candidate's sub-tables of up to this many cells with their exact
optimum (OPHR's recursion), larger ones with what the plain greedy reaches."""

_FD_BUDGET = 300_000_000
"""Most cell comparisons spent discovering functional dependencies."""

_SETTLE = True
"""Whether :meth:`_Solver._settled` settles the groups that need no search together
(off: each runs its own :class:`_Small`, with the same result; tests compare the two)."""

_MAX_EXACT_CELLS = 48
"""The largest ``exact_cells`` accepted (OPHR's own default limit)."""

_PYTHON_CELLS = 256
"""Sub-tables up to this many cells run in plain Python (numpy's per-call cost
outweighs its speed there); the decisions are the same as the numpy path's."""


@dataclass(frozen=True, slots=True)
class Objective:
    """What GGR's choice between its two solves counts (``weigh="best"``).

    Without one, the solve whose prompts a previous-prompt cache serves more
    segment units of (characters, or the encoding's tokens) is kept. With one,
    the served prefix of each prompt is counted in ``tokenizer``'s tokens,
    ``head`` tokens included, and rounded down to ``granularity``
    (:func:`~semframe.reorder.metrics.served_tokens`): what the backend's
    cache would serve. Where both solves serve as many (prompts short of the
    cache's minimum), segment units decide, as without one.

    Attributes
    ----------
    granularity : Granularity
        The cache's units (the backend's cost model declares them).
    tokenizer : callable or None
        Token count of a segment ``f"{column}: {value}\n"`` (and, where
        :func:`~semframe.reorder.order` solves in these tokens, of a value
        and of a label ``f"{column}: \n"``); ``None``: the encoding's units.
    head : int
        Tokens in front of every prompt (instructions, chat framing).
    """

    granularity: Granularity
    tokenizer: Tokenizer | None = None
    head: int = 0


@dataclass(frozen=True, slots=True)
class _Node:
    rows: IntArray  # positions into the table, ascending
    cols: tuple[int, ...]  # recursion columns, in statistics order
    tail: tuple[int, ...]  # high-cardinality columns, in statistics order
    prefix: tuple[int, ...]  # columns already placed in front, in order
    depth: int  # column-wise recursion depth (groups picked on the path)


@dataclass(frozen=True, slots=True)
class _Emit:
    rows: IntArray  # in execution order
    fields: tuple[int, ...]  # the field order of all these rows


@dataclass(frozen=True, slots=True)
class _Layout:
    rank: tuple[int, ...]  # all columns, statistics order
    rec: tuple[int, ...]  # recursion columns, statistics order
    tail: tuple[int, ...]  # high-cardinality columns, statistics order


def _layout(enc: Encoded, high_cardinality: float | None) -> _Layout:
    rank = tuple(stats_rank(enc))
    n = enc.n_rows
    tail: tuple[int, ...] = ()
    if high_cardinality is not None:
        tail = tuple(
            j
            for j in rank
            if enc.cardinalities[j] > 1 and enc.cardinalities[j] > high_cardinality * n
        )
    return _Layout(rank, tuple(j for j in rank if j not in tail), tail)


_PICK_CELLS = 1 << 16
"""A picked group's cells looked up at a time (a large group a column at a time)."""

_CANDIDATES = 1 << 14
"""Candidate groups of a split turned into Python values at a time."""


class _Solver:
    """One GGR run over an encoded table (holds the per-run precomputations)."""

    def __init__(
        self,
        enc: Encoded,
        layout: _Layout,
        fds: Sequence[tuple[int, int]],
        *,
        max_depth: int | None,
        max_groups: int | None,
        min_hitcount: float,
        lookahead_cells: int,
        exact_cells: int = DEFAULT_EXACT_CELLS,
        weigh: str = "value",
    ) -> None:
        self.enc = enc
        self.max_depth = max_depth
        self.max_groups = max_groups
        self.min_hitcount = min_hitcount
        self.lookahead_cells = lookahead_cells
        self.exact_cells = exact_cells
        m = enc.n_columns
        rank = layout.rank
        cards = list(enc.cardinalities)
        self.rank = layout.rank
        self.tail = layout.tail
        self.rec = layout.rec
        offsets = [0] * m
        start = 0
        for j in rank:
            offsets[j] = start
            start += cards[j]
        self.offsets: list[int] = offsets
        self.cards = cards
        sq = np.zeros(start, dtype=np.float64)
        col_of = np.zeros(start, dtype=np.int64)
        for j in range(m):
            lengths = enc.lengths[j].astype(np.float64)
            if weigh == "segment":
                lengths = lengths + enc.labels[j]
            sq[offsets[j] : offsets[j] + cards[j]] = lengths * lengths
            col_of[offsets[j] : offsets[j] + cards[j]] = j
        self.sq: FloatArray = sq
        self.col_of: IntArray = col_of
        recset = set(self.rec)
        deps: dict[int, list[int]] = {}
        for a, b in fds:
            if a in recset and b in recset and cards[b] > 1:
                deps.setdefault(a, []).append(b)
        self.deps = {a: tuple(sorted(bs, key=self.rank.index)) for a, bs in deps.items()}
        self._dep_sq: dict[tuple[int, int], FloatArray] = {}
        self._extra: dict[tuple[int, tuple[int, ...]], FloatArray] = {}
        self._extra_py: dict[tuple[int, tuple[int, ...]], list[float]] = {}
        self._sq_py: list[float] = []
        self._scratch: Codes | None = None

    def block(self, cols: Sequence[int], rows: IntArray) -> IntArray:
        """Global codes of ``rows`` in ``cols`` (a row per column), unique across columns.

        Built per sub-table from the table's codes, so the solver holds no
        second copy of them.
        """
        out: IntArray = np.empty((len(cols), rows.size), dtype=np.int64)
        codes, offsets = self.enc.codes, self.offsets
        for k, c in enumerate(cols):
            np.add(codes[c][rows], offsets[c], out=out[k], dtype=np.int64)
        return out

    def _group_of(self) -> Codes:
        """Scratch space of one entry per global code, for the split running now.

        :meth:`_chain` is never re-entered (sub-tables wait on the stack), so
        one array serves every split of the solve.
        """
        if self._scratch is None:
            size = int(self.sq.size)
            self._scratch = np.empty(size, dtype=np.int32 if size < 2**31 else np.int64)
        return self._scratch

    def _constant(self, col: int, rows: IntArray) -> bool:
        """Whether ``col`` holds one value on ``rows``."""
        values = self.enc.codes[col][rows]
        return bool((values == values[0]).all())

    def _groups(self, cols: Sequence[int], rows: IntArray) -> tuple[IntArray, Codes, Codes]:
        """The sub-table's cells grouped by global code, a column at a time.

        Returns the groups' starts into ``order``, their global codes
        (ascending) and ``order``: each group's rows as local positions into
        ``rows``, ascending within the group. Cells are sorted one column at
        a time (columns by their codes' offsets, so the codes come out
        ascending), so the solver's peak is one column's sort key beside
        ``order``, not a key per cell.
        """
        n_rows = rows.size
        cell = np.int32 if n_rows < 2**31 else np.int64
        order: Codes = np.empty(len(cols) * n_rows, dtype=cell)
        starts: list[IntArray] = []
        codes: list[Codes] = []
        for k, c in enumerate(sorted(cols, key=self.offsets.__getitem__)):
            at = k * n_rows
            key = self.enc.codes[c][rows].astype(np.int64)
            if self.cards[c] * n_rows < 2**62:
                # Sorted by (code, position) through one unique int64 key: an
                # unstable sort of unique keys is stable, and much faster than argsort.
                pack_positions(key, n_rows)
                key.sort()
                first = np.flatnonzero(run_changes(key, n_rows))
                codes.append(key[first] // n_rows + self.offsets[c])
                np.remainder(key, n_rows, out=order[at : at + n_rows], casting="unsafe")
            else:  # the combined key could overflow int64
                by_code = np.argsort(key, kind="stable")
                key = key[by_code]
                first = np.flatnonzero(run_changes(key, 1))
                codes.append(key[first] + self.offsets[c])
                order[at : at + n_rows] = by_code
            del key
            starts.append(first + at)
        return np.concatenate(starts), np.concatenate(codes), order

    # -- scoring ---------------------------------------------------------------

    def _extra_weight(self, a: int, present: tuple[int, ...]) -> FloatArray:
        """Squared lengths of the dependents ``present`` fixed by each value of ``a``."""
        key = (a, present)
        got = self._extra.get(key)
        if got is None:
            got = np.zeros(self.cards[a], dtype=np.float64)
            for b in present:
                sq_b = self._dep_sq.get((a, b))
                if sq_b is None:
                    dep = dependent_codes(self.enc, a, b)
                    sq_b = self.sq[self.offsets[b] + dep]
                    self._dep_sq[(a, b)] = sq_b
                got = got + sq_b
            self._extra[key] = got
        return got

    def _weights(self, cols: tuple[int, ...], codes: Codes) -> FloatArray:
        """HITCOUNT weight (before ``* (count - 1)``) of sorted global ``codes``."""
        w = self.sq[codes].copy()
        if not self.deps:
            return w
        colset = set(cols)
        for a in cols:
            present = tuple(b for b in self.deps.get(a, ()) if b in colset)
            if not present:
                continue
            lo, hi = np.searchsorted(codes, [self.offsets[a], self.offsets[a] + self.cards[a]])
            if hi > lo:
                w[lo:hi] += self._extra_weight(a, present)[codes[lo:hi] - self.offsets[a]]
        return w

    # -- small sub-tables: plain Python, one-step lookahead ---------------------

    def _small(self, node: _Node) -> list[_Node | _Emit]:
        """Solve a small sub-table in plain Python (with lookahead where small enough)."""
        if not self._sq_py:
            self._sq_py = self.sq.tolist()
        return _Small(self, node).solve()

    def _pair(self, node: _Node) -> _Emit:
        """Two rows: the columns they share go first (in statistics order), nothing else hits.

        Same result as the general path: constant columns, then the others, rows
        sorted by the first column where they differ (the tail only matters
        when every recursion column is shared).
        """
        r0, r1 = node.rows.tolist()
        offsets = self.offsets
        a = [int(c[r0]) + o for c, o in zip(self.enc.codes, offsets, strict=True)]
        b = [int(c[r1]) + o for c, o in zip(self.enc.codes, offsets, strict=True)]
        same = tuple(c for c in node.cols if a[c] == b[c])
        differ = tuple(c for c in node.cols if a[c] != b[c])
        if differ:
            fields = node.prefix + same + differ + node.tail
            first = differ[0]
        else:
            tail_same = tuple(c for c in node.tail if a[c] == b[c])
            tail_differ = tuple(c for c in node.tail if a[c] != b[c])
            fields = node.prefix + same + tail_same + tail_differ
            first = tail_differ[0] if tail_differ else -1
        swap = first >= 0 and a[first] > b[first]
        rows = node.rows[::-1].copy() if swap else node.rows
        return _Emit(rows, fields)

    def _extra_list(self, a: int, present: tuple[int, ...]) -> list[float]:
        key = (a, present)
        got = self._extra_py.get(key)
        if got is None:
            got = self._extra_py[key] = self._extra_weight(a, present).tolist()
        return got

    # -- the recursion ---------------------------------------------------------

    def _fallback(self, node: _Node, rows: IntArray | None = None) -> _Emit:
        """Statistics order and a lexicographic row sort for what is left of ``node``."""
        cols = node.cols + node.tail
        rows = node.rows if rows is None else rows
        return _Emit(lexsort_rows(self.enc, rows, cols), node.prefix + cols)

    def run(self) -> _Gathered:
        """Solve: every row in execution order, each with its field order (:class:`_Gatherer`)."""
        n = self.enc.n_rows
        root = _Node(np.arange(n, dtype=np.int64), self.rec, self.tail, (), 0)
        stack: list[_Node | _Emit] = [root]
        out = _Gatherer(n)
        while stack:
            item = stack.pop()
            if isinstance(item, _Emit):
                out.add(item.rows, item.fields)
            else:
                stack.extend(reversed(self._expand(item)))
        return out.gathered()

    def _expand(self, node: _Node) -> list[_Node | _Emit]:
        """Process one sub-table: what to run or emit next, in execution order."""
        rows, cols = node.rows, node.cols
        n_rows = rows.size
        if n_rows < 2 or not (cols or node.tail):
            return [_Emit(rows, node.prefix + cols + node.tail)]
        if not cols:
            # Every recursion column is in the prefix: recurse into the tail.
            return [_Node(rows, node.tail, (), node.prefix, node.depth)]
        if n_rows == 2:
            return [self._pair(node)]
        if n_rows * len(cols) <= max(self.lookahead_cells, _PYTHON_CELLS):
            return self._small(node)
        return self._chain(node)

    def _chain(self, node: _Node) -> list[_Node | _Emit]:
        """The A-chain of ``node``: split off groups greedily, best HITCOUNT first."""
        rows, cols = node.rows, node.cols
        n_rows = rows.size
        constant = [self._constant(c, rows) for c in cols]
        if any(constant):
            fixed = tuple(c for c, k in zip(cols, constant, strict=True) if k)
            cols = tuple(c for c, k in zip(cols, constant, strict=True) if not k)
            node = _Node(rows, cols, node.tail, node.prefix + fixed, node.depth)
            if not cols:
                return [node]
        if len(cols) == 1 or (self.max_depth is not None and node.depth >= self.max_depth):
            return [self._fallback(node)]
        starts, codes, order = self._groups(cols, rows)
        size = order.size
        counts = np.diff(np.append(starts, size))
        cand = np.flatnonzero(counts >= 2)
        if cand.size == 0:
            return [self._fallback(node)]
        weight = np.zeros(codes.size, dtype=np.float64)
        weight[cand] = self._weights(cols, codes[cand])
        scores = weight[cand] * (counts[cand] - 1)
        # Candidates by (score desc, code asc): the scores are upper bounds once
        # rows are taken; entries found stale are re-scored into a heap.
        by_score = cand[np.lexsort((codes[cand], -scores))]
        del cand, scores
        n_list = by_score.size
        # The candidates in that order as Python values (the loop reads them one
        # at a time), converted a chunk at a time: the loop often stops early.
        base = end = 0
        list_neg: list[float] = []
        list_code: list[int] = []
        list_slot: list[int] = []
        list_count: list[int] = []
        heap: list[tuple[float, int, int, int]] = []
        # Each global code's group here (codes absent from this sub-table are never read).
        group_of = self._group_of()
        group_of[codes] = np.arange(codes.size, dtype=group_of.dtype)
        # Per column: its codes, and its codes' groups (indexed by the column's own code).
        lookup = [
            (self.enc.codes[c], group_of[self.offsets[c] : self.offsets[c] + self.cards[c]])
            for c in cols
        ]
        current = counts.copy()
        alive = np.ones(n_rows, dtype=bool)
        remaining = n_rows
        picks: list[tuple[int, IntArray]] = []
        min_hitcount = self.min_hitcount
        ptr = 0
        while True:
            while ptr < n_list:
                if ptr >= end:
                    base, end = ptr, min(ptr + _CANDIDATES, n_list)
                    taken = by_score[base:end]
                    list_neg = (-(weight[taken] * (counts[taken] - 1))).tolist()
                    list_code = codes[taken].tolist()
                    list_slot = taken.tolist()
                    list_count = counts[taken].tolist()
                i = ptr - base
                s = list_slot[i]
                now = int(current[s])
                if now == list_count[i]:
                    break
                if now >= 2:
                    heapq.heappush(heap, (-float(weight[s]) * (now - 1), list_code[i], s, now))
                ptr += 1
            while heap:
                neg, code, s, count = heap[0]
                now = int(current[s])
                if now == count:
                    break
                if now >= 2:
                    heapq.heapreplace(heap, (-float(weight[s]) * (now - 1), code, s, now))
                else:
                    heapq.heappop(heap)
            if (
                ptr < n_list
                and (  # ``ptr`` is in the chunk: the loop above stopped there
                    not heap or (list_neg[ptr - base], list_code[ptr - base]) < heap[0][:2]
                )
            ):
                i = ptr - base
                neg, code, s = list_neg[i], list_code[i], list_slot[i]
                ptr += 1
            elif heap:
                neg, code, s, _ = heapq.heappop(heap)
            else:
                break
            if -neg <= min_hitcount:
                break
            lo, total = int(starts[s]), int(counts[s])
            members = order[lo : lo + total]
            if int(current[s]) != total:
                members = members[alive[members]]
            alive[members] = False
            # Every group a member is in (one per column) loses it: a large
            # group's cells looked up a column at a time.
            taken_rows = rows[members]
            if taken_rows.size * len(cols) <= _PICK_CELLS:
                found = [groups[column[taken_rows]] for column, groups in lookup]
                np.subtract.at(current, np.concatenate(found), 1)
            else:  # a large group a column at a time
                for column, groups in lookup:
                    np.subtract.at(current, groups[column[taken_rows]], 1)
            picks.append((int(self.col_of[code]), members))
            remaining -= members.size
            if remaining < 2 or (self.max_groups is not None and len(picks) >= self.max_groups):
                break
        out: list[_Node | _Emit] = []
        settled = self._settled(node, cols, picks) if _SETTLE else [None] * len(picks)
        for (col, members), done in zip(picks, settled, strict=True):
            if done is not None:
                out.append(done)
                continue
            out.append(
                _Node(
                    rows[members],
                    tuple(c for c in cols if c != col),
                    node.tail,
                    (*node.prefix, col),
                    node.depth + 1,
                )
            )
        if remaining:
            out.append(self._fallback(node, rows[alive]))
        return out

    def _settled(
        self, node: _Node, cols: tuple[int, ...], picks: list[tuple[int, IntArray]]
    ) -> list[_Emit | None]:
        """The picked groups whose sub-table needs no search, each as its emit (``None``: others).

        A group of three rows or more, small enough for :class:`_Small`, needs
        none when at most one of its recursion columns varies once its constant
        ones go to the prefix (or none does, and at most one of the tail's
        columns): its rows are sorted by the varying columns, as
        :meth:`_Small._into` would sort them. Such groups are found together,
        one pass per column over the rows of all groups that picked one column,
        and sorted together, one sort per set of sort columns; a table whose
        groups are many and small (movies and their reviews) would otherwise
        pay a :class:`_Small` per group.
        """
        settled: list[_Emit | None] = [None] * len(picks)
        small = max(self.lookahead_cells, _PYTHON_CELLS)
        by_col: dict[int, list[int]] = {}
        for i, (col, members) in enumerate(picks):
            if members.size >= 3 and members.size * (len(cols) - 1) <= small:
                by_col.setdefault(col, []).append(i)
        if not by_col:
            return settled
        limited = self.max_depth is not None and node.depth + 1 >= self.max_depth
        codes, tail = self.enc.codes, node.tail
        sorts: dict[tuple[int, ...], list[tuple[int, IntArray, tuple[int, ...]]]] = {}
        for col, which in by_col.items():
            child = tuple(c for c in cols if c != col)
            parts = [picks[i][1] for i in which]
            sizes = [p.size for p in parts]
            starts = np.zeros(len(parts), dtype=np.int64)
            np.cumsum(sizes[:-1], out=starts[1:])
            at = node.rows[np.concatenate(parts)]
            checked = child + tail
            constant = np.empty((len(checked), len(parts)), dtype=bool)
            for j, c in enumerate(checked):
                values = codes[c][at]
                least = np.minimum.reduceat(values, starts)
                constant[j] = least == np.maximum.reduceat(values, starts)
            prefix = (*node.prefix, col)
            for i, flags, first, size in zip(
                which, constant.T.tolist(), starts.tolist(), sizes, strict=True
            ):
                fixed = tuple(c for c, f in zip(child, flags, strict=False) if f)
                vary = tuple(c for c, f in zip(child, flags, strict=False) if not f)
                if vary:
                    if len(vary) > 1 and not limited:
                        continue  # a search
                    key, fields = vary + tail, prefix + fixed + vary + tail
                else:  # the tail is recursed into (with the same depth)
                    marks = flags[len(child) :]
                    tail_fixed = tuple(c for c, f in zip(tail, marks, strict=True) if f)
                    tail_vary = tuple(c for c, f in zip(tail, marks, strict=True) if not f)
                    if len(tail_vary) > 1 and not limited:
                        continue
                    key, fields = tail_vary, prefix + fixed + tail_fixed + tail_vary
                rows = at[first : first + size]
                if key:
                    sorts.setdefault(key, []).append((i, rows, fields))
                else:
                    settled[i] = _Emit(rows, fields)
        for key, groups in sorts.items():
            every = np.concatenate([rows for _, rows, _ in groups])
            lengths = [rows.size for _, rows, _ in groups]
            seq = np.repeat(np.arange(len(groups)), lengths)
            # Each group's rows stay together (the group number sorts first), sorted by
            # the key's columns, ties in their order (a stable sort), as _Small sorts.
            done = every[np.lexsort([*(codes[c][every] for c in key[::-1]), seq])]
            lo = 0
            for (i, _, fields), size in zip(groups, lengths, strict=True):
                settled[i] = _Emit(done[lo : lo + size], fields)
                lo += size
        return settled


_Group = tuple[float, int, int, int]  # (HITCOUNT, column, code, local rows as a bit mask)
_hitcount = operator.itemgetter(0)


class _Small:
    """GGR on one small sub-table, in plain Python.

    Rows are local positions ``0..k-1`` into the node's rows; ``data[c][i]`` is
    the global code of column ``c`` at local row ``i``. Decisions are those of
    the numpy path, except in sub-tables of at most ``lookahead_cells`` cells:
    there every pick is chosen by a rollout, the PHC of the group plus what the
    plain greedy reaches on the group's rows (without its column) and on the
    other rows; of those, sub-tables of at most ``exact_cells`` cells are
    credited with their exact optimum (:meth:`_exact_value`).
    """

    def __init__(self, solver: _Solver, node: _Node) -> None:
        self.solver = solver
        self.node = node
        self.rows = node.rows
        columns = node.cols + node.tail
        block = solver.block(columns, node.rows)
        self.data: dict[int, list[int]] = dict(zip(columns, block.tolist(), strict=True))
        # Columns whose values are all distinct here never group nor turn constant.
        size = node.rows.size
        self.dead = frozenset(c for c, col in self.data.items() if len(set(col)) == size)
        self.sq = solver._sq_py
        self._masks: dict[int, list[tuple[int, int]]] | None = None
        self._mask_of: dict[int, dict[int, int]] = {}
        self._scans: dict[tuple[int, ...], list[tuple[int, list[tuple[int, int, float]]]]] = {}
        self.memo: dict[tuple[int, tuple[int, ...]], float] = {}
        self.exact_memo: dict[tuple[int, tuple[int, ...]], float] = {}
        self.groups_memo: dict[tuple[int, tuple[int, ...]], list[_Group]] = {}

    def solve(self) -> list[_Node | _Emit]:
        out: list[_Node | _Emit] = []
        node = self.node
        everything = list(range(self.rows.size))
        self._into(everything, node.cols, node.tail, node.prefix, depth=node.depth, out=out)
        return out

    def _emit(self, idx: list[int], fields: tuple[int, ...]) -> _Emit:
        return _Emit(self.rows[np.asarray(idx, dtype=np.int64)], fields)

    def _strip(
        self, idx: list[int], cols: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        """Split ``cols`` into (constant on ``idx``, the others, their PHC)."""
        fixed: list[int] = []
        rest: list[int] = []
        value = 0.0
        dead = self.dead
        for c in cols:
            col = self.data[c]
            if c not in dead and len(set(map(col.__getitem__, idx))) == 1:
                fixed.append(c)
                value += self.sq[col[idx[0]]] * (len(idx) - 1)
            else:
                rest.append(c)
        return tuple(fixed), tuple(rest), value

    @property
    def masks(self) -> dict[int, list[tuple[int, int]]]:
        """Each grouping column's rows by code, codes ascending, as bit masks (bit i: row i).

        Only values held by two rows or more: the others never group.

        The lookahead works on sets of local rows as masks; built on its first use.
        """
        if self._masks is None:
            self._masks = {}
            for c, col in self.data.items():
                if c not in self.dead:
                    by_code: dict[int, int] = {}
                    for i, code in enumerate(col):
                        by_code[code] = by_code.get(code, 0) | 1 << i
                    # A value held by one row here groups no subset of these rows.
                    self._masks[c] = sorted(x for x in by_code.items() if x[1].bit_count() > 1)
                    self._mask_of[c] = by_code
        return self._masks

    @property
    def mask_of(self) -> dict[int, dict[int, int]]:
        """:attr:`masks` by column and code (for a lookup, not a scan)."""
        if self._masks is None:
            _ = self.masks
        return self._mask_of

    def _groups(self, rows: int, cols: tuple[int, ...]) -> list[_Group]:
        """Groups of >= 2 of ``rows`` (a mask), in tie-break order (statistics rank, then value)."""
        key = (rows, cols)
        got = self.groups_memo.get(key)
        if got is None:
            got = self.groups_memo[key] = self._find_groups(rows, cols)
        return got

    def _find_groups(self, rows: int, cols: tuple[int, ...]) -> list[_Group]:
        out: list[_Group] = []
        for c, entries in self._scan(cols):
            for code, mask, weight in entries:
                members = mask & rows
                count = members.bit_count()
                if count >= 2:
                    out.append((weight * (count - 1), c, code, members))
        return out

    def _scan(self, cols: tuple[int, ...]) -> list[tuple[int, list[tuple[int, int, float]]]]:
        """Each grouping column of ``cols`` with its values' (code, rows, weight), once per cols.

        A value's weight is its squared length plus what the columns it
        determines add while they are among ``cols`` (the numpy path's weights).
        """
        got = self._scans.get(cols)
        if got is not None:
            return got
        solver, deps, masks, sq = self.solver, self.solver.deps, self.masks, self.sq
        colset = set(cols)
        got = []
        for c in cols:
            by_code = masks.get(c)
            if not by_code:  # all distinct here
                continue
            present = tuple(b for b in deps.get(c, ()) if b in colset)
            if present:
                extra, base = solver._extra_list(c, present), solver.offsets[c]
                got.append((c, [(k, m, sq[k] + extra[k - base]) for k, m in by_code]))
            else:
                got.append((c, [(k, m, sq[k]) for k, m in by_code]))
        self._scans[cols] = got
        return got

    def _strip_mask(self, rows: int, cols: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
        """The columns of ``cols`` not constant on ``rows`` (a mask), and the constant ones' PHC."""
        rest: list[int] = []
        value = 0.0
        count = rows.bit_count()
        masks, data = self.mask_of, self.data
        first = (rows & -rows).bit_length() - 1  # the lowest row: its value is the one to check
        for c in cols:
            of = masks.get(c)
            if of is not None:
                code = data[c][first]
                if rows & ~of[code] == 0:  # every row holds this value
                    value += self.sq[code] * (count - 1)
                    continue
            rest.append(c)
        return tuple(rest), value

    def _value(self, rows: int, cols: tuple[int, ...]) -> float:
        """What the lookahead credits a sub-table: exact where it is small, else the greedy's."""
        if rows.bit_count() * len(cols) <= self.solver.exact_cells:
            return self._exact_value(rows, cols)
        return self._greedy_value(rows, cols)

    def _greedy_value(self, rows: int, cols: tuple[int, ...]) -> float:
        """PHC the plain greedy reaches on a sub-table (no tail, no limits but min_hitcount).

        A picked group's own rows are credited with :meth:`_value`.
        """
        if rows.bit_count() < 2 or not cols:
            return 0.0
        key = (rows, cols)
        got = self.memo.get(key)
        if got is not None:
            return got
        cols_left, value = self._strip_mask(rows, cols)
        left = rows
        while cols_left and left.bit_count() >= 2:
            groups = self._groups(left, cols_left)
            if not groups:
                break
            best = max(groups, key=_hitcount)  # the first of the best
            if best[0] <= self.solver.min_hitcount:
                break
            _, c, code, members = best
            value += self.sq[code] * (members.bit_count() - 1)
            value += self._value(members, tuple(x for x in cols_left if x != c))
            left &= ~members
        self.memo[key] = value
        return value

    def _exact_value(self, rows: int, cols: tuple[int, ...]) -> float:
        """The best PHC of a sub-table, by OPHR's recursion (memoized on rows and columns).

        Constant columns go first; then every group scoring above
        ``min_hitcount`` is tried: its rows first, without its column, then
        the other rows with every column. Exponential: only for sub-tables of
        at most ``exact_cells`` cells.
        """
        if rows.bit_count() < 2 or not cols:
            return 0.0
        key = (rows, cols)
        got = self.exact_memo.get(key)
        if got is not None:
            return got
        cols_left, value = self._strip_mask(rows, cols)
        best = 0.0
        if cols_left:
            min_hitcount = self.solver.min_hitcount
            for hc, c, code, members in self._groups(rows, cols_left):
                if hc <= min_hitcount:
                    continue
                gain = (
                    self.sq[code] * (members.bit_count() - 1)
                    + self._exact_value(members, tuple(x for x in cols_left if x != c))
                    + self._exact_value(rows & ~members, cols_left)
                )
                best = max(best, gain)
        value += best
        self.exact_memo[key] = value
        return value

    def _into(
        self,
        idx: list[int],
        cols: tuple[int, ...],
        tail: tuple[int, ...],
        prefix: tuple[int, ...],
        *,
        depth: int,
        out: list[_Node | _Emit],
    ) -> None:
        solver = self.solver
        if len(idx) < 2 or not (cols or tail):
            out.append(self._emit(idx, prefix + cols + tail))
            return
        look = len(idx) * len(cols) <= solver.lookahead_cells
        if cols:
            fixed, cols, _ = self._strip(idx, cols)
            prefix = prefix + fixed
        if not cols:
            if tail:
                self._into(idx, tail, (), prefix, depth=depth, out=out)
            else:
                out.append(self._emit(idx, prefix))
            return
        if (
            len(idx) == 2
            or len(cols) == 1
            or (solver.max_depth is not None and depth >= solver.max_depth)
        ):
            out.append(self._fallback(idx, cols, tail, prefix))
            return
        if look:
            picks, idx = self._picks_lookahead(idx, cols)
        else:
            picks, idx = self._picks_plain(idx, cols)
        for c, members in picks:
            sub = tuple(x for x in cols if x != c)
            self._into(members, sub, tail, (*prefix, c), depth=depth + 1, out=out)
        if idx:
            out.append(self._fallback(idx, cols, tail, prefix))

    def _picks_plain(
        self, idx: list[int], cols: tuple[int, ...]
    ) -> tuple[list[tuple[int, list[int]]], list[int]]:
        """The A-chain without lookahead: a lazy max-heap over the groups, as in numpy."""
        solver = self.solver
        sq, data, dead = self.sq, self.data, self.dead
        min_hitcount = solver.min_hitcount
        colset = set(cols) if solver.deps else set()
        members_of: dict[int, list[int]] = {}
        counts: dict[int, int] = {}
        weight: dict[int, float] = {}
        column: dict[int, int] = {}
        heap: list[tuple[float, int, int]] = []
        active = [c for c in cols if c not in dead]
        for c in active:
            col = data[c]
            by_code: dict[int, list[int]] = {}
            for i in idx:
                by_code.setdefault(col[i], []).append(i)
            if len(by_code) == len(idx):
                continue
            present = tuple(b for b in solver.deps.get(c, ()) if b in colset)
            extra = solver._extra_list(c, present) if present else None
            base = solver.offsets[c]
            for code, members in by_code.items():
                if len(members) < 2:
                    continue
                w = sq[code] + (extra[code - base] if extra is not None else 0.0)
                members_of[code] = members
                counts[code] = len(members)
                weight[code] = w
                column[code] = c
                score = w * (len(members) - 1)
                if score > min_hitcount:
                    heap.append((-score, code, len(members)))
        heapq.heapify(heap)
        alive = set(idx)
        remaining = len(idx)
        picks: list[tuple[int, list[int]]] = []
        while heap:
            _, code, count = heap[0]
            now = counts[code]
            if now != count:  # stale: rows were taken by earlier groups
                score = weight[code] * (now - 1)
                if now >= 2 and score > min_hitcount:
                    heapq.heapreplace(heap, (-score, code, now))
                else:
                    heapq.heappop(heap)
                continue
            heapq.heappop(heap)
            members = [i for i in members_of[code] if i in alive]
            for i in members:
                alive.discard(i)
                for c in active:
                    k = data[c][i]
                    if k in counts:
                        counts[k] -= 1
            picks.append((column[code], members))
            remaining -= len(members)
            if remaining < 2 or (solver.max_groups is not None and len(picks) >= solver.max_groups):
                break
        return picks, [i for i in idx if i in alive]

    def _picks_lookahead(
        self, idx: list[int], cols: tuple[int, ...]
    ) -> tuple[list[tuple[int, list[int]]], list[int]]:
        """The A-chain with each pick chosen by a one-step rollout."""
        solver = self.solver
        picks: list[tuple[int, list[int]]] = []
        left = 0
        for i in idx:
            left |= 1 << i
        while left.bit_count() >= 2:
            cands = [g for g in self._groups(left, cols) if g[0] > solver.min_hitcount]
            if not cands:
                break
            best = cands[0]
            best_key: tuple[float, float] | None = None
            for cand in cands if len(cands) > 1 else ():
                hc, c, code, members = cand
                estimate = (
                    self.sq[code] * (members.bit_count() - 1)
                    + self._value(members, tuple(x for x in cols if x != c))
                    + self._value(left & ~members, cols)
                )
                if best_key is None or (estimate, hc) > best_key:
                    best_key, best = (estimate, hc), cand
            _, c, _, members = best
            picks.append((c, _positions(members)))
            left &= ~members
            if solver.max_groups is not None and len(picks) >= solver.max_groups:
                break
        return picks, _positions(left)

    def _fallback(
        self, idx: list[int], cols: tuple[int, ...], tail: tuple[int, ...], prefix: tuple[int, ...]
    ) -> _Emit:
        """Statistics order and a lexicographic row sort (ties: row order)."""
        order = cols + tail
        if len(idx) > 1 and order:
            keys = zip(*(list(map(self.data[c].__getitem__, idx)) for c in order), strict=True)
            idx = [i for _, i in sorted(zip(keys, idx, strict=True))]
        return self._emit(idx, prefix + order)


def _positions(mask: int) -> list[int]:
    """The set bits of ``mask``, ascending.

    Examples
    --------
    >>> _positions(0b10110)
    [1, 2, 4]
    """
    out: list[int] = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def _check_params(
    max_depth: int | None,
    max_groups: int | None,
    min_hitcount: float,
    high_cardinality: float | None,
    lookahead_cells: int,
    *,
    exact_cells: int = DEFAULT_EXACT_CELLS,
    weigh: str = "best",
) -> None:
    if weigh not in WEIGHS:
        msg = f"weigh must be one of {', '.join(map(repr, WEIGHS))}, got {weigh!r}."
        raise ConfigError(msg)
    if not isinstance(lookahead_cells, int) or lookahead_cells < 0:
        msg = f"lookahead_cells must be an int >= 0, got {lookahead_cells!r}."
        raise ConfigError(msg)
    if not isinstance(exact_cells, int) or not 0 <= exact_cells <= _MAX_EXACT_CELLS:
        msg = (
            f"exact_cells must be an int from 0 to {_MAX_EXACT_CELLS} (the exact search is "
            f"exponential in it), got {exact_cells!r}."
        )
        raise ConfigError(msg)
    if max_depth is not None and (not isinstance(max_depth, int) or max_depth < 0):
        msg = f"max_depth must be an int >= 0 or None, got {max_depth!r}."
        raise ConfigError(msg)
    if max_groups is not None and (not isinstance(max_groups, int) or max_groups < 1):
        msg = f"max_groups must be an int >= 1 or None, got {max_groups!r}."
        raise ConfigError(msg)
    if not isinstance(min_hitcount, (int, float)) or not math.isfinite(min_hitcount):
        msg = f"min_hitcount must be a finite number, got {min_hitcount!r}."
        raise ConfigError(msg)
    if high_cardinality is not None and not (
        isinstance(high_cardinality, (int, float)) and 0 < high_cardinality <= 1
    ):
        msg = f"high_cardinality must be in (0, 1] or None, got {high_cardinality!r}."
        raise ConfigError(msg)


def assemble(enc: Encoded, blocks: Iterable[tuple[IntArray, tuple[int, ...]]]) -> Ordering:
    """Build an :class:`Ordering` from blocks of rows sharing one field order."""
    number: dict[tuple[int, ...], int] = {}
    row_parts: list[IntArray] = []
    id_parts: list[IntArray] = []
    for rows, order in blocks:
        if rows.size == 0:
            continue
        row_parts.append(rows)
        id_parts.append(np.full(rows.size, number.setdefault(order, len(number)), dtype=np.int64))
    if not row_parts:
        return Ordering((), ())
    names = [tuple(enc.columns[j] for j in order) for order in number]
    return Ordering.from_arrays(np.concatenate(row_parts), names, np.concatenate(id_parts))


def assemble_depth_first(
    enc: Encoded, blocks: Sequence[tuple[IntArray, tuple[int, ...]]]
) -> Ordering:
    """Like :func:`assemble`, then the rows in depth-first order of their prompts.

    The blocks' field orders stay; the rows move so that every shared prefix
    runs back to back (:func:`semframe.reorder.trie.depth_first`): the
    previous-prompt hit rate then equals the unbounded one.
    """
    return _DepthFirst(enc, _Gathered.of(blocks)).ordering()


@dataclass(frozen=True, slots=True)
class _Gathered:
    """Blocks of rows as arrays: every row, and each row's field order (into ``orders``)."""

    rows: IntArray
    order_of: Codes
    orders: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, blocks: Iterable[tuple[IntArray, tuple[int, ...]]]) -> _Gathered:
        blocks = list(blocks)
        out = _Gatherer(sum(rows.size for rows, _ in blocks))
        for rows, order in blocks:
            out.add(rows, order)
        return out.gathered()


class _Gatherer:
    """Blocks of rows copied into one array as they come; field orders kept once per run.

    A solve emits many small blocks: kept as objects they would cost about
    100 bytes a row.
    """

    def __init__(self, n: int) -> None:
        self.rows = np.empty(n, dtype=np.int64)
        self.at = 0
        self.ids: dict[tuple[int, ...], int] = {}
        self.runs: list[int] = []  # field-order id, then rows, per run of one field order

    def add(self, rows: IntArray, fields: tuple[int, ...]) -> None:
        size = rows.size
        if not size:
            return
        self.rows[self.at : self.at + size] = rows
        self.at += size
        order = self.ids.setdefault(fields, len(self.ids))
        if self.runs and self.runs[-2] == order:
            self.runs[-1] += size
        else:
            self.runs += (order, size)

    def gathered(self) -> _Gathered:
        if self.at != self.rows.size:  # pragma: no cover - every row is emitted exactly once
            msg = f"internal error: GGR emitted {self.at} of {self.rows.size} rows"
            raise RuntimeError(msg)
        order_of = np.repeat(
            np.asarray(self.runs[0::2], dtype=code_dtype(len(self.ids))), self.runs[1::2]
        )
        return _Gathered(self.rows, order_of, tuple(self.ids))


def _segment_codes(
    enc: Encoded, rows: Codes, order_of: Codes, orders: Sequence[tuple[int, ...]]
) -> Codes:
    """Each prompt's global segment codes (n x m), from its row and its field order's number.

    In 4 bytes where they fit, built a depth and a column at a time (not an
    n x m array of 8-byte codes and another of offsets); in plain Python up
    to :data:`_PYTHON_CELLS` cells, where numpy's per-call cost would dominate.
    """
    m = enc.n_columns
    offsets = list(itertools.accumulate(enc.cardinalities[:-1], initial=0))[:m]
    dtype = np.int64 if sum(enc.cardinalities) >= 2**31 else np.int32
    if rows.size * m <= _PYTHON_CELLS:
        codes = [enc.codes[c][rows].tolist() for c in range(m)]
        cells = [
            [codes[c][i] + offsets[c] for c in orders[o]] for i, o in enumerate(order_of.tolist())
        ]
        return cast("Codes", np.array(cells, dtype=dtype).reshape(rows.size, m))
    columns = np.array(list(orders), dtype=np.int8 if m < 128 else np.int64)
    columns = columns.reshape(len(orders), m)  # column numbers: a byte where they fit
    segments = np.empty((rows.size, m), dtype=dtype)
    for k in range(m):
        here = np.unique(columns[:, k]).tolist()  # the columns rendered at depth k
        if len(here) == 1:
            c = here[0]
            np.add(enc.codes[c][rows], offsets[c], out=segments[:, k], dtype=segments.dtype)
            continue
        at = columns[order_of, k]
        for c in here:
            sel = np.flatnonzero(at == c)
            segments[sel, k] = np.add(enc.codes[c][rows[sel]], offsets[c], dtype=np.int64)
        del at, sel
    return segments


class _DepthFirst:
    """Blocks of rows put in depth-first order, with their prompts' segment codes."""

    def __init__(self, enc: Encoded, gathered: _Gathered) -> None:
        self.enc = enc
        rows_all, row_order = gathered.rows, gathered.order_of
        order_ids = gathered.orders
        segments = _segment_codes(enc, rows_all, row_order, order_ids)
        perm = depth_first(segments)
        for k in range(enc.n_columns):  # permuted in place, a column at a time (not n x m again)
            segments[:, k] = segments[perm, k]
        self.segments: IntArray | None = segments
        self._served: int | None = None
        self.orders = order_ids
        # The runs of prompts with the same first segment: their sizes and the units
        # served inside each, in execution order (counted with the served units).
        self.top: tuple[IntArray, IntArray] | None = None
        # Kept until one solve is chosen (arrays: rows in 4 bytes where they fit).
        self.order = Ordering.from_arrays(
            rows_all[perm].astype(np.int32 if perm.size < 2**31 else np.int64),
            [tuple(enc.columns[j] for j in order) for order in order_ids],
            row_order[perm],
        )

    def ordering(self) -> Ordering:
        """The rows and field orders as an :class:`Ordering` (the segment codes released first)."""
        self.segments = None
        return self.order

    def same_as(self, other: _DepthFirst) -> bool:
        """Whether ``other`` is the same ordering."""
        return self.order == other.order

    def served(self) -> int:
        """Segment units (characters or tokens) a previous-prompt cache serves."""
        if self._served is None:
            codes = self.codes()
            by_prompt = served_by_prompt(codes, _encoded_units(self.enc))
            self._served = int(by_prompt.sum())
            if codes.shape[0] and codes.shape[1]:
                first = codes[:, 0]
                starts = np.flatnonzero(first[1:] != first[:-1]) + 1
                starts = np.concatenate([np.zeros(1, dtype=starts.dtype), starts])
                sizes = np.diff(np.append(starts, first.size))
                self.top = (sizes, np.add.reduceat(by_prompt, starts))
        return self._served

    def codes(self) -> IntArray:
        """Each prompt's global segment codes, in execution order (n x m)."""
        if self.segments is None:  # pragma: no cover - only released once scored
            msg = "internal error: the segment codes were released"
            raise RuntimeError(msg)
        return self.segments

    def score_and_release(self) -> None:
        """Count :meth:`served` now and release the segment codes (an n x m array)."""
        self.served()
        self.segments = None


def _sorted_served(enc: Encoded, rows: IntArray, order: Sequence[int]) -> int:
    """Segment units a previous-prompt cache serves: ``rows`` (sorted) all in field ``order``.

    A row's segment at depth ``k`` is served when the row agrees with the one
    before it on the first ``k + 1`` fields (what :meth:`_DepthFirst.served`
    counts, without building the prompts' codes).
    """
    if rows.size < 2:
        return 0
    same = np.ones(rows.size - 1, dtype=bool)
    total = 0
    for c in order:
        codes = enc.codes[c][rows]
        same &= codes[1:] == codes[:-1]
        if not same.any():
            break
        total += int(enc.segment_units(c)[codes[1:][same]].sum())
    return total


def _mixed(
    enc: Encoded, solve: _DepthFirst, fixed_rows: IntArray, order: tuple[int, ...], floor: int
) -> _Gathered | None:
    """A solve's large top-level groups kept, the rest of its rows in the fixed ``order``.

    Where a table has a few large groups and a long tail of small ones, the
    per-row solve serves the large groups best and one field order serves the
    tail best: neither candidate alone is that mix. The groups are the runs of
    the solve's prompts that share their first segment; each size threshold
    of :func:`_thresholds` (smaller groups go to ``order``, whose rows are
    ``fixed_rows``, sorted) is counted without building its prompts, as the
    units served inside the groups kept plus what the sorted rest serves. The
    best threshold is returned as rows and field orders if it serves more
    than ``floor``, else ``None``. The count is a lower bound: in depth-first
    order a kept group and the rest can share more.
    """
    if solve.top is None:
        return None
    sizes, inside = solve.top
    largest = int(sizes.max())
    if largest < 2 or sizes.size < 2:
        return None  # one group, or only single rows: the solve itself, or the fixed order
    rows = np.asarray(solve.order.rows, dtype=np.int64)
    width = np.int32 if enc.n_rows < 2**31 else np.int64
    size_of: IntArray = np.empty(enc.n_rows, dtype=width)
    size_of[rows] = np.repeat(sizes, sizes)
    in_fixed = size_of[fixed_rows]
    best, best_at = floor, 0
    for at in _thresholds(sizes):
        total = int(inside[sizes >= at].sum())
        total += _sorted_served(enc, fixed_rows[in_fixed < at], order)
        if total > best:
            best, best_at = total, at
    if not best_at:
        return None
    orders = (*solve.orders, order)
    order_of = np.asarray(solve.order.order_of, dtype=np.int64).copy()
    order_of[np.repeat(sizes < best_at, sizes)] = len(orders) - 1
    return _Gathered(rows, order_of.astype(code_dtype(len(orders))), orders)


_MIX_LARGEST = 16
""":func:`_mixed` tries each of the largest this many group sizes as a threshold."""

_MIX_STEP = 1.5
"""Below them, group sizes at least this factor apart."""


def _thresholds(sizes: IntArray) -> list[int]:
    """Group sizes :func:`_mixed` tries as thresholds, largest first.

    Each of the :data:`_MIX_LARGEST` largest distinct sizes (a few large groups
    decide the most), then sizes at least :data:`_MIX_STEP` apart, down to 2.

    Examples
    --------
    >>> _thresholds(np.array([1, 2, 3, 3, 50, 7]))
    [50, 7, 3, 2]
    >>> len(_thresholds(np.arange(1, 1001)))
    30
    """
    distinct: list[int] = np.unique(sizes[sizes >= 2])[::-1].tolist()
    out = distinct[:_MIX_LARGEST]
    for size in distinct[_MIX_LARGEST:]:
        if size * _MIX_STEP <= out[-1]:
            out.append(size)
    return out


def _encoded_units(enc: Encoded) -> IntArray:
    """Each segment's units by global code (its value's and its label's lengths)."""
    return np.concatenate([enc.segment_units(j) for j in range(enc.n_columns)])


def objective_units(enc: Encoded, objective: Objective) -> IntArray:
    """Tokens of each segment ``f"{column}: {value}\n"`` by global code, for ``objective``."""
    tokenizer = objective.tokenizer
    if tokenizer is None:
        return _encoded_units(enc)
    parts = [
        np.fromiter((tokenizer(f"{col}: {v}\n") for v in enc.values[j]), np.int64)
        for j, col in enumerate(enc.columns)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def ggr_encoded(
    enc: Encoded,
    fds: Sequence[tuple[int, int]] = (),
    *,
    discover: bool = True,
    max_depth: int | None = None,
    max_groups: int | None = None,
    min_hitcount: float = 0.0,
    high_cardinality: float | None = DEFAULT_HIGH_CARDINALITY,
    lookahead_cells: int = DEFAULT_LOOKAHEAD_CELLS,
    exact_cells: int = DEFAULT_EXACT_CELLS,
    weigh: str = "best",
    objective: Objective | None = None,
) -> Ordering:
    """GGR on an encoded table, with ``fds`` (column index pairs) and discovered FDs.

    ``objective`` decides between the two solves of ``weigh="best"`` (see
    :class:`Objective`); ``None`` counts segment units.
    """
    _check_params(
        max_depth,
        max_groups,
        min_hitcount,
        high_cardinality,
        lookahead_cells,
        exact_cells=exact_cells,
        weigh=weigh,
    )
    if enc.n_rows == 0:
        return Ordering((), ())
    if enc.n_columns == 0:
        return Ordering.identity(enc.n_rows, ())
    layout = _layout(enc, high_cardinality)
    effective = list(fds)
    work = enc.n_rows * len(layout.rec) * (len(layout.rec) - 1)
    if discover and enc.n_rows > 1 and 0 < work <= _FD_BUDGET:
        # Discovery compares every pair of columns; on very wide tables it is
        # skipped (FDs only sharpen the scores, the ordering stays valid).
        effective = list(dict.fromkeys([*effective, *fd_pairs(enc, layout.rec)]))
    results: list[_DepthFirst] = []
    for w in ("value", "segment") if weigh == "best" else (weigh,):
        solver = _Solver(
            enc,
            layout,
            effective,
            max_depth=max_depth,
            max_groups=max_groups,
            min_hitcount=float(min_hitcount),
            lookahead_cells=lookahead_cells,
            exact_cells=exact_cells,
            weigh=w,
        )
        gathered = solver.run()
        del solver  # its per-code caches go before the depth-first pass
        results.append(_DepthFirst(enc, gathered))
        del gathered  # the depth-first order holds the rows and field orders now
        if weigh == "best" and objective is None and len(results) == 1:
            # Scored now, the first solve's codes are not held through the second solve.
            results[0].score_and_release()
    if weigh == "best":
        # The third candidate: one field order for every row, the one whose sorted
        # rows share the most (fixed_order), as a table of few large groups wants.
        # Counted first, it is built only where it could be chosen.
        if objective is None:
            results[-1].score_and_release()
        order = fixed_order(enc, effective)
        rows = lexsort_rows(enc, np.arange(enc.n_rows, dtype=np.int64), order)
        solves = list(results)
        floor = max(r.served() for r in solves)
        served_fixed = _sorted_served(enc, rows, order)
        if objective is not None or served_fixed > floor:
            fixed = _Gathered(rows, np.zeros(enc.n_rows, dtype=np.int8), (order,))
            results.append(_DepthFirst(enc, fixed))
            del fixed
        # The fourth and fifth: each solve's large groups, the rest in the fixed order
        # (a few large groups and a long tail), built where the count says it serves more.
        floor = max(floor, served_fixed)
        for solve in solves:
            if objective is None:
                results[-1].score_and_release()  # one candidate's codes held at a time
            mixed = _mixed(enc, solve, rows, order, floor)
            if mixed is not None:
                results.append(_DepthFirst(enc, mixed))
                floor = max(floor, results[-1].served())
            del mixed
        del rows, solves
    distinct = [r for i, r in enumerate(results) if not any(r.same_as(q) for q in results[:i])]
    if len(distinct) == 1:
        chosen = distinct[0]  # nothing to choose (and no tokens to count)
    # The objective decides between the candidates: the prompt units served.
    elif objective is None:
        chosen = max(distinct, key=_DepthFirst.served)  # the first (GGR, "value") on a tie
    else:
        units = objective_units(enc, objective)

        def served(r: _DepthFirst) -> tuple[int, int]:
            # Served tokens at the cache's granularity; where they tie (a table
            # whose prompts all fall short of the minimum), segment units decide.
            at = served_tokens(r.codes(), units, objective.granularity, head=objective.head)
            return at, r.served()

        chosen = max(distinct, key=served)
    results.clear()  # the other candidates' arrays go before the chosen one's tuples are built
    distinct.clear()
    return chosen.ordering()


def ggr(
    frame: object,
    columns: Sequence[str] | None = None,
    *,
    fds: Iterable[Sequence[str]] | None = None,
    discover_fds: bool = True,
    max_depth: int | None = None,
    max_groups: int | None = None,
    min_hitcount: float = 0.0,
    high_cardinality: float | None = DEFAULT_HIGH_CARDINALITY,
    lookahead_cells: int = DEFAULT_LOOKAHEAD_CELLS,
    exact_cells: int = DEFAULT_EXACT_CELLS,
    tokenizer: Tokenizer | None = None,
    weigh: str = "best",
    granularity: Granularity | None = None,
    head: int = 0,
) -> Ordering:
    """Reorder rows and per-row fields with Greedy Group Recursion.

    Parameters
    ----------
    frame : Table, pandas or Polars DataFrame, or mapping of columns
        The rows of the relQuery.
    columns : sequence of str, optional
        The fields each prompt carries (all columns when ``None``). Every
        returned field order is a permutation of them.
    fds : iterable of (str, str), optional
        Functional dependencies ``(determinant, dependent)``; each is checked
        against the data (:class:`~semframe.errors.InputError` if it does not
        hold).
    discover_fds : bool
        Also discover every exact single-column dependency (default; skipped
        on very wide tables, where comparing every pair of columns would cost
        more than 3e8 cell comparisons). With ``False`` only ``fds`` are used.
    max_depth : int, optional
        Column-wise recursion limit: below this many nested groups, the rest of
        a sub-table is ordered by statistics.
    max_groups : int, optional
        Row-wise limit: after this many groups split off one sub-table, its
        remaining rows are ordered by statistics.
    min_hitcount : float
        Stop splitting a sub-table when no group scores above this
        HITCOUNT (squared length times repeats).
    high_cardinality : float or None
        Columns with more than ``high_cardinality * n_rows`` distinct values
        stay out of the recursion and are placed last; ``None`` keeps all.
    lookahead_cells : int
        Sub-tables of at most this many cells (rows x recursion columns) are
        solved with a one-step lookahead: each candidate group is scored by the
        PHC the plain greedy reaches after picking it, not by its HITCOUNT
        alone. ``0`` runs the paper's plain greedy everywhere.
    exact_cells : int
        In the lookahead, sub-tables of at most this many cells are credited
        with their exact optimum (OPHR's recursion) rather than the greedy's
        (16 by default, at most 48: the search is exponential). A table of
        at most this many cells is ordered optimally for ``weigh="value"``
        (with ``high_cardinality=None``). ``0``: the greedy's everywhere.
    tokenizer : callable, optional
        Token count of a string: lengths are tokens instead of characters.
    weigh : {"best", "value", "segment"}
        How a value's length enters its group's score: ``"value"`` squares the
        value's own length (the paper's PHC); ``"segment"`` squares the length
        of the prompt segment that carries it, label included
        (``f"{column}: {value}\\n"``), which weighs short values under long
        labels (a rating) the way the prompt does. Neither is right on every
        table: ``"best"`` (default) runs both, adds the rows sorted in the one
        field order that shares most
        (:func:`~semframe.reorder.stats.fixed_order`) and each solve's large
        groups with its other rows in that order, and keeps the candidate
        whose prompts a cache serves more of, counted in segment units.
    granularity : Granularity, optional
        The cache's units: with it, ``"best"`` counts each prompt's served
        prefix (``head`` included) rounded down to it
        (:func:`~semframe.reorder.metrics.served_tokens`), in ``tokenizer``'s
        tokens of whole segments when given.
    head : int
        Tokens in front of every prompt (instructions), for ``granularity``.

    Returns
    -------
    Ordering
        ``rows`` in execution order and each row's field order.

    Examples
    --------
    The paper's Figure 1a: a unique first field hides two shared ones.

    >>> t = {"id": ["1", "2", "3"], "a": ["x", "x", "x"], "b": ["y", "y", "y"]}
    >>> o = ggr(t)
    >>> o.rows.tolist(), o.fields[0]
    ([0, 1, 2], ('a', 'b', 'id'))

    Groups in different fields get different field orders:

    >>> t = {"f1": ["a", "a", "p", "q"], "f2": ["r", "s", "b", "b"]}
    >>> o = ggr(t)
    >>> list(zip(o.rows.tolist(), o.fields))
    [(0, ('f1', 'f2')), (1, ('f1', 'f2')), (2, ('f2', 'f1')), (3, ('f2', 'f1'))]
    """
    table = to_table(frame, columns)
    enc = encode(table, tokenizer)
    given = check_fds(enc, fds) if fds is not None else []
    return ggr_encoded(
        enc,
        given,
        discover=discover_fds,
        max_depth=max_depth,
        max_groups=max_groups,
        min_hitcount=min_hitcount,
        high_cardinality=high_cardinality,
        lookahead_cells=lookahead_cells,
        exact_cells=exact_cells,
        weigh=weigh,
        objective=None if granularity is None else Objective(granularity, tokenizer, head),
    )
