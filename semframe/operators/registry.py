"""Operators are a registry: every ``df.llm`` call goes through one driver.

An :class:`Operator` is four steps over plain data: ``compile`` (validate
the call and read the columns it needs, sending nothing), ``plan`` (what
would be sent), ``estimate`` (what it would cost) and ``run`` (send it through
a :class:`~semframe.runtime.call.Runner`, and describe the result as an
:class:`~semframe.core.frames.Output`). :func:`invoke` drives them: the
caller's frame is read once on the way in (:class:`~semframe.core.frames.Frame`)
and built once on the way out; ``estimate=True``, ``budget=`` and ``probe=``
work the same for every operator, built in or registered with
:func:`register_operator`.

Examples
--------
>>> import pandas as pd, semframe
>>> from semframe.core.frames import NewColumn, Output
>>> class Shout:
...     '''A third-party operator: the text of a column in capitals, no LLM.'''
...     name, required = "shout", ()
...     def compile(self, frame, template, **kwargs):
...         return frame.table([template])
...     def plan(self, table):
...         return None
...     def estimate(self, table, *, probe):
...         raise NotImplementedError
...     def run(self, table, runner):
...         loud = [v.upper() for v in table.cells[table.columns[0]]]
...         return Output(columns=(NewColumn("loud", loud),))
>>> register_operator(Shout())
>>> pd.DataFrame({"t": ["hi", "yo"]}).llm.shout("t")
    t loud
0  hi   HI
1  yo   YO
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from semframe.backends import get_backend
from semframe.config import SETTINGS, config
from semframe.core.frames import Frame, Output, defer, is_lazy
from semframe.cost.budget import Budget, parse_budget
from semframe.cost.estimate import Estimate
from semframe.errors import InputError, RowErrors, did_you_mean, format_choices
from semframe.operators.agg import AGG
from semframe.operators.cascade import CascadeOperator
from semframe.operators.join import JOIN
from semframe.operators.lazy import LAZY_OPERATORS, deferrable, probe_result, with_collected
from semframe.operators.rowwise import CLASSIFY, EXTRACT, FILTER, MAP
from semframe.operators.similarity import CLUSTER, DEDUP, SEARCH, SIM_JOIN
from semframe.operators.topk import TOPK
from semframe.runtime.call import Runner
from semframe.runtime.guard import BudgetGuard, check_estimate

__all__ = [
    "OPERATORS",
    "Operator",
    "RunOptions",
    "estimate",
    "get_operator",
    "invoke",
    "plan",
    "pop_run_options",
    "register_operator",
]


class Operator(Protocol):
    """One operator: compile, plan, estimate, run.

    Attributes
    ----------
    name : str
        What ``df.llm.<name>`` and ``op=`` call it.
    required : tuple of str
        Keyword arguments the operator cannot do without (``schema`` for
        ``extract``...); ``plan(op=...)`` and ``estimate(op=...)`` name a
        missing one.
    lazy : bool, optional
        Not required: ``True`` defers a call on a Polars LazyFrame to its
        ``collect()`` (:mod:`semframe.operators.lazy`; ``compile`` and
        ``run`` must then work on an empty frame). Without it, a LazyFrame is
        collected at the call.
    """

    name: str
    required: tuple[str, ...]

    @property
    def compile(self) -> Callable[..., Any]:
        """``compile(frame, template, **arguments)``: validate the call, send nothing.

        It reads what the call needs from ``frame`` (a
        :class:`~semframe.core.frames.Frame`) once; each operator names its own
        arguments (``schema=``, ``labels=``, ``k=``, ``other=``...).
        """
        ...

    def plan(self, compiled: Any) -> Any:
        """What the call would send (a :class:`~semframe.core.plan.Plan`, or the operator's)."""
        ...

    def estimate(self, compiled: Any, *, probe: int) -> Estimate:
        """What the call would cost; ``probe`` rows may be sent to measure answers."""
        ...

    def run(self, compiled: Any, runner: Runner) -> Output:
        """Run the call's relQueries through ``runner``; the result, frame-neutral.

        Failed rows raise :class:`~semframe.errors.RowErrors` with an
        :class:`~semframe.core.frames.Output` as its ``result``.
        """
        ...


OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (MAP, FILTER, EXTRACT, CLASSIFY, AGG, TOPK, JOIN, SEARCH, SIM_JOIN, DEDUP, CLUSTER)
}
"""Operator name -> operator (the built-in ones and those registered)."""


def register_operator(operator: Operator) -> None:
    """Make ``operator`` available as ``df.llm.<name>`` and as ``op=<name>``.

    Raises
    ------
    InputError
        For a name that is not an identifier, or one the accessor uses for
        something else (``plan``, ``estimate``).
    """
    name = operator.name
    if not name.isidentifier() or name.startswith("_") or name in ("plan", "estimate"):
        msg = (
            f"operator name {name!r} must be an identifier not starting with '_', and not "
            "'plan' or 'estimate'."
        )
        raise InputError(msg)
    OPERATORS[name] = operator


def get_operator(name: str) -> Operator:
    """The operator called ``name``.

    Raises
    ------
    InputError
        For an unknown name, listing the valid ones.
    """
    op = OPERATORS.get(name)
    if op is None:
        msg = (
            f"unknown op {name!r}.{did_you_mean(name, OPERATORS)} "
            f"Valid ops: {format_choices(OPERATORS)}."
        )
        raise InputError(msg)
    return op


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


def _required(op: Operator, kwargs: dict[str, Any]) -> None:
    for name in op.required:
        if name not in kwargs:
            msg = (
                f"plan(op={op.name!r}) needs the {op.name} argument {name!r}, as the "
                "operator itself does."
            )
            raise InputError(msg)


def _resolve(name: str, kwargs: dict[str, Any], *, budget: bool) -> Operator:
    op = get_operator(name)
    if kwargs.get("cascade") is None:
        kwargs.pop("cascade", None)
        return op
    if budget:
        msg = "budget= is not supported with cascade= yet; check the estimate (dry_run=True)."
        raise InputError(msg)
    return CascadeOperator(op)


def _backend(kwargs: dict[str, Any]) -> None:
    """Build the backend the call's settings name; raises its error (a missing API key...).

    A budgeted run checks this before its estimate: an API without its key is
    still priced, so the budget's verdict would otherwise hide the error that
    the run itself would meet first.
    """
    cfg = config(**{k: v for k, v in kwargs.items() if k in SETTINGS})
    get_backend(cfg["backend"], model=cfg["model"], settings=cfg)


def invoke(name: str, frame: Any, template: str, **kwargs: Any) -> Any:
    """Run operator ``name`` on ``frame``: the implementation of every ``df.llm.<op>``.

    Besides the operator's own arguments and any setting, every operator takes
    ``estimate=True`` (or ``dry_run=True``) to return its estimate instead of
    running, ``budget=`` to stop before or while it overspends, and
    ``probe=N``. Operators with a confidence (``filter``, ``classify``,
    ``extract``) take ``cascade=``.

    On a Polars LazyFrame, the operators of :mod:`semframe.operators.lazy`
    return a LazyFrame at once: the call is checked on the frame's schema
    and runs when the result is collected. ``estimate=True``
    and the other operators collect the frame now.
    """
    given = dict(kwargs)
    options = pop_run_options(kwargs)
    op = _resolve(name, kwargs, budget=options.budget is not None)
    if not options.dry_run and is_lazy(frame) and deferrable(name, op):
        return _defer(name, op, frame, template, given=given, arguments=kwargs)
    edge = Frame.of(frame)
    compiled = op.compile(edge, template, **kwargs)
    est = None
    if options.budget is not None and not options.dry_run:
        _backend(kwargs)  # a missing key or SDK first: the estimate is priced without one
    if options.dry_run or options.budget is not None:
        est = op.estimate(compiled, probe=options.probe)
    if options.dry_run:
        return est
    guard = None
    if options.budget is not None and est is not None:
        check_estimate(est, options.budget)
        guard = BudgetGuard(options.budget, est)
    try:
        result = edge.build(op.run(compiled, Runner(op.name, guard)))
    except RowErrors as exc:
        if isinstance(exc.result, Output):
            exc.result = edge.build(exc.result)
        if guard is None or guard.stopped is None:
            raise
        result = exc.result
    if guard is not None and guard.stopped is not None:
        raise guard.exceeded(result)
    return result


def _defer(
    name: str,
    op: Operator,
    frame: Any,
    template: str,
    *,
    given: dict[str, Any],
    arguments: dict[str, Any],
) -> Any:
    """LazyFrame ``frame`` followed by the call, which runs when the result is collected.

    Everything that needs no data is done now: the operator compiles on the
    frame's schema and its result is typed (:func:`~semframe.operators.lazy.probe_result`),
    and the backend is built (a missing SDK or API key fails here). At
    ``collect()`` the whole collected frame goes through :func:`invoke` once
    (``given`` are the call's arguments, run options included), in a copy of
    the context of this call: the settings of ``semframe.using`` and the
    statistics scope are the ones in force now.
    """
    result = probe_result(op, frame, template, arguments)
    if name in LAZY_OPERATORS and arguments.get("cascade") is None:
        _backend(arguments)  # a cascade builds its stages' backends when it compiles
    context = contextvars.copy_context()

    def run(collected: Any) -> Any:
        return context.copy().run(invoke, name, collected, template, **with_collected(given))

    return defer(frame, run, result.schema)


def plan(name: str, frame: Any, template: str, **kwargs: Any) -> Any:
    """The plan of a call of operator ``name``, without running it; nothing is sent.

    A LazyFrame is collected: the plan is made of its rows.
    """
    for option in ("estimate", "dry_run", "budget", "probe"):
        kwargs.pop(option, None)
    op = _resolve(name, kwargs, budget=False)
    _required(op, kwargs)
    return op.plan(op.compile(Frame.of(frame), template, **kwargs))


def estimate(name: str, frame: Any, template: str, **kwargs: Any) -> Any:
    """The estimate of a call of operator ``name`` (only ``probe=N`` rows are sent).

    A LazyFrame is collected: the estimate is made of its rows.
    """
    for option in ("estimate", "dry_run"):
        kwargs.pop(option, None)
    _required(get_operator(name), kwargs)
    return invoke(name, frame, template, dry_run=True, **kwargs)
