"""Nearest-neighbour search over a column's vectors: exact below a size, approximate above.

Below ``ann_threshold`` rows a search is exact (:func:`~semframe.core.vectors.exact_top_k`,
blocked matrix products). From that size on, an HNSW graph from usearch
answers (an optional extra: ``pip install "semframe[ann]"``); the graph is
built once per (model, column content) and saved beside the result cache as
``cache_dir()/indexes/<digest>.usearch``, so the next call or process maps
the file instead of rebuilding it. Without usearch the search stays exact
(slower, never wrong) and a logged warning gives the install line;
``ann="on"`` without it raises that line.

The graph stores float16 vectors, :data:`CONNECTIVITY` links per node, and
is searched with an expansion of :data:`EXPANSION_SEARCH` candidates. On the
hard synthetic vectors of ``benchmarks/embeddings.py`` (2,000 noisy clusters
in 384 dimensions, a million rows) that gives recall@10 1.0 against exact
search at about 2 ms a query; with 16 links it was 0.86-0.89 whatever the
expansion.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semframe.core.vectors import Rows, SparseRows, exact_top_k, n_rows
from semframe.errors import InputError, MissingDependencyError

__all__ = [
    "ANN_INSTALL",
    "ANN_MODES",
    "VectorIndex",
    "ann_available",
    "build_index",
    "index_key",
]

ANN_INSTALL = 'pip install "semframe[ann]"'
"""The install line of the approximate index (usearch)."""
ANN_MODES = ("auto", "on", "off")
"""``ann=``: by size (``ann_threshold``), always, never."""
CONNECTIVITY = 32
"""Graph edges per node (HNSW's M). 16 left a million clustered vectors with recall@10
0.86-0.89 at any expansion up to 1,024; 32 reaches 1.0 at 256 (and takes twice as long
to build)."""
EXPANSION_ADD = 128
"""Candidates kept while inserting (efConstruction)."""
EXPANSION_SEARCH = 256
"""Candidates kept while searching (ef)."""

_log = logging.getLogger(__name__)


def ann_available() -> bool:
    """Whether usearch is installed."""
    return importlib.util.find_spec("usearch") is not None


def index_key(model: str, keys: Sequence[bytes]) -> str:
    """The name of a column's saved index: a digest of the model and its texts' keys, in order.

    The graph's build parameters are part of it, so that a graph saved with
    other ones is built again rather than loaded.

    Examples
    --------
    >>> index_key("minilm", [b"a", b"b"]) != index_key("minilm", [b"b", b"a"])
    True
    """
    h = hashlib.sha256(model.encode("utf-8"))
    h.update(f"f16 M={CONNECTIVITY} ef_add={EXPANSION_ADD}".encode())
    h.update(len(keys).to_bytes(8, "little"))
    for k in keys:
        h.update(k)
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class VectorIndex:
    """A searchable set of rows: exact, or an HNSW graph.

    Attributes
    ----------
    rows : Rows
        The vectors (unit rows), searched exactly when there is no graph.
    graph : object or None
        The usearch ``Index`` (keys are row positions), or ``None``.
    kind : str
        ``"exact"``, ``"ann (built)"`` or ``"ann (loaded)"``.
    """

    rows: Rows
    graph: Any = None
    kind: str = "exact"

    @property
    def size(self) -> int:
        """Rows in the index."""
        return n_rows(self.rows)

    def search(self, queries: Rows, k: int) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """Each query's ``k`` nearest rows, best first, and their similarity (``-1``: none found).

        Examples
        --------
        >>> rows = np.eye(3, dtype=np.float32)
        >>> ids, sims = VectorIndex(rows).search(rows[[2]], 2)
        >>> ids.tolist(), sims.tolist()
        ([[2, 0]], [[1.0, 0.0]])
        """
        if self.graph is None:
            return exact_top_k(queries, self.rows, k)
        k = min(k, self.size)
        q = queries.dense(0, queries.n_rows) if isinstance(queries, SparseRows) else queries
        found = self.graph.search(np.ascontiguousarray(q, dtype=np.float32), k, threads=_threads())
        ids = np.asarray(found.keys, dtype=np.int64).reshape(len(q), -1)[:, :k]
        dist = np.asarray(found.distances, dtype=np.float32).reshape(len(q), -1)[:, :k]
        # one query gives usearch's Matches (no counts), several its BatchMatches
        counts = np.asarray(getattr(found, "counts", [len(found.keys)])).reshape(len(q))
        sims = (1.0 - dist).astype(np.float32)
        missing = np.arange(ids.shape[1])[None, :] >= counts[:, None]
        ids[missing] = -1
        sims[missing] = -1.0
        return ids, sims


def _threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_index(
    rows: Rows,
    *,
    ann: str = "auto",
    threshold: int = 50_000,
    directory: Path | None = None,
    key: str | None = None,
) -> VectorIndex:
    """The index for ``rows``: exact, or an HNSW graph (loaded from ``directory`` when saved).

    Parameters
    ----------
    rows : Rows
        Unit-length vectors; sparse rows are always searched exactly.
    ann : {"auto", "on", "off"}
        ``"auto"``: a graph from ``threshold`` rows on; ``"on"``: always (dense
        rows); ``"off"``: never.
    threshold : int
        Rows from which ``"auto"`` builds a graph.
    directory, key : Path, str, optional
        Where graphs are saved and this one's name (:func:`index_key`); without
        them a graph is built and not saved.

    Raises
    ------
    MissingDependencyError
        With ``ann="on"`` and no usearch, naming the install line.
    """
    if ann not in ANN_MODES:
        msg = f"ann must be one of {', '.join(map(repr, ANN_MODES))}; got {ann!r}."
        raise InputError(msg)
    n = n_rows(rows)
    wanted = ann == "on" or (ann == "auto" and n >= threshold)
    if not wanted or isinstance(rows, SparseRows) or n == 0:
        return VectorIndex(rows)
    if not ann_available():
        if ann == "on":
            msg = f'ann="on" needs usearch for its approximate index: {ANN_INSTALL}'
            raise MissingDependencyError(msg)
        _log.warning(
            "searching %d rows exactly (slow): the approximate index needs usearch: %s",
            n,
            ANN_INSTALL,
        )
        return VectorIndex(rows)
    from usearch.index import Index

    path = None if directory is None or key is None else directory / "indexes" / f"{key}.usearch"
    if path is not None and path.is_file():
        try:
            graph = Index.restore(str(path), view=True, expansion_search=EXPANSION_SEARCH)
        except (OSError, RuntimeError, ValueError) as exc:
            _log.warning("saved index %s unreadable (%s): rebuilding it", path, exc)
        else:
            if graph is not None and len(graph) == n:
                return VectorIndex(rows, graph, "ann (loaded)")
    graph = Index(
        ndim=rows.shape[1],
        metric="ip",
        dtype="f16",
        connectivity=CONNECTIVITY,
        expansion_add=EXPANSION_ADD,
        expansion_search=EXPANSION_SEARCH,
    )
    graph.add(np.arange(n, dtype=np.uint64), np.ascontiguousarray(rows), threads=_threads())
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            graph.save(str(tmp))
            tmp.replace(path)
        except (OSError, RuntimeError) as exc:
            _log.warning("could not save the index to %s (%s): it is rebuilt next time", path, exc)
    return VectorIndex(rows, graph, "ann (built)")
