"""``df.llm.topk``: the k rows that best match a criterion, by partial quicksort.

Naively ranking n rows by pairwise comparison asks about every pair,
n(n-1)/2 LLM calls. Here the candidates sit in ordered buckets (best first);
each round picks a pivot in every bucket that still overlaps the top k and
compares the bucket's other rows with it. Those comparisons, over all buckets,
are one relQuery; the answers split each bucket into better / pivot / worse,
and buckets wholly below rank k are dropped. A bucket of m rows that must
yield only its best t picks as pivot the winner of a knockout among m // 4t
random rows (each knockout round one small relQuery), so one pass keeps the top
t with few rows around them. Measured on 1,000 movie reviews
(``benchmarks/operators.py``): 1,255 comparisons for k = 1, 1,452 for k = 10,
3,165 for k = 100, against 499,500.

Every comparison prompt shows the pivot as item A and the other row as item B,
so all comparisons with one pivot share the instructions and the pivot's fields
as a prompt prefix. (The pivot is always A: a model with a position bias sees it
the same way throughout a round.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from semframe.config import ResolvedConfig, config
from semframe.core.frames import Frame, NewColumn, Output
from semframe.core.ordering import Ordering
from semframe.core.parse import label_spec
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table
from semframe.core.template import Template, compile_template
from semframe.core.wire import Outcome
from semframe.cost.estimate import Estimate
from semframe.errors import InputError, RowError, RowErrors
from semframe.operators.common import apply_truncate, check_error_column, check_options
from semframe.runtime.call import Call, Runner
from semframe.runtime.estimate import estimate_first_round

__all__ = ["TOPK", "Ranking", "Topk", "TopkCall", "TopkPlan", "compile_topk", "rank"]

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
        A rough expectation: one pass over n rows, the pivot sample, and about
        4 k ln(4 k) to order the rows near the top.
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
class TopkCall:
    """A compiled ``topk``: the criterion's rows and how to compare them; nothing sent.

    ``search(rerank=...)`` ranks its candidates with one, cut to their rows
    (``dataclasses.replace(call, table=call.table.take(rows))``).

    Attributes
    ----------
    frame : Frame
        The caller's frame.
    settings : ResolvedConfig
        The call's settings.
    table : Table
        The criterion's columns, one row per row to rank.
    template : Template
        The comparison prompt (the criterion, then items A and B).
    k : int
        Rows to rank.
    seed : int
        Seeds the pivot choice.
    max_tokens : int
        Output limit of a comparison.
    system : str or None
        The system message.
    """

    frame: Frame
    settings: ResolvedConfig
    table: Table
    template: Template
    k: int
    seed: int
    max_tokens: int
    system: str | None


def compile_topk(
    frame: Frame,
    template: str,
    *,
    k: int,
    seed: int = 0,
    max_tokens: int | None = None,
    system: str | None = None,
    truncate: int | Mapping[str, int] | None = None,
    **settings: Any,
) -> TopkCall:
    """Validate a ``topk`` call and read the criterion's columns; sends nothing."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        msg = f"k must be a positive int (how many rows to return), got {k!r}."
        raise InputError(msg)
    if isinstance(seed, bool) or not isinstance(seed, int):
        msg = f"seed must be an int (it picks the pivots), got {seed!r}."
        raise InputError(msg)
    cfg = config(**settings)
    check_error_column(frame, cfg, "llm_error")
    parsed = compile_template(template, frame.columns)
    max_tokens = check_options("topk", max_tokens, system)
    table = apply_truncate(frame.table(parsed.fields), truncate)
    fields = tuple(f"{side}.{f}" for side in "AB" for f in parsed.fields)
    compare = Template(parsed.text, ("Criterion: ", *parsed.parts, "\n" + _COMPARE), fields)
    return TopkCall(frame, cfg, table, compare, k, seed, max_tokens, system)


def _round_plan(tk: TopkCall, pairs: Sequence[tuple[int, int]]) -> Plan:
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


_SAMPLE = 4
"""A bucket of m rows that must yield its best t picks its pivot as the winner of
a knockout among m // (4 t) random rows: a pivot ranked about 4 t, so the better
side keeps the top t with few rows around them (simulated on 1,000 rows: 1,250
comparisons for k = 10 against 2,080 with a random pivot)."""


def _expected(n: int, k: int) -> int:
    """Rough expected comparisons: one pass, the pivot sample, sorting near the top.

    Capped at all pairs: on a few rows the rough formula overshoots what the
    knockout and pass can ask.

    Examples
    --------
    >>> _expected(1000, 10), _expected(4, 2), 4 * 3 // 2
    (1172, 6, 6)
    """
    if n < 2:
        return 0
    k = min(k, n)
    near = min(n, _SAMPLE * k)
    rough = int(n + n // (_SAMPLE * k) + near * math.log(max(near, 2)))
    return min(rough, n * (n - 1) // 2)


def _work(buckets: Sequence[Sequence[int]], k: int) -> list[tuple[int, int]]:
    """(bucket, rows it must still yield) for every bucket of 2+ rows overlapping the top k."""
    out: list[tuple[int, int]] = []
    start = 0
    for i, bucket in enumerate(buckets):
        if start >= k:
            break
        if len(bucket) > 1:
            out.append((i, k - start))
        start += len(bucket)
    return out


def _samples(
    buckets: Sequence[Sequence[int]], work: Sequence[tuple[int, int]], rng: random.Random
) -> dict[int, list[int]]:
    """Pivot candidates per bucket: one random row, or a sample to hold a knockout in."""
    out: dict[int, list[int]] = {}
    for i, need in work:
        bucket = buckets[i]
        size = min(len(bucket), max(1, len(bucket) // (_SAMPLE * need)))
        out[i] = (
            rng.sample(list(bucket), size) if size > 1 else [bucket[rng.randrange(len(bucket))]]
        )
    return out


def _matches(samples: Mapping[int, Sequence[int]]) -> list[tuple[int, int]]:
    """One knockout round: neighbours in each sample meet (an odd one out goes through)."""
    return [(s[j], s[j + 1]) for s in samples.values() for j in range(0, len(s) - 1, 2)]


def _first_pairs(
    tk: TopkCall, buckets: list[list[int]], rng: random.Random
) -> list[tuple[int, int]]:
    work = _work(buckets, tk.k)
    if not work:
        return []
    samples = _samples(buckets, work, rng)
    matches = _matches(samples)
    if matches:
        return matches
    return [(samples[i][0], r) for i, _ in work for r in buckets[i] if r != samples[i][0]]


def _plan(tk: TopkCall) -> TopkPlan:
    n, k = tk.table.n_rows, tk.k
    pairs = _first_pairs(tk, [list(range(n))] if n else [], random.Random(tk.seed))
    return TopkPlan(_round_plan(tk, pairs), k, n, _expected(n, k), n * (n - 1) // 2)


class Topk:
    """``df.llm.topk``: the k best rows by a criterion, with far fewer than n² comparisons."""

    name = "topk"
    required: tuple[str, ...] = ("k",)

    def compile(self, frame: Frame, template: str, **kwargs: Any) -> TopkCall:
        """Validate the call and read the criterion's columns; send nothing."""
        return compile_topk(frame, template, **kwargs)

    def plan(self, tk: TopkCall) -> TopkPlan:
        """The first round exactly, and the expected total."""
        return _plan(tk)

    def estimate(self, tk: TopkCall, *, probe: int) -> Estimate:
        """The first round simulated and scaled to the expected comparisons."""
        plan = _plan(tk)
        return estimate_first_round(
            plan.first,
            tk.settings,
            op="topk",
            probe=probe,
            total=plan.expected_comparisons,
            what="later comparison rounds are extrapolated from the first (an expectation)",
        )

    def run(self, tk: TopkCall, runner: Runner) -> Output:
        """Compare round after round until the top k are ranked."""
        return _run_topk(tk, runner)


@dataclass(frozen=True)
class Ranking:
    """What :func:`rank` found: the top rows, best first, and the rows it could not rank.

    Attributes
    ----------
    ranked : tuple of int
        Positions in the call's table of its ``k`` best rows, best first.
    errors : tuple of RowError
        Rows whose comparison with a pivot failed (after the retries), by position.
    comparisons : int
        Comparisons asked.
    """

    ranked: tuple[int, ...]
    errors: tuple[RowError, ...]
    comparisons: int


def rank(tk: TopkCall, runner: Runner, labels: Sequence[object] | None = None) -> Ranking:
    """Compare round after round until the top ``tk.k`` rows of ``tk.table`` are ranked.

    ``labels`` name the table's rows in messages (default: the frame's labels).
    """
    n, k = tk.table.n_rows, tk.k
    labels = tk.frame.labels if labels is None else labels
    rng = random.Random(tk.seed)
    buckets: list[list[int]] = [list(range(n))] if n else []
    failed: dict[int, RowError] = {}
    comparisons = 0

    def compare(pairs: Sequence[tuple[int, int]], what: str) -> Sequence[Outcome]:
        nonlocal comparisons
        comparisons += len(pairs)
        return runner.run(
            Call(
                [f"{what} of row {labels[b]!r} with row {labels[a]!r}" for a, b in pairs],
                tk.settings,
                _round_plan(tk, pairs),
            )
        )

    while work := _work(buckets, k):
        samples = _samples(buckets, work, rng)
        while matches := _matches(samples):
            # A failed match only changes which candidate becomes the pivot (A goes
            # through); no row is ranked by it, so nothing is reported.
            winners = {
                a: (b if o.error_kind is None and o.value == "B" else a)
                for (a, b), o in zip(matches, compare(matches, "pivot-choice match"), strict=True)
            }
            samples = {
                i: [winners[s[j]] for j in range(0, len(s) - 1, 2)] + s[len(s) - len(s) % 2 :]
                for i, s in samples.items()
            }
        pivots = {i: s[0] for i, s in samples.items()}
        pairs = [(pivots[i], r) for i, _ in work for r in buckets[i] if r != pivots[i]]
        better: dict[int, list[int]] = {}
        worse: dict[int, list[int]] = {}
        for (p, r), o in zip(pairs, compare(pairs, "comparison"), strict=True):
            if o.error_kind is not None:
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
        split: list[list[int]] = []
        start = 0
        for i, bucket in enumerate(buckets):
            if start >= k:
                break  # wholly below rank k: dropped
            start += len(bucket)
            if i not in pivots:
                split.append(bucket)
                continue
            p = pivots[i]
            split.extend(b for b in (better.get(p, []), [p], worse.get(p, [])) if b)
        buckets = split
    ranked = tuple([r for b in buckets for r in b][:k])
    return Ranking(ranked, tuple(sorted(failed.values(), key=lambda e: e.row)), comparisons)


def _run_topk(tk: TopkCall, runner: Runner) -> Output:
    n = tk.table.n_rows
    ranking = rank(tk, runner)
    ranked, errors = list(ranking.ranked), list(ranking.errors)
    runner.finish(
        comparisons=ranking.comparisons,
        naive_comparisons=n * (n - 1) // 2,
        rounds=len(runner.runs),
    )
    if tk.settings["errors"] == "keep":
        reasons = [None] * len(ranked) + [f"{e.kind}: {e.message}" for e in errors]
        rows = ranked + [e.row for e in errors]
        return Output(rows=rows, columns=(NewColumn("llm_error", reasons),))
    result = Output(rows=ranked)
    if errors:
        raise RowErrors(errors, result, total=n)
    return result


TOPK = Topk()
