"""The MILP optimum (InferMax's constraint formulation) on tiny instances."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semframe.errors import InputError
from semframe.serving.sched import (
    Budgets,
    InferMaxCost,
    RelServeScheduler,
    Scheduler,
    make_scheduler,
)
from semframe.serving.sched.milp import (
    TinyRequest,
    gap_study,
    policy_cost,
    schedule_cost,
    solve_optimal,
)

# a cost model where overhead, prefill size and decode context all matter
COST = InferMaxCost(
    overhead=0.02, per_token=1e-4, prefill_attn=1e-7, per_prefill=1e-3, decode_kv=2e-4
)


def _item(r: TinyRequest, generated: int) -> float:
    """Simulator's charge for one item, written out independently of the MILP module."""
    if generated == 0:
        c = r.prompt_len
        return COST.per_token * c + COST.prefill_attn * c * c + COST.per_prefill
    return COST.per_token + COST.decode_kv * (r.prompt_len + generated - 1)


def brute_force(reqs: list[TinyRequest], b: Budgets, objective: str) -> float:
    """Every schedule: any admissible subset each batch, or idle to the next arrival."""
    by = {r.req_id: r for r in reqs}
    rels: dict[int, list[TinyRequest]] = {}
    for r in reqs:
        rels.setdefault(r.rel_id, []).append(r)
    best = math.inf

    def value(fin: dict[int, float]) -> float:
        if objective == "makespan":
            return max(fin.values())
        lat = [max(fin[r.req_id] for r in rs) - min(r.arrival for r in rs) for rs in rels.values()]
        return sum(lat) / len(lat)

    def walk(gen: dict[int, int], now: float, fin: dict[int, float]) -> None:
        nonlocal best
        if len(fin) == len(reqs):
            best = min(best, value(fin))
            return
        ready = [i for i, r in by.items() if r.arrival <= now and gen[i] < r.output_len]
        held = [i for i, r in by.items() if 0 < gen[i] < r.output_len]
        for k in range(1, len(ready) + 1):
            for batch in itertools.combinations(ready, k):
                new = [i for i in batch if gen[i] == 0]
                tokens = sum(by[i].prompt_len if gen[i] == 0 else 1 for i in batch)
                kv = sum(by[i].prompt_len + gen[i] - 1 + (i in batch) for i in held + new)
                if (
                    tokens > b.max_num_batched_tokens
                    or len(held) + len(new) > b.max_num_seqs
                    or kv > b.kv_tokens
                ):
                    continue
                end = now + COST.overhead + sum(_item(by[i], gen[i]) for i in batch)
                g2 = dict(gen)
                f2 = dict(fin)
                for i in batch:
                    g2[i] += 1
                    if g2[i] == by[i].output_len:
                        f2[i] = end
                walk(g2, end, f2)
        later = [r.arrival for r in reqs if r.arrival > now]
        if later:
            walk(gen, min(later), fin)

    walk(dict.fromkeys(by, 0), min(r.arrival for r in reqs), {})
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[TinyRequest], Budgets]:
    n = draw(st.integers(1, 3))
    reqs = [
        TinyRequest(
            i,
            draw(st.integers(0, 1)),
            draw(st.integers(1, 300)),
            draw(st.integers(1, 2)),
            draw(st.sampled_from([0.0, 0.01, 0.05])),
        )
        for i in range(n)
    ]
    need = max(r.prompt_len for r in reqs)
    budgets = Budgets(
        max_num_seqs=draw(st.integers(1, 3)),
        max_num_batched_tokens=need + draw(st.sampled_from([0, 100, 1000])),
        num_blocks=256,
        block_size=16,
    )
    return reqs, budgets


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=instances(), objective=st.sampled_from(["latency", "makespan"]))
def test_milp_optimum_equals_brute_force(
    w: tuple[list[TinyRequest], Budgets], objective: str
) -> None:
    reqs, b = w
    sol = solve_optimal(reqs, b, cost=COST, objective=objective)  # type: ignore[arg-type]
    assert sol.optimal
    assert sol.objective == pytest.approx(brute_force(reqs, b, objective), rel=1e-6, abs=1e-9)
    # the returned schedule is a real one and achieves the objective
    lat, span = schedule_cost(reqs, sol.batches, COST)
    assert (lat if objective == "latency" else span) <= sol.objective * (1 + 1e-6) + 1e-9


def test_kv_capacity_binds_in_the_milp() -> None:
    # two 100-token prompts, KV for only one at a time: the MILP serialises them
    reqs = [TinyRequest(0, 0, 100, 2), TinyRequest(1, 1, 100, 2)]
    tight = Budgets(max_num_seqs=4, max_num_batched_tokens=512, num_blocks=8, block_size=16)
    ample = Budgets(max_num_seqs=4, max_num_batched_tokens=512, num_blocks=64, block_size=16)
    t = solve_optimal(reqs, tight, cost=COST)
    a = solve_optimal(reqs, ample, cost=COST)
    assert t.objective == pytest.approx(brute_force(reqs, tight, "latency"))
    assert t.objective > a.objective
    assert max(len(bt) for bt in t.batches) == 1


POLICIES: dict[str, Callable[[], Scheduler]] = {
    "fcfs": lambda: make_scheduler("fcfs"),
    "sarathi": lambda: make_scheduler("sarathi"),
    "static": lambda: make_scheduler("static"),
    "relserve": lambda: make_scheduler("relserve"),
    "relserve-noABA": lambda: RelServeScheduler(adaptive=False),
    "lpm": lambda: make_scheduler("lpm"),
    "k-lpm": lambda: make_scheduler("k-lpm", k=2),
    "infermax": lambda: make_scheduler("infermax"),
}


@st.composite
def relquery_instances(draw: st.DrawFn) -> list[TinyRequest]:
    out: list[TinyRequest] = []
    for q in range(draw(st.integers(1, 3))):
        arrival = draw(st.sampled_from([0.0, 0.02, 0.1]))
        o = draw(st.integers(1, 2))
        for _ in range(draw(st.integers(1, 2))):
            out.append(TinyRequest(len(out), q, draw(st.integers(8, 300)), o, arrival))
    return out


@settings(
    max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(reqs=relquery_instances(), seqs=st.integers(1, 3))
def test_no_policy_beats_the_milp_bound(reqs: list[TinyRequest], seqs: int) -> None:
    b = Budgets(max_num_seqs=seqs, max_num_batched_tokens=512, num_blocks=256, block_size=16)
    lat = solve_optimal(reqs, b, cost=COST, objective="latency", time_limit=20)
    span = solve_optimal(reqs, b, cost=COST, objective="makespan", time_limit=20)
    for name, factory in POLICIES.items():
        p_lat, p_span, pre = policy_cost(reqs, factory(), b, cost=COST)
        assert pre == 0, name
        assert p_lat >= lat.bound * (1 - 1e-6) - 1e-9, name
        assert p_span >= span.bound * (1 - 1e-6) - 1e-9, name


def test_gap_study_reports_every_policy() -> None:
    out = gap_study(1, policies={"fcfs": lambda: make_scheduler("fcfs")}, n_relqueries=2)
    assert out["headers"][0] == "policy"
    (row,) = out["rows"]
    assert row[0] == "fcfs" and row[1] >= -1e-6
    assert out["instances"][0]["proved_optimal"]


def test_bad_instances_are_rejected() -> None:
    with pytest.raises(InputError, match="at least one"):
        solve_optimal([], Budgets())
    with pytest.raises(InputError, match="max_num_batched_tokens"):
        solve_optimal([TinyRequest(0, 0, 600, 1)], Budgets(max_num_batched_tokens=512))
    with pytest.raises(InputError, match="objective"):
        solve_optimal([TinyRequest(0, 0, 6, 1)], Budgets(), objective="p99")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="decode"):
        schedule_cost([TinyRequest(0, 0, 6, 2)], [[(0, "decode")]])
