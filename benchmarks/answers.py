"""How often the default local model answers filter and classify questions right.

Runs ``filter`` and ``classify`` on the held-out half of
``benchmarks/data/movies_sentiment_labeled_318.csv`` (hand-labeled movie
reviews: the rows at odd places, 159 of them) on the default backend, once
per way of deciding the answer:

- ``text``: the answer text (``calibrate=None``), what semframe did before;
- ``content-free``: the label probabilities, calibrated against content-free
  inputs, with the question restated after the fields (``calibrate="auto"``,
  the default on the local backend);
- ``labeled``: calibrated on 16 labeled rows of the other half (8 positive,
  8 negative), passed as ``calibrate=[...]``.

Every request is sent (``cache=False``). For each run it prints accuracy,
the share of rows answered yes (or "positive"), wall time, prompt tokens and
the cached share the engine reported, and writes them to
``benchmarks/results/answers.json``. Always answering yes scores the share
of positive rows (0.49 here).

With ``--map`` it runs three ``map`` templates over 30 of the held-out rows
(every fifth), once with the local backend's ``restate`` declaration
switched off (the instructions' ``[placeholders]``, no question after the
fields) and once as shipped, and counts answers that repeat a placeholder
(``[`` or a column name), answers that loop, and answers cut at
``max_tokens``, beside time, prompt tokens and cached share
(``benchmarks/results/answers_map.json``).

Usage::

    python benchmarks/answers.py            # the 159 held-out rows
    python benchmarks/answers.py --rows 40  # a quick look
    python benchmarks/answers.py --map      # map prompts, restated or not
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.backends import get_backend

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "movies_sentiment_labeled_318.csv"
OUT = HERE / "results" / "answers.json"
OUT_MAP = HERE / "results" / "answers_map.json"
MAPS = (
    "Give the sentiment of {review_content} in one word.",
    "Summarize {review_content} in one sentence.",
    "What does the review {review_content} say about the movie {movie_title}?",
)
ECHO = re.compile(r"\[|review_content|movie_title")
LOOP = re.compile(r"(\b\w+\b:? )\1{2,}|(\b\w+\b)(, \2){2,}")

FILTERS = {
    "question then field": "Is this review positive about the movie? {review_content}",
    "demo question": "Is the review {review_content} positive about the movie {movie_title}?",
}
CLASSIFY = "What is the sentiment of this review of {movie_title}? {review_content}"
LABELS = ["positive", "negative"]


def labeled_rows(calibration: pd.DataFrame, fields: list[str], op: str) -> list[dict[str, Any]]:
    """8 positive and 8 negative rows of the calibration half, first ones first."""
    rows = []
    for label in ("positive", "negative"):
        for rec in calibration[calibration.label == label].head(8).to_dict("records"):
            answer: object = label == "positive" if op == "filter" else label
            rows.append({**{f: rec[f] for f in fields}, "answer": answer})
    return rows


def run(
    op: str, name: str, template: str, held: pd.DataFrame, calibration: pd.DataFrame
) -> list[dict[str, Any]]:
    fields = [f for f in ("movie_title", "review_content") if "{" + f + "}" in template]
    truth = held.label == "positive"
    results = []
    for mode, calibrate in (
        ("text", None),
        ("content-free", "content_free"),
        ("labeled", labeled_rows(calibration, fields, op)),
    ):
        started = time.perf_counter()
        if op == "filter":
            kept = held.llm.filter(template, calibrate=calibrate, cache=False)
            said_yes = held.index.isin(kept.index)
        else:
            out = held.llm.classify(
                template, LABELS, out="sentiment", calibrate=calibrate, cache=False
            )
            said_yes = (out["sentiment"] == "positive").to_numpy()
        wall = time.perf_counter() - started
        stats = semframe.last_op()
        prompt = sum(r.prompt_tokens for r in stats.runs) if stats else 0
        cached = sum(r.cached_tokens for r in stats.runs) if stats else 0
        row = {
            "op": op,
            "template": name,
            "mode": mode,
            "rows": len(held),
            "accuracy": round(float((said_yes == truth).mean()), 4),
            "yes_rate": round(float(said_yes.mean()), 4),
            "wall_s": round(wall, 2),
            "prompt_tokens": prompt,
            "cached_share": round(cached / prompt, 4) if prompt else 0.0,
            "counts": dict(stats.counts) if stats else {},
        }
        results.append(row)
        print(
            f"{op:8s} {name:20s} {mode:12s} accuracy {row['accuracy']:.3f}  "
            f"yes {row['yes_rate']:.2f}  {wall:6.1f} s  prompt {prompt:,} tok  "
            f"cached {row['cached_share']:.1%}",
            flush=True,
        )
    return results


def run_maps(held: pd.DataFrame) -> list[dict[str, Any]]:
    """The ``map`` templates on 30 rows, restate off then on (the local backend's declaration)."""
    rows = held.iloc[::5].head(30)
    backend = get_backend("local", model=None, settings=semframe.config())
    shipped = backend.capabilities
    results = []
    try:
        for restate in (False, True):
            backend.capabilities = dataclasses.replace(shipped, restate=restate)
            for template in MAPS:
                started = time.perf_counter()
                out = rows.llm.map(
                    template, max_tokens=48, errors="keep", truncated="keep", cache=False
                )
                wall = time.perf_counter() - started
                stats = semframe.last_run()
                answers = [str(a) for a in out["llm_output"]]
                row = {
                    "template": template,
                    "restate": restate,
                    "rows": len(rows),
                    "placeholder_repeated": sum(bool(ECHO.search(a)) for a in answers),
                    "looping": sum(bool(LOOP.search(a)) for a in answers),
                    "cut": int(out["llm_output_truncated"].sum()),
                    "wall_s": round(wall, 2),
                    "prompt_tokens": stats.prompt_tokens if stats else 0,
                    "cached_share": round(stats.cached_tokens / stats.prompt_tokens, 4)
                    if stats and stats.prompt_tokens
                    else 0.0,
                    "answers": answers,
                }
                results.append(row)
                print(
                    f"restate {'on ' if restate else 'off'} {template[:44]:44s} "
                    f"placeholder {row['placeholder_repeated']:2d}  loops {row['looping']:2d}  "
                    f"cut {row['cut']:2d}  {wall:5.1f} s  prompt {row['prompt_tokens']:,} tok  "
                    f"cached {row['cached_share']:.1%}",
                    flush=True,
                )
    finally:
        backend.capabilities = shipped
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="held-out rows (default: all)")
    parser.add_argument("--map", action="store_true", help="map prompts, restated or not")
    args = parser.parse_args()
    data = pd.read_csv(DATA)
    data["review_content"] = data["review_content"].fillna("")
    calibration, held = data.iloc[::2], data.iloc[1::2]
    if args.map:
        results = run_maps(held)
        OUT_MAP.parent.mkdir(exist_ok=True)
        OUT_MAP.write_text(json.dumps({"machine": platform.platform(), "results": results}))
        print(f"wrote {OUT_MAP.relative_to(HERE.parent)}")
        return
    if args.rows:
        held = held.head(args.rows)
    print(f"{len(held)} held-out rows, {(held.label == 'positive').mean():.1%} positive")
    results = []
    for name, template in FILTERS.items():
        results += run("filter", name, template, held, calibration)
    results += run("classify", "sentiment", CLASSIFY, held, calibration)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "model": semframe.config().effective.get("model"),
                "always_yes": round(float((held.label == "positive").mean()), 4),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUT.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
