"""Discrete-event simulator of an LLM engine.

Continuous batching, paged KV cache with prefix caching, preemption by
recompute, relQuery workloads (:mod:`semframe.serving.sim.workload`).
"""

from __future__ import annotations

from semframe.serving.sim.engine import RelTimeline, SimRequest, SimResult, simulate
from semframe.serving.sim.kv import KVCache, block_hashes

__all__ = ["KVCache", "RelTimeline", "SimRequest", "SimResult", "block_hashes", "simulate"]
