"""How good an ordering is: prefix hit count, cache hit rates, the upper bound.

A prompt is modeled as the sequence of its labeled segments
``f"{column}: {value}\\n"`` in the row's field order (the shared instruction
block in front of every prompt is left out: it hits in every order). Cells are
compared as ``(column, value)`` pairs, so two prompts share a segment only when
the same field with the same value sits at the same position.

- :func:`phc` is the paper's prefix hit count (eq. 1-2): for each executed row,
  the sum of ``len(value) ** 2`` over its leading cells equal to the previous
  executed row's cells at the same positions.
- :func:`hit_rate` is the share of prompt characters (or tokens) that a prefix
  cache would serve: holding only the previous prompt (``cache="previous"``)
  or every earlier prompt (``cache="unbounded"``).
- :func:`upper_bound` is ``sum(len(v) ** 2 * (count(v) - 1))`` over every
  ``(column, value)``: no ordering can exceed it, since every occurrence of a
  value but the first can hit at most once.

All of them work on integer codes with numpy, with no Python loop over cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from semframe.core.ordering import Ordering
from semframe.errors import ConfigError, InputError, format_choices
from semframe.reorder._encode import Encoded, IntArray, Tokenizer, encode, table_for, to_table

Cache = Literal["previous", "unbounded"]
CACHES: tuple[str, ...] = ("previous", "unbounded")

_INT64_SAFE = 2**62


@dataclass(frozen=True, slots=True)
class OrderScore:
    """The quality of one ordering of one table.

    Attributes
    ----------
    phc : int
        Prefix hit count (the paper's eq. 1-2).
    upper_bound : int
        The most any ordering of the table can reach (:func:`upper_bound`).
    hit_rate : float
        Share of prompt characters (or tokens) served by a cache holding the
        previous prompt.
    hit_rate_unbounded : float
        Share served by a cache holding every earlier prompt.
    prompt_units : int
        Characters (or tokens) of all prompts' field segments.

    Examples
    --------
    >>> from semframe.core.table import Table
    >>> t = Table.from_columns({"movie": ["Alien", "Alien"], "review": ["ok", "meh"]})
    >>> s = evaluate(t, Ordering.identity(2, ("movie", "review")))
    >>> s.phc, s.upper_bound, s.prompt_units  # 'movie: Alien' (13 of 49 chars) hits
    (25, 25, 49)
    >>> round(s.hit_rate, 4), round(s.hit_rate_unbounded, 4)
    (0.2653, 0.2653)
    """

    phc: int
    upper_bound: int
    hit_rate: float
    hit_rate_unbounded: float
    prompt_units: int

    @property
    def phc_ratio(self) -> float:
        """``phc / upper_bound`` (1.0 when the bound is 0)."""
        return self.phc / self.upper_bound if self.upper_bound else 1.0


def _offsets(enc: Encoded) -> IntArray:
    cards = np.fromiter((len(v) for v in enc.values), dtype=np.int64, count=enc.n_columns)
    return np.concatenate(([0], np.cumsum(cards)[:-1])).astype(np.int64) if cards.size else cards


def _global_codes(enc: Encoded) -> tuple[IntArray, int]:
    """Codes made unique across columns: ``(codes + offsets, number of codes)``."""
    off = _offsets(enc)
    total = int(sum(len(v) for v in enc.values))
    return (enc.codes + off[:, None]).astype(np.int64), total


def _execution_codes(enc: Encoded, ordering: Ordering) -> IntArray:
    """``S[p, j]``: global code of the cell at position ``j`` of the ``p``-th prompt."""
    n, m = len(ordering.rows), enc.n_columns
    if n == 0 or m == 0:
        return np.zeros((n, m), dtype=np.int64)
    col_index = {c: j for j, c in enumerate(enc.columns)}
    perm_ids: dict[tuple[str, ...], int] = {}
    ids = np.fromiter(
        (perm_ids.setdefault(f, len(perm_ids)) for f in ordering.fields), dtype=np.int64, count=n
    )
    perms = np.array([[col_index[c] for c in f] for f in perm_ids], dtype=np.int64)
    g, _ = _global_codes(enc)
    rows = np.asarray(ordering.rows, dtype=np.int64)
    return g[perms[ids], rows[:, None]]


def _weighted_sum(weights: IntArray, counts: IntArray) -> int:
    """Exact ``sum(weights * counts)`` (Python ints when int64 could overflow)."""
    if weights.size == 0:
        return 0
    top = int(weights.max(initial=0)) * int(counts.sum())
    if top < _INT64_SAFE:
        return int(np.dot(weights, counts))
    nz = np.flatnonzero(counts)
    return sum(int(weights[i]) * int(counts[i]) for i in nz)


def _squared(enc: Encoded) -> IntArray:
    if not enc.lengths:
        return np.zeros(0, dtype=np.int64)
    lengths = np.concatenate(enc.lengths).astype(np.int64)
    if lengths.size and int(lengths.max()) >= 2**31:
        msg = "a cell is longer than 2**31 characters or tokens; cannot score it."
        raise InputError(msg)
    return lengths * lengths


def _prev_hits(s: IntArray) -> IntArray:
    """Boolean mask (as int): cell (p, j) equals the previous prompt's cell, for all j' <= j."""
    hits = np.zeros(s.shape, dtype=bool)
    if s.shape[0] > 1 and s.shape[1] > 0:
        hits[1:] = np.logical_and.accumulate(s[1:] == s[:-1], axis=1)
    return hits.astype(np.int64)


def _unbounded_hits(s: IntArray, n_codes: int) -> IntArray:
    """Cell (p, j) hits when prompt p's first j+1 cells equal an earlier prompt's."""
    n, m = s.shape
    hits = np.zeros((n, m), dtype=np.int64)
    if n < 2 or m == 0:
        return hits
    position = np.arange(n)
    prev = np.zeros(n, dtype=np.int64)
    for j in range(m):
        # ids number the distinct prefixes of length j + 1.
        _, ids = np.unique(prev * max(n_codes, 1) + s[:, j], return_inverse=True)
        _, first = np.unique(ids, return_index=True)
        hits[:, j] = first[ids] < position
        prev = ids.astype(np.int64).reshape(n)
    return hits


def _score_counts(s: IntArray, hits: IntArray, n_codes: int) -> IntArray:
    """How often each global code is a hit."""
    return np.bincount(s[hits.astype(bool)], minlength=n_codes).astype(np.int64)


def served_units(segments: IntArray, units: IntArray) -> int:
    """Units a cache holding the previous prompt serves, prompts given as segment codes.

    ``segments[p, j]`` is the global code of prompt ``p``'s ``j``-th segment
    (execution order) and ``units[code]`` that segment's length.

    Examples
    --------
    >>> s = np.array([[0, 2], [0, 3], [1, 3]])
    >>> served_units(s, np.array([5, 5, 4, 4]))  # prompt 1 hits its first segment
    5
    """
    return _weighted_sum(units, _score_counts(segments, _prev_hits(segments), units.size))


def _segment_units(enc: Encoded, tokenizer: Tokenizer | None) -> IntArray:
    """Characters (or tokens) of each ``f"{column}: {value}\\n"`` segment, by global code."""
    parts: list[IntArray] = []
    for j, col in enumerate(enc.columns):
        if tokenizer is None:
            parts.append(np.fromiter((len(v) for v in enc.values[j]), np.int64) + len(col) + 3)
        else:
            parts.append(np.fromiter((tokenizer(f"{col}: {v}\n") for v in enc.values[j]), np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _check_cache(cache: str) -> None:
    if cache not in CACHES:
        msg = f"unknown cache model {cache!r}; valid: {format_choices(CACHES)}."
        raise ConfigError(msg)


def phc(frame: object, ordering: Ordering, *, tokenizer: Tokenizer | None = None) -> int:
    """Prefix hit count of ``ordering`` over ``frame`` (eq. 1-2 of the GGR paper).

    Parameters
    ----------
    frame : Table, pandas or Polars DataFrame, or mapping of columns
        The table; only the columns ``ordering`` names are read.
    ordering : Ordering
        Execution order of rows and per-row field order.
    tokenizer : callable, optional
        Token count of a string; lengths are characters when ``None``.

    Returns
    -------
    int
        For each executed row, the sum of squared lengths of its leading cells
        equal (as ``(column, value)``) to the previous executed row's cells at
        the same positions.

    Examples
    --------
    >>> from semframe.core.table import Table
    >>> t = Table.from_columns({"id": ["1", "2", "3"], "tag": ["ab", "ab", "ab"]})
    >>> phc(t, Ordering.identity(3, ("id", "tag")))
    0
    >>> phc(t, Ordering.identity(3, ("tag", "id")))
    8
    """
    enc = encode(table_for(frame, ordering), tokenizer)
    s = _execution_codes(enc, ordering)
    _, n_codes = _global_codes(enc)
    return _weighted_sum(_squared(enc), _score_counts(s, _prev_hits(s), n_codes))


def hit_rate(
    frame: object,
    ordering: Ordering,
    *,
    tokenizer: Tokenizer | None = None,
    cache: Cache = "previous",
) -> float:
    """Share of prompt characters (or tokens) a prefix cache would serve.

    Prompts are the rows' labeled segments ``f"{column}: {value}\\n"`` in each
    row's field order. A segment is served from the cache when it and every
    earlier segment of its prompt equal the segments at the same positions of
    the previous prompt (``cache="previous"``) or of some earlier prompt
    (``cache="unbounded"``).

    Parameters
    ----------
    frame : Table, pandas or Polars DataFrame, or mapping of columns
        The table; only the columns ``ordering`` names are read.
    ordering : Ordering
        Execution order of rows and per-row field order.
    tokenizer : callable, optional
        Token count of a string; segments are counted in characters when
        ``None``, else as ``tokenizer(segment)`` (a segment-by-segment
        approximation of the prompt's token count).
    cache : {"previous", "unbounded"}
        What the cache holds.

    Returns
    -------
    float
        In ``[0, 1]``; 0 for an empty table.

    Examples
    --------
    >>> from semframe.core.table import Table
    >>> t = Table.from_columns({"k": ["a", "b", "a"], "v": ["x", "y", "z"]})
    >>> o = Ordering.identity(3, ("k", "v"))
    >>> hit_rate(t, o), hit_rate(t, o, cache="unbounded")  # 'k: a' is 5 of 30 chars
    (0.0, 0.16666666666666666)
    """
    _check_cache(cache)
    enc = encode(table_for(frame, ordering), None)
    s = _execution_codes(enc, ordering)
    _, n_codes = _global_codes(enc)
    units = _segment_units(enc, tokenizer)
    hits = _prev_hits(s) if cache == "previous" else _unbounded_hits(s, n_codes)
    total = _weighted_sum(units, np.bincount(s.ravel(), minlength=n_codes).astype(np.int64))
    if total == 0:
        return 0.0
    return _weighted_sum(units, _score_counts(s, hits, n_codes)) / total


def upper_bound(
    frame: object, columns: list[str] | None = None, *, tokenizer: Tokenizer | None = None
) -> int:
    """The largest PHC any ordering of ``frame`` could reach.

    Every occurrence of a ``(column, value)`` but the first can hit at most
    once, so the bound is ``sum(len(v) ** 2 * (count(v) - 1))``. It is reached
    when, for example, one column determines all others.

    Examples
    --------
    >>> upper_bound({"a": ["xy", "xy", "z"], "b": ["1", "2", "3"]})
    4
    """
    enc = encode(to_table(frame, columns), tokenizer)
    return _upper_bound(enc)


def _upper_bound(enc: Encoded) -> int:
    if enc.n_rows == 0 or enc.n_columns == 0:
        return 0
    g, n_codes = _global_codes(enc)
    counts = np.bincount(g.ravel(), minlength=n_codes).astype(np.int64) - 1
    return _weighted_sum(_squared(enc), np.maximum(counts, 0))


def evaluate(
    frame: object, ordering: Ordering, *, tokenizer: Tokenizer | None = None
) -> OrderScore:
    """All quality measures of ``ordering`` at once (one encoding of the table).

    ``phc`` and ``upper_bound`` use value lengths, the hit rates segment
    lengths, in characters or, given ``tokenizer``, in tokens.
    """
    table = table_for(frame, ordering)
    enc = encode(table, tokenizer)
    s = _execution_codes(enc, ordering)
    _, n_codes = _global_codes(enc)
    prev = _prev_hits(s)
    units = _segment_units(enc, tokenizer)
    total = _weighted_sum(units, np.bincount(s.ravel(), minlength=n_codes).astype(np.int64))
    served_prev = _weighted_sum(units, _score_counts(s, prev, n_codes))
    served_all = _weighted_sum(units, _score_counts(s, _unbounded_hits(s, n_codes), n_codes))
    return OrderScore(
        phc=_weighted_sum(_squared(enc), _score_counts(s, prev, n_codes)),
        upper_bound=_upper_bound(enc),
        hit_rate=served_prev / total if total else 0.0,
        hit_rate_unbounded=served_all / total if total else 0.0,
        prompt_units=total,
    )
