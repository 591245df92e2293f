"""Embedding operators: ``search``, ``sim_join``, ``dedup`` and ``cluster``.

Each embeds a column's text (the cells of the named columns, joined by line
breaks) with ``embed_model`` (:mod:`semframe.operators.embed`: MiniLM by
default when installed, through the embedding store, so a text is embedded
once across calls and processes) and works on the unit vectors. By default
none sends an LLM request. A local embedder (MiniLM, a model folder, TF-IDF)
costs nothing; an API one (``"openai:<model>"``, ``"gemini:<model>"``:
:mod:`semframe.backends.api_embedders`) is priced for the texts the store
does not hold, and ``budget=`` stops the call before anything is sent. Each
has an optional LLM step (:mod:`semframe.operators.similarity_llm`, off by
default), whose requests the plan, the estimate and ``budget=`` then
include. Rows whose text is missing (every named cell
missing) never match: ``search`` and ``sim_join`` skip them, ``dedup`` gives
each its own cluster, ``cluster`` a missing id. Searches are exact below
``ann_threshold`` rows and approximate (usearch HNSW, saved beside the
result cache) above it (:mod:`semframe.cache.index`).

- ``search(query, k=, column=)``: the ``k`` rows most similar to ``query``,
  best first, with a ``similarity`` column (row labels kept). With
  ``rerank=``, the ``candidates`` most similar rows are ranked by the LLM
  (``topk``'s comparisons) and the top ``k`` returned, the LLM's best first.
- ``sim_join(other, left_on, right_on, k=)``: for each left row, in order,
  its ``k`` most similar right rows, best first, with ``similarity``.
- ``dedup(column, threshold=)``: every row, in order, with the id of its
  near-duplicate cluster (rows linked by cosine similarity >= threshold,
  transitively; ids 0, 1, ... in order of first row); ``keep="first"`` keeps
  each cluster's first row only. With ``verify=``, pairs in the band
  ``[threshold - band, threshold)`` (not already linked) are asked whether
  they are the same thing; pairs the LLM confirms link too.
- ``cluster(column, k=)``: every row, in order, with its k-means cluster
  (spherical k-means on the vectors, seeded; ids in order of first row).
  With ``label=``, one LLM request per cluster (showing its ``label_sample``
  members nearest the centroid) names it in a ``label_out`` column.

``last_op().counts`` holds ``texts_embedded`` (computed now) and
``vectors_reused`` (read from the store).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from semframe.backends import cost_model, get_backend
from semframe.backends.api_embedders import require_sdk, split_model
from semframe.backends.embedders import get_embedder, resolve_embed_model
from semframe.config import config
from semframe.core.frames import Frame, NewColumn, Output, RightSide
from semframe.core.plan import Plan
from semframe.core.table import MISSING
from semframe.core.vectors import Rows, blocks, components, kmeans, pairs_above
from semframe.cost.estimate import Estimate, Figures
from semframe.cost.pricing import Cost
from semframe.errors import ColumnError, ConfigError, InputError, RowErrors, did_you_mean
from semframe.operators.common import check_new_columns, check_pair
from semframe.operators.embed import Embedded, api_cost, embed_groups, index_for
from semframe.operators.similarity_llm import (
    Label,
    Rerank,
    Verify,
    compile_label,
    compile_rerank,
    compile_verify,
    label_columns,
    label_estimate,
    rerank_estimate,
    rerank_plan,
    run_labels,
    run_rerank,
    run_verify,
    stand_in_plan,
    verify_estimate,
    verify_plan,
    with_llm,
)
from semframe.operators.topk import TopkPlan
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
    llm : Plan, TopkPlan or None
        The LLM step's plan (``None`` without one): ``search(rerank=)``'s
        ``topk`` plan over stand-in candidates (the longest rows; the real
        ones are known once embedded), ``dedup(verify=)``'s pair questions
        (exact: the column is embedded to find the uncertain pairs),
        ``cluster(label=)``'s naming requests (the longest rows standing in
        for each cluster's sample).
    """

    op: str
    model: str
    texts: int
    rows: int
    k: int | None = None
    llm: Plan | TopkPlan | None = None


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
    llm: Rerank | Verify | Label | None = None  # the optional LLM step
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

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
    """Resolved settings and the resolved model; a missing model package fails here.

    An API model's key is needed only to run (an estimate prices it without one).
    """
    cfg = config(**settings)
    model = resolve_embed_model(cfg["embed_model"])
    api = split_model(model)
    if api is not None:
        require_sdk(api[0])  # MissingDependencyError (with the install line) before any work
    elif model != "tfidf":
        get_embedder(model, cfg)  # MissingDependencyError (with the install line) before any work
    return cfg, model


def _estimate(c: _Compiled) -> Estimate:
    """No LLM requests; an API embedding model's requests priced (texts in the store are free)."""
    plan = c.plan()
    texts = [c.texts[r] for r in c.present] + [c.other_texts[r] for r in c.other_present]
    if c.query is not None:
        texts.append(c.query)
    priced = api_cost(texts, {**c.settings, "embed_model": c.model})
    if priced is not None:
        price = priced.price
        dollars = priced.dollars
        figures = Figures(
            priced.requests, priced.tokens, 0, 0, 0, 0, Cost(uncached_input=dollars), dollars, None
        )
        sent = priced.texts - priced.stored
        notes = [
            f"no LLM requests: {sent:,} of {priced.texts:,} distinct texts sent to {c.model!r} "
            f"in {priced.requests:,} request(s) (the other {priced.stored:,} are in the "
            f"embedding store); ${price.input}/M input tokens as of {price.as_of} "
            f"({price.source})"
        ]
        if not priced.exact:
            notes.append("token counts are approximate (o200k_base; Gemini's own counts differ)")
        return Estimate(
            op=c.op,
            backend=price.provider,
            model=price.model,
            reorder="none",
            rows=plan.texts,
            planned=figures,
            original=figures,
            exact_tokens=priced.exact,
            output_source="embeddings, none",
            notes=tuple(notes),
        )
    nothing = Figures(0, 0, 0, 0, 0, 0, Cost(), 0.0, None)
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
    return embed_groups(groups, {**c.settings, "embed_model": c.model}, op=c.op)


def _charge(c: _Compiled, runner: Runner, embedded: Embedded) -> None:
    """Count what an API embedder's requests cost against the call's budget (once a call)."""
    if runner.guard is not None and embedded.run is not None and not c.memo.get("charged"):
        runner.guard.add(embedded.run)
        c.memo["charged"] = True


def _off(step: object) -> bool:
    """Whether an LLM step argument (``rerank=``, ``verify=``, ``label=``) leaves it off."""
    return step is None or step is False


def _unused(name: str, value: object, step: str) -> None:
    """Fail when an LLM step's option is given without the step."""
    if value is not None:
        msg = (
            f"{name}={value!r} only applies with {step}= (the LLM step it tunes), which is "
            f"off; pass {step}=True (or a question template) too, or drop {name}."
        )
        raise InputError(msg)


def _check_llm(settings: Mapping[str, Any], step: str, out: str) -> None:
    """An LLM step's checks before anything is embedded or sent.

    The backend must at least be priceable (an unknown backend fails here; an
    API without its key is still priced for ``estimate=True``, and the run
    fails on the key before embedding), and ``errors="keep"``'s column must
    not be the operator's ``out``.
    """
    try:
        cost_model(settings["backend"], model=settings["model"], settings=settings)
    except ConfigError as exc:
        msg = f"{step}= sends LLM requests, but: {exc}"
        raise ConfigError(msg) from exc
    if settings["errors"] == "keep" and out == "llm_error":
        msg = (
            f"errors='keep' with {step}= adds the column 'llm_error', which is also out; "
            "choose another out."
        )
        raise InputError(msg)


def _with_llm(c: _Compiled, llm: Estimate) -> Estimate:
    """The embedding estimate with the LLM step's ``llm`` added (its requests, tokens, dollars)."""
    base = _estimate(c)
    said = "no LLM requests: "  # true of the embeddings alone, not of the call
    notes = tuple(
        "the embeddings send no LLM request: " + n[len(said) :] if n.startswith(said) else n
        for n in base.notes
    )
    return with_llm(replace(base, notes=notes), llm)


def _llm_backend(settings: Mapping[str, Any]) -> None:
    """Build the LLM step's backend before embedding: a missing key or SDK fails first."""
    get_backend(settings["backend"], model=settings["model"], settings=settings)


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
        rerank: bool | str | None = None,
        candidates: int | None = None,
        **settings: Any,
    ) -> _Compiled:
        """Validate the search (and its re-ranking) and read the column; embeds nothing."""
        if not isinstance(template, str) or not template.strip():
            msg = f"search needs a non-empty query string, got {template!r}."
            raise InputError(msg)
        columns = _columns(frame, column, "column")
        k = _positive_int(k, "k", "rows to return")
        check_new_columns(frame, [out])
        cfg, model = _settings(self.name, settings)
        step = None
        if _off(rerank):
            _unused("candidates", candidates, "rerank")
        else:
            step = compile_rerank(frame, rerank, candidates, template, columns, k, settings)
            _check_llm(step.topk.settings, "rerank", out)
        texts, present = _texts(frame, columns)
        return _Compiled(
            self.name, frame, texts, present, cfg, model, k=k, query=template, out=out, llm=step
        )

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        if isinstance(c.llm, Rerank):
            return replace(c.plan(), llm=rerank_plan(c.llm, c.present))
        return c.plan()

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        if isinstance(c.llm, Rerank):
            return _with_llm(c, rerank_estimate(c.llm, c.present, probe=probe))
        return _estimate(c)

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Embed the rows (stored vectors reused) and the query; search the index.

        With ``rerank=``, the ``candidates`` best hits are ranked by the LLM.
        """
        assert c.query is not None
        assert c.k is not None
        if isinstance(c.llm, Rerank):
            _llm_backend(c.llm.topk.settings)
        wanted = c.llm.candidates if isinstance(c.llm, Rerank) else c.k  # candidates >= k
        embedded = _embed(c, [[c.texts[r] for r in c.present], [c.query]])
        _charge(c, runner, embedded)
        index = index_for(embedded, 0, c.settings)
        ids, sims = index.search(embedded.groups[1], wanted)
        hits = [(int(i), float(s)) for i, s in zip(ids[0], sims[0], strict=True) if i >= 0]
        counts = {"rows": len(c.present), "ann": int(index.graph is not None)}
        if not isinstance(c.llm, Rerank):
            runner.finish(**counts, **embedded.counts())
            return Output(
                rows=[c.present[i] for i, _ in hits],
                columns=(NewColumn(c.out, [s for _, s in hits], "float"),),
            )
        return _reranked(c, c.llm, runner, [(c.present[i], s) for i, s in hits], counts, embedded)


def _reranked(  # noqa: PLR0917
    c: _Compiled,
    step: Rerank,
    runner: Runner,
    hits: Sequence[tuple[int, float]],
    counts: Mapping[str, int],
    embedded: Embedded,
) -> Output:
    """The LLM's top ``k`` of the candidate ``hits`` (frame positions), best first."""
    similarity = dict(hits)
    candidates = [r for r, _ in hits]
    ranking = run_rerank(step, runner, candidates, c.frame.labels)
    n = len(candidates)
    runner.finish(
        **counts,
        candidates=n,
        comparisons=ranking.comparisons,
        naive_comparisons=n * (n - 1) // 2,
        **embedded.counts(),
    )
    ranked = list(ranking.ranked)
    errors = sorted(ranking.errors, key=lambda e: e.row)
    if step.topk.settings["errors"] == "keep":
        rows = ranked + [e.row for e in errors]
        reasons = [None] * len(ranked) + [f"{e.kind}: {e.message}" for e in errors]
        return Output(
            rows=rows,
            columns=(
                NewColumn(c.out, [similarity[r] for r in rows], "float"),
                NewColumn("llm_error", reasons),
            ),
        )
    result = Output(
        rows=ranked, columns=(NewColumn(c.out, [similarity[r] for r in ranked], "float"),)
    )
    if errors:
        raise RowErrors(errors, result, total=n)
    return result


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
        _charge(c, runner, embedded)
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
        verify: bool | str | None = None,
        band: float | None = None,
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
        step = None
        if _off(verify):
            _unused("band", band, "verify")
        else:
            llm_cfg = config(**settings)
            step = compile_verify(frame, verify, band, threshold, columns, llm_cfg)
            _check_llm(llm_cfg, "verify", out)
        texts, present = _texts(frame, columns)
        return _Compiled(
            self.name,
            frame,
            texts,
            present,
            cfg,
            model,
            out=out,
            threshold=threshold,
            keep=keep,
            llm=step,
        )

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        """The embedding work; with ``verify=``, the exact pair questions (embeds the column).

        Where embedding would be billed (an API model, texts the store lacks),
        nothing is embedded to plan: the pair questions are left out (``llm``
        is ``None``) and known only when the call runs.
        """
        if isinstance(c.llm, Verify) and not _billed_embedding(c):
            return replace(c.plan(), llm=verify_plan(c.llm, _links(c).asked))
        return c.plan()

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        """Zero requests; with ``verify=``, the uncertain pairs' questions (found by embedding).

        Where embedding would be billed, the estimate prices the embedding only
        and says the pair questions are not counted: an estimate sends nothing.
        ``budget=`` still stops the run's questions once the call would pass it.
        """
        if not isinstance(c.llm, Verify):
            return _estimate(c)
        if _billed_embedding(c):
            base = _estimate(c)
            note = (
                "verify=: the uncertain pairs are found by embedding the column, which "
                f"{c.model!r} would bill: their questions are not counted here (run "
                "without verify= first, or estimate once the vectors are stored)"
            )
            return replace(base, notes=(*base.notes, note))
        asked = _links(c).asked
        llm = verify_estimate(c.llm, asked, probe=probe)
        note = (
            f"{len(asked):,} uncertain pairs (similarity in [{c.llm.low:.3g}, {c.threshold:.3g}), "
            "not already linked) found by embedding the column now; the run reuses the vectors"
        )
        return _with_llm(c, replace(llm, notes=(*llm.notes, note)))

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Link rows at least ``threshold`` similar (and confirmed pairs); number the clusters."""
        if isinstance(c.llm, Verify):
            _llm_backend(c.llm.settings)
        found = _links(c)
        _charge(c, runner, found.embedded)
        links = [(c.present[a], c.present[b]) for a, b in found.links]
        counts: dict[str, int] = {}
        verdicts = None
        if isinstance(c.llm, Verify):
            verdicts = run_verify(c.llm, runner, found.asked, c.frame.labels)
            links.extend(verdicts.confirmed)
            counts = {
                "asked": len(found.asked),
                "confirmed": len(verdicts.confirmed),
                "refused": verdicts.refused,
            }
        # rows without text are their own clusters: link present rows by frame position
        n = c.frame.height
        ids_of = components(n, links)
        runner.finish(
            rows=n,
            clusters=len(set(ids_of)),
            links=len(links),
            ann=int(found.ann),
            **counts,
            **found.embedded.counts(),
        )
        rows: Sequence[int] = range(n)
        if c.keep == "first":
            firsts: dict[int, int] = {}
            for r, cluster in enumerate(ids_of):
                firsts.setdefault(cluster, r)
            rows = sorted(firsts.values())
            output = Output(
                rows=rows, columns=(NewColumn(c.out, [ids_of[r] for r in rows], "int"),)
            )
        else:
            output = Output(columns=(NewColumn(c.out, ids_of, "int"),))
        if verdicts is None or not isinstance(c.llm, Verify):
            return output
        if c.llm.settings["errors"] == "keep":
            why = [verdicts.reasons.get(r) for r in rows]
            return output.with_columns(NewColumn("llm_error", why))
        if verdicts.errors:
            errors = sorted(verdicts.errors, key=lambda e: e.row)
            raise RowErrors(errors, output, total=len(found.asked))
        return output


@dataclass(frozen=True)
class _Links:
    """What ``dedup`` links by similarity alone, and the pairs ``verify=`` asks about.

    Attributes
    ----------
    embedded : Embedded
        The column's vectors.
    links : list of (int, int)
        Pairs at least ``threshold`` similar (positions among rows with text).
    asked : list of (int, int)
        Pairs in the uncertain band whose rows ``links`` does not already
        connect, as frame positions ``(a, b)``, ``a < b``, sorted; empty
        without ``verify=``.
    ann : bool
        Whether the approximate index found the neighbours.
    """

    embedded: Embedded
    links: list[tuple[int, int]]
    asked: list[tuple[int, int]]
    ann: bool


def _billed_embedding(c: _Compiled) -> bool:
    """Whether embedding ``c``'s texts now would send billed requests (API model, not stored)."""
    texts = [c.texts[r] for r in c.present]
    priced = api_cost(texts, {**c.settings, "embed_model": c.model})
    return priced is not None and priced.tokens > 0


def _links(c: _Compiled) -> _Links:
    """Embed ``dedup``'s column and find its links (once per compiled call: plan, estimate, run)."""
    memo = c.memo.get("links")
    if isinstance(memo, _Links):
        return memo
    assert c.threshold is not None
    low = c.llm.low if isinstance(c.llm, Verify) else c.threshold
    embedded = _embed(c, [[c.texts[r] for r in c.present]])
    rows = embedded.groups[0]
    index = index_for(embedded, 0, c.settings)
    if index.graph is None:
        found = pairs_above(rows, low)
    else:
        ids, sims = index.search(rows, DEDUP_NEIGHBOURS)
        hit = (sims >= np.float32(low)) & (ids >= 0)
        found = [
            (int(q), int(ids[q, j]), float(sims[q, j]))
            for q, j in zip(*np.nonzero(hit), strict=True)
        ]
    cut = float(np.float32(c.threshold))  # as the search compares: in float32
    links = [(a, b) for a, b, s in found if s >= cut]
    asked: list[tuple[int, int]] = []
    if isinstance(c.llm, Verify):
        linked = components(len(c.present), links)
        unsure = {(min(a, b), max(a, b)) for a, b, s in found if s < cut and a != b}
        asked = [(c.present[a], c.present[b]) for a, b in sorted(unsure) if linked[a] != linked[b]]
    result = _Links(embedded, links, asked, index.graph is not None)
    c.memo["links"] = result
    return result


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
        label: bool | str | None = None,
        label_out: str | None = None,
        label_sample: int | None = None,
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
        step = None
        if _off(label):
            _unused("label_out", label_out, "label")
            _unused("label_sample", label_sample, "label")
        else:
            llm_cfg = config(**settings)
            step = compile_label(frame, label, label_out, label_sample, columns, llm_cfg, [out])
            _check_llm(llm_cfg, "label", out)
        texts, present = _texts(frame, columns)
        if k > len(present):
            msg = (
                f"k={k} clusters, but only {len(present)} rows have text in {columns}; "
                f"k must be between 1 and {len(present)}."
            )
            raise InputError(msg)
        return _Compiled(
            self.name, frame, texts, present, cfg, model, k=k, out=out, seed=seed, llm=step
        )

    def plan(self, c: _Compiled) -> EmbeddingPlan:
        """The embedding work; with ``label=``, the naming requests over stand-in samples."""
        if isinstance(c.llm, Label):
            assert c.k is not None
            return replace(c.plan(), llm=stand_in_plan(c.llm, c.present, c.k))
        return c.plan()

    def estimate(self, c: _Compiled, *, probe: int) -> Estimate:
        """Zero requests; with ``label=``, ``k`` naming requests (the longest rows stand in)."""
        if isinstance(c.llm, Label):
            assert c.k is not None
            return _with_llm(c, label_estimate(c.llm, c.present, c.k, probe=probe))
        return _estimate(c)

    def run(self, c: _Compiled, runner: Runner) -> Output:
        """Spherical k-means on the embeddings; ids in order of first row; names with ``label=``."""
        assert c.k is not None
        if isinstance(c.llm, Label):
            _llm_backend(c.llm.settings)
        embedded = _embed(c, [[c.texts[r] for r in c.present]])
        _charge(c, runner, embedded)
        labels, centroids = kmeans(embedded.groups[0], c.k, seed=c.seed)
        values: list[int | None] = [None] * c.frame.height
        for r, label in zip(c.present, labels, strict=True):
            values[r] = label
        counts = {"rows": c.frame.height, "clusters": len(set(labels))}
        if not isinstance(c.llm, Label):
            runner.finish(**counts, **embedded.counts())
            return Output(columns=(NewColumn(c.out, values, "int"),))
        step = c.llm
        samples, firsts, sizes = _samples(
            embedded.groups[0], labels, centroids, c.present, step.sample
        )
        outcomes = run_labels(step, runner, samples, c.frame.labels, sizes)
        names, errors = label_columns(step, outcomes, values, firsts, c.frame.labels)
        runner.finish(**counts, named=len(outcomes) - len(errors), **embedded.counts())
        output = Output(columns=(NewColumn(c.out, values, "int"), *names))
        if errors and step.settings["errors"] != "keep":
            raise RowErrors(errors, output, total=len(outcomes))
        return output


def _samples(
    rows: Rows,
    labels: Sequence[int],
    centroids: np.ndarray[Any, np.dtype[np.float32]],
    present: Sequence[int],
    size: int,
) -> tuple[list[list[int]], list[int], list[int]]:
    """Each cluster's sample, first row and size.

    A sample is the cluster's ``size`` members nearest its centroid, as frame
    positions in row order.
    """
    ids = np.asarray(labels, dtype=np.int64)
    near = np.empty(len(ids), dtype=np.float32)
    for start, block in blocks(rows):
        own = centroids[ids[start : start + len(block)]]
        near[start : start + len(block)] = np.einsum("ij,ij->i", block, own)
    members: list[list[int]] = [[] for _ in range(len(centroids))]
    for i, cluster in enumerate(labels):
        members[cluster].append(i)
    samples = [
        sorted(present[i] for i in sorted(m, key=lambda i: (-float(near[i]), i))[:size])
        for m in members
    ]
    return samples, [present[m[0]] for m in members], [len(m) for m in members]


SEARCH = Search()
SIM_JOIN = SimJoin()
DEDUP = Dedup()
CLUSTER = Cluster()
