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
- :func:`served_tokens` counts what a cache serves in its own units: each
  prompt's shared prefix rounded down to the cache's :class:`Granularity`
  (whole KV blocks, OpenAI's 1,024-token minimum and 128-token steps), so a
  shared prefix that falls short of a block or a step counts nothing.

All of them work on integer codes with numpy, with no Python loop over cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from semframe.core.ordering import Ordering
from semframe.errors import ConfigError, InputError, format_choices
from semframe.reorder._encode import Encoded, IntArray, Tokenizer, encode, table_for, to_table

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]

Cache = Literal["previous", "unbounded"]
CACHES: tuple[str, ...] = ("previous", "unbounded")

_INT64_SAFE = 2**62

_CHUNK = 1 << 14
"""Prompts scored at a time by :func:`served_units`."""


@dataclass(frozen=True, slots=True)
class Granularity:
    """The units in which a prompt cache serves a prefix, in tokens.

    A prompt whose prefix of ``shared`` tokens is in the cache is served
    ``minimum + k * step`` tokens, the most that fits in ``shared`` (``0``
    below ``minimum``): whole KV blocks on vLLM (``step`` the block size), every
    token on llama.cpp (``step=1``), 1,024 tokens then steps of 128 on OpenAI.
    Each backend's cost model declares its own
    (``semframe.cost.models``: ``CostModel.granularity``).

    Attributes
    ----------
    minimum : int
        Shortest prefix served at all.
    step : int
        Served prefixes grow in steps of this many tokens past ``minimum``.
    breakpoints : int or None
        The cache serves a prefix only up to an explicit breakpoint, at most
        this many per prompt (Anthropic; OpenAI from GPT-5.6); ``None``: any
        prefix. semframe places breakpoints at segment boundaries, where every
        hit of the segment model already ends, so the metrics here round by
        ``minimum`` and ``step`` alone.

    Examples
    --------
    >>> openai = Granularity(minimum=1024, step=128)
    >>> [openai.round(t) for t in (1000, 1024, 1151, 1152)]
    [0, 1024, 1024, 1152]
    >>> Granularity(step=16).round(47)
    32
    """

    minimum: int = 0
    step: int = 1
    breakpoints: int | None = None

    def __post_init__(self) -> None:
        for name, value, low in (("minimum", self.minimum, 0), ("step", self.step, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                msg = f"Granularity.{name} must be an int >= {low}, got {value!r}."
                raise ConfigError(msg)
        bp = self.breakpoints
        if bp is not None and (isinstance(bp, bool) or not isinstance(bp, int) or bp < 1):
            msg = f"Granularity.breakpoints must be an int >= 1 or None, got {bp!r}."
            raise ConfigError(msg)

    @property
    def per_token(self) -> bool:
        """Whether every shared token is served (``minimum`` 0, ``step`` 1)."""
        return self.minimum == 0 and self.step == 1

    def round(self, shared: int) -> int:
        """Tokens served of a shared prefix of ``shared`` tokens."""
        if shared < self.minimum:
            return 0
        return self.minimum + (shared - self.minimum) // self.step * self.step

    def round_all(self, shared: IntArray) -> IntArray:
        """:meth:`round` of every element of ``shared``."""
        shared = np.asarray(shared, dtype=np.int64)
        over = shared - self.minimum
        served = self.minimum + over // self.step * self.step
        return np.where(over >= 0, served, 0).astype(np.int64)


TOKEN = Granularity()
"""Every shared token served: the token-level metric."""


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
    if not enc.codes:
        return np.zeros((0, enc.n_rows), dtype=np.int64), total
    shifted = [c.astype(np.int64) + o for c, o in zip(enc.codes, off.tolist(), strict=True)]
    return np.stack(shifted), total


def _execution_codes(enc: Encoded, ordering: Ordering) -> IntArray:
    """``S[p, j]``: global code of the cell at position ``j`` of the ``p``-th prompt."""
    n, m = len(ordering.rows), enc.n_columns
    if n == 0 or m == 0:
        return np.zeros((n, m), dtype=np.int64)
    col_index = {c: j for j, c in enumerate(enc.columns)}
    perms = np.array([[col_index[c] for c in f] for f in ordering.orders], dtype=np.int64)
    g, _ = _global_codes(enc)
    return g[perms[ordering.order_of], ordering.rows[:, None]]


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


def _prev_hits(s: IntArray) -> BoolArray:
    """Boolean mask: cell (p, j) equals the previous prompt's cell, for all j' <= j."""
    hits = np.zeros(s.shape, dtype=bool)
    if s.shape[0] > 1 and s.shape[1] > 0:
        hits[1:] = np.logical_and.accumulate(s[1:] == s[:-1], axis=1)
    return hits


def _unbounded_hits(s: IntArray, n_codes: int) -> BoolArray:
    """Boolean mask: cell (p, j) hits when prompt p's first j+1 cells equal an earlier prompt's."""
    n, m = s.shape
    hits = np.zeros((n, m), dtype=bool)
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


def _score_counts(s: IntArray, hits: BoolArray, n_codes: int) -> IntArray:
    """How often each global code is a hit."""
    return np.bincount(s[hits], minlength=n_codes).astype(np.int64)


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
    n, m = segments.shape
    if n < 2 or m == 0 or units.size == 0:
        return 0
    # A chunk of prompts at a time: no n x m masks (the caller's n x m codes
    # are the largest thing a reordering holds).
    exact = int(units.max(initial=0)) * _CHUNK * m < _INT64_SAFE
    total = 0
    for lo in range(1, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        hits = _prev_hits(segments[lo - 1 : hi])[1:]  # against the prompt before the chunk
        served = units[segments[lo:hi][hits]]
        total += int(served.sum()) if exact else sum(served.tolist())
    return total


def served_by_prompt(segments: IntArray, units: IntArray) -> IntArray:
    """Units a cache holding the previous prompt serves of each prompt (:func:`served_units`).

    Examples
    --------
    >>> s = np.array([[0, 2], [0, 3], [1, 3]])
    >>> served_by_prompt(s, np.array([5, 5, 4, 4])).tolist()
    [0, 5, 0]
    """
    n, m = segments.shape
    out = np.zeros(n, dtype=np.int64)
    if n < 2 or m == 0 or units.size == 0:
        return out
    for lo in range(1, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        hits = _prev_hits(segments[lo - 1 : hi])[1:]  # against the prompt before the chunk
        out[lo:hi] = np.where(hits, units[segments[lo:hi]], 0).sum(axis=1)
    return out


def shared_prefixes(
    segments: IntArray, units: IntArray, *, cache: Cache = "previous", head: int = 0
) -> IntArray:
    """Each prompt's prefix that is in the cache when it runs, in units.

    ``segments[p, j]`` is the global code of prompt ``p``'s ``j``-th segment
    (execution order), ``units[code]`` its length. Every prompt starts with
    ``head`` units shared by all (the instructions, the chat framing): in the
    cache for every prompt but the first. A segment adds its units when it
    and every earlier segment of its prompt equal those of the previous prompt
    (``cache="previous"``) or of some earlier one (``"unbounded"``).

    Examples
    --------
    >>> s = np.array([[0, 2], [0, 3], [1, 3]])
    >>> shared_prefixes(s, np.array([5, 5, 4, 4]), head=10).tolist()
    [0, 15, 10]
    """
    _check_cache(cache)
    segments = np.asarray(segments)
    n = segments.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    n_codes = int(units.size)
    hits = _prev_hits(segments) if cache == "previous" else _unbounded_hits(segments, n_codes)
    shared: IntArray = np.zeros(n, dtype=np.int64)
    units = np.asarray(units, dtype=np.int64)
    for j in range(segments.shape[1]):  # a column at a time: no n x m array of units
        shared += units[segments[:, j]] * hits[:, j]
    shared += head
    shared[0] = 0
    return shared


def served_tokens(
    segments: IntArray,
    units: IntArray,
    granularity: Granularity = TOKEN,
    *,
    cache: Cache = "previous",
    head: int = 0,
) -> int:
    """Tokens a prefix cache serves, each prompt's shared prefix rounded to ``granularity``.

    Pure: prompts are given as segment codes (``segments[p, j]``, execution
    order) with ``units[code]`` tokens each, and ``head`` tokens in front of
    every prompt (:func:`shared_prefixes`). Each prompt is served
    ``granularity.round(shared)``: a prefix short of the cache's minimum, or
    the part of one past its last whole step or block, counts nothing. With
    :data:`TOKEN` and ``head=0`` it is the token-level count
    (:func:`served_units` for ``cache="previous"``).

    Examples
    --------
    >>> s = np.array([[0, 2], [0, 3], [0, 3]])
    >>> u = np.array([20, 0, 10, 10])
    >>> served_tokens(s, u), served_tokens(s, u, Granularity(step=16))
    (50, 32)
    >>> served_tokens(s, u, Granularity(minimum=1024, step=128), head=1000)
    1024
    """
    shared = shared_prefixes(segments, units, cache=cache, head=head)
    return int(granularity.round_all(shared).sum())


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
    granularity: Granularity | None = None,
    head: int = 0,
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
    granularity : Granularity, optional
        Count each prompt's served prefix rounded down to the cache's
        granularity (:func:`served_tokens`); meant with ``tokenizer``.
    head : int
        Units in front of every prompt (the instructions), counted in the
        prompts and, from the second prompt on, in the shared prefix. With 0
        (default) only the field segments count.

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
    >>> hit_rate(t, o, cache="unbounded", granularity=Granularity(step=4))  # 5 -> 4
    0.13333333333333333
    """
    _check_cache(cache)
    if isinstance(head, bool) or not isinstance(head, int) or head < 0:
        msg = f"head must be an int >= 0, got {head!r}."
        raise ConfigError(msg)
    enc = encode(table_for(frame, ordering), None)
    s = _execution_codes(enc, ordering)
    _, n_codes = _global_codes(enc)
    units = _segment_units(enc, tokenizer)
    if granularity is not None or head:
        total = _weighted_sum(units, np.bincount(s.ravel(), minlength=n_codes).astype(np.int64))
        total += head * len(ordering.rows)
        if total == 0:
            return 0.0
        served = served_tokens(s, units, granularity or TOKEN, cache=cache, head=head)
        return served / total
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
