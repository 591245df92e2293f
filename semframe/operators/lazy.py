"""A Polars LazyFrame in, a LazyFrame out: an operator call deferred to ``collect()``.

``lf.llm.map(...)`` on a LazyFrame sends nothing and runs nothing of ``lf``'s
plan. The call is checked on ``lf``'s schema alone: the operator compiles on
an empty frame of that schema (:func:`~semframe.core.frames.schema_only`),
so a template naming a missing column, a bad argument or setting, or a
backend without its SDK or key fails at once, as on an eager frame. The same
operator then runs on that empty frame with a :class:`ProbeRunner` (every
relQuery has no rows; nothing is sent or recorded), which gives the result's
columns and dtypes; the returned LazyFrame has that schema, so ``select``,
``filter`` or ``with_columns`` after it compose before anything runs.

The relQuery runs when the caller collects: the whole collected input, once
(reordering needs every row; the streaming engine does not batch it), as the
eager operator would run it, with the settings and statistics scope in force
at the call (:func:`contextvars.copy_context`). Data-dependent steps happen
there too: ``budget=``'s estimate, ``probe=`` rows, the run, ``RowErrors``
(raised out of ``collect()`` as they are; its ``result`` is the operator's
``polars.DataFrame``, before any later step of the plan). Polars before 1.30
raises a ``ComputeError`` quoting the error instead
(:func:`~semframe.core.frames.errors_pass_through`).

Built-in operators deferred: :data:`LAZY_OPERATORS`. The embedding operators
(``search``, ``sim_join``, ``dedup``, ``cluster``) collect at call time and
return their result lazy: ``cluster`` checks ``k`` against the rows, and
their result could only be typed by embedding. A registered operator is
deferred when it says ``lazy = True``: its ``compile`` and ``run`` must then
work on an empty frame, sending nothing but through the runner.

Examples
--------
>>> import polars as pl, semframe
>>> lf = pl.LazyFrame({"t": ["a", "b"]})
>>> out = lf.llm.map("Echo {t}", out="echo", backend="fake")
>>> out.collect_schema()
Schema([('t', String), ('echo', String)])
>>> out.filter(pl.col("t") == "b").collect()["echo"].to_list()
['fake: b']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from semframe.core.frames import Frame, is_lazy, schema_only
from semframe.core.wire import Outcome
from semframe.errors import plural
from semframe.runtime.call import Call, Runner
from semframe.runtime.stats import OpStats

__all__ = ["LAZY_OPERATORS", "ProbeRunner", "deferrable", "probe_result", "with_collected"]

LAZY_OPERATORS = frozenset({"map", "filter", "extract", "classify", "agg", "topk", "join"})
"""Built-in operators that a LazyFrame defers to ``collect()`` (those sending LLM requests)."""


def deferrable(name: str, operator: object) -> bool:
    """Whether a call of ``operator`` (called ``name``) on a LazyFrame waits for ``collect()``.

    Examples
    --------
    >>> deferrable("map", None), deferrable("cluster", None)
    (True, False)
    >>> class Mine:
    ...     lazy = True
    >>> deferrable("mine", Mine())
    True
    """
    return name in LAZY_OPERATORS or getattr(operator, "lazy", False) is True


class ProbeRunner(Runner):
    """The runner of the schema probe: relQueries over no rows; nothing sent or recorded.

    ``semframe.last_run()`` and ``last_op()`` keep what they said before.
    """

    def run(self, call: Call, *, calibration: int = 0) -> list[Outcome]:
        """No outcomes: the probe's relQueries have no rows."""
        if call.labels:
            msg = (
                f"{self.op} asked for {plural(len(call.labels), 'row')} while typing a LazyFrame "
                "result on an empty frame; such an operator cannot be deferred (give it "
                "lazy = False)."
            )
            raise RuntimeError(msg)
        return []

    def finish(self, *, detail: object = None, **counts: int) -> OpStats:
        """The statistics of nothing, not recorded."""
        return OpStats(self.op, tuple(self.runs), dict(counts), detail)


def probe_result(operator: Any, frame: Any, template: str, arguments: Mapping[str, Any]) -> Any:
    """The empty ``polars.DataFrame`` that the call would return for LazyFrame ``frame``.

    The operator compiles on an empty frame of ``frame``'s schema (a lazy
    ``other=`` too), so every check that needs no data runs here, and runs
    with a :class:`ProbeRunner`.

    Raises
    ------
    SemframeError
        Whatever the operator raises for this call before sending anything.

    Examples
    --------
    >>> import polars as pl
    >>> from semframe.operators.rowwise import CLASSIFY
    >>> probe_result(CLASSIFY, pl.LazyFrame({"t": ["x"]}), "{t}", {"labels": ["a", "b"],
    ...              "errors": "keep", "backend": "fake"}).schema
    Schema([('t', String), ('label', String), ('label_error', String)])
    """
    edge = Frame.of(schema_only(frame))
    arguments = dict(arguments)
    other = arguments.get("other")
    if is_lazy(other):
        arguments["other"] = schema_only(other)
    compiled = operator.compile(edge, template, **arguments)
    return edge.build(operator.run(compiled, ProbeRunner(operator.name)))


def with_collected(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with a lazy ``other=`` collected (at the caller's ``collect()``)."""
    out = dict(arguments)
    other: Any = out.get("other")
    if is_lazy(other):
        out["other"] = other.collect()
    return out
