"""The LLM steps of the embedding operators: re-ranking, verifying pairs, naming clusters.

Each is optional and off by default (the embedding operators then send no LLM
request, :mod:`semframe.operators.similarity`). Each is one or more
relQueries run through the operator call's
:class:`~semframe.runtime.call.Runner`, so retries, the result cache, the
budget, ``last_op()`` and every backend work as for the other operators:

- ``search(rerank=...)``: the ``candidates`` rows the embeddings find are
  ranked by ``topk``'s pairwise comparisons (:func:`~semframe.operators.topk.rank`);
  the result is the top ``k``, best first.
- ``dedup(verify=...)``: pairs whose similarity falls in the band
  ``[threshold - band, threshold)`` are asked "do A and B describe the same
  thing?" in one relQuery (pairs at or above ``threshold`` link without
  asking, as ``join`` asks its blocked pairs); pairs the model confirms link.
- ``cluster(label=...)``: one request per cluster shows a sample of its
  members (those nearest its centroid) and asks for a short name.

The question each step asks is ``True`` (a built-in one) or a template: its
``{column}`` placeholders name the columns shown to the model (any column of
the frame); a question that names no column is shown the operator's
``column``. This module holds what needs no embedding (compiling, planning
and estimating from stand-in rows, turning answers into results);
:mod:`semframe.operators.similarity` runs the embeddings and calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from semframe.config import ResolvedConfig
from semframe.core.frames import Frame, NewColumn
from semframe.core.ordering import Ordering
from semframe.core.parse import BOOL, TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import MISSING, Table, fence
from semframe.core.template import Template, compile_template, parse_template
from semframe.core.wire import Outcome
from semframe.cost.estimate import Estimate
from semframe.errors import InputError, RowError
from semframe.operators.common import check_error_column, check_new_columns, describe
from semframe.operators.topk import TOPK, Ranking, TopkCall, TopkPlan, compile_topk, rank
from semframe.runtime.call import Call, Runner
from semframe.runtime.estimate import estimate_call, estimate_plan

__all__ = [
    "LABEL_MAX_TOKENS",
    "LABEL_SAMPLE",
    "MEMBERS",
    "VERIFY_BAND",
    "VERIFY_MAX_TOKENS",
    "Label",
    "Rerank",
    "Verdicts",
    "Verify",
    "compile_label",
    "compile_rerank",
    "compile_verify",
    "label_columns",
    "label_estimate",
    "label_plan",
    "rerank_estimate",
    "rerank_plan",
    "run_labels",
    "run_rerank",
    "run_verify",
    "stand_in_plan",
    "verify_estimate",
    "verify_plan",
    "with_llm",
]

VERIFY_BAND = 0.1
"""Default width of ``dedup``'s uncertain band below ``threshold``."""
VERIFY_MAX_TOKENS = 32
"""``max_tokens`` of a pair question (a yes/no JSON answer, as ``join``)."""
LABEL_SAMPLE = 8
"""Default members shown per cluster when naming it."""
LABEL_MAX_TOKENS = 32
"""``max_tokens`` of a cluster's name (a few words)."""

_VERIFY_DEFAULT = "Do they describe the same thing (duplicates of one record)? Compare their {}."
_VERIFY_HEAD = "Two items, A and B, follow. "
_LABEL_DEFAULT = (
    "Give a short name (two to five words) for what these items have in common, "
    "judged from their {}."
)
_LABEL_NOTE = "Answer with the name only."
_RERANK_DEFAULT = "Most relevant to the search query: {}. Judge from {}."
MEMBERS = "items"
"""The field of a cluster's name request that holds its sample of members."""


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _question(
    frame: Frame, spec: object, what: str, columns: Sequence[str], default: str
) -> Template:
    """The question of an LLM step (``True`` or a template), checked against the frame."""
    if spec is True:
        shown = ", ".join("{" + c + "}" for c in columns)
        text = default.format(shown)
    elif isinstance(spec, str) and spec.strip():
        text = spec
        if not parse_template(spec, require_fields=False).fields:
            text = spec.rstrip() + " " + " ".join("{" + c + "}" for c in columns)
    else:
        msg = (
            f"{what} must be True (the built-in question), a question template "
            "(its {column} placeholders name the columns shown; without any, the operator's "
            f"column is shown), or None (no LLM step); got {spec!r}."
        )
        raise InputError(msg)
    return compile_template(text, frame.columns)


def _positive(value: object, name: str, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{name} must be a positive int ({meaning}), got {value!r}."
        raise InputError(msg)
    return value


def _longest(table: Table, rows: Sequence[int], n: int) -> list[int]:
    """The ``n`` rows of ``rows`` with the longest cells in ``table`` (ties: earlier first)."""
    size = {r: sum(len(table.cells[c][r]) for c in table.columns) for r in rows}
    return sorted(rows, key=lambda r: (-size[r], r))[:n]


# -- search(rerank=...) ---------------------------------------------------------------


@dataclass(frozen=True)
class Rerank:
    """``search``'s re-ranking: ``topk`` over the candidates the embeddings find.

    Attributes
    ----------
    topk : TopkCall
        The comparisons' criterion, over every row of the frame.
    candidates : int
        Rows the embeddings retrieve for the LLM to rank.
    """

    topk: TopkCall
    candidates: int


def compile_rerank(  # noqa: PLR0917
    frame: Frame,
    spec: object,
    candidates: object,
    query: str,
    columns: Sequence[str],
    k: int,
    settings: Mapping[str, Any],
) -> Rerank:
    """Validate ``rerank=`` and ``candidates=``; sends nothing.

    ``candidates`` defaults to ``3 * k``; it must be at least ``k``. ``settings``
    are the call's setting arguments (resolved as ``topk`` resolves them).
    """
    if candidates is None:
        candidates = 3 * k
    n = _positive(candidates, "candidates", "rows the embeddings retrieve for the LLM to rank")
    if n < k:
        msg = f"candidates={n} must be at least k={k} (the LLM ranks the candidates, keeps k)."
        raise InputError(msg)
    shown = ", ".join("{" + c + "}" for c in columns)
    if spec is True:
        text = _RERANK_DEFAULT.format(_escape(repr(query)), shown)
    else:
        text = _question(frame, spec, "rerank", columns, "").text
    tk = compile_topk(frame, text, k=k, **settings)
    return Rerank(tk, n)


def _stand_in(r: Rerank, present: Sequence[int]) -> TopkCall:
    """The ranking priced before anything is embedded: the longest rows stand in."""
    rows = _longest(r.topk.table, present, min(r.candidates, len(present)))
    return replace(r.topk, table=r.topk.table.take(sorted(rows)))


def rerank_plan(r: Rerank, present: Sequence[int]) -> TopkPlan:
    """``topk``'s plan over stand-in candidates (the longest rows; the real ones are embedded)."""
    return TOPK.plan(_stand_in(r, present))


def rerank_estimate(r: Rerank, present: Sequence[int], *, probe: int) -> Estimate:
    """``topk``'s estimate over the longest ``candidates`` rows (the real ones need embeddings)."""
    est = TOPK.estimate(_stand_in(r, present), probe=probe)
    note = (
        f"re-ranking priced on the {min(r.candidates, len(present)):,} longest rows standing "
        "in for the candidates (known once embedded): an upper bound on prompt tokens"
    )
    return replace(est, notes=(*est.notes, note))


def run_rerank(
    r: Rerank, runner: Runner, candidates: Sequence[int], labels: Sequence[object]
) -> Ranking:
    """Rank ``candidates`` (frame positions); positions in the result are the frame's."""
    tk = replace(r.topk, table=r.topk.table.take(candidates))
    ranking = rank(tk, runner, [labels[c] for c in candidates])
    errors = tuple(replace(e, row=candidates[e.row]) for e in ranking.errors)
    return Ranking(tuple(candidates[i] for i in ranking.ranked), errors, ranking.comparisons)


# -- dedup(verify=...) -----------------------------------------------------------------


@dataclass(frozen=True)
class Verify:
    """``dedup``'s verification of uncertain pairs.

    Attributes
    ----------
    template : Template
        The pair question; its fields are ``A.<col>`` then ``B.<col>``.
    table : Table
        The question's columns, every row of the frame.
    low : float
        Pairs at least this similar (and below ``threshold``) are asked.
    settings : ResolvedConfig
        The call's settings.
    """

    template: Template
    table: Table
    low: float
    settings: ResolvedConfig


def compile_verify(  # noqa: PLR0917
    frame: Frame,
    spec: object,
    band: object,
    threshold: float,
    columns: Sequence[str],
    settings: ResolvedConfig,
) -> Verify:
    """Validate ``verify=`` and ``band=``; sends nothing."""
    if band is None:
        band = VERIFY_BAND
    if (
        isinstance(band, bool)
        or not isinstance(band, int | float)
        or not 0.0 < float(band) <= threshold
    ):
        msg = (
            f"band must be a similarity width in (0, threshold={threshold}] (pairs at least "
            f"threshold - band similar, below threshold, are asked), got {band!r}."
        )
        raise InputError(msg)
    question = _question(frame, spec, "verify", columns, _VERIFY_DEFAULT)
    check_error_column(frame, settings, "llm_error")
    fields = tuple(f"{side}.{f}" for side in "AB" for f in question.fields)
    template = Template(question.text, (_VERIFY_HEAD, *question.parts), fields)
    return Verify(template, frame.table(question.fields), threshold - float(band), settings)


def verify_plan(v: Verify, pairs: Sequence[tuple[int, int]]) -> Plan:
    """One relQuery asking every pair ``(a, b)`` (frame positions, grouped by ``a``)."""
    data: dict[str, tuple[str, ...]] = {}
    for f in v.table.columns:
        col = v.table.cells[f]
        data[f"A.{f}"] = tuple(col[a] for a, _ in pairs)
        data[f"B.{f}"] = tuple(col[b] for _, b in pairs)
    table = Table(v.template.fields, data, len(pairs))
    rq = RelQuery(
        "dedup",
        v.template,
        table,
        BOOL,
        None,
        (),
        VERIFY_MAX_TOKENS,
        v.settings["temperature"],
    )
    return make_plan(rq, Ordering.identity(len(pairs), v.template.fields), "pair-first")


def verify_estimate(v: Verify, pairs: Sequence[tuple[int, int]], *, probe: int) -> Estimate:
    """The pairs relQuery's estimate (pairs the result cache answers are not counted)."""
    return estimate_call(verify_plan(v, pairs), v.settings, op="dedup", probe=probe)


@dataclass(frozen=True)
class Verdicts:
    """The model's answers on the uncertain pairs.

    Attributes
    ----------
    confirmed : tuple of (int, int)
        Pairs answered yes (frame positions).
    refused : int
        Pairs answered no.
    errors : tuple of RowError
        Pairs that failed (after the retries), named by their first row.
    reasons : dict of int to str
        Per frame row, why its pairs failed (``errors="keep"``).
    """

    confirmed: tuple[tuple[int, int], ...]
    refused: int
    errors: tuple[RowError, ...]
    reasons: dict[int, str]


def run_verify(
    v: Verify, runner: Runner, pairs: Sequence[tuple[int, int]], labels: Sequence[object]
) -> Verdicts:
    """Ask every pair once; a failed pair links nothing and is reported."""
    if not pairs:
        return Verdicts((), 0, (), {})
    call = Call(
        [f"pair of rows {labels[a]!r} and {labels[b]!r}" for a, b in pairs],
        v.settings,
        verify_plan(v, pairs),
    )
    outcomes = runner.run(call)
    confirmed: list[tuple[int, int]] = []
    errors: list[RowError] = []
    reasons: dict[int, list[str]] = {}
    refused = 0
    for (a, b), o in zip(pairs, outcomes, strict=True):
        if o.error_kind is not None:
            message = f"pair with row {labels[b]!r}: {o.error}"
            errors.append(RowError(a, labels[a], o.error_kind, message, o.attempts))
            for row, other in ((a, b), (b, a)):
                why = f"pair with row {labels[other]!r}: {describe(o)}"
                reasons.setdefault(row, []).append(why)
        elif o.value is True:
            confirmed.append((a, b))
        else:
            refused += 1
    joined = {r: "; ".join(texts) for r, texts in reasons.items()}
    return Verdicts(tuple(confirmed), refused, tuple(errors), joined)


# -- cluster(label=...) ---------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    """``cluster``'s naming step: one request per cluster.

    Attributes
    ----------
    template : Template
        The naming question; its one field holds the sample of members.
    table : Table
        The question's columns, every row of the frame.
    out : str
        The name column.
    sample : int
        Members shown per cluster (those nearest its centroid).
    settings : ResolvedConfig
        The call's settings.
    """

    template: Template
    table: Table
    out: str
    sample: int
    settings: ResolvedConfig


def compile_label(  # noqa: PLR0917
    frame: Frame,
    spec: object,
    out: object,
    sample: object,
    columns: Sequence[str],
    settings: ResolvedConfig,
    taken: Sequence[str],
) -> Label:
    """Validate ``label=``, ``label_out=`` and ``label_sample=``; sends nothing."""
    question = _question(frame, spec, "label", columns, _LABEL_DEFAULT)
    n = _positive(
        LABEL_SAMPLE if sample is None else sample, "label_sample", "members shown per cluster"
    )
    name = "cluster_label" if out is None else out
    if not isinstance(name, str):
        msg = f"label_out must be a non-empty column name, got {name!r}."
        raise InputError(msg)
    check_new_columns(frame, [name], "label_out")
    if name in taken:
        msg = f"label_out={name!r} is also the cluster id column; choose another name."
        raise InputError(msg)
    if settings["errors"] == "keep":
        check_new_columns(frame, [f"{name}_error"], "the error column")
    template = Template(question.text, (*question.parts, "\n" + _LABEL_NOTE), (MEMBERS,))
    return Label(template, frame.table(question.fields), name, n, settings)


def _members(label: Label, rows: Sequence[int]) -> str:
    """A cluster's sample as the request shows it: each item's fields indented under it."""
    lines: list[str] = []
    table = label.table
    for n, r in enumerate(rows, 1):
        lines.append(f"item {n}:")
        lines.extend(
            f"  {f}: {fence(table.cells[f][r])}"
            for f in table.columns
            if table.cells[f][r] != MISSING
        )
    return "\n" + "\n".join(lines)


def label_plan(label: Label, samples: Sequence[Sequence[int]]) -> Plan:
    """One request per cluster, showing its sample (frame positions, in row order)."""
    table = Table((MEMBERS,), {MEMBERS: tuple(_members(label, s) for s in samples)}, len(samples))
    rq = RelQuery(
        "cluster",
        label.template,
        table,
        TEXT,
        None,
        (),
        LABEL_MAX_TOKENS,
        label.settings["temperature"],
    )
    return make_plan(rq, Ordering.identity(len(samples), (MEMBERS,)), "none")


def _stand_in_samples(label: Label, present: Sequence[int], k: int) -> list[list[int]]:
    """Samples priced before anything is embedded: the longest rows, dealt to ``k`` clusters."""
    longest = _longest(label.table, present, min(k * label.sample, len(present)))
    samples: list[list[int]] = [[] for _ in range(k)]
    for i, r in enumerate(longest):
        samples[i % k].append(r)
    return [sorted(s) for s in samples]


def label_estimate(label: Label, present: Sequence[int], k: int, *, probe: int) -> Estimate:
    """``k`` requests, priced with the longest rows standing in for each cluster's sample."""
    plan = label_plan(label, _stand_in_samples(label, present, k))
    note = (
        f"cluster names priced with the {min(k * label.sample, len(present)):,} longest rows "
        "standing in for the clusters' samples (known once embedded): an upper bound on "
        "prompt tokens"
    )
    return estimate_plan(plan, label.settings, op="cluster", probe=probe, notes=(note,))


def stand_in_plan(label: Label, present: Sequence[int], k: int) -> Plan:
    """The naming plan over stand-in samples (what ``df.llm.plan`` shows before embedding)."""
    return label_plan(label, _stand_in_samples(label, present, k))


def run_labels(
    label: Label,
    runner: Runner,
    samples: Sequence[Sequence[int]],
    labels: Sequence[object],
    sizes: Sequence[int],
) -> Sequence[Outcome]:
    """Ask one name per cluster; outcomes in cluster order."""
    call = Call(
        [
            f"cluster {c} ({sizes[c]} rows, first row {labels[s[0]]!r})"
            for c, s in enumerate(samples)
        ],
        label.settings,
        label_plan(label, samples),
    )
    return runner.run(call)


def label_columns(
    label: Label,
    outcomes: Sequence[Outcome],
    ids: Sequence[int | None],
    firsts: Sequence[int],
    labels: Sequence[object],
) -> tuple[list[NewColumn], list[RowError]]:
    """Each row's cluster name (and error column with ``errors="keep"``), and the failures."""
    names = [None if o.error_kind is not None else str(o.value) for o in outcomes]
    columns = [NewColumn(label.out, [None if c is None else names[c] for c in ids])]
    errors = [
        RowError(
            firsts[c],
            labels[firsts[c]],
            o.error_kind,
            f"name of cluster {c}: {o.error}",
            o.attempts,
        )
        for c, o in enumerate(outcomes)
        if o.error_kind is not None
    ]
    if label.settings["errors"] == "keep":
        why = [None if o.error_kind is None else describe(o) for o in outcomes]
        kept = [None if c is None else why[c] for c in ids]
        columns.append(NewColumn(f"{label.out}_error", kept))
    return columns, errors


# -- estimates: the embeddings' and the LLM's together ----------------------------------


def with_llm(base: Estimate, llm: Estimate) -> Estimate:
    """The embedding estimate ``base`` with its LLM step ``llm`` added (run after it).

    The backend, model, prices and order are the LLM step's; counts and
    dollars add up; the wall time is the LLM step's plus the embeddings' where
    that is modelled.

    Examples
    --------
    >>> from semframe.cost.estimate import Figures
    >>> from semframe.cost.pricing import Cost
    >>> none = Figures(0, 0, 0, 0, 0, 0, Cost(), 0.0, None)
    >>> base = Estimate("dedup", "embedding", "tfidf", "none", 4, none, none)
    >>> llm_figures = Figures(3, 90, 0, 0, 12, 96, None, None, 1.5)
    >>> llm = Estimate("dedup", "fake", "fake-model", "pair-first", 3, llm_figures, llm_figures)
    >>> both = with_llm(base, llm)
    >>> both.requests, both.tokens, both.backend, both.dollars, both.planned.wall_seconds
    (3, 102, 'fake', 0.0, 1.5)
    """
    return replace(
        llm,
        op=base.op,
        planned=base.planned.then(llm.planned),
        original=base.original.then(llm.original),
        notes=(*base.notes, *llm.notes),
        seconds_to_estimate=base.seconds_to_estimate + llm.seconds_to_estimate,
    )
