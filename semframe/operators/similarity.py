"""Embedding operators: ``search``, ``sim_join``, ``dedup`` and ``cluster``.

Each embeds a column's text (the cells of the named columns, joined by line
breaks) with ``embed_model`` (:mod:`semframe.operators.embed`: MiniLM by
default when installed, through the embedding store, so a text is embedded
once across calls and processes) and works on the unit vectors; none sends
an LLM request, so an estimate is zero requests and zero dollars and a
budget never stops them. Rows whose text is missing (every named cell
missing) never match: ``search`` and ``sim_join`` skip them, ``dedup`` gives
each its own cluster, ``cluster`` a missing id. Searches are exact below
``ann_threshold`` rows and approximate (usearch HNSW, saved beside the
result cache) above it (:mod:`semframe.cache.index`).

- ``search(query, k=, column=)``: the ``k`` rows most similar to ``query``,
  best first, with a ``similarity`` column (row labels kept).
- ``sim_join(other, left_on, right_on, k=)``: for each left row, in order,
  its ``k`` most similar right rows, best first, with ``similarity``.
- ``dedup(column, threshold=)``: every row, in order, with the id of its
  near-duplicate cluster (rows linked by cosine similarity >= threshold,
  transitively; ids 0, 1, ... in order of first row); ``keep="first"`` keeps
  each cluster's first row only.
- ``cluster(column, k=)``: every row, in order, with its k-means cluster
  (spherical k-means on the vectors, seeded; ids in order of first row).

``last_op().counts`` holds ``texts_embedded`` (computed now) and
``vectors_reused`` (read from the store).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from semframe.backends.embedders import get_embedder, resolve_embed_model
from semframe.config import config
from semframe.core.frames import Frame, NewColumn, Output, RightSide
from semframe.core.table import MISSING
from semframe.core.vectors import components, kmeans, pairs_above
from semframe.cost.estimate import Estimate, Figures
from semframe.cost.pricing import Cost
from semframe.errors import ColumnError, InputError, did_you_mean
from semframe.operators.common import check_new_columns, check_pair
from semframe.operators.embed import Embedded, embed_groups, index_for
from semframe.runtime.call import Runner

__all__ = [
    "CLUSTER",
    "DEDUP",
    "SEARCH",
    "SIM_JOIN",
    "Cluster",
    "Dedup",
    "EmbeddingPlan",
    "Search",
    "SimJoin",
]

DEDUP_NEIGHBOURS = 16
"""Neighbours per row ``dedup`` links through the approximate index (above ``ann_threshold``)."""


@dataclass(frozen=True)
class EmbeddingPlan:
    """What an embedding operator would do (``df.llm.plan(..., op="search")``).

    Attributes
    ----------
    op : str
        The operator.
    model : str
        The embedding model (``"auto"`` resolved).
    texts : int
        Texts to embed (before the store serves any).
    rows : int
        Rows searched (the corpus, or the right frame).
    k : int or None
        Neighbours (or clusters) asked for.
    """

    op: str
    model: str
    texts: int
    rows: int
    k: int | None = None


@dataclass(frozen=True)
class _Compiled:
    op: str
    frame: Frame
    texts: tuple[str, ...]
    present: tuple[int, ...]  # positions of rows that have text
    settings: Mapping[str, Any]
    model: str
    k: int | None = None
    query: str | None = None
    out: str = "similarity"
    threshold: float | None = None
    keep: str = "all"
    seed: int = 0
    other: Frame | None = None
    other_texts: tuple[str, ...] = ()
    other_present: tuple[int, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)

    def plan(self) -> EmbeddingPlan:
        n_queries = len(self.other_present) if self.other is not None else 0
        queries = 1 if self.query is not None else n_queries
        return EmbeddingPlan(
            self.op, self.model, len(self.present) + queries, len(self.present), self.k
        )


def _columns(frame: Frame, column: object, what: str, side: str = "") -> list[str]:
    names = [column] if isinstance(column, str) else column
    if (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(c, str) for c in names)
    ):
        msg = f"{what} must be a column name or a non-empty list of names; got {column!r}."
        raise InputError(msg)
    for name in names:
        if name not in frame.columns:
            where = f"the {side} frame" if side else "the frame"
            msg = (
                f"{what}={name!r}: {where} has no such column.{did_you_mean(name, frame.columns)} "
                f"Columns: {list(frame.columns)}."
            )
            raise ColumnError(msg)
    return list(names)


def _texts(frame: Frame, columns: Sequence[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Each row's text (its cells joined by line breaks) and the rows that have any."""
    table = frame.table(columns)
    texts, present = [], []
    for r in range(table.n_rows):
        cells = [table.cells[c][r] for c in columns]
        kept = [c for c in cells if c != MISSING]
        texts.append("\n".join(kept))
        if kept:
            present.append(r)
    return tuple(texts), tuple(present)


def _positive_int(value: object, name: str, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{name} must be a positive int ({meaning}), got {value!r}."
        raise InputError(msg)
    return value


def _settings(op: str, settings: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """Resolved settings and the resolved model; a missing model package fails here."""
    cfg = config(**settings)
    model = resolve_embed_model(cfg["embed_model"])
    if model != "tfidf":
        get_embedder(model)  # MissingDependencyError (with the install line) before any work
    return cfg, model


def _estimate(c: _Compiled) -> Estimate:
    nothing = Figures(0, 0, 0, 0, 0, 0, Cost(), 0.0, None)
    plan = c.plan()
    note = (
        f"no LLM requests: {plan.texts:,} texts embedded locally with {plan.model!r} "
        "(vectors already in the embedding store are read, not computed)"
    )
    return Estimate(
        op=c.op,
        backend="embedding",
        model=plan.model,
        reorder="none",
        rows=plan.texts,
        planned=nothing,
        original=nothing,
        notes=(note,),
    )


def _embed(c: _Compiled, groups: Sequence[Sequence[str]]) -> Embedded:
    return embed_groups(groups, {**c.settings, "embed_model": c.model})


class Search:
    """``df.llm.search``: the ``k`` rows most similar to a query, best first."""

    name = "search"
    required: tuple[str, ...] = ("column",)

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        column: str | Sequence[str],
        k: int = 10,
        out: str = "similarity",
        **settings: Any,
    ) -> _Compiled:
        """Validate the search and read the column; embeds nothing."""
        if not isinstance(template, str) or not template.strip():
            msg = f"search needs a non-empty query string, got {template!r}."
            raise InputError(msg)
        columns = _columns(frame, column, "column")
        k = _positive_int(k, "k", "rows to return")
        check_new_columns(frame, [out])
        cfg, model = _settings(self.name, settings)
        texts, present = _texts(frame, columns)
        return _Compiled(self.name, frame, texts, present, cfg, model, k=k, query=template, out=out)

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        return c.plan()

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        return _estimate(c)

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Embed the rows (stored vectors reused) and the query; search the index."""
        assert c.query is not None
        assert c.k is not None
        embedded = _embed(c, [[c.texts[r] for r in c.present], [c.query]])
        index = index_for(embedded, 0, c.settings)
        ids, sims = index.search(embedded.groups[1], c.k)
        hits = [(int(i), float(s)) for i, s in zip(ids[0], sims[0], strict=True) if i >= 0]
        runner.finish(rows=len(c.present), ann=int(index.graph is not None), **embedded.counts())
        return Output(
            rows=[c.present[i] for i, _ in hits],
            columns=(NewColumn(c.out, [s for _, s in hits], "float"),),
        )


class SimJoin:
    """``df.llm.sim_join``: each left row with its ``k`` most similar right rows."""

    name = "sim_join"
    required: tuple[str, ...] = ("other", "left_on", "right_on")

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        other: Any,
        left_on: str | Sequence[str],
        right_on: str | Sequence[str],
        k: int = 1,
        out: str = "similarity",
        suffix: str = "_right",
        **settings: Any,
    ) -> _Compiled:
        """Validate the join and read both sides' columns; embeds nothing."""
        right = Frame.of(other)
        check_pair("sim_join", frame, right, suffix)
        lcols = _columns(frame, left_on, "left_on", "left")
        rcols = _columns(right, right_on, "right_on", "right")
        k = _positive_int(k, "k", "right rows per left row")
        rename = {c: c + suffix for c in right.columns if c in frame.columns}
        result = [*frame.columns, *(rename.get(c, c) for c in right.columns)]
        if len(set(result)) != len(result):
            msg = f"suffix={suffix!r} still leaves right columns named like left ones."
            raise InputError(msg)
        if not isinstance(out, str) or not out or out in result:
            msg = f"out={out!r} must be a new, non-empty column name (the result has {result})."
            raise InputError(msg)
        cfg, model = _settings(self.name, settings)
        texts, present = _texts(frame, lcols)
        rtexts, rpresent = _texts(right, rcols)
        return _Compiled(
            self.name,
            frame,
            texts,
            present,
            cfg,
            model,
            k=k,
            out=out,
            other=right,
            other_texts=rtexts,
            other_present=rpresent,
            rename=rename,
        )

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        return EmbeddingPlan(
            c.op, c.model, len(c.present) + len(c.other_present), len(c.other_present), c.k
        )

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        return _estimate(c)

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Embed both sides; search the right side's index with every left row."""
        assert c.other is not None
        assert c.k is not None
        embedded = _embed(
            c,
            [[c.other_texts[r] for r in c.other_present], [c.texts[r] for r in c.present]],
        )
        index = index_for(embedded, 0, c.settings)
        ids, sims = index.search(embedded.groups[1], c.k)
        rows: list[int] = []
        right_rows: list[int] = []
        values: list[float] = []
        for q, left_row in enumerate(c.present):
            for j, s in zip(ids[q], sims[q], strict=True):
                if j >= 0:
                    rows.append(left_row)
                    right_rows.append(c.other_present[int(j)])
                    values.append(float(s))
        runner.finish(
            rows=len(c.present),
            pairs=len(rows),
            ann=int(index.graph is not None),
            **embedded.counts(),
        )
        return Output(
            rows=rows,
            columns=(NewColumn(c.out, values, "float"),),
            right=RightSide(c.other, right_rows, c.rename),
        )


def _check_threshold(threshold: object) -> float:
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not 0.0 < float(threshold) <= 1.0
    ):
        msg = (
            "threshold must be a cosine similarity in (0, 1] (rows at least this similar are "
            f"duplicates; 0.9 is a near-exact paraphrase with MiniLM), got {threshold!r}."
        )
        raise InputError(msg)
    return float(threshold)


class Dedup:
    """``df.llm.dedup``: near-duplicate cluster ids (or the first row of each cluster)."""

    name = "dedup"
    required: tuple[str, ...] = ()

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        column: str | Sequence[str] | None = None,
        threshold: float = 0.9,
        out: str = "dup_cluster",
        keep: str = "all",
        **settings: Any,
    ) -> _Compiled:
        """Validate the call and read the column (``column=``, else the template)."""
        columns = _columns(frame, template if column is None else column, "column")
        threshold = _check_threshold(threshold)
        if keep not in ("all", "first"):
            msg = f"keep must be 'all' (every row, with its cluster) or 'first', got {keep!r}."
            raise InputError(msg)
        check_new_columns(frame, [out])
        cfg, model = _settings(self.name, settings)
        texts, present = _texts(frame, columns)
        return _Compiled(
            self.name, frame, texts, present, cfg, model, out=out, threshold=threshold, keep=keep
        )

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        return c.plan()

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        return _estimate(c)

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Link rows at least ``threshold`` similar; number the connected clusters."""
        assert c.threshold is not None
        embedded = _embed(c, [[c.texts[r] for r in c.present]])
        rows = embedded.groups[0]
        index = index_for(embedded, 0, c.settings)
        if index.graph is None:
            links = [(i, j) for i, j, _ in pairs_above(rows, c.threshold)]
        else:
            ids, sims = index.search(rows, DEDUP_NEIGHBOURS)
            hit = (sims >= c.threshold) & (ids >= 0)
            links = [(int(q), int(j)) for q, j in zip(*np.nonzero(hit), strict=True)]
            links = [(q, int(ids[q, j])) for q, j in links]
        # rows without text are their own clusters: link present rows by frame position
        n = c.frame.height
        ids_of = components(n, [(c.present[a], c.present[b]) for a, b in links])
        runner.finish(
            rows=n,
            clusters=len(set(ids_of)),
            links=len(links),
            ann=int(index.graph is not None),
            **embedded.counts(),
        )
        if c.keep == "first":
            firsts: dict[int, int] = {}
            for r, cluster in enumerate(ids_of):
                firsts.setdefault(cluster, r)
            first = sorted(firsts.values())
            return Output(
                rows=first, columns=(NewColumn(c.out, [ids_of[r] for r in first], "int"),)
            )
        return Output(columns=(NewColumn(c.out, ids_of, "int"),))


class Cluster:
    """``df.llm.cluster``: k-means cluster ids of the rows' embeddings."""

    name = "cluster"
    required: tuple[str, ...] = ("k",)

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        column: str | Sequence[str] | None = None,
        k: int,
        out: str = "cluster",
        seed: int = 0,
        **settings: Any,
    ) -> _Compiled:
        """Validate the call and read the column (``column=``, else the template)."""
        columns = _columns(frame, template if column is None else column, "column")
        k = _positive_int(k, "k", "clusters")
        if isinstance(seed, bool) or not isinstance(seed, int):
            msg = f"seed must be an int, got {seed!r}."
            raise InputError(msg)
        check_new_columns(frame, [out])
        cfg, model = _settings(self.name, settings)
        texts, present = _texts(frame, columns)
        if k > len(present):
            msg = (
                f"k={k} clusters, but only {len(present)} rows have text in {columns}; "
                f"k must be between 1 and {len(present)}."
            )
            raise InputError(msg)
        return _Compiled(self.name, frame, texts, present, cfg, model, k=k, out=out, seed=seed)

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        return c.plan()

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        return _estimate(c)

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Spherical k-means on the embeddings; ids in order of first row."""
        assert c.k is not None
        embedded = _embed(c, [[c.texts[r] for r in c.present]])
        labels, _ = kmeans(embedded.groups[0], c.k, seed=c.seed)
        values: list[int | None] = [None] * c.frame.height
        for r, label in zip(c.present, labels, strict=True):
            values[r] = label
        runner.finish(rows=c.frame.height, clusters=len(set(labels)), **embedded.counts())
        return Output(columns=(NewColumn(c.out, values, "int"),))


SEARCH = Search()
SIM_JOIN = SimJoin()
DEDUP = Dedup()
CLUSTER = Cluster()
