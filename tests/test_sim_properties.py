"""Property tests of the engine simulator under every policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semframe.serving.sched import BatchMode, Budgets, Policy, RelServeScheduler, make_scheduler
from semframe.serving.sim import SimRequest, block_hashes, simulate

BS = 4


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[SimRequest], Budgets, bool]:
    n = draw(st.integers(1, 12))
    n_rel = draw(st.integers(1, 4))
    shared = {q: draw(st.lists(st.integers(0, 5), max_size=12)) for q in range(n_rel)}
    # all requests of a relQuery arrive together
    arrivals = {q: draw(st.sampled_from([0.0, 0.01, 0.05, 0.2, 1.0])) for q in range(n_rel)}
    raw = []
    for i in range(n):
        q = draw(st.integers(0, n_rel - 1))
        tail = draw(st.lists(st.integers(0, 5), min_size=1, max_size=20))
        toks = shared[q] + tail
        max_tokens = draw(st.integers(1, 6))
        out = draw(st.integers(1, max_tokens))
        arrival = arrivals[q]
        raw.append((i, q, toks, max_tokens, out, arrival))
    sizes = {q: sum(1 for r in raw if r[1] == q) for q in range(n_rel)}
    reqs = [
        SimRequest(i, q, sizes[q], f"t{q}", len(t), m, a, block_hashes(t, BS), output_len=o)
        for i, q, t, m, o, a in raw
    ]
    need = max(r.prompt_len + r.max_tokens for r in reqs)
    chunked = draw(st.booleans())
    tokens = draw(st.integers(4, 16)) if chunked else need + draw(st.integers(0, 8))
    blocks = -(-need // BS) + 1 + draw(st.integers(0, 10))
    budgets = Budgets(
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=tokens,
        num_blocks=blocks,
        block_size=BS,
        chunked_prefill=chunked,
    )
    return reqs, budgets, chunked


POLICIES = [p.value for p in Policy]


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_finish_once_budgets_and_no_leaks(
    policy: str, w: tuple[list[SimRequest], Budgets, bool]
) -> None:
    reqs, budgets, chunked = w
    sched = make_scheduler(policy)
    if chunked and sched.mode is not BatchMode.DECODE_FIRST:
        budgets = Budgets(
            max_num_seqs=budgets.max_num_seqs,
            max_num_batched_tokens=max(r.prompt_len + r.max_tokens for r in reqs),
            num_blocks=budgets.num_blocks,
            block_size=BS,
        )
    res = simulate(reqs, sched, budgets=budgets, record=True, check_kv=True)
    finished = [rid for b in res.batches for rid in b.finished]
    assert sorted(finished) == sorted(r.req_id for r in reqs)  # exactly once each
    for r in reqs:
        assert r.num_output == r.output_len
        assert r.arrival <= r.t_scheduled <= r.t_first_token <= r.t_finish
    for b in res.batches:
        assert b.num_tokens <= budgets.max_num_batched_tokens
        assert len(b.items) <= budgets.max_num_seqs
        assert len({i.req_id for i in b.items}) == len(b.items)
        assert all(i.num_tokens >= 1 for i in b.items)
        assert all(i.num_context + i.num_tokens <= budgets.kv_tokens for i in b.items)
        assert b.end >= b.start
    # batches never overlap and time only moves forward
    for a, b in zip(res.batches, res.batches[1:], strict=False):
        assert a.end <= b.start + 1e-12


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), threshold=st.sampled_from([0.0, 0.001, 0.01, 0.05]))
def test_starvation_guard_serves_starved_relqueries_first(
    w: tuple[list[SimRequest], Budgets, bool], threshold: float
) -> None:
    """Once a relQuery's unit waiting time passes the threshold, no request of a
    non-starved relQuery, or of one that arrived later, is admitted before it."""
    reqs, budgets, _ = w
    budgets = Budgets(
        max_num_seqs=budgets.max_num_seqs,
        max_num_batched_tokens=max(r.prompt_len + r.max_tokens for r in reqs),
        num_blocks=budgets.num_blocks,
        block_size=BS,
    )
    res = simulate(
        reqs, RelServeScheduler(starvation_threshold=threshold), budgets=budgets, record=True
    )
    by_id = {r.req_id: r for r in reqs}
    first_admit: dict[int, float] = {}
    for b in res.batches:
        for rid in b.admitted:
            first_admit.setdefault(rid, b.start)
    for b in res.batches:
        if not b.admitted:
            continue
        # relQueries with a request still waiting (never admitted) at this batch's start
        waiting_rels: dict[int, float] = {}
        for r in reqs:
            if r.arrival <= b.start and first_admit[r.req_id] > b.start:
                waiting_rels[r.rel_id] = r.arrival
        starved = {
            q: a for q, a in waiting_rels.items() if (b.start - a) / by_id_size(reqs, q) > threshold
        }
        if not starved:
            continue
        oldest = min(starved.values())
        for rid in b.admitted:
            r = by_id[rid]
            if by_id[rid].num_preemptions:
                continue  # a preempted request resumes first by design
            admitted_starved = (b.start - r.arrival) / r.rel_size > threshold
            assert admitted_starved, (rid, b.start)
            assert r.arrival <= oldest + 1e-12 or r.rel_id in starved, (rid, b.start)


def by_id_size(reqs: list[SimRequest], rel: int) -> int:
    return next(r.rel_size for r in reqs if r.rel_id == rel)


def test_starvation_guard_bounds_waiting_of_a_large_relquery() -> None:
    """A big relQuery behind a stream of small ones: the guard caps its wait."""

    def mk(rid: int, rel: int, size: int, arrival: float) -> SimRequest:
        toks = [rel * 100 + rid % 7, *range(20)]
        return SimRequest(
            rid, rel, size, "t", len(toks), 4, arrival, block_hashes(toks, BS), output_len=4
        )

    reqs = [mk(i, 0, 20, 0.0) for i in range(20)]
    rid = 20
    for q in range(1, 60):  # small relQueries keep arriving
        reqs.append(mk(rid, q, 1, 0.0 + 0.02 * q))
        rid += 1
    budgets = Budgets(max_num_seqs=4, max_num_batched_tokens=64, num_blocks=64, block_size=BS)

    def wait_of_big(threshold: float | None) -> float:
        fresh = [
            SimRequest(
                r.req_id,
                r.rel_id,
                r.rel_size,
                r.template,
                r.prompt_len,
                r.max_tokens,
                r.arrival,
                r.block_hashes,
                output_len=r.output_len,
            )
            for r in reqs
        ]
        res = simulate(fresh, RelServeScheduler(starvation_threshold=threshold), budgets=budgets)
        big = [r for r in res.requests if r.rel_id == 0]
        return max(r.t_scheduled for r in big)

    unguarded = wait_of_big(None)
    guarded = wait_of_big(0.005)
    assert guarded < unguarded
    assert math.isfinite(guarded)
