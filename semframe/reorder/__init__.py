"""Reordering of relQueries: which row runs when, and in which field order.

``order(table, method)`` is the seam the planner calls. Methods:

- ``"ggr"`` (the planner's default): Greedy Group Recursion, rows and per-row field
  orders chosen so that consecutive prompts share long prefixes
  (:func:`ggr`);
- ``"stats"``: one field order for all rows from table statistics (fields whose
  values repeat most, weighted by length, first) and a lexicographic row sort;
- ``"none"``: the caller's row order and the template's field order.

Also here: the exact optimum for small tables (:func:`ophr`), the quality
measures (:func:`phc`, :func:`hit_rate`, :func:`upper_bound`,
:func:`evaluate`) and :func:`discover_fds`.
"""

from __future__ import annotations

from semframe.core.ordering import Ordering
from semframe.core.table import Table
from semframe.errors import ConfigError, format_choices
from semframe.reorder._encode import Tokenizer, encode
from semframe.reorder.fds import discover_fds
from semframe.reorder.ggr import Objective, assemble, ggr, ggr_encoded
from semframe.reorder.metrics import (
    Granularity,
    OrderScore,
    evaluate,
    hit_rate,
    phc,
    served_tokens,
    upper_bound,
)
from semframe.reorder.ophr import OPHR_MAX_CELLS, ophr
from semframe.reorder.stats import stats_order

METHODS = ("ggr", "stats", "none")
"""Valid values of ``reorder=``; the first, ``"ggr"``, is the planner's default."""

__all__ = [
    "METHODS",
    "OPHR_MAX_CELLS",
    "Granularity",
    "Objective",
    "OrderScore",
    "Tokenizer",
    "discover_fds",
    "evaluate",
    "ggr",
    "hit_rate",
    "ophr",
    "order",
    "phc",
    "served_tokens",
    "upper_bound",
]


def order(
    table: Table,
    method: str = "none",
    *,
    tokenizer: Tokenizer | None = None,
    objective: Objective | None = None,
) -> Ordering:
    """Order the rows and fields of ``table`` with ``method``.

    Parameters
    ----------
    table : Table
        The rendered cells of the relQuery's fields.
    method : {"ggr", "stats", "none"}
        The reordering method.
    tokenizer : callable, optional
        Token count of a string; lengths are characters when ``None``.
    objective : Objective, optional
        What GGR's choice between its two solves counts: the backend's
        tokens at its cache's granularity (the planner passes the backend's
        own); ``None``: segment units. With its tokenizer (and no
        ``tokenizer``), GGR also solves in those tokens: each value weighs
        what its segment costs the cache. Other methods ignore it.

    Examples
    --------
    >>> t = Table.from_columns({"a": ["x", "y", "x"], "b": ["1", "2", "3"]})
    >>> order(t, "none").rows.tolist()
    [0, 1, 2]
    >>> order(t, "stats").rows.tolist()
    [0, 2, 1]
    >>> o = order(t, "ggr")
    >>> o.rows.tolist(), o.fields[0]
    ([0, 2, 1], ('a', 'b'))
    """
    if method == "none":
        return Ordering.identity(table.n_rows, table.columns)
    if method == "ggr":
        if tokenizer is None and objective is not None and objective.tokenizer is not None:
            # The backend's tokens: on tables of short fields, characters
            # misjudge what a token cache serves.
            return ggr_encoded(encode(table, objective.tokenizer), objective=objective)
        return ggr_encoded(encode(table, tokenizer), objective=objective)
    if method == "stats":
        enc = encode(table, tokenizer)
        if enc.n_columns == 0:
            return Ordering.identity(table.n_rows, ())
        rows, fields = stats_order(enc)
        return assemble(enc, [(rows, fields)])
    msg = f"unknown reorder method {method!r}; valid: {format_choices(METHODS)}."
    raise ConfigError(msg)
