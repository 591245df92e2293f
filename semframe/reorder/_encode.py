"""Integer encoding of a :class:`~semframe.core.table.Table` for the reordering algorithms.

Every column is factorized once: its distinct values are sorted, and each cell
becomes the rank of its value (so comparing codes within a column compares the
strings, and a lexicographic sort of codes is a lexicographic sort of text).
Lengths are measured once per distinct value, in characters or, given a
tokenizer, in tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from semframe.core.ordering import Ordering
from semframe.core.table import (
    ArrowValues,
    Coded,
    Codes,
    Table,
    as_table,
    char_lengths,
    code_dtype,
)
from semframe.errors import ColumnError, InputError, format_choices

Tokenizer = Callable[[str], int]
"""A function returning the number of tokens of a string."""

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class Encoded:
    """A table as integer codes, with a length per distinct value.

    Attributes
    ----------
    columns : tuple of str
        Column names, in table order.
    n_rows : int
        Number of rows.
    codes : tuple of ndarray of int
        ``codes[j][r]`` is the rank of row ``r``'s value among the sorted
        distinct values of column ``j``; each column's codes take the
        narrowest integer type that holds them (a byte up to 127 values).
    values : tuple of sequences of str
        The sorted distinct values of each column (a tuple, or
        :class:`~semframe.core.table.ArrowValues` for free text held in Arrow).
    lengths : tuple of ndarray of int64
        ``lengths[j][k]`` is the length of ``values[j][k]`` (characters or tokens).
    labels : tuple of int
        Length of column ``j``'s label in a prompt segment ``f"{column}: {value}\\n"``
        (``len(column) + 3`` characters, or the tokenizer's count of
        ``f"{column}: \\n"``); a segment is ``lengths[j][k] + labels[j]`` long.
        Derived in characters when not given.
    n_columns : int
        Number of columns (derived).
    cardinalities : tuple of int
        Distinct values per column (derived).
    value_counts : tuple of ndarray of int64
        ``value_counts[j][k]``: how many rows hold ``values[j][k]`` (derived).
    """

    columns: tuple[str, ...]
    n_rows: int
    codes: tuple[Codes, ...]
    values: tuple[Sequence[str], ...]
    lengths: tuple[IntArray, ...]
    labels: tuple[int, ...] = ()
    n_columns: int = field(init=False)
    cardinalities: tuple[int, ...] = field(init=False)
    value_counts: tuple[IntArray, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Derived once: the solvers read them in their inner loops.
        object.__setattr__(self, "n_columns", len(self.columns))
        if len(self.labels) != len(self.columns):
            object.__setattr__(self, "labels", tuple(len(c) + 3 for c in self.columns))
        object.__setattr__(self, "cardinalities", tuple(len(v) for v in self.values))
        counts = tuple(
            np.bincount(self.codes[j], minlength=len(v)).astype(np.int64)
            for j, v in enumerate(self.values)
        )
        object.__setattr__(self, "value_counts", counts)

    def cardinality(self, j: int) -> int:
        """Number of distinct values of column ``j``."""
        return self.cardinalities[j]

    def counts(self, j: int) -> IntArray:
        """How many rows hold each distinct value of column ``j``."""
        return self.value_counts[j]

    def segment_units(self, j: int) -> IntArray:
        """Length of each distinct value's segment ``f"{column}: {value}\\n"`` in column ``j``."""
        return self.lengths[j].astype(np.int64) + self.labels[j]


def _sorted_codes(coded: Coded) -> tuple[Sequence[str], Codes]:
    """A column's distinct values sorted, and each row's code into them.

    Built from the table's own factorization (first seen first): only the
    distinct values are sorted; the codes are renumbered in one take. Values
    held in Arrow (:class:`~semframe.core.table.ArrowValues`) are sorted
    there, and stay there.
    """
    values, codes = coded
    if isinstance(values, ArrowValues):
        by_value = _arrow_order(values)
        sorted_values: Sequence[str] = values.view(by_value)
    else:
        order = sorted(range(len(values)), key=values.__getitem__)
        by_value = np.asarray(order, dtype=np.int64)
        sorted_values = tuple(map(values.__getitem__, order))
    rank = np.empty(len(values), dtype=code_dtype(len(values)))
    rank[by_value] = np.arange(len(values), dtype=rank.dtype)
    return sorted_values, rank[codes]


def _arrow_order(values: ArrowValues) -> IntArray:
    """The positions of distinct ``values`` in the order of their text (Python's order).

    Arrow sorts the strings by their UTF-8 bytes, which is the order of their
    code points, as Python compares strings. The whole source is sorted (no
    value is copied) and the rows of the values are picked out of it.
    """
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    rows = np.asarray(pc.sort_indices(values.source).to_numpy(), dtype=np.int64)
    if values.at is None:
        return rows
    position = np.full(len(values.source), -1, dtype=np.int64)
    position[values.at] = np.arange(values.at.size, dtype=np.int64)
    picked = position[rows]
    return picked[picked >= 0]


_STEP = 1 << 16
"""Entries at a time where a loop over a sort key only bounds a temporary."""


def pack_positions(key: IntArray, size: int) -> None:
    """``key * size + position`` in place: sorting it then sorts by key, ties by position.

    The positions are added a chunk at a time (no second array of an entry each).

    Examples
    --------
    >>> key = np.array([2, 0, 2])
    >>> pack_positions(key, 3)
    >>> key.tolist()
    [6, 1, 8]
    """
    key *= size
    n = key.size
    for lo in range(0, n, _STEP):
        key[lo : lo + _STEP] += np.arange(lo, min(lo + _STEP, n))


def run_changes(values: IntArray, size: int) -> NDArray[np.bool_]:
    """Where ``values // size`` changes in the sorted ``values`` (the first entry included).

    Compared a chunk at a time: no whole array of the quotients.

    Examples
    --------
    >>> run_changes(np.array([3, 4, 9, 10, 11, 30]), 10).tolist()
    [True, False, False, True, False, True]
    """
    n = values.size
    new = np.empty(n, dtype=bool)
    new[:1] = True
    for lo in range(1, n, _STEP):
        hi = min(lo + _STEP, n)
        group = values[lo - 1 : hi] // size
        np.not_equal(group[1:], group[:-1], out=new[lo:hi])
    return new


def _measure(values: Sequence[str], tokenizer: Tokenizer | None) -> IntArray:
    if tokenizer is None:
        return char_lengths(values)
    out = np.fromiter(map(tokenizer, values), dtype=np.int64, count=len(values))
    if out.size and int(out.min()) < 0:
        msg = "tokenizer returned a negative token count; it must return an int >= 0."
        raise InputError(msg)
    return out


def encode(table: Table, tokenizer: Tokenizer | None = None) -> Encoded:
    """Factorize every column of ``table`` and measure its distinct values.

    Examples
    --------
    >>> e = encode(Table.from_columns({"a": ["y", "x", "y"], "b": ["1", "1", "22"]}))
    >>> [c.tolist() for c in e.codes], e.values, [x.tolist() for x in e.lengths]
    ([[1, 0, 1], [0, 0, 1]], (('x', 'y'), ('1', '22')), [[1, 1], [1, 2]])
    """
    n = table.n_rows
    columns = tuple(table.columns)
    codes: list[Codes] = []
    values: list[Sequence[str]] = []
    lengths: list[IntArray] = []
    for col in columns:
        coded = table.coded(col)
        if len(coded[1]) != n:
            msg = f"column {col!r} has {len(coded[1])} cells but the table has {n} rows."
            raise InputError(msg)
        uniq, column = _sorted_codes(coded)
        codes.append(column)
        values.append(uniq)
        lengths.append(_measure(uniq, tokenizer))
    labels = tuple(len(c) + 3 if tokenizer is None else int(tokenizer(f"{c}: \n")) for c in columns)
    return Encoded(columns, n, tuple(codes), tuple(values), tuple(lengths), labels)


def to_table(frame: object, columns: Sequence[str] | None = None) -> Table:
    """Convert ``frame`` (a Table, pandas or Polars frame, or mapping) to a Table.

    Unknown column names raise :class:`~semframe.errors.ColumnError` naming the
    available columns.
    """
    if columns is not None:
        columns = list(columns)
        if len(set(columns)) != len(columns):
            msg = f"columns {columns!r} name a column more than once."
            raise InputError(msg)
        available = _column_names(frame)
        if available is not None:
            unknown = [c for c in columns if c not in available]
            if unknown:
                msg = (
                    f"unknown column(s) {format_choices(unknown)}; "
                    f"available: {format_choices(available)}."
                )
                raise ColumnError(msg)
    return as_table(frame, columns)


def _column_names(frame: object) -> list[str] | None:
    if isinstance(frame, Table):
        return list(frame.columns)
    names = getattr(frame, "columns", None)
    if names is not None:
        return [str(c) for c in names]
    if isinstance(frame, Mapping):
        return [str(c) for c in frame]
    return None


def table_for(frame: object, ordering: Ordering) -> Table:
    """The columns of ``frame`` that ``ordering`` orders, checked against it.

    Raises
    ------
    SemframeError
        If ``ordering`` is not a valid ordering of the frame's rows and of
        the columns it names.
    """
    wanted: tuple[str, ...] = ordering.fields[0] if len(ordering) else ()
    if not wanted:
        # No columns to read: convert the frame only to learn its row count.
        full = to_table(frame)
        table = full.select(())
    else:
        available = _column_names(frame)
        if available is not None:
            position = {c: i for i, c in enumerate(available)}
            wanted = tuple(sorted(wanted, key=lambda c: position.get(c, len(position))))
        table = to_table(frame, wanted)
    ordering.validate(table.n_rows, table.columns)
    return table
