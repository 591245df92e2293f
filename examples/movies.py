"""The main job: df.llm on real movie reviews, on the default local backend.

Reads ``../shared/data/movies_small.csv`` (or the slice shipped in
``examples/data/`` when the shared folder is not there), keeps the reviews a
small local model judges positive, labels every review positive or negative
(what the small model does best), writes a one-line summary for a few of the
kept ones, and prints what was sent and what it cost.

    python examples/movies.py                 # 40 rows, local engine
    python examples/movies.py --rows 200
    python examples/movies.py --backend fake  # no model: instant, for a smoke test
    python examples/movies.py --no-cache      # send every request again

Answers are kept in semframe's result cache, so a second run sends nothing and
says so; ``--no-cache`` (or ``SEMFRAME_CACHE=false make demo``) runs afresh.
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
    parser.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        default=None,
        help="neither read nor write the result cache: every request is sent",
    )
    args = parser.parse_args()
    settings = {"backend": args.backend, "cache": args.cache}  # None: from configuration

    source = SHARED if SHARED.exists() else SLICE
    reviews = pd.read_csv(source).head(args.rows)
    reviews = reviews[reviews["review_content"].notna()]
    print(f"{len(reviews)} reviews of {reviews['movie_title'].nunique()} movies from {source.name}")

    question = "Is this review positive about the movie? {review_content}"
    plan = reviews.llm.plan(question, op="filter", **settings)
    print(plan.explain(n=1))

    liked = reviews.llm.filter(question, **settings)
    stats = semframe.last_run()
    print(f"\n{len(liked)} of {len(reviews)} reviews are positive, says the model.")
    print(
        "(The default model, SmolLM2-135M on CPU, is for trying semframe out: decided from "
        "its calibrated probabilities, its yes/no answers on hand-labeled reviews are right "
        "about 6 times in 10, its positive/negative labels 3 to 4 times in 5 "
        "(benchmarks/answers.py). Give model= a larger GGUF file for answers to rely on.)"
    )
    print(stats)
    said = cache_note(stats)
    if said:
        print(said)

    # What the small model does best: one of two labels, decided from its probabilities.
    labeled = reviews.llm.classify(
        "What is the sentiment of this review of {movie_title}? {review_content}",
        ["positive", "negative"],
        out="sentiment",
        **settings,
    )
    counts = labeled["sentiment"].value_counts()
    print(
        f"\nclassify: {counts.get('positive', 0)} positive, {counts.get('negative', 0)} negative "
        "(right for about 4 reviews in 5 on hand-labeled ones):"
    )
    for _, row in labeled.head(args.summaries).iterrows():
        print(f"- {row['sentiment']:8} {' '.join(str(row['review_content']).split())[:90]}")
    print(semframe.last_run())

    sample = liked.head(args.summaries)
    # A small model may run past max_tokens: keep such answers, marked, rather than
    # failing their rows (the default, truncated="error", asks again, then reports them).
    summaries = sample.llm.map(
        "Summarize the review {review_content} of {movie_title} in one short sentence.",
        out="summary",
        max_tokens=40,
        truncated="keep",
        **settings,
    )
    print()
    for _, row in summaries.iterrows():
        cut = " [cut at max_tokens]" if row["summary_truncated"] else ""
        print(f"- {row['movie_title']}: {' '.join(row['summary'].split())}{cut}")
    stats = semframe.last_run()
    print(stats)
    note = cache_note(stats)
    if note and note != said:
        print(note)


def cache_note(stats: semframe.RunStats | None) -> str | None:
    """What the result cache did in this run, in words (None: it answered nothing)."""
    if stats is None or not stats.cache_hits:
        return None
    if stats.requests:
        return (
            f"({stats.cache_hits} of {stats.rows} answers came from the result cache, stored "
            "by an earlier run; only the others were sent.)"
        )
    return (
        "(This demo ran before on this machine and its answers were stored. For a fresh run "
        "that sends every request: SEMFRAME_CACHE=false make demo, or "
        "python examples/movies.py --no-cache.)"
    )


if __name__ == "__main__":
    main()
