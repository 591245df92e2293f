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

import numpy as np

from semframe.reorder._encode import IntArray


def depth_first(segments: IntArray) -> IntArray:
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
    # A prompt's place is lexicographic in, at each depth, where its prefix of
    # that length first appears. ``rank`` keeps that order over the depths so
    # far as one dense number per prompt (not one array of positions per
    # depth, sorted together at the end).
    prefix = np.zeros(n, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    for j in range(m):
        column = segments[:, j]
        base = int(column.max()) + 1
        if n * base >= 2**62:  # the combined key could overflow int64: renumber densely
            column = np.unique(column, return_inverse=True)[1].reshape(n).astype(np.int64)
            base = int(column.max()) + 1
        # prefix ids number the distinct prefixes of length j + 1; ``first`` is
        # where each first appears.
        _, first, ids = np.unique(prefix * base + column, return_index=True, return_inverse=True)
        prefix = ids.reshape(n)
        place = rank * n  # rank and positions are below n: no overflow below 2**31 prompts
        place += first[prefix]
        rank = np.unique(place, return_inverse=True)[1].reshape(n)
        del place
        if first.size == n:  # every prompt is alone in its subtree from here on
            break
    return np.argsort(rank, kind="stable").astype(np.int64, copy=False)
