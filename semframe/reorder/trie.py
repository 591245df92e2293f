"""Depth-first order over the prefix tree of the prompts.

Given each prompt's segments (as integer codes, position by position), the
depth-first order puts every set of prompts that share a prefix next to each
other, at every depth. Two facts make it the last step of a reordering:

- **It is the best row order for the field orders chosen.** A prompt can hit at
  most the longest prefix it shares with *any* earlier prompt (the unbounded
  cache); in depth-first order that prompt is always the one just before it, so
  a cache that holds only the previous prompt serves as much as an unbounded
  one. Which prompts share what does not depend on the row order, so no row
  order serves more.
- **It is what a bounded cache wants.** A prefix's prompts run back to back,
  so a shared prefix is needed only while its subtree runs, and is never needed
  again once the order has left it.

Siblings keep the order in which the solver first emitted them (the solver
puts its best groups first), so the depth-first pass only gathers what the
solver left apart; where nothing is apart it changes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from semframe.core.table import Codes
from semframe.reorder._encode import IntArray, pack_positions, run_changes

_CHUNK = 1 << 16
"""Sorted keys compared at a time in :func:`_extend`."""

_PYTHON_SEGMENTS = 512
"""Up to this many segments the tree is built in plain Python (numpy's per-call
cost dominates there: 7 us against 69 us for 8 prompts of 4 segments)."""


def depth_first(segments: Codes) -> IntArray:
    """Stable depth-first permutation of prompts given as rows of segment codes.

    Parameters
    ----------
    segments : ndarray of int (4 or 8 bytes), shape (n_prompts, n_positions)
        ``segments[p, j]``: the code of prompt ``p``'s ``j``-th segment, in
        execution order. Equal codes are equal segments (codes must differ
        between columns).

    Returns
    -------
    ndarray of int64
        A permutation of ``range(n_prompts)``: prompts sharing a prefix are
        contiguous at every depth; among siblings, and among identical prompts,
        the first-seen comes first.

    Examples
    --------
    The two prompts starting with 7 were apart; now they run back to back, and
    the subtree seen first (7) stays first:

    >>> s = np.array([[7, 1], [8, 2], [7, 3], [8, 2]])
    >>> depth_first(s).tolist()
    [0, 2, 1, 3]
    """
    n, m = segments.shape
    if n < 2 or m == 0:
        return np.arange(n, dtype=np.int64)
    if n * m <= _PYTHON_SEGMENTS:
        return np.array(_depth_first_small(segments.tolist()), dtype=np.int64)
    return _depth_first_arrays(segments)


def _depth_first_arrays(segments: Codes) -> IntArray:
    """:func:`depth_first` in numpy, a depth at a time (for at least two prompts)."""
    n, m = segments.shape
    # A prompt's place is lexicographic in, at each depth, where its prefix of
    # that length first appears. ``rank`` keeps that order over the depths so
    # far as one dense number per prompt (not one array of positions per
    # depth, sorted together at the end); ``prefix`` numbers the distinct
    # prefixes so far densely. Both take 4 bytes a prompt below 2**31 prompts.
    small = np.int32 if n < 2**31 else np.int64
    prefix: Codes = np.zeros(n, dtype=small)
    rank: Codes = np.zeros(n, dtype=small)
    distinct = 1
    for j in range(m):
        ids, first = _extend(prefix, distinct, segments[:, j])
        if first.size == distinct:  # this depth splits no prefix: nothing moves
            del ids, first
            continue
        prefix, distinct = ids, first.size
        del ids
        # The new prefixes ranked by (their parent's rank, where they first
        # appear): positions are below n, so the pair fits one int64 below 2**31
        # prompts, sorted in place; the position names the prefix (``prefix[first]``).
        key = rank[first].astype(np.int64)
        key *= n
        key += first
        del first
        key.sort()
        key %= n
        ranked = np.empty(distinct, dtype=small)
        ranked[prefix[key]] = np.arange(distinct, dtype=small)
        del key
        np.take(ranked, prefix, out=rank)
        del ranked
        if distinct == n:  # every prompt is alone in its subtree from here on
            break
    del prefix
    return np.argsort(rank, kind="stable").astype(np.int64, copy=False)


def _extend(prefix: Codes, distinct: int, column: Codes) -> tuple[Codes, IntArray]:
    """The prefixes ``prefix`` (dense ids below ``distinct``) extended by one more segment.

    Returns each prompt's dense id of its longer prefix (numbered in sorted
    order) and, per new id, the first prompt that has it.

    Examples
    --------
    >>> ids, first = _extend(np.array([0, 0, 1, 0]), 2, np.array([5, 6, 5, 5]))
    >>> ids.tolist(), first.tolist()
    ([0, 1, 2, 0], [0, 1, 2])
    """
    n = prefix.size
    base = int(column.max()) + 1
    if distinct * base >= 2**62:  # the combined key could overflow int64: renumber densely
        column = np.unique(column, return_inverse=True)[1].reshape(n)
        base = int(column.max()) + 1
    key = prefix.astype(np.int64)
    key *= base
    key += column
    out = np.empty(n, dtype=prefix.dtype)
    if distinct * base * n < 2**62:
        # The position packed into the key: sorted in place, no permutation array.
        pack_positions(key, n)
        key.sort()
        new = run_changes(key, n)
        ids = _dense(new, prefix.dtype)
        for lo in range(0, n, _CHUNK):
            out[key[lo : lo + _CHUNK] % n] = ids[lo : lo + _CHUNK]
        del ids
        first: IntArray = key[new]
        del key
        first %= n
        return out, first
    order = np.argsort(key, kind="stable")  # a group's first prompt leads it
    new = np.empty(n, dtype=bool)  # where the sorted keys change
    new[0] = True
    for lo in range(1, n, _CHUNK):  # compared a chunk at a time: no sorted copy of the keys
        hi = min(lo + _CHUNK, n)
        sorted_key = key[order[lo - 1 : hi]]
        np.not_equal(sorted_key[1:], sorted_key[:-1], out=new[lo:hi])
    del key
    out[order] = _dense(new, prefix.dtype)
    return out, order[new]


def _dense(new: np.ndarray[Any, np.dtype[np.bool_]], dtype: np.dtype[Any]) -> Codes:
    """Dense ids from where a sorted sequence changes (``new[0]`` is True)."""
    ids: Codes = np.empty(new.size, dtype=dtype)
    np.cumsum(new, out=ids)
    ids -= 1
    return ids


def _depth_first_small(rows: list[list[int]]) -> list[int]:
    """:func:`depth_first` in plain Python: a tree of dicts, children in first-seen order.

    Examples
    --------
    >>> _depth_first_small([[7, 1], [8, 2], [7, 3], [8, 2]])
    [0, 2, 1, 3]
    """
    root: dict[int | None, Any] = {}
    for p, row in enumerate(rows):
        node = root
        for code in row:
            node = node.setdefault(code, {})
        node.setdefault(None, []).append(p)  # a leaf: the prompts that end here, in order
    out: list[int] = []

    def walk(node: dict[int | None, Any]) -> None:
        for code, child in node.items():
            if code is None:
                out.extend(child)
            else:
                walk(child)

    walk(root)
    return out
