"""``df.llm.agg``: one answer per group (or one overall), reduced hierarchically.

Rows are read in the GGR order of the template's fields, so rows that share
values sit next to each other. Each group's rows are folded, in that order, into
chunks that fit the backend's context window; every chunk is one request. A
group that fits one chunk is answered at once. Otherwise its chunk answers are
combined, again in chunks that fit, level after level, until one answer is left.
Every level is one relQuery over all groups that still need it (run with
``run_call``), ordered so that a group's requests follow each other and share
the instructions and the group's key as a prefix.

Inside a chunk, fields whose value is the same on every row of the chunk are
written once (``shared by all rows:``) rather than on every row.

An answer cut at ``max_tokens`` is asked again, then fails its group. With
``truncated="keep"`` a cut answer is used as it is (a partial answer is
combined at the next level) and the group's answer is marked True in a
``<out>_truncated`` column when any answer it was built from was cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from semframe import reorder as _reorder
from semframe.backends import Backend, get_backend
from semframe.config import ResolvedConfig, config
from semframe.core.frames import Frame, NewColumn, Output
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table, fence
from semframe.core.template import Template, compile_template
from semframe.cost.estimate import Estimate
from semframe.errors import ColumnError, InputError, RowError, RowErrors, did_you_mean, plural
from semframe.operators.common import (
    apply_truncate,
    check_new_columns,
    check_options,
    check_truncated_column,
    was_cut,
)
from semframe.runtime.call import Call, Runner
from semframe.runtime.estimate import estimate_first_round

__all__ = ["AGG", "Agg", "AggPlan"]

ROWS_FIELD = "rows"
PARTS_FIELD = "partial answers"
_OVERHEAD_TOKENS = 64  # chat template, segment labels and separators, generously
_SAFETY = 0.9  # token counts of pieces add up only approximately

_LEAF = (
    "Answer this for all the rows below taken together (they may be one part of a "
    "larger set; answer for the rows shown)."
)
_COMBINE = (
    "The rows were too many for one request, so they were answered in parts. Below are "
    "the answers for each part. Combine them into one answer, as if answering for all "
    "the rows at once."
)


@dataclass(frozen=True)
class AggPlan:
    """What ``agg`` will send: its first relQuery exactly, and the size of the rest.

    Attributes
    ----------
    first : Plan
        Level 0: one request per chunk of rows.
    groups : int
        Number of groups (one answer each).
    chunks : tuple of int
        Chunks per group, in the result's group order.
    levels : int
        Levels of reduction needed at most, level 0 included (assuming every
        partial answer uses the full ``max_tokens``).
    max_requests : int
        Requests over all levels at most (the same assumption).
    chunk_tokens : int or None
        Token budget of a chunk's rows (``None``: no known context window, one
        chunk per group).
    """

    first: Plan
    groups: int
    chunks: tuple[int, ...]
    levels: int
    max_requests: int
    chunk_tokens: int | None

    def explain(self, n: int = 3) -> str:
        """The level-0 plan's explanation, preceded by the reduction's shape."""
        head = (
            f"AggPlan: {plural(self.groups, 'group')}, {plural(sum(self.chunks), 'chunk')} at "
            f"level 0 (largest group {max(self.chunks, default=0)}), up to "
            f"{plural(self.levels, 'level')} and {plural(self.max_requests, 'request')} in all; "
            f"chunk budget {self.chunk_tokens} tokens"
        )
        return head + "\n" + self.first.explain(n)


@dataclass(frozen=True)
class _Agg:
    frame: Frame
    backend: Backend
    settings: ResolvedConfig
    by: tuple[str, ...]
    out: str
    keys: tuple[tuple[str, ...], ...]  # rendered key of each group
    firsts: tuple[int, ...]  # first row of each group
    chunk_rows: tuple[tuple[tuple[int, ...], ...], ...]  # per group, its chunks' rows
    plan: AggPlan
    budget: int | None
    template: Template


def _check_by(by: object, columns: Sequence[str]) -> tuple[str, ...]:
    if by is None:
        return ()
    names = [by] if isinstance(by, str) else by
    if not isinstance(names, list | tuple) or not all(isinstance(b, str) for b in names):
        msg = f"by must be a column name or a list of column names, got {by!r}."
        raise InputError(msg)
    for b in names:
        if b not in columns:
            msg = (
                f"by names column {b!r}, which the frame does not have."
                f"{did_you_mean(b, columns)} Available columns: {', '.join(map(repr, columns))}."
            )
            raise ColumnError(msg)
    if len(set(names)) != len(names):
        msg = f"by names a column twice: {list(names)!r}."
        raise InputError(msg)
    return tuple(names)


def _level_template(parsed: Template, by: Sequence[str], field: str, note: str) -> Template:
    text = parsed.text + "\n" + note
    return Template(text, (*parsed.parts, "\n" + note), (*by, field))


def _render_chunk(table: Table, rows: Sequence[int], orders: Mapping[int, Sequence[str]]) -> str:
    """The rows of one chunk, each field indented under its row.

    A cell's own line breaks are fenced once more here (its later lines start
    four spaces in), so a value cannot start a line that reads as a field of
    this row (two spaces) or as a new row (none).
    """
    fields = orders[rows[0]] if rows else ()
    shared = [f for f in fields if len(rows) > 1 and len({table.cells[f][r] for r in rows}) == 1]
    lines = []
    if shared:
        lines.append("shared by all rows:")
        lines.extend(f"  {f}: {fence(table.cells[f][rows[0]])}" for f in shared)
    for n, r in enumerate(rows, 1):
        own = [f for f in orders[r] if f not in shared]
        lines.append(f"row {n}:")
        lines.extend(f"  {f}: {fence(table.cells[f][r])}" for f in own)
    return "\n" + "\n".join(lines)


def _part(number: int, answer: str) -> str:
    """A partial answer as the next level reads it; the answer's own lines are fenced."""
    return f"\npart {number}: {fence(answer)}"


def _fold(sizes: Sequence[int], budget: int | None) -> list[tuple[int, int]]:
    """Greedy chunks ``[start, stop)`` of consecutive items whose sizes fit ``budget``."""
    if budget is None:
        return [(0, len(sizes))] if sizes else []
    chunks: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > budget:
            chunks.append((start, i))
            start, used = i, 0
        used += size
    if sizes:
        chunks.append((start, len(sizes)))
    return chunks


def _compile(
    frame: Frame,
    template: str,
    *,
    by: str | Sequence[str] | None = None,
    out: str = "llm_output",
    max_tokens: int | None = None,
    system: str | None = None,
    truncate: int | Mapping[str, int] | None = None,
    chunk_tokens: int | None = None,
    **settings: Any,
) -> _Agg:
    cfg = config(**settings)
    columns = frame.columns
    parsed = compile_template(template, columns)
    by_cols = _check_by(by, columns)
    max_tokens = check_options("agg", max_tokens, system)
    if chunk_tokens is not None and (
        isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1
    ):
        msg = f"chunk_tokens must be a positive int (tokens per chunk), got {chunk_tokens!r}."
        raise InputError(msg)
    fields = tuple(f for f in parsed.fields if f not in by_cols)
    if not fields:
        msg = (
            f"the template names only the by columns {list(by_cols)!r}; name at least one "
            "other column, whose rows are summarised."
        )
        raise InputError(msg)
    if ROWS_FIELD in by_cols or PARTS_FIELD in by_cols:
        msg = f"by may not name a column {ROWS_FIELD!r} or {PARTS_FIELD!r} (used by agg's prompts)."
        raise InputError(msg)
    table = apply_truncate(frame.table(fields), truncate)
    keys_table = frame.table(by_cols)
    check_new_columns(frame, [out])
    if cfg["errors"] == "keep":
        check_new_columns(frame, [f"{out}_error"], "error column")
    check_truncated_column(frame, cfg, f"{out}_truncated", [out])

    # Rows in the GGR order of the fields; groups in order of first appearance.
    ordering = _reorder.order(table, cfg["reorder"])
    orders = dict(zip(ordering.rows.tolist(), ordering.fields, strict=True))
    group_of: dict[tuple[str, ...], int] = {}
    firsts: list[int] = []
    for r in range(table.n_rows):
        key = tuple(keys_table.cells[b][r] for b in by_cols)
        if key not in group_of:
            group_of[key] = len(firsts)
            firsts.append(r)
    keys = list(group_of)
    members: list[list[int]] = [[] for _ in keys]
    for r in ordering.rows.tolist():
        members[group_of[tuple(keys_table.cells[b][r] for b in by_cols)]].append(r)

    backend = get_backend(cfg["backend"], model=cfg["model"], settings=cfg)
    level0 = _level_template(parsed, by_cols, ROWS_FIELD, _LEAF)
    level1 = _level_template(parsed, by_cols, PARTS_FIELD, _COMBINE)
    row_texts = [_render_chunk(table, [r], orders) for r in range(table.n_rows)]
    window = backend.capabilities.context_window
    fixed = ([level0, level1], keys, by_cols, system)
    # A text's UTF-8 byte length bounds its token count from above: when every
    # group fits by bytes, nothing needs the tokenizer (which may start an engine).
    budget = _budget(window, chunk_tokens, max_tokens, *fixed, _utf8_sizes, backend, exact=False)
    sizes = _utf8_sizes(row_texts)
    if budget is None or any(sum(sizes[r] + 4 for r in rows) > budget for rows in members):
        budget = _budget(window, chunk_tokens, max_tokens, *fixed, backend.count_tokens, backend)
        sizes = backend.count_tokens(row_texts) if budget is not None else [0] * table.n_rows
    labels = frame.labels
    for r, size in enumerate(sizes):
        if budget is not None and size > budget:
            longest = max(fields, key=lambda c: len(table.cells[c][r]))
            length = len(table.cells[longest][r])
            msg = (
                f"row {r} (label {labels[r]!r}) needs about {size} tokens, more than the "
                f"{budget} a chunk of agg's rows may hold on {backend.name}/{backend.model}. "
                f"Its longest cell is column {longest!r} ({length:,} characters); pass "
                f"truncate={{{longest!r}: {max(1, length * budget // max(size, 1) // 2)}}}."
            )
            raise InputError(msg)
    chunk_rows = tuple(
        tuple(tuple(rows[a:b]) for a, b in _fold([sizes[r] + 4 for r in rows], budget))
        for rows in members
    )
    first = _level_plan(
        level0,
        by_cols,
        ROWS_FIELD,
        [
            (keys[g], _render_chunk(table, c, orders))
            for g, chunks in enumerate(chunk_rows)
            for c in chunks
        ],
        max_tokens,
        system,
        cfg,
    )
    levels, total = _shape([len(c) for c in chunk_rows], budget, max_tokens)
    plan = AggPlan(first, len(keys), tuple(len(c) for c in chunk_rows), levels, total, budget)
    return _Agg(
        frame,
        backend,
        cfg,
        by_cols,
        out,
        tuple(keys),
        tuple(firsts),
        chunk_rows,
        plan,
        budget,
        level1,
    )


def _utf8_sizes(texts: Sequence[str]) -> list[int]:
    return [len(t.encode()) for t in texts]


def _budget(  # noqa: PLR0917
    window: int | None,
    chunk_tokens: int | None,
    max_tokens: int,
    templates: Sequence[Template],
    keys: Sequence[tuple[str, ...]],
    by: Sequence[str],
    system: str | None,
    count: Callable[[Sequence[str]], list[int]],
    backend: Any,
    *,
    exact: bool = True,
) -> int | None:
    """Tokens a chunk's rows may take; ``chunk_tokens`` caps it.

    The window less output, instructions and the longest group key (sized
    with ``count``), with a safety margin. Not ``exact`` (sizes are upper
    bounds): ``None`` where only exact counts can tell whether anything fits.
    """
    if window is None:
        return chunk_tokens
    fixed_texts = [t.instruction() for t in templates]
    longest_key = max(keys, key=lambda k: sum(map(len, k)), default=("",) * len(by))
    fixed_texts.append("".join(f"{b}: {v}\n" for b, v in zip(by, longest_key, strict=True)))
    fixed_texts.append(system or "")
    counts = count(fixed_texts)
    fixed = max(counts[: len(templates)]) + sum(counts[len(templates) :])
    room = int(_SAFETY * (window - max_tokens - _OVERHEAD_TOKENS)) - fixed
    if room < 2 * (max_tokens + 8):
        if not exact:
            return None
        msg = (
            f"agg cannot fit two partial answers of max_tokens={max_tokens} in one request "
            f"on {backend.name}/{backend.model} (context window {window} tokens, of which "
            f"{fixed} are instructions); lower max_tokens or shorten the template."
        )
        raise InputError(msg)
    return int(room if chunk_tokens is None else min(room, chunk_tokens))


def _shape(chunks: Sequence[int], budget: int | None, max_tokens: int) -> tuple[int, int]:
    """(levels, requests) at most, if every partial answer is ``max_tokens`` long."""
    per = max(2, (budget or 0) // (max_tokens + 8)) if budget is not None else 0
    levels, total = (1 if chunks else 0), sum(chunks)
    current = [c for c in chunks if c > 1]
    while current:
        levels += 1
        current = [-(-c // per) if per else 1 for c in current]
        total += sum(current)
        current = [c for c in current if c > 1]
    return levels, total


def _level_plan(  # noqa: PLR0917
    template: Template,
    by: Sequence[str],
    field: str,
    items: Sequence[tuple[tuple[str, ...], str]],
    max_tokens: int,
    system: str | None,
    cfg: ResolvedConfig,
) -> Plan:
    data: dict[str, tuple[str, ...]] = {b: tuple(k[i] for k, _ in items) for i, b in enumerate(by)}
    data[field] = tuple(text for _, text in items)
    table = Table((*by, field), data, len(items))
    spec = TEXT.with_truncated(cfg["truncated"])
    rq = RelQuery("agg", template, table, spec, system, (), max_tokens, cfg["temperature"])
    # Items come grouped (a group's chunks in GGR row order); the key leads every
    # prompt so a group's requests share it. Reordering the level table itself
    # would lead with the unique chunk text instead.
    ordering = Ordering.identity(len(items), (*by, field))
    return make_plan(rq, ordering, "grouped")


class Agg:
    """``df.llm.agg``: one answer per group of rows (or one over all), reduced level by level."""

    name = "agg"
    required: tuple[str, ...] = ()

    def compile(self, frame: Frame, template: str, **kwargs: Any) -> _Agg:
        """Validate the call, fold the rows into chunks and plan level 0; send nothing."""
        return _compile(frame, template, **kwargs)

    def plan(self, agg: _Agg) -> AggPlan:
        """Level 0 exactly, and a bound on the rest."""
        return agg.plan

    def estimate(self, agg: _Agg, *, probe: int) -> Estimate:
        """Level 0 simulated and scaled to every level (an upper bound)."""
        return estimate_first_round(
            agg.plan.first,
            agg.settings,
            op="agg",
            probe=probe,
            total=agg.plan.max_requests,
            what="the later reduction levels are extrapolated from the first (an upper bound)",
        )

    def run(self, agg: _Agg, runner: Runner) -> Output:
        """Run level after level until every group has one answer."""
        return _run_agg(agg, runner)


def _run_agg(agg: _Agg, runner: Runner) -> Output:
    cfg = agg.settings
    labels = agg.frame.labels
    n_groups = len(agg.keys)
    answers: list[str | None] = [None] * n_groups
    errors: dict[int, str] = {}
    cut: set[int] = set()  # groups with a kept cut answer anywhere in their reduction
    # Work items of the current level: (group, text, label) per request.
    pending: list[tuple[int, str, str]] = []
    level_plan = agg.plan.first
    items = [
        (g, _label(agg, g, c, labels)) for g, chunks in enumerate(agg.chunk_rows) for c in chunks
    ]
    level = 0
    while items:
        outcomes = runner.run(Call([label for _, label in items], cfg, level_plan))
        partials: dict[int, list[str]] = {}
        for (g, label), outcome in zip(items, outcomes, strict=True):
            if g in errors:
                continue
            if outcome.error_kind is not None:
                errors[g] = (
                    f"{outcome.error_kind} error at level {level} in {label}: {outcome.error} "
                    f"(after {plural(outcome.attempts, 'attempt')})"
                )
                continue
            if was_cut(outcome):
                cut.add(g)
            partials.setdefault(g, []).append(str(outcome.value))
        pending = []
        for g, texts in partials.items():
            if g in errors:
                continue
            if len(texts) == 1:
                answers[g] = texts[0]
            else:
                pending.extend((g, t, f"group {_key(agg, g)}") for t in texts)
        if not pending:
            break
        level += 1
        level_plan, items = _next_level(agg, pending, level)
    runner.finish(levels=level + 1 if runner.runs else 0, groups=n_groups)
    # Each group's first row carries its key columns (dtypes kept); only the key
    # and answer columns are kept, under fresh labels.
    columns = [NewColumn(agg.out, answers)]
    if cfg["truncated"] == "keep":
        marks = [g in cut and g not in errors for g in range(n_groups)]
        columns.append(NewColumn(f"{agg.out}_truncated", marks, "bool"))
    if cfg["errors"] == "keep":
        columns.append(NewColumn(f"{agg.out}_error", [errors.get(g) for g in range(n_groups)]))
    result = Output(rows=agg.firsts, keep=agg.by, columns=tuple(columns), fresh_labels=True)
    failed = [
        RowError(g, _key(agg, g), "agg", errors[g], 0) for g in range(n_groups) if g in errors
    ]
    if failed and cfg["errors"] != "keep":
        raise RowErrors(failed, result, total=n_groups)
    return result


def _key(agg: _Agg, g: int) -> object:
    key = agg.keys[g]
    return key[0] if len(key) == 1 else (key if key else "(all rows)")


def _label(agg: _Agg, g: int, chunk: Sequence[int], labels: Sequence[object]) -> str:
    n = len(agg.chunk_rows[g])
    where = f"group {_key(agg, g)!r}" if agg.by else "all rows"
    return (
        f"chunk of {where} ({plural(len(chunk), 'row')}, labels {labels[chunk[0]]!r}..."
        f"{labels[chunk[-1]]!r}; {plural(n, 'chunk')} in the group)"
    )


def _next_level(
    agg: _Agg, pending: Sequence[tuple[int, str, str]], level: int
) -> tuple[Plan, list[tuple[int, str]]]:
    """Fold each group's partial answers into chunks that fit; one relQuery for all."""
    cfg = agg.settings
    backend = agg.backend
    texts = [_part(i + 1, t) for i, (_, t, _) in enumerate(pending)]
    sizes = backend.count_tokens(texts) if agg.budget is not None else [0] * len(texts)
    by_group: dict[int, list[int]] = {}
    for i, (g, _, _) in enumerate(pending):
        by_group.setdefault(g, []).append(i)
    items: list[tuple[tuple[str, ...], str]] = []
    work: list[tuple[int, str]] = []
    for g, idx in by_group.items():
        budget = agg.budget
        chunks = _fold([sizes[i] for i in idx], budget)
        if len(chunks) == 1 or len(chunks) == len(idx):
            # All fit, or none pair up: combine everything / halves, never stall.
            chunks = [(0, len(idx))] if len(chunks) == 1 else _halves(len(idx))
        for a, b in chunks:
            body = "".join(_part(j + 1, pending[idx[k]][1]) for j, k in enumerate(range(a, b)))
            items.append((agg.keys[g], body))
            where = f"group {_key(agg, g)!r}" if agg.by else "all rows"
            work.append((g, f"level-{level} combination of {where} (parts {a + 1}-{b})"))
    max_tokens = agg.plan.first.relquery.max_tokens
    plan = _level_plan(
        agg.template, agg.by, PARTS_FIELD, items, max_tokens, agg.plan.first.relquery.system, cfg
    )
    return plan, work


def _halves(n: int) -> list[tuple[int, int]]:
    return [(i, min(i + 2, n)) for i in range(0, n, 2)]


AGG = Agg()
