"""executor="ray" on an API backend: the estimate against what the provider bills.

On the provider emulator (the official SDKs, OpenAI's and Anthropic's caching
and billing rules), the estimator benchmark's two long-rubric workloads
(``benchmarks/estimator.py``: movie reviews and campaign contributions) run as
a ``filter`` in GGR order and in file order, in process and over 2 Ray
replicas (a local Ray cluster on this machine's cores), each ``--runs`` times
with the emulator's caches emptied before each run. The estimate is taken for
the same settings (``executor="ray", replicas=2`` is priced as one client,
since the replicas share the account: see ``docs/ray.md``) and compared with
the median bill: input tokens, cached tokens and dollars.

    python benchmarks/ray_api_bill.py                  # 300 rows, 2 runs, both providers
    python benchmarks/ray_api_bill.py --rows 150 --runs 3 --providers openai

Writes ``benchmarks/results/ray_api_bill.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import ray
from estimator import KEY, LATENCY, WORKLOADS, _frame, bill_cell, compared

import semframe
from semframe.runtime import ray_executor
from semframe.testing.emulator import Latency, ProviderEmulator

RESULTS = Path(__file__).resolve().parent / "results" / "ray_api_bill.json"
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-sonnet-4-5"}


def measure(rows: int, runs: int, providers: list[str]) -> list[dict[str, Any]]:
    """Every (workload, provider, order, executor) cell: the estimate and the bills."""
    os.environ["OPENAI_API_KEY"] = KEY
    os.environ["ANTHROPIC_API_KEY"] = KEY
    out: list[dict[str, Any]] = []
    with ProviderEmulator(latency=Latency(LATENCY)) as emu:
        for workload, (_, template) in WORKLOADS.items():
            df = _frame(workload, rows)
            for backend in providers:
                url = emu.openai_url if backend == "openai" else emu.anthropic_url
                for reorder in ("ggr", "none"):
                    for executor in ("local", "ray"):
                        settings = {
                            "backend": backend,
                            "model": MODELS[backend],
                            "base_url": url,
                            "reorder": reorder,
                            "progress": "off",
                            "cache": False,  # every run billed in full
                            "executor": executor,
                            "replicas": 2,
                        }
                        est, bills, _ = bill_cell(emu, df, template, settings, runs)
                        p = est.planned
                        row = {
                            "workload": workload,
                            "backend": backend,
                            "order": reorder,
                            "executor": executor,
                            **compared(p, bills),
                        }
                        lo, hi = row["cached_range_est"]
                        out.append(row)
                        print(
                            f"{workload:<18} {backend:<9} {reorder:<4} {executor:<5} "
                            f"{row['err_input']:>+7.1%} "
                            f"{p.cached_tokens:>9,} {row['cached_billed']:>9,.0f} "
                            f"{row['err_cached']:>+7.1%} "
                            f"${row['dollars_est']:>7.4f} ${row['dollars_billed']:>7.4f} "
                            f"{row['err_dollars']:>+7.1%}  range {lo:,}-{hi:,}, "
                            f"{row['bills_in_range']} of {runs} bills in it",
                            flush=True,
                        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--runs", type=int, default=2, help="bills per cell (the median is used)")
    parser.add_argument("--providers", default="openai,anthropic")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    print(
        f"{'workload':<18} {'backend':<9} {'ord':<4} {'exec':<5} {'input':>7} "
        f"{'cached est':>9} {'billed':>9} {'err':>7} {'$ est':>8} {'billed':>8} {'err':>7}"
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = measure(args.rows, args.runs, args.providers.split(","))
    finally:
        ray_executor.shutdown_replicas()
        ray.shutdown()
    ray_rows = [r for r in rows if r["executor"] == "ray"]
    errors = ("err_input", "err_cached", "err_dollars")
    worst = {key: max(abs(r[key]) for r in ray_rows) for key in errors}
    print(
        "over 2 replicas, worst |error| against the median bill: "
        + ", ".join(f"{k[4:]} {v:.1%}" for k, v in worst.items())
    )
    print(
        f"bills whose cached tokens lie in the estimate's range: "
        f"{sum(r['bills_in_range'] for r in rows)} of {len(rows) * args.runs}"
    )
    print(
        "median |dollars error|, in process / over 2 replicas: "
        f"{statistics.median(abs(r['err_dollars']) for r in rows if r['executor'] == 'local'):.1%}"
        f" / {statistics.median(abs(r['err_dollars']) for r in ray_rows):.1%}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "semframe": semframe.__version__,
                "machine": platform.platform(),
                "rows": args.rows,
                "runs": args.runs,
                "latency_s": LATENCY,
                "cells": rows,
                "worst_over_replicas": worst,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
