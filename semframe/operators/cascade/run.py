"""Running and pricing a cascade: the operator, its reports, calibration on the models.

:class:`CascadeOperator` is what ``cascade=`` on ``filter``/``classify``/``extract``
runs: each stage over the rows the stages before were unsure of, reported as a
:class:`CascadeReport` (:func:`last_cascade`). :func:`answer_all` runs every stage
on every row for :func:`calibrate`; :func:`estimate_cascade` prices a plan.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from semframe.core.frames import Frame, NewColumn, Output
from semframe.core.parse import record_spec
from semframe.core.wire import Outcome
from semframe.cost.estimate import Estimate
from semframe.errors import InputError
from semframe.operators.cascade.confidence import _YES_NO, agreement, answer_confidence
from semframe.operators.cascade.stages import CASCADE_OPS, CascadePlan, Metric, Stage, as_plan
from semframe.operators.cascade.thresholds import calibrate_profiles
from semframe.operators.common import LOGPROB_BACKENDS, TOP_LOGPROBS, check_new_columns
from semframe.operators.rowwise import CLASSIFY, EXTRACT, FILTER, RowwiseCall
from semframe.runtime.call import Call, Runner, backend_of, with_logprobs
from semframe.runtime.estimate import estimate_plan
from semframe.runtime.stats import RunStats, last_op


@dataclass(frozen=True)
class StageAnswers:
    """One stage's answers on a set of rows: values and confidences, row-aligned.

    ``values[i]`` is ``None`` for a row the stage did not answer (failed).
    """

    stage: str
    values: tuple[object, ...]
    confidences: tuple[float | None, ...]
    runs: tuple[RunStats, ...] = ()


@dataclass(frozen=True)
class StageReport:
    """What one stage of a cascade run did."""

    stage: str
    rows_in: int
    answered: int
    runs: tuple[RunStats, ...]

    @property
    def dollars(self) -> float | None:
        """Billed dollars of the stage (``None`` where the model has no price)."""
        priced = [r.dollars for r in self.runs if r.dollars is not None]
        return sum(priced) if priced else None

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens sent by the stage."""
        return sum(r.prompt_tokens for r in self.runs)

    @property
    def wall_seconds(self) -> float:
        """Wall time of the stage's runs."""
        return sum(r.wall_seconds for r in self.runs)


@dataclass(frozen=True)
class CascadeReport:
    """A cascade run: rows in, rows answered and cost per stage (``last_cascade()``)."""

    op: str
    rows: int
    stages: tuple[StageReport, ...]
    thresholds: tuple[float, ...]

    @property
    def escalated(self) -> float:
        """Share of rows the first stage did not answer."""
        return 1.0 - self.stages[0].answered / self.rows if self.rows else 0.0

    def __repr__(self) -> str:
        lines = [f"CascadeReport({self.op}, {self.rows} rows, escalated {self.escalated:.1%}:"]
        for s in self.stages:
            money = "-" if s.dollars is None else f"${s.dollars:.4f}"
            lines.append(
                f"  {s.stage}: {s.rows_in} in, {s.answered} answered, "
                f"{s.prompt_tokens:,} prompt tok, {money}, {s.wall_seconds:.1f} s"
            )
        return "\n".join(lines) + ")"


def last_cascade() -> CascadeReport | None:
    """The report of the most recent cascade run (``semframe.last_op().detail``)."""
    op = last_op()
    detail = op.detail if op is not None else None
    return detail if isinstance(detail, CascadeReport) else None


@dataclass(frozen=True)
class _Spec:
    """What a cascade needs to know about its operator: compile a stage, read a confidence."""

    op: str
    labels: tuple[str, ...]
    compile: Callable[[Frame, Mapping[str, Any]], RowwiseCall]


def _stage_settings(stage: Stage, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(kwargs)
    merged.update(stage.settings)
    merged["backend"] = stage.backend
    merged["model"] = stage.model
    if stage.samples > 1:
        merged["temperature"] = stage.temperature
    return merged


def _logprobs(compiled: RowwiseCall) -> RowwiseCall:
    return dataclasses.replace(compiled, call=with_logprobs(compiled.call, TOP_LOGPROBS))


def _spec(op: str, template: str, extra: Mapping[str, Any]) -> _Spec:
    needs = {"classify": "labels", "extract": "schema"}.get(op)
    if needs is not None and needs not in extra:
        msg = (
            f"a cascade of {op} needs the {op} argument {needs!r} "
            f"(calibrate(..., extra={{{needs!r}: ...}}))."
        )
        raise InputError(msg)
    if op == "filter":
        return _Spec(op, _YES_NO, lambda f, kw: _logprobs(FILTER.compile(f, template, **kw)))
    if op == "classify":
        labels = extra["labels"]
        if extra.get("multi"):
            msg = (
                "cascade= needs a single label per row (multi=False): the confidence of a "
                "set of labels is not defined here."
            )
            raise InputError(msg)
        if extra.get("confidence"):
            msg = "cascade= and confidence=True do not combine; the cascade reports its stages."
            raise InputError(msg)
        out = extra.get("out", "label")
        return _Spec(
            op,
            tuple(cast("Sequence[str]", labels)),
            lambda f, kw: CLASSIFY.compile(
                f, template, labels=labels, out=out, confidence=True, **kw
            ),
        )
    if op == "extract":
        schema = extra["schema"]
        return _Spec(
            op, (), lambda f, kw: _logprobs(EXTRACT.compile(f, template, schema=schema, **kw))
        )
    msg = f"cascade= works with {', '.join(CASCADE_OPS)}; not with {op!r}."
    raise InputError(msg)


def check_stages(plan: CascadePlan, compiled: Sequence[RowwiseCall]) -> None:
    """Fail before any request unless every stage can say how confident it is.

    Every stage but the last needs a backend reporting logprobs, or
    ``samples > 1``; no stage may use ``batch=True``.
    """
    for i, (stage, call) in enumerate(zip(plan.stages, compiled, strict=True)):
        cfg = call.settings
        if cfg["batch"]:
            msg = f"cascade stage {i} ({stage.name}): batch=True is not supported in a cascade."
            raise InputError(msg)
        backend = backend_of(cfg)
        if i == len(plan.stages) - 1 or stage.samples > 1:
            continue
        if not backend.capabilities.logprobs:
            msg = (
                f"cascade stage {i} ({stage.name}) must report a confidence, but backend "
                f"{backend.name!r} gives no token logprobs. Use a backend that does "
                f"({', '.join(LOGPROB_BACKENDS)}), or sample for agreement: "
                f"{{'backend': {stage.backend!r}, 'model': {stage.model!r}, 'samples': 5}}."
            )
            raise InputError(msg)


def _prepare(
    frame: Frame,
    template: str,
    op: str,
    *,
    plan: CascadePlan,
    kwargs: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> tuple[_Spec, list[RowwiseCall]]:
    spec = _spec(op, template, extra)
    compiled = [spec.compile(frame, _stage_settings(s, kwargs)) for s in plan.stages]
    check_stages(plan, compiled)
    return spec, compiled


def _answer_stage(
    spec: _Spec, stage: Stage, call: Call, runner: Runner
) -> tuple[Sequence[Outcome], list[float | None]]:
    if stage.samples == 1:
        outcomes = runner.run(call)
        return outcomes, [answer_confidence(spec.op, o, spec.labels) for o in outcomes]
    samples = [runner.run(call) for _ in range(stage.samples)]
    picked = [agreement(list(row)) for row in zip(*samples, strict=True)]
    return [o for o, _ in picked], [c for _, c in picked]


def answer_all(
    frame: Any,
    template: str,
    op: str,
    cascade: object,
    extra: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> list[StageAnswers]:
    """Every stage's answers and confidences on every row (for calibration).

    Each stage runs as one relQuery over all rows, with its own reordering.
    """
    plan = as_plan(cascade, None)
    spec, compiled = _prepare(
        Frame.of(frame), template, op, plan=plan, kwargs=kwargs, extra=extra or {}
    )
    out = []
    for stage, compiled_stage in zip(plan.stages, compiled, strict=True):
        runner = Runner(op)
        outcomes, confs = _answer_stage(spec, stage, compiled_stage.call, runner)
        out.append(
            StageAnswers(
                stage.name,
                tuple(o.value if o.error_kind is None else None for o in outcomes),
                tuple(confs),
                tuple(runner.runs),
            )
        )
    return out


@dataclass(frozen=True)
class CascadeCall:
    """A compiled cascade: each stage's compiled call over every row."""

    plan: CascadePlan
    spec: _Spec
    stages: tuple[RowwiseCall, ...]
    stage_column: str | None


class CascadeOperator:
    """``cascade=`` on ``filter``, ``classify`` or ``extract``: the operator run as a cascade.

    Examples
    --------
    >>> import math
    >>> import pandas as pd
    >>> from semframe.backends import get_backend
    >>> from semframe.operators.cascade import TokenLogprob, last_cascade
    >>> small = get_backend("fake", model="doc-small", settings={})
    >>> small.set_logprobs(lambda r, text: [  # unsure about "meh"
    ...     TokenLogprob(text, math.log(0.55 if "meh" in r.prompt else 0.99))])
    >>> df = pd.DataFrame({"review": ["a great film", "meh, good enough", "dull"]})
    >>> out = df.llm.filter("Is {review} positive?", cascade=["fake/doc-small", "fake/doc-big"],
    ...                     thresholds=[0.9])
    >>> out
                 review       llm_stage
    0      a great film  fake/doc-small
    1  meh, good enough    fake/doc-big
    >>> [(s.stage, s.rows_in, s.answered) for s in last_cascade().stages]
    [('fake/doc-small', 3, 2), ('fake/doc-big', 1, 1)]
    """

    def __init__(self, base: Any) -> None:
        if base.name not in CASCADE_OPS:
            msg = f"cascade= works with {', '.join(CASCADE_OPS)}; not with {base.name!r}."
            raise InputError(msg)
        self.base = base
        self.name: str = base.name
        self.required: tuple[str, ...] = base.required

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        cascade: object,
        thresholds: Sequence[float] | None = None,
        stage_column: str | None = "llm_stage",
        **kwargs: Any,
    ) -> CascadeCall:
        """Compile every stage's call over all rows; send nothing."""
        extra: dict[str, Any] = {}
        for name in ("schema", "labels", "out", "multi", "confidence"):
            if name in kwargs:
                extra[name] = kwargs.pop(name)
        for name in ("backend", "model"):
            if kwargs.get(name) is not None:
                msg = f"{name}= and cascade= do not combine: each cascade stage names its {name}."
                raise InputError(msg)
            kwargs.pop(name, None)
        plan = as_plan(cascade, thresholds)
        spec, compiled = _prepare(frame, template, self.name, plan=plan, kwargs=kwargs, extra=extra)
        if stage_column is not None:
            check_new_columns(frame, [stage_column], "stage_column")
        return CascadeCall(plan, spec, tuple(compiled), stage_column)

    def plan(self, compiled: CascadeCall) -> Any:
        """Each stage's plan over every row (later stages see only the rows escalated)."""
        return tuple(c.call.plan for c in compiled.stages)

    def estimate(self, compiled: CascadeCall, *, probe: int) -> Any:
        """The :class:`CascadeEstimate`: each stage priced for the rows expected to reach it."""
        return estimate_cascade(compiled.plan, compiled.stages, self.name)

    def run(self, compiled: CascadeCall, runner: Runner) -> Output:
        """Stage after stage, each over the rows the ones before were unsure of."""
        plan, spec = compiled.plan, compiled.spec
        first = compiled.stages[0]
        n = len(first.call.labels)
        final: list[Outcome | None] = [None] * n
        stage_of: list[int] = [len(plan.stages) - 1] * n
        pending = list(range(n))
        reports = []
        for s, stage in enumerate(plan.stages):
            if not pending:
                reports.append(StageReport(stage.name, 0, 0, ()))
                continue
            call = compiled.stages[s].call
            if len(pending) != n:
                call = call.take(pending)
            before = len(runner.runs)
            outcomes, confs = _answer_stage(spec, stage, call, runner)
            last = s == len(plan.stages) - 1
            still = []
            for pos, outcome, conf in zip(pending, outcomes, confs, strict=True):
                ok = outcome.error_kind is None
                if last or (ok and conf is not None and conf >= plan.thresholds[s]):
                    final[pos] = outcome
                    stage_of[pos] = s
                else:
                    still.append(pos)
            runs = tuple(runner.runs[before:])
            reports.append(StageReport(stage.name, len(pending), len(pending) - len(still), runs))
            pending = still
        outcomes_final = [
            o if o is not None else Outcome(None, None, "backend", "no stage", 0) for o in final
        ]
        report = CascadeReport(self.name, n, tuple(reports), plan.thresholds)
        runner.finish(
            detail=report,
            **{f"stage{i}_answered": r.answered for i, r in enumerate(reports)},
        )
        extra: list[NewColumn] = []
        if compiled.stage_column is not None:
            names = [plan.stages[s].name for s in stage_of]
            extra.append(NewColumn(compiled.stage_column, names))
        return self.base.output(first, outcomes_final, extra)  # type: ignore[no-any-return]


# -- estimating a cascade ------------------------------------------------------------


@dataclass(frozen=True)
class CascadeEstimate:
    """Expected cost of a cascade: each stage's estimate times the share reaching it.

    Attributes
    ----------
    stages : tuple of str
        Stage names.
    estimates : tuple of Estimate
        Each stage's estimate as if it answered every row (times its samples).
    reach : tuple of float
        Expected share of rows reaching each stage (from calibration; 1.0 for
        every stage without one: an upper bound).
    samples : tuple of int
        Samples per row of each stage.
    calibrated : bool
        Whether ``reach`` comes from calibration.
    """

    stages: tuple[str, ...]
    estimates: tuple[Estimate, ...]
    reach: tuple[float, ...]
    samples: tuple[int, ...]
    calibrated: bool

    @property
    def dollars(self) -> float | None:
        """Expected dollars (``None`` when no stage has a price)."""
        parts = [
            (e.dollars or 0.0) * r * k
            for e, r, k in zip(self.estimates, self.reach, self.samples, strict=True)
            if e.dollars is not None
        ]
        return sum(parts) if parts else None

    @property
    def tokens(self) -> float:
        """Expected input plus output tokens."""
        return sum(
            float(e.tokens) * r * k
            for e, r, k in zip(self.estimates, self.reach, self.samples, strict=True)
        )

    @property
    def requests(self) -> float:
        """Expected requests."""
        return sum(
            float(e.requests) * r * k
            for e, r, k in zip(self.estimates, self.reach, self.samples, strict=True)
        )

    def __repr__(self) -> str:
        lines = [
            "CascadeEstimate("
            + (
                "calibrated"
                if self.calibrated
                else "uncalibrated: every stage priced for every row"
            )
        ]
        for name, e, r, k in zip(
            self.stages, self.estimates, self.reach, self.samples, strict=True
        ):
            money = "-" if e.dollars is None else f"${e.dollars * r * k:,.4f}"
            lines.append(f"  {name}: reach {r:.1%} x {k}, {e.tokens * r * k:,.0f} tok, {money}")
        total = "-" if self.dollars is None else f"${self.dollars:,.4f}"
        lines.append(f"  expected: {self.tokens:,.0f} tok, {total})")
        return "\n".join(lines)


def estimate_cascade(
    plan: CascadePlan, compiled: Sequence[RowwiseCall], op: str
) -> CascadeEstimate:
    """Price a cascade from each stage's estimate and the calibrated escalation shares."""
    estimates = tuple(estimate_plan(c.call.plan, c.settings, op=op) for c in compiled)
    return CascadeEstimate(
        tuple(s.name for s in plan.stages),
        estimates,
        plan.reach,
        tuple(s.samples for s in plan.stages),
        plan.calibration is not None,
    )


# -- calibration that runs the models ------------------------------------------------


def calibrate(
    frame: Any,
    template: str,
    *,
    op: str,
    cascade: object,
    labels: Sequence[object] | str | None = None,
    sample: int = 100,
    target_accuracy: float | None = None,
    target_precision: float | None = None,
    target_recall: float | None = None,
    level: float = 0.95,
    holdout: float = 0.5,
    seed: int = 0,
    costs: Sequence[float] | None = None,
    dry_run: bool = False,
    extra: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Run every stage on labeled rows and choose thresholds meeting a target.

    Parameters
    ----------
    frame : DataFrame
        The rows to calibrate on.
    template : str
        The operator's template.
    op : {"filter", "classify", "extract"}
        The operator.
    cascade : list of stages or CascadePlan
        The cascade.
    labels : sequence or str, optional
        The true answer of every row of ``frame`` (a column name, or values
        aligned with the rows: bools for ``filter``, labels for ``classify``,
        mappings for ``extract``). Without labels, a seeded random ``sample`` of
        rows is answered by the last (largest) stage and its answers are the
        labels; the target is then agreement with that model.
    sample : int
        Rows to label with the last stage when ``labels`` is None.
    target_accuracy, target_precision, target_recall : float
        Exactly one; precision and recall are for ``filter`` (positive = yes).
    level : float
        Confidence of the lower bound the target must clear.
    holdout : float
        Share of the labeled rows kept out of calibration to report on.
    seed : int
        Seed of the sample and the split.
    costs : sequence of float, optional
        Relative cost of a row at each stage (default ``1, 10, 100...``).
    dry_run : bool
        Return the :class:`CascadeEstimate` of the calibration run itself
        (every stage on every calibration row) instead of running it.
    extra : mapping, optional
        The operator's own arguments: ``labels``/``out`` for classify,
        ``schema`` for extract.

    Returns
    -------
    CascadePlan
        The stages with the chosen thresholds and the :class:`Calibration`.

    Examples
    --------
    >>> import math
    >>> import pandas as pd
    >>> from semframe.backends import get_backend
    >>> from semframe.backends.fake import default_answer
    >>> from semframe.operators.cascade import TokenLogprob, calibrate
    >>> small = get_backend("fake", model="cal-small", settings={})
    >>> small.responder = lambda r: (  # wrong, and unsure, on the "ok" rows
    ...     '{"answer": "no"}' if "ok" in r.prompt else default_answer(r))
    >>> small.set_logprobs(lambda r, text: [
    ...     TokenLogprob(text, math.log(0.6 if "ok" in r.prompt else 0.99))])
    >>> df = pd.DataFrame({"review": ["great"] * 40 + ["ok, good"] * 20 + ["awful"] * 40})
    >>> truth = [True] * 60 + [False] * 40
    >>> plan = calibrate(df, "Is {review} positive?", op="filter",
    ...                  cascade=["fake/cal-small", "fake/cal-large"], labels=truth,
    ...                  target_accuracy=0.9)
    >>> plan.thresholds, round(plan.calibration.escalated, 2)
    ((0.99,), 0.18)
    """
    targets = {
        "accuracy": target_accuracy,
        "precision": target_precision,
        "recall": target_recall,
    }
    given = {k: v for k, v in targets.items() if v is not None}
    if len(given) != 1:
        msg = "give exactly one of target_accuracy=, target_precision=, target_recall=."
        raise InputError(msg)
    metric, target = next(iter(given.items()))
    if metric != "accuracy" and op != "filter":
        msg = f"target_{metric}= is for filter; use target_accuracy= for {op}."
        raise InputError(msg)
    plan = as_plan(cascade, None)
    edge = Frame.of(frame)
    n = edge.height
    eager = edge.data
    labels_from = "given"
    if labels is None:
        rows = sorted(random.Random(seed).sample(range(n), min(sample, n)))
        eager = edge.adapter.take(eager, rows)
        labels_from = plan.stages[-1].name
    elif isinstance(labels, str):
        if labels not in edge.columns:
            msg = f"labels={labels!r} is not a column; columns: {list(edge.columns)}."
            raise InputError(msg)
        labels = list(eager[labels])  # pandas and Polars columns alike: raw values
    if labels is not None and len(labels) != edge.adapter.height(eager):
        msg = f"labels has {len(labels)} values for {n} rows; give one per row."
        raise InputError(msg)
    if dry_run:
        _, compiled = _prepare(
            Frame.of(eager), template, op, plan=plan, kwargs=kwargs, extra=extra or {}
        )
        return estimate_cascade(CascadePlan(plan.stages, plan.thresholds), compiled, op)
    answers = answer_all(eager, template, op, plan, extra, **kwargs)
    if labels is None:
        labels = list(answers[-1].values)
    if op == "extract":
        labels = [_record(y, extra) for y in labels]
    result = calibrate_profiles(
        answers,
        list(labels),
        target=target,
        metric=cast("Metric", metric),
        level=level,
        holdout=holdout,
        seed=seed,
        costs=costs,
        labels_from=labels_from,
    )
    return CascadePlan(plan.stages, result.thresholds, result)


def _record(label: object, extra: Mapping[str, Any] | None) -> object:
    """An extract label (a mapping) as the tuple of field values extract answers with."""
    if not isinstance(label, Mapping):
        return label
    _, fields = record_spec((extra or {})["schema"])
    return tuple(label.get(f.name) for f in fields)
