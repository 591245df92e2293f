"""Optimal Prefix Hit Recursion (OPHR): the exact reordering, for small tables.

``OPHR(R, C)`` is the best PHC for rows ``R`` over columns ``C``. Columns with a
single value in ``R`` go first (never worse; see :mod:`semframe.reorder.ggr`).
Then every ``(column c, value v)`` held by at least two rows is tried: the rows
``R_v`` run first with ``v`` in front, recursing without ``c``; the other rows
follow with all columns::

    OPHR(R, C) = max over (c, v) of  len(v)**2 * (|R_v| - 1)
                                     + OPHR(R_v, C - {c}) + OPHR(R - R_v, C)

Sub-problems are memoized on ``(row set, column set)`` bit masks. The search
is exponential, so :func:`ophr` refuses tables above ``max_cells`` cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from semframe.core.ordering import Ordering
from semframe.errors import ConfigError, InputError
from semframe.reorder._encode import Encoded, Tokenizer, encode, to_table
from semframe.reorder.ggr import assemble
from semframe.reorder.stats import lexsort_rows, stats_rank

OPHR_MAX_CELLS = 48
"""Default size limit (rows x columns) of :func:`ophr`."""


@dataclass(frozen=True, slots=True)
class _Choice:
    constant: tuple[int, ...]  # columns with one value in the row set, placed first
    column: int  # the picked group's column (-1: no group repeats)
    group: int  # the picked group's rows (bit mask)


class _Exact:
    def __init__(self, enc: Encoded) -> None:
        self.n = enc.n_rows
        self.rank = tuple(stats_rank(enc))
        self.codes = [enc.codes[j].tolist() for j in range(enc.n_columns)]
        self.sq = [[int(x) * int(x) for x in enc.lengths[j].tolist()] for j in range(enc.n_columns)]
        self.memo: dict[tuple[int, int], tuple[int, _Choice | None]] = {}

    def rows_of(self, rmask: int) -> list[int]:
        return [r for r in range(self.n) if rmask >> r & 1]

    def cols_of(self, cmask: int) -> tuple[int, ...]:
        return tuple(j for j in self.rank if cmask >> j & 1)

    def best(self, rmask: int, cmask: int) -> int:
        key = (rmask, cmask)
        got = self.memo.get(key)
        if got is not None:
            return got[0]
        rows = self.rows_of(rmask)
        if len(rows) < 2 or cmask == 0:
            self.memo[key] = (0, None)
            return 0
        k = len(rows)
        value = 0
        constant: list[int] = []
        groups: list[tuple[int, int, int]] = []  # (column, code, row mask)
        for j in self.cols_of(cmask):
            col = self.codes[j]
            by_code: dict[int, int] = {}
            for r in rows:
                by_code[col[r]] = by_code.get(col[r], 0) | (1 << r)
            if len(by_code) == 1:
                constant.append(j)
                value += self.sq[j][col[rows[0]]] * (k - 1)
                continue
            groups.extend((j, code, mask) for code, mask in sorted(by_code.items()))
        rest = cmask
        for j in constant:
            rest &= ~(1 << j)
        best_gain, best_col, best_group = 0, -1, 0
        for j, code, mask in groups:
            size = mask.bit_count()
            if size < 2:
                continue
            gain = (
                self.sq[j][code] * (size - 1)
                + self.best(mask, rest & ~(1 << j))
                + self.best(rmask & ~mask, rest)
            )
            if gain > best_gain:
                best_gain, best_col, best_group = gain, j, mask
        total = value + best_gain
        self.memo[key] = (total, _Choice(tuple(constant), best_col, best_group))
        return total

    def blocks(self, rmask: int, cmask: int) -> list[tuple[list[int], tuple[int, ...]]]:
        """The optimal sequence as (rows, field order) blocks, without recursion."""
        out: list[tuple[list[int], tuple[int, ...]]] = []
        stack: list[tuple[int, int, tuple[int, ...]]] = [(rmask, cmask, ())]
        while stack:
            rm, cm, prefix = stack.pop()
            if rm == 0:
                continue
            self.best(rm, cm)
            _, choice = self.memo[(rm, cm)]
            if choice is None:
                out.append((self.rows_of(rm), prefix + self.cols_of(cm)))
                continue
            rest = cm
            for j in choice.constant:
                rest &= ~(1 << j)
            prefix = prefix + choice.constant
            if choice.column < 0:
                out.append((self.rows_of(rm), prefix + self.cols_of(rest)))
                continue
            # Pushed in reverse: the group R_v runs first, then the other rows.
            stack.append((rm & ~choice.group, rest, prefix))
            stack.append((choice.group, rest & ~(1 << choice.column), (*prefix, choice.column)))
        return out


def ophr_encoded(enc: Encoded, *, max_cells: int = OPHR_MAX_CELLS) -> Ordering:
    """OPHR on an encoded table."""
    if not isinstance(max_cells, int) or max_cells < 1:
        msg = f"max_cells must be an int >= 1, got {max_cells!r}."
        raise ConfigError(msg)
    n, m = enc.n_rows, enc.n_columns
    if n == 0:
        return Ordering((), ())
    if n == 1 or m <= 1:
        # One row: nothing to share. One column: grouping equal values is optimal.
        rank = tuple(stats_rank(enc))
        rows = lexsort_rows(enc, np.arange(n, dtype=np.int64), rank)
        return assemble(enc, [(rows, rank)])
    if n * m > max_cells:
        msg = (
            f"ophr() is exact and exponential in the table size: this table has {n} rows x "
            f"{m} columns = {n * m} cells, above the limit max_cells={max_cells}. "
            "Use ggr() for larger tables, or raise max_cells if you can wait."
        )
        raise InputError(msg)
    exact = _Exact(enc)
    blocks = exact.blocks((1 << n) - 1, (1 << m) - 1)
    return assemble(enc, [(np.asarray(r, dtype=np.int64), f) for r, f in blocks])


def ophr_value(enc: Encoded) -> int:
    """The optimal PHC of a small encoded table (no size check)."""
    if enc.n_rows < 2 or enc.n_columns == 0:
        return 0
    return _Exact(enc).best((1 << enc.n_rows) - 1, (1 << enc.n_columns) - 1)


def ophr(
    frame: object,
    columns: Sequence[str] | None = None,
    *,
    max_cells: int = OPHR_MAX_CELLS,
    tokenizer: Tokenizer | None = None,
) -> Ordering:
    """The exact optimum of the prefix hit count (OPHR), for small tables.

    Parameters
    ----------
    frame : Table, pandas or Polars DataFrame, or mapping of columns
        The rows of the relQuery.
    columns : sequence of str, optional
        The fields each prompt carries (all columns when ``None``).
    max_cells : int
        Refuse tables with more than this many cells (rows x columns), unless
        they have one row or one column (then the optimum is a sort).
    tokenizer : callable, optional
        Token count of a string: lengths are tokens instead of characters.

    Returns
    -------
    Ordering
        An ordering of maximal PHC. Ties are broken by a fixed rule (columns
        in statistics order, values in sorted order), so the result is
        deterministic.

    Raises
    ------
    InputError
        If the table is larger than ``max_cells``.

    Examples
    --------
    >>> o = ophr({"f1": ["a", "a", "p", "q"], "f2": ["r", "s", "b", "b"]})
    >>> list(zip(o.rows.tolist(), o.fields))
    [(0, ('f1', 'f2')), (1, ('f1', 'f2')), (2, ('f2', 'f1')), (3, ('f2', 'f1'))]
    """
    return ophr_encoded(encode(to_table(frame, columns), tokenizer), max_cells=max_cells)
