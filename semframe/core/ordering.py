"""Orderings: which row runs when, and in which field order.

An :class:`Ordering` is the only place where the execution order of a relQuery
and its inverse live. Reordering algorithms (``semframe.reorder``) produce one;
the planner renders prompts in its order; :meth:`Ordering.restore` puts the
results back in the caller's order.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from semframe.errors import SemframeError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Ordering:
    """Execution order of a relQuery's rows and of each row's fields.

    Attributes
    ----------
    rows : tuple of int
        Positions into the input table, in execution order (a permutation of
        ``range(n)``).
    fields : tuple of tuple of str
        For each executed row (aligned with ``rows``), the order in which its
        fields are rendered: a permutation of the relQuery's fields.

    Examples
    --------
    >>> o = Ordering(rows=(2, 0, 1), fields=(("a", "b"), ("b", "a"), ("a", "b")))
    >>> o.restore(["third", "first", "second"])
    ['first', 'second', 'third']
    """

    rows: tuple[int, ...]
    fields: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.fields):
            msg = (
                f"Ordering.rows has {len(self.rows)} entries but Ordering.fields has "
                f"{len(self.fields)}; they must be aligned (one field order per executed row)."
            )
            raise SemframeError(msg)

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def identity(cls, n_rows: int, fields: Sequence[str]) -> Ordering:
        """The input order, with the same field order for every row.

        Examples
        --------
        >>> Ordering.identity(2, ["x", "y"])
        Ordering(rows=(0, 1), fields=(('x', 'y'), ('x', 'y')))
        """
        f = tuple(fields)
        return cls(rows=tuple(range(n_rows)), fields=(f,) * n_rows)

    def inverse(self) -> tuple[int, ...]:
        """For each input row, its position in execution order.

        Examples
        --------
        >>> Ordering(rows=(2, 0, 1), fields=((),) * 3).inverse()
        (1, 2, 0)
        """
        n = len(self.rows)
        inv = np.full(n, -1, dtype=np.int64)
        inv[np.fromiter(self.rows, dtype=np.int64, count=n)] = np.arange(n, dtype=np.int64)
        return tuple(inv.tolist())

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
        if len(values) != len(self.rows):
            msg = f"restore() got {len(values)} values for an ordering of {len(self.rows)} rows."
            raise SemframeError(msg)
        inverse = self.inverse()
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
        if len(self.rows) != n_rows or not _is_permutation(self.rows):
            msg = f"Ordering.rows is not a permutation of range({n_rows})."
            raise SemframeError(msg)
        want = sorted(fields)
        checked: set[tuple[str, ...]] = set()
        for f in self.fields:
            if f in checked:
                continue
            if sorted(f) != want:
                msg = f"Ordering field order {f!r} is not a permutation of {tuple(fields)!r}."
                raise SemframeError(msg)
            checked.add(f)


def _is_permutation(rows: Sequence[int]) -> bool:
    """Whether ``rows`` holds each of ``0 .. len(rows) - 1`` exactly once (counted in numpy).

    Examples
    --------
    >>> _is_permutation((2, 0, 1)), _is_permutation((0, 0, 2)), _is_permutation((0, 3))
    (True, False, False)
    >>> _is_permutation(()), _is_permutation(("a",)), _is_permutation((0, 1.0))
    (True, False, False)
    """
    n = len(rows)
    if n == 0:
        return True
    at = np.asarray(rows)
    if at.ndim != 1 or at.dtype.kind not in "iu":  # not all integers (floats, strings, ...)
        return False
    if int(at.min()) < 0 or int(at.max()) >= n:
        return False
    return bool((np.bincount(at, minlength=n) == 1).all())
