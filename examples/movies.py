"""The main job: df.llm on real movie reviews, on the default local backend.

Reads ``../shared/data/movies_small.csv`` (or the slice shipped in
``examples/data/`` when the shared folder is not there), keeps the reviews a
small local model judges positive, writes a one-line summary for a few of them,
and prints what was sent and what it cost.

    python examples/movies.py                 # 40 rows, local engine
    python examples/movies.py --rows 200
    python examples/movies.py --backend fake  # no model: instant, for a smoke test
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import semframe

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "movies_small.csv"
SLICE = HERE / "data" / "movies_slice.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description="semframe on movie reviews")
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--summaries", type=int, default=4)
    parser.add_argument("--backend", default=None, help="default: from configuration (local)")
    args = parser.parse_args()

    source = SHARED if SHARED.exists() else SLICE
    reviews = pd.read_csv(source).head(args.rows)
    reviews = reviews[reviews["review_content"].notna()]
    print(f"{len(reviews)} reviews of {reviews['movie_title'].nunique()} movies from {source.name}")

    question = "Is the review {review_content} positive about the movie {movie_title}?"
    plan = reviews.llm.plan(question, op="filter", backend=args.backend)
    print(plan.explain(n=1))

    liked = reviews.llm.filter(question, backend=args.backend)
    stats = semframe.last_run()
    print(f"\n{len(liked)} of {len(reviews)} reviews are positive.")
    print(stats)

    sample = liked.head(args.summaries)
    # A small model may run past max_tokens: keep such answers, marked, rather than
    # failing their rows (the default, truncated="error", asks again, then reports them).
    summaries = sample.llm.map(
        "Summarize the review {review_content} of {movie_title} in one short sentence.",
        out="summary",
        max_tokens=40,
        truncated="keep",
        backend=args.backend,
    )
    print()
    for _, row in summaries.iterrows():
        cut = " [cut at max_tokens]" if row["summary_truncated"] else ""
        print(f"- {row['movie_title']}: {' '.join(row['summary'].split())}{cut}")
    print(semframe.last_run())


if __name__ == "__main__":
    main()
