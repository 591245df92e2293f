"""Model cascades on the labeled movie-review slice: accuracy and cost by target.

Stage 1 is the real local model (SmolLM2-135M-Instruct on llama.cpp, the
``local`` backend), run through ``semframe.operators.cascade.answer_all`` as a ``filter``
("Is the review positive about the movie?"), its confidence taken from the
logprobs of the constrained yes/no token.

Stage 2 is the **hand labels** (an ``oracle`` backend registered here that
answers every row with its label): no model more capable than SmolLM2 ships as
a pip package on this machine (Gemma-3-270M measured 52-62% on the same task,
below SmolLM2's 65%; see ``benchmarks/results/local_models.json``), and no API
key is used. So the large stage stands for a human reviewer or a strong API
model that is always right on this slice; its accuracy is 100% **by
construction**, not measured. What this benchmark measures is the real small
model's accuracy and confidence, and how many rows a calibrated cascade must
escalate to meet each target. The large stage's dollar cost is the
estimator's price of the escalated rows on ``openai/gpt-4o-mini`` (token
counts from its tokenizer, nothing sent).

For each target the thresholds are chosen on a random half of the rows
(one-sided 95% Clopper-Pearson bound, fixed-sequence test) and reported on the
other half; then the split is redrawn ``--splits`` times to show how often the
held-out accuracy meets the target.

Usage::

    .venv/bin/python benchmarks/cascades.py            # 318 rows, ~3 min on 2 cores
    .venv/bin/python benchmarks/cascades.py --limit 80 # quick run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import semframe  # noqa: F401  (registers df.llm)
from semframe.backends import register_backend
from semframe.backends.base import Capabilities, Completion, Request, Usage
from semframe.cost.models import SlotCost
from semframe.operators.cascade import (
    StageAnswers,
    answer_all,
    calibrate_profiles,
    evaluate,
    split_rows,
)

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "movies_sentiment_labeled_318.csv"
OUT = HERE / "results" / "cascades.json"
PLOT = HERE / "results" / "cascades.png"
ANSWERS = HERE / "results" / "cascades_answers.json"
TEMPLATE = "Is the review positive about the movie? {movie_title} {review_content}"
TARGETS = (0.70, 0.75, 0.80, 0.85, 0.90, 0.95)
PRECISION_TARGETS = (0.80, 0.90)
LARGE_PRICE_MODEL = "gpt-4o-mini"


class OracleBackend:
    """Answers each row with its hand label (matched by review text): the large stage."""

    name = "oracle"
    endpoint = None

    def __init__(self, truth: Mapping[str, bool]) -> None:
        self.model = "hand-labels"
        self.truth = dict(truth)
        self.capabilities = Capabilities(json_schema=True, max_concurrency=8)
        self.cost = SlotCost(self.model, self.count_tokens, 8, engine=self.name)

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        hits = [v for k, v in self.truth.items() if k in request.prompt]
        answer = "yes" if hits and hits[0] else "no"
        return Completion(
            request.id, f'{{"answer": "{answer}"}}', Usage(prompt_tokens=len(request.prompt) // 4)
        )

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t) // 4 for t in texts]

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument(
        "--reuse", action="store_true", help="reuse the saved small-model answers (no model run)"
    )
    args = parser.parse_args()

    df = pd.read_csv(DATA)
    if args.limit:
        df = df.head(args.limit)
    labels = [lab == "positive" for lab in df.label]
    oracle = OracleBackend(dict(zip(df.review_content, labels, strict=True)))
    register_backend("oracle", lambda model, settings: oracle)

    if args.reuse and ANSWERS.is_file():
        small, large, small_runs, wall = reuse(df, labels)
    else:
        small, large, small_runs, wall = run_models(df)
    small_seconds = sum(r.wall_seconds for r in small_runs) if small_runs else wall
    finish(
        args,
        df,
        labels,
        small=small,
        large=large,
        small_seconds=small_seconds,
        wall=wall,
        small_runs=small_runs,
    )


def run_models(df: pd.DataFrame) -> tuple[StageAnswers, StageAnswers, tuple[Any, ...], float]:
    """Both stages on every row; the small stage's answers saved for --reuse."""
    t0 = time.perf_counter()
    small, large = answer_all(
        df,
        TEMPLATE,
        "filter",
        ["local/smollm2-135m", "oracle/hand-labels"],
        max_concurrency=4,
        errors="keep",
        cache=False,
        progress="off",
    )
    wall = time.perf_counter() - t0
    small_runs = small.runs
    ANSWERS.write_text(
        json.dumps(
            {
                "id": [int(i) for i in df.id],
                "small_answer": list(small.values),
                "small_confidence": list(small.confidences),
                "small_seconds": sum(r.wall_seconds for r in small_runs),
                "small_prompt_tokens": sum(r.prompt_tokens for r in small_runs),
                "small_cached_tokens": sum(r.cached_tokens for r in small_runs),
            }
        )
        + "\n"
    )
    return small, large, small_runs, wall


def reuse(
    df: pd.DataFrame, labels: Sequence[bool]
) -> tuple[StageAnswers, StageAnswers, tuple[Any, ...], float]:
    """The small stage's saved answers (from a run on the same rows), the labels as stage 2."""
    saved = json.loads(ANSWERS.read_text())
    if saved["id"] != [int(i) for i in df.id]:
        raise SystemExit(f"{ANSWERS} holds answers for other rows; run without --reuse")
    small = StageAnswers(
        "local/smollm2-135m", tuple(saved["small_answer"]), tuple(saved["small_confidence"])
    )
    large = StageAnswers("oracle/hand-labels", tuple(labels), (1.0,) * len(labels))
    REUSED.update(saved)
    return small, large, (), float(saved["small_seconds"])


REUSED: dict[str, Any] = {}


def finish(
    args: argparse.Namespace,
    df: pd.DataFrame,
    labels: Sequence[bool],
    *,
    small: StageAnswers,
    large: StageAnswers,
    small_seconds: float,
    wall: float,
    small_runs: Sequence[Any],
) -> None:
    """Calibrate at every target, print the table, write JSON and the plot."""
    n = len(df)
    # Unparseable small answers have no value: count them wrong and escalate them.
    small = StageAnswers(
        small.stage,
        tuple(v if v is not None else (not y) for v, y in zip(small.values, labels, strict=True)),
        small.confidences,
    )
    large_est = df.llm.estimate(
        TEMPLATE, op="filter", backend="openai", model=LARGE_PRICE_MODEL, cache=False
    )
    large_dollars_per_row = (large_est.dollars or 0.0) / n
    small_acc = sum(v == y for v, y in zip(small.values, labels, strict=True)) / n

    def cost(escalated: float) -> dict[str, float]:
        return {
            "small_cpu_s_per_row": small_seconds / n,
            "large_rows_share": escalated,
            "large_usd_per_1k_rows": 1000 * escalated * large_dollars_per_row,
        }

    _, held_rows = split_rows(n, 0.5, seed=0)
    held_labels = [labels[i] for i in held_rows]
    held_small = [small.values[i] for i in held_rows]
    held_conf = [small.confidences[i] for i in held_rows]
    held_large = [large.values[i] for i in held_rows]
    rows: list[dict[str, Any]] = [
        {
            "config": "small only (smollm2-135m)",
            "target": None,
            "heldout_accuracy": sum(p == y for p, y in zip(held_small, held_labels, strict=True))
            / len(held_rows),
            **cost(0.0),
        },
        {
            "config": "large only (hand labels)",
            "target": None,
            "heldout_accuracy": 1.0,
            **cost(1.0),
        },
    ]
    for target in TARGETS:
        cal = calibrate_profiles(
            [small, large], labels, target=target, level=args.level, holdout=0.5, seed=0
        )
        met = []
        escalations = []
        for seed in range(args.splits):
            c = calibrate_profiles(
                [small, large], labels, target=target, level=args.level, holdout=0.5, seed=seed
            )
            met.append(bool(c.met))
            escalations.append(c.escalated)
        rows.append(
            {
                "config": f"cascade, target {target:.2f}",
                "target": target,
                "threshold": cal.thresholds[0],
                "calibration_accuracy": cal.calibration_value,
                "lower_bound": cal.lower_bound,
                "heldout_accuracy": cal.heldout_value,
                "met": cal.met,
                "met_share_over_splits": sum(met) / len(met),
                "mean_escalated_over_splits": statistics.fmean(escalations),
                **cost(cal.escalated),
            }
        )

    # filter's other targets: precision of the kept (positive) rows
    precision_rows = []
    for target in PRECISION_TARGETS:
        cal = calibrate_profiles(
            [small, large],
            labels,
            target=target,
            metric="precision",
            level=args.level,
            holdout=0.5,
            seed=0,
        )
        met = [
            bool(
                calibrate_profiles(
                    [small, large],
                    labels,
                    target=target,
                    metric="precision",
                    level=args.level,
                    holdout=0.5,
                    seed=seed,
                ).met
            )
            for seed in range(args.splits)
        ]
        precision_rows.append(
            {
                "config": f"cascade, precision target {target:.2f}",
                "target": target,
                "threshold": cal.thresholds[0],
                "heldout_precision": cal.heldout_value,
                "met": cal.met,
                "met_share_over_splits": sum(met) / len(met),
                **cost(cal.escalated),
            }
        )

    # The whole threshold sweep on the held-out half, for the plot.
    sweep = []
    for t in sorted({c for c in held_conf if c is not None} | {0.0, math.inf}):
        acc, shares = evaluate(
            [held_small, held_large], [held_conf, [1.0] * len(held_rows)], held_labels, [t]
        )
        sweep.append({"threshold": t, "accuracy": acc, "escalated": shares[1]})

    print(
        f"{n} labeled rows ({sum(labels)} positive); small model accuracy on all rows "
        f"{small_acc:.3f}; small stage {small_seconds:.1f} s on {os.cpu_count()} cores "
        f"(calibration run {wall:.1f} s); large stage priced as {LARGE_PRICE_MODEL}: "
        f"${large_dollars_per_row * 1000:.4f} per 1k rows"
    )
    header = (
        f"{'config':32} {'thr':>7} {'held-out acc':>12} {'met':>5} {'met%':>6} "
        f"{'escal.':>7} {'$/1k':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        thr = r.get("threshold")
        thr_s = "-" if thr is None else ("inf" if math.isinf(thr) else f"{thr:.4f}")
        met_s = "-" if r.get("met") is None else ("yes" if r["met"] else "NO")
        share = r.get("met_share_over_splits")
        share_s = "-" if share is None else f"{share:.0%}"
        print(
            f"{r['config']:32} {thr_s:>7} {r['heldout_accuracy']:>12.3f} {met_s:>5} "
            f"{share_s:>6} {r['large_rows_share']:>7.1%} {r['large_usd_per_1k_rows']:>8.4f}"
        )

    for r in precision_rows:
        print(
            f"{r['config']:32} {r['threshold']:>7.4f} {r['heldout_precision']:>12.3f} "
            f"{'yes' if r['met'] else 'NO':>5} {r['met_share_over_splits']:>6.0%} "
            f"{r['large_rows_share']:>7.1%} {r['large_usd_per_1k_rows']:>8.4f}  (precision)"
        )
    load = load_policy(rows)

    def finite(x: Any) -> Any:
        return None if isinstance(x, float) and math.isinf(x) else x

    OUT.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "config": {
            "rows": n,
            "positives": sum(labels),
            "template": TEMPLATE,
            "small": "local/smollm2-135m (llama.cpp, 4 slots)",
            "large": "hand labels (oracle: accuracy 1.0 by construction)",
            "large_priced_as": LARGE_PRICE_MODEL,
            "large_usd_per_row": large_dollars_per_row,
            "level": args.level,
            "holdout": 0.5,
            "splits": args.splits,
            "small_accuracy_all_rows": small_acc,
            "small_seconds": small_seconds,
            "small_prompt_tokens": sum(r.prompt_tokens for r in small_runs)
            or REUSED.get("small_prompt_tokens"),
            "small_cached_tokens": sum(r.cached_tokens for r in small_runs)
            or REUSED.get("small_cached_tokens"),
            "small_yes_rate": sum(v is True for v in small.values) / n,
            "reused_answers": bool(REUSED),
            "small_unanswered": sum(c is None for c in small.confidences),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "results": [{k: finite(v) for k, v in r.items()} for r in rows],
        "precision_results": [{k: finite(v) for k, v in r.items()} for r in precision_rows],
        "sweep": [{k: finite(v) for k, v in s.items()} for s in sweep],
        "load_policy": load,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, sweep, n_held=len(held_rows))
    print(f"wrote {OUT.relative_to(HERE.parent)} and {PLOT.relative_to(HERE.parent)}")


LARGE_WORK = 10.0
"""Assumed work of one large-stage row, in small-stage rows (an assumption, not measured)."""


def load_policy(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """KEN's load-based choice on the calibrated cascades, in the queue simulator.

    Time is in units of one small-model row; a large-stage row is assumed to
    take ``LARGE_WORK`` of them. Each option's accuracy and escalation share
    are the held-out figures measured above.
    """
    import numpy as np

    from semframe.serving.sim.cascades import CascadeOption, gear_plan, simulate_load

    options = [
        CascadeOption(
            str(r["config"]),
            float(r["heldout_accuracy"]),
            (1.0, LARGE_WORK),
            (1.0, float(r["large_rows_share"])),
        )
        for r in rows
        if r["target"] is not None
    ]
    small = CascadeOption(rows[0]["config"], rows[0]["heldout_accuracy"], (1.0,), (1.0,))
    large = CascadeOption(rows[1]["config"], 1.0, (LARGE_WORK,), (1.0,))
    options = [large, *options, small]
    plan = gear_plan(options, max_rate=1.0, ranges=40)
    out = []
    print(
        f"\nload-based choice (simulated; a large-stage row assumed {LARGE_WORK:g}x a "
        "small one; rate in rows per small-row time)"
    )
    print(f"{'rate':>6} {'policy':44} {'accuracy':>8} {'p95 latency':>12}")
    for rate in (0.04, 0.07, 0.1, 0.13, 0.2, 0.4):
        arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / rate, 4000)).tolist()
        for name, policy in (
            ("gear plan", plan.pick),
            ("large only", lambda _r: large),
            ("small only", lambda _r: small),
        ):
            res = simulate_load(arrivals, policy, window_s=50 / rate)
            top = max(res.chosen, key=lambda k: res.chosen[k])
            label = f"{name} (mostly {top})" if name == "gear plan" else name
            print(f"{rate:>6.2f} {label:44} {res.accuracy:>8.3f} {res.p95_latency_s:>12.1f}")
            out.append(
                {
                    "rate": rate,
                    "policy": name,
                    "mostly": top,
                    "accuracy": res.accuracy,
                    "p95_latency": res.p95_latency_s,
                    "mean_latency": res.mean_latency_s,
                }
            )
    return out


def plot(
    rows: Sequence[Mapping[str, Any]], sweep: Sequence[Mapping[str, Any]], n_held: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(
        [100 * s["escalated"] for s in sweep],
        [s["accuracy"] for s in sweep],
        color="0.6",
        lw=1,
        label="every threshold (held-out half)",
    )
    for r in rows:
        x = 100 * r["large_rows_share"]
        if r["target"] is None:
            ax.scatter([x], [r["heldout_accuracy"]], marker="s", s=50, zorder=3)
            ax.annotate(
                r["config"],
                (x, r["heldout_accuracy"]),
                fontsize=8,
                xytext=(4, -10),
                textcoords="offset points",
            )
        else:
            color = "tab:green" if r["met"] else "tab:red"
            ax.scatter([x], [r["heldout_accuracy"]], color=color, zorder=3)
            ax.hlines(r["target"], x - 3, x + 3, color=color, lw=1)
            ax.annotate(
                f"target {r['target']:.2f}",
                (x, r["heldout_accuracy"]),
                fontsize=8,
                xytext=(4, 2),
                textcoords="offset points",
            )
    base = rows[0]["heldout_accuracy"]
    ax.plot(
        [0, 100],
        [base, 1.0],
        color="0.6",
        lw=1,
        ls="--",
        label="escalating rows at random (no confidence)",
    )
    ax.set_xlabel("rows escalated to the large stage (%)")
    ax.set_ylabel(f"held-out accuracy ({n_held} rows)")
    ax.set_title("SmolLM2-135M -> large stage cascade, thresholds at 95% confidence")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)
    shutil.copyfile(PLOT, HERE.parent / "docs" / "img" / PLOT.name)  # the docs site shows it


if __name__ == "__main__":
    main()
