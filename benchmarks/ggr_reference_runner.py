"""Run the GGR authors' QuickGreedy on a CSV; print the reordered prompts as JSON.

Runs in the reference's own environment (pandas and networkx; pyspark and PyYAML
too, which the authors' ``src/core/utils.py`` imports though the solver uses
neither), never semframe's: ``benchmarks/reorder.py --reference DIR`` calls it as

    PYTHON benchmarks/ggr_reference_runner.py DIR table.csv out.json [--merge a,b]

``DIR`` holds the authors' code (``src/core/algos/quick_greedy.py``, with its
``solver.py`` and the ``Trie`` of ``src/core/utils.py``). Each cell is labeled
``f"{column}: {value}\\n"`` first, exactly the segments semframe's prompts and
hit rates use, so that both solvers order the same strings. The solver runs
with the paper's configuration (``early_stop=100000, distinct_value_threshold=0.7,
row_stop=4, col_stop=2``). The output is ``{"seconds": ..., "rows": [[segment,
...], ...]}`` in the solver's row order (a merged cell is split back into its
segments).

With ``--repeats N`` the solve is timed as semframe's solvers are: a first
run to warm up, then up to ``N`` timed runs while the runs so far took less
than ``--budget`` seconds (default 30); ``seconds`` is the median of the timed
runs (the warm-up run's time where none fitted in the budget) and
``seconds_all`` lists them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import pandas as pd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reference", help="folder with the authors' src/core/algos")
    parser.add_argument("table")
    parser.add_argument("out")
    parser.add_argument("--merge", action="append", default=[], help="columns merged: a,b")
    parser.add_argument("--repeats", type=int, default=0, help="timed runs after a warm-up")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of runs in all")
    args = parser.parse_args()
    sys.path.insert(0, args.reference)
    from src.core.algos.quick_greedy import QuickGreedy  # the authors' module

    df = pd.read_csv(args.table, dtype=str, keep_default_na=False)
    labeled = pd.DataFrame({c: c + ": " + df[c] + "\n" for c in df.columns})
    merge = [m.split(",") for m in args.merge]

    def solve() -> tuple[pd.DataFrame, float]:
        table = labeled.copy()  # a fresh input for every run
        t0 = time.perf_counter()
        out, _ = QuickGreedy().reorder(
            table,
            early_stop=100000,
            distinct_value_threshold=0.7,
            row_stop=4,
            col_stop=2,
            col_merge=merge,
        )
        return out, time.perf_counter() - t0

    out, first = solve()
    spent, times = first, []
    while len(times) < args.repeats and spent < args.budget:
        out, seconds = solve()
        times.append(seconds)
        spent += seconds
    rows = [
        [seg + "\n" for cell in row for seg in str(cell).split("\n") if seg]
        for row in out.itertuples(index=False)
    ]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(
            {
                "seconds": statistics.median(times) if times else first,
                "seconds_all": times or [first],
                "warm_up_seconds": first,
                "rows": rows,
            },
            f,
        )


if __name__ == "__main__":
    main()
