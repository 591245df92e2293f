"""Operators, frame-neutral: compile a call into a relQuery, plan it, run it.

The accessors (``df.llm``) are thin shims over these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from semframe.config import config
from semframe.core.frames import FrameAdapter, adapter_for, is_lazy
from semframe.core.parse import BOOL, TEXT, OutputSpec, label_confidence, label_spec, record_spec
from semframe.core.plan import RelQuery, check_sendable, render_instructions
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.errors import BudgetExceeded, InputError, RowError, RowErrors, did_you_mean
from semframe.runtime.call import Call, Recipe, run_call, uncached_part, with_logprobs
from semframe.runtime.execute import Outcome, RunStats, stop_when_var

if TYPE_CHECKING:
    from semframe.backends.base import Usage
    from semframe.cost.estimate import Budget, Estimate

OPS: dict[str, OutputSpec] = {"map": TEXT, "filter": BOOL}
"""Operators whose output format is fixed; the others build theirs from arguments."""
ALL_OPS = ("map", "filter", "extract", "classify", "agg", "topk", "join")
"""Every operator ``df.llm.plan(op=...)`` knows."""
# A JSON answer {"answer": "yes"} takes up to ~25 tokens with the whitespace small
# models put in it; a cut-off answer would be a parse error.
DEFAULT_MAX_TOKENS = {
    "map": 256,
    "filter": 32,
    "extract": 256,
    "classify": 48,
    "agg": 256,
    "topk": 32,
    "join": 32,
}
TRUNCATION_MARK = "…"


def _apply_truncate(table: Table, truncate: int | Mapping[str, int] | None) -> Table:
    if truncate is None:
        return table
    limits = dict.fromkeys(table.columns, truncate) if isinstance(truncate, int) else dict(truncate)
    for name, limit in limits.items():
        if name not in table.columns:
            msg = (
                f"truncate names column {name!r}, which the template does not use; "
                f"template columns: {list(table.columns)}."
            )
            raise InputError(msg)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            msg = f"truncate limit for {name!r} must be a positive int (characters), got {limit!r}."
            raise InputError(msg)
    cells = dict(table.cells)
    for name, limit in limits.items():
        cells[name] = tuple(
            v if len(v) <= limit else v[: max(limit - 1, 0)] + TRUNCATION_MARK for v in cells[name]
        )
    return Table(table.columns, cells, table.n_rows)


def compile_call(
    frame: Any,
    template: str,
    *,
    op: str,
    output: OutputSpec | None = None,
    max_tokens: int | None = None,
    system: str | None = None,
    examples: Sequence[Mapping[str, object]] | None = None,
    truncate: int | Mapping[str, int] | None = None,
    **settings: Any,
) -> Call:
    """Validate a row-by-row call (one request per row); sends nothing.

    The call's plan is built on first use of ``call.plan``.

    Parameters
    ----------
    op : str
        The operator; ``output`` defaults to its fixed output format (:data:`OPS`).
    output : OutputSpec, optional
        The answer format, for operators that build it from their arguments.

    Raises
    ------
    SemframeError
        Any problem with the frame, template, options or settings, before any
        request is sent.
    """
    if output is None:
        if op not in OPS:
            msg = (
                f"unknown op {op!r}.{did_you_mean(op, ALL_OPS)} "
                f"Valid ops: {', '.join(map(repr, ALL_OPS))}."
            )
            raise InputError(msg)
        output = OPS[op]
    frame, adapter = collect(frame)
    cfg = config(**settings)
    parsed = parse_template(template).resolve(adapter.columns(frame))
    max_tokens = check_options(op, max_tokens, system)
    table = _apply_truncate(adapter.to_table(frame, parsed.fields), truncate)
    rq = RelQuery(
        op=op,
        template=parsed,
        table=table,
        output=output,
        system=system,
        examples=tuple(examples or ()),
        max_tokens=max_tokens,
        temperature=cfg["temperature"],
    )
    check_sendable(rq, render_instructions(rq))
    # Ordered and rendered when first needed: a call served whole from the
    # result cache is neither (semframe.runtime.call.run_call).
    return Call(frame, adapter, cfg, Recipe(rq, cfg["reorder"]))


def collect(frame: Any) -> tuple[Any, FrameAdapter]:
    """An eager frame (a LazyFrame collected) and its adapter."""
    if is_lazy(frame):
        frame = frame.collect()
    return frame, adapter_for(frame)


def check_options(op: str, max_tokens: object, system: object) -> int:
    """Validate ``max_tokens`` and ``system``; return ``max_tokens`` or the op's default."""
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS[op]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        msg = f"max_tokens must be a positive int, got {max_tokens!r}."
        raise InputError(msg)
    if not isinstance(system, str | None):
        msg = f"system must be a str or None, got {type(system).__name__}."
        raise InputError(msg)
    return max_tokens


@dataclass(frozen=True)
class OpStats:
    """What one operator call cost, over all the relQueries it ran (``semframe.last_op()``).

    Operators such as ``agg`` (one relQuery per reduction level) and ``topk``
    (one per comparison round) run several relQueries; ``semframe.last_run()``
    describes only the last of them, this describes the whole call.

    Attributes
    ----------
    op : str
        The operator.
    runs : tuple of RunStats
        One per relQuery run, in order.
    counts : mapping of str to int
        Operator-specific figures, e.g. ``comparisons`` and
        ``naive_comparisons`` for ``topk``, ``pairs`` and ``naive_pairs`` for
        ``join``, ``levels`` for ``agg``.
    """

    op: str
    runs: tuple[RunStats, ...]
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def llm_calls(self) -> int:
        """Requests sent, retries included, over every relQuery of the call."""
        return sum(r.requests for r in self.runs)

    @property
    def relqueries(self) -> int:
        """Number of relQueries run."""
        return len(self.runs)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over every run."""
        return sum(r.prompt_tokens for r in self.runs)

    @property
    def cached_tokens(self) -> int:
        """Cached prompt tokens over every run."""
        return sum(r.cached_tokens for r in self.runs)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v:,}" for k, v in self.counts.items())
        return (
            f"OpStats({self.op}: {self.relqueries} relQuery(s), {self.llm_calls:,} LLM calls, "
            f"prompt {self.prompt_tokens:,} tok, cached {self.cached_tokens:,}{extra})"
        )


_last_op: OpStats | None = None


def last_op() -> OpStats | None:
    """Statistics of the most recent operator call in this process, all its relQueries.

    Examples
    --------
    >>> import pandas as pd, semframe
    >>> from semframe.operators.common import last_op
    >>> _ = pd.DataFrame({"t": ["a", "b"]}).llm.map("Echo {t}", backend="fake")
    >>> last_op().llm_calls, last_op().relqueries
    (2, 1)
    """
    return _last_op


def record_op(op: str, runs: Sequence[RunStats], **counts: int) -> OpStats:
    """Record the statistics of an operator call (see :func:`last_op`)."""
    global _last_op
    _last_op = OpStats(op, tuple(runs), dict(counts))
    return _last_op


def run(call: Call, runs: list[RunStats]) -> list[Outcome]:
    """``run_call`` that appends the run's statistics to ``runs``; outcomes in input order.

    Inside a call with ``budget=`` (see :func:`guarded`) the run stops once the
    spend of the whole operator call would pass the budget; rows not sent get
    an outcome with ``error_kind="budget"``, and later relQueries of the same
    call send nothing.
    """
    guard = _guard_var.get()
    if guard is None:
        outcomes, stats = run_call(call)
        runs.append(stats)
        return outcomes
    n = len(call.plan.requests)
    if guard.stopped is not None:
        return [guard.unsent()] * n
    token = stop_when_var.set(guard.hook(call))
    try:
        outcomes, stats = run_call(call)
    except BudgetExceeded as exc:
        guard.stopped = exc
        if exc.stats is not None:
            runs.append(exc.stats)
            guard.add(exc.stats)
        return [o if o is not None else guard.unsent() for o in exc.outcomes]
    finally:
        stop_when_var.reset(token)
    runs.append(stats)
    guard.add(stats)
    return outcomes


# -- estimate, dry_run, budget -------------------------------------------------------

RUN_OPTIONS = ("estimate", "dry_run", "budget", "probe")
"""Keyword arguments every operator takes besides its settings."""


@dataclass(frozen=True)
class RunOptions:
    """What a call should do besides running: estimate only, budget, probe rows."""

    dry_run: bool = False
    budget: Budget | None = None
    probe: int = 0


def pop_run_options(kwargs: dict[str, Any]) -> RunOptions:
    """Take ``estimate``/``dry_run``, ``budget`` and ``probe`` out of ``kwargs``; validate them.

    Examples
    --------
    >>> kw = {"dry_run": True, "budget": "10k tokens", "model": "m"}
    >>> pop_run_options(kw), kw
    (RunOptions(dry_run=True, budget=Budget(tokens=10000), probe=0), {'model': 'm'})
    """
    from semframe.cost.estimate import parse_budget

    flags = {}
    for name in ("estimate", "dry_run"):
        value = kwargs.pop(name, False)
        if not isinstance(value, bool):
            msg = f"{name} must be True or False, got {value!r}."
            raise InputError(msg)
        flags[name] = value
    budget = kwargs.pop("budget", None)
    probe = kwargs.pop("probe", 0)
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 0:
        msg = (
            f"probe must be a number of rows >= 0 (sent to measure answer lengths), got {probe!r}."
        )
        raise InputError(msg)
    return RunOptions(
        flags["estimate"] or flags["dry_run"],
        None if budget is None else parse_budget(budget),
        probe,
    )


def estimate_of(
    plan: Any, settings: Mapping[str, Any], options: RunOptions, op: str
) -> Estimate | None:
    """The estimate of a compiled call, when ``dry_run`` or ``budget`` needs one.

    ``plan`` is a :class:`Call` (planned only when an estimate is needed), a
    :class:`Plan`, or an ``AggPlan`` / ``TopkPlan`` whose first relQuery is
    simulated and scaled to the whole call.
    """
    if not options.dry_run and options.budget is None:
        return None
    from semframe.cost.estimate import estimate_plan

    if isinstance(plan, Call):
        plan = plan.plan

    first = getattr(plan, "first", None)
    if first is None:
        n = len(plan.requests)
        plan, cached = uncached_part(plan, settings)
        notes = (
            (
                f"{cached:,} of {n:,} rows are answered by the result cache and not counted "
                "(they cost nothing; cache=False estimates every row)",
            )
            if cached
            else ()
        )
        return estimate_plan(plan, settings, op=op, probe=options.probe, notes=notes)
    total = int(getattr(plan, "max_requests", 0) or getattr(plan, "expected_comparisons", 0))
    n = len(first.requests)
    scale = total / n if n else 1.0
    what = (
        "the later reduction levels are extrapolated from the first (an upper bound)"
        if op == "agg"
        else "later comparison rounds are extrapolated from the first (an expectation)"
    )
    return estimate_plan(
        first,
        settings,
        op=op,
        probe=options.probe,
        scale=scale,
        notes=(f"first relQuery ({n:,} requests) simulated; {what}: {total:,} requests",),
    )


class _Guard:
    """Spend of one operator call under a budget, over all its relQueries."""

    def __init__(self, budget: Budget, estimate: Estimate) -> None:
        self.budget = budget
        self.estimate = estimate
        self.dollars = 0.0
        self.tokens = 0
        self.stopped: BudgetExceeded | None = None
        reqs = max(estimate.requests, 1)
        self.mean_dollars = (estimate.dollars or 0.0) / reqs
        self.mean_tokens = estimate.tokens / reqs

    def unsent(self) -> Outcome:
        return Outcome(
            None, None, "budget", f"not sent: budget {self.budget.describe()} reached", 0
        )

    def add(self, stats: RunStats) -> None:
        self.dollars += stats.dollars or 0.0
        self.tokens += stats.prompt_tokens + stats.output_tokens

    def hook(self, call: Call) -> Callable[[Usage, int, int], bool]:
        """``stop_when`` for one relQuery: stop before the projected spend passes the budget."""
        from semframe.backends import get_backend
        from semframe.runtime.execute import bill

        cfg = call.settings
        backend = get_backend(cfg["backend"], model=cfg["model"], settings=cfg)
        budget = self.budget

        def stop(spent: Usage, answered: int, in_flight: int) -> bool:
            if budget.tokens is not None:
                used = spent.prompt_tokens + spent.output_tokens
                mean = used / answered if answered else self.mean_tokens
                return self.tokens + used + mean * (in_flight + 1) > budget.tokens
            dollars = bill(backend, spent, prices=cfg["prices"]) or 0.0
            mean = dollars / answered if answered else self.mean_dollars
            return self.dollars + dollars + mean * (in_flight + 1) > (budget.dollars or 0.0)

        return stop

    def exceeded(self, result: Any) -> BudgetExceeded:
        spent: float = self.tokens if self.budget.tokens is not None else self.dollars
        shown = f"{spent:,} tokens" if self.budget.tokens is not None else f"${spent:,.4f}"
        stopped = self.stopped
        outcomes = stopped.outcomes if stopped is not None else []
        unsent = sum(1 for o in outcomes if o is None)
        msg = (
            f"budget {self.budget.describe()} reached: stopped after spending {shown}; "
            f"{unsent} request(s) of the last relQuery were not sent. The answers paid for "
            "are in `.result` of this exception (rows not sent have no value)."
        )
        exc = BudgetExceeded(
            msg, estimate=self.estimate, budget=self.budget, spent=spent, result=result
        )
        if stopped is not None:
            exc.outcomes, exc.stats = stopped.outcomes, stopped.stats
        return exc


_guard_var: ContextVar[_Guard | None] = ContextVar("semframe_budget_guard", default=None)


def guarded(
    options: RunOptions, estimate: Estimate | None, original: Any, body: Callable[[], Any]
) -> Any:
    """Run ``body`` (an operator's run) under ``options.budget``.

    Raises
    ------
    BudgetExceeded
        Before anything is sent when ``estimate`` is over the budget; after the
        run, with the partial result, when the spend reached it.
    """
    budget = options.budget
    if budget is None or estimate is None:
        return body()
    if estimate.exceeds(budget):
        expected = (
            f"{estimate.tokens:,} tokens"
            if budget.tokens is not None
            else f"${estimate.dollars or 0.0:,.4f}"
        )
        msg = (
            f"the estimate of this {estimate.op} ({expected}, {estimate.requests:,} requests on "
            f"{estimate.backend}/{estimate.model}) is over budget={budget.describe()}; nothing "
            "was sent. Raise the budget, or see `.estimate` (df.llm.estimate(...)) for where "
            "the cost comes from."
        )
        raise BudgetExceeded(msg, estimate=estimate, budget=budget, spent=0)
    guard = _Guard(budget, estimate)
    token = _guard_var.set(guard)
    try:
        try:
            result = body()
        except RowErrors as exc:
            if guard.stopped is None:
                raise
            result = exc.result
    finally:
        _guard_var.reset(token)
    if guard.stopped is not None:
        raise guard.exceeded(result)
    return result


def _row_errors(call: Call, outcomes: Sequence[Outcome]) -> list[RowError]:
    labels = call.adapter.labels(call.frame)
    return [
        RowError(i, labels[i], o.error_kind or "", o.error or "", o.attempts)
        for i, o in enumerate(outcomes)
        if not o.ok
    ]


def llm_map(frame: Any, template: str, *, out: str = "llm_output", **kwargs: Any) -> Any:
    """Implementation of ``df.llm.map``; see the accessor for documentation."""
    options = pop_run_options(kwargs)
    call = compile_call(frame, template, op="map", **kwargs)
    check_new_columns(call.adapter, call.frame, [out])
    check_error_column(call.adapter, call.frame, call.settings, f"{out}_error")
    est = estimate_of(call, call.settings, options, "map")
    if options.dry_run:
        return est
    return guarded(options, est, frame, lambda: _map(frame, call, out))


def _map(frame: Any, call: Call, out: str) -> Any:
    runs: list[RunStats] = []
    outcomes = run(call, runs)
    record_op("map", runs)
    result = call.adapter.with_column(call.frame, out, [o.value for o in outcomes], "str")
    return _finish(frame, call, outcomes, result, f"{out}_error")


def llm_filter(frame: Any, template: str, **kwargs: Any) -> Any:
    """Implementation of ``df.llm.filter``; see the accessor for documentation."""
    if kwargs.get("cascade") is not None:
        return _cascade(frame, template, "filter", kwargs, {})
    options = pop_run_options(kwargs)
    call = compile_call(frame, template, op="filter", **kwargs)
    est = estimate_of(call, call.settings, options, "filter")
    if options.dry_run:
        return est
    return guarded(options, est, frame, lambda: _filter(frame, call))


def _filter(frame: Any, call: Call) -> Any:
    runs: list[RunStats] = []
    outcomes = run(call, runs)
    record_op("filter", runs)
    errors = _row_errors(call, outcomes)
    keep = [i for i, o in enumerate(outcomes) if o.value is True or not o.ok]
    result = call.adapter.take(call.frame, keep)
    as_column = call.settings["errors"] == "keep"
    if errors or as_column:
        reasons = [None if outcomes[i].ok else _describe(outcomes[i]) for i in keep]
        result = call.adapter.with_column(result, "llm_error", reasons, "str")
    if errors and not as_column:
        raise RowErrors(errors, relazy(frame, result))
    return relazy(frame, result)


def compile_extract(frame: Any, template: str, schema: object, **kwargs: Any) -> Call:
    """Validate an ``extract`` call and build its plan; sends nothing."""
    spec, fields = record_spec(schema)
    call = compile_call(frame, template, op="extract", output=spec, **kwargs)
    check_new_columns(call.adapter, call.frame, [f.name for f in fields], "schema field")
    check_error_column(call.adapter, call.frame, call.settings, "llm_error")
    return call


def llm_extract(frame: Any, template: str, schema: object, **kwargs: Any) -> Any:
    """Implementation of ``df.llm.extract``; see the accessor for documentation."""
    if kwargs.get("cascade") is not None:
        return _cascade(frame, template, "extract", kwargs, {"schema": schema})
    options = pop_run_options(kwargs)
    _, fields = record_spec(schema)
    call = compile_extract(frame, template, schema, **kwargs)
    est = estimate_of(call, call.settings, options, "extract")
    if options.dry_run:
        return est
    return guarded(options, est, frame, lambda: _extract(frame, call, fields))


def _extract(frame: Any, call: Call, fields: Any) -> Any:
    runs: list[RunStats] = []
    outcomes = run(call, runs)
    record_op("extract", runs)
    result = call.frame
    for i, f in enumerate(fields):
        values = [o.value[i] if o.ok else None for o in outcomes]
        result = call.adapter.with_column(result, f.name, values, f.dtype)
    return _finish(frame, call, outcomes, result, "llm_error")


TOP_LOGPROBS = 5
"""Top alternatives per token asked for when ``classify(confidence=True)``."""
LOGPROB_BACKENDS = ("openai", "local", "vllm", "fake (after FakeBackend.set_logprobs)")
"""Backends that can report token logprobs, as error messages name them."""


def compile_classify(
    frame: Any,
    template: str,
    labels: object,
    *,
    out: str = "label",
    multi: bool = False,
    confidence: bool = False,
    **kwargs: Any,
) -> Call:
    """Validate a ``classify`` call and build its plan; sends nothing.

    With ``confidence`` every request asks for token logprobs
    (:data:`TOP_LOGPROBS` alternatives per token).
    """
    if not isinstance(multi, bool):
        msg = f"multi must be True or False, got {multi!r}."  # type: ignore[unreachable]
        raise InputError(msg)
    if not isinstance(confidence, bool):
        msg = f"confidence must be True or False, got {confidence!r}."  # type: ignore[unreachable]
        raise InputError(msg)
    spec = label_spec(labels, multi=multi)
    call = compile_call(frame, template, op="classify", output=spec, **kwargs)
    check_new_columns(call.adapter, call.frame, [out])
    if confidence:
        check_new_columns(call.adapter, call.frame, _confidence_columns(out, labels, multi))
        call = with_logprobs(call, TOP_LOGPROBS)
    check_error_column(call.adapter, call.frame, call.settings, f"{out}_error")
    return call


def _confidence_columns(out: str, labels: object, multi: bool) -> list[str]:
    """The confidence column(s) ``classify(confidence=True)`` adds (labels already checked)."""
    if not multi:
        return [f"{out}_confidence"]
    return [f"{out}_confidence_{label}" for label in cast("Sequence[str]", labels)]


def check_logprobs(call: Call) -> None:
    """Fail before sending unless the call's backend reports token logprobs."""
    from semframe.backends import get_backend

    cfg = call.settings
    if cfg["batch"]:
        msg = (
            "classify(confidence=True) needs token logprobs, which batch=True runs do not "
            "return; run without batch=True."
        )
        raise InputError(msg)
    backend = get_backend(cfg["backend"], model=cfg["model"], settings=cfg)
    if not backend.capabilities.logprobs:
        msg = (
            f"classify(confidence=True) needs token logprobs, which backend "
            f"{backend.name!r} (model {backend.model!r}) does not report. Backends that "
            f"can: {', '.join(LOGPROB_BACKENDS)}."
        )
        raise InputError(msg)


def llm_classify(
    frame: Any, template: str, labels: object, *, out: str = "label", **kwargs: Any
) -> Any:
    """Implementation of ``df.llm.classify``; see the accessor for documentation."""
    if kwargs.get("cascade") is not None:
        extra = {"labels": labels, "out": out}
        for name in ("multi", "confidence"):
            extra[name] = kwargs.pop(name, False)
        return _cascade(frame, template, "classify", kwargs, extra)
    options = pop_run_options(kwargs)
    confidence = kwargs.get("confidence", False)
    call = compile_classify(frame, template, labels, out=out, **kwargs)
    est = estimate_of(call, call.settings, options, "classify")
    if options.dry_run:
        return est
    if confidence:
        check_logprobs(call)
    names = list(cast("Sequence[str]", labels)) if confidence else []
    return guarded(options, est, frame, lambda: _classify(frame, call, out, names))


def _classify(frame: Any, call: Call, out: str, confidence_labels: Sequence[str]) -> Any:
    runs: list[RunStats] = []
    outcomes = run(call, runs)
    record_op("classify", runs)
    multi = call.relquery.output.kind == "labels"
    dtype = "list[str]" if multi else "str"
    result = call.adapter.with_column(call.frame, out, [o.value for o in outcomes], dtype)
    if confidence_labels:
        found = [_confidences(o, confidence_labels) for o in outcomes]
        if multi:
            for label, name in zip(
                confidence_labels,
                _confidence_columns(out, confidence_labels, multi=True),
                strict=True,
            ):
                values = [c.get(label) for c in found]
                result = call.adapter.with_column(result, name, values, "float")
        else:
            values = [
                c.get(o.value) if o.ok else None for c, o in zip(found, outcomes, strict=True)
            ]
            result = call.adapter.with_column(result, f"{out}_confidence", values, "float")
    return _finish(frame, call, outcomes, result, f"{out}_error")


def _confidences(outcome: Outcome, labels: Sequence[str]) -> dict[str, float]:
    """Confidence of each label the outcome chose (none for a failed row or no logprobs)."""
    if not outcome.ok or outcome.logprobs is None or outcome.raw is None:
        return {}
    chosen = outcome.value if isinstance(outcome.value, list) else [outcome.value]
    found = label_confidence(outcome.raw, outcome.logprobs, labels)
    return {k: v for k, v in found.items() if k in chosen}


def _finish(
    original: Any, call: Call, outcomes: Sequence[Outcome], result: Any, error_column: str
) -> Any:
    """Row-aligned operators: add the error column (``errors="keep"``) or raise RowErrors."""
    errors = _row_errors(call, outcomes)
    if call.settings["errors"] == "keep":
        reasons = [None if o.ok else _describe(o) for o in outcomes]
        result = call.adapter.with_column(result, error_column, reasons, "str")
    elif errors:
        raise RowErrors(errors, relazy(original, result))
    return relazy(original, result)


def llm_plan(frame: Any, template: str, *, op: str = "map", **kwargs: Any) -> Any:
    """Implementation of ``df.llm.plan``: the plan(s) of a call, nothing sent.

    Returns a :class:`Plan` for ``map``, ``filter``, ``extract``, ``classify``
    and ``join``; a :class:`~semframe.operators.agg.AggPlan` for ``agg`` and a
    :class:`~semframe.operators.topk.TopkPlan` for ``topk`` (their later relQueries
    depend on earlier answers).
    """
    if op in OPS:
        kwargs.pop("out", None)
        return compile_call(frame, template, op=op, **kwargs).plan
    if op == "extract":
        return compile_extract(frame, template, _required(kwargs, "schema", op), **kwargs).plan
    if op == "classify":
        labels = _required(kwargs, "labels", op)
        return compile_classify(frame, template, labels, **kwargs).plan
    if op == "agg":
        from semframe.operators.agg import plan_agg

        return plan_agg(frame, template, **kwargs)
    if op == "topk":
        from semframe.operators.topk import plan_topk

        return plan_topk(frame, template, _required(kwargs, "k", op), **kwargs)
    if op == "join":
        from semframe.operators.join import compile_join

        return compile_join(frame, _required(kwargs, "other", op), template, **kwargs).call.plan
    msg = (
        f"unknown op {op!r}.{did_you_mean(op, ALL_OPS)} Valid ops: {', '.join(map(repr, ALL_OPS))}."
    )
    raise InputError(msg)


def llm_estimate(frame: Any, template: str, *, op: str = "map", **kwargs: Any) -> Any:
    """Implementation of ``df.llm.estimate``: the operator called with ``dry_run=True``."""
    for name in ("estimate", "dry_run"):
        kwargs.pop(name, None)
    kwargs["dry_run"] = True
    if op == "map":
        return llm_map(frame, template, **kwargs)
    if op == "filter":
        return llm_filter(frame, template, **kwargs)
    if op == "extract":
        return llm_extract(frame, template, _required(kwargs, "schema", op), **kwargs)
    if op == "classify":
        return llm_classify(frame, template, _required(kwargs, "labels", op), **kwargs)
    if op == "agg":
        from semframe.operators.agg import llm_agg

        return llm_agg(frame, template, **kwargs)
    if op == "topk":
        from semframe.operators.topk import llm_topk

        return llm_topk(frame, template, _required(kwargs, "k", op), **kwargs)
    if op == "join":
        from semframe.operators.join import llm_join

        return llm_join(frame, _required(kwargs, "other", op), template, **kwargs)
    msg = (
        f"unknown op {op!r}.{did_you_mean(op, ALL_OPS)} Valid ops: {', '.join(map(repr, ALL_OPS))}."
    )
    raise InputError(msg)


def _cascade(
    frame: Any, template: str, op: str, kwargs: dict[str, Any], extra: dict[str, Any]
) -> Any:
    """``cascade=`` on filter/classify/extract: see :mod:`semframe.operators.cascade`."""
    from semframe.operators.cascade import run_cascade

    cascade = kwargs.pop("cascade")
    thresholds = kwargs.pop("thresholds", None)
    stage_column = kwargs.pop("stage_column", "llm_stage")
    for name in ("backend", "model"):
        if kwargs.get(name) is not None:
            msg = f"{name}= and cascade= do not combine: each cascade stage names its {name}."
            raise InputError(msg)
        kwargs.pop(name, None)
    return run_cascade(
        frame,
        template,
        op,
        cascade,
        thresholds=thresholds,
        stage_column=stage_column,
        extra=extra,
        **kwargs,
    )


def _required(kwargs: dict[str, Any], name: str, op: str) -> Any:
    if name not in kwargs:
        msg = f"plan(op={op!r}) needs the {op} argument {name!r}, as the operator itself does."
        raise InputError(msg)
    return kwargs.pop(name)


def _describe(outcome: Outcome) -> str:
    return f"{outcome.error_kind}: {outcome.error} (after {outcome.attempts} attempt(s))"


def check_new_columns(
    adapter: FrameAdapter, frame: Any, names: Sequence[str], what: str = "out"
) -> None:
    """Fail unless every name is a non-empty string naming no existing column."""
    existing = adapter.columns(frame)
    for out in names:
        if not isinstance(out, str) or not out:
            msg = f"{what} must be a non-empty column name, got {out!r}."
            raise InputError(msg)
        if out in existing:
            msg = f"{what}={out!r} would overwrite an existing column; choose another name."
            raise InputError(msg)


def check_error_column(
    adapter: FrameAdapter, frame: Any, settings: Mapping[str, Any], name: str
) -> None:
    """With ``errors="keep"``, fail if the error column ``name`` already exists."""
    if settings["errors"] == "keep" and name in adapter.columns(frame):
        msg = (
            f"errors='keep' adds the column {name!r}, which the frame already has; "
            "rename that column first."
        )
        raise InputError(msg)


def relazy(original: Any, result: Any) -> Any:
    """``result`` made lazy again when the caller passed a LazyFrame."""
    if is_lazy(original):
        return result.lazy()
    return result
