"""``df.llm.topk``: the k rows that best match a criterion, by partial quicksort.

Naively ranking n rows by pairwise comparison asks about every pair,
n(n-1)/2 LLM calls. Here the candidates sit in ordered buckets (best first);
each round picks a pivot in every bucket that still overlaps the top k and
compares the bucket's other rows with it. Those comparisons, over all buckets,
are one relQuery; the answers split each bucket into better / pivot / worse,
and buckets wholly below rank k are dropped. Expected cost is about
2n + O(k log k) comparisons in O(log n) rounds (for n = 1,000 and k = 10,
roughly 2,000 to 3,000 instead of 499,500).

Every comparison prompt shows the pivot as item A and the other row as item B,
so all comparisons with one pivot share the instructions and the pivot's fields
as a prompt prefix. (The pivot is always A: a model with a position bias sees it
the same way throughout a round.)
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from semframe.config import ResolvedConfig, config
from semframe.errors import InputError, RowError, RowErrors
from semframe.execute import RunStats
from semframe.frames import FrameAdapter
from semframe.ops import _apply_truncate, check_options, collect, record_op, relazy, run
from semframe.ordering import Ordering
from semframe.parse import label_spec
from semframe.parts import parts_call
from semframe.plan import Plan, RelQuery, make_plan
from semframe.table import Table
from semframe.template import Template, parse_template

_COMPARE = (
    "Two items, A and B, follow. Which of them matches the criterion above better? "
    'Answer with a JSON object: {"answer": "A"} or {"answer": "B"}.'
)
_SPEC = replace(label_spec(["A", "B"]), instruction="")  # _COMPARE says it


@dataclass(frozen=True)
class TopkPlan:
    """What ``topk`` will send: its first round exactly, and the expected total.

    Attributes
    ----------
    first : Plan
        Round 1: every row compared with the first pivot.
    k : int
        Rows asked for.
    rows : int
        Candidate rows.
    expected_comparisons : int
        About ``2 n + 2 k ln k`` comparisons (quickselect plus sorting the top k).
    naive_comparisons : int
        ``n (n - 1) / 2``: every pair compared once.
    """

    first: Plan
    k: int
    rows: int
    expected_comparisons: int
    naive_comparisons: int

    def explain(self, n: int = 3) -> str:
        """The first round's explanation, preceded by the expected totals."""
        head = (
            f"TopkPlan: top {self.k} of {self.rows} rows; about {self.expected_comparisons:,} "
            f"comparisons expected (naive all pairs: {self.naive_comparisons:,})"
        )
        return head + "\n" + self.first.explain(n)


@dataclass(frozen=True)
class _Topk:
    frame: Any
    adapter: FrameAdapter
    settings: ResolvedConfig
    table: Table
    template: Template
    k: int
    seed: int
    max_tokens: int
    system: str | None


def _compile(
    frame: Any,
    template: str,
    k: int,
    *,
    seed: int = 0,
    max_tokens: int | None = None,
    system: str | None = None,
    truncate: int | Mapping[str, int] | None = None,
    **settings: Any,
) -> _Topk:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        msg = f"k must be a positive int (how many rows to return), got {k!r}."
        raise InputError(msg)
    if isinstance(seed, bool) or not isinstance(seed, int):
        msg = f"seed must be an int (it picks the pivots), got {seed!r}."
        raise InputError(msg)
    frame, adapter = collect(frame)
    cfg = config(**settings)
    parsed = parse_template(template).resolve(adapter.columns(frame))
    max_tokens = check_options("topk", max_tokens, system)
    table = _apply_truncate(adapter.to_table(frame, parsed.fields), truncate)
    fields = tuple(f"{side}.{f}" for side in "AB" for f in parsed.fields)
    compare = Template(parsed.text, ("Criterion: ", *parsed.parts, "\n" + _COMPARE), fields)
    return _Topk(frame, adapter, cfg, table, compare, k, seed, max_tokens, system)


def _round_plan(tk: _Topk, pairs: Sequence[tuple[int, int]]) -> Plan:
    """One relQuery comparing ``(pivot, row)`` pairs; pairs come grouped by pivot."""
    names = tk.table.columns
    data: dict[str, tuple[str, ...]] = {}
    for f in names:
        col = tk.table.cells[f]
        data[f"A.{f}"] = tuple(col[p] for p, _ in pairs)
        data[f"B.{f}"] = tuple(col[r] for _, r in pairs)
    table = Table(tk.template.fields, data, len(pairs))
    rq = RelQuery(
        "topk", tk.template, table, _SPEC, tk.system, (), tk.max_tokens, tk.settings["temperature"]
    )
    return make_plan(rq, Ordering.identity(len(pairs), tk.template.fields), "pivot-first")


def _expected(n: int, k: int) -> int:
    import math

    k = min(k, n)
    return int(2 * n + 2 * k * math.log(max(k, 1))) if n > 1 else 0


def _pivots(buckets: list[list[int]], k: int, rng: random.Random) -> list[tuple[int, int]]:
    """Pivot and comparison pairs for every bucket that still overlaps the top ``k``."""
    pairs: list[tuple[int, int]] = []
    start = 0
    for bucket in buckets:
        if start >= k:
            break
        if len(bucket) > 1:
            pivot = bucket[rng.randrange(len(bucket))]
            pairs.extend((pivot, r) for r in bucket if r != pivot)
        start += len(bucket)
    return pairs


def plan_topk(frame: Any, template: str, k: int, **kwargs: Any) -> TopkPlan:
    """Implementation of ``df.llm.plan(op="topk")``: nothing is sent."""
    tk = _compile(frame, template, k, **kwargs)
    n = tk.table.n_rows
    pairs = _pivots([list(range(n))], k, random.Random(tk.seed))
    return TopkPlan(_round_plan(tk, pairs), k, n, _expected(n, k), n * (n - 1) // 2)


def llm_topk(frame: Any, template: str, k: int, **kwargs: Any) -> Any:
    """Implementation of ``df.llm.topk``; see the accessor for documentation."""
    tk = _compile(frame, template, k, **kwargs)
    n = tk.table.n_rows
    labels = tk.adapter.labels(tk.frame)
    rng = random.Random(tk.seed)
    buckets: list[list[int]] = [list(range(n))] if n else []
    failed: dict[int, RowError] = {}
    runs: list[RunStats] = []
    comparisons = 0
    while True:
        pairs = _pivots(buckets, k, rng)
        if not pairs:
            break
        comparisons += len(pairs)
        call = parts_call(
            [f"comparison of row {labels[r]!r} with pivot row {labels[p]!r}" for p, r in pairs],
            tk.settings,
            _round_plan(tk, pairs),
        )
        outcomes = run(call, runs)
        better: dict[int, list[int]] = {}
        worse: dict[int, list[int]] = {}
        for (p, r), o in zip(pairs, outcomes, strict=True):
            if not o.ok:
                failed[r] = RowError(
                    r,
                    labels[r],
                    o.error_kind or "",
                    f"comparison with row {labels[p]!r}: {o.error}",
                    o.attempts,
                )
            elif o.value == "B":
                better.setdefault(p, []).append(r)
            else:
                worse.setdefault(p, []).append(r)
        pivots = {p for p, _ in pairs}
        split: list[list[int]] = []
        start = 0
        for bucket in buckets:
            if start >= k:
                break
            start += len(bucket)
            pivot = next((r for r in bucket if r in pivots), None)
            if pivot is None:
                split.append(bucket)
                continue
            parts = [better.get(pivot, []), [pivot], worse.get(pivot, [])]
            split.extend(b for b in parts if b)
        buckets = split
    ranked = [r for b in buckets for r in b][:k]
    record_op(
        "topk", runs, comparisons=comparisons, naive_comparisons=n * (n - 1) // 2, rounds=len(runs)
    )
    errors = sorted(failed.values(), key=lambda e: e.row)
    result = tk.adapter.take(tk.frame, ranked)
    if tk.settings["errors"] == "keep":
        failed_rows = [e.row for e in errors]
        result = tk.adapter.take(tk.frame, ranked + failed_rows)
        reasons = [None] * len(ranked) + [f"{e.kind}: {e.message}" for e in errors]
        result = tk.adapter.with_column(result, "llm_error", reasons, "str")
    elif errors:
        raise RowErrors(errors, relazy(frame, result))
    return relazy(frame, result)
