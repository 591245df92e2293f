"""Our scheduler inside a real vLLM engine (the CPU build), against the simulator.

1. **Policies on a real engine.** A RelServe-shaped stream of relQueries over
   ``movies_small.csv`` and ``contributions.csv`` (task types, instructions and
   fields of :mod:`semframe.serving.sim.workload`; sizes, output limits and rate scaled
   down to what a CPU serves in minutes) is replayed on vLLM with our
   scheduler, once per policy: FCFS, static priority (vLLM-SP), RelServe and
   k-LPM. Each relQuery's requests arrive together, tagged with its identity and
   size; its latency is arrival to last token. One engine per policy, each
   warmed up before the stream starts.
2. **Calibration and prediction.** The FCFS run's scheduler trace (one line per
   engine step: prefill chunks, decode contexts, step time) is fitted to the
   simulator's cost models; RelServe and static priority then run with the
   fitted predictor, and the simulator replays the same trace (same arrivals,
   real prompt tokens and block hashes, real output lengths, the engine's
   budgets) for every policy. The prediction error is reported.
3. **Prefix-cache hit rate, file order vs GGR**, on ``movies_small.csv``:
   one map over the same rows with ``reorder="none"`` and ``reorder="ggr"``
   (prefix cache reset in between); hit rate = cached / prompt tokens as vLLM
   reports them.

Usage: ``python benchmarks/vllm_relserve.py [--relqueries 12] [--rate 0.1]``
in an environment with vLLM (``make test-vllm`` builds ``.venv-vllm``). Prints
tables and writes ``benchmarks/results/vllm_relserve.json``. About 15 minutes on
2 cores. ``benchmarks/gpu/vllm_relserve.sh`` runs it at GPU scale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
POLICIES = ("fcfs", "static", "relserve", "k-lpm")


@dataclass
class Job:
    """One relQuery of the stream: when it arrives and its requests."""

    rel: str
    arrival: float
    template: str
    prompts: list[str]
    max_tokens: int
    finish: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)

    @property
    def latency(self) -> float:
        return max(self.finish) - self.arrival


def make_stream(n: int, rate: float, max_size: int, out_scale: float, seed: int) -> list[Job]:
    """RelServe's relQuery stream (:func:`semframe.serving.sim.workload.relserve_workload`'s
    recipe) with real prompt text, scaled for a CPU."""
    from semframe.serving.sim.workload import TASKS, load_tables, poisson_arrivals, render

    rng = np.random.default_rng(seed)
    tables = load_tables(DATA)
    names = sorted(tables)
    times = poisson_arrivals(n, rate, rng)
    jobs = []
    for q in range(n):
        table = names[int(rng.integers(len(names)))]
        task = TASKS[int(rng.integers(len(TASKS)))]
        _, instruction, fields = next(t for t in task.templates if t[0] == table)
        size = int(rng.integers(1, max_size + 1))
        rows = tables[table]
        offset = int(rng.integers(len(rows)))
        prompts = [render(instruction, fields, rows[(offset + k) % len(rows)]) for k in range(size)]
        jobs.append(
            Job(
                f"q{q}",
                float(times[q]),
                f"{task.name}:{table}",
                prompts,
                max(2, math.ceil(task.max_tokens * out_scale)),
            )
        )
    return jobs


# -- the real engine ------------------------------------------------------------------


def make_backend(
    policy: str, trace: Path, engine: dict[str, Any], cost: dict[str, float] | None, model: str
) -> Any:
    from semframe.backends.vllm import VllmBackend

    ours: dict[str, Any] = {"trace": str(trace), "options": {}}
    if policy == "k-lpm":
        ours["options"] = {"k": 2}
    if cost is not None and policy in {"relserve", "static"}:
        ours["cost"] = cost
    args = dict(engine)
    args["additional_config"] = {"semframe": ours}
    return VllmBackend(model, scheduler=policy, vllm_args=args, max_concurrency=1_000)


async def _replay(backend: Any, jobs: list[Job]) -> float:
    from semframe.backends.base import Request

    start = time.monotonic()
    tasks = []
    rid = 0

    async def one(job: Job, request: Request) -> None:
        completion = await backend.acomplete(request)
        job.finish.append(time.monotonic() - start)
        u = completion.usage
        job.prompt_tokens.append(u.prompt_tokens)
        job.cached_tokens.append(u.cached_tokens)
        job.output_tokens.append(u.output_tokens)

    for job in sorted(jobs, key=lambda j: j.arrival):
        delay = job.arrival - (time.monotonic() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        job.arrival = time.monotonic() - start  # when it really arrived
        for i, prompt in enumerate(job.prompts):
            request = Request(
                rid, i, prompt, None, job.max_tokens, 0.0, None, rid,
                rel=job.rel, rel_size=len(job.prompts),
            )  # fmt: skip
            rid += 1
            tasks.append(asyncio.ensure_future(one(job, request)))
    await asyncio.gather(*tasks)
    return time.monotonic() - start


def run_policy(
    policy: str,
    jobs: list[Job],
    engine: dict[str, Any],
    cost: Any,
    *,
    tmp: Path,
    model: str,
    tag: str = "",
) -> dict[str, Any]:
    from semframe.backends import aio as _aio
    from semframe.backends.base import Request

    trace = tmp / f"trace-{policy}{tag}.jsonl"
    backend = make_backend(policy, trace, engine, cost, model)
    t0 = time.monotonic()
    warm = [Request(i, i, f"Warm up {i}.", None, 8, 0.0, None, i) for i in range(4)]

    async def warm_up() -> None:
        await asyncio.gather(*(backend.acomplete(r) for r in warm))

    _aio.run(warm_up())  # engine start and the first batches' one-time kernel setup
    startup = time.monotonic() - t0
    with trace.open("a") as f:
        f.write(json.dumps({"marker": "stream"}) + "\n")
    wall = _aio.run(_replay(backend, jobs))
    cache_cfg = backend._engine.vllm_config.cache_config
    blocks = (int(cache_cfg.num_gpu_blocks or 0), int(cache_cfg.block_size))
    tok = backend.tokenizer()
    for job in jobs:
        job.prompt_ids = [
            list(tok.encode(backend.prompt(Request(0, 0, p, None, 1, 0.0, None, 0)),
                            add_special_tokens=False))
            for p in job.prompts
        ]  # fmt: skip
    backend.close()
    lat = [j.latency for j in jobs]
    from semframe.serving.vllm.trace import read_steps, samples

    steps = samples(read_steps(trace.read_text().splitlines(), after="stream"))
    prompt = sum(sum(j.prompt_tokens) for j in jobs)
    cached = sum(sum(j.cached_tokens) for j in jobs)
    return {
        "policy": policy,
        "avg_latency": statistics.fmean(lat),
        "median_latency": statistics.median(lat),
        "max_latency": max(lat),
        "wall_s": wall,
        "startup_s": startup,
        "hit_rate": cached / prompt if prompt else 0.0,
        "median_step_s": statistics.median(x.seconds for x in steps) if steps else float("nan"),
        "holds": sum(1 for line in trace.read_text().splitlines() if '"hold": true' in line),
        "trace": str(trace),
        "kv_blocks": blocks[0],
        "block_size": blocks[1],
        "latencies": lat,
    }


def _asdict(obj: Any) -> dict[str, float]:
    from dataclasses import asdict

    return asdict(obj)


def simulate_policies(jobs: list[Job], infer: Any, engine: dict[str, Any], block: int) -> dict:
    from semframe.serving.sched import Budgets, make_scheduler
    from semframe.serving.sched.base import BatchMode
    from semframe.serving.sched.cost import RelServeCost
    from semframe.serving.sim import SimRequest, simulate
    from semframe.serving.sim.kv import block_hashes

    budgets = Budgets(
        max_num_seqs=int(engine["max_num_seqs"]),
        max_num_batched_tokens=int(engine["max_num_batched_tokens"]),
        num_blocks=int(engine["_num_blocks"]),
        block_size=block,
        chunked_prefill=True,
    )
    t0 = min(j.arrival for j in jobs)
    out = {}
    rel_cost = RelServeCost(**engine["_relserve_cost"])
    for policy in POLICIES:
        reqs = []
        rid = 0
        for q, job in enumerate(jobs):
            for ids, n_out in zip(job.prompt_ids, job.output_tokens, strict=False):
                reqs.append(
                    SimRequest(
                        rid, q, len(job.prompts), job.template, len(ids), job.max_tokens,
                        job.arrival - t0, block_hashes(ids, block),
                        output_len=max(1, min(job.max_tokens, n_out)),
                    )
                )  # fmt: skip
                rid += 1
        options: dict[str, Any] = {}
        if policy in {"relserve", "static"}:
            options["cost"] = rel_cost
        if policy == "k-lpm":
            options["k"] = 2
        sched = make_scheduler(policy, **options)
        # vLLM V1's batches: running requests first, then admissions (RelServe's
        # one-step admission holds are not modelled in this replay)
        sched.mode = BatchMode.DECODE_FIRST
        res = simulate(reqs, sched, budgets=budgets, cost=infer)
        out[policy] = res.summary()
    return out


# -- reordering on the engine -----------------------------------------------------------


def hit_rates(rows: int, engine: dict[str, Any], model: str, tmp: Path) -> dict[str, Any]:
    """File order vs GGR on the engine, each with the estimator's prediction first
    (after calibrating the engine model once, into a scratch cache directory)."""
    import pandas as pd

    import semframe
    from semframe.backends import aio as _aio
    from semframe.backends import get_backend
    from semframe.backends import vllm as vb
    from semframe.backends.vllm import calibrate_vllm

    df = pd.read_csv(DATA / "movies_small.csv").head(rows)
    df = df.fillna("")
    template = (
        "Review: {review_content}\nMovie: {movie_title}\nSynopsis: {movie_info}\n"
        "Summarize the critic's opinion of the movie in ten words."
    )
    settings = {
        "backend": "vllm",
        "model": model,
        "vllm_scheduler": "fcfs",
        "vllm_args": dict(engine),
        "cache": False,
        "progress": "off",
        "cache_dir": str(tmp),
    }
    out: dict[str, Any] = {"rows": len(df)}
    with semframe.using(**settings):
        df.head(4).llm.map("Say hello to {movie_title}.", max_tokens=4)  # start the engine
        cfg = semframe.config()
    t0 = time.monotonic()
    engine_model = calibrate_vllm(get_backend("vllm", model=model, settings=cfg), tmp)
    out["calibration_s"] = time.monotonic() - t0
    out["engine_model"] = json.loads(engine_model.to_json())

    def reset() -> None:
        for backend in vb._backends.values():
            if backend._engine is not None:
                _aio.run(backend._engine.reset_prefix_cache())

    for method in ("none", "ggr"):
        with semframe.using(**settings):
            reset()
            est = df.llm.estimate(template, reorder=method, max_tokens=12, probe=8)
            reset()
            df.llm.map(template, reorder=method, max_tokens=12)
        stats = semframe.last_run()
        assert stats is not None
        out[method] = {
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
            "hit_rate": stats.cached_tokens / stats.prompt_tokens,
            "wall_s": stats.wall_seconds,
            "output_tokens": stats.output_tokens,
            "estimate": {
                "prompt_tokens": est.planned.input_tokens,
                "cached_tokens": est.planned.cached_tokens,
                "output_tokens": est.planned.output_tokens,
                "wall_s": est.planned.wall_seconds,
            },
        }
        for backend in vb._backends.values():  # same engine, cache emptied between orders
            engine_obj = backend._engine
            if engine_obj is not None:
                _aio.run(engine_obj.reset_prefix_cache())
    for backend in vb._backends.values():
        backend.close()
    return out


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--relqueries", type=int, default=12)
    ap.add_argument("--rate", type=float, default=0.1, help="relQueries per second")
    ap.add_argument("--max-size", type=int, default=10)
    ap.add_argument("--out-scale", type=float, default=0.25, help="x the tasks' output limits")
    ap.add_argument("--hit-rows", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-gib", type=int, default=1)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--repeats", type=int, default=2, help="rounds, alternating policy order")
    ap.add_argument("--parts", default="policies,hitrate", help="policies and/or hitrate")
    ap.add_argument("--model", default="smollm2-135m", help="known name or HF directory")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--vllm-args", default="{}", help="more engine arguments, as JSON")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_gib))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from semframe.serving.vllm import installed_version
    from semframe.serving.vllm.trace import calibrate_from_trace

    engine = {"max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens,
              **json.loads(args.vllm_args)}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="vllm-relserve-"))
    parts = [p for p in args.parts.split(",") if p]
    policies = [p for p in args.policies.split(",") if p] if "policies" in parts else []
    results: dict[str, Any] = {
        "config": {
            **vars(args),
            "engine": engine,
            "vllm": installed_version(),
            "cpu_count": os.cpu_count(),
        },
    }
    runs: dict[str, Any] = {}
    cost = None
    base_jobs = make_stream(args.relqueries, args.rate, args.max_size, args.out_scale, args.seed)
    jobs_by_policy: dict[str, list[Job]] = {}
    rounds: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for r in range(args.repeats):
        order = policies if r % 2 == 0 else list(reversed(policies))  # spread drift evenly
        if cost is None and "fcfs" in order:  # calibrate first: RelServe needs the fit
            order = ["fcfs"] + [p for p in order if p != "fcfs"]
        for policy in order:
            jobs = make_stream(args.relqueries, args.rate, args.max_size, args.out_scale, args.seed)
            print(f"round {r + 1}: running {policy} ...", flush=True)
            run = run_policy(policy, jobs, engine, cost, tmp=tmp, model=args.model, tag=str(r))
            rounds[policy].append(run)
            jobs_by_policy.setdefault(policy, jobs)
            if policy == "fcfs" and cost is None:
                cal = calibrate_from_trace(run["trace"], after="stream", source="fcfs run")
                cost = _asdict(cal.relserve)
                results["calibration"] = {
                    "samples": cal.num_samples,
                    "mean_rel_error": cal.mean_rel_error,
                    "infermax": _asdict(cal.infermax),
                    "relserve": cost,
                }
                print(
                    f"calibrated on {cal.num_samples} engine steps "
                    f"(mean error {cal.mean_rel_error:.1%})",
                    flush=True,
                )
    for policy, rs in rounds.items():
        runs[policy] = {
            "avg_latency": statistics.median(x["avg_latency"] for x in rs),
            "median_latency": statistics.median(x["median_latency"] for x in rs),
            "max_latency": statistics.median(x["max_latency"] for x in rs),
            "hit_rate": statistics.median(x["hit_rate"] for x in rs),
            "median_step_s": statistics.median(x["median_step_s"] for x in rs),
            "kv_blocks": rs[0]["kv_blocks"],
            "block_size": rs[0]["block_size"],
            "rounds": rs,
        }
    if runs:
        results["real"] = runs
    print()
    print(f"relQueries: {len(base_jobs)}, requests: {sum(len(j.prompts) for j in base_jobs)}")
    rows = []
    fcfs = runs.get("fcfs", {}).get("avg_latency")
    for p, r in runs.items():
        speedup = (fcfs / r["avg_latency"]) if fcfs else float("nan")
        each = " / ".join(f"{x['avg_latency']:.2f}" for x in r["rounds"])
        rows.append([p, r["avg_latency"], each, r["max_latency"], speedup, r["median_step_s"]])
    print(
        table(["policy", "avg latency s (median)", "per round", "max s", "vs fcfs", "step s"], rows)
    )

    if "fcfs" in runs and "calibration" in results:
        jobs = jobs_by_policy["fcfs"]
        block = int(runs["fcfs"]["block_size"])  # the engine's own KV layout
        engine_sim = dict(engine)
        engine_sim["_num_blocks"] = int(runs["fcfs"]["kv_blocks"])
        engine_sim["_relserve_cost"] = results["calibration"]["relserve"]
        from semframe.serving.sched.cost import InferMaxCost

        infer = InferMaxCost(**results["calibration"]["infermax"])
        sim = simulate_policies(jobs, infer, engine_sim, block)
        results["simulated"] = sim
        rows = []
        for p in runs:
            pred = sim[p]["avg_latency"]
            real = runs[p]["avg_latency"]
            rows.append([p, real, pred, abs(pred - real) / real])
        print()
        print(table(["policy", "measured avg s", "simulated avg s", "prediction error"], rows))

    if "hitrate" in parts:
        print("\nprefix-cache hit rate on movies_small.csv, file order vs GGR ...", flush=True)
        hr = hit_rates(args.hit_rows, engine, args.model, tmp)
        results["hit_rate"] = hr
        rows = []
        for m in ("none", "ggr"):
            e = hr[m]["estimate"]
            rows.append([
                m, hr[m]["prompt_tokens"], hr[m]["cached_tokens"], hr[m]["hit_rate"],
                e["cached_tokens"], hr[m]["wall_s"], e["wall_s"],
                abs(e["wall_s"] - hr[m]["wall_s"]) / hr[m]["wall_s"],
            ])  # fmt: skip
        print(table(
            ["order", "prompt tok", "cached tok", "hit rate", "est. cached", "wall s",
             "est. wall s", "wall error"],
            rows,
        ))  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "vllm_relserve.json"
    if set(parts) != {"policies", "hitrate"} and path.exists():  # one part: keep the other's
        old = json.loads(path.read_text())
        results[f"config_{'_'.join(parts)}"] = results.pop("config")
        results = {**old, **results}
    (RESULTS / "vllm_relserve.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS / 'vllm_relserve.json'}")


if __name__ == "__main__":
    main()
