"""Reordering of relQueries: which row runs when, and in which field order.

``order(table, method)`` is the seam the planner calls. Methods:

- ``"none"``: the caller's row order and the template's field order;
- ``"stats"``: one field order for all rows from table statistics (fields whose
  values repeat most, weighted by length, first) and a lexicographic row sort.
"""

from __future__ import annotations

from semframe.errors import ConfigError, format_choices
from semframe.ordering import Ordering
from semframe.table import Table

METHODS = ("none", "stats")


def order(table: Table, method: str = "none") -> Ordering:
    """Order the rows and fields of ``table`` with ``method``.

    Examples
    --------
    >>> t = Table.from_columns({"a": ["x", "y", "x"], "b": ["1", "2", "3"]})
    >>> order(t, "none").rows
    (0, 1, 2)
    """
    if method == "none":
        return Ordering.identity(table.n_rows, table.columns)
    if method == "stats":
        return _stats_order(table)
    msg = f"unknown reorder method {method!r}; valid: {format_choices(METHODS)}."
    raise ConfigError(msg)


def _stats_order(table: Table) -> Ordering:
    def score(col: str) -> float:
        values = table.cells[col]
        distinct = len(set(values))
        avg_len = sum(map(len, values)) / max(len(values), 1)
        return avg_len * avg_len * (len(values) - distinct)

    fields = tuple(sorted(table.columns, key=lambda c: (-score(c), table.columns.index(c))))
    keys = list(zip(*(table.cells[c] for c in fields), strict=True))
    rows = tuple(sorted(range(table.n_rows), key=keys.__getitem__)) if fields else tuple(
        range(table.n_rows)
    )
    return Ordering(rows, (fields,) * table.n_rows)
