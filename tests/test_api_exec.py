"""Async execution, rate limits, batch mode and breakpoints, without any server.

The API backends' machinery is tested here with small in-process backends; the
same paths against the official SDKs and the provider emulator are in
``test_api_backends.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends._api import classify_error, retry_after, scrub
from semframe.backends.base import (
    BatchResult,
    BatchStatus,
    Capabilities,
    Completion,
    Request,
    Usage,
)
from semframe.cost.models import SlotCost, choose_breakpoints, min_sharers, openai_cost
from semframe.errors import RequestRejected, RunAborted, TransientError
from semframe.operators.common import compile_call
from semframe.runtime.batch import run_batch, state_path
from semframe.runtime.dispatch import RateLimiter as _RateLimiter
from semframe.runtime.execute import execute


def _plan(n_groups: int = 4, per_group: int = 5, op: str = "map"):  # type: ignore[no-untyped-def]
    df = pd.DataFrame(
        {
            "movie": [f"movie {g}" for g in range(n_groups) for _ in range(per_group)],
            "review": [f"review {g}-{i}" for g in range(n_groups) for i in range(per_group)],
        }
    )
    return compile_call(df, "Summarize {review} of {movie}", op=op, backend="fake").plan


class AsyncBackend:
    """An async backend: answers after a delay, records send and finish times."""

    name = "async-fake"
    model = "m"
    endpoint = None

    def __init__(self, *, delay: float = 0.005, concurrency: int = 8) -> None:
        self.capabilities = Capabilities(
            prefix_cache="shared", max_concurrency=concurrency, async_io=True
        )
        self.cost = SlotCost(self.model, self.count_tokens, concurrency, engine=self.name)
        self.delay = delay
        self.events: list[tuple[str, int]] = []
        self.in_flight = 0
        self.peak = 0
        self.failures: dict[int, list[BaseException]] = {}

    async def acomplete(self, request: Request) -> Completion:
        self.events.append(("send", request.id))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            queue = self.failures.get(request.row)
            if queue:
                raise queue.pop(0)
            return Completion(request.id, f"answer {request.row}", Usage(10, 4, 0, 2))
        finally:
            self.in_flight -= 1
            self.events.append(("done", request.id))

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        raise AssertionError("async backends are driven through acomplete")

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]


def test_async_path_answers_every_row_and_restores_order() -> None:
    plan = _plan()
    backend = AsyncBackend()
    outcomes, stats = execute(plan, backend, max_concurrency=8, progress="off")
    assert [o.value for o in plan.restore(outcomes)] == [f"answer {i}" for i in range(20)]
    assert stats.requests == 20
    assert stats.prompt_tokens == 200
    assert stats.cached_tokens == 80
    assert 1 < backend.peak <= 8


def test_group_members_wait_for_their_leader_then_fan_out() -> None:
    plan = _plan(n_groups=3, per_group=6)
    backend = AsyncBackend(concurrency=16)
    execute(plan, backend, max_concurrency=16, progress="off")
    for group in plan.groups:
        leader_done = backend.events.index(("done", group.start))
        for member in range(group.start + 1, group.stop):
            assert backend.events.index(("send", member)) > leader_done
    # Members were in flight together (fanned out), not sent one after another.
    assert backend.peak >= 5


@pytest.mark.parametrize("warm", [True, False])
def test_warm_start_sends_the_first_request_alone(warm: bool) -> None:
    plan = _plan(n_groups=4, per_group=3)
    backend = AsyncBackend(concurrency=16)
    execute(plan, backend, max_concurrency=16, progress="off", warm=warm)
    first = plan.requests[0].id
    before = backend.events[: backend.events.index(("done", first))]
    if warm:  # the head every prompt shares is cached before anything else is sent
        assert before == [("send", first)]
    else:  # the first wave: one leader per group at once
        assert [e for e in before if e[0] == "send"] == [
            ("send", plan.requests[g.start].id) for g in plan.groups
        ]


def test_warm_start_is_declared_by_the_cost_model() -> None:
    from semframe.cost.models import anthropic_cost

    assert anthropic_cost("claude-sonnet-4-5", None, concurrency=8, ttl="5m").warm_start
    assert not openai_cost("gpt-4o-mini", None, concurrency=8).warm_start
    assert not AsyncBackend().cost.warm_start


def test_warm_start_in_the_estimators_replay() -> None:
    from semframe.cost.simulate import simulate_async

    groups = [(0, 3), (3, 6), (6, 9)]
    for warm in (True, False):
        sent: list[tuple[float, int]] = []
        end = simulate_async(
            groups, 9, 8, 1.0, 0.0, lambda r, t, s=sent: s.append((t, r)), warm=warm
        )
        at_zero = [r for t, r in sent if t == 0.0]
        assert at_zero == ([0] if warm else [0, 3, 6])
        assert end == (3.0 if warm else 2.0)  # one more round trip
        assert sorted(r for _, r in sent) == list(range(9))


def _recorder(into: list[tuple[int, float]]) -> Callable[[int, float], None]:
    """A replay callback that records ``(request, time)``."""

    def record(request: int, at: float) -> None:
        into.append((request, at))

    return record


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    workers=st.integers(1, 5),
    latency=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    send_s=st.sampled_from([0.0, 0.01, 0.4]),
    receive_s=st.sampled_from([0.0, 0.02, 0.7]),
    warm=st.booleans(),
)
def test_the_estimators_replay_is_the_same_with_and_without_arrivals_watched(
    sizes: list[int], workers: int, latency: float, send_s: float, receive_s: float, warm: bool
) -> None:
    """Unwatched, an arrival goes straight to its completion: the same completions and end."""
    from semframe.cost.simulate import simulate_async

    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    groups = [(a, a + k) for a, k in zip(starts, sizes, strict=True)]
    n = groups[-1][1]
    runs: list[tuple[float, list[tuple[int, float]], list[tuple[int, float]]]] = []
    for watch in (True, False):
        arrived: list[tuple[int, float]] = []
        done: list[tuple[int, float]] = []
        end = simulate_async(
            groups,
            n,
            workers,
            latency,
            send_s,
            _recorder(arrived) if watch else None,
            _recorder(done),
            receive_s=receive_s,
            warm=warm,
        )
        runs.append((end, arrived, done))
    (end, arrived, done), (end_alone, _, done_alone) = runs
    assert (end, done) == (end_alone, done_alone)
    assert sorted(r for r, _ in arrived) == sorted(r for r, _ in done) == list(range(n))
    assert all(t_done == t + latency for (_, t), (_, t_done) in zip(arrived, done, strict=True))


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.integers(1, 5), min_size=1, max_size=12),
    clients=st.integers(1, 4),
    seed=st.randoms(use_true_random=False),
    workers=st.integers(1, 4),
    warm=st.booleans(),
)
def test_several_clients_replayed_against_one_clock(
    groups: list[int], clients: int, seed: random.Random, workers: int, warm: bool
) -> None:
    """executor="ray" replicas of an API backend: each client as if alone, events merged in time."""
    from types import SimpleNamespace

    from semframe.cost.simulate import client_bounds, simulate_async, simulate_clients

    group_of = [g for g, size in enumerate(groups) for _ in range(size)]
    plan: Any = SimpleNamespace(requests=[SimpleNamespace(group=g) for g in group_of])
    shards: list[list[int]] = [[] for _ in range(clients)]
    for g in range(len(groups)):  # whole groups to a random client, in plan order
        shards[seed.randrange(clients)].extend(i for i, x in enumerate(group_of) if x == g)
    events: list[tuple[float, str, int]] = []
    end = simulate_clients(
        plan,
        shards,
        workers,
        1.0,
        0.1,
        lambda i, t: events.append((t, "arrive", i)),
        lambda i, t: events.append((t, "complete", i)),
        receive_s=0.05,
        warm=warm,
    )
    times = [t for t, _, _ in events]
    assert times == sorted(times)  # one clock
    for kind in ("arrive", "complete"):  # every request once, nothing lost or doubled
        assert sorted(i for _, k, i in events if k == kind) == list(range(len(group_of)))
    ends = []
    for ids in shards:  # each client as if it were alone
        if not ids:
            continue
        alone: list[tuple[float, int]] = []
        ends.append(
            simulate_async(
                client_bounds(plan, ids),
                len(ids),
                min(workers, len(ids)),
                1.0,
                0.1,
                lambda r, t, ids=ids, out=alone: out.append((t, ids[r])),
                receive_s=0.05,
                warm=warm,
            )
        )
        assert alone == [(t, i) for t, k, i in events if k == "arrive" and i in set(ids)]
    assert end == max(ends)


def test_transient_errors_retried_with_retry_after_rejected_rows_not() -> None:
    plan = _plan(n_groups=1, per_group=4)
    backend = AsyncBackend()
    backend.failures = {
        0: [TransientError("429", retry_after=0.01), TransientError("503", retry_after=0.0)],
        1: [RequestRejected("HTTP 400: prompt too long")],
        2: [TransientError("timeout", retry_after=0.0)] * 5,
    }
    outcomes, stats = execute(plan, backend, max_retries=2, progress="off")
    by_row = dict(zip(plan.ordering.rows, outcomes, strict=True))
    assert by_row[0].ok and by_row[0].attempts == 3
    assert by_row[1].error_kind == "backend" and "400" in str(by_row[1].error)
    assert by_row[1].attempts == 1
    assert by_row[2].error_kind == "backend" and by_row[2].attempts == 3
    assert by_row[3].ok
    assert stats.errors == 2
    assert stats.retries == 4


def test_run_aborted_keeps_answered_rows() -> None:
    plan = _plan(n_groups=1, per_group=6)
    backend = AsyncBackend(concurrency=1)
    backend.failures = {plan.ordering.rows[3]: [RunAborted("openai: HTTP 401: bad key")]}
    with pytest.raises(RunAborted, match="401") as info:
        execute(plan, backend, max_concurrency=1, progress="off")
    assert info.value.answered == 3
    answered = [o for o in info.value.outcomes if o is not None]
    assert len(answered) == 3 and all(o.ok for o in answered)
    assert "3 of 6 rows had been answered" in str(info.value)


def test_deadline_turns_a_hang_into_a_retry() -> None:
    plan = _plan(n_groups=1, per_group=2)
    backend = AsyncBackend(delay=5.0)
    outcomes, _ = execute(plan, backend, max_retries=0, timeout=0.05, progress="off")
    assert all(o.error_kind == "backend" and "no answer within" in str(o.error) for o in outcomes)


def test_rate_limiter_spaces_requests() -> None:
    now = [0.0]
    limiter = _RateLimiter(rpm=60, tpm=None, clock=lambda: now[0])
    # Ten seconds of burst at 1 request/s, then one per second.
    assert all(limiter.wait_time(100) == 0 for _ in range(10))
    wait = limiter.wait_time(100)
    assert wait == pytest.approx(1.0)
    now[0] += wait
    assert limiter.wait_time(100) == 0


def test_token_limit_and_oversized_requests() -> None:
    now = [0.0]
    limiter = _RateLimiter(rpm=None, tpm=6000, clock=lambda: now[0])  # 100 tokens/s, burst 1000
    assert limiter.wait_time(600) == 0
    assert limiter.wait_time(600) == pytest.approx(2.0)
    now[0] += 10
    assert limiter.wait_time(50_000) == 0  # clamped to the burst size, never stuck


def test_async_run_honours_rpm() -> None:
    plan = _plan(n_groups=1, per_group=3)
    backend = AsyncBackend()
    _, stats = execute(plan, backend, rpm=600, progress="off")  # burst 100: no wait
    assert stats.errors == 0


# -- breakpoints -----------------------------------------------------------------


@given(st.floats(1.0, 4.0), st.floats(0.0, 0.9))
def test_min_sharers_repay_the_write_premium(write: float, read: float) -> None:
    n = min_sharers(write, read)
    assert write + read * (n - 1) < n  # n sharers: one write, n - 1 reads, cheaper than n sends
    assert n == 1 or not write + read * (n - 2) < n - 1  # and n - 1 would not be


@given(
    st.lists(
        st.tuples(st.integers(1, 10_000), st.integers(1, 50), st.integers(0, 5000)),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([1.25, 2.0]),
)
@settings(max_examples=200, deadline=None)
def test_breakpoints_at_most_four_and_only_where_they_pay(
    raw: list[tuple[int, int, int]], write: float
) -> None:
    levels = sorted({(end, shared) for end, shared, _ in raw})
    tokens = sorted(t for _, _, t in raw)[: len(levels)]
    while len(tokens) < len(levels):
        tokens.append(tokens[-1])
    need = min_sharers(write)
    cuts = choose_breakpoints(levels, tokens, minimum=1024, sharers=need)
    assert len(cuts) <= 4
    assert cuts == sorted(cuts)
    by_end = {end: (shared, count) for (end, shared), count in zip(levels, tokens, strict=True)}
    for cut in cuts:
        shared, count = by_end[cut]
        assert count >= 1024 and shared >= need


def test_plan_prefix_levels_are_shared_by_exactly_that_run() -> None:
    plan = _plan(n_groups=3, per_group=4)
    prompts = [r.prompt for r in plan.requests]
    for r in plan.requests:
        assert r.prefix[0] == (len(plan.instructions) + 2, len(plan.requests))
        for end, shared in r.prefix:
            run = [i for i, p in enumerate(prompts) if p[:end] == r.prompt[:end]]
            assert len(run) == shared
            assert run == list(range(run[0], run[0] + shared))
            assert r.id in run


# -- error classification ------------------------------------------------------


class _Resp:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class _StatusError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status
        self.response = _Resp(headers or {})
        self.body = {"error": {"message": message}}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, TransientError),
        (408, TransientError),
        (409, TransientError),
        (500, TransientError),
        (529, TransientError),
        (400, RequestRejected),
        (422, RequestRejected),
        (401, RunAborted),
        (403, RunAborted),
        (404, RunAborted),
    ],
)
def test_classify_status(status: int, kind: type) -> None:
    err = classify_error(
        _StatusError(status, "nope sk-secretsecret123", {"retry-after": "3"}),
        provider="openai",
        secrets=["sk-secretsecret123"],
    )
    assert isinstance(err, kind)
    assert "secret" not in str(err)
    if kind is TransientError:
        assert isinstance(err, TransientError)
        assert err.retry_after == 3.0


def test_scrub_and_retry_after() -> None:
    assert scrub("key sk-ant-api03-abcdefghij end") == "key *** end"
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after({}) is None


# -- batch mode --------------------------------------------------------------------


class BatchFake:
    """A batch API in memory: batches finish after ``polls`` status checks."""

    name = "openai"
    model = "gpt-4o-mini"
    endpoint = None

    def __init__(self, *, polls: int = 2, answer: str = '{"answer": "yes"}') -> None:
        self.capabilities = Capabilities(
            prefix_cache="shared", max_concurrency=4, batch_api=True, batch_limit=7
        )
        self.cost = openai_cost(self.model, None, concurrency=4)
        self.polls = polls
        self.answer = answer
        self.batches: dict[str, list[Request]] = {}
        self.checks: dict[str, int] = {}
        self.fail_once: set[int] = set()
        self.reject: set[int] = set()
        self.submitted: list[int] = []

    def batch_submit(self, requests: Sequence[Request]) -> str:
        batch_id = f"batch_{len(self.batches)}"
        self.batches[batch_id] = list(requests)
        self.checks[batch_id] = 0
        self.submitted.append(len(requests))
        return batch_id

    def batch_status(self, batch_id: str) -> BatchStatus:
        self.checks[batch_id] += 1
        done = self.checks[batch_id] > self.polls
        return BatchStatus(batch_id, "completed" if done else "in_progress", done)

    def batch_results(self, batch_id: str) -> dict[int, BatchResult]:
        out: dict[int, BatchResult] = {}
        for r in self.batches[batch_id]:
            if r.row in self.reject:
                out[r.id] = RequestRejected("HTTP 400: bad")
            elif r.row in self.fail_once:
                self.fail_once.discard(r.row)
                out[r.id] = TransientError("HTTP 500")
            else:
                out[r.id] = Completion(r.id, self.answer, Usage(100, 0, 0, 5))
        return out

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        raise AssertionError("batch mode must not send single requests")

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [1 for _ in texts]


def test_batch_round_trip_splits_retries_and_cleans_up(tmp_path: Path) -> None:
    plan = _plan(n_groups=4, per_group=4, op="filter")
    backend = BatchFake()
    backend.fail_once = {3, 9}
    backend.reject = {5}
    naps: list[float] = []
    outcomes, stats = run_batch(
        plan, backend, directory=tmp_path, poll_seconds=7.0, progress="off", sleep=naps.append
    )
    rows = plan.restore(outcomes)
    assert [o.ok for o in rows] == [i != 5 for i in range(16)]
    assert rows[5].error_kind == "backend"
    assert backend.submitted == [7, 7, 2, 2]  # 16 in chunks of 7, then the 2 retried rows
    assert set(naps) == {7.0}
    assert stats.batch and stats.errors == 1 and stats.retries == 2
    assert stats.dollars is not None and stats.dollars > 0
    assert not list(tmp_path.rglob("*.json"))  # state file removed when done


def test_batch_resumes_after_the_process_died(tmp_path: Path) -> None:
    plan = _plan(n_groups=2, per_group=3, op="filter")
    backend = BatchFake(polls=1000)

    class Died(Exception):
        pass

    def die(_: float) -> None:
        raise Died

    with pytest.raises(Died):
        run_batch(plan, backend, directory=tmp_path, progress="off", sleep=die)
    state = state_path(plan, backend, tmp_path)
    assert json.loads(state.read_text())["rounds"][0]["batches"][0]["id"] == "batch_0"
    # A new process: same call, same state file; the batch is not submitted again.
    backend.polls = 0
    outcomes, _ = run_batch(plan, backend, directory=tmp_path, progress="off", sleep=die)
    assert backend.submitted == [6]
    assert all(o.ok for o in outcomes)
    assert not state.exists()


def test_batch_true_through_the_accessor_needs_a_batch_api(fake: object) -> None:
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(semframe.ConfigError, match="no batch API"):
        df.llm.map("Echo {t}", backend="fake", batch=True)
