"""What warming the shared head saves: one request first, then the rest.

A relQuery with a long shared head (instructions, a rubric, worked examples)
and short rows. A provider caches a prefix only once a request carrying it
has been processed, so a first wave of requests sent at once each pay for
the head in full (and on Anthropic each writes it, at 1.25x). semframe sends
the plan's first request alone and the rest once it is answered
(``warm_start``, on by default); this script bills both side by side, and on
Anthropic also the same rows sent with no cache directives at all, the
bill caching must never exceed.

Every run is a real ``df.llm.filter`` through the official SDKs against the
provider emulator (each provider's caching rules, semframe's dated price
table), from a cold cache, with 0.5 s per answer. Rows are the first reviews
of ``movies_small.csv``; the head is a grading rubric and worked examples
(about 1,950 tokens). Beside each bill: its input side, the input side
semframe estimated before sending (``estimate=True``; the output side is
estimated at ``max_tokens``, an upper bound), and the wall time.

    python benchmarks/warm_prefix.py
    python benchmarks/warm_prefix.py --rows 20,300 --latency 0.5

Writes ``benchmarks/results/warm_prefix.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

import semframe  # noqa: F401  (registers df.llm)
from semframe.testing.emulator import Latency, ProviderEmulator

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT / ".." / "shared" / "data").resolve()
RESULTS = ROOT / "benchmarks" / "results" / "warm_prefix.json"

RUBRIC = """You grade film critics' reviews for a sentiment index used by a
streaming service to decide which films to feature. Your answer feeds an
automated pipeline, so follow the rubric exactly and do not explain.

Decide whether the critic's review of the movie is positive overall.

Rubric:
1. A review is positive when the critic recommends the film, praises it more
   than they fault it, or calls it worth seeing despite flaws.
2. A review is negative when the critic advises against it, finds its flaws
   decisive, or describes it as dull, failed, forgettable or a waste of time.
3. Mixed reviews: weigh the final judgement most; a closing recommendation
   decides. Faint praise ("competent", "serviceable") without a recommendation
   counts as negative.
4. Judge the critic's opinion, not the plot: dark or sad subject matter is not
   negative sentiment, and a cheerful premise is not positive sentiment.
5. Sarcasm: read "a triumph of tedium" as negative; irony that still endorses
   the film ("gloriously silly fun") as positive.
6. Comparisons: "not as good as the original" is negative only when the critic
   says the film fails on its own terms; "a worthy sequel" is positive.
7. Performances: praise for one actor in an otherwise failed film is negative;
   a film "carried" by its cast that the critic still enjoyed is positive.
8. Genre: judge a horror film by whether the critic found it effective as
   horror, a comedy by whether they laughed, a documentary by whether it
   informed or moved them; not by whether the genre appeals to you.
9. Length and pacing complaints ("overlong", "drags in the middle") are flaws
   to weigh, not verdicts, unless the critic says they ruin the film.
10. Technical praise (cinematography, score, effects) counts towards positive
    only when the critic connects it to enjoying the film.
11. Audience qualifiers ("fans will enjoy it", "for kids only") are positive
    when the critic endorses the film for that audience, negative when they
    use the qualifier to dismiss it.
12. A review that is empty or only a rating without words is judged from the
    words present; if there are none, answer no.
13. Answer about the review as written; do not guess the critic's star rating
    and do not let the movie description decide.

Glossary of critics' shorthand:
- "a must-see", "essential", "don't miss it": positive.
- "a mixed bag", "uneven": weigh what follows; alone, negative.
- "skip it", "wait for streaming", "rent, don't buy": negative.
- "a guilty pleasure", "so bad it's good" said with affection: positive.
- "ambitious failure", "noble misfire": negative.
- "flawed but fascinating", "messy but alive": positive.
- "fine for what it is", "passable": negative without a recommendation.
"""

EXAMPLES = 12


def reviews(n: int) -> pd.DataFrame:
    df = pd.read_csv(DATA / "movies_small.csv").dropna(subset=["review_content"])
    return df.head(n)[["movie_title", "review_content"]].reset_index(drop=True)


def examples() -> list[dict[str, object]]:
    """Worked examples: the first review of the table's last movies, answered by hand."""
    full = pd.read_csv(DATA / "movies_small.csv").dropna(subset=["review_content"])
    picks = full.drop_duplicates("movie_title").tail(EXAMPLES)
    answers = ["yes", "no"] * (EXAMPLES // 2)
    return [
        {"movie_title": r.movie_title, "review_content": r.review_content, "answer": a}
        for r, a in zip(picks.itertuples(), answers, strict=True)
    ]


TEMPLATE = RUBRIC + "\nMovie: {movie_title}\nReview: {review_content}\nIs the review positive?"

# (label, provider, model, settings)
MODES: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("first wave at once", "anthropic", "claude-sonnet-4-5", {"warm_start": False}),
    ("warm start", "anthropic", "claude-sonnet-4-5", {"warm_start": True}),
    # A minimum no prompt reaches: semframe places no cache breakpoint at all.
    (
        "no cache directives",
        "anthropic",
        "claude-sonnet-4-5",
        {"prices": {"claude-sonnet-4-5": {"min_cacheable_tokens": 10**9}}},
    ),
    ("first wave at once", "openai", "gpt-4o-mini", {"warm_start": False}),
    ("warm start", "openai", "gpt-4o-mini", {"warm_start": True}),
)


def run_one(
    emu: ProviderEmulator, df: pd.DataFrame, provider: str, model: str, extra: dict[str, Any]
) -> dict[str, Any]:
    emu.reset()  # a cold cache: no run profits from the one before
    url = emu.openai_url if provider == "openai" else emu.anthropic_url
    opts: dict[str, Any] = {
        "examples": examples(),
        "backend": provider,
        "base_url": url,
        "model": model,
        "errors": "keep",
        "progress": "off",
        "cache": False,  # billed in full: nothing from an earlier run's result cache
        **extra,
    }
    estimate = df.llm.filter(TEMPLATE, estimate=True, **opts)
    start = time.perf_counter()
    df.llm.filter(TEMPLATE, **opts)
    wall = time.perf_counter() - start
    bill = emu.ledger.totals()
    return {
        "rows": len(df),
        "requests": bill.requests,
        "prompt_tokens": bill.prompt_tokens,
        "cached_tokens": bill.cached_tokens,
        "cache_write_tokens": bill.cache_write_tokens,
        "writes": sum(1 for e in emu.ledger.entries() if e.cache_write_tokens),
        "prompt_tokens_per_request": round(bill.prompt_tokens / max(1, bill.requests)),
        "billed_dollars": bill.dollars,
        "billed_input_dollars": bill.cost.uncached_input
        + bill.cost.cached_input
        + bill.cost.cache_writes,
        "estimated_dollars": estimate.dollars,
        "estimated_input_dollars": _input(estimate.planned.cost),
        "wall_seconds": round(wall, 2),
    }


def _input(cost: Any) -> float:
    return float(cost.uncached_input + cost.cached_input + cost.cache_writes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="20,300", help="comma-separated row counts")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per answer")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-emulator")
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-emulator")
    warnings.simplefilter("ignore", DeprecationWarning)

    results: list[dict[str, Any]] = []
    header = (
        f"{'rows':>5} {'model':<18} {'mode':<20} {'cached':>7} {'writes':>6} "
        f"{'billed $':>9} {'vs warm':>8} {'input $':>8} {'estimated':>9} {'wall s':>7}"
    )
    print(header)
    print("-" * len(header))
    with ProviderEmulator(latency=Latency(fixed_s=args.latency)) as emu:
        for n in (int(x) for x in args.rows.split(",")):
            df = reviews(n)
            rows: list[dict[str, Any]] = []
            for label, provider, model, extra in MODES:
                row = {"mode": label, "provider": provider, "model": model}
                row |= run_one(emu, df, provider, model, extra)
                rows.append(row)
            for row in rows:
                warm = next(
                    r["billed_dollars"]
                    for r in rows
                    if r["model"] == row["model"] and r["mode"] == "warm start"
                )
                row["billed_over_warm"] = row["billed_dollars"] / warm
                share = row["cached_tokens"] / row["prompt_tokens"] if row["prompt_tokens"] else 0
                print(
                    f"{n:>5} {row['model']:<18} {row['mode']:<20} {share:>7.1%} "
                    f"{row['writes']:>6} {row['billed_dollars']:>9.4f} "
                    f"{row['billed_over_warm']:>7.2f}x {row['billed_input_dollars']:>8.4f} "
                    f"{row['estimated_input_dollars']:>9.4f} {row['wall_seconds']:>7.1f}"
                )
            results.extend(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"latency_s": args.latency, "runs": results}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
