"""What the result cache costs: a cold run with the cache against one without, and a re-run.

The workload of ``benchmarks/overhead.py`` (N rows x 8 columns, ``df.llm.map``
on the ``fake`` backend, whose answers take microseconds) is run three ways in
one process, each timed end to end (compile, execute, restore):

- ``no cache``: ``cache=False``;
- ``cold``: the cache on, in an empty cache folder: every request is looked up,
  sent, and its answer stored (the run waits for the last commit);
- ``re-run``: the same call again: the cache indexes the whole call (its
  fingerprint: the data, template and settings), so every row is served from
  the cache without ordering or rendering anything, and nothing is sent.

Each is repeated (garbage collected before each run; which of ``no cache`` and
``cold`` comes first alternates between repeats) and the medians are reported.
Prints a table and writes ``benchmarks/results/cache.json``.

    python benchmarks/cache.py                    # 100,000 rows, 5 repeats
    python benchmarks/cache.py --rows 20000 --repeat 5
    python benchmarks/cache.py --rows 20000 --delay-ms 1 --workers 8   # a model taking 1 ms

Targets (issue 10): the re-run under 3 s at 100,000 rows; the cold run's
overhead under 5% of the fake backend's run without the cache.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import semframe
from semframe.backends import register_backend
from semframe.backends.fake import FakeBackend

sys.path.insert(0, str(Path(__file__).parent))
from overhead import TEMPLATE, make_frame


def run(
    df: object, folder: Path, *, cache: bool, reorder: str, delay: float = 0.0, workers: int = 1
) -> tuple[float, float, float, int, int]:
    """Seconds for one ``map`` call (wall clock and CPU of the process, every thread) and for
    its execution (cache lookups, sending, storing: ``RunStats.wall_seconds``); requests the
    backend received; rows from the cache."""

    def answer(request: object) -> str:
        if delay:
            time.sleep(delay)
        return "ok"

    backend = FakeBackend(answer, max_concurrency=workers)
    register_backend("fake", lambda model, settings: backend)
    start, cpu = time.perf_counter(), time.process_time()
    with semframe.using(cache_dir=str(folder), progress="off"):
        out = df.llm.map(TEMPLATE, backend="fake", cache=cache, reorder=reorder, out="label")  # type: ignore[attr-defined]
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert len(out) == len(df)  # type: ignore[arg-type]
    stats = semframe.last_run()
    assert stats is not None
    return seconds, cpu, stats.wall_seconds, len(backend.history), stats.cache_hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--reorder", default="ggr")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="fake answer time")
    parser.add_argument("--workers", type=int, default=1, help="fake backend slots")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cache.json"))
    args = parser.parse_args()

    df = make_frame(args.rows)
    times: dict[str, list[float]] = {"no cache": [], "cold": [], "re-run": []}
    execute: dict[str, list[float]] = {"no cache": [], "cold": [], "re-run": []}
    cpu: dict[str, list[float]] = {"no cache": [], "cold": [], "re-run": []}
    for rep in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            runs = [
                ("no cache", False, (args.rows, 0)),
                ("cold", True, (args.rows, 0)),
                ("re-run", True, (0, args.rows)),  # nothing sent
            ]
            if rep % 2:  # alternate which comes first: the first run of a repeat is slower
                runs = [*runs[1:], runs[0]]
            for name, cache, expect in runs:
                gc.collect()
                seconds, used, inner, sent, hits = run(
                    df,
                    folder,
                    cache=cache,
                    reorder=args.reorder,
                    delay=args.delay_ms / 1000,
                    workers=args.workers,
                )
                assert (sent, hits) == expect
                times[name].append(seconds)
                cpu[name].append(used)
                execute[name].append(inner)
            file_mib = sum(p.stat().st_size for p in folder.glob("results.sqlite*")) / 2**20

    med = {k: statistics.median(v) for k, v in times.items()}
    med_exec = {k: statistics.median(v) for k, v in execute.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    cpu_overhead = med_cpu["cold"] - med_cpu["no cache"]
    overhead = med["cold"] - med["no cache"]
    share = overhead / med["no cache"]
    exec_overhead = med_exec["cold"] - med_exec["no cache"]
    print(
        f"{args.rows:,} rows x 8 columns, map on the fake backend ({args.delay_ms:g} ms an "
        f"answer, {args.workers} slot(s)), reorder={args.reorder}, medians of {args.repeat}"
    )
    print(f"{'run':<10} {'call s':>8} {'execute s':>10} {'CPU s':>7} {'calls s':>22}")
    for name, values in times.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"{name:<10} {med[name]:>8.3f} {med_exec[name]:>10.3f} {med_cpu[name]:>7.3f} {runs:>22}"
        )
    print(
        f"cold-run overhead: {overhead:.3f} s = {share:.1%} of the call without the cache "
        f"(target < 5%); in execute alone {exec_overhead:.3f} s, "
        f"{exec_overhead / args.rows * 1e6:.1f} µs a row"
    )
    print(
        f"CPU: the cold run uses {cpu_overhead:.3f} s more CPU than the run without the cache "
        f"= {cpu_overhead / med_cpu['no cache']:.1%}"
    )
    print(f"re-run: {med['re-run']:.3f} s (target < 3 s); cache file {file_mib:.1f} MiB")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    result = {
        "semframe": semframe.__version__,
        "rows": args.rows,
        "columns": 8,
        "reorder": args.reorder,
        "repeat": args.repeat,
        "fake_delay_ms": args.delay_ms,
        "fake_workers": args.workers,
        "seconds": times,
        "median_s": med,
        "execute_seconds": execute,
        "execute_median_s": med_exec,
        "cpu_seconds": cpu,
        "cpu_median_s": med_cpu,
        "cold_overhead_cpu_s": cpu_overhead,
        "cold_overhead_cpu_share": cpu_overhead / med_cpu["no cache"],
        "cold_overhead_s": overhead,
        "cold_overhead_share": share,
        "cold_overhead_execute_s": exec_overhead,
        "cold_overhead_us_per_row": exec_overhead / args.rows * 1e6,
        "rerun_s": med["re-run"],
        "cache_file_mib": file_mib,
        "load_average_1min_after": os.getloadavg()[0],
        "targets": {"rerun_s": 3.0, "cold_overhead_share": 0.05},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
