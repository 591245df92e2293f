"""Rows of vectors and exact search over them: dense float32 arrays or sparse rows.

Embeddings are unit-length rows, so the dot product is the cosine
similarity. A dense embedding (MiniLM's 384 floats) is a float32 array; a
sparse one (the hashed TF-IDF fallback: a few hundred non-zero buckets out of
4,096) is :class:`SparseRows`, compressed rows that are made dense a block
at a time, so no search ever holds more than a block of dense rows.

:func:`exact_top_k` is the exact search every operator falls back to (and
what approximate search is measured against); :func:`kmeans` and
:func:`components` serve ``cluster`` and ``dedup``. All are deterministic:
ties go to the earlier row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Rows",
    "SparseRows",
    "blocks",
    "components",
    "dense",
    "exact_top_k",
    "kmeans",
    "n_rows",
    "pairs_above",
]

BLOCK = 8192
"""Rows of the corpus compared at once (a block of similarities is ``queries x BLOCK``)."""
QUERY_BLOCK = 512
"""Query rows compared at once."""


@dataclass(frozen=True)
class SparseRows:
    """Rows of a sparse matrix in compressed-row form (CSR), float32 values.

    Row ``i`` has the values ``values[indptr[i]:indptr[i+1]]`` at the columns
    ``indices[indptr[i]:indptr[i+1]]``.

    Examples
    --------
    >>> rows = SparseRows.of([{0: 1.0}, {2: 0.6, 3: 0.8}], width=4)
    >>> rows.n_rows, rows.dense(0, 2).astype(float).round(2).tolist()
    (2, [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.6, 0.8]])
    """

    indptr: NDArray[np.int64]
    indices: NDArray[np.int32]
    values: NDArray[np.float32]
    width: int

    @classmethod
    def of(cls, rows: Sequence[dict[int, float]], width: int) -> SparseRows:
        """From one ``{column: value}`` mapping per row."""
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        indices = np.fromiter((c for r in rows for c in r), dtype=np.int32, count=int(indptr[-1]))
        values = np.fromiter(
            (v for r in rows for v in r.values()), dtype=np.float32, count=int(indptr[-1])
        )
        return cls(indptr, indices, values, width)

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return len(self.indptr) - 1

    @property
    def nbytes(self) -> int:
        """Bytes the rows take."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.values.nbytes)

    def take(self, rows: Sequence[int]) -> SparseRows:
        """The rows at ``rows``, in that order."""
        picked = [np.arange(self.indptr[r], self.indptr[r + 1]) for r in rows]
        at = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(p) for p in picked])
        return SparseRows(indptr, self.indices[at], self.values[at], self.width)

    def dense(self, start: int, stop: int) -> NDArray[np.float32]:
        """Rows ``start:stop`` as a dense float32 array."""
        out = np.zeros((stop - start, self.width), dtype=np.float32)
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        row_of = np.repeat(np.arange(stop - start), np.diff(self.indptr[start : stop + 1]))
        out[row_of, self.indices[lo:hi]] = self.values[lo:hi]
        return out


Rows: TypeAlias = "NDArray[np.float32] | SparseRows"
"""Unit-length vectors, one per row: dense or sparse."""


def n_rows(rows: Rows) -> int:
    """Number of rows."""
    return rows.n_rows if isinstance(rows, SparseRows) else len(rows)


def dense(rows: Rows, start: int = 0, stop: int | None = None) -> NDArray[np.float32]:
    """Rows ``start:stop`` as a dense float32 array (a view for dense rows)."""
    stop = n_rows(rows) if stop is None else stop
    if isinstance(rows, SparseRows):
        return rows.dense(start, stop)
    return rows[start:stop]


def blocks(rows: Rows, size: int = BLOCK) -> Iterator[tuple[int, NDArray[np.float32]]]:
    """``(first row, dense block)`` over ``rows``, ``size`` rows at a time."""
    n = n_rows(rows)
    for start in range(0, n, size):
        yield start, dense(rows, start, min(start + size, n))


def _best(
    ids: NDArray[np.int64], sims: NDArray[np.float32], k: int
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Per row, the ``k`` highest ``sims`` (ties: lower id), best first."""
    order = np.lexsort((ids, -sims), axis=-1)[:, :k]
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(sims, order, axis=1)


def _block_top(
    sims: NDArray[np.float32], k: int, offset: int
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """The ``k`` best columns of each row of ``sims`` (ties: lower column)."""
    m = sims.shape[1]
    if k >= m:
        ids = np.broadcast_to(np.arange(m, dtype=np.int64), sims.shape)
        return _best(ids + offset, sims, k)
    part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    picked = np.take_along_axis(sims, part, axis=1)
    kth = picked.min(axis=1)
    # argpartition breaks ties at the k-th value arbitrarily: redo those rows stably
    crossing = np.flatnonzero((sims >= kth[:, None]).sum(axis=1) > k)
    for r in crossing:
        part[r] = np.argsort(-sims[r], kind="stable")[:k]
    picked = np.take_along_axis(sims, part, axis=1)
    return _best(part.astype(np.int64) + offset, picked, k)


def exact_top_k(
    queries: Rows, corpus: Rows, k: int
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """For each query row, its ``k`` most similar corpus rows, best first, and their similarity.

    Similarity is the dot product (cosine for unit rows); ties go to the
    earlier corpus row. With fewer than ``k`` corpus rows, every row is
    returned. Work is done in blocks (:data:`QUERY_BLOCK` x :data:`BLOCK`).

    Examples
    --------
    >>> corpus = np.array([[1, 0], [0.6, 0.8], [0, 1], [1, 0]], dtype=np.float32)
    >>> ids, sims = exact_top_k(np.array([[1, 0]], dtype=np.float32), corpus, 3)
    >>> ids.tolist(), sims.astype(float).round(2).tolist()
    ([[0, 3, 1]], [[1.0, 1.0, 0.6]])
    """
    nq, nc = n_rows(queries), n_rows(corpus)
    k = min(k, nc)
    out_ids = np.zeros((nq, k), dtype=np.int64)
    out_sims = np.zeros((nq, k), dtype=np.float32)
    if k == 0 or nq == 0:
        return out_ids, out_sims
    corpus_blocks = list(blocks(corpus)) if isinstance(corpus, SparseRows) else None
    for qstart, qblock in blocks(queries, QUERY_BLOCK):
        best: tuple[NDArray[np.int64], NDArray[np.float32]] | None = None
        for cstart, cblock in corpus_blocks or blocks(corpus):
            ids, sims = _block_top(qblock @ cblock.T, k, cstart)
            if best is not None:
                ids, sims = _best(
                    np.concatenate([best[0], ids], axis=1),
                    np.concatenate([best[1], sims], axis=1),
                    k,
                )
            best = (ids, sims)
        assert best is not None
        stop = qstart + len(qblock)
        out_ids[qstart:stop], out_sims[qstart:stop] = best
    return out_ids, out_sims


def pairs_above(rows: Rows, threshold: float) -> list[tuple[int, int, float]]:
    """Every pair ``(i, j, sim)`` with ``i < j`` and similarity at least ``threshold``.

    Exact, by blocks; quadratic in the rows (``dedup`` uses it below the
    approximate index's size).

    Examples
    --------
    >>> v = np.array([[1, 0], [0.99, 0.141], [0, 1]], dtype=np.float32)
    >>> [(i, j) for i, j, _ in pairs_above(v, 0.9)]
    [(0, 1)]
    """
    out: list[tuple[int, int, float]] = []
    all_blocks = list(blocks(rows, QUERY_BLOCK))
    for a, (astart, ablock) in enumerate(all_blocks):
        for bstart, bblock in all_blocks[a:]:
            sims = ablock @ bblock.T
            ii, jj = np.nonzero(sims >= np.float32(threshold))
            for i, j in zip(ii.tolist(), jj.tolist(), strict=True):
                if astart + i < bstart + j:
                    out.append((astart + i, bstart + j, float(sims[i, j])))
    out.sort()
    return out


def components(n: int, pairs: Sequence[tuple[int, int]]) -> list[int]:
    """Connected components of ``n`` rows linked by ``pairs``: ids 0, 1, ... by first row.

    Examples
    --------
    >>> components(5, [(3, 1), (4, 0)])
    [0, 1, 2, 1, 0]
    """
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    ids: dict[int, int] = {}
    return [ids.setdefault(root(i), len(ids)) for i in range(n)]


def kmeans(
    rows: Rows, k: int, *, seed: int = 0, iterations: int = 50
) -> tuple[list[int], NDArray[np.float32]]:
    """Spherical k-means (cosine) of ``rows``: each row's cluster and the unit centroids.

    Greedy k-means++ seeding with ``seed`` (each centre the best of
    ``2 + ln k`` candidates drawn by k-means++, as scikit-learn does), then
    Lloyd iterations until no row moves (at most ``iterations``). Clusters
    are numbered by their first row, so the result does not depend on the
    seeding's numbering. Needs ``1 <= k <= rows``.

    Examples
    --------
    >>> v = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], dtype=np.float32)
    >>> v /= np.linalg.norm(v, axis=1, keepdims=True)
    >>> kmeans(v, 2)[0]
    [0, 0, 1, 1]
    """
    n = n_rows(rows)
    rng = np.random.default_rng(seed)
    first = int(rng.integers(n))
    centroids = [dense(rows, first, first + 1)[0]]
    trials = 2 + int(np.log(k))

    def distances(center: NDArray[np.float32]) -> NDArray[np.float64]:
        out = np.empty(n, dtype=np.float64)
        for start, block in blocks(rows):
            out[start : start + len(block)] = np.maximum(1.0 - block @ center, 0.0)
        return out

    closest = distances(centroids[0])
    for _ in range(1, k):
        total = closest.sum()
        if total <= 0:
            picks = rng.integers(n, size=1)
        else:
            picks = rng.choice(n, size=trials, p=closest / total)
        best: tuple[float, NDArray[np.float64], int] | None = None
        for pick in picks.tolist():
            tried = np.minimum(closest, distances(dense(rows, pick, pick + 1)[0]))
            if best is None or tried.sum() < best[0]:
                best = (float(tried.sum()), tried, pick)
        assert best is not None
        closest = best[1]
        centroids.append(dense(rows, best[2], best[2] + 1)[0])
    centers = np.stack(centroids).astype(np.float32)
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(iterations):
        new = np.empty(n, dtype=np.int64)
        sums = np.zeros_like(centers)
        for start, block in blocks(rows):
            assign = np.argmax(block @ centers.T, axis=1)
            new[start : start + len(block)] = assign
            onehot = np.zeros((len(block), k), dtype=np.float32)
            onehot[np.arange(len(block)), assign] = 1.0
            sums += onehot.T @ block
        moved = not np.array_equal(new, labels)
        labels = new
        norms = np.linalg.norm(sums, axis=1)
        empty = norms == 0
        sums[~empty] /= norms[~empty, None]
        sums[empty] = centers[empty]  # an empty cluster keeps its centre
        centers = sums
        if not moved:
            break
    renumber: dict[int, int] = {}
    ordered = [renumber.setdefault(int(c), len(renumber)) for c in labels]
    order = sorted(renumber, key=renumber.__getitem__)
    return ordered, centers[order] if order else centers[:0]


def as_float32(vectors: Any) -> NDArray[np.float32]:
    """``vectors`` as a C-contiguous float32 2-d array."""
    return np.ascontiguousarray(np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1))
