"""What every operator shares: options, compiling a row-by-row relQuery, results and errors.

Operators receive the caller's frame at the edge
(:class:`~semframe.core.frames.Frame`), read the columns they need once, and
describe their result as an :class:`~semframe.core.frames.Output`; the
registry (:mod:`semframe.operators.registry`) builds the caller's frame from
it. Everything here is a plain function of plain data; operators other than
the row-by-row ones (``agg``, ``topk``, ``join``) use the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semframe.backends import get_backend
from semframe.config import ResolvedConfig, config
from semframe.core.frames import Frame, NewColumn, Output
from semframe.core.parse import BOOL, CUT_NOTE, TEXT, OutputSpec
from semframe.core.plan import RelQuery, validate
from semframe.core.table import Table
from semframe.core.template import compile_template
from semframe.core.wire import Outcome, failed
from semframe.errors import InputError, RowError, RowErrors, plural
from semframe.runtime.call import Call, Recipe

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FIXED_OUTPUTS",
    "LOGPROB_BACKENDS",
    "TOP_LOGPROBS",
    "TRUNCATION_MARK",
    "apply_truncate",
    "check_error_column",
    "check_logprobs",
    "check_new_columns",
    "check_options",
    "check_pair",
    "check_truncated_column",
    "compile_call",
    "compile_relquery",
    "describe",
    "finish",
    "row_errors",
    "truncated_marks",
    "was_cut",
]

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
"""``max_tokens`` of each built-in operator when the call does not say."""
FIXED_OUTPUTS: dict[str, OutputSpec] = {"map": TEXT, "filter": BOOL}
"""Operators whose answer format is fixed; the others build theirs from arguments."""
TRUNCATION_MARK = "…"
"""Ends a cell cut by ``truncate=``."""
TOP_LOGPROBS = 5
"""Top alternatives per token asked for when a confidence is needed."""
LOGPROB_BACKENDS = ("openai", "local", "vllm", "fake (after FakeBackend.set_logprobs)")
"""Backends that can report token logprobs, as error messages name them."""


def apply_truncate(table: Table, truncate: int | Mapping[str, int] | None) -> Table:
    """``table`` with cells cut to ``truncate`` characters (per column with a mapping).

    Examples
    --------
    >>> t = Table.from_columns({"a": ["abcdef", "ab"]})
    >>> apply_truncate(t, 4).cells["a"]
    ('abc…', 'ab')
    """
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


def check_options(op: str, max_tokens: object, system: object) -> int:
    """Validate ``max_tokens`` and ``system``; return ``max_tokens`` or the op's default."""
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS.get(op, 256)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        msg = f"max_tokens must be a positive int, got {max_tokens!r}."
        raise InputError(msg)
    if not isinstance(system, str | None):
        msg = f"system must be a str or None, got {type(system).__name__}."
        raise InputError(msg)
    return max_tokens


def check_new_columns(frame: Frame, names: Sequence[str], what: str = "out") -> None:
    """Fail unless every name is a non-empty string naming no existing column."""
    existing = frame.columns
    for out in names:
        if not isinstance(out, str) or not out:
            msg = f"{what} must be a non-empty column name, got {out!r}."
            raise InputError(msg)
        if out in existing:
            msg = f"{what}={out!r} would overwrite an existing column; choose another name."
            raise InputError(msg)


def check_error_column(frame: Frame, settings: Mapping[str, Any], name: str) -> None:
    """With ``errors="keep"``, fail if the error column ``name`` already exists."""
    if settings["errors"] == "keep" and name in frame.columns:
        msg = (
            f"errors='keep' adds the column {name!r}, which the frame already has; "
            "rename that column first."
        )
        raise InputError(msg)


def check_truncated_column(
    frame: Frame, settings: Mapping[str, Any], name: str, new_columns: Sequence[str] = ()
) -> None:
    """With ``truncated="keep"``, fail if the marker column ``name`` would clash.

    Examples
    --------
    >>> import pandas as pd
    >>> frame = Frame.of(pd.DataFrame({"t_truncated": [1]}))
    >>> check_truncated_column(frame, {"truncated": "keep"}, "t_truncated")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: truncated='keep' adds the column 't_truncated', which the frame ...
    >>> check_truncated_column(frame, {"truncated": "error"}, "t_truncated")  # nothing is added
    """
    if settings["truncated"] != "keep":
        return
    if name in frame.columns:
        msg = (
            f"truncated='keep' adds the column {name!r}, which the frame already has; "
            "rename that column first."
        )
        raise InputError(msg)
    if name in new_columns:
        msg = (
            f"truncated='keep' adds the column {name!r}, which this call also adds; "
            "choose another name for it."
        )
        raise InputError(msg)


def compile_relquery(
    frame: Frame,
    template: str,
    *,
    op: str,
    output: OutputSpec,
    settings: ResolvedConfig,
    max_tokens: int | None = None,
    system: str | None = None,
    examples: Sequence[Mapping[str, object]] | None = None,
    truncate: int | Mapping[str, int] | None = None,
    new_columns: Sequence[str] = (),
    what: str = "out",
    error_column: str | None = None,
    truncated_column: str | None = None,
) -> Call:
    """Validate a row-by-row call (one request per row); sends nothing.

    The call's plan is built on first use of ``call.plan`` (a call served
    whole from the result cache is never ordered or rendered). The columns
    the result will add are checked too: ``new_columns`` (named ``what`` in
    messages) must not exist, nor ``error_column`` with ``errors="keep"``.

    An operator that marks kept cut answers names its marker column
    ``truncated_column``: with ``truncated="keep"`` that column is checked
    like the others and ``output`` keeps cut answers that parse
    (:meth:`~semframe.core.parse.OutputSpec.with_truncated`). Without it, an
    answer cut at ``max_tokens`` is always an error, whatever the setting.

    Raises
    ------
    SemframeError
        Any problem with the frame, template or options, before any request is sent.
    """
    parsed = compile_template(template, frame.columns)
    limit = check_options(op, max_tokens, system)
    table = apply_truncate(frame.table(parsed.fields), truncate)
    if truncated_column is not None:
        check_truncated_column(frame, settings, truncated_column, new_columns)
        output = output.with_truncated(settings["truncated"])
    rq = RelQuery(
        op=op,
        template=parsed,
        table=table,
        output=output,
        system=system,
        examples=_examples(examples, parsed.fields),
        max_tokens=limit,
        temperature=settings["temperature"],
    )
    validate(rq)
    check_new_columns(frame, new_columns, what)
    if error_column is not None:
        check_error_column(frame, settings, error_column)
    return Call(frame.labels, settings, Recipe(rq, settings["reorder"]))


def _examples(examples: object, fields: Sequence[str]) -> tuple[Mapping[str, object], ...]:
    """``examples`` as a tuple; an :class:`InputError` unless it is a list (or tuple).

    Its items are checked by :func:`~semframe.core.plan.check_examples`.

    Examples
    --------
    >>> _examples(None, ["t"])
    ()
    >>> _examples(5, ["t"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: examples must be a list of mappings, each with the keys ['t', 'answer'], got int (5).
    """  # noqa: E501
    if examples is None:
        return ()
    if isinstance(examples, list | tuple):
        return tuple(examples)
    keys = [*fields, "answer"]
    hint = (
        "; wrap the one example in a list, examples=[{...}]"
        if isinstance(examples, Mapping)
        else ""
    )
    msg = (
        f"examples must be a list of mappings, each with the keys {keys!r}, got "
        f"{type(examples).__name__} ({_short_repr(examples)}){hint}."
    )
    raise InputError(msg)


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    """A validated row-by-row call on a DataFrame (or :class:`Frame`); sends nothing.

    ``output`` defaults to the fixed format of ``op`` (``map``: text,
    ``filter``: yes/no). Settings are resolved as for an operator call.

    Examples
    --------
    >>> import pandas as pd
    >>> call = compile_call(pd.DataFrame({"t": ["a", "b"]}), "Echo {t}", op="map",
    ...                     backend="fake")
    >>> len(call.plan.requests), call.settings["backend"]
    (2, 'fake')
    """
    if output is None:
        output = FIXED_OUTPUTS.get(op)
        if output is None:
            msg = f"compile_call(op={op!r}) needs output=; ops with a fixed format: map, filter."
            raise InputError(msg)
    return compile_relquery(
        Frame.of(frame),
        template,
        op=op,
        output=output,
        settings=config(**settings),
        max_tokens=max_tokens,
        system=system,
        examples=examples,
        truncate=truncate,
    )


def describe(outcome: Outcome) -> str:
    """Why a row has no value: ``"<kind>: <detail> (after <n> attempts)"``."""
    return f"{outcome.error_kind}: {outcome.error} (after {plural(outcome.attempts, 'attempt')})"


def was_cut(outcome: Outcome) -> bool:
    """Whether ``outcome`` has a value that was cut at ``max_tokens`` and kept.

    Such an outcome (``truncated="keep"``) has no error kind and a note in
    ``error`` starting with :data:`~semframe.core.parse.CUT_NOTE`.
    """
    note = outcome.error
    return outcome.error_kind is None and note is not None and note.startswith(CUT_NOTE)


def truncated_marks(
    call: Call, outcomes: Sequence[Outcome], name: str, rows: Sequence[int] | None = None
) -> list[NewColumn]:
    """The marker column of kept cut answers: ``[]`` unless the call keeps them.

    With ``truncated="keep"`` (the call's answer format keeps cut answers),
    one bool column ``name``: True where the row's value is an answer cut at
    ``max_tokens``, False elsewhere (failed rows included: their error says
    why). ``rows`` picks the outcomes of the result's rows (``filter``).
    """
    if not call.relquery.output.keeps_truncated:
        return []
    picked = outcomes if rows is None else [outcomes[i] for i in rows]
    return [NewColumn(name, [was_cut(o) for o in picked], "bool")]


def row_errors(labels: Sequence[object], outcomes: Sequence[Outcome]) -> list[RowError]:
    """One :class:`~semframe.errors.RowError` per failed outcome (row order)."""
    errors = []
    for i in failed(outcomes):
        o = outcomes[i]
        errors.append(RowError(i, labels[i], o.error_kind or "", o.error or "", o.attempts))
    return errors


def finish(call: Call, outcomes: Sequence[Outcome], output: Output, error_column: str) -> Output:
    """Row-aligned operators: add the error column (``errors="keep"``) or raise RowErrors.

    Raises
    ------
    RowErrors
        With ``output`` as its ``result`` (the registry builds it into a frame).
    """
    if call.settings["errors"] == "keep":
        reasons = [None if o.error_kind is None else describe(o) for o in outcomes]
        return output.with_columns(NewColumn(error_column, reasons))
    errors = row_errors(call.labels, outcomes)
    if errors:
        raise RowErrors(errors, output, total=len(outcomes))
    return output


def check_logprobs(settings: Mapping[str, Any], what: str) -> None:
    """Fail before sending unless the backend of ``settings`` reports token logprobs."""
    if settings["batch"]:
        msg = (
            f"{what} needs token logprobs, which batch=True runs do not return; run without "
            "batch=True."
        )
        raise InputError(msg)
    backend = get_backend(settings["backend"], model=settings["model"], settings=settings)
    if not backend.capabilities.logprobs:
        msg = (
            f"{what} needs token logprobs, which backend {backend.name!r} (model "
            f"{backend.model!r}) does not report. Backends that can: "
            f"{', '.join(LOGPROB_BACKENDS)}."
        )
        raise InputError(msg)


def check_pair(op: str, left: Frame, right: Frame, suffix: object) -> None:
    """The checks of a two-frame operator: same library, a usable ``suffix``.

    Raises
    ------
    InputError
        When the frames come from different libraries or ``suffix`` is not a
        non-empty str.
    """
    if not left.same_library(right):
        a, b = left.data, right.data
        msg = (
            f"{op} needs two frames of the same library; got {type(a).__module__}."
            f"{type(a).__name__} and {type(b).__module__}.{type(b).__name__}."
        )
        raise InputError(msg)
    if not isinstance(suffix, str) or not suffix:
        msg = f"suffix must be a non-empty str, got {suffix!r}."
        raise InputError(msg)
