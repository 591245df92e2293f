"""Billed API cost by row order: original vs ``stats`` vs ``ggr``, OpenAI and Anthropic.

Every run is a real ``df.llm`` call through the official SDK clients against
the provider emulator (``semframe.testing.emulator``), which applies each provider's
caching rules to the prompts it receives and bills them with semframe's dated
price table. Nothing is estimated: the dollars are what the emulator billed.

Workloads (real tables from ``../shared/data``):

- ``movies/short``: filter over ``movies_small.csv`` (1,019 reviews of 51
  movies) with a one-line question; prompts are ~150 tokens.
- ``movies/rubric``: the same filter with a grading rubric and six worked
  examples in the shared instructions (~960 tokens), as production prompts
  often carry.
- ``contrib/rubric``: a sector classification of ``contributions.csv`` rows
  (first ``--contrib-rows`` rows, 8 of their columns) with a rubric and ten
  worked examples (~1,180 tokens of shared instructions).

Price models: ``gpt-4o-mini`` (cached input at 50%, the pricing of the GGR
paper's time), ``gpt-4.1-mini`` (cached at 25%), ``claude-opus-4-1`` (1,024-token
minimum; writes 1.25x, reads 0.1x) and ``claude-haiku-4-5`` (4,096-token
minimum). And one hypothetical: ``gpt-4o-mini`` with no minimum, 1-token steps
and a single cache machine, i.e. every token a prompt shares with an earlier
prompt billed as cached, which is how the GGR paper's cost figure counts.

Each run starts from a cold cache. Requests go out as semframe sends them:
concurrently (64 in flight), each prefix group's first request ahead of the
rest of its group, ``prompt_cache_key`` per group.

    python benchmarks/api_cost.py            # full (about 8 minutes on 2 cores)
    python benchmarks/api_cost.py --quick    # 300 movie rows, 600 contribution rows

Writes ``benchmarks/results/api_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.cost.cachesim import OpenAIRules
from semframe.testing.emulator import ProviderEmulator

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT / ".." / "shared" / "data").resolve()
RESULTS = ROOT / "benchmarks" / "results" / "api_cost.json"
ORDERS = ("none", "stats", "ggr")

MOVIE_RUBRIC = """You grade film critics' reviews for a sentiment index.
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
6. Use the movie description only to understand references in the review
   (character names, genre conventions); never grade the movie yourself.
7. A review that is empty or only a rating without words is judged from the
   words present; if there are none, answer no.
8. Answer about the review as written; do not guess the critic's star rating.
"""

CONTRIB_RUBRIC = """You classify individual campaign contributions from US
Federal Election Commission filings for an economic-sector report.

Decide whether the contributor works in the finance, insurance or real estate
sector (the "FIRE" sector) based on the filing.

Rubric:
1. Use EMPLOYER and OCCUPATION first. Banks, credit unions, brokerages, asset
   and wealth managers, private equity, venture capital, hedge funds, payment
   processors, insurers, insurance brokers and agents, real estate developers,
   brokers, agents, property managers, REITs, mortgage lenders and appraisers
   are in the sector.
2. Accountants and lawyers are in the sector only when the employer is a
   financial firm; at an accounting or law firm they are not.
3. "SELF-EMPLOYED" counts when the occupation is in the sector (for example
   REALTOR, INVESTOR, FINANCIAL ADVISOR, INSURANCE AGENT).
4. "RETIRED", "NOT EMPLOYED", "NONE", "HOMEMAKER" and "STUDENT" are not in the
   sector, whatever the amount.
5. Executives (CEO, CFO, VP, DIRECTOR, PRESIDENT) are in the sector when the
   employer is; a CFO of a hospital is not.
6. Ignore the committee, report type, transaction type, date, amount, city,
   state and ZIP code; they do not decide the sector.
7. When employer and occupation are missing, blank or "INFORMATION REQUESTED",
   answer no.
8. Government employees, including financial regulators, are not in the sector.
9. Technology companies are not in the sector unless their business is
   payments, lending, insurance or brokerage (a payments processor counts; a
   general software firm with a finance department does not).
10. Answer about this filing only; do not infer from other filings of the same
    person.
"""

CONTRIB_FIELDS = (
    "CMTE_ID",
    "RPT_TP",
    "NAME",
    "CITY",
    "STATE",
    "EMPLOYER",
    "OCCUPATION",
    "TRANSACTION_AMT",
)


@dataclass(frozen=True)
class Row:
    workload: str
    model: str
    order: str
    rows: int
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    input_dollars: float
    output_dollars: float
    dollars: float
    wall_seconds: float

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def movies(n: int) -> pd.DataFrame:
    df = pd.read_csv(DATA / "movies_small.csv")
    return df.head(n).reset_index(drop=True)


def contributions(n: int) -> pd.DataFrame:
    df = pd.read_csv(DATA / "contributions.csv", dtype=str, keep_default_na=False)
    return df.head(n)[list(CONTRIB_FIELDS)].reset_index(drop=True)


def movie_examples() -> list[dict[str, object]]:
    # Six worked examples: the first review of the table's last six movies (the
    # same in every run, whatever the slice), answered by hand.
    full = pd.read_csv(DATA / "movies_small.csv").fillna("")
    picks = full.drop_duplicates("movie_title").tail(6)
    answers = ["yes", "no", "yes", "no", "yes", "no"]
    return [
        {"movie_info": r.movie_info, "review_content": r.review_content, "answer": a}
        for r, a in zip(picks.itertuples(), answers, strict=True)
    ]


FIRE_WORDS = (
    "BANK",
    "CAPITAL",
    "FINANC",
    "INVEST",
    "INSURANCE",
    "REAL ESTATE",
    "REALTOR",
    "MORTGAGE",
    "WEALTH",
    "ASSET",
    "EQUITY",
    "BROKER",
    "FUND",
    "PAYMENT",
    "WORLDPAY",
)


def contrib_examples(n_slice: int) -> list[dict[str, object]]:
    # Ten filings from outside the benchmark slice, labeled by the keyword rule
    # above on EMPLOYER and OCCUPATION (a stand-in for hand labels; the bill does
    # not depend on the labels' quality).
    full = pd.read_csv(DATA / "contributions.csv", dtype=str, keep_default_na=False)
    rest = full.iloc[n_slice:][list(CONTRIB_FIELDS)]
    examples: list[dict[str, object]] = []
    for want in (True, False) * 5:
        for _, r in rest.iterrows():
            text = f"{r.EMPLOYER} {r.OCCUPATION}".upper()
            if any(w in text for w in FIRE_WORDS) == want and r.NAME not in {
                e["NAME"] for e in examples
            }:
                examples.append({**r.to_dict(), "answer": "yes" if want else "no"})
                break
    return examples


def workloads(movie_rows: int, contrib_rows: int) -> list[tuple[str, pd.DataFrame, dict[str, Any]]]:
    m = movies(movie_rows)
    c = contributions(contrib_rows)
    return [
        (
            "movies/short",
            m,
            {"template": "Given {movie_info}, is the review {review_content} positive?"},
        ),
        (
            "movies/rubric",
            m,
            {
                "template": MOVIE_RUBRIC
                + "\nMovie description: {movie_info}\nReview: {review_content}\n"
                + "Is the review positive?",
                "examples": movie_examples(),
            },
        ),
        (
            "contrib/rubric",
            c,
            {
                "template": CONTRIB_RUBRIC
                + "\nFiling: "
                + ", ".join(f"{{{f}}}" for f in CONTRIB_FIELDS)
                + "\nIs the contributor in the FIRE sector?",
                "examples": contrib_examples(len(c)),
            },
        ),
    ]


HYPOTHETICAL = "gpt-4o-mini-every-shared-token"
PRICES = {
    HYPOTHETICAL: {
        "provider": "openai",
        "input": 0.15,
        "cached_input": 0.075,
        "output": 0.60,
        "min_cacheable_tokens": 1,
        "cache_step_tokens": 1,
        "as_of": "2024-07-18",
        "note": "gpt-4o-mini prices with no minimum and 1-token steps (hypothetical)",
    }
}
MODELS = (
    ("openai", "gpt-4o-mini"),
    ("openai", "gpt-4.1-mini"),
    ("openai", HYPOTHETICAL),
    ("anthropic", "claude-opus-4-1"),
    ("anthropic", "claude-haiku-4-5"),
)


def run_one(
    emu: ProviderEmulator,
    df: pd.DataFrame,
    *,
    spec: dict[str, Any],
    provider: str,
    model: str,
    order: str,
) -> Row:
    emu.reset()  # a cold cache: no run profits from the one before
    url = emu.openai_url if provider == "openai" else emu.anthropic_url
    start = time.perf_counter()
    df.llm.filter(
        spec["template"],
        examples=spec.get("examples"),
        backend=provider,
        base_url=url,
        model=model,
        reorder=order,
        prices=PRICES,
        errors="keep",
        progress="off",
        cache=False,  # billed in full: no answers from the result cache of an earlier run
    )
    wall = time.perf_counter() - start
    bill = emu.ledger.totals()
    return Row(
        workload="",
        model=model,
        order=order,
        rows=len(df),
        prompt_tokens=bill.prompt_tokens,
        cached_tokens=bill.cached_tokens,
        cache_write_tokens=bill.cache_write_tokens,
        input_dollars=bill.cost.uncached_input + bill.cost.cached_input + bill.cost.cache_writes,
        output_dollars=bill.cost.output,
        dollars=bill.dollars,
        wall_seconds=wall,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--movie-rows", type=int, default=1019)
    parser.add_argument("--contrib-rows", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="300 movie and 600 contribution rows")
    args = parser.parse_args()
    if args.quick:
        args.movie_rows, args.contrib_rows = 300, 600
    os.environ.setdefault("OPENAI_API_KEY", "sk-emulator")
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-emulator")
    warnings.simplefilter("ignore", DeprecationWarning)

    results: list[dict[str, Any]] = []
    header = (
        f"{'workload':<15} {'model':<31} {'order':<6} {'prompt tok':>11} {'cached':>7} "
        f"{'writes':>9} {'input $':>9} {'total $':>9} {'saved':>7} {'saved in':>8}"
    )
    print(header)
    print("-" * len(header))
    # The hypothetical model is billed by one cache machine that never overflows:
    # every token a prompt shares with an earlier one is cached, as in the paper.
    ideal = ProviderEmulator(
        prices=PRICES, openai_rules=OpenAIRules(machines=1, overflow_per_minute=10**9)
    )
    real = ProviderEmulator(prices=PRICES)
    emus = {model: ideal if model == HYPOTHETICAL else real for _, model in MODELS}
    with real, ideal:
        for name, df, spec in workloads(args.movie_rows, args.contrib_rows):
            for provider, model in MODELS:
                base: Row | None = None
                for order in ORDERS:
                    row = run_one(
                        emus[model], df, spec=spec, provider=provider, model=model, order=order
                    )
                    row = Row(**{**asdict(row), "workload": name})
                    base = base or row
                    saved = 1 - row.dollars / base.dollars if base.dollars else 0.0
                    saved_in = (
                        1 - row.input_dollars / base.input_dollars if base.input_dollars else 0.0
                    )
                    print(
                        f"{name:<15} {model:<31} {order:<6} {row.prompt_tokens:>11,} "
                        f"{row.cached_share:>7.1%} {row.cache_write_tokens:>9,} "
                        f"{row.input_dollars:>9.4f} {row.dollars:>9.4f} "
                        f"{saved:>7.1%} {saved_in:>8.1%}"
                    )
                    results.append(
                        {
                            **asdict(row),
                            "cached_share": row.cached_share,
                            "saved_vs_original": saved,
                            "input_saved_vs_original": saved_in,
                        }
                    )
            print()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "api_cost",
                "date": time.strftime("%Y-%m-%d"),
                "machine": platform.platform(),
                "semframe": semframe.__version__ if hasattr(semframe, "__version__") else None,
                "movie_rows": args.movie_rows,
                "contrib_rows": args.contrib_rows,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
