"""Embedding operators: blocking recall, ANN search, throughput and memory, dedup quality.

Four measurements, each on this machine (2 CPU cores, no GPU):

- **join blocking recall, reviews x movies** (the data of ``benchmarks/operators.py``:
  the reviews with text among the first 1,000 rows of ``../shared/data/movies_small.csv``
  x its 51 movies; a review without text cannot be matched by any method): the
  share of reviews whose own movie is among the ``block_k`` candidates kept per review,
  for ``block_k`` = 1, 2 (<= 5% of all pairs) and 5, TF-IDF vs MiniLM, blocking on
  ``movie_info`` alone and on ``movie_title`` + ``movie_info``; and how many reviews
  name their movie's title at all.
- **search at 1M rows**: synthetic unit vectors (384 dimensions, 2,000 Gaussian clusters
  with noise, so that neighbours are neither trivial nor random), 200 queries drawn near
  the data: recall@10 of the usearch HNSW index against exact search, the index's query
  latency (one query at a time, median and p95), exact search's latency, the build time.
  ``--rows`` changes the size (``--quick``: 100,000).
- **embedding throughput**: MiniLM texts/second on the reviews (short) and the movie
  descriptions (long), 2 cores; peak memory of embedding, and bytes per row in memory
  (float32), in the embedding store (float16 in SQLite) and for TF-IDF (sparse rows)
  against the dense 4,096-float rows it replaced, all per million rows.
- **dedup with planted near-duplicates**: 600 distinct reviews plus 200 edited copies
  (case, punctuation, a dropped word, a typo, a word swapped); pairwise precision and
  recall of ``dedup`` at several thresholds, MiniLM and TF-IDF.
- **semframe's ``sim_join`` vs LOTUS's ``sem_sim_join``** (where the LOTUS environment
  ``.venv-lotus`` exists, as for ``benchmarks/vs_lotus.py``; skipped otherwise): the
  reviews x movies of the blocking part (right text: ``movie_title: movie_info``), the
  same all-MiniLM-L6-v2 weights on both sides (LOTUS: ``SentenceTransformersRM`` on torch
  with ``FaissVS``; semframe: its numpy encoder and exact search), each in a fresh process
  on the same 2 cores: seconds of the first call (a cold embedding store for semframe;
  LOTUS runs ``sem_index`` then ``sem_sim_join``), of a call for another ``k`` (semframe
  reads its stored vectors, LOTUS embeds again), own-movie recall and the pairs'
  agreement per ``k``, texts per second embedding the reviews, and peak RSS.

Prints a table, writes ``benchmarks/results/embeddings.json`` and draws
``benchmarks/results/embeddings.png`` (copied to ``docs/img``).

    python benchmarks/embeddings.py            # about 10 minutes (the 1M-row index)
    python benchmarks/embeddings.py --quick    # 100,000 rows for the search part
    python benchmarks/embeddings.py --vs-lotus-only   # redo the LOTUS comparison only
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import semframe
from semframe.backends.embedders import get_embedder
from semframe.cache.index import EXPANSION_SEARCH, build_index
from semframe.cache.vectors import VectorStore, embed_texts
from semframe.core.vectors import exact_top_k
from semframe.operators.embed import tfidf_rows
from semframe.operators.join import compile_join

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data" / "movies_small.csv"
RESULTS = HERE / "results" / "embeddings.json"
LOTUS_PYTHON = HERE.parent / ".venv-lotus" / "bin" / "python"
SIMJOIN_KS = (1, 2, 5)
PLOT = HERE / "results" / "embeddings.png"


def load(rows: int = 1000) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = pd.read_csv(DATA).head(rows)
    df["review_content"] = df["review_content"].fillna("")
    reviews = df.reset_index(drop=True)
    movies = (
        pd.read_csv(DATA)
        .drop_duplicates("movie_title")[["movie_title", "movie_info"]]
        .reset_index(drop=True)
    )
    return reviews, movies


def with_text(reviews: pd.DataFrame) -> pd.DataFrame:
    """The reviews that have text (the others cannot be matched to a movie by any method)."""
    return reviews[reviews["review_content"].str.strip() != ""].reset_index(drop=True)


def title_mentions(reviews: pd.DataFrame) -> float:
    """The share of ``reviews`` whose text names their movie (its title before any colon)."""
    named = [
        title.split(":")[0].strip().lower() in text.lower()
        for title, text in zip(reviews["movie_title"], reviews["review_content"], strict=True)
    ]
    return sum(named) / len(named)


def blocking(reviews: pd.DataFrame, movies: pd.DataFrame) -> list[dict[str, Any]]:
    titles = movies["movie_title"].tolist()
    own = {(i, titles.index(t)) for i, t in enumerate(reviews["movie_title"])}
    total = len(reviews) * len(movies)
    out = []
    for right in ("info", "title+info"):
        template = (
            "Does {review_content} fit the movie {movie_info}?"
            if right == "info"
            else "Does {review_content} fit {movie_title}: {movie_info}?"
        )
        for model in ("tfidf", "minilm"):
            for k in (1, 2, 5):
                t0 = time.perf_counter()
                jc = compile_join(
                    reviews[["review_content"]],
                    movies,
                    template,
                    backend="fake",
                    block="embedding",
                    block_k=k,
                    block_model=model,
                )
                secs = time.perf_counter() - t0
                out.append(
                    {
                        "model": model,
                        "right_text": right,
                        "block_k": k,
                        "pairs": len(jc.pairs),
                        "share_of_pairs": len(jc.pairs) / total,
                        "recall": len(own & set(jc.pairs)) / len(own),
                        "seconds": secs,
                    }
                )
    return out


def synthetic(n: int, dim: int, clusters: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    for start in range(0, n, step):
        m = min(step, n - start)
        block = centers[rng.integers(clusters, size=m)]
        block += 1.2 * rng.normal(size=(m, dim)).astype(np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        out[start : start + m] = block
    return out


def search(rows: int, queries: int = 200) -> dict[str, Any]:
    dim = 384
    data = synthetic(rows, dim, 2000, seed=0)
    rng = np.random.default_rng(1)
    picks = data[rng.integers(rows, size=queries)]
    q = picks + 0.5 * rng.normal(size=picks.shape).astype(np.float32) / np.sqrt(dim)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    t0 = time.perf_counter()
    truth, _ = exact_top_k(q, data, 10)
    exact_batch = time.perf_counter() - t0
    lat_exact = []
    for i in range(5):
        t0 = time.perf_counter()
        exact_top_k(q[i : i + 1], data, 10)
        lat_exact.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        index = build_index(data, ann="on", directory=Path(tmp), key="bench")
        build = time.perf_counter() - t0
        size = (Path(tmp) / "indexes" / "bench.usearch").stat().st_size
        t0 = time.perf_counter()
        loaded = build_index(data, ann="on", directory=Path(tmp), key="bench")
        load_secs = time.perf_counter() - t0
        assert loaded.kind == "ann (loaded)"
        curve = []
        for ef in sorted({32, 96, 256, 512, 1024, 2048, EXPANSION_SEARCH}):
            loaded.graph.expansion_search = ef
            lat = []
            found = []
            for i in range(queries):
                t0 = time.perf_counter()
                ids, _ = loaded.search(q[i : i + 1], 10)
                lat.append(time.perf_counter() - t0)
                found.append(ids[0])
            recall = float(
                np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
            )
            curve.append(
                {
                    "expansion_search": ef,
                    "recall_at_10": recall,
                    "latency_ms_median": 1000 * statistics.median(lat),
                    "latency_ms_p95": 1000 * float(np.percentile(lat, 95)),
                }
            )
    default = next(c for c in curve if c["expansion_search"] == EXPANSION_SEARCH)
    del index
    return {
        "rows": rows,
        "dim": dim,
        "queries": queries,
        "build_seconds": build,
        "load_seconds": load_secs,
        "index_bytes": size,
        "exact_latency_ms_median": 1000 * statistics.median(lat_exact),
        "exact_batch_seconds": exact_batch,
        "recall_at_10": default["recall_at_10"],
        "latency_ms_median": default["latency_ms_median"],
        "latency_ms_p95": default["latency_ms_p95"],
        "curve": curve,
    }


def throughput(reviews: pd.DataFrame, movies: pd.DataFrame) -> dict[str, Any]:
    model = get_embedder("minilm")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: dict[str, Any] = {}
    for name, texts in (
        ("reviews", [t for t in reviews["review_content"] if t]),
        ("movie_info", movies["movie_info"].fillna("").tolist() * 4),
    ):
        model.embed(texts[:20])  # warm up
        t0 = time.perf_counter()
        vectors = model.embed(texts)
        secs = time.perf_counter() - t0
        tokens = [len(x) for x in model.encoder.tokens(texts)]  # type: ignore[attr-defined]
        out[name] = {
            "texts": len(texts),
            "mean_word_pieces": statistics.mean(tokens),
            "texts_per_second": len(texts) / secs,
        }
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as tmp:
        texts = [t for t in reviews["review_content"] if t]
        with VectorStore(Path(tmp) / "e.sqlite") as store:
            embed_texts(model, texts, store=store)
        db = sqlite3.connect(Path(tmp) / "e.sqlite")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
        store_bytes = (Path(tmp) / "e.sqlite").stat().st_size / len(set(texts))
    (sparse,) = tfidf_rows([reviews["review_content"].tolist()])
    out["peak_rss_mib_embedding"] = rss1 / 1024
    out["rss_growth_mib_embedding"] = (rss1 - rss0) / 1024
    out["bytes_per_row"] = {
        "minilm_float32_in_memory": vectors.shape[1] * 4,
        "minilm_store_float16_sqlite": store_bytes,
        "tfidf_sparse": sparse.nbytes / sparse.n_rows,
        "tfidf_dense_before": 4096 * 4,
    }
    out["mib_per_million_rows"] = {k: v * 1e6 / 2**20 for k, v in out["bytes_per_row"].items()}
    return out


def perturb(text: str, rng: random.Random) -> str:
    words = text.split()
    kind = rng.choice(["case", "punct", "drop", "typo", "swap"])
    if kind == "case":
        return text.lower() if text != text.lower() else text.upper()
    if kind == "punct":
        return "".join(c for c in text if c.isalnum() or c.isspace())
    if kind == "drop" and len(words) > 4:
        del words[rng.randrange(len(words))]
    elif kind == "typo" and len(text) > 10:
        i = rng.randrange(len(text) - 1)
        return text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    elif kind == "swap" and len(words) > 4:
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def dedup(reviews: pd.DataFrame) -> list[dict[str, Any]]:
    rng = random.Random(0)
    pool = list(dict.fromkeys(t for t in pd.read_csv(DATA)["review_content"].dropna() if t))
    base = pool[:600]
    planted = rng.sample(range(len(base)), 200)
    texts = base + [perturb(base[i], rng) for i in planted]
    rng.shuffle(order := list(range(len(texts))))
    shuffled = [texts[i] for i in order]
    where = {orig: pos for pos, orig in enumerate(order)}
    truth = {
        tuple(sorted((where[i], where[600 + j]))) for j, i in enumerate(planted)
    }  # (original, copy) positions
    df = pd.DataFrame({"text": shuffled})
    out = []
    for model in ("minilm", "tfidf"):
        for threshold in (0.8, 0.85, 0.9, 0.95):
            t0 = time.perf_counter()
            res = df.llm.dedup("text", threshold=threshold, embed_model=model)
            secs = time.perf_counter() - t0
            groups: dict[int, list[int]] = {}
            for pos, c in enumerate(res["dup_cluster"]):
                groups.setdefault(int(c), []).append(pos)
            found = {(a, b) for g in groups.values() for a in g for b in g if a < b}
            hit = len(found & truth)
            out.append(
                {
                    "model": model,
                    "threshold": threshold,
                    "rows": len(df),
                    "planted_pairs": len(truth),
                    "found_pairs": len(found),
                    "precision": hit / len(found) if found else 1.0,
                    "recall": hit / len(truth),
                    "seconds": secs,
                }
            )
    return out


def simjoin_texts(reviews: pd.DataFrame, movies: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The left (review) and right (``title: info``) texts of the comparison with LOTUS."""
    right = (movies["movie_title"] + ": " + movies["movie_info"].fillna("")).tolist()
    return reviews["review_content"].tolist(), right


def semframe_simjoin(job: dict[str, Any]) -> dict[str, Any]:
    """What ``--simjoin-worker`` prints: semframe's sim_join per k, in a fresh process."""
    with tempfile.TemporaryDirectory() as store:
        semframe.configure(progress="off", cache_dir=store)
        left = pd.DataFrame({"review": job["left"], "_left": range(len(job["left"]))})
        right = pd.DataFrame({"movie": job["right"], "_right": range(len(job["right"]))})
        model = get_embedder("minilm")
        model.embed(job["left"][:16])  # warm up, as LOTUS's side does
        t0 = time.perf_counter()
        model.embed(job["left"])
        embed_left = time.perf_counter() - t0
        runs = []
        for k in job["ks"]:
            t0 = time.perf_counter()
            joined = left.llm.sim_join(right, "review", "movie", k=k, embed_model="minilm")
            seconds = time.perf_counter() - t0
            found = joined.dropna(subset=["_right"])
            pairs = sorted(
                {(int(a), int(b)) for a, b in zip(found["_left"], found["_right"], strict=True)}
            )
            runs.append({"k": k, "seconds": seconds, "pairs": pairs})
    return {
        "runs": runs,
        "embed_left_seconds": embed_left,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _worker(command: list[str], job: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        command, input=json.dumps(job), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        msg = f"{command[0]} failed ({done.returncode}): {done.stderr[-2000:]}"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def vs_lotus(reviews: pd.DataFrame, movies: pd.DataFrame) -> dict[str, Any] | None:
    """semframe's ``sim_join`` against LOTUS's ``sem_sim_join``; None without ``.venv-lotus``."""
    if not LOTUS_PYTHON.exists():
        print(
            "LOTUS comparison skipped: no .venv-lotus "
            "(python3 -m venv .venv-lotus && .venv-lotus/bin/pip install lotus-ai==1.2.4)"
        )
        return None
    from semframe.backends.embedders import minilm_path

    left, right = simjoin_texts(reviews, movies)
    titles = movies["movie_title"].tolist()
    own = {(i, titles.index(t)) for i, t in enumerate(reviews["movie_title"])}
    job = {
        "left": left,
        "right": right,
        "ks": list(SIMJOIN_KS),
        "model_zip": str(minilm_path()),
        "threads": 2,
    }
    sides = {
        "semframe": _worker([sys.executable, __file__, "--simjoin-worker"], job),
        "lotus": _worker([str(LOTUS_PYTHON), str(HERE / "lotus_simjoin.py")], job),
    }
    out: dict[str, Any] = {"reviews": len(left), "movies": len(right)}
    for name, side in sides.items():
        out[name] = {
            "texts_per_second": len(left) / side["embed_left_seconds"],
            "peak_rss_mib": side["peak_rss_mib"],
            "runs": [
                {
                    "k": r["k"],
                    "seconds": r["seconds"],
                    "pairs": len(r["pairs"]),
                    "recall": len(own & {tuple(p) for p in r["pairs"]}) / len(own),
                }
                for r in side["runs"]
            ],
        }
    out["agreement"] = [
        len({tuple(p) for p in a["pairs"]} & {tuple(p) for p in b["pairs"]})
        / max(1, len(b["pairs"]))
        for a, b in zip(sides["semframe"]["runs"], sides["lotus"]["runs"], strict=True)
    ]
    return out


def plot(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for model in ("tfidf", "minilm"):
        for right, style in (("info", "--"), ("title+info", "-")):
            pts = [
                r for r in result["blocking"] if r["model"] == model and r["right_text"] == right
            ]
            ax.plot(
                [100 * r["share_of_pairs"] for r in pts],
                [100 * r["recall"] for r in pts],
                style,
                marker="o",
                label=f"{model}, {right}",
            )
    ax.axvline(5, color="grey", lw=0.8)
    ax.axhline(90, color="grey", lw=0.8)
    ax.set(xlabel="% of all pairs kept", ylabel="own-movie recall %", title="join blocking")
    ax.legend(fontsize=8)
    ax = axes[1]
    s = result["search"]
    ax.plot(
        [c["latency_ms_median"] for c in s["curve"]],
        [c["recall_at_10"] for c in s["curve"]],
        marker="o",
    )
    for c in s["curve"]:
        ax.annotate(f"ef={c['expansion_search']}", (c["latency_ms_median"], c["recall_at_10"]))
    ax.axhline(0.95, color="grey", lw=0.8)
    ax.set(
        xlabel="median query latency (ms)",
        ylabel="recall@10 vs exact",
        title=f"usearch HNSW, {s['rows']:,} rows (exact: {s['exact_latency_ms_median']:.0f} ms)",
    )
    ax = axes[2]
    for model in ("minilm", "tfidf"):
        pts = [r for r in result["dedup"] if r["model"] == model]
        ax.plot([r["recall"] for r in pts], [r["precision"] for r in pts], marker="o", label=model)
        for r in pts:
            ax.annotate(str(r["threshold"]), (r["recall"], r["precision"]), fontsize=8)
    ax.set(xlabel="recall", ylabel="precision", title="dedup, planted near-duplicates")
    ax.legend()
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    shutil.copyfile(PLOT, HERE.parent / "docs" / "img" / PLOT.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows for the search part")
    parser.add_argument("--rows", type=int, default=None, help="rows of the search part")
    parser.add_argument(
        "--search-only", action="store_true", help="redo the search part only (keep the rest)"
    )
    parser.add_argument(
        "--blocking-only", action="store_true", help="redo the blocking part only (keep the rest)"
    )
    parser.add_argument(
        "--vs-lotus-only", action="store_true", help="redo the LOTUS comparison only"
    )
    parser.add_argument("--simjoin-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simjoin_worker:
        json.dump(semframe_simjoin(json.load(sys.stdin)), sys.stdout)
        return
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    store = tempfile.TemporaryDirectory()  # a fresh embedding store: first embeddings are real
    semframe.configure(progress="off", cache_dir=store.name)
    reviews, movies = load()
    result: dict[str, Any] = {"machine": {"cores": 2, "python": sys.version.split()[0]}}
    only = args.search_only or args.blocking_only or args.vs_lotus_only
    if only:
        result = json.loads(RESULTS.read_text())
    if args.vs_lotus_only:
        result["vs_lotus"] = vs_lotus(with_text(reviews), movies)
    elif not args.search_only:
        t0 = time.perf_counter()
        texts = with_text(reviews)
        result["blocking"] = blocking(texts, movies)
        result["blocking_reviews"] = len(texts)
        result["blocking_title_mentions"] = title_mentions(texts)
        print(f"blocking: {time.perf_counter() - t0:.0f} s", flush=True)
    if not only:
        result["vs_lotus"] = vs_lotus(with_text(reviews), movies)
        print("LOTUS comparison done", flush=True)
        result["throughput"] = throughput(reviews, movies)
        print("throughput done", flush=True)
        result["dedup"] = dedup(reviews)
        print("dedup done", flush=True)
    if not (args.blocking_only or args.vs_lotus_only):
        result["search"] = search(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    plot(result)
    print(
        f"\njoin blocking, reviews x movies ({result['blocking_reviews']:,} reviews with text"
        f" x 51; {result['blocking_title_mentions']:.0%} name their movie): own-movie recall"
    )
    print(f"{'model':8} {'right text':11} {'k':>2} {'% pairs':>8} {'recall':>7} {'s':>6}")
    for r in result["blocking"]:
        print(
            f"{r['model']:8} {r['right_text']:11} {r['block_k']:>2} "
            f"{100 * r['share_of_pairs']:7.1f}% {100 * r['recall']:6.1f}% {r['seconds']:6.1f}"
        )
    s = result["search"]
    print(f"\nsearch, {s['rows']:,} synthetic rows x {s['dim']} dims, {s['queries']} queries")
    print(
        f"HNSW build {s['build_seconds']:.0f} s ({s['index_bytes'] / 2**20:.0f} MiB, load "
        f"{s['load_seconds']:.2f} s); exact search {s['exact_latency_ms_median']:.0f} ms/query"
    )
    for c in s["curve"]:
        print(
            f"  ef={c['expansion_search']:>3}: recall@10 {c['recall_at_10']:.3f}, "
            f"median {c['latency_ms_median']:.2f} ms, p95 {c['latency_ms_p95']:.2f} ms"
        )
    t = result["throughput"]
    print("\nMiniLM throughput (2 cores, numpy)")
    for name in ("reviews", "movie_info"):
        x = t[name]
        print(
            f"  {name:10} {x['texts_per_second']:7.0f} texts/s "
            f"({x['mean_word_pieces']:.0f} word pieces on average)"
        )
    print(f"  peak RSS while embedding: {t['peak_rss_mib_embedding']:.0f} MiB")
    for k, v in t["mib_per_million_rows"].items():
        print(f"  {k:30} {v:8.0f} MiB per million rows")
    print("\ndedup, 800 rows with 200 planted near-duplicate pairs")
    for r in result["dedup"]:
        print(
            f"  {r['model']:7} threshold {r['threshold']:.2f}: precision {r['precision']:.3f} "
            f"recall {r['recall']:.3f} ({r['found_pairs']} pairs, {r['seconds']:.1f} s)"
        )
    v = result.get("vs_lotus")
    if v:
        print(
            f"\nsim_join vs LOTUS sem_sim_join, {v['reviews']} reviews x {v['movies']} movies "
            "(all-MiniLM-L6-v2 on both, fresh processes)"
        )
        print(f"{'':9} {'k':>2} {'seconds':>8} {'recall':>7} {'pairs':>6}")
        for name in ("semframe", "lotus"):
            for r in v[name]["runs"]:
                print(
                    f"{name:9} {r['k']:>2} {r['seconds']:8.2f} {100 * r['recall']:6.1f}% "
                    f"{r['pairs']:>6}"
                )
            print(
                f"{name:9} embedding {v[name]['texts_per_second']:.0f} texts/s, "
                f"peak RSS {v[name]['peak_rss_mib']:.0f} MiB"
            )
        agree = ", ".join(f"{a:.3f}" for a in v["agreement"])
        print(f"pairs found by both, share of LOTUS's, per k: {agree}")
    print(f"\nwrote {RESULTS.relative_to(HERE.parent)} and {PLOT.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
