"""semframe's own overhead, no LLM: compile, render, execute on the fake backend, restore.

Builds a synthetic table of N rows x 8 columns (mixed dtypes, some repetition),
runs ``df.llm.map`` on the ``fake`` backend and times each phase. The fake
backend is a stand-in for the model and does work of its own (it records every
request and simulates a per-slot prefix cache), so its time alone, answering
the same requests without semframe around it, is measured too and subtracted:
``semframe s`` = total - fake alone. Prints a table and writes JSON to
``benchmarks/results/overhead.json``.

    python benchmarks/overhead.py                  # 12.5k, 25k, 50k, 100k rows
    python benchmarks/overhead.py --rows 100000 --repeat 5

Target (issue 2): under 2 s for 100,000 rows x 8 columns, linear in rows.

``--calls`` measures the calls of issue 24 instead, on N rows of three
low-cardinality fields and a ~230-character review, each against the columnar
floor measured in the same run (pandas/pyarrow string operations rendering N
prompts of the same four labeled fields into a column). The maps run on a fake
backend that keeps no history of its requests (below), alone as in the call.
Every measurement runs
in a fresh subprocess, so that its peak memory (``VmHWM`` above the process's
resident size after building the frame, the heap's free memory given back
first: ``benchmarks/memory.py``) is its own. The same call runs first on 8
rows: what a process's first call loads once (the library's modules, a
tokenizer's tables) is reported apart (``first_call_bytes``), not in the
call's peak, which is what the call holds for its rows. Then the call runs
once on every row, not measured: building the frame leaves memory the
process holds but no longer uses, which a first call reuses without growing
(its peak read less than half of the next calls'). Each measured call's peak
is taken from its own start, what the call before it left for Python's
cyclic collector collected first; the largest is reported (``peak_bytes``,
each in ``peaks_bytes``). A ``map`` served from the cache finds it filled by
that unmeasured call. Times are medians over ``--repeat`` (the floor: at least
3). The machine's load average is recorded with the results. Writes
``benchmarks/results/overhead_calls.json``.

    python benchmarks/overhead.py --calls --rows 300000 --repeat 3

Targets (issue 24): ``plan`` within 10x the floor, ``estimate`` within 20x,
a cold fake-backend ``map`` the fake's own work plus 5 us a row, the same map
served from the result cache within 10x.

``--scale N`` runs one ``map`` of N rows of the same four fields (reviews drawn
from 100,000 distinct texts and numbered, so every review is distinct) with
``cache=False`` and then with an empty result cache, each in a fresh
subprocess, on a fake backend that keeps no history of its requests (the
shipped one keeps every prompt it is sent); it prints the time and the
process's peak resident memory and writes ``benchmarks/results/overhead_scale.json``.

    python benchmarks/overhead.py --scale 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import memory  # benchmarks/memory.py
import numpy as np
import pandas as pd

import semframe
from semframe.backends import register_backend
from semframe.backends.fake import FakeBackend
from semframe.core.frames import Frame, NewColumn, Output
from semframe.operators.common import compile_call
from semframe.runtime.execute import execute

TEMPLATE = (
    "Classify the contribution from {name} ({city}, {state}) of {amount} on {date} "
    "to {committee}, employer {employer}, occupation {occupation}."
)


def make_frame(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "name": [f"person {i}" for i in rng.integers(0, rows // 2 + 1, rows)],
            "city": rng.choice([f"city {i}" for i in range(300)], rows),
            "state": rng.choice([f"S{i}" for i in range(50)], rows),
            "amount": rng.integers(1, 5000, rows),
            "date": pd.to_datetime("2024-01-01") + pd.to_timedelta(rng.integers(0, 365, rows), "D"),
            "committee": rng.choice([f"committee {i}" for i in range(40)], rows),
            "employer": rng.choice([f"employer {i}" for i in range(2000)], rows),
            "occupation": rng.choice([f"occupation {i}" for i in range(100)], rows),
        }
    )


def run_once(df: pd.DataFrame, reorder: str) -> dict[str, float]:
    backend = FakeBackend(lambda request: "ok")
    register_backend("fake", lambda model, settings: backend)
    t0 = time.perf_counter()
    frame = Frame.of(df)
    call = compile_call(frame, TEMPLATE, op="map", backend="fake", reorder=reorder, progress="off")
    t1 = time.perf_counter()
    outcomes, _ = execute(call.plan, backend, progress="off")
    t2 = time.perf_counter()
    values = call.plan.restore(outcomes)
    out = frame.build(Output(columns=(NewColumn("label", [o.value for o in values]),)))
    t3 = time.perf_counter()
    assert len(out) == len(df)
    assert len(backend.history) == len(df)
    alone = FakeBackend(lambda request: "ok")
    requests = list(call.plan.requests)  # rendered before the clock starts: the fake's work only
    t4 = time.perf_counter()
    for request in requests:
        alone.complete(request, slot=0)
    fake = time.perf_counter() - t4
    return {
        "compile": t1 - t0,
        "execute": t2 - t1,
        "restore": t3 - t2,
        "total": t3 - t0,
        "fake_alone": fake,
        "semframe": t3 - t0 - fake,
    }


CALLS_TEMPLATE = (
    "Summarize in one sentence what the {review} says about {product} "
    "({category}, sold in {region})."
)
CALLS = ("floor", "plan", "estimate", "map_cold", "map_warm")
CALL_TARGETS = {"plan": 10.0, "estimate": 20.0, "map_warm": 10.0}
"""Largest time of each call as a multiple of the floor (issue 24)."""
MAP_COLD_US_PER_ROW = 5.0
"""A cold map's budget: the fake's own work plus this many microseconds a row."""

_WORDS = (
    "the a this film movie plot acting story scene great good bad slow fast funny dark "
    "long short music score camera cast director ending twist characters dialogue "
    "brilliant boring tense warm cold beautiful ugly loud quiet clever dull fresh stale "
    "and but with without very quite rather too never always often sometimes really"
)


REGIONS = ["north", "south", "east", "west", "central"]


def make_reviews_frame(rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` rows: product, category, region (few distinct values) and a ~230-char review."""
    rng = np.random.default_rng(seed)
    words = np.array(_WORDS.split(), dtype=object)
    picks = words[rng.integers(0, len(words), (rows, 40))]
    regions = REGIONS
    reviews = [f"{i}: " + " ".join(w)[:226] for i, w in enumerate(picks.tolist())]
    return pd.DataFrame(
        {
            "product": pd.array(rng.choice([f"product {i}" for i in range(200)], rows), "str"),
            "category": pd.array(rng.choice([f"category {i}" for i in range(12)], rows), "str"),
            "region": pd.array(rng.choice(regions, rows), "str"),
            "review": pd.array(reviews, "str"),
        }
    )


def floor_render(df: pd.DataFrame) -> pd.Series:
    """The floor: render the four labeled fields of every row into a column, columnar."""
    head = "Summarize in one sentence what the [review] says about [product] ([category], "
    head += "sold in [region]).\n\n"
    return (
        head
        + "review: "
        + df["review"]
        + "\nproduct: "
        + df["product"]
        + "\ncategory: "
        + df["category"]
        + "\nregion: "
        + df["region"]
        + "\n"
    )


def child(name: str, rows: int, repeat: int, cache_root: str) -> dict[str, Any]:
    """One measurement in this process: times of ``repeat`` calls and the peak memory."""
    df = make_reviews_frame(rows)
    columns_bytes = int(df.memory_usage(deep=True, index=False).sum())
    frame_peak = memory.status_bytes("VmHWM")
    # The fake without its record of every request it is sent (prompts and all): that
    # memory is the stand-in's, not the call's (it was 0.5 GB of a 1M-row map's peak).
    quiet = QuietFake()
    register_backend("fake", lambda model, settings: quiet)

    def call(frame: pd.DataFrame, cache_dir: str) -> Any:
        if name == "floor":
            return floor_render(frame)
        if name == "plan":
            return frame.llm.plan(CALLS_TEMPLATE, op="map", cache_dir=cache_dir)
        if name == "estimate":
            return frame.llm.estimate(
                CALLS_TEMPLATE, op="map", backend="openai", model="gpt-4o-mini", cache_dir=cache_dir
            )
        return frame.llm.map(CALLS_TEMPLATE, backend="fake", cache_dir=cache_dir, progress="off")

    # The same call on 8 rows first (its own result cache): what a process's first call
    # loads once (the library's modules, a tokenizer's tables) is counted apart.
    memory.start()  # what building the frame freed is not counted as resident before the call
    base_rss = memory.status_bytes("VmRSS")
    warm_up = call(df.iloc[:8], f"{cache_root}/warm-up")
    del warm_up
    first_call_bytes = memory.status_bytes("VmHWM") - base_rss
    # Then once on every row, not measured: building the frame left memory that the
    # process holds but no longer uses, which a first call reuses without growing (its
    # peak read less than half of the next calls'); every measured call comes after.
    settled = call(df, f"{cache_root}/settle" if name == "map_cold" else f"{cache_root}/cold0")
    del settled
    times: list[float] = []
    peaks: list[int] = []
    answers_bytes = 0
    for i in range(max(repeat, 3) if name == "floor" else repeat):  # the floor is cheap
        cache_dir = f"{cache_root}/cold{i}" if name == "map_cold" else f"{cache_root}/cold0"
        # Each call's own peak: what the call before left for the cyclic collector is
        # collected first (it was counted in the next call's peak otherwise).
        memory.start()
        base_rss = memory.status_bytes("VmRSS")
        t0 = time.perf_counter()
        out = call(df, cache_dir)
        times.append(time.perf_counter() - t0)
        if name.startswith("map"):
            answers_bytes = int(out["llm_output"].memory_usage(deep=True, index=False))
        del out
        peaks.append(memory.status_bytes("VmHWM") - base_rss)
    result: dict[str, Any] = {
        "call": name,
        "rows": rows,
        "times": times,
        "median_s": statistics.median(times),
        "peak_bytes": max(peaks),
        "peaks_bytes": peaks,
        "first_call_bytes": first_call_bytes,
        "frame_peak_bytes": frame_peak,
        "columns_bytes": columns_bytes,
        "answers_bytes": answers_bytes,
    }
    if name == "map_cold":
        plan = df.llm.plan(CALLS_TEMPLATE, op="map", backend="fake", cache=False)
        requests = list(plan.requests)  # rendered before the clock starts: the fake's work only
        alone = QuietFake()
        t0 = time.perf_counter()
        for request in requests:
            alone.complete(request, slot=0)
        result["fake_alone_s"] = time.perf_counter() - t0
    return result


def run_calls(rows: list[int], repeat: int, out: str) -> None:
    """Each of :data:`CALLS` in a subprocess per size; a table and JSON."""
    results = []
    load_before = os.getloadavg()
    print(
        f"{'rows':>9} {'call':>9} {'median s':>9} {'x floor':>8} {'target':>14} "
        f"{'peak MB':>8} {'peak/(cols+answers)':>20} {'B/row':>7} {'first call MB':>14}"
    )
    for n in rows:
        root = tempfile.mkdtemp(prefix="overhead-", dir=os.environ.get("OVERHEAD_TMP"))
        by_call: dict[str, dict[str, Any]] = {}
        try:
            for name in CALLS:
                cmd = [sys.executable, __file__, "--child", name, "--rows", str(n)]
                cmd += ["--repeat", str(repeat), "--cache-root", root]
                done = subprocess.run(cmd, check=False, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{name} failed:\n{done.stderr}")
                by_call[name] = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            shutil.rmtree(root, ignore_errors=True)
        floor = by_call["floor"]["median_s"]
        answers = by_call["map_cold"]["answers_bytes"]
        for name in CALLS:
            r = by_call[name]
            ratio = r["median_s"] / floor
            if name in CALL_TARGETS:
                target = f"<= {CALL_TARGETS[name]:.0f}x"
                r["met"] = ratio <= CALL_TARGETS[name]
            elif name == "map_cold":
                allowed = r["fake_alone_s"] + MAP_COLD_US_PER_ROW * 1e-6 * n
                target = f"<= {allowed:.2f} s"
                r["allowed_s"] = allowed
                r["met"] = r["median_s"] <= allowed
            else:
                target = ""
            r["x_floor"] = ratio
            base = r["columns_bytes"] + (answers if name.startswith("map") else 0)
            r["peak_over_input"] = r["peak_bytes"] / base
            met = "" if "met" not in r else (" ok" if r["met"] else " MISS")
            print(
                f"{n:>9,} {name:>9} {r['median_s']:>9.3f} {ratio:>8.1f} {target + met:>14} "
                f"{r['peak_bytes'] / 1e6:>8.0f} {r['peak_over_input']:>20.2f} "
                f"{r['peak_bytes'] / n:>7.0f} {r['first_call_bytes'] / 1e6:>14.0f}"
            )
            results.append(r)
        print(f"{'':>9} fake alone {by_call['map_cold']['fake_alone_s']:.3f} s")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps(
            {
                "semframe": semframe.__version__,
                "pandas": pd.__version__,
                "load_average": {"before": load_before, "after": os.getloadavg()},
                "results": results,
            },
            indent=2,
        )
    )
    print(f"load average (1, 5, 15 min): before {load_before}, after {os.getloadavg()}")
    print(f"wrote {out}")


class QuietFake(FakeBackend):
    """The fake backend without its history of requests (a 10M-row run would keep every prompt)."""

    def complete(self, request: Any, *, slot: int | None = None) -> Any:
        completion = super().complete(request, slot=slot)
        self.history.clear()
        self.slots.clear()
        return completion


def scale_frame(rows: int) -> pd.DataFrame:
    """``rows`` rows of :func:`make_reviews_frame`'s fields, each review distinct."""
    rng = np.random.default_rng(0)
    bodies = make_reviews_frame(100_000)["review"].str.split(": ", n=1).str[1].to_numpy()
    picked = bodies[rng.integers(0, len(bodies), rows)].tolist()
    reviews = pd.array([f"{i}: {b}" for i, b in enumerate(picked)], "str")
    del picked
    return pd.DataFrame(
        {
            "product": pd.array(rng.choice([f"product {i}" for i in range(200)], rows), "str"),
            "category": pd.array(rng.choice([f"category {i}" for i in range(12)], rows), "str"),
            "region": pd.array(rng.choice(REGIONS, rows), "str"),
            "review": reviews,
        }
    )


def scale_child(rows: int, cache: bool, cache_root: str) -> dict[str, Any]:
    """One ``map`` of ``rows`` rows in this process: seconds and peak resident bytes."""
    import gc

    t0 = time.perf_counter()
    df = scale_frame(rows)
    gc.collect()
    built = time.perf_counter() - t0
    frame_peak = memory.status_bytes("VmHWM")
    register_backend("quiet-fake", lambda model, settings: QuietFake())
    t0 = time.perf_counter()
    out = df.llm.map(
        CALLS_TEMPLATE, backend="quiet-fake", cache=cache, cache_dir=cache_root, progress="off"
    )
    seconds = time.perf_counter() - t0
    run = semframe.last_run()
    return {
        "rows": rows,
        "cache": cache,
        "seconds": seconds,
        "us_per_row": seconds / rows * 1e6,
        "run_seconds": run.wall_seconds,
        "frame_seconds": built,
        "columns_bytes": int(df.memory_usage(deep=True, index=False).sum()),
        "answers_bytes": int(out["llm_output"].memory_usage(deep=True, index=False)),
        "frame_peak_bytes": frame_peak,
        "peak_bytes": memory.status_bytes("VmHWM"),
    }


def run_scale(rows: int, out: str) -> None:
    """:func:`scale_child` without and with the result cache, each in a subprocess."""
    results = []
    for cache in (False, True):
        root = tempfile.mkdtemp(prefix="overhead-scale-", dir=os.environ.get("OVERHEAD_TMP"))
        try:
            cmd = [sys.executable, __file__, "--scale-child", str(rows), "--cache-root", root]
            cmd += ["--with-cache"] if cache else []
            done = subprocess.run(cmd, check=False, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"scale run failed:\n{done.stderr}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            shutil.rmtree(root, ignore_errors=True)
        results.append(r)
        print(
            f"{rows:,} rows, cache={'on' if cache else 'off'}: {r['seconds']:.0f} s "
            f"({r['us_per_row']:.1f} us a row; the run itself {r['run_seconds']:.0f} s), "
            f"peak resident {r['peak_bytes'] / 1e9:.1f} GB (building the frame: "
            f"{r['frame_peak_bytes'] / 1e9:.1f} GB; columns {r['columns_bytes'] / 1e9:.1f} GB, "
            f"answers {r['answers_bytes'] / 1e9:.1f} GB)",
            flush=True,
        )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    report = {"semframe": semframe.__version__, "results": results}
    Path(out).write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=None)
    parser.add_argument("--reorder", nargs="*", default=["none", "ggr"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--calls", action="store_true", help="issue 24's calls vs the floor")
    parser.add_argument("--child", choices=CALLS, help=argparse.SUPPRESS)
    parser.add_argument("--cache-root", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=int, default=None, help="one map of this many rows")
    parser.add_argument("--scale-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--with-cache", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    results_dir = Path(__file__).parent / "results"
    if args.scale_child is not None:
        print(json.dumps(scale_child(args.scale_child, args.with_cache, args.cache_root)))
        return
    if args.scale is not None:
        run_scale(args.scale, args.out or str(results_dir / "overhead_scale.json"))
        return
    if args.child:
        print(json.dumps(child(args.child, args.rows[0], args.repeat, args.cache_root)))
        return
    if args.calls:
        out = args.out or str(results_dir / "overhead_calls.json")
        run_calls(args.rows or [300_000], args.repeat, out)
        return
    args.rows = args.rows or [12_500, 25_000, 50_000, 100_000]
    args.out = args.out or str(results_dir / "overhead.json")

    results = []
    print(
        f"{'rows':>8} {'reorder':>8} {'compile s':>10} {'execute s':>10} {'restore s':>10} "
        f"{'total s':>8} {'fake s':>7} {'semframe s':>10} {'rows/s':>10}"
    )
    for rows in args.rows:
        df = make_frame(rows)
        for reorder in args.reorder:
            runs = [run_once(df, reorder) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results.append(
                {
                    "rows": rows,
                    "columns": 8,
                    "reorder": reorder,
                    **med,
                    "rows_per_s": rows / med["semframe"],
                    "repeat": args.repeat,
                }
            )
            print(
                f"{rows:>8} {reorder:>8} {med['compile']:>10.3f} {med['execute']:>10.3f} "
                f"{med['restore']:>10.3f} {med['total']:>8.3f} {med['fake_alone']:>7.3f} "
                f"{med['semframe']:>10.3f} {rows / med['semframe']:>10,.0f}"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"semframe": semframe.__version__, "results": results}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
