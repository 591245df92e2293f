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
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

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
    t4 = time.perf_counter()
    for request in call.plan.requests:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[12_500, 25_000, 50_000, 100_000])
    parser.add_argument("--reorder", nargs="*", default=["none", "ggr"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "overhead.json"))
    args = parser.parse_args()

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
