"""The row-by-row operators: ``map``, ``filter``, ``extract``, ``classify``.

Each compiles one relQuery with one request per row (:func:`compile_relquery`),
runs it once, and turns the outcomes into new columns (or, for ``filter``, a
choice of rows). They differ only in the answer format and in how answers
become the result; :mod:`semframe.operators.cascade` reuses both.

What counts as an answer is the same for all four: an empty (or
whitespace-only) answer and one cut at ``max_tokens`` are asked again, then
reported as row errors (``RowErrors``, or the error column with
``errors="keep"``), never turned into a value. With ``truncated="keep"`` a
cut answer that still parses is kept and marked True in a bool column
(``<out>_truncated`` for ``map`` and ``classify``, ``llm_truncated`` for
``filter`` and ``extract``), added to every result of such a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from semframe.backends.base import Capabilities
from semframe.config import ResolvedConfig, config
from semframe.core.frames import Frame, NewColumn, Output
from semframe.core.ordering import Ordering
from semframe.core.parse import (
    BOOL,
    TEXT,
    FieldSpec,
    label_confidence,
    label_distribution,
    label_spec,
    record_spec,
)
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table
from semframe.core.wire import Outcome, values_of
from semframe.cost.estimate import Estimate
from semframe.errors import ConfigError, InputError, MissingDependencyError, RowErrors, plural
from semframe.operators import calibration
from semframe.operators.common import (
    TOP_LOGPROBS,
    check_logprobs,
    compile_relquery,
    describe,
    finish,
    row_errors,
    truncated_marks,
)
from semframe.runtime.call import Call, Recipe, Runner, backend_of, with_logprobs
from semframe.runtime.estimate import estimate_call

__all__ = [
    "CLASSIFY",
    "EXTRACT",
    "FILTER",
    "MAP",
    "Classify",
    "Extract",
    "Filter",
    "Map",
    "RowwiseCall",
]

_ROW_ARGS = ("max_tokens", "system", "examples", "truncate")
"""Keyword arguments every row-by-row operator passes to :func:`compile_relquery`."""


@dataclass(frozen=True)
class RowwiseCall:
    """A compiled row-by-row call: the frame it reads, its relQuery, what the result adds.

    Attributes
    ----------
    frame : Frame
        The caller's frame.
    call : Call
        The relQuery (one request per row).
    out : str
        The answer column (``map``, ``classify``), or ``""``.
    fields : tuple of FieldSpec
        ``extract``'s schema fields (its new columns).
    confidence : tuple of str
        ``classify(confidence=True)``'s labels (empty: no confidence columns).
    choices : tuple of str
        The labels an answer is decided among (``filter``: yes and no;
        ``classify``: its labels; empty for the others).
    calibrate : str, tuple or None
        How ``filter`` and ``classify`` decide (see :func:`check_calibrate`):
        ``"auto"``, ``"content_free"``, labeled rows, or ``None`` (the text).
    """

    frame: Frame
    call: Call
    out: str = ""
    fields: tuple[FieldSpec, ...] = ()
    confidence: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    calibrate: str | tuple[Mapping[str, object], ...] | None = None

    @property
    def settings(self) -> ResolvedConfig:
        """The call's settings."""
        return self.call.settings


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], ResolvedConfig]:
    """The operator's common arguments, and the settings resolved from the rest."""
    args = {k: kwargs.pop(k) for k in _ROW_ARGS if k in kwargs}
    return args, config(**kwargs)


class _Rowwise:
    """The steps every row-by-row operator shares."""

    name: str
    required: tuple[str, ...] = ()

    def plan(self, compiled: RowwiseCall) -> Plan:
        return as_sent(compiled)[0].plan

    def estimate(self, compiled: RowwiseCall, *, probe: int) -> Estimate:
        call, mode = as_sent(compiled)
        if mode is None:
            return estimate_call(call.plan, compiled.settings, op=self.name, probe=probe)
        check_logprobs(compiled.settings, f"{self.name}(calibrate=...)")
        both, k, _ = _calibration_first(call, mode)
        estimate = estimate_call(both.plan, compiled.settings, op=self.name, probe=probe)
        what = "labeled rows" if isinstance(mode, tuple) else "content-free inputs"
        note = f"includes {plural(k, 'calibration request')} ({what}) sent before the rows"
        return dataclasses.replace(estimate, rows=estimate.rows - k, notes=(*estimate.notes, note))

    def run(self, compiled: RowwiseCall, runner: Runner) -> Output:
        outcomes = runner.run(as_sent(compiled)[0])
        runner.finish()
        return self.output(compiled, outcomes)

    def output(
        self, compiled: RowwiseCall, outcomes: Sequence[Outcome], extra: Sequence[NewColumn] = ()
    ) -> Output:
        """The result of ``outcomes`` (caller's row order), with ``extra`` columns added."""
        raise NotImplementedError


class Map(_Rowwise):
    """``df.llm.map``: the answer of every row in a new column.

    An empty answer is not ``''``: it is asked again, then a row error.
    """

    name = "map"

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        out: str = "llm_output",
        language: object = None,
        **kwargs: Any,
    ) -> RowwiseCall:
        args, cfg = _split(kwargs)
        call = compile_relquery(
            frame,
            pin_language(template, language),
            op="map",
            output=TEXT,
            settings=cfg,
            new_columns=[out],
            error_column=f"{out}_error",
            truncated_column=f"{out}_truncated",
            **args,
        )
        return RowwiseCall(frame, call, out)

    def output(
        self, compiled: RowwiseCall, outcomes: Sequence[Outcome], extra: Sequence[NewColumn] = ()
    ) -> Output:
        call, out = compiled.call, compiled.out
        answers = NewColumn(out, values_of(outcomes))
        marks = truncated_marks(call, outcomes, f"{out}_truncated")
        return finish(call, outcomes, Output(columns=(answers, *marks, *extra)), f"{out}_error")


class Filter(_Rowwise):
    """``df.llm.filter``: the rows the model says yes to (failed rows kept, and reported)."""

    name = "filter"

    def compile(
        self, frame: Frame, template: str, *, calibrate: object = "auto", **kwargs: Any
    ) -> RowwiseCall:
        """Validate a ``filter`` call; with ``errors="keep"`` ``llm_error`` must not exist yet."""
        args, cfg = _split(kwargs)
        call = compile_relquery(
            frame,
            template,
            op="filter",
            output=BOOL,
            settings=cfg,
            error_column="llm_error",
            truncated_column="llm_truncated",
            **args,
        )
        choices = ("yes", "no")
        mode = check_calibrate(calibrate, call.relquery.fields, choices, "filter")
        return RowwiseCall(frame, call, choices=choices, calibrate=mode)

    def run(self, compiled: RowwiseCall, runner: Runner) -> Output:
        outcomes = run_decided(compiled, runner, "filter")
        return self.output(compiled, outcomes)

    def output(
        self, compiled: RowwiseCall, outcomes: Sequence[Outcome], extra: Sequence[NewColumn] = ()
    ) -> Output:
        """The rows answered yes and the failed rows; ``llm_error`` says why a row failed.

        With ``errors="raise"`` the result attached to ``RowErrors`` has the
        ``llm_error`` column too, unless the frame has a column of that name
        (it is never overwritten; the exception lists the errors).
        """
        keep = [i for i, o in enumerate(outcomes) if o.value is True or o.error_kind is not None]
        columns = [NewColumn(c.name, [c.values[i] for i in keep], c.dtype) for c in extra]
        columns.extend(truncated_marks(compiled.call, outcomes, "llm_truncated", keep))
        errors = row_errors(compiled.call.labels, outcomes)
        as_column = compiled.settings["errors"] == "keep"
        if as_column or (errors and "llm_error" not in compiled.frame.columns):
            reasons = [
                None if outcomes[i].error_kind is None else describe(outcomes[i]) for i in keep
            ]
            columns.append(NewColumn("llm_error", reasons))
        result = Output(rows=keep, columns=tuple(columns))
        if errors and not as_column:
            raise RowErrors(errors, result, total=len(outcomes))
        return result


class Extract(_Rowwise):
    """``df.llm.extract``: typed fields of every row, one new column each.

    An answer that breaks the schema is asked again, then a row error; that
    includes ``NaN`` or ``Infinity`` for a ``float`` field, nullable or not
    (a nullable field takes ``null``; see :meth:`FieldSpec.validate`).
    """

    name = "extract"
    required: tuple[str, ...] = ("schema",)

    def compile(self, frame: Frame, template: str, *, schema: object, **kwargs: Any) -> RowwiseCall:
        spec, fields = record_spec(schema)
        args, cfg = _split(kwargs)
        call = compile_relquery(
            frame,
            template,
            op="extract",
            output=spec,
            settings=cfg,
            new_columns=[f.name for f in fields],
            what="schema field",
            error_column="llm_error",
            truncated_column="llm_truncated",
            **args,
        )
        return RowwiseCall(frame, call, fields=fields)

    def output(
        self, compiled: RowwiseCall, outcomes: Sequence[Outcome], extra: Sequence[NewColumn] = ()
    ) -> Output:
        columns = tuple(
            NewColumn(
                f.name, [o.value[i] if o.error_kind is None else None for o in outcomes], f.dtype
            )
            for i, f in enumerate(compiled.fields)
        )
        marks = truncated_marks(compiled.call, outcomes, "llm_truncated")
        return finish(
            compiled.call, outcomes, Output(columns=(*columns, *marks, *extra)), "llm_error"
        )


class Classify(_Rowwise):
    """``df.llm.classify``: one (or several) of a fixed set of labels for every row.

    With ``multi=True`` the answer ``{"answer": []}`` (an explicit empty list)
    means no label applies and gives ``[]``; an empty answer, or text that
    names no label, is asked again, then a row error (see
    :func:`~semframe.core.parse.label_spec`).
    """

    name = "classify"
    required: tuple[str, ...] = ("labels",)

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        labels: object,
        out: str = "label",
        multi: bool = False,
        confidence: bool = False,
        calibrate: object = "auto",
        **kwargs: Any,
    ) -> RowwiseCall:
        """Validate a ``classify`` call; with ``confidence`` every request asks for logprobs."""
        if not isinstance(multi, bool):
            msg = f"multi must be True or False, got {multi!r}."  # type: ignore[unreachable]
            raise InputError(msg)
        if not isinstance(confidence, bool):
            msg = f"confidence must be True or False, got {confidence!r}."  # type: ignore[unreachable]
            raise InputError(msg)
        spec = label_spec(labels, multi=multi)
        args, cfg = _split(kwargs)
        names = tuple(cast("Sequence[str]", labels)) if confidence else ()
        call = compile_relquery(
            frame,
            template,
            op="classify",
            output=spec,
            settings=cfg,
            new_columns=[out, *(confidence_columns(out, names, multi) if confidence else ())],
            error_column=f"{out}_error",
            truncated_column=f"{out}_truncated",
            **args,
        )
        if confidence:
            call = with_logprobs(call, TOP_LOGPROBS)
        choices = tuple(cast("Sequence[str]", labels))
        if multi:
            if calibrate not in ("auto", None, False):
                msg = (
                    f"calibrate={_short(calibrate)} decides one label per row; with multi=True "
                    "(any number of labels) give calibrate=None or leave it out."
                )
                raise InputError(msg)
            mode = None
        else:
            mode = check_calibrate(calibrate, call.relquery.fields, choices, "classify")
        return RowwiseCall(frame, call, out, confidence=names, choices=choices, calibrate=mode)

    def run(self, compiled: RowwiseCall, runner: Runner) -> Output:
        if compiled.confidence:
            check_logprobs(compiled.settings, "classify(confidence=True)")
        outcomes = run_decided(compiled, runner, "classify")
        return self.output(compiled, outcomes)

    def output(
        self, compiled: RowwiseCall, outcomes: Sequence[Outcome], extra: Sequence[NewColumn] = ()
    ) -> Output:
        call, out = compiled.call, compiled.out
        multi = call.relquery.output.kind == "labels"
        columns = [NewColumn(out, values_of(outcomes), "list[str]" if multi else "str")]
        names = compiled.confidence
        if names:
            found = [_confidences(o, names) for o in outcomes]
            if multi:
                for label, name in zip(names, confidence_columns(out, names, True), strict=True):
                    columns.append(NewColumn(name, [c.get(label) for c in found], "float"))
            else:
                values = [
                    c.get(o.value) if o.error_kind is None else None
                    for c, o in zip(found, outcomes, strict=True)
                ]
                columns.append(NewColumn(f"{out}_confidence", values, "float"))
        columns.extend(truncated_marks(call, outcomes, f"{out}_truncated"))
        return finish(call, outcomes, Output(columns=(*columns, *extra)), f"{out}_error")


def pin_language(template: str, language: object) -> str:
    """``template`` asking for answers in ``language`` (``None``: unchanged).

    Raises
    ------
    InputError
        For a ``language`` that is not the name of a language on one line.

    Examples
    --------
    >>> pin_language("Summarize {review}.", "English")
    'Summarize {review}. Answer in English.'
    >>> pin_language("Summarize {review}.", "")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: language='' is not valid: give the name of a language, ...
    """
    if language is None or not isinstance(template, str):
        return template
    if (
        not isinstance(language, str)
        or not language.strip()
        or len(language) > LANGUAGE_CHARS
        or not language.isprintable()
        or any(c in language for c in "{}")
    ):
        msg = (
            f"language={_short(language)} is not valid: give the name of a language, e.g. "
            f'language="English" (one line of at most {LANGUAGE_CHARS} characters, no '
            "braces), or None to leave the answers' language to the model."
        )
        raise InputError(msg)
    return f"{template.rstrip()} Answer in {language.strip()}."


LANGUAGE_CHARS = 40
"""The longest ``language=`` accepted."""

CALIBRATION_LOGPROBS = 20
"""Top alternatives per token asked for when answers are decided from probabilities."""


def check_calibrate(
    calibrate: object, fields: Sequence[str], choices: Sequence[str], op: str
) -> str | tuple[Mapping[str, object], ...] | None:
    """``calibrate=`` of ``filter`` or ``classify``, checked before anything is sent.

    ``"auto"`` (the default) decides from content-free calibrated label
    probabilities where the backend declares it (``Capabilities.calibrate``:
    the embedded small model), from the answer text elsewhere;
    ``"content_free"`` asks for it on any backend that reports logprobs;
    ``None`` or ``False`` decides from the answer text; a list of labeled rows
    (mappings with every template field and ``"answer"``) calibrates on them.

    Raises
    ------
    InputError
        Naming what is wrong and what is valid.

    Examples
    --------
    >>> check_calibrate(False, ["review"], ["yes", "no"], "filter") is None
    True
    >>> check_calibrate([{"review": "dull", "answer": False}], ["review"], ["yes", "no"], "filter")
    ({'review': 'dull', 'answer': 'no'},)
    >>> check_calibrate("cf", ["review"], ["yes", "no"], "filter")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: calibrate='cf' is not valid: give "auto" (the default), ...
    """
    if calibrate is None or calibrate is False:
        return None
    if calibrate in ("auto", "content_free"):
        return calibrate
    if not isinstance(calibrate, list | tuple) or not calibrate:
        msg = (
            f'calibrate={_short(calibrate)} is not valid: give "auto" (the default), '
            '"content_free", None (decide from the answer text), or a non-empty list of '
            f"labeled rows, each a mapping with the keys {[*fields, 'answer']!r}."
        )
        raise InputError(msg)
    rows = []
    folded = {c.casefold(): c for c in choices}
    for i, row in enumerate(calibrate):
        if not isinstance(row, Mapping) or any(k not in row for k in [*fields, "answer"]):
            msg = (
                f"calibrate row {i} must be a mapping with the keys "
                f"{[*fields, 'answer']!r}, got {_short(row)}."
            )
            raise InputError(msg)
        answer = row["answer"]
        if op == "filter" and isinstance(answer, bool):
            answer = "yes" if answer else "no"
        label = folded.get(str(answer).strip().casefold()) if isinstance(answer, str) else None
        if label is None:
            valid = "True, False, 'yes' or 'no'" if op == "filter" else repr(list(choices))
            msg = f"calibrate row {i} has answer {answer!r}; valid answers: {valid}."
            raise InputError(msg)
        rows.append({**{f: row[f] for f in fields}, "answer": label})
    return tuple(rows)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_sent(compiled: RowwiseCall) -> tuple[Call, str | tuple[Mapping[str, object], ...] | None]:
    """The call as it is sent, and how ``filter`` and ``classify`` decide its answers.

    ``calibrate="auto"`` becomes ``"content_free"`` where the backend declares
    ``Capabilities.calibrate`` (and the run is not a batch), ``None``
    elsewhere; a calibrated call asks for the top
    :data:`CALIBRATION_LOGPROBS` alternatives of each answer token. Where the
    backend declares ``Capabilities.restate``, or answers are calibrated, the
    question is asked again after each row's fields (``RelQuery.restate``).
    A backend that cannot be built here (an API without its key) declares
    nothing: the run itself reports why it cannot be built.
    """
    call = compiled.call
    declared = _capabilities(compiled.settings)
    mode = compiled.calibrate
    if mode == "auto":
        wanted = declared is not None and declared.calibrate and not compiled.settings["batch"]
        mode = "content_free" if wanted else None
    if not compiled.choices or not call.labels:
        mode = None
    if mode is not None:
        call = with_logprobs(call, max(CALIBRATION_LOGPROBS, call.relquery.logprobs))
    if mode is not None or (declared is not None and declared.restate):
        call = _restated(call)
    return call, mode


def _capabilities(settings: ResolvedConfig) -> Capabilities | None:
    try:
        return backend_of(settings).capabilities
    except (ConfigError, MissingDependencyError):
        return None


def _calibrated_first(plan: Plan, calibration: RelQuery) -> Plan:
    """``plan`` with the calibration rows sent first, as one plan to price."""
    rq = plan.relquery
    k = calibration.table.n_rows
    cells = {f: calibration.table.cells[f] + rq.table.cells[f] for f in rq.fields}
    table = Table(rq.fields, cells, k + rq.table.n_rows)
    old = plan.ordering  # the calibration rows first, in the first row's field order
    first = int(old.order_of[0]) if len(old) else 0
    ordering = Ordering.from_arrays(
        np.concatenate([np.arange(k), old.rows.astype(np.int64) + k]),
        old.orders or (tuple(rq.fields),),
        np.concatenate([np.full(k, first, dtype=old.order_of.dtype), old.order_of]),
    )
    return make_plan(dataclasses.replace(rq, table=table), ordering, plan.reorder)


def _calibration_first(
    call: Call, mode: str | tuple[Mapping[str, object], ...]
) -> tuple[Call, int, list[str]]:
    """``call`` with its calibration rows sent first, as one call; their count and answers."""
    probe, answers = _probe(call, mode)
    plan = _calibrated_first(call.plan, probe.relquery)
    return Call([*probe.labels, *call.labels], call.settings, plan), len(probe.labels), answers


def run_decided(compiled: RowwiseCall, runner: Runner, op: str) -> Sequence[Outcome]:
    """Run the call; with calibration, decide each answer from its label probabilities.

    The calibration rows (content-free inputs, or the labeled rows) go first,
    in the same run as the call's rows and with the same instructions (they
    warm the cache for the rows, and no slot waits for them to finish); the
    call's own rows follow with logprobs asked for.
    A row whose answer carries no usable probabilities keeps its text answer;
    calibration rows that fail are left out (with none left, the labels'
    probabilities are compared uncalibrated). ``semframe.last_op()`` counts
    the rows decided by probability (``decided``) and those whose decision
    differs from the answer text (``changed``).
    """
    call, mode = as_sent(compiled)
    if mode is None:
        outcomes = runner.run(call)
        runner.finish()
        return outcomes
    check_logprobs(compiled.settings, f"{op}(calibrate=...)")
    both, k, answers = _calibration_first(call, mode)
    sent = runner.run(both, calibration=k)
    probed, outcomes = sent[:k], sent[k:]
    choices = compiled.choices
    dists = [_distribution(o, choices) for o in probed]
    if answers:
        pairs = [(d, a) for d, a in zip(dists, answers, strict=True) if d is not None]
        bias = calibration.bias_from_labeled([d for d, _ in pairs], [a for _, a in pairs], choices)
    else:
        known = [d for d in dists if d is not None]
        bias = calibration.bias_from_prior(calibration.mean_distribution(known, choices))
    decided: list[Outcome] = []
    changed = used = 0
    for o in outcomes:
        dist = _distribution(o, choices)
        if dist is None:
            decided.append(o)
            continue
        label = calibration.decide(dist, bias)
        value: object = label == "yes" if op == "filter" else label
        used += 1
        changed += value != o.value
        decided.append(o._replace(value=value))
    runner.finish(decided=used, changed=changed, calibration_rows=len(probed))
    return decided


def _restated(call: Call) -> Call:
    """``call`` with its question asked again after each row's fields (``RelQuery.restate``)."""
    source = call.source
    if not isinstance(source, Recipe):
        return call
    rq = dataclasses.replace(source.relquery, restate=True)
    return dataclasses.replace(call, source=Recipe(rq, source.reorder))


def _probe(call: Call, mode: str | tuple[Mapping[str, object], ...]) -> tuple[Call, list[str]]:
    """The calibration relQuery of ``call``, and the right label of each of its rows."""
    rq = call.relquery
    if isinstance(mode, tuple):
        columns = {f: [row[f] for row in mode] for f in rq.fields}
        answers = [cast("str", row["answer"]) for row in mode]
        labels: list[object] = [f"calibration row {i}" for i in range(len(mode))]
    else:
        columns = {f: list(calibration.CONTENT_FREE) for f in rq.fields}
        answers = []
        labels = [f"content-free input {v!r}" for v in calibration.CONTENT_FREE]
    probe = dataclasses.replace(rq, table=Table.from_columns(columns))
    method = call.source.reorder if isinstance(call.source, Recipe) else "none"
    return Call(labels, call.settings, Recipe(probe, method)), answers


def _distribution(outcome: Outcome, choices: Sequence[str]) -> dict[str, float] | None:
    if outcome.error_kind is not None or outcome.logprobs is None or outcome.raw is None:
        return None
    return label_distribution(outcome.raw, outcome.logprobs, choices)


def confidence_columns(out: str, labels: Sequence[str], multi: bool) -> list[str]:
    """The confidence column(s) ``classify(confidence=True)`` adds."""
    if not multi:
        return [f"{out}_confidence"]
    return [f"{out}_confidence_{label}" for label in labels]


def _confidences(outcome: Outcome, labels: Sequence[str]) -> dict[str, float]:
    """Confidence of each label the outcome chose (none for a failed row or no logprobs)."""
    if outcome.error_kind is not None or outcome.logprobs is None or outcome.raw is None:
        return {}
    chosen = outcome.value if isinstance(outcome.value, list) else [outcome.value]
    found = label_confidence(outcome.raw, outcome.logprobs, labels)
    if isinstance(outcome.value, str) and outcome.value not in found:
        # Decided by calibrated probabilities against the text: the model's own
        # probability of the label decided on.
        found = label_distribution(outcome.raw, outcome.logprobs, labels) or {}
    return {k: v for k, v in found.items() if k in chosen}


MAP = Map()
FILTER = Filter()
EXTRACT = Extract()
CLASSIFY = Classify()
