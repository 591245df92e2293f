"""Cached-token share and wall time on the embedded engine: order x dispatch.

The movies-short workload (``movies_small.csv``; fields movie_title, movie_info,
review_content; a one-line filter question) on the default local backend, run
four ways in one process, on the same engine:

- file order, naive dispatch (requests go to whichever slot is free);
- file order, group-aware dispatch;
- GGR order, naive dispatch;
- GGR order, group-aware dispatch (what semframe does).

The engine's host-RAM prompt cache is off (``local_cache_ram_mib=0``) so that
prefix reuse comes from slot KV caches only, and a fresh engine is used for
every configuration so no run inherits another's cache.

    python benchmarks/local_dispatch.py --rows 120
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from semframe.backends.local import LocalBackend
from semframe.operators.common import compile_call
from semframe.runtime.execute import execute

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "movies_small.csv"
TEMPLATE = "Is the review {review_content} positive about the movie {movie_title} ({movie_info})?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "local_dispatch.json")
    )
    args = parser.parse_args()
    df = pd.read_csv(DATA).head(args.rows)
    rows = []
    print(
        f"{'order':>6} {'dispatch':>8} {'prompt tok':>10} {'cached':>8} {'share':>6} "
        f"{'wall s':>7} {'rows/s':>6} {'yes':>4}"
    )
    for reorder in ["none", "ggr"]:
        for group_aware in [False, True]:
            backend = LocalBackend(args.model, parallel=args.parallel, n_ctx=2048, cache_ram_mib=0)
            call = compile_call(df, TEMPLATE, op="filter", backend="fake", reorder=reorder)
            _ = backend.engine  # start the engine before timing
            t0 = time.perf_counter()
            outcomes, stats = execute(call.plan, backend, progress="off", group_aware=group_aware)
            wall = time.perf_counter() - t0
            yes = sum(1 for o in outcomes if o.value is True)
            dispatch = "groups" if group_aware else "naive"
            rows.append(
                {
                    "order": reorder,
                    "dispatch": dispatch,
                    "rows": len(df),
                    "prompt_tokens": stats.prompt_tokens,
                    "cached_tokens": stats.cached_tokens,
                    "cached_share": stats.cached_share,
                    "wall_s": wall,
                    "yes": yes,
                    "errors": stats.errors,
                    "expected_char_reuse": call.plan.expected_hit_rate,
                }
            )
            print(
                f"{reorder:>6} {dispatch:>8} {stats.prompt_tokens:>10,} {stats.cached_tokens:>8,} "
                f"{stats.cached_share:>6.1%} {wall:>7.1f} {len(df) / wall:>6.2f} {yes:>4}"
            )
            del backend
            import gc

            from semframe.backends import local

            local._engines.clear()
            gc.collect()
    Path(args.out).write_text(
        json.dumps(
            {
                "workload": "movies-short filter",
                "model": args.model or "gemma-3-270m",
                "parallel": args.parallel,
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
