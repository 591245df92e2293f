"""Prefix hits under a bounded prefix cache: file order, GGR, GGR with capacity-aware dispatch.

An order that is best for an unbounded prefix cache can thrash a small one.
This benchmark replays a plan's requests through a bounded LRU cache of KV
blocks shared by every request, in the order the dispatcher sends them, and
counts the prompt tokens the cache serves.

The cache is :class:`semframe.serving.sim.kv.KVCache` (vLLM's design, the one
semframe's engine simulator uses): ``capacity`` tokens in blocks of
``--block`` tokens (16, vLLM's default); a full prompt block is cached under a
hash chained with its parent's, so a hit is a run of whole leading blocks.
Up to ``K`` requests are in flight (the dispatcher's concurrency); a request
admitted by the engine holds its blocks (its cached prefix, shared, plus its
uncached prompt and its output, reserved at admission) until it finishes; then
its prompt blocks stay cached, unreferenced, and are evicted least recently
used first (its tail first) when a new block is needed. A request that does
not fit waits, first come first served, as in vLLM. Its prompt blocks become
shareable when its prefill ends, so requests prefilled at the same time do not
share them (as in vLLM). Time: a request takes ``prefill_s`` per uncached
prompt token, then ``decode_s`` per output token; output lengths are random
(8 to 56 tokens), so runs with K > 1 are repeated over ``--seeds`` seeds and
medians reported. One request at a time (K = 1) is the same in every seed.

Dispatch is semframe's own (:class:`semframe.runtime.dispatch.AsyncDispatcher`,
the executor's for a backend with one shared cache, driven here in simulated
time through ``next_request``/``finished``), without a warm start (the engine
backends' default):

- **today**: a prefix group's first request goes alone, its followers once it
  has been answered, ahead of new groups, up to ``K`` in flight.
- **capacity-aware**: the same with the :class:`~semframe.runtime.dispatch.Room`
  the executor computes for a bounded cache (``room_for``: sizes from
  characters at the backend's tokens per character, outputs at
  ``max_tokens``, here 56): a new group starts only when its prefix and its
  leader fit beside the prefixes of the started groups and the requests in
  flight, and would still be cached when the followers waiting ahead of it
  have run.

Orders: the file's order (template field order, ``reorder="none"``), and GGR
as the planner orders it for a vLLM backend (its choice of solve counted in
16-token blocks).

Tables: ``movies_small.csv`` (fields ``movie_title, movie_info,
review_content``), ``contributions.csv`` (all 15 columns) and a synthetic
long-tail table (``long_tail_docs``: a few documents with hundreds of
questions each, then hundreds of documents with one to four; each document
long, each section shared by a few questions; rows shuffled).

Tokens are ``o200k_base`` (``semframe.cost.tokens``, offline), each labeled
segment tokenized on its own (as the estimator does), so a prompt's tokens
are the concatenation of its segments'.

Capacity is swept in multiples of the table's mean request (prompt plus
output tokens), from 2 up to unbounded; concurrency K over 1, 4 and 32.
The ceiling is every request's longest prefix shared with any earlier
request, in whole blocks, with GGR's field orders: what an unbounded cache
serves them one request at a time. The replay is checked against it (K = 1,
unbounded) before the sweep.

    python benchmarks/reorder_capacity.py            # about 70 s
    python benchmarks/reorder_capacity.py --quick    # a smoke run

Writes ``benchmarks/results/reorder_capacity.json`` and draws
``benchmarks/results/reorder_capacity.png``.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import platform
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from semframe.core.capacity import Capacity
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.cost.simulate import Pieces
from semframe.cost.tokens import count, encoding
from semframe.reorder import Granularity, Objective, order
from semframe.runtime.dispatch import AsyncDispatcher, room_for
from semframe.serving.sched.base import SchedRequest
from semframe.serving.sim.kv import KVCache, block_hashes

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT / ".." / "shared" / "data").resolve()
RESULTS = ROOT / "benchmarks" / "results"

csv.field_size_limit(sys.maxsize)

OUT_LO, OUT_HI = 8, 56
"""Output tokens per request: uniform in this range (mean 32)."""
PREFILL_S = 1 / 5000
"""Seconds per uncached prompt token."""
DECODE_S = 0.02
"""Seconds per output token (one decode step; batching is free here)."""


# ------------------------------------------------------------------ tables


def load_csv(path: Path, columns: list[str] | None = None) -> Table:
    with path.open(newline="", encoding="utf-8") as f:
        records = list(csv.DictReader(f))
    names = columns or (list(records[0]) if records else [])
    return Table.from_columns({c: [r[c] for r in records] for c in names})


WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "can",
    "has",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "market",
    "policy",
    "report",
    "system",
    "data",
    "model",
    "results",
    "patients",
    "study",
    "court",
    "contract",
    "revenue",
    "quarter",
    "growth",
    "risk",
    "design",
    "engine",
    "cache",
    "memory",
    "request",
    "table",
]


def long_tail_docs(seed: int = 0, big: int = 6, small: int = 500) -> Table:
    """Questions about documents: a few documents with many questions, then many with few.

    ``big`` documents get 150 to 300 questions each, ``small`` documents one to
    four; each document is 1,200 to 4,000 characters (about 300 to 1,000
    tokens) and has three to six sections of 100 to 400 characters, each
    question picking one; questions are unique. Rows are shuffled.
    """
    rng = np.random.default_rng(seed)
    docs: list[str] = []
    secs: list[str] = []
    qs: list[str] = []

    def text(lo: int, hi: int) -> str:
        n = int(rng.integers(lo, hi + 1))
        out = " ".join(rng.choice(WORDS, size=n // 5 + 1).tolist())
        return out[:n]

    sizes = [int(rng.integers(150, 301)) for _ in range(big)]
    sizes += [int(rng.integers(1, 5)) for _ in range(small)]
    for d, size in enumerate(sizes):
        doc = f"[doc {d}] " + text(1200, 4000)
        sections = [f"[doc {d} sec {s}] " + text(100, 400) for s in range(int(rng.integers(3, 7)))]
        for q in range(size):
            docs.append(doc)
            secs.append(sections[int(rng.integers(0, len(sections)))])
            qs.append(f"question {d}.{q}: " + text(40, 120))
    perm = rng.permutation(len(docs)).tolist()
    return Table.from_columns(
        {
            "document": [docs[i] for i in perm],
            "section": [secs[i] for i in perm],
            "question": [qs[i] for i in perm],
        }
    )


# ------------------------------------------------------------------ workloads


@dataclass(frozen=True)
class Workload:
    """One plan as the replay sees it: token prompts, block hashes, prefix groups."""

    table: str
    order: str
    plan: Plan
    prompts: list[int]  # prompt tokens per request, in plan order
    hashes: list[tuple[int, ...]]  # chained block hashes per request
    groups: list[tuple[int, int]]  # the plan's prefix groups
    block: int


def o200k_encode(texts: Sequence[str]) -> list[list[int]]:
    enc = encoding("o200k_base")
    return [enc.encode_ordinary(t) for t in texts]


def workload(name: str, plan: Plan, label: str, block: int) -> Workload:
    pieces = Pieces(plan, o200k_encode)
    tokens = [
        [t for part in pieces.parts(i) for t in pieces.tokens(part)] for i in range(len(plan))
    ]
    groups = [(g.start, g.stop) for g in plan.groups]
    return Workload(
        name,
        label,
        plan,
        [len(t) for t in tokens],
        [block_hashes(t, block) for t in tokens],
        groups,
        block,
    )


def plans(name: str, table: Table, block: int) -> list[Workload]:
    fields = table.columns
    template = parse_template(
        "Read the record below and answer the question it asks, or summarize it in one "
        "sentence when it asks none. Fields: " + ", ".join("{" + f + "}" for f in fields) + "."
    )
    rq = RelQuery("map", template, table, TEXT, max_tokens=OUT_HI)
    file_order = make_plan(rq, Ordering.identity(table.n_rows, rq.fields), "none")
    head = count([rq.instructions + "\n\n"])[0]
    tok: dict[str, int] = {}

    def seg_tokens(text: str) -> int:
        found = tok.get(text)
        if found is None:
            found = tok[text] = count([text])[0]
        return found

    objective = Objective(Granularity(step=block), seg_tokens, head=head)
    ggr_plan = make_plan(rq, order(table, "ggr", objective=objective), "ggr")
    return [
        workload(name, file_order, "file order", block),
        workload(name, ggr_plan, "ggr", block),
    ]


# ------------------------------------------------------------------ dispatch


def dispatcher(w: Workload, k: int, capacity: int | None, rule: str | None) -> AsyncDispatcher:
    """semframe's async dispatch of ``w``'s plan, as the executor builds it.

    ``rule``: ``None`` (today's: no capacity) or ``"capacity"`` (the room of
    :func:`~semframe.runtime.dispatch.room_for`, as the executor computes it
    for a cache of ``capacity`` tokens: tokens per character from the first
    16 prompts, outputs at ``max_tokens``).
    """
    room = None
    if rule is not None and capacity is not None:
        sample = [r.prompt for r in w.plan.requests[:16]]
        ratio = sum(map(len, o200k_encode(sample))) / sum(map(len, sample))
        cap = Capacity(capacity, block=w.block, concurrency=k)
        out = w.plan.relquery.max_tokens
        room = room_for(w.plan, cap, tokens_per_char=ratio, output_tokens=out)
    return AsyncDispatcher(w.plan, room=room, workers=k)


# ------------------------------------------------------------------ the engine


@dataclass(frozen=True)
class Result:
    hit_tokens: int
    prompt_tokens: int
    makespan: float

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def simulate(
    w: Workload, k: int, capacity: int | None, seed: int, rule: str | None = None
) -> Result:
    """Replay ``w`` through a bounded LRU block cache with ``k`` requests in flight."""
    block = w.block
    n = len(w.prompts)
    rng = np.random.default_rng(seed)
    outs = rng.integers(OUT_LO, OUT_HI + 1, size=n).tolist()
    blocks_of = [-(-(p + o) // block) for p, o in zip(w.prompts, outs, strict=True)]
    num_blocks = capacity // block if capacity is not None else sum(blocks_of) + 1
    if max(blocks_of) > num_blocks:
        msg = f"capacity {capacity} holds less than one request ({max(blocks_of) * block} tokens)"
        raise ValueError(msg)
    kv = KVCache(num_blocks, block)
    reqs = [
        SchedRequest(i, 0, n, "t", w.prompts[i], outs[i], 0.0, block_hashes=w.hashes[i])
        for i in range(n)
    ]
    dispatch = dispatcher(w, k, capacity, rule)
    group_of = [g for g, (a, b) in enumerate(w.groups) for _ in range(a, b)]
    queue: deque[int] = deque()
    events: list[tuple[float, int, int, int]] = []  # (time, seq, kind 0 commit / 1 finish, i)
    seq = 0
    hits = 0
    now = 0.0
    finished = 0

    def send() -> None:
        while dispatch.in_flight < k and (taken := dispatch.next_request()) is not None:
            queue.append(taken[1])

    def admit(now: float) -> None:
        nonlocal seq, hits
        while queue:
            i = queue[0]
            r = reqs[i]
            limit = (r.prompt_len - 1) // block
            cached = min(kv.cached_prefix(r) // block, limit)
            need = blocks_of[i] - cached
            if need > kv.num_free_blocks - kv.evictable_hits(r, cached * block):
                return
            queue.popleft()
            got = kv.admit(r)
            if not kv.grow(r, r.prompt_len + outs[i]):  # pragma: no cover - checked above
                raise AssertionError("admission check and allocation disagree")
            hits += got
            prefilled = now + PREFILL_S * (r.prompt_len - got)
            heapq.heappush(events, (prefilled, seq, 0, i))
            heapq.heappush(events, (prefilled + DECODE_S * outs[i], seq + 1, 1, i))
            seq += 2

    send()
    admit(0.0)
    while events:
        now, _, kind, i = heapq.heappop(events)
        if kind == 0:
            kv.commit(reqs[i], reqs[i].prompt_len)
            continue
        kv.free(reqs[i])
        finished += 1
        dispatch.finished(group_of[i], i)
        send()
        admit(now)
    if finished != n:  # pragma: no cover - a bug in the replay
        raise AssertionError(f"{finished} of {n} requests finished")
    return Result(hits, sum(w.prompts), now)


def ceiling(w: Workload) -> int:
    """Tokens an unbounded cache serves one request at a time: leading blocks seen before."""
    seen: set[int] = set()
    total = 0
    for p, hs in zip(w.prompts, w.hashes, strict=True):
        limit = (p - 1) // w.block
        j = 0
        while j < limit and hs[j] in seen:
            j += 1
        total += j * w.block
        seen.update(hs)
    return total


# ------------------------------------------------------------------ the sweep


def run(args: argparse.Namespace) -> dict[str, object]:
    tables: list[tuple[str, Table]] = [
        (
            "movies_small",
            load_csv(DATA / "movies_small.csv", ["movie_title", "movie_info", "review_content"]),
        ),
        ("contributions", load_csv(DATA / "contributions.csv")),
        ("long-tail docs", long_tail_docs(args.seed)),
    ]
    if args.quick:
        tables = [(n, t) for n, t in tables if n != "contributions"]
    report: dict[str, object] = {
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "block": args.block,
        "multiples": args.multiples,
        "concurrency": args.concurrency,
        "seeds": args.seeds,
        "tokens": "o200k_base, each labeled segment tokenized on its own",
        "prefill_s_per_token": PREFILL_S,
        "decode_s_per_token": DECODE_S,
        "output_tokens": [OUT_LO, OUT_HI],
        "tables": [],
    }
    out_tables: list[dict[str, object]] = []
    for name, table in tables:
        t0 = time.perf_counter()
        file_w, ggr_w = plans(name, table, args.block)
        mean_request = statistics.fmean(file_w.prompts) + (OUT_LO + OUT_HI) / 2
        biggest = max(file_w.prompts) + OUT_HI
        print(
            f"\n## {name}: {table.n_rows:,} rows x {len(table.columns)}; mean prompt "
            f"{statistics.fmean(file_w.prompts):,.0f} tokens, longest {max(file_w.prompts):,}; "
            f"groups: file order {len(file_w.groups):,}, ggr {len(ggr_w.groups):,} "
            f"(planned in {time.perf_counter() - t0:.1f} s)"
        )
        ceil_tokens = ceiling(ggr_w)
        total = sum(ggr_w.prompts)
        # The replay is exact where the answer is known: one request at a time into an
        # unbounded cache serves every leading block seen before.
        for w in (file_w, ggr_w):
            if simulate(w, 1, None, args.seed).hit_tokens != ceiling(w):
                raise AssertionError(f"{name}, {w.order}: the replay disagrees with the ceiling")
        print(
            f"ceiling (unbounded cache, one at a time, ggr fields): {ceil_tokens / total:.3f}; "
            f"file order's fields: {ceiling(file_w) / total:.3f}"
        )
        rows: list[dict[str, object]] = []
        capacities: list[int | None] = [
            max(biggest, int(m * mean_request)) // args.block * args.block + args.block
            for m in args.multiples
        ]
        capacities.append(None)
        for k in args.concurrency:
            seeds = [args.seed] if k == 1 else list(range(args.seed, args.seed + args.seeds))
            for m, cap in zip([*args.multiples, None], capacities, strict=True):
                entry: dict[str, object] = {
                    "k": k,
                    "multiple": m,
                    "capacity_tokens": cap,
                }
                for label, which, rule in VARIANTS:
                    w = file_w if which == "file order" else ggr_w
                    res = [simulate(w, k, cap, s, rule) for s in seeds]
                    entry[label] = {
                        "hit_rate": statistics.median(r.hit_rate for r in res),
                        "makespan_s": statistics.median(r.makespan for r in res),
                        "hit_rates": [r.hit_rate for r in res],
                    }
                rows.append(entry)
                print_row(entry)
        out_tables.append(
            {
                "table": name,
                "rows": table.n_rows,
                "columns": len(table.columns),
                "mean_prompt_tokens": statistics.fmean(file_w.prompts),
                "mean_request_tokens": mean_request,
                "prompt_tokens": total,
                "groups": {"file order": len(file_w.groups), "ggr": len(ggr_w.groups)},
                "ceiling_hit_rate": ceil_tokens / total,
                "results": rows,
                "seconds": time.perf_counter() - t0,
            }
        )
    report["tables"] = out_tables
    return report


VARIANTS: list[tuple[str, str, str | None]] = [
    ("file order", "file order", None),
    ("ggr", "ggr", None),
    ("ggr, capacity-aware", "ggr", "capacity"),
]
LABELS = tuple(label for label, _, _ in VARIANTS)


def print_row(e: dict[str, object]) -> None:
    cap = e["capacity_tokens"]
    m = e["multiple"]
    where = "unbounded" if cap is None else f"{cap:>9,} ({m:g}x)"
    cells = []
    for label in LABELS:
        r = e[label]
        assert isinstance(r, dict)
        cells.append(f"{r['hit_rate']:.3f}")
    ggr = e["ggr"]
    aware = e["ggr, capacity-aware"]
    assert isinstance(ggr, dict)
    assert isinstance(aware, dict)
    ratio = aware["makespan_s"] / ggr["makespan_s"] if ggr["makespan_s"] else math.nan
    print(f"K={e['k']:<3} {where:>18} | " + " | ".join(cells) + f" | time x{ratio:.2f}")


def markdown(report: dict[str, object]) -> str:
    """The tables of docs/reordering.md."""
    lines = []
    tables = report["tables"]
    assert isinstance(tables, list)
    for t in tables:
        lines.append(
            f"**{t['table']}** ({t['rows']:,} x {t['columns']}; mean prompt "
            f"{t['mean_prompt_tokens']:,.0f} tokens; ceiling {t['ceiling_hit_rate']:.3f})\n"
        )
        names = " | ".join("ggr, dispatch today" if x == "ggr" else x for x in LABELS)
        lines.append(
            f"| K | cache (tokens, x mean request) | {names} | time, capacity-aware / today |"
        )
        lines.append("|---:|---:|" + "---:|" * (len(LABELS) + 1))
        for e in t["results"]:
            cap = e["capacity_tokens"]
            where = "unbounded" if cap is None else f"{cap:,} ({e['multiple']:g}x)"
            ratio = e["ggr, capacity-aware"]["makespan_s"] / e["ggr"]["makespan_s"]
            cells = " | ".join(f"{e[label]['hit_rate']:.3f}" for label in LABELS)
            lines.append(f"| {e['k']} | {where} | {cells} | {ratio:.2f} |")
        lines.append("")
    return "\n".join(lines)


def draw(report: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = report["tables"]
    assert isinstance(tables, list)
    ks = report["concurrency"]
    assert isinstance(ks, list)
    fig, axes = plt.subplots(
        len(ks), len(tables), figsize=(4.2 * len(tables), 3.2 * len(ks)), squeeze=False
    )
    styles = {"file order": ("tab:gray", "o"), "ggr": ("tab:blue", "s")}
    styles["ggr, capacity-aware"] = ("tab:orange", "^")
    for col, t in enumerate(tables):
        for row, k in enumerate(ks):
            ax = axes[row][col]
            entries = [e for e in t["results"] if e["k"] == k]
            bounded = [e for e in entries if e["capacity_tokens"] is not None]
            top = max(e["multiple"] for e in bounded) * 2
            xs = [e["multiple"] if e["capacity_tokens"] is not None else top for e in entries]
            for label, (color, marker) in styles.items():
                ax.plot(
                    xs,
                    [e[label]["hit_rate"] for e in entries],
                    color=color,
                    marker=marker,
                    label=label,
                    markersize=4,
                )
            ax.axhline(t["ceiling_hit_rate"], color="black", lw=0.8, ls="--", label="ceiling")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs[:-1]] + ["inf"], fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_title(f"{t['table']}, K={k}", fontsize=9)
            if row == len(ks) - 1:
                ax.set_xlabel("cache / mean request (prompt + output)", fontsize=8)
            if col == 0:
                ax.set_ylabel("prompt tokens served", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block", type=int, default=16, help="tokens per KV block")
    p.add_argument(
        "--multiples",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[2, 4, 8, 16, 32, 64, 128, 256],
        help="cache sizes in mean requests (comma separated); unbounded is always added",
    )
    p.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4, 32],
        help="requests in flight (comma separated)",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds per point with K > 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="no contributions, fewer points")
    p.add_argument("--out", type=Path, default=RESULTS / "reorder_capacity.json")
    args = p.parse_args()
    if args.quick:
        args.multiples = [2, 8, 32]
        args.seeds = 1
    started = time.perf_counter()
    report = run(args)
    report["seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    draw(report, args.out.with_suffix(".png"))
    print()
    print(markdown(report))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
