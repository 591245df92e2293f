"""Orderings: which row runs when, and in which field order.

An :class:`Ordering` is the only place where the execution order of a relQuery
and its inverse live. Reordering algorithms (``semframe.reorder``) produce one;
the planner renders prompts in its order; :meth:`Ordering.restore` puts the
results back in the caller's order.

An ordering is held as arrays, not as a Python object per row: the rows in
execution order, the distinct field orders, and for each executed row the
number of its field order (a byte while there are fewer than 128).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, TypeVar, overload

import numpy as np

from semframe.core.table import Codes, code_dtype
from semframe.errors import SemframeError

T = TypeVar("T")

_STEP = 1 << 16
"""Rows converted to Python objects at a time when iterating (no list of every row)."""


class FieldOrders(Sequence[tuple[str, ...]]):
    """Each executed row's field order, as a read-only sequence over two arrays.

    ``orders[i]`` is the field order of the ``i``-th executed row: the distinct
    orders are stored once, and each row holds the number of its own.

    Examples
    --------
    >>> o = Ordering(rows=(1, 0), fields=(("a", "b"), ("b", "a")))
    >>> o.fields[1], len(o.fields), list(o.fields) == [("a", "b"), ("b", "a")]
    (('b', 'a'), 2, True)
    """

    __slots__ = ("_distinct", "_ids")

    def __init__(self, distinct: tuple[tuple[str, ...], ...], ids: Codes) -> None:
        self._distinct = distinct
        self._ids = ids

    def __len__(self) -> int:
        return int(self._ids.size)

    @overload
    def __getitem__(self, i: int) -> tuple[str, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[tuple[str, ...], ...]: ...

    def __getitem__(self, i: int | slice) -> tuple[str, ...] | tuple[tuple[str, ...], ...]:
        if isinstance(i, slice):
            return tuple(map(self._distinct.__getitem__, self._ids[i].tolist()))
        return self._distinct[int(self._ids[i])]

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        distinct, ids = self._distinct, self._ids
        return chain.from_iterable(
            map(distinct.__getitem__, ids[i : i + _STEP].tolist())
            for i in range(0, ids.size, _STEP)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # compared by value, like a list

    def __repr__(self) -> str:
        return f"FieldOrders({tuple(self)!r})"


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class Ordering:
    """Execution order of a relQuery's rows and of each row's fields.

    A frozen value held as arrays (see the module docstring), so a
    million-row ordering takes a few megabytes, not a Python tuple per row.

    Parameters
    ----------
    rows : sequence of int
        Positions into the input table, in execution order (a permutation of
        ``range(n)``).
    fields : sequence of tuple of str
        For each executed row (aligned with ``rows``), the order in which its
        fields are rendered: a permutation of the relQuery's fields.

    Attributes
    ----------
    rows : ndarray of int
        The rows in execution order (read-only).
    fields : FieldOrders
        Each executed row's field order (a read-only sequence).
    orders : tuple of tuple of str
        The distinct field orders.
    order_of : ndarray of int
        For each executed row, the number of its field order in ``orders``
        (read-only).

    Examples
    --------
    >>> o = Ordering(rows=(2, 0, 1), fields=(("a", "b"), ("b", "a"), ("a", "b")))
    >>> o.restore(["third", "first", "second"])
    ['first', 'second', 'third']
    >>> o.rows.tolist(), o.orders, o.order_of.tolist()
    ([2, 0, 1], (('a', 'b'), ('b', 'a')), [0, 1, 0])
    """

    rows: Codes
    orders: tuple[tuple[str, ...], ...]
    order_of: Codes
    _fields: FieldOrders = field(compare=False)

    def __init__(self, rows: Sequence[int], fields: Sequence[tuple[str, ...]]) -> None:
        if len(rows) != len(fields):
            msg = (
                f"Ordering.rows has {len(rows)} entries but Ordering.fields has "
                f"{len(fields)}; they must be aligned (one field order per executed row)."
            )
            raise SemframeError(msg)
        if isinstance(fields, FieldOrders):
            distinct, ids = fields._distinct, fields._ids
        else:
            number: dict[tuple[str, ...], int] = {}
            found = [number.setdefault(tuple(f), len(number)) for f in fields]
            distinct = tuple(number)
            ids = np.asarray(found, dtype=code_dtype(len(distinct)))
        self._set(_as_rows(rows, copy=True), distinct, ids)

    def _set(self, rows: Codes, orders: tuple[tuple[str, ...], ...], order_of: Codes) -> None:
        rows.flags.writeable = False
        order_of.flags.writeable = False
        object.__setattr__(self, "rows", rows)  # frozen: set once, here
        object.__setattr__(self, "orders", orders)
        object.__setattr__(self, "order_of", order_of)
        object.__setattr__(self, "_fields", FieldOrders(orders, order_of))

    @classmethod
    def from_arrays(
        cls, rows: Codes, orders: Sequence[tuple[str, ...]], order_of: Codes
    ) -> Ordering:
        """An ordering from its arrays, without a Python object per row.

        The arrays are taken, not copied, where their types already fit (4- or
        8-byte rows, the narrowest type for the order numbers), and become
        read-only.

        Parameters
        ----------
        rows : ndarray of int
            The rows in execution order.
        orders : sequence of tuple of str
            The distinct field orders.
        order_of : ndarray of int
            For each executed row, the number of its field order in ``orders``.

        Examples
        --------
        >>> o = Ordering.from_arrays(np.array([1, 0]), [("x",)], np.zeros(2, dtype=np.int8))
        >>> o == Ordering((1, 0), (("x",), ("x",)))
        True
        """
        distinct = tuple(tuple(f) for f in orders)
        rows_at, ids = np.asarray(rows), np.asarray(order_of)
        if rows_at.ndim != 1 or ids.shape != rows_at.shape:
            msg = (
                f"Ordering.from_arrays: rows (shape {rows_at.shape}) and order_of (shape "
                f"{ids.shape}) must be one-dimensional and aligned."
            )
            raise SemframeError(msg)
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= len(distinct)):
            msg = f"Ordering.from_arrays: order_of must number one of the {len(distinct)} orders."
            raise SemframeError(msg)
        if len(set(distinct)) < len(distinct):  # one number per distinct order
            number: dict[tuple[str, ...], int] = {}
            remap = np.array([number.setdefault(f, len(number)) for f in distinct], np.int64)
            distinct, ids = tuple(number), remap[ids]
        width = code_dtype(len(distinct))
        out = cls.__new__(cls)
        out._set(_as_rows(rows_at, copy=False), distinct, ids.astype(width, copy=False))
        return out

    @property
    def fields(self) -> FieldOrders:
        """Each executed row's field order."""
        return self._fields

    def __len__(self) -> int:
        return int(self.rows.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ordering):
            return NotImplemented
        if not np.array_equal(self.rows, other.rows):
            return False
        if self.orders == other.orders:
            return bool(np.array_equal(self.order_of, other.order_of))
        number: dict[tuple[str, ...], int] = {}
        mine = np.array([number.setdefault(f, len(number)) for f in self.orders], np.int64)
        theirs = np.array([number.setdefault(f, len(number)) for f in other.orders], np.int64)
        mine_of = mine[self.order_of] if mine.size else self.order_of
        theirs_of = theirs[other.order_of] if theirs.size else other.order_of
        return bool(np.array_equal(mine_of, theirs_of))

    def __hash__(self) -> int:
        return hash((self.rows.astype(np.int64).tobytes(), tuple(self.fields)))

    def __repr__(self) -> str:
        n = len(self)
        if n <= 8:
            return f"Ordering(rows={tuple(self.rows.tolist())!r}, fields={tuple(self.fields)!r})"
        head = ", ".join(map(str, self.rows[:4].tolist()))
        return f"Ordering(rows=({head}, ...), {n:,} rows, {len(self.orders)} distinct field orders)"

    def __reduce__(self) -> tuple[Any, ...]:
        arrays = np.asarray(self.rows), self.orders, np.asarray(self.order_of)
        return (Ordering.from_arrays, arrays)

    @classmethod
    def identity(cls, n_rows: int, fields: Sequence[str]) -> Ordering:
        """The input order, with the same field order for every row.

        Examples
        --------
        >>> Ordering.identity(2, ["x", "y"])
        Ordering(rows=(0, 1), fields=(('x', 'y'), ('x', 'y')))
        """
        return cls.uniform(np.arange(n_rows, dtype=np.int64), fields)

    @classmethod
    def uniform(cls, rows: Sequence[int] | Codes, fields: Sequence[str]) -> Ordering:
        """``rows`` in the order given, each with the same field order ``fields``.

        Examples
        --------
        >>> Ordering.uniform([1, 0], ["x"])
        Ordering(rows=(1, 0), fields=(('x',), ('x',)))
        """
        at = _as_rows(rows, copy=True)
        return cls.from_arrays(at, (tuple(fields),), np.zeros(at.size, dtype=np.int8))

    def subset(self, positions: Sequence[int] | Codes) -> Ordering:
        """Executed rows ``positions`` as an ordering of a table of their own.

        Row ``i`` of the result is the executed row ``positions[i]`` (of a table
        holding just those rows, in that order), with its field order.

        Examples
        --------
        >>> o = Ordering(rows=(2, 0, 1), fields=(("a", "b"), ("b", "a"), ("a", "b")))
        >>> o.subset([1, 2])
        Ordering(rows=(0, 1), fields=(('b', 'a'), ('a', 'b')))
        """
        at = np.asarray(positions, dtype=np.int64)
        return Ordering.from_arrays(
            np.arange(at.size, dtype=np.int64), self.orders, self.order_of[at]
        )

    def inverse(self) -> Codes:
        """For each input row, its position in execution order.

        Examples
        --------
        >>> Ordering(rows=(2, 0, 1), fields=((),) * 3).inverse().tolist()
        [1, 2, 0]
        """
        n = len(self)
        inv = np.full(n, -1, dtype=np.int64)
        inv[self.rows] = np.arange(n, dtype=np.int64)
        return inv

    def restore(self, values: Sequence[T]) -> list[T]:
        """Put per-execution values (aligned with ``rows``) back into input order.

        Parameters
        ----------
        values : sequence
            ``values[i]`` belongs to the executed row ``rows[i]``.

        Returns
        -------
        list
            ``out[r]`` is the value of input row ``r``.
        """
        if len(values) != len(self):
            msg = f"restore() got {len(values)} values for an ordering of {len(self)} rows."
            raise SemframeError(msg)
        inverse = self.inverse().tolist()
        if len(inverse) < 2:  # itemgetter returns one item bare, and needs at least one
            return [values[i] for i in inverse]
        return list(operator.itemgetter(*inverse)(values))

    def validate(self, n_rows: int, fields: Sequence[str]) -> None:
        """Check that this ordering is a valid plan for ``n_rows`` rows of ``fields``.

        Raises
        ------
        SemframeError
            If ``rows`` is not a permutation of ``range(n_rows)`` or a field
            order is not a permutation of ``fields``.
        """
        if len(self) != n_rows or not _is_permutation(self.rows):
            msg = f"Ordering.rows is not a permutation of range({n_rows})."
            raise SemframeError(msg)
        want = sorted(fields)
        used = np.bincount(self.order_of, minlength=len(self.orders)) if n_rows else ()
        for f, count in zip(self.orders, used, strict=False):  # the orders some row takes
            if count and sorted(f) != want:
                msg = f"Ordering field order {f!r} is not a permutation of {tuple(fields)!r}."
                raise SemframeError(msg)


def _as_rows(rows: Sequence[int] | Codes, *, copy: bool) -> Codes:
    """``rows`` as a one-dimensional integer array (4 bytes where they fit).

    With ``copy``, the result never shares memory with ``rows``.

    Examples
    --------
    >>> _as_rows((2, 0, 1), copy=True).dtype.name, _as_rows((), copy=True).dtype.name
    ('int32', 'int32')
    """
    at = np.asarray(rows)
    if at.size == 0:
        return np.zeros(0, dtype=np.int32)
    if at.ndim != 1 or at.dtype.kind not in "iu":
        msg = f"Ordering.rows must be integers (one per executed row), not {at.dtype} values."
        raise SemframeError(msg)
    if at.dtype in (np.int32, np.int64) and not copy:
        return at
    small = at.size < 2**31 and int(at.min()) >= -(2**31) and int(at.max()) < 2**31
    return at.astype(np.int32 if small else np.int64, copy=copy)


def _is_permutation(rows: Codes) -> bool:
    """Whether ``rows`` holds each of ``0 .. len(rows) - 1`` exactly once (counted in numpy).

    Examples
    --------
    >>> _is_permutation(np.array([2, 0, 1])), _is_permutation(np.array([0, 0, 2]))
    (True, False)
    >>> _is_permutation(np.array([0, 3])), _is_permutation(np.zeros(0, dtype=np.int32))
    (False, True)
    """
    n = rows.size
    if n == 0:
        return True
    if int(rows.min()) < 0 or int(rows.max()) >= n:
        return False
    return bool((np.bincount(rows, minlength=n) == 1).all())
