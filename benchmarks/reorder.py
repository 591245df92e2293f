"""Reordering quality and solver time: original order, stats, GGR, OPHR.

For each table, every order is scored with the paper's prefix hit count (PHC),
PHC over its upper bound (no order can exceed the bound), and the share of
prompt characters a prefix cache would serve (holding the previous prompt, or
every earlier prompt). Prompts are the rows' labeled field segments
``f"{column}: {value}\\n"`` only: the shared instructions in front of every
prompt hit in any order and are left out. Solver seconds are the median wall
time of the reordering call on an already rendered table (factorizing the
columns and discovering functional dependencies included).

Tables:

- ``movies_small.csv`` (1,019 rows) with the template's fields ``movie_title,
  movie_info, review_content``;
- ``contributions.csv`` (15,000 rows, all 15 columns);
- a synthetic table (``--rows``, ``--columns``, ``--cardinalities``,
  ``--value-lengths``, ``--skew``, ``--fds``);
- a long-tail synthetic table shaped like a table of item reviews (reviewer,
  time, four ratings, item name, id and style): items in file order, popular
  ones first, then a long tail of items with one to four reviews each
  (``--long-tail-rows``);
- a tiny synthetic table on which OPHR (exact) fits.

With the GGR authors' code present (``--reference DIR``, default
``$SEMFRAME_GGR_REFERENCE`` or ``../ggr-reference``: a folder holding their
``src/core/algos/quick_greedy.py`` and ``solver.py`` with a Python environment
that has pandas, networkx, pyspark and PyYAML (the last two only imported),
``DIR/.venv`` unless ``--reference-python``),
each table up to ``--reference-max-rows`` rows is also ordered by their
QuickGreedy, run in that environment by ``benchmarks/ggr_reference_runner.py``
on the same labeled segments; otherwise that row is skipped and says so.

Then a scaling series of GGR over rows (``--scaling``) and the quality check of
GGR against OPHR on ``--small-tables`` random small tables (up to 8 rows x 4
columns, low cardinality): mean and minimum of ``PHC(GGR) / PHC(OPHR)``.

    python benchmarks/reorder.py
    python benchmarks/reorder.py --rows 50000 --fds 0>3,1>4 --repeats 3
    python benchmarks/reorder.py --reference ../ggr-reference
    python benchmarks/reorder.py --units
    python benchmarks/reorder.py --sweep 40 --seed 2 --reference ../ggr-reference
    python benchmarks/reorder.py --lookahead 64,32,0 --seed 2
    python benchmarks/reorder.py --exact 32,16,0 --seed 2
    python benchmarks/reorder.py --scaling-only --scaling-shape proportional --columns 8 \\
        --scaling 1000000,3000000,10000000

Writes ``benchmarks/results/reorder.json``.

``--units`` measures instead the hit rates in the cache's own units on the
data tables and the long-tail tables (``benchmarks/results/reorder_units.json``):
in characters, in ``o200k_base`` tokens (``semframe.cost.tokens``, offline),
in whole 16-token KV blocks (vLLM's default) and at OpenAI's 1,024-token
minimum and 128-token steps, for the file's order, GGR (in characters, as
without a backend), GGR solved in the tokens with its choice made at each
granularity (what the planner does for such a backend), and the reference
when present. OpenAI is measured on the field segments alone and after an
instruction block of ``--head`` tokens (default 1,024), which every prompt
shares: there the rate is the field tokens served beyond what the block alone
gets, ``(served - (n - 1) * round(head)) / field tokens``.

``--sweep N`` orders ``N`` random tables of varied shapes instead, each with
GGR and the reference (required; each timed as above, a warm-up then the
median of 3), and counts where GGR is below it under either cache model
(``benchmarks/results/reorder_sweep_SEED.json``): synthetic tables of 200 to
6,000 rows and 3 to 9 columns (random cardinalities, value lengths, Zipf
skews, sometimes an FD), long-tail tables of 2,000 to 10,000 rows (with 0,
50% or 95% of reviews giving one score to all four aspects), and slices of
3 to 8 random columns and 500 to 10,000 rows of the two data
tables. Shapes come from ``--seed``: a new seed is a new set of tables.

``--lookahead 64,32,0`` makes the tables of the sweep recorded with
``--seed`` again and orders them with GGR at each ``lookahead_cells``,
against the reference's recorded hit rates (it is not run again), with
OPHR's small tables: what the one-step lookahead buys and what it costs
(``benchmarks/results/reorder_lookahead_SEED.json``). ``--exact 32,16,0``
does the same at each ``exact_cells`` (the sub-tables the lookahead credits
with their exact optimum; ``benchmarks/results/reorder_exact_SEED.json``).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import memory  # benchmarks/memory.py
import numpy as np

from semframe.core.ordering import Ordering
from semframe.core.table import Table
from semframe.cost.tokens import count
from semframe.reorder import Granularity, Objective, evaluate, ggr, hit_rate, ophr, order, phc

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT / ".." / "shared" / "data").resolve()
RESULTS = ROOT / "benchmarks" / "results" / "reorder.json"

csv.field_size_limit(sys.maxsize)


@dataclass(frozen=True)
class Row:
    order: str
    phc: int
    upper_bound: int
    phc_ratio: float
    hit_rate: float
    hit_rate_unbounded: float
    seconds: float | None
    cpu_seconds: float | None
    seconds_all: tuple[float, ...]


def load_csv(path: Path, columns: list[str] | None = None) -> Table:
    with path.open(newline="", encoding="utf-8") as f:
        records = list(csv.DictReader(f))
    names = columns or (list(records[0]) if records else [])
    return Table.from_columns({c: [r[c] for r in records] for c in names})


def synthetic(
    rows: int,
    columns: int,
    cardinalities: list[int],
    lengths: tuple[int, int],
    *,
    skew: float = 0.0,
    fds: list[tuple[int, int]] | None = None,
    seed: int = 0,
) -> Table:
    """Random table: column j has ``cardinalities[j % len]`` distinct values.

    Values have random lengths in ``lengths``; cells follow a Zipf-like law
    with exponent ``skew`` (0: uniform). Each planted FD ``(a, b)`` makes column
    ``b`` a function of column ``a``.
    """
    rng = np.random.default_rng(seed)
    codes: list[np.ndarray] = []
    cards: list[int] = []
    for j in range(columns):
        k = max(1, min(cardinalities[j % len(cardinalities)], rows))
        p = 1.0 / np.arange(1, k + 1) ** skew
        codes.append(rng.choice(k, size=rows, p=p / p.sum()))
        cards.append(k)
    for a, b in fds or []:
        mapping = rng.integers(0, cards[b], size=cards[a])
        codes[b] = mapping[codes[a]]
    data: dict[str, list[str]] = {}
    lo, hi = lengths
    for j in range(columns):
        pool = []
        for i, length in enumerate(rng.integers(lo, hi + 1, size=cards[j]).tolist()):
            head = f"c{j}v{i}"
            pool.append(head + "." * max(0, length - len(head)))
        data[f"c{j}"] = [pool[c] for c in codes[j].tolist()]
    return Table.from_columns(data)


def long_tail(rows: int, seed: int = 0, same: float = 0.0) -> Table:
    """Item reviews in file order: popular items first, then a long tail of tiny ones.

    The first 84% of the rows come from items with Pareto-distributed review
    counts (about 13 a item, up to 400); the rest from items with one to four
    reviews. Each item has a name, an id and a style (functional dependencies);
    each review four ratings in half steps (correlated with the item's level), a
    time stamp (nearly unique) and a reviewer (Zipf over 6,000 names). A share
    ``same`` of the reviews give all four aspects one score (drawn from the
    overall score distribution), as many real reviewers do.
    """
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    head, total = int(rows * 0.84), 0
    while total < rows:
        size = (
            int(min(400, max(2, rng.pareto(1.2) * 12 + 2)))
            if total < head
            else int(rng.integers(1, 5))
        )
        sizes.append(size)
        total += size
    kinds = [
        "IPA",
        "Stout",
        "Porter",
        "Pale Ale",
        "Lager",
        "Tripel",
        "Saison",
        "Pilsener",
        "Brown Ale",
    ]
    origins = ["American", "English", "Belgian", "German", "Russian Imperial", "Scotch", "Irish"]
    styles = [f"{o} {k}" for o in origins for k in kinds]
    words = ["Old", "Dark", "Golden", "Hop", "Imperial", "Double", "Wild", "Red", "Black", "Winter"]
    reviewer_p = 1.0 / np.arange(1, 6001) ** 1.1
    reviewer_p /= reviewer_p.sum()
    ratings = ["1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0", "4.5", "5.0"]
    level_p = np.array([1, 1, 2, 4, 10, 25, 33, 18, 6], dtype=float)
    level_p /= level_p.sum()
    aspects = ["review/appearance", "review/aroma", "review/palate", "review/taste"]
    data: dict[str, list[str]] = {
        c: []
        for c in [
            "beer/name",
            "beer/beerId",
            "beer/style",
            *aspects,
            "review/time",
            "review/profileName",
        ]
    }
    for i, size in enumerate(sizes):
        name = " ".join(rng.choice(words, size=int(rng.integers(2, 4)))) + f" {i}"
        item_id, style = str(10_000 + i), styles[int(rng.integers(0, len(styles)))]
        level = int(rng.choice(9, p=level_p))
        for _ in range(size):
            data["beer/name"].append(name)
            data["beer/beerId"].append(item_id)
            data["beer/style"].append(style)
            one = ratings[int(rng.choice(9, p=level_p))] if rng.random() < same else None
            for a in aspects:
                data[a].append(one or ratings[int(np.clip(level + rng.integers(-1, 2), 0, 8))])
            data["review/time"].append(str(1_000_000_000 + int(rng.integers(0, 300_000_000))))
            data["review/profileName"].append(f"user{int(rng.choice(6000, p=reviewer_p))}")
    return Table.from_columns({c: v[:rows] for c, v in data.items()})


def reference_order(
    table: Table, directory: Path, python: Path, repeats: int = 0
) -> tuple[Ordering, float, tuple[float, ...]] | None:
    """The GGR authors' QuickGreedy on ``table``: (ordering, solver seconds, each run's), or None.

    With ``repeats`` the solver is timed as ours are (:func:`timed`): a warm-up
    run, then up to ``repeats`` timed runs while the runs so far took under
    30 s; the seconds are their median (the warm-up run's where none fitted).
    The runner returns each prompt's segments; rows are matched back to the
    table by their cells (identical rows are interchangeable for every metric).
    """
    runner = ROOT / "benchmarks" / "ggr_reference_runner.py"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "table.csv", Path(tmp) / "out.json"
        with src.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(table.columns)
            writer.writerows(zip(*(table.cells[c] for c in table.columns), strict=True))
        command = [str(python), str(runner), str(directory), str(src), str(out)]
        done = subprocess.run(
            [*command, "--repeats", str(repeats)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"  reference failed: {done.stderr.strip().splitlines()[-1:]}")
            return None
        result = json.loads(out.read_text(encoding="utf-8"))
    where: dict[tuple[str, ...], list[int]] = {}
    for r in range(table.n_rows):
        where.setdefault(tuple(table.cells[c][r] for c in table.columns), []).append(r)
    rows, fields = [], []
    for segments in result["rows"]:
        cells = dict(seg[:-1].split(": ", 1) for seg in segments)
        rows.append(where[tuple(cells[c] for c in table.columns)].pop())
        fields.append(tuple(seg.split(": ", 1)[0] for seg in segments))
    times = tuple(float(t) for t in result["seconds_all"])
    return Ordering(tuple(rows), tuple(fields)), float(result["seconds"]), times


@dataclass(frozen=True)
class Reference:
    directory: Path
    python: Path
    max_rows: int


def find_reference(args: argparse.Namespace) -> Reference | None:
    """The reference's folder and Python, or None (printed) when absent."""
    directory = args.reference or Path(
        os.environ.get("SEMFRAME_GGR_REFERENCE", ROOT.parent / "ggr-reference")
    )
    python = args.reference_python or directory / ".venv" / "bin" / "python"
    code = directory / "src" / "core" / "algos" / "quick_greedy.py"
    if not code.is_file() or not python.is_file():
        print(f"reference skipped: no {code} or no {python} (see --reference)")
        return None
    return Reference(directory.resolve(), python, args.reference_max_rows)


def timed(fn: Callable[[], Ordering], repeats: int) -> tuple[Ordering, list[float], list[float]]:
    """Run ``fn`` once to warm up, then ``repeats`` times: (result, wall s, CPU s)."""
    wall, cpu = [], []
    result = fn()
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return result, wall, cpu


def score_orders(
    table: Table, repeats: int, with_ophr: bool, reference: Reference | None = None
) -> list[Row]:
    methods: list[tuple[str, Callable[[], Ordering]]] = [
        ("original", lambda: order(table, "none")),
        ("stats", lambda: order(table, "stats")),
        ("ggr", lambda: ggr(table)),
        ("ggr, value score only", lambda: ggr(table, weigh="value")),
    ]
    if with_ophr:
        methods.append(("ophr", lambda: ophr(table)))
    out = []
    for name, fn in methods:
        o, times, cpu = timed(fn, repeats if name != "original" else 1)
        s = evaluate(table, o)
        out.append(
            Row(
                name,
                s.phc,
                s.upper_bound,
                s.phc_ratio,
                s.hit_rate,
                s.hit_rate_unbounded,
                None if name == "original" else statistics.median(times),
                None if name == "original" else statistics.median(cpu),
                tuple(times) if name != "original" else (),
            )
        )
    if reference is not None and table.n_rows <= reference.max_rows:
        got = reference_order(table, reference.directory, reference.python, repeats)
        if got is not None:
            o, seconds, times = got
            o.validate(table.n_rows, table.columns)
            s = evaluate(table, o)
            out.append(
                Row(
                    "reference (authors' QuickGreedy)",
                    s.phc,
                    s.upper_bound,
                    s.phc_ratio,
                    s.hit_rate,
                    s.hit_rate_unbounded,
                    seconds,
                    None,
                    times,
                )
            )
    return out


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n### {title}\n")
    print(
        "| order | PHC | PHC / upper bound | hit rate (prev prompt) "
        "| hit rate (unbounded) | solver seconds | CPU seconds |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sec = "-" if r.seconds is None else f"{r.seconds:.4f}"
        cpu = "-" if r.cpu_seconds is None else f"{r.cpu_seconds:.4f}"
        print(
            f"| {r.order} | {r.phc:,} | {r.phc_ratio:.3f} | {r.hit_rate:.3f} "
            f"| {r.hit_rate_unbounded:.3f} | {sec} | {cpu} |"
        )


def random_small_table(rng: random.Random) -> Table:
    n, m = rng.randint(2, 8), rng.randint(1, 4)
    data = {}
    for j in range(m):
        k = rng.randint(1, 3)
        pool = ["".join(rng.choice("abcdef") for _ in range(rng.randint(1, 4))) for _ in range(k)]
        data[f"c{j}"] = [rng.choice(pool) for _ in range(n)]
    return Table.from_columns(data)


def quality_check(
    count: int, seed: int, solvers: dict[str, Callable[[Table], Ordering]] | None = None
) -> dict[str, dict[str, float]]:
    """PHC over OPHR's of each of ``solvers`` on ``count`` random small tables."""
    rng = random.Random(seed)
    tables = [random_small_table(rng) for _ in range(count)]
    # PHC weighs a value by its own squared length, GGR's "value" score; the
    # default (the better of two scores by prompt units served) is not aimed at PHC.
    solvers = solvers or {
        "ggr, value score": lambda t: ggr(t, weigh="value"),
        "ggr, default (best of two scores)": ggr,
        "ggr, value score, no lookahead (the paper's greedy)": lambda t: ggr(
            t, weigh="value", lookahead_cells=0
        ),
        "stats": lambda t: order(t, "stats"),
    }
    best = [phc(t, ophr(t)) for t in tables]
    out: dict[str, dict[str, float]] = {}
    for name, solve in solvers.items():
        ratios = []
        for t, b in zip(tables, best, strict=True):
            ratios.append(phc(t, solve(t)) / b if b else 1.0)
        out[name] = {
            "mean_ratio": statistics.fmean(ratios),
            "min_ratio": min(ratios),
            "share_optimal": sum(r >= 1.0 - 1e-12 for r in ratios) / len(ratios),
            "share_below_0.8": sum(r < 0.8 for r in ratios) / len(ratios),
        }
    return out


def scaling(
    sizes: list[int], args: argparse.Namespace, fds: list[tuple[int, int]]
) -> list[dict[str, float]]:
    out = []
    for n in sizes:
        cards = args.cardinalities
        if args.scaling_shape == "proportional":
            # The same shape at every size: high cardinalities grow with the rows.
            cards = [c if c <= 100 else max(2, n * c // 100_000) for c in cards]
        table = synthetic(
            n,
            args.columns,
            cards,
            args.value_lengths,
            skew=args.skew,
            fds=fds,
            seed=args.seed,
        )
        o, times, cpu = timed(functools.partial(ggr, table), args.repeats)
        med = statistics.median(times)
        out.append(
            {
                "rows": n,
                "columns": args.columns,
                "seconds": med,
                "cpu_seconds": statistics.median(cpu),
                "seconds_all": times,
                "microseconds_per_row": med / n * 1e6,
                "ns_per_n_log2_n": med / (n * math.log2(n)) * 1e9,
                "phc_ratio": evaluate(table, o).phc_ratio,
            }
        )
    return out


def table_mb(table: Table) -> float:
    """The rendered table's own memory, MB: each column's tuple and its distinct strings."""
    total = 0
    for c in table.columns:
        cells = table.cells[c]
        total += sys.getsizeof(cells)
        total += sum(sys.getsizeof(v) for v in {id(v): v for v in cells}.values())
    return total / 1e6


def scaling_child(n: int, args: argparse.Namespace, fds: list[tuple[int, int]]) -> dict[str, Any]:
    """One size of ``--scaling-only``, in a fresh process: one solve, its time and memory.

    ``table_mb`` is the rendered table's own memory (the template's columns:
    :func:`table_mb`); ``solve_peak_mb_above_table`` is the process's peak
    resident memory during the solve above what it held just before it (the
    C heap's free memory given back first, so that the solve's pages count:
    ``benchmarks/memory.py``), and ``peak_over_table`` that as a multiple of
    ``table_mb`` (the target: at most 2).
    """
    cards = args.cardinalities
    if args.scaling_shape == "proportional":
        cards = [c if c <= 100 else max(2, n * c // 100_000) for c in cards]
    table = synthetic(
        n, args.columns, cards, args.value_lengths, skew=args.skew, fds=fds, seed=args.seed
    )
    size = table_mb(table)
    reset = memory.start()  # the peak from here on is the solve's (Linux)
    resident = memory.status_bytes("VmRSS")
    with_table = resident / 1e6
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    t0, c0 = time.perf_counter(), time.process_time()
    o = ggr(table)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # kB -> MB
    if reset:
        solve_peak = memory.peak_mb_since_start(resident)
    else:  # ru_maxrss is the process's peak so far: it counts the solve where the solve set it
        solve_peak = peak - with_table if peak > before else math.nan
    return {
        "rows": n,
        "columns": args.columns,
        "cardinalities": cards,
        "seconds": wall,
        "cpu_seconds": cpu,
        "microseconds_per_row": cpu / n * 1e6,
        "table_mb": size,
        "resident_mb_before_solve": with_table,
        "solve_peak_mb_above_table": solve_peak,
        "peak_over_table": solve_peak / size if size > 0 else math.nan,
        "process_peak_mb": peak,
        "phc_ratio": evaluate(table, o).phc_ratio if n <= 1_000_000 else None,
    }


def scaling_only(args: argparse.Namespace) -> None:
    """``--scaling-only``: the GGR scaling series, each size in a fresh process."""
    series = []
    for n in args.scaling:
        command = [sys.executable, __file__, "--scaling-child", str(n)]
        command += ["--columns", str(args.columns), "--scaling-shape", args.scaling_shape]
        command += ["--fds", args.fds, "--skew", str(args.skew), "--seed", str(args.seed)]
        command += ["--cardinalities", ",".join(map(str, args.cardinalities))]
        command += ["--value-lengths", ":".join(map(str, args.value_lengths))]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        series.append(json.loads(done.stdout))
        s = series[-1]
        print(
            f"{s['rows']:>12,} rows: {s['seconds']:8.1f} s, {s['cpu_seconds']:8.1f} CPU s "
            f"({s['microseconds_per_row']:.1f} us a row); table {s['table_mb']:,.0f} MB, "
            f"solve peak above it {s['solve_peak_mb_above_table']:,.0f} MB "
            f"({s['peak_over_table']:.2f}x)",
            flush=True,
        )
    out = args.out or RESULTS.with_name("reorder_scaling.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"shape": args.scaling_shape, "load_average_at_end": os.getloadavg(), "series": series}
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")


OPENAI = Granularity(minimum=1024, step=128)
BLOCKS = Granularity(step=16)


@functools.cache
def o200k(text: str) -> int:
    """``o200k_base`` tokens of ``text`` (offline, memoized: segments repeat)."""
    return count([text])[0]


def unit_rates(table: Table, o: Ordering, head: int) -> dict[str, float]:
    """Hit rates of ``o`` in characters, tokens, 16-token blocks and OpenAI's steps."""
    n = len(o.rows)
    fields = hit_rate(table, o, tokenizer=o200k, granularity=Granularity()) if n else 0.0
    field_tokens = sum(o200k(f"{c}: {v}\n") for c in table.columns for v in table.cells[c])
    with_head = hit_rate(table, o, tokenizer=o200k, granularity=OPENAI, head=head)
    served = with_head * (field_tokens + head * n)
    beyond = (served - (n - 1) * OPENAI.round(head)) / field_tokens if field_tokens else 0.0
    return {
        "characters": hit_rate(table, o),
        "tokens": fields,
        "blocks_16": hit_rate(table, o, tokenizer=o200k, granularity=BLOCKS),
        "openai_fields_only": hit_rate(table, o, tokenizer=o200k, granularity=OPENAI),
        "openai_after_head": beyond,
    }


def units_report(args: argparse.Namespace) -> dict[str, object]:
    """Hit rates in the cache's own units on the data and long-tail tables."""
    head = args.head
    tables = [
        (
            "movies_small.csv (movie_title, movie_info, review_content)",
            load_csv(DATA / "movies_small.csv", ["movie_title", "movie_info", "review_content"]),
        ),
        ("contributions.csv (all 15 columns)", load_csv(DATA / "contributions.csv")),
        (
            f"long-tail item reviews {args.long_tail_rows:,} x 9",
            long_tail(args.long_tail_rows, seed=args.seed),
        ),
        (
            f"long-tail item reviews {args.long_tail_rows:,} x 9, 95% one score for all aspects",
            long_tail(args.long_tail_rows, seed=args.seed, same=0.95),
        ),
    ]
    reference = find_reference(args)
    names = {
        "characters": "chars",
        "tokens": "tokens",
        "blocks_16": "16-token blocks",
        "openai_fields_only": "OpenAI 1,024/128, fields only",
        "openai_after_head": f"OpenAI 1,024/128 after {head:,}-token head",
    }
    out = []
    for title, table in tables:
        orders: list[tuple[str, Ordering]] = [
            ("file order", order(table, "none")),
            ("ggr (choice in characters)", ggr(table)),
            (
                f"ggr for OpenAI (in tokens, choice at 1,024/128 after {head:,}-token head)",
                order(table, "ggr", objective=Objective(OPENAI, o200k, head)),
            ),
            (
                "ggr for 16-token blocks (in tokens, choice at blocks)",
                order(table, "ggr", objective=Objective(BLOCKS, o200k)),
            ),
        ]
        if reference is not None and table.n_rows <= reference.max_rows:
            got = reference_order(table, reference.directory, reference.python)
            if got is not None:
                orders.append(("reference (authors' QuickGreedy)", got[0]))
        rows = [{"order": name, **unit_rates(table, o, head)} for name, o in orders]
        print(f"\n### {title}: {table.n_rows:,} rows x {len(table.columns)} columns\n")
        print("| order | " + " | ".join(names.values()) + " |")
        print("|---|" + "---:|" * len(names))
        for r in rows:
            print(f"| {r['order']} | " + " | ".join(f"{r[k]:.3f}" for k in names) + " |")
        out.append(
            {"table": title, "rows": table.n_rows, "columns": len(table.columns), "orders": rows}
        )
    return {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "tokenizer": "o200k_base (semframe.cost.tokens, offline)",
        "granularities": {
            "blocks_16": asdict(BLOCKS),
            "openai": asdict(OPENAI),
            "head_tokens": head,
        },
        "reference": None if reference is None else str(reference.directory),
        "note": "hit rates count field segments; openai_after_head: field tokens served "
        "beyond the head's own rounded share, over field tokens",
        "tables": out,
    }


def sweep_table(rng: random.Random, data: dict[str, Table]) -> tuple[str, Table]:
    """One random table for ``--sweep`` (see the module docstring), and what it is."""
    kind = rng.choice(["synthetic", "synthetic", "synthetic", "long-tail", "data"])
    seed = rng.randrange(10**6)
    if kind == "synthetic":
        rows = rng.choice([200, 500, 1000, 3000, 6000])
        cols = rng.randint(3, 9)
        cards = [rng.choice([2, 3, 5, 10, 30, 100, 300, 1000, rows]) for _ in range(cols)]
        lo = rng.randint(1, 10)
        hi = lo + rng.randint(0, 60)
        fds = [(0, 1)] if cols >= 4 and rng.random() < 0.5 else []
        skew = rng.choice([0.0, 0.5, 1.0, 1.5])
        t = synthetic(rows, cols, cards, (lo, hi), skew=skew, fds=fds, seed=seed)
        shape = f"cardinalities {cards}, lengths {lo}-{hi}, skew {skew}, FDs {fds}"
        return f"synthetic {rows} x {cols}, {shape}", t
    if kind == "long-tail":
        rows = rng.choice([2000, 5000, 10000])
        same = rng.choice([0.0, 0.5, 0.95])
        return f"long-tail {rows}, one score for all aspects {same:.0%}", long_tail(
            rows, seed, same
        )
    name = rng.choice(sorted(data))
    src = data[name]
    chosen = rng.sample(list(src.columns), rng.randint(3, min(8, len(src.columns))))
    n = rng.choice([500, 1000, 3000, min(src.n_rows, 10000)])
    start = rng.randrange(max(1, src.n_rows - n))
    t = Table.from_columns({c: list(src.cells[c][start : start + n]) for c in chosen})
    return f"{name} rows {start}-{start + t.n_rows} of {chosen}", t


def sweep_data() -> dict[str, Table]:
    """The data tables the sweep slices (:func:`sweep_table`)."""
    return {
        "movies_small.csv": load_csv(DATA / "movies_small.csv"),
        "contributions.csv": load_csv(DATA / "contributions.csv"),
    }


def sweep(args: argparse.Namespace, count: int) -> None:
    """``--sweep``: GGR against the reference on ``count`` random tables."""
    reference = find_reference(args)
    if reference is None:
        sys.exit("--sweep needs the reference (see --reference)")
    data = sweep_data()
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    below = 0
    print("| # | table | ggr (prev / unbounded) | reference | ggr s | reference s |")
    print("|---:|---|---:|---:|---:|---:|")
    for k in range(count):
        title, table = sweep_table(rng, data)
        ordering, times, _ = timed(lambda t=table: ggr(t), 3)  # a warm-up, then 3 timed
        seconds = statistics.median(times)
        mine = evaluate(table, ordering)
        got = reference_order(table, reference.directory, reference.python, 3)
        if got is None:
            continue
        theirs = evaluate(table, got[0])
        lower = min(
            mine.hit_rate - theirs.hit_rate, mine.hit_rate_unbounded - theirs.hit_rate_unbounded
        )
        below += lower < 0
        print(
            f"| {k} | {title} | {mine.hit_rate:.4f} / {mine.hit_rate_unbounded:.4f} | "
            f"{theirs.hit_rate:.4f} / {theirs.hit_rate_unbounded:.4f} | {seconds:.3f} | "
            f"{got[1]:.3f} |{' **below**' if lower < 0 else ''}",
            flush=True,
        )
        rows.append(
            {
                "table": title,
                "rows": table.n_rows,
                "columns": len(table.columns),
                "ggr": [mine.hit_rate, mine.hit_rate_unbounded],
                "reference": [theirs.hit_rate, theirs.hit_rate_unbounded],
                "ggr_seconds": seconds,
                "reference_seconds": got[1],
            }
        )
    print(f"\nGGR below the reference on {below} of {len(rows)} tables")
    out = args.out or RESULTS.with_name(f"reorder_sweep_{args.seed}.json")
    report = {"seed": args.seed, "tables": rows, "below": below, "date": time.strftime("%Y-%m-%d")}
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


def lookahead_sweep(
    args: argparse.Namespace, sizes: list[int], param: str = "lookahead_cells"
) -> None:
    """``--lookahead`` (``--exact``): GGR at each size of ``param`` on a recorded sweep's tables.

    The tables of ``--sweep`` with ``--seed`` are made again and ordered by
    GGR with each ``lookahead_cells`` (``exact_cells``) of ``sizes`` (a
    warm-up, then the median of 3), scored against the reference's hit rates
    recorded in ``benchmarks/results/reorder_sweep_SEED.json`` (the reference
    is not run again); OPHR's small tables are scored too. What the lookahead
    (its exact scoring) buys, and what it costs
    (``benchmarks/results/reorder_lookahead_SEED.json``,
    ``reorder_exact_SEED.json``).
    """
    recorded = RESULTS.with_name(f"reorder_sweep_{args.seed}.json")
    if not recorded.exists():
        sys.exit(f"--lookahead needs {recorded}: run --sweep N --seed {args.seed} first")
    ref = json.loads(recorded.read_text(encoding="utf-8"))["tables"]
    data = sweep_data()
    rng = random.Random(args.seed)
    seconds = dict.fromkeys(sizes, 0.0)
    leads: dict[int, list[float]] = {size: [] for size in sizes}
    for k in range(len(ref)):
        title, table = sweep_table(rng, data)
        if ref[k]["table"] != title:
            sys.exit(f"table {k} is not the one recorded ({title!r}): the generator changed")
        theirs = ref[k]["reference"]
        for size in sizes:
            # a warm-up, then 3 timed
            ordering, times, _ = timed(functools.partial(ggr, table, **{param: size}), 3)
            mine = evaluate(table, ordering)
            seconds[size] += statistics.median(times)
            leads[size].append(min(mine.hit_rate - theirs[0], mine.hit_rate_unbounded - theirs[1]))
    quality = quality_check(
        args.small_tables,
        0,
        {str(size): functools.partial(ggr, weigh="value", **{param: size}) for size in sizes},
    )
    rows = []
    print(
        f"| {param} | GGR seconds, {len(ref)} tables | below the reference | "
        "mean lead (points) | PHC / OPHR, mean | min |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sizes:
        row: dict[str, float] = {
            param: size,
            "seconds": seconds[size],
            "below": sum(lead < 0 for lead in leads[size]),
            "mean_lead": statistics.fmean(leads[size]),
            "ophr_mean": quality[str(size)]["mean_ratio"],
            "ophr_min": quality[str(size)]["min_ratio"],
        }
        rows.append(row)
        print(
            f"| {size} | {row['seconds']:.2f} | {row['below']} | {100 * row['mean_lead']:.2f} | "
            f"{row['ophr_mean']:.4f} | {row['ophr_min']:.3f} |",
            flush=True,
        )
    name = "lookahead" if param == "lookahead_cells" else "exact"
    out = args.out or RESULTS.with_name(f"reorder_{name}_{args.seed}.json")
    report = {"seed": args.seed, "small_tables": args.small_tables, "sizes": rows}
    report["date"] = time.strftime("%Y-%m-%d")
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


def parse_fds(text: str) -> list[tuple[int, int]]:
    out = []
    for part in filter(None, text.split(",")):
        a, b = part.split(">")
        out.append((int(a), int(b)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per solver")
    parser.add_argument("--rows", type=int, default=100_000, help="synthetic rows")
    parser.add_argument("--columns", type=int, default=10, help="synthetic columns")
    parser.add_argument(
        "--cardinalities",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[3, 10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000],
        help="distinct values per synthetic column (cycled)",
    )
    parser.add_argument(
        "--value-lengths",
        type=lambda s: tuple(int(x) for x in s.split(":")),
        default=(4, 40),
        help="min:max characters of synthetic values",
    )
    parser.add_argument("--skew", type=float, default=1.0, help="Zipf exponent (0: uniform)")
    parser.add_argument(
        "--fds", default="0>1,3>4", help="planted FDs as 'a>b,...' (column indices)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scaling",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[12_500, 25_000, 50_000, 100_000],
        help="row counts of the GGR scaling series",
    )
    parser.add_argument(
        "--scaling-shape",
        choices=("fixed", "proportional"),
        default="fixed",
        help="scaling series: the same cardinalities at every size (fixed), or cardinalities "
        "above 100 scaled with the rows as at 100,000 (proportional)",
    )
    parser.add_argument("--long-tail-rows", type=int, default=28_479)
    parser.add_argument("--reference", type=Path, default=None, help="the GGR authors' code")
    parser.add_argument("--reference-python", type=Path, default=None)
    parser.add_argument("--reference-max-rows", type=int, default=30_000)
    parser.add_argument("--small-tables", type=int, default=500)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--units",
        action="store_true",
        help="only hit rates in characters, tokens, 16-token blocks and OpenAI's 1,024/128",
    )
    parser.add_argument(
        "--head", type=int, default=1024, help="--units: instruction tokens before every prompt"
    )
    parser.add_argument(
        "--scaling-only",
        action="store_true",
        help="only the GGR scaling series (--scaling sizes), each size in a fresh process, "
        "one solve, with the table's memory and the solver's peak above it",
    )
    parser.add_argument("--scaling-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--sweep", type=int, default=0, help="only GGR vs the reference on N random tables"
    )
    parser.add_argument(
        "--lookahead",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="only GGR at these lookahead_cells (e.g. 64,32,0) on the tables of the sweep "
        "recorded with --seed, against its recorded reference",
    )
    parser.add_argument(
        "--exact",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="as --lookahead, at these exact_cells (e.g. 32,16,0)",
    )
    args = parser.parse_args()
    if args.lookahead:
        lookahead_sweep(args, args.lookahead)
        return
    if args.exact:
        lookahead_sweep(args, args.exact, "exact_cells")
        return
    if args.sweep:
        sweep(args, args.sweep)
        return
    fds = parse_fds(args.fds)
    if args.scaling_child is not None:
        json.dump(scaling_child(args.scaling_child, args, fds), sys.stdout)
        return
    if args.scaling_only:
        scaling_only(args)
        return
    if args.units:
        out = args.out or RESULTS.with_name("reorder_units.json")
        report_units = units_report(args)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report_units, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {out}")
        return
    args.out = args.out or RESULTS

    report: dict[str, object] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average_at_start": os.getloadavg(),
        },
        "repeats": args.repeats,
        "note": "hit rates count field segments only; seconds: median wall time, "
        "cpu_seconds: median process CPU time",
    }
    tables: list[tuple[str, Table, bool]] = [
        (
            "movies_small.csv (movie_title, movie_info, review_content)",
            load_csv(DATA / "movies_small.csv", ["movie_title", "movie_info", "review_content"]),
            False,
        ),
        ("contributions.csv (all 15 columns)", load_csv(DATA / "contributions.csv"), False),
        (
            f"synthetic {args.rows:,} x {args.columns} (skew {args.skew}, FDs {args.fds or '-'})",
            synthetic(
                args.rows,
                args.columns,
                args.cardinalities,
                args.value_lengths,
                skew=args.skew,
                fds=fds,
                seed=args.seed,
            ),
            False,
        ),
        (
            f"long-tail item reviews {args.long_tail_rows:,} x 9 (popular items, then 1-4 reviews)",
            long_tail(args.long_tail_rows, seed=args.seed),
            False,
        ),
        (
            f"long-tail item reviews {args.long_tail_rows:,} x 9, 95% of reviews one score "
            "for all four aspects",
            long_tail(args.long_tail_rows, seed=args.seed, same=0.95),
            False,
        ),
        (
            "synthetic 8 x 4 (cardinality 3, OPHR fits)",
            synthetic(8, 4, [3], (1, 6), seed=args.seed),
            True,
        ),
    ]
    reference = find_reference(args)
    report["reference"] = None if reference is None else str(reference.directory)
    results = []
    for title, table, with_ophr in tables:
        rows = score_orders(table, args.repeats, with_ophr, reference)
        print_table(f"{title}: {table.n_rows:,} rows x {len(table.columns)} columns", rows)
        results.append(
            {
                "table": title,
                "rows": table.n_rows,
                "columns": len(table.columns),
                "orders": [asdict(r) for r in rows],
            }
        )
    report["tables"] = results

    series = scaling(args.scaling, args, fds)
    print(f"\n### GGR scaling over rows ({args.columns} columns, same generator)\n")
    print("| rows | seconds | CPU seconds | us / row | ns / (n log2 n) | PHC / upper bound |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in series:
        print(
            f"| {s['rows']:,} | {s['seconds']:.3f} | {s['cpu_seconds']:.3f} "
            f"| {s['microseconds_per_row']:.1f} | {s['ns_per_n_log2_n']:.2f} "
            f"| {s['phc_ratio']:.3f} |"
        )
    report["scaling"] = series

    quality = quality_check(args.small_tables, args.seed)
    print(f"\n### Quality against OPHR on {args.small_tables} random small tables\n")
    print("| solver | mean PHC / OPHR | min | share optimal | share below 0.8 |")
    print("|---|---:|---:|---:|---:|")
    for name, q in quality.items():
        print(
            f"| {name} | {q['mean_ratio']:.4f} | {q['min_ratio']:.3f} "
            f"| {q['share_optimal']:.3f} | {q['share_below_0.8']:.3f} |"
        )
    report["quality_vs_ophr"] = {"tables": args.small_tables, "solvers": quality}

    report["load_average_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
