"""relQuery-aware scheduling on the simulated engine.

Prints tables, writes benchmarks/results/scheduling.json and PNG plots:

1. average relQuery latency vs arrival rate for every policy (RelServe-shaped
   relQuery streams over movies_small.csv and contributions.csv), and the
   waiting / core / tail breakdown at the highest rate;
2. P99 TTFT vs request rate for FCFS, LPM and k-LPM (k = 2, 4, 8) on the
   k-LPM workload (shared base prompt, user contexts repeated 4x, shuffled);
3. scheduler decision time per step (real seconds) with 10,000 waiting
   requests, against the simulated time of the steps;
4. gap of each policy to the MILP optimum on tiny instances.

Usage: python benchmarks/scheduling.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from semframe.serving.sched import Budgets, RelServeScheduler, Scheduler, make_scheduler
from semframe.serving.sim import SimRequest, simulate
from semframe.serving.sim.workload import klpm_workload, load_tables, relserve_workload

RESULTS = Path(__file__).parent / "results"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"

RELQ_BUDGETS = Budgets(max_num_seqs=256, max_num_batched_tokens=4096, num_blocks=2048)
CHUNKED = Budgets(
    max_num_seqs=256, max_num_batched_tokens=512, num_blocks=2048, chunked_prefill=True
)
KLPM_BUDGETS = Budgets(max_num_seqs=64, max_num_batched_tokens=8192, num_blocks=2048)

POLICIES: dict[str, tuple[Callable[[], Scheduler], Budgets]] = {
    "fcfs": (lambda: make_scheduler("fcfs"), RELQ_BUDGETS),
    "sarathi": (lambda: make_scheduler("sarathi"), CHUNKED),
    "static": (lambda: make_scheduler("static"), RELQ_BUDGETS),
    "relserve": (lambda: make_scheduler("relserve"), RELQ_BUDGETS),
    "relserve-noABA": (lambda: RelServeScheduler(adaptive=False), RELQ_BUDGETS),
    "relserve-multiRQ": (lambda: RelServeScheduler(single_relquery_prefill=False), RELQ_BUDGETS),
    "relserve-countRun": (lambda: RelServeScheduler(count_running=True), RELQ_BUDGETS),
    "lpm": (lambda: make_scheduler("lpm"), RELQ_BUDGETS),
    "k-lpm(2)": (lambda: make_scheduler("k-lpm", k=2), RELQ_BUDGETS),
    "infermax": (lambda: make_scheduler("infermax"), CHUNKED),
}


def _save(fig: Any, name: str) -> str:
    """Write a plot to the results folder and, for the docs site, to docs/img."""
    import matplotlib.pyplot as plt

    path = RESULTS / name
    fig.savefig(path, dpi=110)
    shutil.copyfile(path, DOCS_IMG / name)
    plt.close(fig)
    return name


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def relquery_latency(rates: list[float], seeds: int, n_rq: int) -> dict[str, Any]:
    tabs = load_tables()
    out: dict[str, Any] = {"rates": rates, "seeds": seeds, "relqueries": n_rq, "policies": {}}
    for name, (factory, budgets) in POLICIES.items():
        per_rate = []
        for rate in rates:
            runs = []
            for seed in range(seeds):
                reqs = relserve_workload(n_rq, rate, seed=seed, tables=tabs)
                runs.append(simulate(reqs, factory(), budgets=budgets).summary())
            per_rate.append({k: float(np.mean([r[k] for r in runs])) for k in runs[0]})
        out["policies"][name] = per_rate
    return out


def klpm_ttft(rates: list[float], seeds: int, n: int) -> dict[str, Any]:
    pols: dict[str, Callable[[], Scheduler]] = {
        "fcfs": lambda: make_scheduler("fcfs"),
        "lpm": lambda: make_scheduler("lpm"),
        "k-lpm(2)": lambda: make_scheduler("k-lpm", k=2),
        "k-lpm(4)": lambda: make_scheduler("k-lpm", k=4),
        "k-lpm(8)": lambda: make_scheduler("k-lpm", k=8),
    }
    out: dict[str, Any] = {"rates": rates, "seeds": seeds, "prompts": n, "policies": {}}
    for name, factory in pols.items():
        rows = []
        for rate in rates:
            p99 = []
            hit = []
            for seed in range(seeds):
                res = simulate(klpm_workload(n, rate, seed=seed), factory(), budgets=KLPM_BUDGETS)
                s = res.summary()
                p99.append(s["p99_ttft"])
                hit.append(s["cache_hit_rate"])
            rows.append({"p99_ttft": float(np.mean(p99)), "cache_hit_rate": float(np.mean(hit))})
        out["policies"][name] = rows
    return out


def overhead(n_waiting: int, steps: int) -> dict[str, Any]:
    tabs = load_tables()
    n_rq = n_waiting // 100
    base = relserve_workload(n_rq, 1.0, seed=7, tables=tabs, max_size=100)
    # every relQuery has exactly 100 requests, all waiting at t = 0
    reqs: list[SimRequest] = []
    rid = 0
    by_rel: dict[int, list[SimRequest]] = {}
    for r in base:
        by_rel.setdefault(r.rel_id, []).append(r)
    for q, rs in sorted(by_rel.items()):
        for k in range(100):
            src = rs[k % len(rs)]
            reqs.append(
                SimRequest(
                    rid,
                    q,
                    100,
                    src.template,
                    src.prompt_len,
                    src.max_tokens,
                    0.0,
                    src.block_hashes,
                    output_len=src.output_len,
                )
            )
            rid += 1
    out: dict[str, Any] = {"waiting": len(reqs), "steps": steps, "policies": {}}
    for name, (factory, budgets) in POLICIES.items():
        fresh = [
            SimRequest(
                r.req_id,
                r.rel_id,
                r.rel_size,
                r.template,
                r.prompt_len,
                r.max_tokens,
                r.arrival,
                r.block_hashes,
                output_len=r.output_len,
            )
            for r in reqs
        ]
        res = simulate(fresh, factory(), budgets=budgets, max_steps=steps)
        dec = res.sched_seconds
        out["policies"][name] = {
            "median_decision_s": statistics.median(dec),
            "median_step_sim_s": res.busy_time / max(1, res.steps),
            "decision_share": sum(dec) / res.busy_time,
        }
    return out


def milp_gaps(n_instances: int) -> dict[str, Any]:
    from semframe.serving.sched.milp import gap_study

    return gap_study(n_instances)


def movies_only(rate: float, seeds: int, n_rq: int) -> dict[str, Any]:
    """Static vs RelServe when every relQuery is over movies (longer prompts)."""
    tabs = load_tables()
    mv = {"movies": tabs["movies"]}
    out: dict[str, Any] = {"rate": rate, "seeds": seeds, "relqueries": n_rq, "policies": {}}
    for name in ("fcfs", "static", "relserve"):
        factory, budgets = POLICIES[name]
        runs = [
            simulate(
                relserve_workload(n_rq, rate, seed=seed, tables=mv), factory(), budgets=budgets
            ).summary()
            for seed in range(seeds)
        ]
        out["policies"][name] = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    reqs = relserve_workload(n_rq, rate, seed=0, tables=mv)
    out["avg_prompt_tokens"] = float(np.mean([r.prompt_len for r in reqs]))
    return out


def plots(rel: dict[str, Any], kl: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in rel["policies"].items():
        ax.plot(rel["rates"], [r["avg_latency"] for r in rows], marker="o", label=name)
    ax.set_xlabel("relQueries / s")
    ax.set_ylabel("average relQuery latency (s)")
    ax.set_title("relQuery latency vs load (simulated 13B on A100)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    files.append(_save(fig, "scheduling_latency.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(rel["policies"])
    last = [rel["policies"][n][-1] for n in names]
    bottom = np.zeros(len(names))
    for part in ("avg_waiting", "avg_core", "avg_tail"):
        vals = np.array([row[part] for row in last])
        ax.bar(names, vals, bottom=bottom, label=part.removeprefix("avg_"))
        bottom += vals
    ax.set_ylabel("seconds")
    ax.set_title(f"latency breakdown at {rel['rates'][-1]} relQueries/s")
    ax.legend()
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    files.append(_save(fig, "scheduling_breakdown.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in kl["policies"].items():
        ax.plot(kl["rates"], [r["p99_ttft"] for r in rows], marker="o", label=name)
    ax.set_xlabel("requests / s")
    ax.set_ylabel("P99 TTFT (s)")
    ax.set_yscale("log")
    ax.set_title("k-LPM workload: P99 TTFT vs load")
    ax.legend()
    fig.tight_layout()
    files.append(_save(fig, "scheduling_klpm_ttft.png"))
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rates, seeds and relQueries")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.quick:
        rates, seeds, n_rq = [1.0, 2.0, 3.0], 1, 60
        k_rates, k_seeds, k_n = [2.5, 3.5], 1, 400
        ov_steps, milp_n = 50, 2
    else:
        rates, seeds, n_rq = [0.5, 1.0, 1.5, 2.0, 3.0], 5, 100
        k_rates, k_seeds, k_n = [2.0, 2.5, 3.0, 3.5, 4.0], 3, 1000
        ov_steps, milp_n = 300, 10
    RESULTS.mkdir(exist_ok=True)

    rel = relquery_latency(rates, seeds, n_rq)
    print(f"\n## Average relQuery latency (s), {n_rq} relQueries, mean of {seeds} seeds\n")
    print(
        table(
            ["policy", *[f"{r}/s" for r in rates]],
            [[n, *[row["avg_latency"] for row in rows]] for n, rows in rel["policies"].items()],
        )
    )
    print(f"\n## Breakdown at {rates[-1]} relQueries/s (s)\n")
    print(
        table(
            ["policy", "waiting", "core", "tail", "total", "max", "cache hit"],
            [
                [
                    n,
                    rows[-1]["avg_waiting"],
                    rows[-1]["avg_core"],
                    rows[-1]["avg_tail"],
                    rows[-1]["avg_latency"],
                    rows[-1]["max_latency"],
                    rows[-1]["cache_hit_rate"],
                ]
                for n, rows in rel["policies"].items()
            ],
        )
    )
    hi = {n: rows[-1]["avg_latency"] for n, rows in rel["policies"].items()}
    ratios = {
        "fcfs_over_relserve": hi["fcfs"] / hi["relserve"],
        "static_over_relserve": hi["static"] / hi["relserve"],
        "sarathi_over_relserve": hi["sarathi"] / hi["relserve"],
    }
    rel["ratios_at_highest_rate"] = ratios
    print(
        f"\nAt {rates[-1]}/s: FCFS / RelServe = {ratios['fcfs_over_relserve']:.2f}x, "
        f"static / RelServe = {ratios['static_over_relserve']:.2f}x, "
        f"Sarathi / RelServe = {ratios['sarathi_over_relserve']:.2f}x"
    )

    kl = klpm_ttft(k_rates, k_seeds, k_n)
    print(f"\n## k-LPM workload: P99 TTFT (s), {k_n} prompts, mean of {k_seeds} seeds\n")
    print(
        table(
            ["policy", *[f"{r}/s" for r in k_rates]],
            [[n, *[row["p99_ttft"] for row in rows]] for n, rows in kl["policies"].items()],
        )
    )

    ov = overhead(10_000, ov_steps)
    print(f"\n## Scheduler decision time, {ov['waiting']:,} waiting requests, {ov_steps} steps\n")
    print(
        table(
            ["policy", "median decision ms", "mean simulated step ms", "decision / engine time"],
            [
                [
                    n,
                    v["median_decision_s"] * 1e3,
                    v["median_step_sim_s"] * 1e3,
                    f"{100 * v['decision_share']:.2f}%",
                ]
                for n, v in ov["policies"].items()
            ],
        )
    )

    mo = movies_only(rates[-1] * 2 / 3, seeds, n_rq)
    print(
        f"\n## Movies-only relQueries (avg prompt {mo['avg_prompt_tokens']:.0f} tokens) "
        f"at {mo['rate']:.1f}/s, mean of {seeds} seeds\n"
    )
    print(
        table(
            ["policy", "waiting", "core", "tail", "total"],
            [
                [n, v["avg_waiting"], v["avg_core"], v["avg_tail"], v["avg_latency"]]
                for n, v in mo["policies"].items()
            ],
        )
    )
    mp = mo["policies"]
    print(
        f"\nstatic / RelServe = {mp['static']['avg_latency'] / mp['relserve']['avg_latency']:.2f}x"
    )

    gaps = milp_gaps(milp_n)
    proved = sum(1 for i in gaps["instances"] if i["proved_optimal"])
    print(
        f"\n## Gap to the MILP optimum, {milp_n} tiny instances "
        f"({proved} proved optimal; avg relQuery latency and makespan)\n"
    )
    print(table(gaps["headers"], gaps["rows"]))

    files = plots(rel, kl)
    wall = time.perf_counter() - t0
    out = {
        "quick": args.quick,
        "wall_seconds": wall,
        "cost_model": "A100_13B roofline defaults (semframe.serving.sched.cost)",
        "relquery_latency": rel,
        "klpm_ttft": kl,
        "overhead": ov,
        "movies_only": mo,
        "milp": gaps,
        "plots": files,
    }
    (RESULTS / "scheduling.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {RESULTS / 'scheduling.json'} and {', '.join(files)} in {wall:.0f} s")


if __name__ == "__main__":
    main()
