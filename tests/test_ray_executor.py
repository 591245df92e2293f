"""executor="ray" on a local 2-CPU Ray cluster: same answers, order kept, faults survived.

One Ray cluster serves the whole module (starting one takes seconds); the
replicas are reused between tests whose settings match. Backends registered
here travel to the replicas with their factory (this module is pickled by
value, since the replicas cannot import it).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends import BACKENDS, get_backend, register_backend, reset_backends
from semframe.backends.fake import FakeBackend
from semframe.cost.models import LatencyModel
from semframe.errors import BudgetExceeded, ConfigError
from semframe.operators.common import compile_call
from semframe.testing.emulator import Latency, ProviderEmulator, default_responder

ray = pytest.importorskip("ray")

from semframe.runtime import ray_executor  # noqa: E402
from semframe.runtime.estimate import estimate_plan  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

RAY = {"executor": "ray", "replicas": 2, "ray_num_cpus": 0.5}
TEMPLATE = "Summarize {review} of {movie}"


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray_executor.shutdown_replicas()
    ray.shutdown()
    reset_backends()
    gc.collect()  # clients of this module's runs are closed here, not in a later test


def _movies(n: int, movies: int = 5) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "movie": [f"movie number {i % movies} with a longer title" for i in range(n)],
            "review": [f"review {i}: a fine film" for i in range(n)],
        }
    )


def _pid_backend(model: str | None, settings: object) -> FakeBackend:
    """A fake backend answering with the process it runs in (which replica answered)."""
    return FakeBackend(lambda request: f"pid {os.getpid()}", model=model or "pid")


def test_same_results_as_the_in_process_executor() -> None:
    df = _movies(30)
    df.index = [i % 7 for i in range(30)]  # duplicated labels
    local = df.llm.map(TEMPLATE, backend="fake", cache=False)
    remote = df.llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
    pd.testing.assert_frame_equal(local, remote)
    stats = semframe.last_run()
    assert stats is not None and len(stats.replicas) == 2
    assert sum(r.rows for r in stats.replicas) == 30
    assert all(r.rows > 0 for r in stats.replicas)
    assert stats.prompt_tokens == sum(r.prompt_tokens for r in stats.replicas)
    assert stats.cached_tokens == sum(r.cached_tokens for r in stats.replicas)
    assert "on 2 Ray replicas" in repr(stats)
    kept = df.llm.filter("Is {review} of {movie} good?", backend="fake", cache=False, **RAY)
    pd.testing.assert_frame_equal(
        kept, df.llm.filter("Is {review} of {movie} good?", backend="fake", cache=False)
    )


frames = st.lists(
    st.tuples(st.sampled_from(["Alien", "Heat", "Up"]), st.text("abc", max_size=4)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames, st.booleans())
def test_order_and_index_restored(rows: list[tuple[str, str]], polars: bool) -> None:
    data = {"movie": [m for m, _ in rows], "review": [r for _, r in rows]}
    if polars:
        frame = pl.DataFrame(data)
        got = frame.llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
        want = frame.llm.map(TEMPLATE, backend="fake", cache=False)
        assert got.equals(want)
    else:
        df = pd.DataFrame(data, index=[i // 2 for i in range(len(rows))][::-1])
        got_pd = df.llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
        pd.testing.assert_frame_equal(got_pd, df.llm.map(TEMPLATE, backend="fake", cache=False))
        assert list(got_pd.index) == list(df.index)


def test_each_prefix_group_is_answered_by_one_replica() -> None:
    register_backend("pid", _pid_backend)
    df = _movies(24, movies=6)
    out = df.llm.map(TEMPLATE, backend="pid", cache=False, **RAY)
    by_movie = out.groupby("movie")["llm_output"].nunique()
    assert (by_movie == 1).all(), by_movie
    assert out["llm_output"].nunique() == 2  # both replicas answered
    stats = semframe.last_run()
    assert stats is not None and {r.rows for r in stats.replicas} == {12}


def test_the_result_cache_is_written_by_the_driver_and_resumes() -> None:
    df = _movies(20)
    first = df.iloc[:12].llm.map(TEMPLATE, backend="fake", **RAY)
    whole = df.llm.map(TEMPLATE, backend="fake", **RAY)
    pd.testing.assert_frame_equal(whole.iloc[:12], first)
    stats = semframe.last_run()
    assert stats is not None
    assert stats.cache_hits == 12
    assert sum(r.rows for r in stats.replicas) == 8
    again = df.llm.map(TEMPLATE, backend="fake", **RAY)  # served whole, Ray not asked
    pd.testing.assert_frame_equal(again, whole)
    assert semframe.last_run().cache_hits == 20  # type: ignore[union-attr]


def _kill_when(condition: object, replica: int) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if condition():  # type: ignore[operator]
                actors = ray_executor.live_replicas()
                ray.kill(actors[replica])
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_killed_replica_loses_no_row_and_rebills_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    received: Counter[str] = Counter()
    lock = threading.Lock()

    def counting(provider: str, model: str, prompt: str, schema: object) -> str:
        with lock:
            received[prompt] += 1
        return default_responder(provider, model, prompt, schema)  # type: ignore[arg-type]

    df = _movies(40, movies=8)
    with ProviderEmulator(responder=counting, latency=Latency(fixed_s=0.03)) as emu:
        settings = {
            "backend": "openai",
            "base_url": emu.openai_url,
            "cache": False,
            "max_concurrency": 2,  # one request in flight per replica
            **RAY,
        }
        want = df.llm.map(TEMPLATE, **{**settings, "executor": "local"})
        emu.ledger.reset()
        received.clear()
        ray_executor.shutdown_replicas()
        watcher = _kill_when(lambda: len(emu.ledger) >= 10, replica=0)
        got = df.llm.map(TEMPLATE, **settings)
        watcher.join()
        pd.testing.assert_frame_equal(got, want)
        stats = semframe.last_run()
        assert stats is not None
        assert stats.replicas[0].died and not stats.replicas[1].died
        assert sum(r.rows for r in stats.replicas) == 40
        billed = len(emu.ledger)
        # Each replica had at most one request in flight and one answer on its way when
        # it was killed: only those can be sent twice; every answered row is billed once.
        assert 40 <= billed <= 42
        assert max(received.values()) <= 2
        assert sum(c - 1 for c in received.values()) == billed - 40
        assert stats.requests == 40  # the driver counts the answers it received
        # What the dead replica may have had in flight is charged, unconfirmed: the
        # report never counts less than the provider billed.
        assert stats.unconfirmed >= 1
        assert stats.requests + stats.unconfirmed >= billed
        reset_backends("openai")  # close the in-process run's connections to the emulator


def test_api_replicas_bill_what_their_estimate_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replicas of one Anthropic account: the estimate replays each as a client of its own."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    df = pd.DataFrame(
        {
            "movie": [f"movie number {i % 6} with a longer title" for i in range(48)],
            "review": [f"review {i}: a fine film, " + "quite long " * (i % 5) for i in range(48)],
        }
    )
    template = "Is {review} positive about {movie}? " + "Follow the rubric with care. " * 300
    with ProviderEmulator(latency=Latency(fixed_s=0.5)) as emu:
        settings = {
            "backend": "anthropic",
            "model": "claude-sonnet-4-5",
            "base_url": emu.anthropic_url,
            "cache": False,
            "progress": "off",
            **RAY,
        }
        latency = LatencyModel(0.5, 0.0)
        call = compile_call(df, template, op="filter", **settings)
        est = estimate_plan(call.plan, call.settings, latency=latency).planned
        alone = compile_call(df, template, op="filter", **{**settings, "executor": "local"})
        one_client = estimate_plan(alone.plan, alone.settings, latency=latency).planned
        # The estimate has both replicas start together. Started cold, one may lag
        # (its SDK imported, its client made) until the other's write has landed,
        # and then it reads the instructions instead of writing them: so both are
        # started first, by a call too short for the provider to cache anything.
        df.iloc[:2].llm.filter("Is {review} positive about {movie}?", **settings)
        emu.ledger.reset()
        df.llm.filter(template, **settings)
        bill = emu.ledger.totals()
        assert bill.requests == est.requests == 48
        assert bill.prompt_tokens == est.input_tokens
        # Both replicas write the shared instructions: one client would write them once.
        assert one_client.cache_write_tokens < bill.cache_write_tokens
        assert abs(bill.cache_write_tokens - est.cache_write_tokens) <= 0.02 * bill.prompt_tokens
        assert abs(bill.cached_tokens - est.cached_tokens) <= 0.02 * bill.cached_tokens
        assert est.cost is not None
        # The input side in dollars (output is priced at max_tokens: no probe here).
        billed_input = bill.cost.total - bill.cost.output
        assert abs(est.cost.total - est.cost.output - billed_input) <= 0.03 * billed_input
        reset_backends("anthropic")


@pytest.fixture
def pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards sent in pieces of 4 requests, then 8 (the sizes a table of millions gets)."""
    monkeypatch.setattr(ray_executor, "CHUNK_FIRST", 4)
    monkeypatch.setattr(ray_executor, "CHUNK_MOST", 8)


@pytest.mark.parametrize("in_pieces", [False, True])
def test_a_killed_fake_replica_hands_its_rows_to_the_other(
    in_pieces: bool, request: pytest.FixtureRequest
) -> None:
    if in_pieces:  # 30 rows each, in pieces of 4, 8, 8, 8 and 2: killed in the second
        request.getfixturevalue("pieces")
    register_backend(
        "slow",
        lambda model, settings: FakeBackend(model=model or "slow", delay=0.05),
    )
    df = _movies(60, movies=6)
    want = df.llm.map(TEMPLATE, backend="fake", cache=False)
    settings = {"backend": "slow", "model": "fake-model", "cache": False, **RAY}
    df.iloc[:2].llm.map(TEMPLATE, **settings)  # the replicas are up
    started = time.monotonic()
    watcher = _kill_when(lambda: time.monotonic() - started > 0.5, replica=1)
    got = df.llm.map(TEMPLATE, **settings)  # 30 rows each, 0.05 s a row
    watcher.join()
    pd.testing.assert_frame_equal(got, want)
    stats = semframe.last_run()
    assert stats is not None and stats.replicas[1].died
    assert stats.replicas[0].rows + stats.replicas[1].rows == 60
    assert stats.replicas[1].rows < 30


@pytest.mark.usefixtures("pieces")
def test_a_shard_in_pieces_gives_the_same_answers_each_group_on_one_replica() -> None:
    register_backend("pid", _pid_backend)
    df = _movies(60, movies=6)
    df.index = [i % 9 for i in range(60)]
    remote = df.llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
    stats = semframe.last_run()
    assert stats is not None and sum(r.rows for r in stats.replicas) == 60
    assert stats.requests == 60  # every row sent once, over several pieces each
    pd.testing.assert_frame_equal(remote, df.llm.map(TEMPLATE, backend="fake", cache=False))
    out = df.llm.map(TEMPLATE, backend="pid", cache=False, **RAY)
    assert (out.groupby("movie")["llm_output"].nunique() == 1).all()


@pytest.mark.usefixtures("pieces")
def test_a_budget_stop_sends_no_later_piece() -> None:
    register_backend(
        "slow",
        lambda model, settings: FakeBackend(model=model or "slow", delay=0.02),
    )
    one = {**RAY, "replicas": 1}
    df = _movies(80)
    df.iloc[:2].llm.map(TEMPLATE, backend="slow", model="fake-model", cache=False, **one)
    call = compile_call(df, TEMPLATE, op="map", backend="slow", model="fake-model", **one)
    backend = get_backend("slow", model="fake-model", settings=call.settings)

    def stop(spent: object, answered: int, in_flight: int) -> bool:
        return answered >= 10

    with pytest.raises(BudgetExceeded) as info:
        ray_executor.execute_ray(call.plan, backend, call.settings, stop_when=stop)
    outcomes = info.value.outcomes
    assert outcomes is not None and len(outcomes) == 80
    sent = [o for o in outcomes if o is not None]
    # Stopped in the second piece (pieces of 4, then 8): what was in flight is kept and
    # the rest is not sent. (12 here; 20 bounds a driver slow enough to see the stop
    # only once the third piece had started, which the replica then halts.)
    assert 10 <= len(sent) <= 20
    assert all(o.ok for o in sent)
    assert info.value.stats is not None and info.value.stats.requests == len(sent)
    # The stop holds for that run only: the next one runs whole on the same replica.
    again = df.llm.map(TEMPLATE, backend="slow", model="fake-model", cache=False, **one)
    assert again["llm_output"].notna().all()


def test_pieces_cover_the_shard_and_cut_at_group_boundaries() -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    for _ in range(200):
        groups = np.repeat(np.arange(40), rng.integers(1, 12, 40))[: rng.integers(0, 300)]
        first, most = int(rng.integers(1, 10)), int(rng.integers(1, 30))
        bounds = ray_executor.piece_bounds(groups, first, most)
        if groups.size == 0:
            assert bounds == []
            continue
        assert bounds[0][0] == 0 and bounds[-1][1] == groups.size
        assert all(a < b for a, b in bounds)
        assert all(bounds[k][1] == bounds[k + 1][0] for k in range(len(bounds) - 1))
        size = first
        for lo, hi in bounds[:-1]:
            assert hi >= lo + size  # never smaller than its size
            at_boundary = groups[hi] != groups[hi - 1]
            # cut where a group begins, or inside a group running on past ``most``
            assert at_boundary or hi == lo + size
            assert hi - lo <= size + most
            size = min(2 * size, most)


def test_bad_input_fails_before_anything_is_sent(fake: FakeBackend) -> None:
    df = _movies(4)
    with pytest.raises(ConfigError, match="replicas"):
        df.llm.map(TEMPLATE, backend="fake", executor="ray", replicas=0)
    with pytest.raises(ConfigError, match=r"ray_num_gpus=1 GPU\(s\).*largest node"):
        df.llm.map(TEMPLATE, backend="fake", executor="ray", ray_num_gpus=1)
    with pytest.raises(ConfigError, match=r"replicas=8 x ray_num_cpus=1 needs 8 CPU"):
        df.llm.map(TEMPLATE, backend="fake", executor="ray", replicas=8)
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster"):
        df.llm.map(TEMPLATE, backend="fake", executor="ray", ray_address="127.0.0.1:9")
    with pytest.raises(ConfigError, match="not an address"):
        df.llm.map(TEMPLATE, backend="fake", executor="ray", ray_address="nowhere")
    assert fake.history == []


def test_settings_come_from_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert semframe.config()["executor"] == "local"
    monkeypatch.setenv("SEMFRAME_EXECUTOR", "ray")
    monkeypatch.setenv("SEMFRAME_REPLICAS", "3")
    cfg = semframe.config()
    assert (cfg["executor"], cfg["replicas"]) == ("ray", 3)
    assert cfg.sources["replicas"] == "SEMFRAME_REPLICAS"
    with semframe.using(replicas=2, ray_num_cpus=0.5):
        assert semframe.config()["replicas"] == 2
    with pytest.raises(ConfigError, match="executor"):
        semframe.configure(executor="dask")
    assert BACKENDS["fake"] is not None


def test_a_new_replica_count_starts_a_new_pool() -> None:
    df = _movies(8)
    df.llm.map(TEMPLATE, backend="fake", cache=False, **{**RAY, "replicas": 1})
    assert len(semframe.last_run().replicas) == 1  # type: ignore[union-attr]
    df.llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
    assert len(semframe.last_run().replicas) == 2  # type: ignore[union-attr]
    assert len(ray_executor.live_replicas()) == 2


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc")
def test_replicas_start_with_one_allocation_arena() -> None:
    """A replica's process starts with MALLOC_ARENA_MAX (the driver's value, if it sets one)."""
    _movies(8).llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
    want = os.environ.get("MALLOC_ARENA_MAX", "1")
    for actor in ray_executor.live_replicas():
        pid, _ = ray.get(actor.info.remote())
        with open(f"/proc/{pid}/environ", "rb") as f:  # what the process started with
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        assert env[b"MALLOC_ARENA_MAX"] == want.encode()


def test_settings_read_per_run_keep_the_replicas() -> None:
    """Only what the backend is built from (and the placement) starts new replicas."""
    df = _movies(8)

    def actors() -> list[str]:
        return [a._actor_id.hex() for a in ray_executor.live_replicas()]

    df.llm.map(TEMPLATE, backend="fake", cache=False, **RAY)
    first = actors()
    # retries, errors and the rest of what a run reads are sent with each run
    df.llm.map(TEMPLATE, backend="fake", cache=False, max_retries=0, errors="keep", **RAY)
    assert actors() == first
    # another model is another backend: new replicas
    out = df.llm.map(TEMPLATE, backend="fake", model="other", cache=False, **RAY)
    assert actors() != first and len(actors()) == 2
    assert out["llm_output"].notna().all()


def test_a_late_batch_for_answered_rows_is_billed_not_placed() -> None:
    from semframe.core.wire import Outcome, Usage
    from semframe.runtime.execute import Totals
    from semframe.runtime.shard import Answer, Answers

    job = ray_executor._Job(0, (4, 2, 7))
    late = ray_executor._Job(1, (2, 7))
    first = Answers.of(
        [Answer(k, Outcome(f"a{k}", f"a{k}", None, None, 1), None) for k in (0, 1)],
        usage=Usage(20, 8, 0, 6),
        largest_output=3,
    )
    again = Answers.of(
        [Answer(k, Outcome(f"b{k}", f"b{k}", None, None, 2), None) for k in (0, 1)],
        usage=Usage(20, 0, 0, 10),
        largest_output=5,
    )
    # usage billed before its answers came (an answer's earlier attempts)
    billed = Answers.of([], usage=Usage(7, 0, 0, 1), largest_output=1)
    outcomes: list[Outcome | None] = [None] * 8
    totals, tallies = Totals(), [ray_executor._Tally(), ray_executor._Tally()]
    assert ray_executor._take(first, job, outcomes, totals, tallies[0], start=0.0) == [0, 1]
    # row 2 was answered by the first batch: only row 7 of the late batch is new
    assert ray_executor._take(again, late, outcomes, totals, tallies[1], start=0.0) == [1]
    assert ray_executor._take(billed, late, outcomes, totals, tallies[1], start=0.0) == []
    values = [None if o is None else o.value for o in outcomes]
    assert values == [None, None, "a1", None, "a0", None, None, "b1"]
    assert totals.done == 3 and tallies[1].rows == 1
    # every attempt of both batches was sent and billed
    assert (totals.sent, totals.retries) == (6, 2)
    assert (totals.prompt_tokens, totals.cached_tokens, totals.output_tokens) == (47, 8, 17)
    assert (tallies[1].requests, tallies[1].prompt_tokens) == (4, 27)
    assert totals.largest_output == 5
