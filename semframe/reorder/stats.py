"""The statistics baseline: one field order for every row, then a row sort.

A column's score is the most it can contribute to the prefix hit count,
``sum(len(v) ** 2 * (count(v) - 1))`` over its values: it grows with how often
values repeat and how long they are. Fields are ordered by decreasing score
(ties: table order) and rows are sorted lexicographically in that field order,
which puts equal leading values next to each other. GGR falls back to the same
rule where its recursion stops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from semframe.reorder._encode import Encoded, FloatArray, IntArray


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
