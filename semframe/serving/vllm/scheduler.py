"""Our scheduler inside vLLM: ``scheduler_cls="semframe.serving.vllm.scheduler.SemframeScheduler"``.

This module imports vLLM (it is loaded by the engine process, never by
``import semframe``). :class:`SemframeScheduler` subclasses vLLM's V1
``Scheduler`` and changes two things:

1. **Admission order.** The waiting queue is a :class:`~semframe.serving.vllm.queue.PolicyQueue`
   driven by one of semframe's policies (:mod:`semframe.serving.sched.policies`):
   at the start of every step the policy sees the running requests, the
   prefix cache and the engine's budgets, updates its priorities (RelServe's
   Dynamic Priority Updater, k-LPM's prefix matches, ...) and orders the queue.
2. **Prefill or decode.** vLLM V1 builds one hybrid batch per step: running
   requests first, then admissions while the token budget lasts. When both
   running and waiting requests exist, the policy's
   :meth:`~semframe.serving.sched.base.Scheduler.prefer_prefill` (RelServe's Adaptive
   Batch Arranger) decides whether this step admits new requests or only
   decodes; "decode" holds admissions for one step (vLLM's ``PAUSED_NEW``
   state, restored right after).

relQuery identity reaches the scheduler per request in
``SamplingParams.extra_args`` (on a server: the request body's ``vllm_xargs``):
``semframe_rel`` (an id) and ``semframe_rel_size`` (its number of requests).
Requests without them are relQueries of one.

Options come from the engine's ``additional_config`` under ``"semframe"``
(``semframe serve`` fills it; in Python pass
``additional_config={"semframe": {...}}``)::

    {"policy": "relserve" | "k-lpm" | "lpm" | "static" | "fcfs" | ...,
     "options": {...},           # constructor options of the policy
     "cost": {"alpha_p": ..., "beta_p": ..., "alpha_d": ..., "beta_d": ...},
     "trace": "/path/trace.jsonl"}

The same JSON in the environment variable ``SEMFRAME_VLLM_SCHEDULER`` is used
when ``additional_config`` has no ``"semframe"`` entry.

``cost`` is the RelServe predictor calibrated on this engine
(:func:`semframe.serving.vllm.trace.calibrate_from_trace`); ``trace`` makes the
scheduler append one JSON line per step: when it ran, which requests
(and relQueries) were admitted, the batch's prefill and decode work, and the
policy's decision, which is how tests and benchmarks see admission order.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler

from semframe.serving.sched.base import Budgets, SchedContext, SchedRequest
from semframe.serving.sched.cost import RelServeCost
from semframe.serving.sched.policies import Policy, make_scheduler
from semframe.serving.vllm import check_version, installed_version
from semframe.serving.vllm.queue import PolicyQueue

REL_KEY = "semframe_rel"
REL_SIZE_KEY = "semframe_rel_size"

_COST_POLICIES = (Policy.RELSERVE, Policy.STATIC)


class _Queue(PolicyQueue, RequestQueue):  # type: ignore[misc]
    """:class:`PolicyQueue` registered as a vLLM ``RequestQueue``."""


class _Cache:
    """The :class:`~semframe.serving.sched.base.CacheView` of vLLM's prefix cache.

    Probes walk a request's block hashes through the block pool's hash table
    (no side effects: vLLM's own hit-rate statistics are not touched).
    """

    def __init__(self, sched: Scheduler, engine_requests: dict[str, Any]) -> None:
        self._pool = sched.kv_cache_manager.block_pool
        self._groups = list(range(len(sched.kv_cache_config.kv_cache_groups)))
        self._block = int(sched.block_size)
        self._engine = engine_requests

    def cached_prefix(self, req: SchedRequest) -> int:
        request = self._engine.get(str(getattr(req, "engine_id", "")))
        if request is None:
            return 0
        hits = 0
        for block_hash in request.block_hashes:
            if self._pool.get_cached_block(block_hash, self._groups) is None:
                break
            hits += 1
        return min(hits * self._block, req.prompt_len)

    probe_prefix = cached_prefix

    @property
    def num_free_blocks(self) -> int:
        free: int = self._pool.get_num_free_blocks()
        return free


class _Mirror(SchedRequest):
    """A :class:`SchedRequest` that remembers its engine request's id."""

    __slots__ = ("engine_id", "queued")
    queued: bool
    engine_id: str


class _SemframeMixin:
    """What both scheduler classes add to vLLM's (see the module docstring).

    It comes first in their bases, so ``super()`` here is vLLM's scheduler.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._semframe_init()

    def schedule(self, throttle_prefills: bool = False) -> Any:
        parent: Any = super()
        return self._semframe_schedule(parent.schedule, throttle_prefills)

    def _free_request(self, request: Any, delay_free_blocks: bool = False) -> Any:
        self._semframe_finished(request)
        parent: Any = super()
        return parent._free_request(request, delay_free_blocks)

    def _semframe_init(self) -> None:
        version = installed_version()
        if version is not None:
            check_version(version)
        sched: Any = self
        extra = sched.vllm_config.additional_config
        opts = dict(extra.get("semframe", {})) if isinstance(extra, dict) else {}
        env = os.environ.get("SEMFRAME_VLLM_SCHEDULER")
        if env and not opts:
            opts = json.loads(env)
        policy = Policy.parse(opts.get("policy", "fcfs"))
        options = dict(opts.get("options", {}))
        if "cost" in opts and policy in _COST_POLICIES:
            options["cost"] = RelServeCost(**opts["cost"])
        self.semframe_policy = make_scheduler(policy, **options)
        self._mirrors: dict[str, _Mirror] = {}
        self._rel_ids: dict[str, int] = {}
        self._rel_live: dict[str, int] = {}
        self._rel_counter = 0
        self._next_req = 0
        self._trace_path: str | None = opts.get("trace")
        self._trace = open(self._trace_path, "a", encoding="utf-8") if self._trace_path else None  # noqa: SIM115
        self._last_step: float | None = None
        sched.waiting = _Queue(self.semframe_policy, mirror=self._queued, key=_request_id)
        self._cache = _Cache(sched, sched.requests)
        cfg = sched.scheduler_config
        self._budgets = Budgets(
            max_num_seqs=int(cfg.max_num_seqs),
            max_num_batched_tokens=int(cfg.max_num_batched_tokens),
            num_blocks=int(sched.kv_cache_config.num_blocks),
            block_size=int(sched.block_size),
            chunked_prefill=bool(getattr(cfg, "enable_chunked_prefill", True)),
        )

    # -- mirrors -------------------------------------------------------------

    def _mirror(self, request: Any) -> _Mirror:
        m = self._mirrors.get(request.request_id)
        if m is not None:
            return m
        args = getattr(request.sampling_params, "extra_args", None) or {}
        rel_key = str(args.get(REL_KEY, f"req:{request.request_id}"))
        rel_id = self._rel_ids.get(rel_key)
        if rel_id is None:
            rel_id = self._rel_ids[rel_key] = self._rel_counter
            self._rel_counter += 1
        self._rel_live[rel_key] = self._rel_live.get(rel_key, 0) + 1
        size = int(args.get(REL_SIZE_KEY, 1) or 1)
        m = _Mirror(
            req_id=self._next_req,
            rel_id=rel_id,
            rel_size=max(1, size),
            template=rel_key,
            prompt_len=int(request.num_prompt_tokens),
            max_tokens=int(request.max_tokens or 1),
            arrival=float(request.arrival_time),
        )
        m.engine_id = request.request_id
        m.queued = False
        self._next_req += 1
        self._mirrors[request.request_id] = m
        return m

    def _queued(self, request: Any) -> _Mirror:
        m = self._mirror(request)
        m.queued = True  # the policy knows it
        return m

    def _sync(self, request: Any) -> _Mirror:
        m = self._mirror(request)
        m.num_computed = int(request.num_computed_tokens)
        m.num_output = int(request.num_output_tokens)
        m.num_cached = max(0, int(getattr(request, "num_cached_tokens", 0) or 0))
        m.num_preemptions = int(request.num_preemptions)
        return m

    # -- the step ------------------------------------------------------------

    def _semframe_schedule(self, schedule: Any, throttle_prefills: bool) -> Any:
        sched: Any = self
        now = time.time()
        running = [self._sync(r) for r in sched.running]
        for r in sched.waiting:
            self._sync(r)
        ctx = SchedContext(now, running, self._cache, self._budgets)
        queue: _Queue = sched.waiting
        queue.refresh(ctx)
        hold = False
        if running and queue:
            head = queue.peek_request()
            prefill = [self._mirror(head)]
            hold = not self.semframe_policy.prefer_prefill(prefill, running, ctx)
        paused = sched._pause_state
        if hold and paused == PauseState.UNPAUSED:
            sched._pause_state = PauseState.PAUSED_NEW
        try:
            out = schedule(throttle_prefills)
        finally:
            if hold and paused == PauseState.UNPAUSED:
                sched._pause_state = paused
        if self._trace is not None:
            self._write_trace(out, now, hold, len(queue))
        return out

    def _write_trace(self, out: Any, now: float, hold: bool, waiting: int) -> None:
        sched: Any = self
        admitted = []
        prefill = []
        decode = []
        for new in out.scheduled_new_reqs:
            m = self._mirrors.get(new.req_id)
            if m is not None:
                admitted.append([new.req_id, m.template, m.rel_size])
        for req_id, n in out.num_scheduled_tokens.items():
            request = sched.requests.get(req_id)
            if request is None:
                continue
            before = int(request.num_computed_tokens) - int(n)  # already advanced
            if before < int(request.num_prompt_tokens):
                prefill.append([int(n), max(0, before)])
            else:
                decode.append(before)
        record = {
            "t": now,
            "since_last": None if self._last_step is None else now - self._last_step,
            "admitted": admitted,
            "prefill": prefill,
            "decode": decode,
            "hold": hold,
            "waiting": waiting,
            "running": len(sched.running),
            "policy": self.semframe_policy.name,
        }
        self._last_step = now
        assert self._trace is not None
        self._trace.write(json.dumps(record) + "\n")
        self._trace.flush()

    def _semframe_finished(self, request: Any) -> None:
        m = self._mirrors.pop(request.request_id, None)
        if m is None:
            return
        sched: Any = self
        sched.waiting.remove_request(request)  # aborted while waiting: already gone
        if m.queued:
            self.semframe_policy.on_finished([m], time.time())
        left = self._rel_live[m.template] - 1
        if left:
            self._rel_live[m.template] = left
        else:  # the relQuery is done; its id may be used again by a later one
            del self._rel_live[m.template]
            del self._rel_ids[m.template]


def _request_id(request: Any) -> str:
    return str(request.request_id)


class SemframeScheduler(_SemframeMixin, Scheduler):  # type: ignore[misc]
    """vLLM's V1 scheduler with a semframe policy deciding admissions (module docs)."""


class SemframeAsyncScheduler(_SemframeMixin, AsyncScheduler):  # type: ignore[misc]
    """The same, over vLLM's async-scheduling variant (for engines that enable it)."""


__all__ = ["REL_KEY", "REL_SIZE_KEY", "SemframeAsyncScheduler", "SemframeScheduler"]
