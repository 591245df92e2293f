"""executor="ray": measured on this machine, and simulated at scale.

**Measured** (a local Ray cluster on this machine's cores): a movies-shaped
``map`` on the fake backend with a per-request delay (a stand-in for a model's
latency; each replica has one slot whose prefix cache holds its previous
prompt), with 1, 2 and 4 replicas:

* ``semframe``: ``df.llm.map(..., executor="ray", replicas=N)``: planned once
  (GGR), whole prefix groups per replica;
* ``ray-data``: what a user writes without semframe: Ray Data ``map_batches``
  over the rows in file order, ``N`` actors each owning the same fake backend,
  prompts rendered with the movie first (the field order GGR picks, the best a
  user could write by hand) and sent in file order.

Reported: wall time and the share of prompt tokens served from the replicas'
prefix caches. On GPUs the same comparison runs with a vLLM engine per replica
(``--measured-only --backend vllm --model DIR``; ``benchmarks/gpu/ray_vllm.sh``).

Then the Ray path's own overhead: the same ``map`` on the fake backend without
a delay (``--overhead-rows``, 200,000 by default), in process
against ``executor="ray"`` with 1 and 2 replicas, medians of 3 alternating
rounds, in seconds per million rows (target: at most 5).

**Simulated** (no engine): a 10-million-row movies-shaped relQuery (150,000
movies of Zipf-like popularity, each with its description, a review type and
its reviews) on 8, 16, 32 and 64 replicas, each with an unbounded prefix cache
(a prefix is paid once per replica it lands on):

* ``prefix-aware``: :func:`semframe.serving.partition.assign`, the rule the
  Ray executor uses (whole groups, LPT, split at sub-prefixes only when needed);
* ``round-robin``: the GGR-ordered requests dealt out one by one;
* ``file-order blocks``: the rows in file order, cut into ``N`` contiguous blocks.

Work per replica = prompt characters it must prefill (uncached) + 400 per
request (decode and overhead, as the executor assumes); makespan = the largest,
compared with the single-engine work divided by ``N``.

    python benchmarks/ray_scale.py                 # both parts
    python benchmarks/ray_scale.py --skip-measured # simulation only
    python benchmarks/ray_scale.py --rows 1000000  # a smaller simulation
    python benchmarks/ray_scale.py --overhead-only # the Ray path's own overhead

Writes ``benchmarks/results/ray_scale.json`` and the plot
``docs/img/ray_scale.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import semframe
from semframe.backends import register_backend
from semframe.backends.fake import FakeBackend
from semframe.core.wire import Request
from semframe.runtime import ray_executor
from semframe.serving.partition import Unit, assign, replica_cache

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "ray_scale.json"
PLOT = ROOT / "docs" / "img" / "ray_scale.png"
PER_REQUEST = ray_executor.PER_REQUEST_CHARS
TEMPLATE = (
    "Read the critic's review {review} of the film {movie_title} ({movie_info}), "
    "marked {review_type}. Answer with one sentence on what the critic liked."
)

# ---------------------------------------------------------------- measured


def movies_frame(rows: int, movies: int, seed: int = 0) -> pd.DataFrame:
    """A movies-shaped frame in file order (reviews shuffled across movies)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, movies + 1) ** 0.8
    movie = rng.choice(movies, size=rows, p=weights / weights.sum())
    words = [
        "tense",
        "brilliant",
        "slow",
        "moving",
        "funny",
        "dull",
        "bold",
        "tender",
        "loud",
        "strange",
    ]
    info = {
        m: f"Film {m}: " + " ".join(words[(m * 7 + k) % len(words)] for k in range(70))
        for m in range(movies)
    }
    return pd.DataFrame(
        {
            "movie_title": [f"Movie number {m}" for m in movie],
            "movie_info": [info[m] for m in movie],
            "review_type": rng.choice(["Fresh", "Rotten"], size=rows, p=[0.6, 0.4]),
            "review": [f"review {i}: " + " ".join(rng.choice(words, size=20)) for i in range(rows)],
        }
    )


def slow_fake(delay: float) -> Any:
    def create(model: str | None, settings: Any) -> FakeBackend:
        return FakeBackend(model=model or "fake-model", delay=delay)

    return create


@dataclass(frozen=True)
class Target:
    """The backend both sides run, and what each replica reserves.

    ``slow-fake`` (the CPU run): the fake backend with ``delay`` seconds per
    request, one request at a time per replica (one slot). ``vllm`` (the GPU
    run, ``benchmarks/gpu/ray_vllm.sh``): a vLLM engine per replica, one GPU
    each, ``concurrency`` requests in flight on both sides.
    """

    backend: str = "slow-fake"
    model: str | None = None
    settings: tuple[tuple[str, Any], ...] = ()
    delay: float = 0.01
    num_cpus: float = 0.1
    num_gpus: float = 0.0
    concurrency: int = 1
    max_tokens: int = 64

    def backend_settings(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "truncated": "keep", **dict(self.settings)}

    def build(self) -> Any:
        """The backend, in the calling process (a Ray Data actor)."""
        from semframe.backends import get_backend

        if self.backend == "slow-fake":
            register_backend("slow-fake", slow_fake(self.delay))
        return get_backend(self.backend, model=self.model, settings=self.backend_settings())


def run_semframe(df: pd.DataFrame, replicas: int, target: Target) -> dict[str, Any]:
    settings = {
        "backend": target.backend,
        "model": target.model,
        "cache": False,
        "progress": "off",
        "executor": "ray",
        "replicas": replicas,
        "ray_num_cpus": target.num_cpus,
        "ray_num_gpus": target.num_gpus,
        **target.backend_settings(),
    }
    df.iloc[:4].llm.map(TEMPLATE, **settings)  # start the replicas (not timed)
    start = time.perf_counter()
    df.llm.map(TEMPLATE, **settings)
    wall = time.perf_counter() - start
    stats = semframe.last_run()
    assert stats is not None
    return {
        "method": "semframe",
        "replicas": replicas,
        "wall_s": wall,
        "cached_share": stats.cached_share,
        "per_replica_rows": [r.rows for r in stats.replicas],
    }


def run_ray_data(df: pd.DataFrame, replicas: int, target: Target) -> dict[str, Any]:
    """Ray Data map_batches in file order, prompts with the movie first, same backend."""
    import ray

    head = TEMPLATE.replace("{", "[").replace("}", "]") + "\n\n"
    prompts = [
        f"{head}movie_title: {r.movie_title}\nmovie_info: {r.movie_info}\n"
        f"review_type: {r.review_type}\nreview: {r.review}\n"
        for r in df.itertuples()
    ]

    class Engine:
        def __init__(self) -> None:
            self.backend = target.build()

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            requests = [
                Request(int(i), int(i), str(p), None, target.max_tokens, 0.0, None, 0)
                for i, p in zip(batch["i"], batch["prompt"], strict=True)
            ]
            if target.concurrency > 1:  # the batch in flight at once, as an engine is fed
                with ThreadPoolExecutor(target.concurrency) as pool:
                    done = list(pool.map(self.backend.complete, requests))
            else:
                done = [self.backend.complete(r) for r in requests]
            return {
                "cached": np.array([c.usage.cached_tokens for c in done]),
                "total": np.array([c.usage.prompt_tokens for c in done]),
            }

    ds = ray.data.from_items([{"i": i, "prompt": p} for i, p in enumerate(prompts)])
    ds = ds.repartition(replicas * 4)  # blocks in file order
    start = time.perf_counter()
    out = ds.map_batches(
        Engine,
        concurrency=replicas,
        batch_size=None,
        num_cpus=target.num_cpus,
        num_gpus=target.num_gpus,
    ).to_pandas()
    wall = time.perf_counter() - start
    del ds
    gc.collect()  # let Ray Data release its actors before the next run
    return {
        "method": "ray-data",
        "replicas": replicas,
        "wall_s": wall,
        "cached_share": float(out["cached"].sum() / out["total"].sum()),
    }


def measured(rows: int, movies: int, target: Target, counts: Sequence[int]) -> dict[str, Any]:
    import ray

    if target.backend == "slow-fake":
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        register_backend("slow-fake", slow_fake(target.delay))
    else:
        ray.init(include_dashboard=False, log_to_driver=False)  # every GPU of the machine
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    df = movies_frame(rows, movies)
    out: list[dict[str, Any]] = []
    if target.num_gpus == 0:  # in process (a GPU run's driver holds no GPU)
        start = time.perf_counter()
        df.llm.map(
            TEMPLATE,
            backend=target.backend,
            model=target.model,
            cache=False,
            progress="off",
            **target.backend_settings(),
        )
        local = semframe.last_run()
        assert local is not None
        out.append(
            {
                "method": "in-process",
                "replicas": 1,
                "wall_s": time.perf_counter() - start,
                "cached_share": local.cached_share,
            }
        )
    for n in counts:
        out.append(run_semframe(df, n, target))
        ray_executor.shutdown_replicas()
        out.append(run_ray_data(df, n, target))
        print(out[-2], "\n", out[-1], flush=True)
    ray_executor.shutdown_replicas()
    ray.shutdown()
    return {
        "rows": rows,
        "movies": movies,
        "backend": target.backend,
        "model": target.model,
        "delay_s": target.delay if target.backend == "slow-fake" else None,
        "runs": out,
    }


def overhead(rows: int, repeats: int) -> dict[str, Any]:
    """The Ray path's own cost: a fake-backend ``map`` in process vs ``executor="ray"``.

    The fake answers at once, so the difference is what the Ray path adds:
    shipping shards to the replicas, streaming answers back, and the replicas'
    own executors beside the driver. The replicas are started first (not
    timed); the three calls alternate, ``repeats`` rounds, medians.
    """
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    df = movies_frame(rows, max(24, rows // 60))
    base = {"backend": "fake", "cache": False, "progress": "off"}
    configs = {
        "in-process": base,
        "ray, 1 replica": {**base, "executor": "ray", "replicas": 1, "ray_num_cpus": 0.5},
        "ray, 2 replicas": {**base, "executor": "ray", "replicas": 2, "ray_num_cpus": 0.5},
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, settings in configs.items():
            df.iloc[:8].llm.map(TEMPLATE, **settings)  # the replicas of this count up
            gc.collect()
            start = time.perf_counter()
            out = df.llm.map(TEMPLATE, **settings)
            times[name].append(time.perf_counter() - start)
            assert out["llm_output"].notna().all()
            del out
            print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
    ray_executor.shutdown_replicas()
    ray.shutdown()
    med = {name: float(np.median(t)) for name, t in times.items()}
    return {
        "rows": rows,
        "repeats": repeats,
        "seconds": times,
        "median_s": med,
        "overhead_s_per_million_rows": {
            name: (med[name] - med["in-process"]) * 1e6 / rows
            for name in configs
            if name != "in-process"
        },
    }


# ---------------------------------------------------------------- simulated


class Movies:
    """A movies-shaped relQuery in GGR order, as arrays (no prompts are built)."""

    def __init__(self, rows: int, movies: int, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, movies + 1) ** 1.0
        counts = rng.multinomial(rows, weights / weights.sum())
        counts = counts[counts > 0]
        self.movies = len(counts)
        self.head = 600  # instructions and the output format
        self.movie_chars = rng.integers(250, 900, size=self.movies)  # title + description
        self.type_chars = 20  # "review_type: Fresh\n"
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self.movie_of = np.repeat(np.arange(self.movies), counts)  # GGR order: by movie
        fresh = rng.binomial(counts, 0.6)
        self.type_split = self.starts[:-1] + fresh  # Fresh rows first within a movie
        self.review = rng.integers(80, 400, size=rows)  # each review's own characters
        self.cum_review = np.concatenate([[0], np.cumsum(self.review)])
        self.rows = rows
        self.file_order = rng.permutation(rows)  # a file sorted by review date, say

    def review_sum(self, a: int, b: int) -> int:
        return int(self.cum_review[b] - self.cum_review[a])

    def units(self) -> list[Unit]:
        out = []
        for m in range(self.movies):
            a, b = int(self.starts[m]), int(self.starts[m + 1])
            rest = self.review_sum(a, b) + self.type_chars * (b - a)
            chain = ((1, a, int(self.movie_chars[m])),) if b - a > 1 else ()
            mid = int(self.type_split[m])
            runs = int(mid > a) + int(b > mid)
            reuse = self.type_chars * (b - a - runs)  # a type run's rows after its first
            rest += 0 if chain else int(self.movie_chars[m])
            out.append(Unit(a, b, chain, rest, reuse))
        return out

    def split(self, unit: Unit) -> tuple[tuple[Unit, ...], bool] | None:
        if len(unit) < 2:
            return None
        if unit.depth == 1:  # a movie: its Fresh and Rotten runs
            mid = int(self.type_split[self.movie_of[unit.start]])
            pieces = []
            for a, b in ((unit.start, mid), (mid, unit.stop)):
                if b > a:
                    chain = (*unit.chain, (2, a, self.type_chars)) if b - a > 1 else unit.chain
                    extra = 0 if b - a > 1 else self.type_chars
                    pieces.append(Unit(a, b, chain, self.review_sum(a, b) + extra))
            if len(pieces) >= 2:
                return tuple(pieces), True
            unit = pieces[0]
        rows = tuple(
            Unit(i, i + 1, unit.chain, self.review_sum(i, i + 1))
            for i in range(unit.start, unit.stop)
        )
        return rows, False

    def single_engine(self) -> tuple[int, int]:
        """(prompt characters, cached characters) on one engine."""
        per_row_shared = self.head + self.movie_chars[self.movie_of] + self.type_chars
        prompt = int(per_row_shared.sum() + self.review.sum())
        paid = self.head + int(self.movie_chars.sum()) + self.review.sum()
        paid += self.type_chars * self.movies * 2  # two type runs per movie
        return prompt, prompt - int(paid)

    def spread(self, replica_of_row: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per replica (prompt, paid) characters when rows go to ``replica_of_row``."""
        movie = self.movie_of
        fresh = np.arange(self.rows) < self.type_split[movie]
        prompt = np.bincount(
            replica_of_row,
            weights=self.head + self.movie_chars[movie] + self.type_chars + self.review,
            minlength=n,
        )
        paid = np.bincount(replica_of_row, weights=self.review, minlength=n) + self.head
        pairs = np.unique(replica_of_row.astype(np.int64) * self.movies + movie)
        paid += np.bincount(
            pairs // self.movies, weights=self.movie_chars[pairs % self.movies], minlength=n
        )
        runs = np.unique((replica_of_row.astype(np.int64) * self.movies + movie) * 2 + fresh)
        paid += np.bincount(runs // 2 // self.movies, minlength=n) * self.type_chars
        return prompt, paid


def simulate(rows: int, movies: int, counts: Sequence[int]) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = Movies(rows, movies)
    prompt1, cached1 = data.single_engine()
    single_share = cached1 / prompt1
    single_work = (prompt1 - cached1) + PER_REQUEST * rows
    units = data.units()
    print(f"simulated table built in {time.perf_counter() - t0:.1f} s", flush=True)
    out: list[dict[str, Any]] = []
    for n in counts:
        ideal = single_work / n
        rows_per = np.full(n, rows // n) + (np.arange(n) < rows % n)
        t = time.perf_counter()
        part = assign(units, n, data.split, per_request=PER_REQUEST)
        took = time.perf_counter() - t
        figures = replica_cache(part.units, data.head)
        shard_rows = np.array([sum(len(u) for u in us) for us in part.units])
        work = np.array(figures.prompt) - np.array(figures.cached) + PER_REQUEST * shard_rows
        out.append(
            _row("prefix-aware", n, figures.cached_share, work, ideal=ideal, single=single_share)
            | {"seconds": took, "splits": part.splits, "row_splits": part.row_splits}
        )
        rr = np.arange(rows) % n
        prompt, paid = data.spread(rr, n)
        work = paid + PER_REQUEST * np.bincount(rr, minlength=n)
        out.append(
            _row(
                "round-robin",
                n,
                1 - paid.sum() / prompt.sum(),
                work,
                ideal=ideal,
                single=single_share,
            )
        )
        block = np.empty(rows, dtype=np.int64)
        block[data.file_order] = np.repeat(np.arange(n), rows_per)
        prompt, paid = data.spread(block, n)
        work = paid + PER_REQUEST * rows_per
        out.append(
            _row(
                "file-order blocks",
                n,
                1 - paid.sum() / prompt.sum(),
                work,
                ideal=ideal,
                single=single_share,
            )
        )
        for r in out[-3:]:
            print(
                f"  N={n:>2} {r['method']:<18} cached {r['cached_share']:.1%} "
                f"({r['of_single']:.1%} of one engine), makespan {r['makespan_over_ideal']:.3f} "
                "x work/N",
                flush=True,
            )
    return {
        "rows": rows,
        "movies": data.movies,
        "single_engine_cached_share": single_share,
        "per_request_chars": PER_REQUEST,
        "runs": out,
    }


def _row(
    method: str, n: int, share: float, work: np.ndarray, *, ideal: float, single: float
) -> dict[str, Any]:
    return {
        "method": method,
        "replicas": n,
        "cached_share": float(share),
        "of_single": float(share / single),
        "makespan_over_ideal": float(work.max() / ideal),
        "imbalance": float(work.max() / work.mean()),
    }


# ---------------------------------------------------------------- report


def plot(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = result["simulated"]
    fig, axes = plt.subplots(1, 3 if "measured" in result else 2, figsize=(15, 4.2))
    methods = ["prefix-aware", "round-robin", "file-order blocks"]
    for method in methods:
        runs = [r for r in sim["runs"] if r["method"] == method]
        xs = [r["replicas"] for r in runs]
        axes[0].plot(xs, [r["cached_share"] for r in runs], marker="o", label=method)
        axes[1].plot(xs, [r["makespan_over_ideal"] for r in runs], marker="o", label=method)
    axes[0].axhline(sim["single_engine_cached_share"], color="grey", ls="--", label="one engine")
    axes[0].set(
        xscale="log",
        xlabel="replicas",
        ylabel="cached share of prompt characters",
        title=f"simulated: {sim['rows']:,} rows, {sim['movies']:,} movies",
    )
    axes[1].axhline(1.1, color="grey", ls=":", label="target: 1.10")
    axes[1].set(
        xscale="log",
        xlabel="replicas",
        ylabel="makespan / (one engine's work / N)",
        title="simulated makespan",
    )
    for ax in axes[:2]:
        ax.minorticks_off()
        ax.set_xticks([8, 16, 32, 64], ["8", "16", "32", "64"])
        ax.legend(fontsize="small")
    if "measured" in result:
        runs = result["measured"]["runs"]
        for method in ("semframe", "ray-data"):
            mine = [r for r in runs if r["method"] == method]
            axes[2].plot(
                [r["replicas"] for r in mine],
                [r["wall_s"] for r in mine],
                marker="o",
                label=f"{method} (cached {np.mean([r['cached_share'] for r in mine]):.0%})",
            )
        axes[2].set(
            xlabel="replicas",
            ylabel="wall seconds",
            title=f"measured here: {result['measured']['rows']} rows, fake backend "
            f"{result['measured']['delay_s'] * 1000:.0f} ms/request",
        )
        axes[2].legend(fontsize="small")
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--movies", type=int, default=150_000)
    parser.add_argument("--measured-rows", type=int, default=600)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument(
        "--skip-measured",
        action="store_true",
        help="redo the simulation only (keep the measured part of the last results)",
    )
    parser.add_argument(
        "--overhead-rows",
        type=int,
        default=200_000,
        help="rows of the Ray path's overhead measurement (fake backend, no delay)",
    )
    parser.add_argument(
        "--overhead-only",
        action="store_true",
        help="redo the overhead measurement only (keep the rest of the last results)",
    )
    parser.add_argument(
        "--backend",
        default="slow-fake",
        help="backend of the measured part: slow-fake (CPU) or vllm (a GPU per replica)",
    )
    parser.add_argument("--model", default=None, help="model of --backend vllm (a local path)")
    parser.add_argument(
        "--replica-counts",
        default="1,2,4",
        help="replica counts of the measured part, e.g. 1,2,4,8",
    )
    parser.add_argument("--vllm-args", default="{}", help="JSON engine arguments of --backend vllm")
    parser.add_argument("--concurrency", type=int, default=64, help="--backend vllm: in flight")
    parser.add_argument(
        "--measured-only", action="store_true", help="the measured part only (a GPU run)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON --measured-only writes")
    args = parser.parse_args()
    counts = tuple(int(x) for x in args.replica_counts.split(","))
    target = Target(delay=args.delay)
    if args.backend != "slow-fake":
        target = Target(
            args.backend,
            args.model,
            (("vllm_args", json.loads(args.vllm_args)), ("max_concurrency", args.concurrency)),
            num_cpus=1.0,
            num_gpus=1.0,
            concurrency=args.concurrency,
        )
    if args.measured_only:
        run = measured(args.measured_rows, max(24, args.measured_rows // 25), target, counts)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"measured": run}, indent=2) + "\n")
        for r in run["runs"]:
            wall, share = r["wall_s"], r["cached_share"]
            print(f"  {r['method']:<11} N={r['replicas']}  {wall:8.2f} s  {share:.1%}")
        print(f"\nwrote {args.out}")
        return
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {platform.processor() or ''}"}
    if args.overhead_only:
        result = json.loads(RESULTS.read_text()) if RESULTS.exists() else result
        result["overhead"] = overhead(args.overhead_rows, 3)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        _print_overhead(result["overhead"])
        return
    if not args.skip_measured:
        result["measured"] = measured(args.measured_rows, 24, target, counts)
    elif RESULTS.exists() and "measured" in (last := json.loads(RESULTS.read_text())):
        result["measured"] = last["measured"]
    if not args.skip_measured:
        result["overhead"] = overhead(args.overhead_rows, 3)
    elif RESULTS.exists() and "overhead" in (last := json.loads(RESULTS.read_text())):
        result["overhead"] = last["overhead"]
    result["simulated"] = simulate(args.rows, args.movies, (8, 16, 32, 64))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    plot(result)
    if "measured" in result:
        print("\nmeasured (wall s, cached share):")
        for r in result["measured"]["runs"]:
            print(
                f"  {r['method']:<11} N={r['replicas']}  {r['wall_s']:6.2f} s  "
                f"{r['cached_share']:.1%}"
            )
    if "overhead" in result:
        _print_overhead(result["overhead"])
    print(f"\nwrote {RESULTS.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


def _print_overhead(o: dict[str, Any]) -> None:
    print(
        f"\nthe Ray path's overhead, fake backend, {o['rows']:,} rows (medians of {o['repeats']}):"
    )
    for name, sec in o["median_s"].items():
        extra = o["overhead_s_per_million_rows"].get(name)
        more = "" if extra is None else f"  (+{extra:.1f} s per million rows; target <= 5)"
        print(f"  {name:<16} {sec:6.2f} s{more}")


if __name__ == "__main__":
    main()
