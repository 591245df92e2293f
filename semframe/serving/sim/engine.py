"""Discrete-event simulator of one LLM engine under a :class:`Scheduler`.

Continuous batching, step by step: at each step the engine admits arrivals,
lets the policy refresh priorities, builds a candidate prefill batch (waiting
requests in the policy's order while the sequence, token and KV-block budgets
allow; admission stops at the first request that does not fit, as in vLLM)
and a candidate decode batch (all running requests), and runs one of them
(prefill-first, or the policy's choice), or, in decode-first mode, a hybrid
batch of all decodes plus (chunked) prefills. The batch's time comes from an
:class:`~semframe.serving.sched.cost.InferMaxCost`; the clock jumps by it. A running
request that needs a KV block when none is free preempts running requests from
the end of the policy's running order (recompute: its KV is dropped and it
waits again, first in line). Prefix caching is :class:`~semframe.serving.sim.kv.KVCache`.

Timelines are recorded per request (arrival, first scheduled, first token,
last prefill end, finish) and summarised per relQuery as RelServe defines them:
waiting (arrival to first prefill), core running (to the end of the last
prefill batch) and tail running (to the last token).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from semframe.errors import InputError
from semframe.serving.sched.base import (
    BatchItem,
    BatchMode,
    BatchRecord,
    Budgets,
    SchedContext,
    SchedRequest,
    Scheduler,
)
from semframe.serving.sched.cost import A100_13B, InferMaxCost
from semframe.serving.sim.kv import KVCache

NAN = math.nan


@dataclass(slots=True, eq=False)
class SimRequest(SchedRequest):
    """A request in the simulator: the policy view plus ground truth and timeline.

    Attributes
    ----------
    output_len : int
        True output length (policies only see ``max_tokens``).
    t_scheduled, t_first_token, t_prefill_done, t_finish : float
        First time in a batch, end of the batch that produced the first token,
        end of the last batch that completed a (re)fill, completion.
    """

    output_len: int = 1
    t_scheduled: float = NAN
    t_first_token: float = NAN
    t_prefill_done: float = NAN
    t_finish: float = NAN

    @property
    def ttft(self) -> float:
        """Time to first token."""
        return self.t_first_token - self.arrival


@dataclass(frozen=True, slots=True)
class RelTimeline:
    """One relQuery's latency and its breakdown (RelServe eq. 2)."""

    rel_id: int
    size: int
    template: str
    arrival: float
    waiting: float
    core: float
    tail: float

    @property
    def latency(self) -> float:
        """Arrival to last token."""
        return self.waiting + self.core + self.tail


@dataclass
class SimResult:
    """What a simulation produced.

    Attributes
    ----------
    requests : list of SimRequest
        Every request, with its timeline.
    batches : list of BatchRecord
        Every batch (only when ``record=True``).
    sim_time : float
        Simulated seconds from the first arrival to the last completion.
    busy_time : float
        Simulated seconds spent running batches.
    steps : int
        Batches run.
    sched_seconds : list of float
        Real seconds the scheduler spent forming each batch (policy and bookkeeping).
    cache_hit_rate : float
        Prompt tokens found in the prefix cache / prompt tokens admitted.
    preemptions : int
        Preemptions in all.
    """

    requests: list[SimRequest]
    batches: list[BatchRecord] = field(default_factory=list)
    sim_time: float = 0.0
    busy_time: float = 0.0
    steps: int = 0
    sched_seconds: list[float] = field(default_factory=list)
    cache_hit_rate: float = 0.0
    preemptions: int = 0

    def relqueries(self) -> list[RelTimeline]:
        """Per-relQuery timelines, by relQuery id."""
        groups: dict[int, list[SimRequest]] = {}
        for r in self.requests:
            groups.setdefault(r.rel_id, []).append(r)
        out = []
        for rid in sorted(groups):
            rs = groups[rid]
            arrival = min(r.arrival for r in rs)
            start = min(r.t_scheduled for r in rs)
            pdone = max(r.t_prefill_done for r in rs)
            fin = max(r.t_finish for r in rs)
            out.append(
                RelTimeline(
                    rid,
                    len(rs),
                    rs[0].template,
                    arrival,
                    start - arrival,
                    pdone - start,
                    fin - pdone,
                )
            )
        return out

    def summary(self) -> dict[str, float]:
        """Average relQuery latency and breakdown, TTFT percentiles, throughput."""
        rels = self.relqueries()
        ttft = np.array([r.ttft for r in self.requests])
        return {
            "avg_latency": float(np.mean([r.latency for r in rels])),
            "avg_waiting": float(np.mean([r.waiting for r in rels])),
            "avg_core": float(np.mean([r.core for r in rels])),
            "avg_tail": float(np.mean([r.tail for r in rels])),
            "max_latency": float(np.max([r.latency for r in rels])),
            "p50_ttft": float(np.percentile(ttft, 50)),
            "p99_ttft": float(np.percentile(ttft, 99)),
            "cache_hit_rate": self.cache_hit_rate,
            "preemptions": float(self.preemptions),
            "sim_time": self.sim_time,
            "steps": float(self.steps),
        }


def _check_requests(requests: Sequence[SimRequest], budgets: Budgets, mode: BatchMode) -> None:
    seen: set[int] = set()
    chunked = budgets.chunked_prefill and mode is BatchMode.DECODE_FIRST
    for r in requests:
        if r.req_id in seen:
            msg = f"request id {r.req_id} appears twice; ids must be unique."
            raise InputError(msg)
        seen.add(r.req_id)
        if r.prompt_len < 1 or r.output_len < 1 or r.output_len > r.max_tokens:
            msg = (
                f"request {r.req_id}: need prompt_len >= 1 and 1 <= output_len <= max_tokens; "
                f"got {r.prompt_len}, {r.output_len}, {r.max_tokens}."
            )
            raise InputError(msg)
        if not chunked and r.prompt_len + r.max_tokens > budgets.max_num_batched_tokens:
            msg = (
                f"request {r.req_id} needs up to {r.prompt_len + r.max_tokens} tokens in one "
                f"batch (a refill) but max_num_batched_tokens is {budgets.max_num_batched_tokens}; "
                "raise it or use a decode-first policy with chunked_prefill=True."
            )
            raise InputError(msg)
        if r.prompt_len + r.max_tokens > budgets.kv_tokens:
            msg = (
                f"request {r.req_id} needs {r.prompt_len + r.max_tokens} KV tokens but the cache "
                f"holds {budgets.kv_tokens}."
            )
            raise InputError(msg)


class _Engine:
    """State of one simulation run (one use)."""

    def __init__(
        self,
        sched: Scheduler,
        budgets: Budgets,
        cost: InferMaxCost,
        *,
        record: bool,
        check_kv: bool,
    ) -> None:
        self.sched = sched
        self.b = budgets
        self.cost = cost
        self.kv = KVCache(budgets.num_blocks, budgets.block_size)
        self.running: list[SimRequest] = []
        self.record = record
        self.check_kv = check_kv
        self.preemptions = 0
        self.chunked = budgets.chunked_prefill and sched.mode is BatchMode.DECODE_FIRST
        self.decide_seconds = 0.0

    # -- helpers -------------------------------------------------------------
    def _preempt(self, victim: SimRequest, out: list[int]) -> None:
        self.kv.free(victim)
        victim.num_computed = 0
        victim.num_cached = 0
        victim.num_preemptions += 1
        self.running.remove(victim)
        self.sched.prepend_waiting(victim)
        self.preemptions += 1
        out.append(victim.req_id)

    def _plan(self, req: SimRequest, token_budget: int, blocks_used: int) -> tuple[int, int] | None:
        """Whether ``req`` can be admitted: (new tokens, blocks it takes) or None."""
        kv = self.kv
        limit = ((req.num_known - 1) // kv.block_size) * kv.block_size
        cached = min(kv.cached_prefix(req), limit)
        todo = req.num_known - cached
        if todo > token_budget:
            if not self.chunked or token_budget <= 0:
                return None
            todo = token_budget
        extra = -(-self.sched.reserve_tokens(req) // kv.block_size)
        take = kv.blocks_for(cached + todo) - cached // kv.block_size
        take += kv.evictable_hits(req, cached)
        if take + extra > kv.num_free_blocks - blocks_used:
            return None
        return todo, take

    def _admit(self, req: SimRequest, todo: int) -> int:
        """Admit ``req`` for ``todo`` new tokens; return its cached context."""
        hit = self.kv.admit(req)
        req.num_cached = hit
        req.num_computed = hit
        ok = self.kv.grow(req, hit + todo)
        if not ok:  # pragma: no cover - _plan checked the blocks
            msg = "KV blocks ran out during admission (planning bug)."
            raise RuntimeError(msg)
        return hit

    def _prefill_candidate(
        self, ctx: SchedContext, budget: int, single_rel: bool
    ) -> list[tuple[SimRequest, int]]:
        b = self.b
        n_seqs = len(self.running)
        used = 0
        first_rel: int | None = None
        out: list[tuple[SimRequest, int]] = []
        for view in self.sched.iter_waiting(ctx):
            req = cast(SimRequest, view)
            if n_seqs >= b.max_num_seqs or budget <= 0:
                break
            if single_rel and first_rel is not None and req.rel_id != first_rel:
                break
            plan = self._plan(req, budget, used)
            if plan is None:
                break
            first_rel = req.rel_id
            out.append((req, plan[0]))
            budget -= plan[0]
            used += plan[1]
            n_seqs += 1
        return out

    def _run_running(
        self, budget: int, preempted: list[int], items: list[tuple[SimRequest, int, int]]
    ) -> int:
        """Schedule running requests in the policy's order; preempt from the end."""
        order = [cast(SimRequest, r) for r in self.sched.running_order(self.running)]
        gone: set[int] = set()
        i = 0
        while i < len(order):
            r = order[i]
            i += 1
            if r.req_id in gone:
                continue
            todo = r.num_known - r.num_computed
            if todo > budget:
                if not self.chunked or budget <= 0:
                    continue
                todo = budget
            while not self.kv.grow(r, r.num_computed + todo):
                victim = next((v for v in reversed(order[i:]) if v.req_id not in gone), None)
                if victim is None:
                    victim = r
                gone.add(victim.req_id)
                self._preempt(victim, preempted)
                if victim is r:
                    todo = 0
                    break
            if todo:
                items.append((r, todo, r.num_computed))
                budget -= todo
        return budget

    # -- one step ------------------------------------------------------------
    def step(self, now: float) -> BatchRecord | None:
        t0 = time.perf_counter()
        b = self.b
        sched = self.sched
        ctx = SchedContext(now, self.running, self.kv, b)
        sched.update(ctx)
        preempted: list[int] = []
        items: list[tuple[SimRequest, int, int]] = []  # (req, new tokens, context)
        admitted: list[SimRequest] = []

        if sched.mode is BatchMode.DECODE_FIRST:
            budget = self._run_running(b.max_num_batched_tokens, preempted, items)
            cand = self._prefill_candidate(ctx, budget, sched.single_relquery_prefill)
        else:
            cand = self._prefill_candidate(
                ctx, b.max_num_batched_tokens, sched.single_relquery_prefill
            )
            if cand and self.running:
                views: list[SchedRequest] = [r for r, _ in cand]
                if not sched.prefer_prefill(views, list(self.running), ctx):
                    cand = []
            if not cand:
                self._run_running(b.max_num_batched_tokens, preempted, items)
        for req, todo in cand:
            hit = self._admit(req, todo)
            items.append((req, todo, hit))
            admitted.append(req)
            sched.remove_waiting(req)
            self.running.append(req)
            if math.isnan(req.t_scheduled):
                req.t_scheduled = now
        self.decide_seconds = time.perf_counter() - t0
        if not items:
            return None
        # cost
        n_tok = attn = pkv = n_pre = dkv = 0
        batch_items = []
        kinds = []
        for r, c, m in items:
            n_tok += c
            is_decode = c == 1 and r.num_output > 0 and m == r.num_known - 1
            kinds.append(is_decode)
            if is_decode:
                dkv += m
            else:
                attn += c * c + 2 * m * c
                pkv += m
                n_pre += 1
            if self.record:
                batch_items.append(BatchItem(r.req_id, r.rel_id, c, m, not is_decode))
        dur = self.cost.time_from_sums(n_tok, attn, pkv, n_pre, dkv)
        end = now + dur
        finished: list[SimRequest] = []
        for (r, c, m), is_decode in zip(items, kinds, strict=True):
            r.num_computed = m + c
            if not is_decode:
                self.kv.commit(r, min(r.num_computed, r.prompt_len))
            if r.num_computed == r.num_known:
                r.num_output += 1
                if not is_decode:
                    r.t_prefill_done = end
                if r.num_output == 1:
                    r.t_first_token = end
                if r.num_output >= r.output_len:
                    r.t_finish = end
                    finished.append(r)
        for r in finished:
            self.kv.free(r)
            self.running.remove(r)
        if finished:
            sched.on_finished(finished, end)
        rec = BatchRecord(
            now,
            end,
            tuple(batch_items),
            tuple(r.req_id for r in admitted),
            tuple(r.req_id for r in finished),
            tuple(r.num_output for r in finished),
            tuple(preempted),
        )
        sched.observe(rec, SchedContext(end, self.running, self.kv, b))
        if self.check_kv:
            self.kv.check()
        return rec


def simulate(
    requests: Sequence[SimRequest],
    scheduler: Scheduler,
    *,
    budgets: Budgets | None = None,
    cost: InferMaxCost = A100_13B,
    record: bool = False,
    check_kv: bool = False,
    max_steps: int | None = None,
) -> SimResult:
    """Run ``requests`` (arriving at their ``arrival`` times) through one engine.

    Parameters
    ----------
    requests : sequence of SimRequest
        Fresh requests (progress fields zero); they are updated in place.
    scheduler : Scheduler
        A fresh policy instance.
    budgets : Budgets, optional
        Engine limits (defaults: :class:`Budgets`).
    cost : InferMaxCost
        Batch-time model.
    record : bool
        Keep every :class:`BatchRecord` (tests, plots).
    check_kv : bool
        Check the KV cache's invariants after every batch (slow).
    max_steps : int, optional
        Stop after this many batches (unfinished requests keep NaN times).

    Examples
    --------
    >>> from semframe.serving.sched import make_scheduler
    >>> reqs = [SimRequest(i, 0, 2, "t", 32, 4, 0.0, output_len=3) for i in range(2)]
    >>> res = simulate(reqs, make_scheduler("fcfs"))
    >>> res.steps, all(r.num_output == 3 for r in res.requests)
    (3, True)
    """
    b = budgets or Budgets()
    _check_requests(requests, b, scheduler.mode)
    eng = _Engine(scheduler, b, cost, record=record, check_kv=check_kv)
    pending = sorted(requests, key=lambda r: (r.arrival, r.req_id))
    n = len(pending)
    pos = 0
    now = pending[0].arrival if pending else 0.0
    start = now
    done = 0
    res = SimResult(requests=list(requests))
    while done < n:
        while pos < n and pending[pos].arrival <= now:
            scheduler.add_waiting(pending[pos], pending[pos].arrival)
            pos += 1
        if not eng.running and scheduler.num_waiting() == 0:
            now = pending[pos].arrival
            continue
        rec = eng.step(now)
        res.sched_seconds.append(eng.decide_seconds)
        if rec is None:
            if pos < n:  # nothing fits now; wait for the next arrival
                now = max(now, pending[pos].arrival)
                continue
            msg = "the engine cannot make progress: a waiting request never fits the budgets."
            raise InputError(msg)
        res.steps += 1
        res.busy_time += rec.end - rec.start
        now = rec.end
        done += sum(1 for _ in rec.finished)
        if record:
            res.batches.append(rec)
        if max_steps is not None and res.steps >= max_steps:
            break
    res.sim_time = now - start
    res.preemptions = eng.preemptions
    res.cache_hit_rate = eng.kv.hits / eng.kv.queries if eng.kv.queries else 0.0
    return res
