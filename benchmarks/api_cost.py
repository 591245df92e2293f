"""Billed API cost with and without semframe: file order, GGR, cache directives.

Every run is a real ``df.llm.filter`` call through the official SDK clients
(``openai``, ``anthropic``, ``google-genai``) against the provider emulator
(``semframe.testing.emulator``), which applies each provider's caching rules to
the prompts it receives and bills them with semframe's dated price table
(``semframe/data/prices.toml``). Nothing is estimated: the dollars are what the
emulator billed, output included.

Four columns per workload and model, each from a cold cache:

- ``plain``: file order, no cache directives (``reorder="none",
  cache_directives=False``): what a client without semframe sends. OpenAI: no
  ``prompt_cache_key`` (and on GPT-5.6 no breakpoints, so OpenAI's implicit
  mode writes every whole prompt at 1.25x input); Anthropic: no
  ``cache_control``, nothing cached; Gemini: implicit caching only.
- ``file``: file order with semframe's directives (``reorder="none"``).
- ``ggr``: GGR order without directives (``reorder="ggr",
  cache_directives=False``).
- ``ggr+dir``: GGR order with the best directive (``reorder="ggr"``, the
  default): ``prompt_cache_key`` per prefix group (OpenAI), breakpoints where
  the write is repaid (Anthropic, GPT-5.6 in explicit mode), an explicit cache
  for the shared instructions where it pays (Gemini).

"saved" is against ``plain``. A check per workload and model says whether
``ggr+dir`` is at most the cheaper of the two file-order columns, with a 0.5%
tolerance; a miss prints a ``FAIL`` line, runs the three columns three more
times each from a cold cache and decides on the medians of the four runs (the
table keeps the first run), recorded in the JSON with every run's bill and the
medians' verdict (the exit status stays 0). On OpenAI's automatic-caching models
(gpt-4o-mini to gpt-5.5) hits depend on which requests have finished when the
next arrive, so a bill varies between identical runs: by 1-4% on
gpt-4.1-mini, by up to 30% on gpt-5.5 for the columns without GGR +
directives. A FAIL that the medians do not repeat is within that spread.

Workloads (real tables from ``../shared/data``):

- ``movies/rubric``: filter over ``movies_small.csv`` (1,019 reviews of 51
  movies) with a grading rubric and six worked examples in the shared
  instructions (~960 tokens; ~1,070 per prompt). The file's rows are not
  sorted by movie (its first 300 rows hold all 51 movies); GGR puts a movie's
  reviews together behind the shared instructions and its description.
- ``movies/long``: the same with twenty worked examples (~2,500 tokens of
  shared instructions; ~2,610 per prompt): past the 2,048-token minimum of
  Claude Sonnet 4.6 and Gemini 2.5, under Claude Haiku 4.5's 4,096.
- ``contrib/rubric``: a sector classification of ``contributions.csv`` rows
  (first ``--contrib-rows`` rows, 8 of their columns) with a rubric and ten
  worked examples (~1,180 tokens of shared instructions; ~1,250 per prompt).

Models: ``gpt-4o-mini`` (cached input at 50%, the pricing of the GGR paper's
time), ``gpt-4.1-mini`` (25%), ``gpt-5.5`` (10%; automatic caching, 24h
retention), ``gpt-5.6-luna`` and ``gpt-5.6`` (Sol) (10%; cache writes 1.25x,
caching by breakpoints; the family shares its rules, Luna is the cheap end and
Sol the dear one), ``claude-haiku-4-5`` (4,096-token minimum) and
``claude-sonnet-4-6`` (2,048; both write 1.25x, read 0.1x), ``gemini-2.5-flash``
and ``gemini-2.5-pro`` (2,048-token minimum, cached 10%, explicit caches
billed creation + 5 minutes of storage). And one hypothetical:
``gpt-4o-mini`` with no minimum, 1-token steps and a single cache machine, i.e.
every token a prompt shares with an earlier prompt billed as cached, which is
how the GGR paper's cost figure counts.

Requests go out as semframe sends them: concurrently (64 in flight on OpenAI,
32 on Anthropic and Gemini), each prefix group's first request ahead of the
rest of its group.

    python benchmarks/api_cost.py            # 1,019 / 2,000 rows: about 14 minutes on 2 cores
    python benchmarks/api_cost.py --quick    # 300 movie rows, 600 contribution rows: about 4.5
    python benchmarks/api_cost.py --replot   # redraw the plot from the JSON

Writes ``benchmarks/results/api_cost.json`` and ``benchmarks/results/api_cost.png``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.backends import reset_backends
from semframe.cost.cachesim import OpenAIRules
from semframe.cost.pricing import price_for
from semframe.testing.emulator import Latency, ProviderEmulator

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT / ".." / "shared" / "data").resolve()
RESULTS = ROOT / "benchmarks" / "results" / "api_cost.json"
PLOT = ROOT / "benchmarks" / "results" / "api_cost.png"

# (name, reorder, cache_directives)
COLUMNS = (
    ("plain", "none", False),
    ("file", "none", True),
    ("ggr", "ggr", False),
    ("ggr+dir", "ggr", True),
)
LABELS = {
    "plain": "file order, no directives",
    "file": "file order + directives",
    "ggr": "GGR, no directives",
    "ggr+dir": "GGR + best directive",
}
TOLERANCE = 0.005  # "never above file order" up to 0.5% (run-to-run noise can exceed it)
PAPER = {"openai": 0.32, "anthropic": 0.21}  # the GGR paper's best measured savings

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
    provider: str
    model: str
    column: str
    reorder: str
    cache_directives: bool
    rows: int
    requests: int
    failed: int
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


# Answers by hand to the first review of each of the table's last twenty movies
# (the same in every run, whatever the slice). The last six are movies/rubric's
# examples (and benchmarks/vs_lotus.py's), as they were first written.
MOVIE_ANSWERS = (
    *("no", "no", "yes", "no", "no", "yes", "no", "no", "yes", "yes", "no", "no", "no", "no"),
    *("yes", "no", "yes", "no", "yes", "no"),
)


def movie_examples(n: int = 6) -> list[dict[str, object]]:
    full = pd.read_csv(DATA / "movies_small.csv").fillna("")
    picks = full.drop_duplicates("movie_title").tail(n)
    answers = MOVIE_ANSWERS[-n:]
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
    movie_template = (
        MOVIE_RUBRIC
        + "\nMovie description: {movie_info}\nReview: {review_content}\n"
        + "Is the review positive?"
    )
    return [
        ("movies/rubric", m, {"template": movie_template, "examples": movie_examples(6)}),
        ("movies/long", m, {"template": movie_template, "examples": movie_examples(20)}),
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
    ("openai", "gpt-5.5"),
    ("openai", "gpt-5.6-luna"),
    ("openai", "gpt-5.6"),
    ("openai", HYPOTHETICAL),
    ("anthropic", "claude-haiku-4-5"),
    ("anthropic", "claude-sonnet-4-6"),
    ("gemini", "gemini-2.5-flash"),
    ("gemini", "gemini-2.5-pro"),
)


def run_one(
    emu: ProviderEmulator,
    df: pd.DataFrame,
    *,
    workload: str,
    spec: dict[str, Any],
    provider: str,
    model: str,
    column: str,
    order: str,
    directives: bool,
) -> tuple[Row, list[str]]:
    emu.reset()  # a cold cache: no run profits from the one before
    url = {"openai": emu.openai_url, "anthropic": emu.anthropic_url, "gemini": emu.gemini_url}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df.llm.filter(
            spec["template"],
            examples=spec.get("examples"),
            backend=provider,
            base_url=url[provider],
            model=model,
            reorder=order,
            cache_directives=directives,
            prices=PRICES,
            errors="keep",
            progress="off",
            cache=False,  # billed in full: no answers from the result cache of an earlier run
        )
    wall = time.perf_counter() - start
    bill = emu.ledger.totals()
    # Close the backends while the emulator still answers (Gemini deletes its
    # explicit caches); the next run builds fresh ones.
    reset_backends()
    row = Row(
        workload=workload,
        provider=provider,
        model=model,
        column=column,
        reorder=order,
        cache_directives=directives,
        rows=len(df),
        requests=bill.requests,
        failed=bill.failed,
        prompt_tokens=bill.prompt_tokens,
        cached_tokens=bill.cached_tokens,
        cache_write_tokens=bill.cache_write_tokens,
        input_dollars=bill.cost.uncached_input + bill.cost.cached_input + bill.cost.cache_writes,
        output_dollars=bill.cost.output,
        dollars=bill.dollars,
        wall_seconds=wall,
    )
    notes = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return row, notes


RERUNS = 3
"""Cold reruns of the three compared columns after a miss; the check then takes medians."""


def never_above(dollars: dict[str, float]) -> dict[str, Any]:
    """Whether GGR + directives cost at most the cheaper file-order column (with tolerance)."""
    best = dollars["ggr+dir"]
    floor = min(dollars["plain"], dollars["file"])
    return {
        "ggr_dir_dollars": best,
        "file_order_min_dollars": floor,
        "ratio": best / floor if floor else 1.0,
        "ok": best <= floor * (1 + TOLERANCE),
    }


def verdict(check: dict[str, Any]) -> str:
    return (
        f"{'ok' if check['ok'] else 'FAIL'} (ggr+dir {check['ggr_dir_dollars']:.4f} vs "
        f"min(plain, file) {check['file_order_min_dollars']:.4f}, {check['ratio'] - 1:+.2%})"
    )


def summary(results: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    """One line per workload and model: cached shares, savings vs plain, the check."""
    head = (
        f"{'workload':<15} {'model':<31} {'plain $':>8}  "
        f"{'cached: plain / file / ggr / ggr+dir':<36} {'saved: file / ggr / ggr+dir':<27} check"
    )
    print("summary (saved: against plain file order, whole bill)")
    print(head)
    print("-" * len(head))
    ok = {
        (c["workload"], c["model"]): "ok"
        if c["ok"]
        else f"FAIL (medians {'ok' if c['rerun']['ok'] else 'FAIL'})"
        for c in checks
    }
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["workload"], r["model"]), {})[r["column"]] = r
    for (name, model), cell in cells.items():
        shares = " / ".join(f"{cell[c]['cached_share']:.1%}" for c, _, _ in COLUMNS)
        saved = " / ".join(f"{cell[c]['saved_vs_plain']:.1%}" for c, _, _ in COLUMNS[1:])
        print(
            f"{name:<15} {model:<31} {cell['plain']['dollars']:>8.4f}  {shares:<36} "
            f"{saved:<27} {ok.get((name, model), '')}"
        )
    print()


def plot(results: list[dict[str, Any]], names: list[str]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    models = [m for _, m in MODELS]
    fig, axes = plt.subplots(len(names), 1, figsize=(13, 3.3 * len(names)), squeeze=False)
    width = 0.2
    colors = ("#9e9e9e", "#64b5f6", "#ffb74d", "#2e7d32")
    for ax, name in zip(axes[:, 0], names, strict=True):
        cell = {(r["model"], r["column"]): r for r in results if r["workload"] == name}
        for j, (column, _, _) in enumerate(COLUMNS):
            xs, ys = [], []
            for i, model in enumerate(models):
                r = cell.get((model, column))
                base = cell.get((model, "plain"))
                if r and base and base["dollars"]:
                    xs.append(i + (j - 1.5) * width)
                    ys.append(r["dollars"] / base["dollars"])
            ax.bar(xs, ys, width, label=LABELS[column], color=colors[j])
        ax.axhline(1.0, color="black", linewidth=0.8)
        for provider, color in (("openai", "#d32f2f"), ("anthropic", "#7b1fa2")):
            ax.axhline(
                1 - PAPER[provider],
                color=color,
                linestyle=":",
                linewidth=1,
                label=f"GGR paper: -{PAPER[provider]:.0%} ({provider})",
            )
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(
            [m.replace("-every-shared-token", "\n(every shared\ntoken)") for m in models],
            fontsize=8,
        )
        ax.set_ylabel("bill / plain file order")
        rows = next(iter(cell.values()))["rows"] if cell else 0
        ax.set_title(f"{name} ({rows:,} rows)", fontsize=10, loc="left")
        ax.set_ylim(0, max(1.3, ax.get_ylim()[1]))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=3, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.97))
    fig.suptitle("Billed cost relative to plain file order (provider emulator; lower is cheaper)")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)
    print(f"wrote {PLOT.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--movie-rows", type=int, default=1019)
    parser.add_argument("--contrib-rows", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="300 movie and 600 contribution rows")
    parser.add_argument("--replot", action="store_true", help="only redraw the plot from the JSON")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(RESULTS.read_text())["results"]
        plot(saved, list(dict.fromkeys(r["workload"] for r in saved)))
        return
    if args.quick:
        args.movie_rows, args.contrib_rows = 300, 600
    os.environ.setdefault("OPENAI_API_KEY", "sk-emulator")
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-emulator")
    os.environ.setdefault("GEMINI_API_KEY", "emulator")  # any key: the emulator takes it

    began = time.perf_counter()
    results: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    notes: set[str] = set()
    header = (
        f"{'workload':<15} {'model':<31} {'column':<8} {'prompt tok':>10} {'cached':>6} "
        f"{'writes':>9} {'total $':>9} {'saved':>7} {'vs paper':>9}"
    )
    # The hypothetical model is billed by one cache machine that never overflows:
    # every token a prompt shares with an earlier one is cached, as in the paper.
    # Instant answers (Latency(0)), as the documented results were measured.
    ideal = ProviderEmulator(
        prices=PRICES,
        openai_rules=OpenAIRules(machines=1, overflow_per_minute=10**9),
        latency=Latency(0),
    )
    real = ProviderEmulator(prices=PRICES, latency=Latency(0))
    emus = {model: ideal if model == HYPOTHETICAL else real for _, model in MODELS}
    names: list[str] = []
    with real, ideal:
        for name, df, spec in workloads(args.movie_rows, args.contrib_rows):
            names.append(name)
            print(header)
            print("-" * len(header))
            for provider, model in MODELS:
                price = price_for(model, PRICES)
                cell: dict[str, Row] = {}
                # one cold run of a column of this cell (the table's, and the reruns')
                run = functools.partial(
                    run_one,
                    emus[model],
                    df,
                    workload=name,
                    spec=spec,
                    provider=provider,
                    model=model,
                )
                for column, order, directives in COLUMNS:
                    row, warned = run(column=column, order=order, directives=directives)
                    cell[column] = row
                    base = cell["plain"]
                    saved = 1 - row.dollars / base.dollars if base.dollars else 0.0
                    # What the plain run's prompts cost with no caching at all.
                    uncached = base.prompt_tokens * price.input / 1e6 + base.output_dollars
                    paper = PAPER.get(provider)
                    versus = "" if paper is None or column == "plain" else f"{saved - paper:+.1%}"
                    print(
                        f"{name:<15} {model:<31} {column:<8} {row.prompt_tokens:>10,} "
                        f"{row.cached_share:>6.1%} {row.cache_write_tokens:>9,} "
                        f"{row.dollars:>9.4f} {saved:>7.1%} {versus:>9}",
                        flush=True,
                    )
                    for w in warned:
                        print(f"    warning: {w}")
                        notes.add(f"{name} {model} {column}: {w}")
                    if row.failed:
                        print(f"    {row.failed} of {row.requests} requests failed")
                    results.append(
                        {
                            **asdict(row),
                            "cached_share": row.cached_share,
                            "saved_vs_plain": saved,
                            "uncached_dollars": uncached,
                            "vs_uncached": row.dollars / uncached - 1 if uncached else 0.0,
                            "paper_saving": paper,
                        }
                    )
                check = never_above({c: row.dollars for c, row in cell.items()})
                check = {"workload": name, "model": model, **check}
                plain_vs_none = results[-len(COLUMNS)]["vs_uncached"]
                print(
                    f"{'':<15} {model:<31} never above file order: {verdict(check)}; "
                    f"plain vs no caching at all: {plain_vs_none:+.1%}"
                )
                if not check["ok"]:
                    # RERUNS more times each, from a cold cache, to tell a real
                    # excess from run-to-run noise: the medians of all runs decide;
                    # the table keeps the first run.
                    runs = {c: [cell[c].dollars] for c in ("plain", "file", "ggr+dir")}
                    for _ in range(RERUNS):
                        for column, order, directives in COLUMNS:
                            if column in runs:
                                again = run(column=column, order=order, directives=directives)[0]
                                runs[column].append(again.dollars)
                    medians = {c: statistics.median(d) for c, d in runs.items()}
                    check["rerun"] = {**never_above(medians), "runs": runs}
                    print(f"{'':<15} {model:<31} medians: {verdict(check['rerun'])}")
                checks.append(check)
            print()
    wall = time.perf_counter() - began
    summary(results, checks)
    fails = [c for c in checks if not c["ok"]]
    confirmed = [c for c in fails if not c["rerun"]["ok"]]
    for c in fails:
        print(
            f"FAIL: {c['workload']} {c['model']}: GGR + directives {c['ggr_dir_dollars']:.4f} "
            f"> file order {c['file_order_min_dollars']:.4f} ({c['ratio'] - 1:+.2%}); "
            f"medians of {RERUNS + 1} runs: {verdict(c['rerun'])}"
        )
    print(
        f"never above file order: {len(checks) - len(fails)} of {len(checks)} ok "
        f"(tolerance {TOLERANCE:.1%}); {len(confirmed)} FAIL confirmed by the medians of "
        f"{RERUNS + 1} runs"
    )
    print(f"wall time: {wall:.0f} s ({len(results)} runs)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "api_cost",
                "date": time.strftime("%Y-%m-%d"),
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "semframe": getattr(semframe, "__version__", None),
                "quick": args.quick,
                "movie_rows": args.movie_rows,
                "contrib_rows": args.contrib_rows,
                "wall_seconds": wall,
                "tolerance": TOLERANCE,
                "paper_savings": PAPER,
                "never_above_file_order": not fails,
                "never_above_file_order_by_medians": not confirmed,
                "checks": checks,
                "warnings": sorted(notes),
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    plot(results, names)


if __name__ == "__main__":
    main()
