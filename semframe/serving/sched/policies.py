"""Scheduling policies, named by :class:`Policy`; :func:`make_scheduler` builds one.

====================  =============================================================
``fcfs``              vLLM's default: arrival order, prefill batches first.
``sarathi``           arrival order, every running request decodes each step and
                      chunked prefills fill the rest of the token budget.
``static``            vLLM-SP: relQueries by a priority fixed at arrival (sum of
                      per-request estimates), prefill first.
``relserve``          RelServe: Dynamic Priority Updater (per-step priority from
                      the Priority Estimation Model, sampled cache-miss ratio,
                      priority reuse, starvation guard) + Adaptive Batch Arranger.
``lpm``               longest prefix match first (SGLang's default).
``k-lpm``             k-LPM: the oldest request, then k-1 longest-prefix picks.
``infermax``          Sarathi-style batches, running requests longest first so the
                      shortest are preempted first, admission reserves the
                      output length estimated by an online histogram.
====================  =============================================================
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from semframe.errors import ConfigError, format_choices
from semframe.serving.sched.base import (
    BatchMode,
    BatchRecord,
    FifoQueue,
    SchedContext,
    SchedRequest,
    Scheduler,
)
from semframe.serving.sched.cost import RELSERVE_A100_13B, RelServeCost


class Policy(enum.StrEnum):
    """Names of the scheduling policies."""

    FCFS = "fcfs"
    SARATHI = "sarathi"
    STATIC = "static"
    RELSERVE = "relserve"
    LPM = "lpm"
    KLPM = "k-lpm"
    INFERMAX = "infermax"

    @classmethod
    def parse(cls, name: str | Policy) -> Policy:
        """The policy called ``name``; unknown names list the valid ones.

        Examples
        --------
        >>> Policy.parse("k-lpm")
        <Policy.KLPM: 'k-lpm'>
        >>> Policy.parse("sjf")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        semframe.errors.ConfigError: unknown scheduling policy 'sjf'; valid: 'fcfs', ...
        """
        if isinstance(name, Policy):
            return name
        for p in cls:
            if p.value == name:
                return p
        msg = f"unknown scheduling policy {name!r}; valid: {format_choices(p.value for p in cls)}."
        raise ConfigError(msg)


# -- FCFS family ---------------------------------------------------------------


@dataclass
class FcfsScheduler(Scheduler):
    """vLLM's default: arrival order, prefill batches take priority over decodes."""

    @property
    def name(self) -> str:
        return Policy.FCFS.value


@dataclass
class SarathiScheduler(Scheduler):
    """Sarathi-Serve: FCFS, decode-first hybrid batches with chunked prefill."""

    mode: BatchMode = BatchMode.DECODE_FIRST

    @property
    def name(self) -> str:
        return Policy.SARATHI.value


# -- relQuery bookkeeping ------------------------------------------------------


@dataclass(slots=True, eq=False)
class RelState:
    """What a relQuery-aware policy tracks about one relQuery."""

    rel_id: int
    size: int
    arrival: float
    max_tokens: int
    waiting: FifoQueue = field(default_factory=FifoQueue)
    running: dict[int, SchedRequest] = field(default_factory=dict)
    finished: int = 0
    prio: float = math.inf
    miss_ratio: float = 1.0
    dirty: bool = True
    starved: bool = False


@dataclass
class _RelQueryScheduler(Scheduler):
    """Waiting requests grouped by relQuery, relQueries ordered by a key."""

    rels: dict[int, RelState] = field(default_factory=dict, init=False, repr=False)
    _order: list[int] = field(default_factory=list, init=False, repr=False)
    _n_waiting: int = field(default=0, init=False, repr=False)

    def _rel(self, req: SchedRequest, now: float) -> RelState:
        st = self.rels.get(req.rel_id)
        if st is None:
            st = RelState(req.rel_id, req.rel_size, req.arrival, req.max_tokens)
            self.rels[req.rel_id] = st
        return st

    def add_waiting(self, req: SchedRequest, now: float) -> None:
        st = self._rel(req, now)
        st.waiting.add(req)
        st.dirty = True
        self._n_waiting += 1

    def prepend_waiting(self, req: SchedRequest) -> None:
        st = self._rel(req, req.arrival)
        st.running.pop(req.req_id, None)
        st.waiting.prepend(req)
        st.dirty = True
        self._n_waiting += 1

    def remove_waiting(self, req: SchedRequest) -> None:
        st = self.rels[req.rel_id]
        st.waiting.remove(req)
        st.running[req.req_id] = req
        st.dirty = True
        self._n_waiting -= 1

    def num_waiting(self) -> int:
        return self._n_waiting

    def on_finished(self, reqs: Iterable[SchedRequest], now: float) -> None:
        for r in reqs:
            st = self.rels[r.rel_id]
            st.running.pop(r.req_id, None)
            st.finished += 1
            st.dirty = True
            if st.finished >= st.size and not st.waiting and not st.running:
                del self.rels[r.rel_id]

    def _key(self, st: RelState) -> tuple[float, float, int]:
        return (st.prio, st.arrival, st.rel_id)

    def update(self, ctx: SchedContext) -> None:
        self._order = sorted(
            (st.rel_id for st in self.rels.values() if st.waiting),
            key=lambda rid: self._key(self.rels[rid]),
        )

    def iter_waiting(self, ctx: SchedContext) -> Iterator[SchedRequest]:
        for rid in self._order:
            st = self.rels.get(rid)
            if st is not None:
                yield from list(st.waiting)


def request_estimate(req: SchedRequest, cost: RelServeCost) -> float:
    """Static per-request estimate (RelServe eq. 6 with linear L1, L2).

    ``L1(tok) = alpha_p * tok``; ``L2(OL) = OL * (alpha_d + beta_d)``: one decode
    step of a batch of one per output token.

    Examples
    --------
    >>> rs = RelServeCost(alpha_p=1e-4, beta_p=0.0, alpha_d=1e-4, beta_d=0.02)
    >>> round(request_estimate(SchedRequest(0, 0, 1, "t", 200, 10, 0.0), rs), 6)
    0.221
    """
    return cost.alpha_p * req.prompt_len + req.max_tokens * (cost.alpha_d + cost.beta_d)


@dataclass
class StaticPriorityScheduler(_RelQueryScheduler):
    """vLLM-SP: each relQuery's priority is the sum of its requests' estimates, fixed."""

    cost: RelServeCost = RELSERVE_A100_13B

    @property
    def name(self) -> str:
        return Policy.STATIC.value

    def add_waiting(self, req: SchedRequest, now: float) -> None:
        fresh = req.rel_id not in self.rels
        super().add_waiting(req, now)
        st = self.rels[req.rel_id]
        if fresh:
            st.prio = 0.0
        if req.num_preemptions == 0:
            st.prio += request_estimate(req, self.cost)


# -- RelServe ------------------------------------------------------------------


def batch_decompose(
    utoks: Sequence[float], *, max_num_seqs: int, max_num_batched_tokens: int, cap: float
) -> tuple[list[float], list[int]]:
    """RelServe's Algorithm 1: split a relQuery's requests into prefill and decode groups.

    Returns the uncached tokens of each prefill batch, and for each group of
    requests decoded together its size (each group decodes ``OL`` steps). The
    accumulator resets after each group (the paper's listing never resets it,
    which would make every later request its own group).

    Examples
    --------
    >>> batch_decompose([100.0] * 5, max_num_seqs=2, max_num_batched_tokens=150, cap=1e9)
    ([100.0, 100.0, 100.0, 100.0, 100.0], [2, 2, 1])
    >>> batch_decompose([10.0] * 4, max_num_seqs=8, max_num_batched_tokens=100, cap=1e9)
    ([40.0], [4])
    """
    prefills: list[float] = []
    groups: list[int] = []
    p = 0.0
    p_n = 0
    d = 0
    accum = 0.0
    for u in utoks:
        if d and (u + accum > cap or d + 1 > max_num_seqs):
            if p_n:
                prefills.append(p)
            groups.append(d)
            p, p_n, d, accum = 0.0, 0, 0, 0.0
        if p_n and u + p > max_num_batched_tokens:
            prefills.append(p)
            p, p_n = 0.0, 0
        p += u
        p_n += 1
        d += 1
        accum += u
    if p_n:
        prefills.append(p)
    if d:
        groups.append(d)
    return prefills, groups


def pem(
    utoks: Sequence[float],
    max_tokens: int,
    cost: RelServeCost,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    cap: float,
    running: int = 0,
    running_steps: int = 0,
) -> float:
    """Priority Estimation Model (eq. 10): predicted seconds to finish a relQuery.

    Waiting requests are decomposed by :func:`batch_decompose`; each group decodes
    ``max_tokens`` steps. The paper removes requests already prefilled from the
    decomposition (``utok = 0``, out of the prefill and decode batches), so a
    relQuery whose requests all run estimates to 0; ``running`` and
    ``running_steps`` (default 0) optionally add ``running_steps`` decode steps of
    a batch of ``running`` on top (an ablation, not the paper: it counts the
    running requests' decode steps *in series* with the waiting ones', so the
    estimate grows as a relQuery is prefilled).

    Examples
    --------
    >>> rs = RelServeCost(alpha_p=1e-3, beta_p=0.01, alpha_d=1e-3, beta_d=0.02)
    >>> round(pem([100.0, 100.0], 5, rs, max_num_seqs=8, max_num_batched_tokens=512, cap=1e4), 4)
    0.32
    """
    prefills, groups = batch_decompose(
        utoks, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, cap=cap
    )
    total = sum(cost.prefill_time(u) for u in prefills)
    total += sum(max_tokens * cost.decode_time(g) for g in groups)
    if running:
        total += running_steps * cost.decode_time(running)
    return total


@dataclass
class RelServeScheduler(_RelQueryScheduler):
    """RelServe: dynamic relQuery priorities and adaptive prefill/decode arrangement.

    Attributes
    ----------
    cost : RelServeCost
        The batch-time predictors (calibrated on the engine).
    sample_size : int
        Requests sampled per relQuery for its cache-miss ratio (eq. 11).
    starvation_threshold : float or None
        Seconds of waiting per request (``unit_waiting_time``, eq. 13) after which
        a relQuery's priority is set to 0; None disables the guard.
    reuse : bool
        Reuse the last priority while all of a relQuery's requests wait (eq. 12).
    adaptive : bool
        Use the Adaptive Batch Arranger; False always prefers prefill.
    count_running : bool
        Add the running requests' remaining decode steps to the estimate
        (serially, see :func:`pem`). False (the paper, and the default): only the
        waiting requests are decomposed.
    seed : int
        Seed of the random cache-miss sample.
    """

    mode: BatchMode = BatchMode.ADAPTIVE
    single_relquery_prefill: bool = True
    cost: RelServeCost = RELSERVE_A100_13B
    sample_size: int = 4
    starvation_threshold: float | None = 2.0
    reuse: bool = True
    adaptive: bool = True
    count_running: bool = False
    seed: int = 0
    pem_calls: int = field(default=0, init=False)
    _rng: random.Random = field(default_factory=random.Random, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)

    @property
    def name(self) -> str:
        return Policy.RELSERVE.value

    def _miss_ratio(self, st: RelState, ctx: SchedContext) -> float:
        """Eq. 11: uncached / total tokens of ``sample_size`` random waiting requests."""
        n = len(st.waiting)
        if n == 0:
            return 1.0
        k = min(self.sample_size, n)
        picks = set(self._rng.sample(range(n), k)) if k < n else set(range(n))
        last = max(picks)
        tok = 0
        miss = 0
        for i, r in enumerate(st.waiting):
            if i in picks:
                tok += r.prompt_len
                miss += r.prompt_len - min(r.prompt_len, ctx.cache.probe_prefix(r))
            if i >= last:
                break
        return miss / tok if tok else 1.0

    def _estimate(self, st: RelState, ctx: SchedContext) -> float:
        self.pem_calls += 1
        st.miss_ratio = self._miss_ratio(st, ctx)
        utoks = [r.prompt_len * st.miss_ratio for r in st.waiting]
        steps = 0
        if self.count_running:
            steps = max((st.max_tokens - r.num_output for r in st.running.values()), default=0)
        b = ctx.budgets
        return pem(
            utoks,
            st.max_tokens,
            self.cost,
            max_num_seqs=b.max_num_seqs,
            max_num_batched_tokens=b.max_num_batched_tokens,
            cap=b.kv_tokens,
            running=len(st.running) if self.count_running else 0,
            running_steps=max(0, steps),
        )

    def update(self, ctx: SchedContext) -> None:
        now = ctx.now
        thr = self.starvation_threshold
        for st in self.rels.values():
            if st.waiting and thr is not None and not st.starved:
                st.starved = (now - st.arrival) / st.size > thr
            if st.starved and st.waiting:
                st.prio = 0.0
                continue
            if self.reuse and not st.dirty and not st.running and math.isfinite(st.prio):
                continue  # eq. 12: everything still waits, nothing changed
            st.prio = self._estimate(st, ctx)
            st.dirty = False
        super().update(ctx)

    def prefer_prefill(
        self,
        prefill: Sequence[SchedRequest],
        decode: Sequence[SchedRequest],
        ctx: SchedContext,
    ) -> bool:
        if not self.adaptive:
            return True
        rels = self.rels
        p_rel = rels[prefill[0].rel_id]
        run_rels = {r.rel_id: rels[r.rel_id] for r in decode if r.rel_id in rels}
        m_minus = p_rel.prio
        m_plus = min((st.prio for st in run_rels.values()), default=math.inf)
        if m_plus >= m_minus:
            return True  # preemption by a shorter relQuery, or the same relQuery continues
        # Transitional: eq. 15-17. Eq. 16 is the waiting relQueries' *reduction*.
        c = self.cost
        utok = sum(r.prompt_len for r in prefill) * p_rel.miss_ratio
        ol_p = p_rel.max_tokens
        delta_plus = c.prefill_time(utok) * len(run_rels)
        delta_plus += sum(
            c.alpha_d * len(prefill) * min(st.max_tokens, ol_p) for st in run_rels.values()
        )
        n_wait = sum(1 for st in rels.values() if st.waiting)
        max_ol = max(st.max_tokens for st in run_rels.values()) if run_rels else 0
        delta_minus = n_wait * c.beta_d * min(ol_p, max_ol)
        return delta_plus - delta_minus < 0


# -- prefix-match policies -----------------------------------------------------


@dataclass
class LpmScheduler(Scheduler):
    """Longest prefix match first; with ``k``, k-LPM (oldest, then k-1 LPM picks).

    Attributes
    ----------
    k : int or None
        None is LPM; 1 is FCFS.
    window : int
        Oldest waiting requests scored per step (like SGLang's fallback to FCFS
        on long queues, this bounds the per-step cost).
    random_ties : bool
        Break ties in match length pseudo-randomly (by a hash of the request
        id), as the k-LPM paper's analysis assumes and as SGLang's in-place
        re-sorting of its queue effectively does; False breaks them by age.
    """

    k: int | None = None
    window: int = 512
    random_ties: bool = True
    _phase: int = field(default=0, init=False, repr=False)

    @property
    def name(self) -> str:
        return Policy.LPM.value if self.k is None else Policy.KLPM.value

    def remove_waiting(self, req: SchedRequest) -> None:
        super().remove_waiting(req)
        self._phase += 1

    def iter_waiting(self, ctx: SchedContext) -> Iterator[SchedRequest]:
        cand: list[SchedRequest] = []
        for i, r in enumerate(self._waiting):
            if i >= self.window:
                break
            cand.append(r)
        probe = ctx.cache.probe_prefix
        if self.random_ties:
            by_match = sorted(
                range(len(cand)),
                key=lambda i: (-probe(cand[i]), (cand[i].req_id * 2654435761) % 4294967296),
            )
        else:
            by_match = sorted(range(len(cand)), key=lambda i: (-probe(cand[i]), i))
        used = [False] * len(cand)
        oldest = 0
        best = 0
        phase = self._phase
        for _ in range(len(cand)):
            if self.k is not None and phase % self.k == 0:
                while used[oldest]:
                    oldest += 1
                pick = oldest
            else:
                while used[by_match[best]]:
                    best += 1
                pick = by_match[best]
            used[pick] = True
            phase += 1
            yield cand[pick]
        rest = self._waiting
        for i, r in enumerate(rest):
            if i >= self.window:
                yield r


# -- InferMax ------------------------------------------------------------------


@dataclass
class InferMaxScheduler(Scheduler):
    """InferMax's deployable policy: decode-first hybrid, evict short requests first.

    Running requests are served longest first (most KV computed) and preempted
    from the shortest; admission keeps free the KV for the output length at
    ``quantile`` of an online histogram of finished requests' output lengths.
    """

    mode: BatchMode = BatchMode.DECODE_FIRST
    quantile: float = 0.9
    hist: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _seen: int = field(default=0, init=False, repr=False)

    @property
    def name(self) -> str:
        return Policy.INFERMAX.value

    def running_order(self, running: Sequence[SchedRequest]) -> list[SchedRequest]:
        return sorted(running, key=lambda r: -r.num_computed)

    def estimated_output(self, max_tokens: int) -> int:
        """Output length at ``quantile`` of those seen, capped by ``max_tokens``.

        Examples
        --------
        >>> s = InferMaxScheduler()
        >>> s.estimated_output(50)
        50
        >>> s.hist.update({4: 9, 40: 1}); s._seen = 10
        >>> s.estimated_output(50)
        4
        """
        if not self._seen:
            return max_tokens
        target = self.quantile * self._seen
        acc = 0
        for length in sorted(self.hist):
            acc += self.hist[length]
            if acc >= target:
                return min(length, max_tokens)
        return max_tokens

    def reserve_tokens(self, req: SchedRequest) -> int:
        return max(0, self.estimated_output(req.max_tokens) - req.num_output)

    def observe(self, record: BatchRecord, ctx: SchedContext) -> None:
        for n in record.output_lens:
            self.hist[n] = self.hist.get(n, 0) + 1
            self._seen += 1


_FACTORIES: dict[Policy, Any] = {
    Policy.FCFS: FcfsScheduler,
    Policy.SARATHI: SarathiScheduler,
    Policy.STATIC: StaticPriorityScheduler,
    Policy.RELSERVE: RelServeScheduler,
    Policy.LPM: LpmScheduler,
    Policy.KLPM: lambda **kw: LpmScheduler(**{"k": 2, **kw}),
    Policy.INFERMAX: InferMaxScheduler,
}


def make_scheduler(policy: str | Policy, **options: Any) -> Scheduler:
    """A fresh scheduler for ``policy`` (options go to its constructor).

    Examples
    --------
    >>> make_scheduler("k-lpm", k=4).name, make_scheduler("relserve").mode.value
    ('k-lpm', 'adaptive')
    """
    p = Policy.parse(policy)
    sched: Scheduler = _FACTORIES[p](**options)
    return sched
