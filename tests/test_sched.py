"""Unit tests of the scheduling policies, cost models and KV cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from semframe.errors import ConfigError, InputError
from semframe.serving.sched import (
    A100_13B,
    BatchShape,
    Budgets,
    Calibration,
    InferMaxCost,
    InferMaxScheduler,
    LpmScheduler,
    Policy,
    RelServeCost,
    RelServeScheduler,
    Sample,
    SchedContext,
    SchedRequest,
    StaticPriorityScheduler,
    calibrate,
    fit_infermax,
    fit_relserve,
    make_scheduler,
    profile_shapes,
)
from semframe.serving.sim import KVCache, SimRequest, block_hashes, simulate


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as exc:
        make_scheduler("shortest-job")
    msg = str(exc.value)
    assert "'shortest-job'" in msg
    for p in Policy:
        assert repr(p.value) in msg


def test_every_policy_builds_and_names_itself() -> None:
    for p in Policy:
        assert make_scheduler(p).name == p.value


def test_infermax_fit_recovers_coefficients_from_noisy_timings() -> None:
    true = InferMaxCost(0.02, 1.4e-4, 2.6e-9, 5e-7, 5e-5, 5e-7)
    shapes = profile_shapes()
    exact = fit_infermax([Sample(s, true.batch_time(s)) for s in shapes])
    for got, want in zip(exact.coefficients(), true.coefficients(), strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    # with 0.2% timing noise the terms that dominate batch time stay within 2%
    rng = np.random.default_rng(0)
    samples = [Sample(s, true.batch_time(s) * (1 + rng.normal(0, 0.002))) for s in shapes]
    fit = fit_infermax(samples)
    assert fit.decode_kv == pytest.approx(true.decode_kv, rel=0.02)
    assert fit.overhead == pytest.approx(true.overhead, rel=0.02)
    assert fit.per_token == pytest.approx(true.per_token, rel=0.02)


def test_relserve_fit_uses_uncached_tokens() -> None:
    rs = RelServeCost(alpha_p=2e-4, beta_p=0.03, alpha_d=3e-4, beta_d=0.02)
    pre = [
        Sample(BatchShape(prefill=((c, 0),), uncached=u), rs.prefill_time(u))
        for c, u in [(100, 10), (1000, 400), (2000, 2000), (500, 0)]
    ]
    dec = [Sample(BatchShape(decode=(10,) * n), rs.decode_time(n)) for n in (1, 50, 200)]
    fit = fit_relserve(pre + dec)
    assert fit.alpha_p == pytest.approx(2e-4)
    assert fit.beta_p == pytest.approx(0.03)
    assert fit.alpha_d == pytest.approx(3e-4)
    assert fit.beta_d == pytest.approx(0.02)


def test_fit_errors_name_the_problem() -> None:
    with pytest.raises(InputError, match="at least one"):
        fit_infermax([])
    with pytest.raises(InputError, match="decode"):
        fit_relserve([Sample(BatchShape(prefill=((5, 0),)), 1.0)] * 3)


def test_calibrate_writes_json_that_round_trips(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "cal.json"
    calls: list[BatchShape] = []

    def engine(shape: BatchShape) -> float:
        calls.append(shape)
        return A100_13B.batch_time(shape)

    cal = calibrate(engine, repeats=2, path=path, source="test engine")
    assert len(calls) == 2 * cal.num_samples
    back = Calibration.from_json(path.read_text())
    assert back == cal
    assert json.loads(path.read_text())["source"] == "test engine"
    assert cal.infermax.per_token == pytest.approx(A100_13B.per_token, rel=1e-6)


def _req(rid: int, rel: int, size: int, prompt: int, out: int, arrival: float = 0.0) -> SimRequest:
    toks = [rel * 1000 + rid, *range(prompt - 1)]
    return SimRequest(
        rid, rel, size, f"t{rel}", prompt, out, arrival, block_hashes(toks, 16), output_len=out
    )


def _ctx(now: float = 0.0) -> SchedContext:
    return SchedContext(now, [], KVCache(64, 16), Budgets())


def test_static_priority_orders_small_relqueries_first() -> None:
    s = StaticPriorityScheduler()
    big = [_req(i, 0, 10, 100, 50) for i in range(10)]
    small = [_req(10 + i, 1, 2, 100, 5, arrival=1.0) for i in range(2)]
    for r in big + small:
        s.add_waiting(r, r.arrival)
    s.update(_ctx(1.0))
    order = [r.rel_id for r in s.iter_waiting(_ctx(1.0))]
    assert order == [1, 1] + [0] * 10


def test_relserve_priority_drops_as_a_relquery_progresses() -> None:
    s = RelServeScheduler(starvation_threshold=None)
    reqs = [_req(i, 0, 8, 200, 10) for i in range(8)]
    for r in reqs:
        s.add_waiting(r, 0.0)
    s.update(_ctx())
    before = s.rels[0].prio
    for r in reqs[:6]:
        s.remove_waiting(r)
    s.on_finished(reqs[:6], 0.5)
    s.update(_ctx(0.5))
    assert s.rels[0].prio < before


def test_relserve_reuses_priority_while_all_requests_wait() -> None:
    s = RelServeScheduler(starvation_threshold=None)
    for r in [_req(i, 0, 3, 50, 5) for i in range(3)]:
        s.add_waiting(r, 0.0)
    s.update(_ctx())
    calls = s.pem_calls
    s.update(_ctx(0.1))
    s.update(_ctx(0.2))
    assert s.pem_calls == calls
    s.remove_waiting(next(iter(s.iter_waiting(_ctx(0.2)))))
    s.update(_ctx(0.3))
    assert s.pem_calls == calls + 1


def test_relserve_starvation_sets_priority_zero() -> None:
    s = RelServeScheduler(starvation_threshold=0.1)
    big = [_req(i, 0, 4, 100, 100) for i in range(4)]
    small = _req(4, 1, 1, 10, 1, arrival=0.3)
    for r in [*big, small]:
        s.add_waiting(r, r.arrival)
    s.update(_ctx(0.3))
    assert next(iter(s.iter_waiting(_ctx(0.3)))).rel_id == 1  # small first
    s.update(_ctx(0.5))  # big has waited 0.5 s / 4 requests > 0.1
    assert s.rels[0].prio == 0.0
    assert next(iter(s.iter_waiting(_ctx(0.5)))).rel_id == 0


def test_klpm_alternates_oldest_and_longest_match() -> None:
    kv = KVCache(64, 4)
    shared = [7, 7, 7, 7, 8, 8, 8, 8]
    warm = SchedRequest(99, 99, 1, "t", 9, 1, 0.0, block_hashes([*shared, 1], 4))
    kv.admit(warm)
    kv.grow(warm, 9)
    kv.commit(warm, 9)
    kv.free(warm)

    def mk(i: int, toks: list[int]) -> SchedRequest:
        return SchedRequest(i, i, 1, "t", len(toks), 1, float(i), block_hashes(toks, 4))

    old = [mk(i, [i + 20] * 9) for i in range(3)]
    hits = [mk(10 + i, [*shared, i]) for i in range(3)]
    ctx = SchedContext(0.0, [], kv, Budgets(block_size=4))
    k2 = LpmScheduler(k=2, random_ties=False)
    lpm = LpmScheduler(random_ties=False)
    for s in (k2, lpm):
        for r in old + hits:
            s.add_waiting(r, r.arrival)
    assert [r.req_id for r in lpm.iter_waiting(ctx)][:3] == [10, 11, 12]
    assert [r.req_id for r in k2.iter_waiting(ctx)] == [0, 10, 1, 11, 2, 12]


def test_infermax_evicts_short_requests_first_and_learns_output_lengths() -> None:
    s = InferMaxScheduler()
    a = SchedRequest(0, 0, 1, "t", 10, 50, 0.0, num_computed=10)
    b = SchedRequest(1, 0, 1, "t", 10, 50, 0.0, num_computed=300)
    assert [r.req_id for r in s.running_order([a, b])] == [1, 0]  # victim from the end: a
    assert s.reserve_tokens(a) == 50
    from semframe.serving.sched import BatchRecord

    s.observe(BatchRecord(0, 1, (), finished=(1, 2, 3), output_lens=(3, 3, 4)), _ctx())
    assert s.reserve_tokens(a) == 4


def test_relserve_aba_prefers_prefill_of_a_shorter_relquery() -> None:
    s = RelServeScheduler(starvation_threshold=None)
    long = [_req(i, 0, 4, 100, 100) for i in range(4)]
    short = _req(4, 1, 1, 20, 5)
    for r in [*long, short]:
        s.add_waiting(r, 0.0)
    for r in long:
        s.remove_waiting(r)
    s.update(_ctx())
    assert s.prefer_prefill([short], long, _ctx())  # m+ > m-: preempt the longer relQuery


def test_kv_lru_evicts_least_recently_freed_prefix() -> None:
    kv = KVCache(num_blocks=4, block_size=2)
    a = SchedRequest(0, 0, 1, "t", 4, 1, 0.0, block_hashes([1, 2, 3, 4], 2))
    b = SchedRequest(1, 0, 1, "t", 4, 1, 0.0, block_hashes([5, 6, 7, 8], 2))
    for r in (a, b):
        kv.admit(r)
        kv.grow(r, 4)
        kv.commit(r, 4)
        kv.free(r)
    kv.check()
    c = SchedRequest(2, 0, 1, "t", 4, 1, 0.0, block_hashes([9, 9, 9, 9], 2))
    kv.admit(c)
    kv.grow(c, 4)  # needs 2 blocks: a's are the least recently used
    kv.check()
    assert kv.cached_prefix(a) == 0
    assert kv.cached_prefix(b) == 4
    assert kv.probe_prefix(b) == 4


def test_simulate_rejects_requests_that_cannot_fit() -> None:
    r = _req(0, 0, 1, 5000, 5)
    with pytest.raises(InputError, match="max_num_batched_tokens"):
        simulate([r], make_scheduler("fcfs"))
    with pytest.raises(InputError, match="KV tokens"):
        simulate(
            [_req(0, 0, 1, 100, 5)],
            make_scheduler("sarathi"),
            budgets=Budgets(num_blocks=2, chunked_prefill=True),
        )


def test_prefix_cache_hits_for_shared_instructions() -> None:
    reqs = [_req(i, 0, 4, 64, 2) for i in range(4)]
    shared = [5] * 48
    reqs = [
        SimRequest(
            r.req_id,
            0,
            4,
            "t",
            64,
            2,
            0.1 * i,
            block_hashes([*shared, *[i] * 16], 16),
            output_len=2,
        )
        for i, r in enumerate(reqs)
    ]
    res = simulate(reqs, make_scheduler("fcfs"))
    assert res.cache_hit_rate == pytest.approx(3 * 48 / (4 * 64))


def test_relserve_priority_drops_once_part_of_a_relquery_is_prefilled() -> None:
    # the paper drops prefilled requests from the decomposition: progress lowers the estimate
    s = RelServeScheduler(starvation_threshold=None)
    reqs = [_req(i, 0, 40, 200, 100) for i in range(40)]
    for r in reqs:
        s.add_waiting(r, 0.0)
    s.update(_ctx())
    fresh = s.rels[0].prio
    for r in reqs[:20]:
        s.remove_waiting(r)
    s.update(_ctx(0.1))
    assert s.rels[0].prio < fresh
    # counting the running requests' decode steps in series (ablation) raises it instead
    a = RelServeScheduler(starvation_threshold=None, count_running=True)
    for r in reqs:
        a.add_waiting(r, 0.0)
    a.update(_ctx())
    for r in reqs[:20]:
        a.remove_waiting(r)
    a.update(_ctx(0.1))
    assert a.rels[0].prio > fresh
