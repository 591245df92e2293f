"""What the estimator knows of a vLLM engine, and its prediction of a plan.

A vLLM engine is described by an :class:`EngineModel`: its budgets and KV
cache (blocks, block size) as the engine reported them, and batch times fitted
to its own steps (:func:`semframe.serving.vllm.trace.calibrate_from_trace`).
:func:`semframe.backends.vllm.calibrate_vllm` measures one once per machine
and model and stores it under the cache directory; the estimator then
predicts a plan's cached tokens and wall time by replaying it on semframe's
engine simulator
(:mod:`semframe.serving.sim`) with that model: the prefix cache has the engine's
capacity and block granularity, batches cost what the engine's steps cost.

The replay follows the executor's dispatch: each prefix group's first request
goes at once, the rest of the group when it has been answered (requests
admitted in the same engine step do not share KV blocks, in vLLM as in the
simulator). It runs in two passes: the leaders alone give each group's
release time, then everything.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semframe.serving.sched.base import BatchMode, Budgets
from semframe.serving.sched.cost import Calibration
from semframe.serving.sched.policies import make_scheduler
from semframe.serving.sim import SimRequest, simulate
from semframe.serving.sim.kv import block_hashes

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class EngineModel:
    """A calibrated vLLM engine: budgets, KV cache layout and batch-time fit.

    Attributes
    ----------
    calibration : Calibration
        Batch-time models fitted to the engine's steps.
    block_size : int
        Tokens per KV block (prefix hits are whole blocks).
    num_blocks : int
        KV blocks in the engine's cache.
    max_num_seqs : int
        Requests running at once.
    max_num_batched_tokens : int
        Tokens per step.
    measured_at : str
        When (UTC, ISO 8601) and on which machine it was measured.
    """

    calibration: Calibration
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    measured_at: str

    def budgets(self) -> Budgets:
        """The engine's limits as the simulator takes them (chunked prefill, as V1)."""
        return Budgets(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            chunked_prefill=True,
        )

    def to_json(self) -> str:
        """JSON text (see :meth:`from_json`)."""
        return json.dumps(
            {
                "calibration": json.loads(self.calibration.to_json()),
                "block_size": self.block_size,
                "num_blocks": self.num_blocks,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "measured_at": self.measured_at,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> EngineModel:
        """Read what :meth:`to_json` wrote."""
        d = json.loads(text)
        return cls(
            calibration=Calibration.from_json(json.dumps(d["calibration"])),
            block_size=int(d["block_size"]),
            num_blocks=int(d["num_blocks"]),
            max_num_seqs=int(d["max_num_seqs"]),
            max_num_batched_tokens=int(d["max_num_batched_tokens"]),
            measured_at=str(d["measured_at"]),
        )


def model_path(directory: str | Path, model: str) -> Path:
    """Where the engine model of ``model`` on this machine is stored.

    Examples
    --------
    >>> model_path("/c", "smollm2-135m").parent.as_posix()
    '/c/vllm'
    """
    name = _SAFE.sub("_", Path(model).name or model)
    machine = _SAFE.sub("_", f"{platform.node()}-{platform.machine()}")
    return Path(directory) / "vllm" / f"{name}-{machine}.json"


def load_engine_model(directory: str | Path, model: str) -> EngineModel | None:
    """The stored engine model, or None when this machine has not calibrated ``model``."""
    path = model_path(directory, model)
    try:
        return EngineModel.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError):
        return None


def store_engine_model(engine: EngineModel, directory: str | Path, model: str) -> Path:
    """Write ``engine`` where :func:`load_engine_model` finds it."""
    path = model_path(directory, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(engine.to_json() + "\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class Prediction:
    """The replay's figures for one plan."""

    prompt_tokens: int
    cached_tokens: int
    wall_seconds: float


def predict(
    prompts: Sequence[Sequence[int]],
    groups: Sequence[tuple[int, int]],
    output_tokens: float,
    engine: EngineModel,
    *,
    max_tokens: int | None = None,
) -> Prediction:
    """Replay a plan's requests on the simulator calibrated to ``engine``.

    Parameters
    ----------
    prompts : sequence of token sequences
        Each request's prompt tokens, in execution order (equal text must give
        equal tokens; the ids themselves need not be the model's).
    groups : sequence of (start, stop)
        Prefix groups over ``prompts`` (the executor's dispatch unit).
    output_tokens : float
        Expected output tokens per request.
    engine : EngineModel
        The calibrated engine.
    max_tokens : int, optional
        Output limit (default: ``output_tokens`` rounded up).

    Examples
    --------
    >>> from semframe.serving.sched.cost import InferMaxCost, RelServeCost
    >>> cal = Calibration(InferMaxCost(0.01, 1e-4, 0.0, 0.0, 0.0, 0.0),
    ...                   RelServeCost(1e-4, 0.01, 1e-4, 0.01), 10, 0.1, "example")
    >>> eng = EngineModel(cal, 4, 1000, 8, 512, "2026-01-01 example")
    >>> shared = list(range(40))
    >>> p = predict([shared + [100 + i] for i in range(6)], [(0, 6)], 4, eng)
    >>> p.prompt_tokens, p.cached_tokens  # 5 followers x 40 cached tokens
    (246, 200)
    """
    n = len(prompts)
    if n == 0:
        return Prediction(0, 0, 0.0)
    out = max(1, round(output_tokens))
    limit = max(out, max_tokens or out)
    budgets = engine.budgets()
    hashes = [block_hashes(list(p), engine.block_size) for p in prompts]

    def requests(ids: Sequence[int], arrivals: Sequence[float]) -> list[SimRequest]:
        return [
            SimRequest(
                k, 0, len(ids), "plan", max(1, len(prompts[i])), limit, arrivals[k], hashes[i],
                output_len=out,
            )
            for k, i in enumerate(ids)
        ]  # fmt: skip

    def run(reqs: list[SimRequest]) -> Any:
        sched = make_scheduler("fcfs")
        sched.mode = BatchMode.DECODE_FIRST  # V1: running requests first, then admissions
        return simulate(reqs, sched, budgets=budgets, cost=engine.calibration.infermax)

    leaders = [start for start, _ in groups]
    first = run(requests(leaders, [0.0] * len(leaders)))
    release = {leaders[k]: r.t_finish for k, r in enumerate(first.requests)}
    order: list[int] = []
    arrivals: list[float] = []
    for start, stop in groups:
        for i in range(start, stop):
            order.append(i)
            arrivals.append(0.0 if i == start else release[start])
    final = run(requests(order, arrivals))
    total = sum(len(p) for p in prompts)
    cached = sum(r.num_cached for r in final.requests)
    return Prediction(total, cached, float(final.sim_time))
