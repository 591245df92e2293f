"""Local-engine throughput against LOTUS: few large groups and many small ones.

Two tables from ``movies_small.csv`` (reviews with text, in the file's order):

- ``few``: every review of the 7 movies with the most reviews (7 prefix groups
  of about 20 rows);
- ``many``: the first 3 reviews of each of 50 movies (50 groups of 3 rows).

On each, a ``filter`` and a ``map`` (48-token cap) run on the embedded
llama.cpp engine (SmolLM2-135M, ``--parallel`` slots, a fresh engine for every
run so that no run inherits another's cache): semframe in process (its
``local`` backend), and LOTUS (``lotus-ai`` 1.2.4) over the same engine's
OpenAI-compatible endpoint with as many requests in flight as there are slots,
when its environment is present (see ``benchmarks/vs_lotus.py``). The
libraries alternate who goes first in each round.

Beside each wall time, from the engine itself:

- **slot occupancy**: the share of slot-time spent processing, sampled from
  the server's ``/slots`` every 20 ms over the call;
- **busy slots per decode**: the server's own ``n_busy_slots_per_decode``
  (``/metrics``): how many sequences each decode step advanced together;
- **cached share**: cached prompt tokens over prompt tokens, as the responses
  reported them.

Targets (issue "Throughput"): filter at most 0.25x and map at most 0.4x of
LOTUS's wall time, on both tables. Medians of ``--repeats`` rounds::

    python benchmarks/local_throughput.py --repeats 3

Writes ``benchmarks/results/local_throughput.json`` and a plot of slot
occupancy over time (``local_throughput.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.backends import reset_backends

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_lotus import (
    DATA,
    LOTUS_PY,
    MAX_TOKENS,
    TEMPLATES,
    fresh_engine,
    lotus_local,
    semframe_call,
    semframe_counts,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "local_throughput.json"
TARGETS = {"filter": 0.25, "map": 0.4}
SAMPLE_S = 0.02


def tables() -> dict[str, list[int]]:
    """Row positions of the two tables (in the file's order)."""
    df = pd.read_csv(DATA)
    df = df[df["review_content"].notna() & (df["review_content"].str.strip() != "")]
    counts = df["movie_title"].value_counts(sort=False)
    # The most-reviewed movies (ties in the file's order), and the first 50 movies.
    big = counts.sort_values(ascending=False, kind="stable").index[:7]
    movies = list(dict.fromkeys(df["movie_title"]))[:50]
    few = df.index[df["movie_title"].isin(big)]
    many = df.groupby("movie_title", sort=False).head(3)
    many = many[many["movie_title"].isin(movies)]
    return {"few": [int(i) for i in few], "many": [int(i) for i in many.index]}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text: str = resp.read().decode()
        return text


class Occupancy:
    """Samples the server's ``/slots`` in a thread: (seconds, busy slots) pairs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        while not self._stop.is_set():
            try:
                slots = json.loads(_get(self.url + "/slots"))
            except OSError:
                break
            busy = sum(bool(s.get("is_processing")) for s in slots)
            self.samples.append((time.perf_counter() - start, busy))
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> Occupancy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def metrics(url: str) -> dict[str, float]:
    """The server's Prometheus counters, ``llamacpp:`` names without the prefix."""
    out: dict[str, float] = {}
    for line in _get(url + "/metrics").splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def one_run(
    lib: str, table: str, op: str, positions: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]  # the machine's load: another job skews a run
    url = fresh_engine(args.parallel)
    df = pd.read_csv(DATA).iloc[positions].reset_index(drop=True)
    with Occupancy(url) as occ:
        if lib == "semframe":
            answers, wall, st = semframe_call(
                df, op, progress="off", backend="local", local_parallel=args.parallel
            )
            tokens = semframe_counts(st) | {"retries": st.retries}
        else:
            res, tokens = lotus_local(op, positions, url, args.parallel, args.lotus_python)
            answers, wall = res["answers"], res["wall_s"]
            tokens["lotus_fields"] = res["fields"]  # its field order differs per process
    server = metrics(url)
    # Occupancy over the call itself: from the first busy sample to the last.
    busy = [i for i, (_, b) in enumerate(occ.samples) if b]
    window = occ.samples[busy[0] : busy[-1] + 1] if busy else []
    occupancy = statistics.fmean(b for _, b in window) / args.parallel if window else float("nan")
    run = {
        "load_average_before": load_before,
        "lib": lib,
        "table": table,
        "op": op,
        "rows": len(positions),
        "wall_s": wall,
        **tokens,
        "cached_share": tokens["cached_tokens"] / tokens["prompt_tokens"]
        if tokens["prompt_tokens"]
        else 0.0,
        "slot_occupancy": occupancy,
        "busy_slots_per_decode": server.get("n_busy_slots_per_decode", float("nan")),
        "server": server,
        "timeline": busy_over_time(window),
        "answered": sum(a is not None for a in answers),
    }
    print(
        f"  {table:<5} {op:<6} {lib:<9} {wall:6.1f} s  occupancy {occupancy:5.1%}  "
        f"per decode {run['busy_slots_per_decode']:.2f}  cached {run['cached_share']:.1%}",
        flush=True,
    )
    return run


def summarize(runs: list[dict[str, Any]], libs: list[str]) -> list[dict[str, Any]]:
    rows = []
    for table in ("few", "many"):
        for op in ("filter", "map"):
            by_lib = {
                lib: [r for r in runs if (r["table"], r["op"], r["lib"]) == (table, op, lib)]
                for lib in libs
            }
            lotus_wall = (
                statistics.median(r["wall_s"] for r in by_lib["lotus"])
                if by_lib.get("lotus")
                else None
            )
            for lib, mine in by_lib.items():
                if not mine:
                    continue
                wall = statistics.median(r["wall_s"] for r in mine)
                row: dict[str, Any] = {
                    "table": table,
                    "op": op,
                    "lib": lib,
                    "wall_s": wall,
                    "wall_s_all": [round(r["wall_s"], 1) for r in mine],
                    "slot_occupancy": statistics.median(r["slot_occupancy"] for r in mine),
                    "busy_slots_per_decode": statistics.median(
                        r["busy_slots_per_decode"] for r in mine
                    ),
                    "cached_share": statistics.median(r["cached_share"] for r in mine),
                    "output_tokens": statistics.median(r["output_tokens"] for r in mine),
                }
                if lotus_wall and lib != "lotus":
                    row["vs_lotus"] = wall / lotus_wall
                    row["target"] = TARGETS[op]
                    row["met"] = row["vs_lotus"] <= TARGETS[op]
                rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'table':<5} {'op':<6} {'library':<9} {'wall s':>7} {'vs LOTUS':>8} {'target':>6} "
        f"{'slots busy':>10} {'per decode':>10} {'cached':>7} {'out tok':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['vs_lotus']:.2f}x" if "vs_lotus" in r else "-"
        target = f"{r['target']:.2f}x" if "target" in r else "-"
        print(
            f"{r['table']:<5} {r['op']:<6} {r['lib']:<9} {r['wall_s']:>7.1f} {ratio:>8} "
            f"{target:>6} {r['slot_occupancy']:>10.1%} {r['busy_slots_per_decode']:>10.2f} "
            f"{r['cached_share']:>7.1%} {r['output_tokens']:>7,.0f}"
        )


def busy_over_time(
    samples: list[tuple[float, int]], window: float = 1.0, step: float = 0.25
) -> list[tuple[float, float]]:
    """Busy slots averaged over the ``window`` seconds before each ``step`` (from the call's start).

    Examples
    --------
    >>> busy_over_time([(0.0, 4), (0.5, 2), (1.0, 2), (1.5, 4)], window=1.0, step=0.5)
    [(0.0, 4.0), (0.5, 3.0), (1.0, 2.667), (1.5, 2.667)]
    """
    if not samples:
        return []
    t0 = samples[0][0]
    out: list[tuple[float, float]] = []
    start = total = 0
    at = 0.0
    for i, (t, busy) in enumerate(samples):
        total += busy
        while samples[start][0] < t - window:
            total -= samples[start][1]
            start += 1
        if t - t0 >= at or i == len(samples) - 1:
            out.append((round(t - t0, 2), round(total / (i - start + 1), 3)))
            at += step
    return out


def plot(runs: list[dict[str, Any]], libs: list[str], path: Path, parallel: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 7), sharey=True)
    for ax, (table, op) in zip(
        axes.flat, [(t, o) for t in ("few", "many") for o in ("filter", "map")], strict=True
    ):
        for lib in libs:
            first = next(
                (r for r in runs if (r["table"], r["op"], r["lib"]) == (table, op, lib)), None
            )
            if first and first["timeline"]:
                ax.plot(
                    [t for t, _ in first["timeline"]],
                    [b for _, b in first["timeline"]],
                    label=f"{lib} ({first['wall_s']:.0f} s)",
                )
        ax.set(title=f"{table} groups: {op}", xlabel="seconds", ylabel="busy slots (1 s mean)")
        ax.set_ylim(0, parallel + 0.5)
        ax.legend(loc="lower right")
    fig.suptitle("Engine slots busy during one call (first round), from the server's /slots")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(
    args: argparse.Namespace,
    chosen: dict[str, list[int]],
    libs: list[str],
    runs: list[dict[str, Any]],
) -> None:
    """Write the JSON of the runs so far."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "local_throughput",
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "machine": f"{platform.platform()}, {os.cpu_count()} cores",
                "command": "python benchmarks/local_throughput.py " + " ".join(sys.argv[1:]),
                "semframe": semframe.__version__,
                "parallel": args.parallel,
                "repeats": args.repeats,
                "tables": {k: len(v) for k, v in chosen.items()},
                "templates": {op: TEMPLATES[op] for op in args.ops},
                "max_tokens": {op: MAX_TOKENS[op] for op in args.ops},
                "summary": summarize(runs, libs),
                "runs": runs,
            },
            indent=1,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=4, help="engine slots")
    parser.add_argument("--tables", nargs="+", default=["few", "many"], choices=["few", "many"])
    parser.add_argument("--ops", nargs="+", default=["filter", "map"], choices=["filter", "map"])
    parser.add_argument("--lotus-python", type=Path, default=LOTUS_PY)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--replot", action="store_true", help="only draw the plot again from --out's JSON"
    )
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(args.out.read_text())
        libs = list(dict.fromkeys(r["lib"] for r in saved["runs"]))
        plot(saved["runs"], libs, args.out.with_suffix(".png"), saved["parallel"])
        return
    warnings.simplefilter("ignore", DeprecationWarning)
    libs = ["semframe"]
    if args.lotus_python.exists():
        libs.append("lotus")
    else:
        print(
            f"no LOTUS environment at {args.lotus_python}: semframe alone. Create it with\n"
            "  python3 -m venv .venv-lotus && .venv-lotus/bin/pip install lotus-ai==1.2.4"
        )
    chosen = {k: v for k, v in tables().items() if k in args.tables}
    for name, positions in chosen.items():
        movies = pd.read_csv(DATA).iloc[positions]["movie_title"].nunique()
        print(f"table {name}: {len(positions)} reviews of {movies} movies")
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for table, positions in chosen.items():
            for op in args.ops:
                order = libs[rep % len(libs) :] + libs[: rep % len(libs)]
                for lib in order:
                    run = one_run(lib, table, op, positions, args)
                    run["rep"] = rep
                    runs.append(run)
                    write(args, chosen, libs, runs)  # an interrupted run keeps what it has
    reset_backends("local")
    print()
    print_table(summarize(runs, libs))
    png = args.out.with_suffix(".png")
    plot(runs, libs, png, args.parallel)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
