"""``df.llm.join``: a semantic join, every candidate pair asked as one relQuery.

The template names columns of both frames as ``{left.col}`` and
``{right.col}``; an unqualified ``{col}`` is allowed when exactly one frame has
that column. Candidate pairs are all pairs, or with ``on=`` only pairs whose
key columns render equal (blocking; missing keys never match). With
``block="embedding"`` each left row keeps only its ``block_k`` most similar
right rows among those candidates, by cosine similarity of embeddings
(:mod:`semframe.operators.embed`) of ``block_on`` (a left and a right column; by default
each side's template fields, joined). The pairs form
one relQuery, ordered so that one side forms the shared prefix: pairs are
grouped by that side's row and its fields come first in every prompt. The side
is the one whose repetition saves more prompt characters (rows that recur in
many pairs, times the length of their fields); with ``reorder="none"`` it is
the left side.

The result holds the matching pairs ordered by left row, then right row (the
callers' row orders), with the left frame's columns then the right frame's;
right columns whose name the left frame has get ``suffix``. pandas results get a
fresh ``RangeIndex``, as ``pandas.merge`` gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from semframe.backends.api_embedders import split_model
from semframe.backends.embedders import resolve_embed_model
from semframe.config import config
from semframe.core.frames import Frame, NewColumn, Output, RightSide
from semframe.core.ordering import Ordering
from semframe.core.parse import BOOL
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import MISSING, Table
from semframe.core.template import Placeholder, Template, parse_template
from semframe.cost.estimate import Estimate
from semframe.errors import ColumnError, InputError, RowError, RowErrors, did_you_mean
from semframe.operators.common import (
    apply_truncate,
    check_error_column,
    check_options,
    check_pair,
    describe,
)
from semframe.operators.embed import embed_groups, index_for, top_k
from semframe.runtime.call import Call, Runner
from semframe.runtime.estimate import estimate_call

__all__ = ["JOIN", "Join", "JoinCall", "compile_join"]

SIDES = ("left", "right")


@dataclass(frozen=True)
class JoinCall:
    """A compiled join: the pairs relQuery and what is needed to build the result.

    Attributes
    ----------
    call : Call
        The pairs relQuery (``call.plan``), one request per candidate pair.
    pairs : tuple of (int, int)
        Candidate pairs (left position, right position), in the result's order.
    left, right : Frame
        The two frames.
    suffix : str
        Added to right column names the left frame also has.
    major : str
        The side whose rows lead each prompt (``"left"`` or ``"right"``).
    """

    call: Call
    pairs: tuple[tuple[int, int], ...]
    left: Frame
    right: Frame
    suffix: str
    major: str


def _qualify(template: Template, left: Sequence[str], right: Sequence[str]) -> Template:
    """Map each placeholder to ``left.col`` / ``right.col``, or fail naming the valid ones."""
    cols = {"left": list(left), "right": list(right)}
    mapping: dict[str, str] = {}
    for name in template.fields:
        side, dot, col = name.partition(".")
        if dot and side in cols:
            if col not in cols[side]:
                shown = ", ".join(repr(c) for c in cols[side])
                msg = (
                    f"template names {name!r}, but the {side} frame has no column {col!r}."
                    f"{did_you_mean(col, cols[side])} {side.capitalize()} columns: {shown}."
                )
                raise ColumnError(msg)
            mapping[name] = name
            continue
        owners = [s for s in SIDES if name in cols[s]]
        if len(owners) == 1:
            mapping[name] = f"{owners[0]}.{name}"
        elif owners:
            msg = (
                f"template column {name!r} is in both frames; write {{left.{name}}} or "
                f"{{right.{name}}}."
            )
            raise ColumnError(msg)
        else:
            msg = (
                f"template names column {name!r}, which neither frame has."
                f"{did_you_mean(name, cols['left'] + cols['right'])} Write {{left.col}} or "
                f"{{right.col}}; left columns: {cols['left']}, right columns: {cols['right']}."
            )
            raise ColumnError(msg)
    parts = tuple(
        Placeholder(mapping[p.name]) if isinstance(p, Placeholder) else p for p in template.parts
    )
    fields = tuple(dict.fromkeys(mapping[f] for f in template.fields))
    return Template(template.text, parts, fields)


def _keys(on: object, left: Sequence[str], right: Sequence[str]) -> list[tuple[str, str]]:
    if on is None:
        return []
    items = [on] if isinstance(on, str | tuple) else on
    if not isinstance(items, list) or not items:
        msg = (
            "on must be a column name, a (left, right) pair of names, or a list of them; "
            f"got {on!r}."
        )
        raise InputError(msg)
    keys: list[tuple[str, str]] = []
    for item in items:
        pair = (item, item) if isinstance(item, str) else item
        if not (
            isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        ):
            msg = (
                f"on entries must be a column name or a (left, right) pair of names; got {item!r}."
            )
            raise InputError(msg)
        for side, name, cols in (("left", pair[0], left), ("right", pair[1], right)):
            if name not in cols:
                msg = (
                    f"on names {name!r}, which the {side} frame does not have."
                    f"{did_you_mean(name, cols)} {side.capitalize()} columns: {list(cols)}."
                )
                raise ColumnError(msg)
        keys.append((pair[0], pair[1]))
    return keys


def compile_join(
    frame: Any,
    other: Any,
    template: str,
    *,
    on: str | tuple[str, str] | Sequence[str | tuple[str, str]] | None = None,
    suffix: str = "_right",
    max_tokens: int | None = None,
    system: str | None = None,
    examples: Sequence[Mapping[str, object]] | None = None,
    truncate: int | Mapping[str, int] | None = None,
    block: str | None = None,
    block_k: int = 5,
    block_on: str | tuple[str, str] | None = None,
    block_model: str | None = None,
    **settings: Any,
) -> JoinCall:
    """Validate a join and build its pairs relQuery; sends nothing.

    ``frame`` and ``other`` are DataFrames (or :class:`~semframe.core.frames.Frame`).
    """
    left, right = Frame.of(frame), Frame.of(other)
    check_pair("join", left, right, suffix)
    cfg = config(**settings)
    lcols, rcols = list(left.columns), list(right.columns)
    parsed = _qualify(parse_template(template), lcols, rcols)
    keys = _keys(on, lcols, rcols)
    max_tokens = check_options("join", max_tokens, system)
    renamed = [c + suffix if c in lcols else c for c in rcols]
    check_error_column(left, cfg, "llm_error")
    if cfg["errors"] == "keep" and "llm_error" in renamed:
        check_error_column(right, cfg, "llm_error")
    clash = sorted(set(renamed) & set(lcols))
    if clash:
        msg = f"suffix={suffix!r} still leaves right columns named like left ones: {clash}."
        raise InputError(msg)
    side_fields = {
        s: [f.partition(".")[2] for f in parsed.fields if f.startswith(s + ".")] for s in SIDES
    }
    tables = {"left": left.table(side_fields["left"]), "right": right.table(side_fields["right"])}
    limits: dict[str, int] | int | None = None
    if truncate is not None:
        limits = truncate if isinstance(truncate, int) else _qualify_limits(truncate, parsed)
    pair_table = _pairs_table(tables, parsed.fields)
    blocking = _blocking(block, block_k, block_on, block_model, left=lcols, right=rcols)
    # with blocking and no keys, the index finds the pairs: all n x m are never listed
    pairs = _candidates(left, right, keys) if keys or blocking is None else []
    if blocking is not None:
        pairs = _embedding_block(
            left,
            right,
            pairs,
            side_fields=side_fields,
            blocking=blocking,
            settings=cfg,
            every_pair=not keys,
        )
    major = _major(tables, pairs) if cfg["reorder"] != "none" else "left"
    table = apply_truncate(pair_table(pairs), limits)
    minor = "right" if major == "left" else "left"
    fields = tuple(f for f in parsed.fields if f.startswith(major + ".")) + tuple(
        f for f in parsed.fields if f.startswith(minor + ".")
    )
    index = 0 if major == "left" else 1
    order = sorted(range(len(pairs)), key=lambda i: (pairs[i][index], pairs[i][1 - index]))
    ordering = Ordering.uniform(order, fields)
    rq = RelQuery(
        "join",
        parsed,
        table,
        BOOL,
        system,
        tuple(examples or ()),
        max_tokens,
        cfg["temperature"],
    )
    plan = make_plan(rq, ordering, f"{major}-first")
    llabels, rlabels = left.labels, right.labels
    call = Call([(llabels[i], rlabels[j]) for i, j in pairs], cfg, plan)
    return JoinCall(call, tuple(pairs), left, right, suffix, major)


def _qualify_limits(truncate: Mapping[str, int], template: Template) -> dict[str, int]:
    """``truncate`` keys as the pairs table names them (``col`` -> ``left.col``)."""
    out: dict[str, int] = {}
    for name, limit in truncate.items():
        options = [f for f in (name, f"left.{name}", f"right.{name}") if f in template.fields]
        out[options[0] if len(options) == 1 else name] = limit
    return out


def _pairs_table(tables: Mapping[str, Table], fields: Sequence[str]) -> Any:
    def build(pairs: Sequence[tuple[int, int]]) -> Table:
        cells: dict[str, tuple[str, ...]] = {}
        for f in fields:
            side, _, col = f.partition(".")
            values = tables[side].cells[col]
            at = 0 if side == "left" else 1
            cells[f] = tuple(values[p[at]] for p in pairs)
        return Table(tuple(fields), cells, len(pairs))

    return build


def _candidates(
    left: Frame, right: Frame, keys: Sequence[tuple[str, str]]
) -> list[tuple[int, int]]:
    """Candidate pairs in (left, right) order: all, or those whose keys render equal."""
    n, m = left.height, right.height
    if not keys:
        return [(i, j) for i in range(n) for j in range(m)]
    lk = left.table([a for a, _ in keys])
    rk = right.table([b for _, b in keys])
    index: dict[tuple[str, ...], list[int]] = {}
    for j in range(m):
        key = tuple(rk.cells[b][j] for _, b in keys)
        if MISSING not in key:
            index.setdefault(key, []).append(j)
    out: list[tuple[int, int]] = []
    for i in range(n):
        key = tuple(lk.cells[a][i] for a, _ in keys)
        if MISSING not in key:
            out.extend((i, j) for j in index.get(key, ()))
    return out


@dataclass(frozen=True)
class _Blocking:
    k: int
    on: tuple[str, str] | None
    model: str | None  # None: the embed_model setting


def _blocking(
    block: object,
    k: object,
    on: object,
    model: object,
    *,
    left: Sequence[str],
    right: Sequence[str],
) -> _Blocking | None:
    """Validate the ``block*`` arguments; None without blocking."""
    if block is None:
        return None
    if block != "embedding":
        msg = f"block must be 'embedding' or None, got {block!r} (exact keys: use on=)."
        raise InputError(msg)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        msg = f"block_k must be a positive int (right rows kept per left row), got {k!r}."
        raise InputError(msg)
    if model is not None:
        try:
            resolve_embed_model(model)  # type: ignore[arg-type]
        except InputError:
            msg = (
                f"unknown block_model {model!r}; valid: 'auto', 'minilm', 'tfidf', a registered "
                "embedder, a path to a BERT sentence-encoder folder, or None (the embed_model "
                "setting)."
            )
            raise InputError(msg) from None
    pair: tuple[str, str] | None = None
    if on is not None:
        if isinstance(on, str):
            on = (on, on)
        if not (isinstance(on, tuple) and len(on) == 2 and all(isinstance(x, str) for x in on)):
            msg = f"block_on must be a column name or a (left, right) pair of names; got {on!r}."
            raise InputError(msg)
        for side, name, cols in (("left", on[0], left), ("right", on[1], right)):
            if name not in cols:
                msg = (
                    f"block_on names {name!r}, which the {side} frame does not have."
                    f"{did_you_mean(name, cols)} {side.capitalize()} columns: {list(cols)}."
                )
                raise ColumnError(msg)
        pair = (on[0], on[1])
    return _Blocking(k, pair, None if model is None else str(model))


def _embedding_block(
    left: Frame,
    right: Frame,
    pairs: Sequence[tuple[int, int]],
    *,
    side_fields: Mapping[str, Sequence[str]],
    blocking: _Blocking,
    settings: Mapping[str, Any],
    every_pair: bool,
) -> list[tuple[int, int]]:
    """The pairs whose right row is among the left row's ``k`` most similar candidates.

    With every pair a candidate (no ``on=``), the right side's index answers
    (exact, or approximate above ``ann_threshold``); otherwise each left row's
    candidates are ranked exactly.
    """
    model = blocking.model if blocking.model is not None else settings["embed_model"]
    if split_model(resolve_embed_model(model)) is not None:
        msg = (
            f"block='embedding' with the API embedding model {model!r} is not supported: "
            "join blocking embeds while the call compiles (its estimate prices the pairs "
            "found), so the embeddings would be billed before any estimate or budget check. "
            "Use a local model (block_model='minilm' or 'tfidf'), or match the tables with "
            "df.llm.sim_join(...) first."
        )
        raise InputError(msg)
    texts = {}
    for at, (side, frame) in enumerate((("left", left), ("right", right))):
        cols = [blocking.on[at]] if blocking.on is not None else list(side_fields[side])
        if not cols:
            msg = (
                f"block='embedding' needs text from the {side} frame: the template names none "
                f"of its columns; pass block_on=(left_column, right_column)."
            )
            raise InputError(msg)
        table = frame.table(cols)
        texts[side] = ["\n".join(table.cells[c][r] for c in cols) for r in range(table.n_rows)]
    embedded = embed_groups([texts["right"], texts["left"]], {**settings, "embed_model": model})
    rvec, lvec = embedded.groups
    if every_pair:
        ids, _ = index_for(embedded, 0, settings).search(lvec, blocking.k)
        return [(i, int(j)) for i in range(len(ids)) for j in sorted(ids[i].tolist()) if j >= 0]
    candidates: list[list[int]] = [[] for _ in range(len(texts["left"]))]
    for i, j in pairs:
        candidates[i].append(j)
    kept = top_k(lvec, rvec, blocking.k, candidates)
    return [(i, j) for i, js in enumerate(kept) for j in js]


def _major(tables: Mapping[str, Table], pairs: Sequence[tuple[int, int]]) -> str:
    """The side whose rows, put first, share more prompt characters between pairs."""
    saved = {}
    for at, side in enumerate(SIDES):
        table = tables[side]
        counts: dict[int, int] = {}
        for p in pairs:
            counts[p[at]] = counts.get(p[at], 0) + 1
        saved[side] = sum(
            (c - 1) * sum(len(table.cells[f][r]) + len(f) + 8 for f in table.columns)
            for r, c in counts.items()
        )
    return "right" if saved["right"] > saved["left"] else "left"


class Join:
    """``df.llm.join``: the pairs of rows of two frames the model says yes to."""

    name = "join"
    required: tuple[str, ...] = ("other",)

    def compile(self, frame: Frame, template: str, *, other: Any, **kwargs: Any) -> JoinCall:
        """Validate the join, find the candidate pairs, plan them; send nothing."""
        return compile_join(frame, other, template, **kwargs)

    def plan(self, jc: JoinCall) -> Plan:
        """The pairs relQuery, exactly."""
        return jc.call.plan

    def estimate(self, jc: JoinCall, *, probe: int) -> Estimate:
        """The pairs relQuery's estimate (pairs the result cache answers are not counted)."""
        return estimate_call(jc.call.plan, jc.call.settings, op="join", probe=probe)

    def run(self, jc: JoinCall, runner: Runner) -> Output:
        """Ask every candidate pair; the matching pairs, left columns then right ones."""
        outcomes = runner.run(jc.call)
        n, m = jc.left.height, jc.right.height
        runner.finish(pairs=len(jc.pairs), naive_pairs=n * m)
        keep_errors = jc.call.settings["errors"] == "keep"
        chosen = [i for i, o in enumerate(outcomes) if o.value is True or o.error_kind is not None]
        lcols = set(jc.left.columns)
        right = RightSide(
            jc.right,
            [jc.pairs[i][1] for i in chosen],
            {c: c + jc.suffix for c in jc.right.columns if c in lcols},
        )
        errors = [
            RowError(
                jc.pairs[i][0],
                jc.call.labels[i],
                o.error_kind or "",
                f"pair with right row {jc.pairs[i][1]}: {o.error}",
                o.attempts,
            )
            for i, o in enumerate(outcomes)
            if o.error_kind is not None
        ]
        columns: tuple[NewColumn, ...] = ()
        if errors or keep_errors:
            reasons = [
                None if outcomes[i].error_kind is None else describe(outcomes[i]) for i in chosen
            ]
            columns = (NewColumn("llm_error", reasons),)
        result = Output(rows=[jc.pairs[i][0] for i in chosen], columns=columns, right=right)
        if errors and not keep_errors:
            raise RowErrors(errors, result, total=len(outcomes))
        return result


JOIN = Join()
