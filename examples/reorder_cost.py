"""Estimate vs actual, with reordering on and off.

Reads ``../shared/data/movies_small.csv`` (or the slice shipped in
``examples/data/``), and for the same filter over the same reviews runs
``reorder="none"`` (the file's row order, the template's field order) and
``reorder="ggr"`` (semframe's default). For each it prints the estimate made
before sending anything next to what the run measured: input tokens, tokens
served from the engine's prefix cache, and wall time.

The engine's host-RAM prompt cache is turned off (``local_cache_ram_mib=0``)
so that reuse comes from the slots' KV caches only, which is what the
estimator models, and so is semframe's result cache (``cache=False``), which
would otherwise answer the second run's repeated prompts without sending them.

    python examples/reorder_cost.py                 # 32 reviews, local engine (about a minute)
    python examples/reorder_cost.py --rows 80
    python examples/reorder_cost.py --backend fake  # no model: instant smoke test
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import semframe

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "movies_small.csv"
SLICE = HERE / "data" / "movies_slice.csv"
QUESTION = "Is the review {review_content} positive about the movie {movie_title} ({movie_info})?"


def main() -> None:
    parser = argparse.ArgumentParser(description="estimate vs actual, reordering on and off")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--backend", default=None, help="default: from configuration (local)")
    args = parser.parse_args()
    source = SHARED if SHARED.exists() else SLICE
    reviews = pd.read_csv(source).dropna(subset=["review_content"])
    # Reviews of eight movies, in the file's order (the movies interleave there).
    titles = reviews["movie_title"].drop_duplicates().head(8)
    reviews = reviews[reviews["movie_title"].isin(titles)].head(args.rows)
    print(
        f"{len(reviews)} reviews of {reviews['movie_title'].nunique()} movies from {source.name}\n"
    )
    # cache=False: the result cache would answer a re-run without sending anything.
    opts = {"backend": args.backend, "local_cache_ram_mib": 0, "errors": "keep", "cache": False}

    header = (
        f"{'reorder':<8} {'':<9} {'input tok':>10} {'cached':>8} {'share':>7} {'wall s':>8}"
        f" {'yes':>5}"
    )
    print(header)
    print("-" * len(header))
    for reorder in ("none", "ggr"):
        est = reviews.llm.estimate(QUESTION, op="filter", reorder=reorder, **opts)
        fig = est.planned
        share = fig.cached_tokens / fig.input_tokens if fig.input_tokens else 0.0
        wall = "-" if fig.wall_seconds is None else f"{fig.wall_seconds:.1f}"
        print(
            f"{reorder:<8} {'estimate':<9} {fig.input_tokens:>10,} {fig.cached_tokens:>8,} "
            f"{share:>7.1%} {wall:>8}"
        )
        liked = reviews.llm.filter(QUESTION, reorder=reorder, **opts)
        run = semframe.last_run()
        if run is None:
            continue
        print(
            f"{'':<8} {'actual':<9} {run.prompt_tokens:>10,} {run.cached_tokens:>8,} "
            f"{run.cached_share:>7.1%} {run.wall_seconds:>8.1f} {len(liked):>5}"
        )
    print(
        "\nThe estimate counts the rendered prompt; the run also counts the chat "
        "template's tokens.\nSame rows, same question: reordering changes only what "
        "the engine can reuse."
    )


if __name__ == "__main__":
    main()
