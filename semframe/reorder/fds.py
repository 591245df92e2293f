"""Functional dependencies between single columns, discovered exactly from the data.

Column ``A`` determines column ``B`` (``A -> B``) when every value of ``A`` maps
to one value of ``B``. GGR uses them to credit a group with the columns its
value fixes: picking ``movie_title = "Alien"`` also fixes ``movie_info``, so
both are shared by every row of the group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from semframe.errors import ColumnError, InputError, format_choices
from semframe.reorder._encode import Encoded, IntArray, encode, to_table

FD = tuple[str, str]
"""A functional dependency ``(determinant, dependent)``."""


def fd_pairs(enc: Encoded, columns: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """All exact single-column FDs among ``columns`` (indices), as ``(a, b)`` pairs.

    For each determinant ``a`` the rows are sorted once by ``a``; ``a -> b``
    holds when ``b`` never changes between consecutive rows with equal ``a``.
    """
    cols = list(range(enc.n_columns)) if columns is None else list(columns)
    out: list[tuple[int, int]] = []
    if len(cols) < 2:
        return out
    cards = list(enc.cardinalities)
    for a in cols:
        targets = [b for b in cols if b != a and cards[b] <= cards[a]]
        if not targets:
            continue
        if enc.n_rows < 2:
            out.extend((a, b) for b in targets)
            continue
        perm = np.argsort(enc.codes[a], kind="stable")
        sa = enc.codes[a][perm]
        same = sa[1:] == sa[:-1]
        for b in targets:  # a column at a time: no targets x rows block
            sb = enc.codes[b][perm]
            if not ((sb[1:] != sb[:-1]) & same).any():
                out.append((a, b))
    return out


def dependent_codes(enc: Encoded, a: int, b: int) -> IntArray:
    """For an FD ``a -> b``: the code of ``b`` fixed by each code of ``a``."""
    dep = np.zeros(enc.cardinalities[a], dtype=np.int64)
    dep[enc.codes[a]] = enc.codes[b]
    return dep


def discover_fds(frame: object, columns: Sequence[str] | None = None) -> tuple[FD, ...]:
    """Every exact functional dependency ``A -> B`` between two columns of ``frame``.

    The result is exact for the data at hand (not a sample): it includes the
    trivial ones, from a column whose values are all distinct and into a
    column with a single value.

    Parameters
    ----------
    frame : Table, pandas or Polars DataFrame, or mapping of columns
        The table.
    columns : sequence of str, optional
        Restrict to these columns (all when ``None``).

    Returns
    -------
    tuple of (str, str)
        ``(determinant, dependent)`` pairs, ordered by determinant then
        dependent, in column order.

    Examples
    --------
    >>> discover_fds({"title": ["Alien", "Heat", "Alien"],
    ...               "year": ["1979", "1995", "1979"],
    ...               "review": ["a", "b", "c"]})
    (('title', 'year'), ('year', 'title'), ('review', 'title'), ('review', 'year'))
    """
    enc = encode(to_table(frame, columns))
    return tuple((enc.columns[a], enc.columns[b]) for a, b in fd_pairs(enc))


def check_fds(enc: Encoded, fds: Iterable[Sequence[str]]) -> list[tuple[int, int]]:
    """Resolve given FDs to column indices, checking that each holds on the data.

    Raises
    ------
    ColumnError
        If an FD names a column the table does not have.
    InputError
        If an FD is malformed or does not hold (the message shows a value of
        the determinant with two different dependent values).
    """
    index = {c: j for j, c in enumerate(enc.columns)}
    out: list[tuple[int, int]] = []
    for fd in fds:
        if isinstance(fd, str) or len(fd) != 2:
            msg = f"functional dependency {fd!r} must be a pair (determinant, dependent)."
            raise InputError(msg)
        a_name, b_name = fd
        for name in (a_name, b_name):
            if name not in index:
                msg = (
                    f"functional dependency {tuple(fd)!r} names unknown column {name!r}; "
                    f"available: {format_choices(enc.columns)}."
                )
                raise ColumnError(msg)
        a, b = index[a_name], index[b_name]
        if a == b:
            continue
        if enc.n_rows > 1:
            perm = np.argsort(enc.codes[a], kind="stable")
            sa, sb = enc.codes[a][perm], enc.codes[b][perm]
            bad = np.flatnonzero((sa[1:] == sa[:-1]) & (sb[1:] != sb[:-1]))
            if bad.size:
                i = int(bad[0])
                msg = (
                    f"functional dependency {a_name!r} -> {b_name!r} does not hold: "
                    f"{a_name}={enc.values[a][int(sa[i])]!r} occurs with "
                    f"{b_name}={enc.values[b][int(sb[i])]!r} and "
                    f"{b_name}={enc.values[b][int(sb[i + 1])]!r}."
                )
                raise InputError(msg)
        if (a, b) not in out:
            out.append((a, b))
    return out
