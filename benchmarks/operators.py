"""LLM calls of topk and join against the naive approach, on 1,000 real rows.

Runs on the ``fake`` backend (calls and prompt tokens are counted exactly; the
answers come from deterministic stand-ins for a model, so the algorithms' call
counts are what a real model would need for the same answers). Data:
``../shared/data/movies_small.csv``, the first 1,000 reviews.

- **topk**: "the most detailed review" (the stand-in prefers the longer
  review), k = 1, 10, 100, ten pivot seeds each. Naive: every pair compared
  once, n(n-1)/2 = 499,500 calls. The result is checked against sorting.
- **join, reviews x movies**: 1,000 reviews x 51 movies, "does this review fit
  the movie described by movie_info?". No blocking: the pair count equals the
  naive one (51,000); what changes is the order (each movie's long
  ``movie_info`` leads its pairs' prompts), shown as expected prefix reuse and
  the fake engine's cached tokens, against the naive pair order (review by
  review, template field order: semframe's ``reorder="none"``).
- **join, reviews x movies, embedding blocking**: the same question with
  ``block="embedding", block_on=("review_content", "movie_info")``, top 5 and
  top 10 movies per review by TF-IDF character 3-gram cosine similarity
  (:mod:`semframe.operators.embed`). ``own_movie_recall``: share of reviews whose own
  movie (by title) is among the candidates kept.
- **join, reviews x reviews, blocked on the movie**: "do these two reviews
  agree?" with ``on="movie_title"``. Naive: every pair of the two frames,
  1,000,000 calls.

Prints a table and writes ``benchmarks/results/operators.json``.

    python benchmarks/operators.py
    python benchmarks/operators.py --rows 300     # quicker
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import pandas as pd

import semframe  # noqa: F401  (registers df.llm)
from semframe import last_op
from semframe.backends import register_backend
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend
from semframe.operators.join import compile_join

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "movies_small.csv"
RESULTS = Path(__file__).resolve().parent / "results" / "operators.json"


def load(rows: int) -> pd.DataFrame:
    df = pd.read_csv(DATA).head(rows)
    df["review_content"] = df["review_content"].fillna("")
    return df.reset_index(drop=True)


def use(responder: object) -> FakeBackend:
    backend = FakeBackend(responder)  # type: ignore[arg-type]
    register_backend("fake", lambda model, settings: backend)
    return backend


def field(prompt: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}: (.*)$", prompt, re.MULTILINE)
    return match.group(1) if match else ""


def longer_review(request: Request) -> str:
    a = field(request.prompt, "A.review_content")
    b = field(request.prompt, "B.review_content")
    return '{"answer": "B"}' if (len(b), b) > (len(a), a) else '{"answer": "A"}'


def bench_topk(df: pd.DataFrame, ks: list[int], seeds: int) -> list[dict[str, object]]:
    n = len(df)
    lengths = sorted(((len(t), t) for t in df["review_content"]), reverse=True)
    out = []
    for k in ks:
        calls, rounds, secs = [], [], []
        for seed in range(seeds):
            use(longer_review)
            t0 = time.perf_counter()
            top = df.llm.topk(
                "The most detailed review {review_content}", k, seed=seed, backend="fake"
            )
            secs.append(time.perf_counter() - t0)
            got = [(len(t), t) for t in top["review_content"]]
            assert got == lengths[:k], "topk disagrees with sorting"
            stats = last_op()
            assert stats is not None
            calls.append(stats.llm_calls)
            rounds.append(stats.counts["rounds"])
        out.append(
            {
                "k": k,
                "rows": n,
                "llm_calls_mean": statistics.mean(calls),
                "llm_calls_max": max(calls),
                "relqueries_mean": statistics.mean(rounds),
                "naive_calls": n * (n - 1) // 2,
                "ratio": statistics.mean(calls) / (n * (n - 1) // 2),
                "seconds_mean": statistics.mean(secs),
            }
        )
    return out


def fits(request: Request) -> str:
    review = field(request.prompt, "left.review_content")
    info = field(request.prompt, "right.movie_info")
    words = set(re.findall(r"[a-z]{6,}", review.lower()))
    return '{"answer": "yes"}' if words & set(info.lower().split()) else '{"answer": "no"}'


def agree(request: Request) -> str:
    a = field(request.prompt, "left.review_content")
    b = field(request.prompt, "right.review_content")
    return '{"answer": "yes"}' if (len(a) > 100) == (len(b) > 100) else '{"answer": "no"}'


def bench_join(df: pd.DataFrame) -> list[dict[str, object]]:
    reviews = df[["movie_title", "review_content"]]
    movies = df[["movie_title", "movie_info"]].drop_duplicates("movie_title")
    template = "Does the review {review_content} fit the movie described as {movie_info}?"
    out = []
    for reorder in ("none", "ggr"):
        backend = use(fits)
        plan = reviews.llm.plan(template, op="join", other=movies, reorder=reorder)
        t0 = time.perf_counter()
        joined = reviews.llm.join(movies, template, backend="fake", reorder=reorder)
        secs = time.perf_counter() - t0
        stats = last_op()
        assert stats is not None
        out.append(
            {
                "workload": "reviews x movies",
                "order": plan.reorder + (" (naive order)" if reorder == "none" else ""),
                "pairs": len(reviews) * len(movies),
                "llm_calls": stats.llm_calls,
                "naive_calls": len(reviews) * len(movies),
                "matches": len(joined),
                "expected_prefix_reuse": plan.expected_hit_rate,
                "prompt_tokens": stats.prompt_tokens,
                "cached_share": stats.cached_tokens / max(stats.prompt_tokens, 1),
                "fake_slots": backend.capabilities.max_concurrency,
                "seconds": secs,
            }
        )
    for k in (5, 10):
        use(fits)
        block = {"block": "embedding", "block_k": k, "block_on": ("review_content", "movie_info")}
        jc = compile_join(reviews, movies, template, backend="fake", **block)
        titles = movies["movie_title"].tolist()
        own = {(i, titles.index(t)) for i, t in enumerate(reviews["movie_title"])}
        t0 = time.perf_counter()
        joined = reviews.llm.join(movies, template, backend="fake", **block)
        secs = time.perf_counter() - t0
        stats = last_op()
        assert stats is not None
        out.append(
            {
                "workload": f"reviews x movies, embedding top-{k}",
                "order": jc.call.plan.reorder,
                "pairs": stats.counts["pairs"],
                "llm_calls": stats.llm_calls,
                "naive_calls": len(reviews) * len(movies),
                "matches": len(joined),
                "own_movie_recall": len(own & set(jc.pairs)) / len(own),
                "expected_prefix_reuse": jc.call.plan.expected_hit_rate,
                "prompt_tokens": stats.prompt_tokens,
                "cached_share": stats.cached_tokens / max(stats.prompt_tokens, 1),
                "fake_slots": 1,
                "seconds": secs,
            }
        )
    use(agree)
    template = "Do the reviews {left.review_content} and {right.review_content} agree?"
    plan = reviews.llm.plan(template, op="join", other=reviews, on="movie_title")
    t0 = time.perf_counter()
    joined = reviews.llm.join(reviews, template, on="movie_title", backend="fake")
    secs = time.perf_counter() - t0
    stats = last_op()
    assert stats is not None
    out.append(
        {
            "workload": "reviews x reviews, on=movie_title",
            "order": plan.reorder,
            "pairs": stats.counts["pairs"],
            "llm_calls": stats.llm_calls,
            "naive_calls": len(reviews) ** 2,
            "matches": len(joined),
            "expected_prefix_reuse": plan.expected_hit_rate,
            "prompt_tokens": stats.prompt_tokens,
            "cached_share": stats.cached_tokens / max(stats.prompt_tokens, 1),
            "fake_slots": 1,
            "seconds": secs,
        }
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    df = load(args.rows)
    topk = bench_topk(df, [1, 10, 100], args.seeds)
    print(f"topk on {len(df)} reviews (mean of {args.seeds} seeds; fake backend)")
    print(f"{'k':>5} {'LLM calls':>10} {'max':>7} {'relQueries':>10} {'naive':>9} {'ratio':>8}")
    for r in topk:
        print(
            f"{r['k']:>5} {r['llm_calls_mean']:>10,.0f} {r['llm_calls_max']:>7,} "
            f"{r['relqueries_mean']:>10.1f} {r['naive_calls']:>9,} {r['ratio']:>8.2%}"
        )
    join = bench_join(df)
    print(f"\njoin on {len(df)} reviews (fake backend)")
    print(
        f"{'workload':<36} {'order':<26} {'LLM calls':>10} {'naive':>10} "
        f"{'prefix reuse':>12} {'cached':>7}"
    )
    for r in join:
        recall = r.get("own_movie_recall")
        print(
            f"{r['workload']:<36} {r['order']:<26} {r['llm_calls']:>10,} {r['naive_calls']:>10,} "
            f"{r['expected_prefix_reuse']:>12.1%} {r['cached_share']:>7.1%}"
            + (f"  (own-movie recall {recall:.1%})" if isinstance(recall, float) else "")
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": len(df), "topk": topk, "join": join}, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
