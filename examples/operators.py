"""Every operator once, on real movie reviews, on the default local backend.

Reads ``../shared/data/movies_small.csv`` (or the slice shipped in
``examples/data/``), then:

- ``extract``: a typed rating and a one-word mood from each review;
- ``classify``: the review's tone, one of four labels, with a confidence;
- ``agg``: one summary of the critics per movie;
- ``topk``: the three reviews that most recommend their movie;
- ``join``: which reviews belong with which movie description (blocked by
  title, so only plausible pairs are asked about).

    python examples/operators.py                 # local engine, a minute or two
    python examples/operators.py --backend fake  # no model: instant smoke test

The default local model (SmolLM2-135M) is tiny: the structure of every answer is
guaranteed, its judgement is not. Point ``model=`` at a larger GGUF file for
useful answers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import pandas as pd

import semframe

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "movies_small.csv"
SLICE = HERE / "data" / "movies_slice.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description="semframe's operators on movie reviews")
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--backend", default=None, help="default: from configuration (local)")
    args = parser.parse_args()
    opts = {"backend": args.backend, "errors": "keep"}

    source = SHARED if SHARED.exists() else SLICE
    reviews = pd.read_csv(source).dropna(subset=["review_content"])
    # A few reviews of each of three movies.
    titles = reviews["movie_title"].drop_duplicates().head(3)
    reviews = (
        reviews[reviews["movie_title"].isin(titles)]
        .groupby("movie_title")
        .head(max(1, args.rows // 3))
    )
    print(f"{len(reviews)} reviews of {reviews['movie_title'].nunique()} movies\n")

    rated = reviews.llm.extract(
        "Rate the review {review_content} of {movie_title}.",
        {"stars": int, "mood": Literal["enthusiastic", "warm", "lukewarm", "hostile"]},
        **opts,
    )
    print("extract:")
    print(rated[["movie_title", "stars", "mood"]].to_string(max_colwidth=60), "\n")

    # Confidences need token logprobs (local and openai give them; the fake does not).
    confident = semframe.config(backend=args.backend)["backend"] in {"local", "openai"}
    toned = reviews.llm.classify(
        "What is the tone of the review {review_content}?",
        ["praise", "mixed", "criticism", "neutral"],
        out="tone",
        confidence=confident,
        **opts,
    )
    print("classify" + (" (with the label's probability):" if confident else ":"))
    shown = ["movie_title", "tone"] + (["tone_confidence"] if confident else [])
    print(toned[shown].to_string(max_colwidth=60), "\n")

    summary = reviews.llm.agg(
        "Summarize in one sentence what critics say about {movie_title}: {review_content}",
        by="movie_title",
        out="critics_say",
        max_tokens=60,
        truncated="keep",  # a small model's sentence may run past 60 tokens: keep it, marked
        **opts,
    )
    print("agg (one answer per movie):")
    print(summary.to_string(max_colwidth=80), "\n")

    best = reviews.llm.topk(
        "Which review recommends its movie more strongly: {review_content}", 3, **opts
    )
    calls = semframe.last_op()
    print(f"topk (3 of {len(reviews)} with {calls.llm_calls if calls else '?'} LLM calls):")
    print(best[["movie_title", "review_content"]].to_string(max_colwidth=60), "\n")

    movies = reviews[["movie_title", "movie_info"]].drop_duplicates("movie_title")
    matched = reviews.head(4).llm.join(
        movies,
        "Does the review {left.review_content} fit the movie described as {right.movie_info}?",
        on="movie_title",
        **opts,
    )
    print("join (blocked on the title):")
    print(matched[["review_content", "movie_title"]].to_string(max_colwidth=60), "\n")
    print(semframe.last_run())


if __name__ == "__main__":
    main()
