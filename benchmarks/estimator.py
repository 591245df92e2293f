"""The cost estimator against what is billed and measured.

1. **API accuracy.** movies-long (``movies_small.csv`` with a ~1,200-token
   grading rubric before the fields) and contributions-wide
   (``contributions.csv``, 15 fields, the same rubric) run on the provider
   emulator through the official SDKs, for OpenAI (gpt-4.1-mini) and Anthropic
   (claude-sonnet-4-5), in GGR order and in the file's order. Before each run
   the estimate is taken (``probe=20`` rows measure answer lengths; the probe
   is billed separately and the emulator reset after it); after it, the
   emulator's ledger gives what was billed. The emulator answers each request
   after a fixed 0.3 s (``Latency(0.3)``); the estimator is told that latency.
   Each run is repeated ``--runs`` times (5 by default) from cold caches, and
   the estimate is compared with the **median** bill: on OpenAI's routed
   automatic cache, which requests hit depends on which have finished when the
   next arrive, so identical runs bill differently (by up to about 11% in file
   order). Every bill is kept, and the table shows their range beside the
   estimate; one estimate made before the run cannot be nearer to a single
   bill than that spread. The estimate also gives a range (the cached tokens
   of the fewest-cached and most-cached dispatch timings it replays:
   ``Figures.span``); the table counts the bills that fall inside it.
2. **Local wall time.** The default local engine (SmolLM2-135M, 4 slots,
   RAM prompt cache off) is calibrated once (stored in the cache directory,
   reused on later runs), then movies-short is estimated (``probe=10``) and
   run; estimated vs measured wall time.
3. **Speed.** Time to estimate a 100,000-row relQuery (the synthetic
   8-column table of ``benchmarks/overhead.py``) on OpenAI, planned and
   original order, median of 5 (after one warm-up call).

Prints a table and writes ``benchmarks/results/estimator.json``::

    python benchmarks/estimator.py                 # everything
    python benchmarks/estimator.py --skip-local    # API and speed only (keeps the last local)
    python benchmarks/estimator.py --runs 1        # one bill per estimate (faster)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.cost.calibration import load_calibration
from semframe.cost.estimate import Estimate, Figures
from semframe.cost.models import LatencyModel
from semframe.operators.common import compile_call
from semframe.runtime.calibrate import calibrate_local
from semframe.runtime.estimate import estimate_plan
from semframe.testing.emulator import Latency, ProviderEmulator

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"
RESULTS = HERE / "results" / "estimator.json"
KEY = "sk-emulator-0123456789abcdef"
LATENCY = 0.3
RUBRIC = (
    "You grade texts for a research team. Read the record below and answer the question "
    "at the end. Follow the rubric exactly.\n"
    + "\n".join(
        f"Rubric point {i}: consider whether the record's wording, context and details support "
        f"the answer; do not guess beyond what is written (point {i} of 40)."
        for i in range(1, 41)
    )
)
WORKLOADS = {
    "movies-long": (
        "movies_small.csv",
        RUBRIC + "\nQuestion: is the review {review_content} positive about the movie "
        "{movie_title} ({movie_info})?",
    ),
    "contributions-wide": (
        "contributions.csv",
        RUBRIC + "\nQuestion: was this contribution made by a retired person? Committee "
        "{CMTE_ID}, report {RPT_TP}, transaction {TRANSACTION_TP}, entity {ENTITY_TP}, name "
        "{NAME}, city {CITY}, state {STATE}, zip {ZIP_CODE}, employer {EMPLOYER}, occupation "
        "{OCCUPATION}, date {TRANSACTION_DT}, amount {TRANSACTION_AMT}, candidate {CAND_ID}, "
        "id {TRAN_ID}, memo {MEMO_CD}.",
    ),
}
PROVIDERS = (("openai", "gpt-4.1-mini"), ("anthropic", "claude-sonnet-4-5"))


def _frame(name: str, rows: int) -> pd.DataFrame:
    file, _ = WORKLOADS[name]
    df = pd.read_csv(DATA / file)
    if name == "movies-long":
        df = df.dropna(subset=["review_content"])
    return df.head(rows).reset_index(drop=True)


def _err(est: float, real: float) -> float:
    if real == 0:
        return 0.0 if est == 0 else float("inf")
    return (est - real) / real


def api_accuracy(rows: int, runs: int) -> list[dict[str, Any]]:
    os.environ["OPENAI_API_KEY"] = KEY
    os.environ["ANTHROPIC_API_KEY"] = KEY
    out: list[dict[str, Any]] = []
    with ProviderEmulator(latency=Latency(LATENCY)) as emu:
        for workload, (_, template) in WORKLOADS.items():
            df = _frame(workload, rows)
            for backend, model in PROVIDERS:
                url = emu.openai_url if backend == "openai" else emu.anthropic_url
                for reorder in ("ggr", "none"):
                    settings = {
                        "backend": backend,
                        "model": model,
                        "base_url": url,
                        "reorder": reorder,
                        "progress": "off",
                        "cache": False,  # every run billed in full: no answers from the cache
                    }
                    est, bills, walls = bill_cell(emu, df, template, settings, runs)
                    bill = _median_bill(bills)
                    p = est.planned
                    row = {
                        "workload": workload,
                        "backend": backend,
                        "model": model,
                        "order": reorder,
                        "requests": bill.requests,
                        **compared(p, bills),
                        "writes_est": p.cache_write_tokens,
                        "writes_billed": bill.cache_write_tokens,
                        "output_est": p.output_tokens,
                        "output_billed": bill.output_tokens,
                        "dollars_max_tokens_bound": p.cost_max,
                        "wall_est_s": p.wall_seconds,
                        "wall_s": statistics.median(walls),
                        "estimate_s": est.seconds_to_estimate,
                        "runs": runs,
                        "wall_s_all": walls,
                    }
                    out.append(row)
                    print(
                        f"  {workload:<18} {backend:<9} {reorder:<4} input {p.input_tokens:>9,} "
                        f"vs {bill.prompt_tokens:>9,.0f}  cached {p.cached_tokens:>9,} vs "
                        f"{bill.cached_tokens:>9,.0f}  ${row['dollars_est']:.4f} vs "
                        f"${bill.dollars:.4f} "
                        f"(bills ${min(b.dollars for b in bills):.4f}"
                        f"-{max(b.dollars for b in bills):.4f})",
                        flush=True,
                    )
    return out


def bill_cell(
    emu: ProviderEmulator, df: pd.DataFrame, template: str, settings: dict[str, Any], runs: int
) -> tuple[Estimate, list[Any], list[float]]:
    """A filter's estimate (20 probe rows), then ``runs`` bills of it and their wall times.

    The emulator's caches are emptied before the estimate and before each run.
    """
    call = compile_call(df, template, op="filter", **settings)
    emu.reset()
    est = estimate_plan(call.plan, call.settings, probe=20, latency=LatencyModel(LATENCY, 0.0))
    bills, walls = [], []
    for _ in range(runs):
        emu.reset()  # the probe (or the run before) warmed the caches
        t0 = time.perf_counter()
        df.llm.filter(template, **settings)
        walls.append(time.perf_counter() - t0)
        bills.append(emu.ledger.totals())
    return est, bills, walls


def compared(p: Figures, bills: list[Any]) -> dict[str, Any]:
    """Estimated figures ``p`` against the median of ``bills``: input, cached tokens, dollars."""
    bill = _median_bill(bills)
    assert p.cost is not None
    span = p.span
    lo, hi = span.cached_tokens if span else (p.cached_tokens, p.cached_tokens)
    return {
        "input_est": p.input_tokens,
        "input_billed": bill.prompt_tokens,
        "cached_est": p.cached_tokens,
        "cached_billed": bill.cached_tokens,
        "dollars_est": p.cost.total,
        "dollars_billed": bill.dollars,
        "cached_billed_all": [b.cached_tokens for b in bills],
        "dollars_billed_all": [b.dollars for b in bills],
        "cached_range_est": [lo, hi],
        "bills_in_range": sum(lo <= b.cached_tokens <= hi for b in bills),
        "err_input": _err(p.input_tokens, bill.prompt_tokens),
        "err_cached": _err(p.cached_tokens, bill.cached_tokens),
        "err_dollars": _err(p.cost.total, bill.dollars),
    }


@dataclass(frozen=True)
class _Bill:
    """The medians of a cell's bills, field by field."""

    requests: int
    prompt_tokens: float
    cached_tokens: float
    cache_write_tokens: float
    output_tokens: float
    dollars: float


def _median_bill(bills: list[Any]) -> _Bill:
    def med(name: str) -> float:
        return float(statistics.median(getattr(b, name) for b in bills))

    return _Bill(
        bills[0].requests,
        med("prompt_tokens"),
        med("cached_tokens"),
        med("cache_write_tokens"),
        med("output_tokens"),
        med("dollars"),
    )


def local_wall(rows: int, recalibrate: bool) -> dict[str, Any]:
    from semframe.backends import get_backend
    from semframe.config import cache_dir

    # cache=False: the probe's answers (and an earlier run's) must not be served from the
    # result cache, or the measured run would be shorter than the one estimated
    settings: dict[str, Any] = {
        "backend": "local",
        "local_cache_ram_mib": 0,
        "progress": "off",
        "cache": False,
    }
    template = (
        "Is the review {review_content} positive about the movie {movie_title} ({movie_info})?"
    )
    df = pd.read_csv(DATA / "movies_small.csv").dropna().head(rows).reset_index(drop=True)
    call = compile_call(df, template, op="filter", **settings)
    backend = get_backend("local", model=None, settings=call.settings)
    directory = cache_dir(call.settings["cache_dir"])
    slots = backend.capabilities.max_concurrency
    cal = None if recalibrate else load_calibration(directory, backend.model, slots)
    calibrated_now = cal is None
    t0 = time.perf_counter()
    if cal is None:
        cal = calibrate_local(backend, directory)
    calibration_s = time.perf_counter() - t0
    est = estimate_plan(call.plan, call.settings, probe=10)
    t0 = time.perf_counter()
    df.llm.filter(template, errors="keep", **settings)
    wall = time.perf_counter() - t0
    stats = semframe.last_run()
    assert stats is not None
    p = est.planned
    return {
        "rows": rows,
        "model": backend.model,
        "slots": slots,
        "calibration": cal.__dict__,
        "calibrated_in_this_run": calibrated_now,
        "calibration_s": calibration_s,
        "wall_est_s": p.wall_seconds,
        "wall_s": wall,
        "err_wall": _err(p.wall_seconds or 0.0, wall),
        "prompt_est": p.input_tokens,
        "prompt_measured": stats.prompt_tokens,
        "cached_est": p.cached_tokens,
        "cached_measured": stats.cached_tokens,
        "output_est": p.output_tokens,
        "output_measured": stats.output_tokens,
    }


def speed(rows: int, repeat: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from overhead import TEMPLATE, make_frame

    os.environ.setdefault("OPENAI_API_KEY", KEY)
    df = make_frame(rows)
    t0 = time.perf_counter()
    call = compile_call(df, TEMPLATE, op="map", backend="openai", progress="off")
    compile_s = time.perf_counter() - t0
    estimate_plan(call.plan, call.settings)  # warm-up: SDK import, tokenizer build
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        estimate_plan(call.plan, call.settings)
        times.append(time.perf_counter() - t0)
    return {
        "rows": rows,
        "compile_s": compile_s,
        "estimate_s_median": statistics.median(times),
        "estimate_s_all": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument(
        "--runs", type=int, default=5, help="bills per estimate (the median is compared)"
    )
    parser.add_argument("--local-rows", type=int, default=100)
    parser.add_argument("--speed-rows", type=int, default=100_000)
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--recalibrate", action="store_true", help="ignore a stored calibration")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # SDK notice for sonnet-4-5
    print(
        f"API accuracy ({args.rows} rows per workload, emulator latency {LATENCY} s, "
        f"the median of {args.runs} bills per estimate):"
    )
    api = api_accuracy(args.rows, args.runs)
    local = None if args.skip_local else local_wall(args.local_rows, args.recalibrate)
    fast = speed(args.speed_rows, 5)
    print()
    head = (
        f"{'workload':<18} {'backend':<9} {'order':<5} {'input err':>9} {'cached est':>11} "
        f"{'cached billed':>13} {'cached err':>10} {'$ est':>8} {'$ billed':>8} {'$ err':>7} "
        f"{'$ bills, min-max':>17} {'in range':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in api:
        print(
            f"{r['workload']:<18} {r['backend']:<9} {r['order']:<5} {r['err_input']:>9.2%} "
            f"{r['cached_est']:>11,} {r['cached_billed']:>13,.0f} {r['err_cached']:>10.2%} "
            f"{r['dollars_est']:>8.4f} {r['dollars_billed']:>8.4f} {r['err_dollars']:>7.2%} "
            f"{min(r['dollars_billed_all']):>8.4f}-{max(r['dollars_billed_all']):.4f} "
            f"{r['bills_in_range']:>5}/{r['runs']}"
        )
    worst = max(max(abs(r[k]) for k in ("err_input", "err_cached", "err_dollars")) for r in api)
    print(
        "worst |error| over input tokens, cached tokens and dollars, against the median bill: "
        f"{worst:.2%} (target 3%)"
    )
    inside = sum(r["bills_in_range"] for r in api)
    print(
        f"bills whose cached tokens lie in the estimate's range (its fewest to most cached "
        f"over the dispatch timings it replays): {inside} of {sum(r['runs'] for r in api)}"
    )
    walls = [(r["wall_est_s"], r["wall_s"]) for r in api]
    print(
        "API wall time, estimated vs measured (median ratio): "
        f"{statistics.median(e / m for e, m in walls if e):.2f}"
    )
    if local is not None:
        print(
            f"local wall time ({local['rows']} rows, {local['model']}, {local['slots']} slots): "
            f"estimated {local['wall_est_s']:.1f} s, measured {local['wall_s']:.1f} s "
            f"({local['err_wall']:+.1%}; target within 25%)"
        )
    print(
        f"estimate of a {fast['rows']:,}-row relQuery: {fast['estimate_s_median']:.2f} s median "
        f"(compile {fast['compile_s']:.2f} s; target < 3 s)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if local is None and RESULTS.exists():  # --skip-local keeps the last local result
        local = json.loads(RESULTS.read_text()).get("local")
    RESULTS.write_text(
        json.dumps({"api": api, "worst_abs_error": worst, "local": local, "speed": fast}, indent=1)
        + "\n"
    )
    print(f"wrote {RESULTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
