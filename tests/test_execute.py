"""Group-aware dispatch, retries and statistics of the executor."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest

from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend
from semframe.errors import BudgetExceeded, TransientError
from semframe.operators.common import compile_call
from semframe.runtime.execute import execute


def _plan(df: pd.DataFrame, template: str, reorder: str = "none"):  # type: ignore[no-untyped-def]
    return compile_call(df, template, op="map", backend="fake", reorder=reorder).plan


class Recorder:
    """Responder that sleeps a little and records when each request ran."""

    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.spans: dict[int, tuple[float, float]] = {}

    def __call__(self, request: Request) -> str:
        start = time.monotonic()
        time.sleep(self.delay)
        with self.lock:
            self.spans[request.id] = (start, time.monotonic())
        return "ok"


def test_group_leader_finishes_before_the_rest_start() -> None:
    movies = [m for m in "ABCDEFGH" for _ in range(5)]
    df = pd.DataFrame({"movie": movies, "review": [f"r{i}" for i in range(len(movies))]})
    plan = _plan(df, "Review {review} of {movie}", reorder="stats")
    assert len(plan.groups) == 8
    recorder = Recorder()
    backend = FakeBackend(recorder, max_concurrency=4)
    outcomes, stats = execute(plan, backend, progress="off")
    assert all(o.ok for o in outcomes)
    assert stats.workers == 4
    for group in plan.groups:
        leader_end = recorder.spans[group.start][1]
        for pos in range(group.start + 1, group.stop):
            assert recorder.spans[pos][0] >= leader_end
    # Requests follow their group's leader onto its slot; only tail stealing moves them.
    slot_of = dict(zip([r.id for r in backend.history], backend.slots, strict=True))
    on_leader_slot = sum(
        slot_of[r.id] == slot_of[plan.groups[r.group].start] for r in plan.requests
    )
    assert on_leader_slot >= 0.75 * len(plan.requests)


def test_idle_workers_help_with_big_groups_after_the_leader() -> None:
    df = pd.DataFrame({"movie": ["A"] * 12, "review": [f"r{i}" for i in range(12)]})
    plan = _plan(df, "Review {review} of {movie}", reorder="stats")
    assert len(plan.groups) == 1
    recorder = Recorder(delay=0.01)
    backend = FakeBackend(recorder, max_concurrency=3)
    outcomes, _ = execute(plan, backend, progress="off")
    assert all(o.ok for o in outcomes)
    leader_end = recorder.spans[0][1]
    assert all(recorder.spans[i][0] >= leader_end for i in range(1, 12))
    assert len(set(backend.slots)) > 1, "other slots help once the prefix is cached"


def test_per_slot_cache_hits_follow_groups() -> None:
    movies = [m for m in "ABCD" for _ in range(6)]
    df = pd.DataFrame(
        {
            "movie_info": [f"info about {m} " * 20 for m in movies],
            "review": [f"r{i}" for i in range(len(movies))],
        }
    )
    plan = _plan(df, "Review {review} given {movie_info}", reorder="stats")
    _, grouped = execute(plan, FakeBackend(max_concurrency=4), progress="off")
    naive = _plan(df.sample(frac=1, random_state=1), "Review {review} given {movie_info}")
    _, shuffled = execute(naive, FakeBackend(max_concurrency=4), progress="off")
    assert grouped.cached_share > 0.6
    assert grouped.cached_share > shuffled.cached_share


def test_retry_after_is_honoured() -> None:
    df = pd.DataFrame({"x": ["a"]})
    plan = _plan(df, "{x}")
    backend = FakeBackend()
    backend.enqueue(TransientError("429 slow down", retry_after=2.5), "fine")
    sleeps: list[float] = []
    outcomes, stats = execute(plan, backend, sleep=sleeps.append, progress="off")
    assert outcomes[0].value == "fine"
    assert sleeps == [2.5]
    assert (stats.requests, stats.retries, stats.errors) == (2, 1, 0)


def test_unexpected_backend_errors_propagate() -> None:
    df = pd.DataFrame({"x": list("abcdef")})
    plan = _plan(df, "{x}")
    backend = FakeBackend(max_concurrency=3)
    backend.enqueue("ok", RuntimeError("engine crashed"))
    with pytest.raises(RuntimeError, match="engine crashed"):
        execute(plan, backend, progress="off")


def test_naive_dispatch_baseline_answers_everything_without_slot_hints() -> None:
    movies = [m for m in "ABC" for _ in range(4)]
    df = pd.DataFrame({"movie": movies, "review": [f"r{i}" for i in range(len(movies))]})
    plan = _plan(df, "Review {review} of {movie}", reorder="stats")
    backend = FakeBackend(Recorder(), max_concurrency=3)
    outcomes, stats = execute(plan, backend, progress="off", group_aware=False)
    assert [o.value for o in outcomes] == ["ok"] * len(df)
    assert set(backend.slots) == {None}
    assert stats.workers == 3


def test_a_halt_event_stops_sending_and_keeps_what_was_answered() -> None:
    """``halt=`` (a Ray replica's stop): nothing more is sent once it is set."""
    df = pd.DataFrame({"movie": ["A"] * 40, "review": [f"r{i}" for i in range(40)]})
    plan = _plan(df, "Review {review} of {movie}")
    halt = threading.Event()
    seen: list[int] = []

    def on_outcome(request_id: int, outcome: object) -> None:
        seen.append(request_id)
        if len(seen) == 5:
            halt.set()

    backend = FakeBackend(Recorder(0.001), max_concurrency=2)
    with pytest.raises(BudgetExceeded) as info:
        execute(plan, backend, progress="off", halt=halt, on_outcome=on_outcome)
    outcomes = info.value.outcomes
    assert outcomes is not None
    answered = [o for o in outcomes if o is not None]
    assert 5 <= len(answered) <= 5 + 2  # the requests in flight when it was set complete
    assert len(backend.history) == len(answered)  # and nothing else was sent
    assert all(o.ok for o in answered)


def test_no_halt_event_set_sends_everything() -> None:
    df = pd.DataFrame({"movie": ["A"] * 10, "review": [f"r{i}" for i in range(10)]})
    plan = _plan(df, "Review {review} of {movie}")
    outcomes, _ = execute(plan, FakeBackend(), progress="off", halt=threading.Event())
    assert len(outcomes) == 10 and all(o.ok for o in outcomes)


def test_the_garbage_collector_is_paused_during_a_run_and_back_after() -> None:
    """A run pauses the cyclic collector (paced), and turns it back on however it ends."""
    import gc

    df = pd.DataFrame({"movie": ["A", "B", "C"], "review": ["x", "y", "z"]})
    plan = _plan(df, "Review {review} of {movie}")
    seen: list[bool] = []

    def respond(request: Request) -> str:
        seen.append(gc.isenabled())
        return "ok"

    assert gc.isenabled()
    execute(plan, FakeBackend(respond), progress="off")
    assert seen == [False, False, False]
    assert gc.isenabled()

    def fail(request: Request) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(plan, FakeBackend(fail), progress="off")
    assert gc.isenabled()
