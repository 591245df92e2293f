"""Optimal schedules for tiny instances: InferMax's constraint formulation as a MILP.

InferMax (``infermax-cost-aware-scheduling``, section 5) writes optimal
scheduling as a constraint problem over batches ``j = 1..J``: which request
processes how many tokens in which batch, subject to termination, token
generation, memory and per-batch budget constraints, with the objective built
from the linear batch-time model. Here it is a mixed-integer linear program
solved by HiGHS through :func:`scipy.optimize.milp`, with the simulator's own
cost model (:class:`~semframe.serving.sched.cost.InferMaxCost`), so the optimum is a
true bound for every policy the simulator runs on the same instance.

Variables, per request ``i`` and batch ``j``:

- ``p[i,j]`` (binary): ``i``'s whole prompt is prefilled in batch ``j`` (it
  produces the first output token);
- ``d[i,j]`` (binary): ``i`` decodes one token in batch ``j``;
- ``r[i,j]`` (binary): ``i`` holds a sequence slot and KV during batch ``j``
  (prefilled and not finished before ``j``); ``f[i,j]`` (binary): ``i`` has
  generated all its tokens by the end of ``j``;
- ``y[i,j] >= 0``: KV tokens read by ``i``'s decode in ``j`` (the bilinear
  ``d[i,j] * context`` linearised with the Big-M method, as the paper does);
  ``k[i,j] >= 0``: KV tokens ``i`` holds during ``j``;

and per batch ``u[j]`` (binary, batch non-empty: pays the per-batch overhead),
``s[j]`` (start time, continuous: the engine may idle until an arrival). The
constraints are the paper's: termination (``sum_j p = 1``, ``sum_j d = O_i -
1``), generation only after the prefill, at most one item per request per
batch, budgets per batch (tokens, sequences held, KV tokens held), arrivals
(``s[j] >= a_i p[i,j]``) and batches in sequence (``s[j+1] >= s[j] +
time[j]``). The objective is the average relQuery latency (arrival to last
token, the metric the benchmark reports) or the makespan.

What is left out, and why the optimum is still a bound for our policies:
prompts are prefilled whole (no chunking) and requests are never evicted, so
the bound holds for policies run with ``chunked_prefill=False`` on instances
where the KV cache is ample (no preemption happens); the policies'
block-granular KV accounting is stricter than the MILP's token accounting, and
requests carry no shared prefixes (no cache hits). :func:`gap_study` checks
all three for every instance it reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from semframe.errors import InputError, MissingDependencyError
from semframe.serving.sched.base import Budgets, Scheduler
from semframe.serving.sched.cost import A100_13B, InferMaxCost
from semframe.serving.sched.policies import RelServeScheduler, make_scheduler
from semframe.serving.sim.engine import SimRequest, simulate
from semframe.serving.sim.workload import relserve_workload

Objective = Literal["latency", "makespan"]


@dataclass(frozen=True, slots=True)
class TinyRequest:
    """One request of a tiny instance (true output length known, as in InferMax's CSP).

    Attributes
    ----------
    req_id, rel_id : int
        Request and relQuery ids.
    prompt_len : int
        Prompt tokens ``I_i``.
    output_len : int
        Output tokens ``O_i`` (>= 1).
    arrival : float
        Arrival time (seconds).
    """

    req_id: int
    rel_id: int
    prompt_len: int
    output_len: int
    arrival: float = 0.0


@dataclass(frozen=True, slots=True)
class MilpSchedule:
    """An optimal schedule.

    Attributes
    ----------
    objective : float
        Average relQuery latency or makespan (seconds) of ``batches`` run as
        soon as possible (:func:`schedule_cost`): the schedule's exact cost,
        not the solver's value, which may sit up to its feasibility tolerance
        below it.
    batches : list of list of (int, str)
        Per batch, ``(req_id, "prefill" | "decode")`` items.
    starts : list of float
        Start time of each batch.
    optimal : bool
        Whether HiGHS proved optimality (False: time limit, best found).
    bound : float
        The solver's lower bound on the objective.
    num_vars : int
        Variables in the model.
    """

    objective: float
    batches: list[list[tuple[int, str]]]
    starts: list[float]
    optimal: bool
    bound: float
    num_vars: int


def item_time(cost: InferMaxCost, prompt_len: int, generated: int) -> float:
    """Marginal seconds of one batch item (without the per-batch overhead).

    ``generated`` tokens exist before the item: 0 is the prefill, ``g >= 1`` a
    decode reading ``prompt_len + g - 1`` KV tokens, exactly as the simulator
    charges them.

    Examples
    --------
    >>> c = InferMaxCost(overhead=1.0, per_token=0.1, decode_kv=0.01)
    >>> item_time(c, 10, 0), round(item_time(c, 10, 2), 6)
    (1.0, 0.21)
    """
    if generated == 0:
        c = prompt_len
        return cost.per_token * c + cost.prefill_attn * c * c + cost.per_prefill
    return cost.per_token + cost.decode_kv * (prompt_len + generated - 1)


def schedule_cost(
    requests: Sequence[TinyRequest],
    batches: Sequence[Sequence[tuple[int, str]]],
    cost: InferMaxCost = A100_13B,
) -> tuple[float, float]:
    """Evaluate a schedule: (average relQuery latency, makespan), batches run ASAP.

    A batch starts when the previous one ends or, if later, when its last
    request arrives. Raises :class:`~semframe.errors.InputError` if a request
    decodes before its prefill or does not generate exactly its tokens.

    Examples
    --------
    >>> reqs = [TinyRequest(0, 0, 10, 2)]
    >>> c = InferMaxCost(overhead=1.0, per_token=0.1)
    >>> schedule_cost(reqs, [[(0, "prefill")], [(0, "decode")]], c)
    (3.1, 3.1)
    """
    by_id = {r.req_id: r for r in requests}
    gen = dict.fromkeys(by_id, 0)
    finish: dict[int, float] = {}
    now = 0.0
    for batch in batches:
        if not batch:
            continue
        now = max([now] + [by_id[i].arrival for i, _ in batch])
        t = cost.overhead
        for i, kind in batch:
            r = by_id[i]
            if (kind == "prefill") != (gen[i] == 0) or gen[i] >= r.output_len:
                msg = f"request {i}: {kind} after {gen[i]} of {r.output_len} tokens."
                raise InputError(msg)
            t += item_time(cost, r.prompt_len, gen[i])
            gen[i] += 1
        now += t
        for i, _ in batch:
            if gen[i] == by_id[i].output_len:
                finish[i] = now
    if any(gen[i] != r.output_len for i, r in by_id.items()):
        msg = "the schedule does not finish every request."
        raise InputError(msg)
    rels: dict[int, list[TinyRequest]] = {}
    for r in requests:
        rels.setdefault(r.rel_id, []).append(r)
    lat = [max(finish[r.req_id] for r in rs) - min(r.arrival for r in rs) for rs in rels.values()]
    return float(np.mean(lat)), max(finish.values())


def _chain(cost: InferMaxCost, r: TinyRequest) -> float:
    """Least time from arrival to the last token: each item in its own minimal batch."""
    return sum(cost.overhead + item_time(cost, r.prompt_len, g) for g in range(r.output_len))


@dataclass
class _Model:
    """Sparse MILP builder: variables with bounds and integrality, rows."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integ: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    rlo: list[float] = field(default_factory=list)
    rhi: list[float] = field(default_factory=list)

    def var(self, lo: float = 0.0, hi: float = 1.0, *, integer: bool = True) -> int:
        self.lb.append(lo)
        self.ub.append(hi)
        self.integ.append(1 if integer else 0)
        return len(self.lb) - 1

    def row(self, terms: Sequence[tuple[int, float]], lo: float, hi: float) -> None:
        k = len(self.rlo)
        for v, a in terms:
            self.rows.append(k)
            self.cols.append(v)
            self.vals.append(a)
        self.rlo.append(lo)
        self.rhi.append(hi)


def solve_optimal(
    requests: Sequence[TinyRequest],
    budgets: Budgets,
    *,
    cost: InferMaxCost = A100_13B,
    objective: Objective = "latency",
    num_batches: int | None = None,
    time_limit: float = 30.0,
) -> MilpSchedule:
    """Solve the scheduling MILP for a tiny instance.

    Parameters
    ----------
    requests : sequence of TinyRequest
        The instance (a handful of requests with short outputs).
    budgets : Budgets
        ``max_num_seqs``, ``max_num_batched_tokens`` and the KV capacity
        (``num_blocks * block_size`` tokens) bound every batch.
    cost : InferMaxCost
        Batch-time model (the simulator's).
    objective : {"latency", "makespan"}
        Average relQuery latency, or the last batch's end.
    num_batches : int, optional
        Horizon ``J``; defaults to ``sum O_i`` (every batch produces a token,
        so no optimal schedule needs more).
    time_limit : float
        Seconds for HiGHS; past it the best schedule found is returned with
        ``optimal=False``.

    Examples
    --------
    Two one-token requests fit one batch; a third must wait (two sequences):

    >>> reqs = [TinyRequest(i, i, 10, 1) for i in range(3)]
    >>> c = InferMaxCost(overhead=1.0, per_token=0.01)
    >>> s = solve_optimal(reqs, Budgets(max_num_seqs=2), cost=c)
    >>> round(s.objective, 4), [len(b) for b in s.batches], s.optimal
    (1.5667, [2, 1], True)
    """
    reqs = list(requests)
    kind: str = objective
    if kind not in ("latency", "makespan"):
        msg = f"objective must be 'latency' or 'makespan'; got {kind!r}."
        raise InputError(msg)
    if not reqs:
        msg = "solve_optimal needs at least one request."
        raise InputError(msg)
    for r in reqs:
        if r.output_len < 1 or r.prompt_len < 1:
            msg = f"request {r.req_id}: need prompt_len >= 1 and output_len >= 1."
            raise InputError(msg)
        if r.prompt_len > budgets.max_num_batched_tokens:
            msg = f"request {r.req_id}: prompt longer than max_num_batched_tokens."
            raise InputError(msg)
    n = len(reqs)
    big_j = num_batches if num_batches is not None else sum(r.output_len for r in reqs)
    cap = budgets.kv_tokens
    # horizon: every item alone, after the last arrival, bounds an optimal schedule's end
    horizon = max(r.arrival for r in reqs) + sum(
        cost.overhead + item_time(cost, r.prompt_len, g) for r in reqs for g in range(r.output_len)
    )
    m = _Model()
    p = [[m.var() for _ in range(big_j)] for _ in range(n)]
    d = [[m.var() for _ in range(big_j)] for _ in range(n)]
    res = [[m.var() for _ in range(big_j)] for _ in range(n)]
    fin = [[m.var() for _ in range(big_j)] for _ in range(n)]
    y = [
        [m.var(0.0, r.prompt_len + r.output_len, integer=False) for _ in range(big_j)] for r in reqs
    ]
    kv = [
        [m.var(0.0, r.prompt_len + r.output_len, integer=False) for _ in range(big_j)] for r in reqs
    ]
    u = [m.var() for _ in range(big_j)]
    s = [m.var(0.0, horizon, integer=False) for _ in range(big_j)]
    rel_ids = sorted({r.rel_id for r in reqs})
    comp = {q: m.var(0.0, horizon, integer=False) for q in rel_ids}
    cmax = m.var(0.0, horizon, integer=False)
    inf = math.inf

    def gen_terms(i: int, upto: int) -> list[tuple[int, float]]:
        """Tokens generated by request i in batches 0..upto (inclusive)."""
        return [(p[i][j], 1.0) for j in range(upto + 1)] + [(d[i][j], 1.0) for j in range(upto + 1)]

    def time_terms(j: int) -> list[tuple[int, float]]:
        """Batch j's duration as a linear expression."""
        t: list[tuple[int, float]] = [(u[j], cost.overhead)]
        for i, r in enumerate(reqs):
            t.append((p[i][j], item_time(cost, r.prompt_len, 0)))
            t.append((d[i][j], cost.per_token))
            t.append((y[i][j], cost.decode_kv))
        return t

    for i, r in enumerate(reqs):
        big_o = r.output_len
        m.row([(p[i][j], 1.0) for j in range(big_j)], 1.0, 1.0)  # termination
        m.row([(d[i][j], 1.0) for j in range(big_j)], big_o - 1, big_o - 1)
        for j in range(big_j):
            m.row([(p[i][j], 1.0), (d[i][j], 1.0)], -inf, 1.0)  # one item per batch
            # decode only after the prefill
            m.row([(d[i][j], 1.0)] + [(p[i][k], -1.0) for k in range(j)], -inf, 0.0)
            # finished by j only if all tokens generated: O * f <= G_j
            m.row([(fin[i][j], float(big_o))] + [(v, -a) for v, a in gen_terms(i, j)], -inf, 0.0)
            # resident at j if prefilled by j and not finished before j
            prev_fin = [(fin[i][j - 1], 1.0)] if j else []
            m.row([(res[i][j], 1.0)] + [(p[i][k], -1.0) for k in range(j + 1)] + prev_fin, 0.0, inf)
            # decode reads prompt + generated - 1 KV tokens: y >= (I - 1 + G_{j-1}) - M (1 - d)
            big_m = r.prompt_len + big_o
            g_prev = [(v, -a) for v, a in gen_terms(i, j - 1)] if j else []
            m.row(
                [(y[i][j], 1.0), (d[i][j], -float(big_m)), *g_prev],
                r.prompt_len - 1 - big_m,
                inf,
            )
            # KV held: k >= I + G_j - 1 - M (1 - r)
            m.row(
                [(kv[i][j], 1.0), (res[i][j], -float(big_m))]
                + [(v, -a) for v, a in gen_terms(i, j)],
                r.prompt_len - 1 - big_m,
                inf,
            )
            # the batch is non-empty if anyone is in it; it starts after the arrival
            m.row([(u[j], 1.0), (p[i][j], -1.0), (d[i][j], -1.0)], 0.0, inf)
            m.row([(s[j], 1.0), (p[i][j], -r.arrival)], 0.0, inf)
            # relQuery completion: comp >= s_j + time_j - H (1 - p - d)
            m.row(
                [(comp[r.rel_id], 1.0), (s[j], -1.0), (p[i][j], -horizon), (d[i][j], -horizon)]
                + [(v, -a) for v, a in time_terms(j)],
                -horizon,
                inf,
            )
    for j in range(big_j):
        m.row(
            [(p[i][j], float(r.prompt_len)) for i, r in enumerate(reqs)]
            + [(d[i][j], 1.0) for i in range(n)],
            -inf,
            float(budgets.max_num_batched_tokens),
        )
        m.row([(res[i][j], 1.0) for i in range(n)], -inf, float(budgets.max_num_seqs))
        m.row([(kv[i][j], 1.0) for i in range(n)], -inf, float(cap))
        if j + 1 < big_j:
            m.row([(s[j + 1], 1.0), (s[j], -1.0)] + [(v, -a) for v, a in time_terms(j)], 0.0, inf)
            m.row([(u[j], 1.0), (u[j + 1], -1.0)], 0.0, inf)  # used batches first
        m.row(
            [(cmax, 1.0), (s[j], -1.0), (u[j], -horizon)] + [(v, -a) for v, a in time_terms(j)],
            -horizon,
            inf,
        )
    for q in rel_ids:
        # valid cut: each request's items run in distinct batches after its arrival
        m.row(
            [(comp[q], 1.0)], max(r.arrival + _chain(cost, r) for r in reqs if r.rel_id == q), inf
        )
    m.row([(cmax, 1.0)], max(r.arrival + _chain(cost, r) for r in reqs), inf)

    c = np.zeros(len(m.lb))
    if kind == "latency":
        for q in rel_ids:
            c[comp[q]] = 1.0 / len(rel_ids)
        shift = -sum(min(r.arrival for r in reqs if r.rel_id == q) for q in rel_ids) / len(rel_ids)
    else:
        c[cmax] = 1.0
        shift = 0.0
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array
    except ImportError:
        msg = "the MILP bound needs SciPy: pip install 'semframe[sched]'"
        raise MissingDependencyError(msg) from None
    a = coo_array((m.vals, (m.rows, m.cols)), shape=(len(m.rlo), len(m.lb))).tocsr()
    # HiGHS occasionally ends a feasible instance with "Solve error" (status 4)
    # at the tightest gap; solving again without presolve, then at a looser gap,
    # gets it through.
    for options in (
        {"mip_rel_gap": 1e-9},
        {"mip_rel_gap": 1e-9, "presolve": False},
        {"mip_rel_gap": 1e-6, "presolve": False},
    ):
        sol = milp(
            c,
            constraints=LinearConstraint(a, np.array(m.rlo), np.array(m.rhi)),
            integrality=np.array(m.integ),
            bounds=Bounds(np.array(m.lb), np.array(m.ub)),
            options={"time_limit": time_limit, **options},
        )
        if sol.x is not None:
            break
    if sol.x is None:  # pragma: no cover - the instance is always feasible
        msg = f"the MILP found no schedule: {sol.message}"
        raise RuntimeError(msg)
    x = sol.x
    batches: list[list[tuple[int, str]]] = []
    starts: list[float] = []
    for j in range(big_j):
        items = [(r.req_id, "prefill") for i, r in enumerate(reqs) if x[p[i][j]] > 0.5]
        items += [(r.req_id, "decode") for i, r in enumerate(reqs) if x[d[i][j]] > 0.5]
        if items:
            batches.append(items)
            starts.append(float(x[s[j]]))
    dual = getattr(sol, "mip_dual_bound", None)
    bound = float(sol.fun if dual is None else dual) + shift
    latency, makespan = schedule_cost(reqs, batches, cost)
    return MilpSchedule(
        objective=latency if objective == "latency" else makespan,
        batches=batches,
        starts=starts,
        optimal=sol.status == 0,
        bound=bound,
        num_vars=len(m.lb),
    )


def policy_cost(
    requests: Sequence[TinyRequest],
    scheduler: Scheduler,
    budgets: Budgets,
    *,
    cost: InferMaxCost = A100_13B,
) -> tuple[float, float, int]:
    """Run a policy on the simulator: (average relQuery latency, makespan, preemptions).

    Examples
    --------
    >>> from semframe.serving.sched import make_scheduler
    >>> reqs = [TinyRequest(i, i, 10, 1) for i in range(3)]
    >>> c = InferMaxCost(overhead=1.0, per_token=0.01)
    >>> lat, span, pre = policy_cost(reqs, make_scheduler("fcfs"), Budgets(max_num_seqs=2), cost=c)
    >>> round(lat, 4), pre
    (1.5667, 0)
    """
    sizes: dict[int, int] = {}
    for r in requests:
        sizes[r.rel_id] = sizes.get(r.rel_id, 0) + 1
    sims = [
        SimRequest(
            r.req_id,
            r.rel_id,
            sizes[r.rel_id],
            f"rel{r.rel_id}",
            r.prompt_len,
            r.output_len,
            r.arrival,
            output_len=r.output_len,
        )
        for r in requests
    ]
    res = simulate(sims, scheduler, budgets=budgets, cost=cost)
    first = min(r.arrival for r in requests)
    return res.summary()["avg_latency"], first + res.sim_time, res.preemptions


def tiny_instance(
    seed: int,
    *,
    n_relqueries: int = 3,
    max_size: int = 2,
    max_output: int = 2,
    prompt_lens: Sequence[int] | None = None,
    rate: float = 20.0,
) -> list[TinyRequest]:
    """A tiny relQuery instance: sizes in ``1..max_size``, outputs in ``1..max_output``.

    Prompt lengths are drawn from ``prompt_lens`` (default: those of a
    RelServe-shaped workload over the real tables, if they load; else 100-250)
    and relQueries arrive as a Poisson process at ``rate`` per second.

    Examples
    --------
    >>> inst = tiny_instance(0, prompt_lens=[100, 200])
    >>> len({r.rel_id for r in inst}), all(1 <= r.output_len <= 3 for r in inst)
    (3, True)
    """
    rng = np.random.default_rng(seed)
    pool = list(prompt_lens) if prompt_lens is not None else _real_prompt_lens()
    t = 0.0
    out: list[TinyRequest] = []
    for q in range(n_relqueries):
        if q:
            t += float(rng.exponential(1.0 / rate))
        out_len = int(rng.integers(1, max_output + 1))  # one task type per relQuery
        for _ in range(int(rng.integers(1, max_size + 1))):
            out.append(
                TinyRequest(len(out), q, int(pool[int(rng.integers(len(pool)))]), out_len, t)
            )
    return out


def _real_prompt_lens() -> list[int]:
    try:
        return sorted({r.prompt_len for r in relserve_workload(20, 1.0, seed=0, max_size=10)})
    except Exception:
        return list(range(100, 251, 10))


def gap_study(
    n_instances: int,
    *,
    policies: dict[str, Callable[[], Scheduler]] | None = None,
    budgets: Budgets | None = None,
    cost: InferMaxCost = A100_13B,
    time_limit: float = 30.0,
    **instance: Any,
) -> dict[str, Any]:
    """Each policy's average relQuery latency and makespan against the MILP optimum.

    Every policy runs with whole-prompt prefill (``chunked_prefill=False``) and
    an ample KV cache, so its schedule is one the MILP considers; an instance
    where a policy preempts is reported and left out of that policy's mean.

    Returns a dict with ``headers`` and ``rows`` (policy, mean and max gap in
    percent for latency and makespan, instances where the policy is optimal)
    and ``instances`` (per instance: the optimum, each policy's values).

    Examples
    --------
    >>> from semframe.serving.sched import make_scheduler
    >>> out = gap_study(1, policies={"fcfs": lambda: make_scheduler("fcfs")},
    ...                 n_relqueries=2, max_size=1, max_output=2)
    >>> out["rows"][0][0], out["rows"][0][1] >= -1e-6
    ('fcfs', True)
    """
    b = budgets or Budgets(
        max_num_seqs=2, max_num_batched_tokens=512, num_blocks=256, block_size=16
    )
    pols: dict[str, Callable[[], Scheduler]] = policies or {
        "fcfs": lambda: make_scheduler("fcfs"),
        "sarathi": lambda: make_scheduler("sarathi"),
        "static": lambda: make_scheduler("static"),
        "relserve": lambda: make_scheduler("relserve"),
        "relserve-noABA": lambda: RelServeScheduler(adaptive=False),
        "lpm": lambda: make_scheduler("lpm"),
        "k-lpm(2)": lambda: make_scheduler("k-lpm", k=2),
        "infermax": lambda: make_scheduler("infermax"),
    }
    per_inst: list[dict[str, Any]] = []
    gaps: dict[str, dict[str, list[float]]] = {n: {"latency": [], "makespan": []} for n in pols}
    skipped: dict[str, int] = dict.fromkeys(pols, 0)
    for k in range(n_instances):
        reqs = tiny_instance(k, **instance)
        opt_l = solve_optimal(reqs, b, cost=cost, objective="latency", time_limit=time_limit)
        opt_m = solve_optimal(reqs, b, cost=cost, objective="makespan", time_limit=time_limit)
        row: dict[str, Any] = {
            "requests": len(reqs),
            "relqueries": len({r.rel_id for r in reqs}),
            "tokens_out": sum(r.output_len for r in reqs),
            "opt_latency": opt_l.objective,
            "opt_makespan": opt_m.objective,
            "proved_optimal": opt_l.optimal and opt_m.optimal,
            "milp_vars": opt_l.num_vars,
            "policies": {},
        }
        for name, factory in pols.items():
            lat, span, pre = policy_cost(reqs, factory(), b, cost=cost)
            row["policies"][name] = {"latency": lat, "makespan": span, "preemptions": pre}
            if pre:
                skipped[name] += 1
                continue
            gaps[name]["latency"].append(100 * (lat / opt_l.objective - 1))
            gaps[name]["makespan"].append(100 * (span / opt_m.objective - 1))
        per_inst.append(row)
    headers = [
        "policy",
        "mean latency gap %",
        "max latency gap %",
        "mean makespan gap %",
        "max makespan gap %",
        "latency-optimal",
    ]
    rows: list[list[Any]] = []
    for name, g in gaps.items():
        lat_g, span_g = g["latency"], g["makespan"]
        hits = sum(1 for v in lat_g if v < 1e-6)
        rows.append(
            [
                name,
                float(np.mean(lat_g)) if lat_g else math.nan,
                float(np.max(lat_g)) if lat_g else math.nan,
                float(np.mean(span_g)) if span_g else math.nan,
                float(np.max(span_g)) if span_g else math.nan,
                f"{hits}/{len(lat_g)}",
            ]
        )
    return {
        "headers": headers,
        "rows": rows,
        "instances": per_inst,
        "preempted_instances": skipped,
        "budgets": {
            "max_num_seqs": b.max_num_seqs,
            "max_num_batched_tokens": b.max_num_batched_tokens,
            "kv_tokens": b.kv_tokens,
        },
        "instance_shape": instance,
    }
