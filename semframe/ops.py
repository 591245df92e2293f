"""Operators, frame-neutral: compile a call into a relQuery, plan it, run it.

The accessors (``df.llm``) are thin shims over these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semframe import reorder as _reorder
from semframe.config import config
from semframe.errors import InputError, RowError, RowErrors, did_you_mean
from semframe.execute import Outcome
from semframe.frames import adapter_for, is_lazy
from semframe.parse import BOOL, TEXT, OutputSpec
from semframe.plan import Plan, RelQuery, make_plan
from semframe.run import Call, run_call
from semframe.table import Table
from semframe.template import parse_template

OPS: dict[str, OutputSpec] = {"map": TEXT, "filter": BOOL}
# A JSON answer {"answer": "yes"} takes up to ~25 tokens with the whitespace small
# models put in it; a cut-off answer would be a parse error.
DEFAULT_MAX_TOKENS = {"map": 256, "filter": 32}
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
    max_tokens: int | None = None,
    system: str | None = None,
    examples: Sequence[Mapping[str, object]] | None = None,
    truncate: int | Mapping[str, int] | None = None,
    **settings: Any,
) -> Call:
    """Validate a call and build its plan; sends nothing.

    Raises
    ------
    SemframeError
        Any problem with the frame, template, options or settings, before any
        request is sent.
    """
    if op not in OPS:
        msg = f"unknown op {op!r}.{did_you_mean(op, OPS)} Valid ops: {', '.join(map(repr, OPS))}."
        raise InputError(msg)
    if is_lazy(frame):
        frame = frame.collect()
    adapter = adapter_for(frame)
    cfg = config(**settings)
    parsed = parse_template(template).resolve(adapter.columns(frame))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS[op]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        msg = f"max_tokens must be a positive int, got {max_tokens!r}."
        raise InputError(msg)
    if not isinstance(system, str | None):  # callers without type checking
        msg = f"system must be a str or None, got {type(system).__name__}."  # type: ignore[unreachable]
        raise InputError(msg)
    table = _apply_truncate(adapter.to_table(frame, parsed.fields), truncate)
    rq = RelQuery(
        op=op,
        template=parsed,
        table=table,
        output=OPS[op],
        system=system,
        examples=tuple(examples or ()),
        max_tokens=max_tokens,
        temperature=cfg["temperature"],
    )
    method = cfg["reorder"]
    ordering = _reorder.order(table, method)
    return Call(frame, adapter, cfg, make_plan(rq, ordering, method))


def _row_errors(call: Call, outcomes: Sequence[Outcome]) -> list[RowError]:
    labels = call.adapter.labels(call.frame)
    return [
        RowError(i, labels[i], o.error_kind or "", o.error or "", o.attempts)
        for i, o in enumerate(outcomes)
        if not o.ok
    ]


def llm_map(frame: Any, template: str, *, out: str = "llm_output", **kwargs: Any) -> Any:
    """Implementation of ``df.llm.map``; see the accessor for documentation."""
    call = compile_call(frame, template, op="map", **kwargs)
    _check_out(call, out)
    outcomes, _ = run_call(call)
    result = call.adapter.with_column(call.frame, out, [o.value for o in outcomes], "str")
    errors = _row_errors(call, outcomes)
    if call.settings["errors"] == "keep":
        result = call.adapter.with_column(
            result, f"{out}_error", [None if o.ok else _describe(o) for o in outcomes], "str"
        )
    elif errors:
        raise RowErrors(errors, _relazy(frame, result))
    return _relazy(frame, result)


def llm_filter(frame: Any, template: str, **kwargs: Any) -> Any:
    """Implementation of ``df.llm.filter``; see the accessor for documentation."""
    call = compile_call(frame, template, op="filter", **kwargs)
    outcomes, _ = run_call(call)
    errors = _row_errors(call, outcomes)
    keep = [i for i, o in enumerate(outcomes) if o.value is True or not o.ok]
    result = call.adapter.take(call.frame, keep)
    as_column = call.settings["errors"] == "keep"
    if errors or as_column:
        reasons = [None if outcomes[i].ok else _describe(outcomes[i]) for i in keep]
        result = call.adapter.with_column(result, "llm_error", reasons, "str")
    if errors and not as_column:
        raise RowErrors(errors, _relazy(frame, result))
    return _relazy(frame, result)


def llm_plan(frame: Any, template: str, *, op: str = "map", **kwargs: Any) -> Plan:
    """Implementation of ``df.llm.plan``: the plan, nothing sent."""
    kwargs.pop("out", None)
    return compile_call(frame, template, op=op, **kwargs).plan


def _describe(outcome: Outcome) -> str:
    return f"{outcome.error_kind}: {outcome.error} (after {outcome.attempts} attempt(s))"


def _check_out(call: Call, out: str) -> None:
    if not isinstance(out, str) or not out:
        msg = f"out must be a non-empty column name, got {out!r}."
        raise InputError(msg)
    if out in call.adapter.columns(call.frame):
        msg = f"out={out!r} would overwrite an existing column; choose another name."
        raise InputError(msg)


def _relazy(original: Any, result: Any) -> Any:
    if is_lazy(original):
        return result.lazy()
    return result
