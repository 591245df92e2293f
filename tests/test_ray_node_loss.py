"""executor="ray" when a node is lost: a two-node ``ray.cluster_utils.Cluster``.

Each node has one CPU and each replica reserves one, so the two replicas run
on different nodes. The node of one replica is removed mid-run (its raylet and
every process on it, the replica included): no row may be lost, no answered
row billed again, and the result must equal the in-process executor's.

To make the loss land mid-run on a 2-core machine, whatever the timing, the
provider emulator holds every request that arrives once the removal has begun
until the node is gone: the lost replica cannot finish its shard meanwhile,
and the surviving one resumes after. The module's cluster is its own (the
other Ray test modules start a one-node cluster).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

import semframe
from semframe.backends import reset_backends
from semframe.testing.emulator import Latency, ProviderEmulator, default_responder

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from semframe.runtime import ray_executor  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

TEMPLATE = "Summarize {review} of {movie}"


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[Any, Any]]:
    """A head node and a worker node, one CPU each; this process is the driver."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, worker
    ray_executor.shutdown_replicas()
    ray.shutdown()
    cluster.shutdown()
    reset_backends()
    gc.collect()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie has); ``True`` where ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def _movies(n: int, movies: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "movie": [f"movie number {i % movies} with a longer title" for i in range(n)],
            "review": [f"review {i}: a fine film" for i in range(n)],
        }
    )


def test_a_lost_node_loses_no_row_and_rebills_none(
    nodes: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, worker = nodes
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    received: Counter[str] = Counter()
    lock = threading.Lock()
    removing, removed = threading.Event(), threading.Event()

    def responder(provider: str, model: str, prompt: str, schema: object) -> str:
        with lock:
            received[prompt] += 1
        if removing.is_set():
            removed.wait(60)  # no answer while the node is being removed
        return default_responder(provider, model, prompt, schema)  # type: ignore[arg-type]

    df = _movies(40, movies=8)
    with ProviderEmulator(responder=responder, latency=Latency(fixed_s=0.03)) as emu:
        settings: dict[str, Any] = {
            "backend": "openai",
            "base_url": emu.openai_url,
            "cache": False,
            "max_concurrency": 2,  # one request in flight per replica
            "executor": "ray",
            "replicas": 2,
            "ray_num_cpus": 1,  # one replica per node
        }
        want = semframe.llm(df).map(TEMPLATE, **{**settings, "executor": "local"})
        semframe.llm(df.iloc[:1]).map(TEMPLATE, **settings)  # the replicas are up, one on each node
        where = [ray.get(a.info.remote()) for a in ray_executor.live_replicas()]
        on = [node for _, node in where]
        assert sorted(on) == sorted([cluster.head_node.node_id, worker.node_id])
        lost = on.index(worker.node_id)
        pid = where[lost][0]
        emu.ledger.reset()
        received.clear()

        def remove() -> None:
            deadline = time.monotonic() + 60
            while len(emu.ledger) < 10 and time.monotonic() < deadline:
                time.sleep(0.005)
            removing.set()
            try:
                cluster.remove_node(worker)
                # The replica's process outlives its raylet by a moment: held until it is gone,
                # it can neither send nor answer once the emulator answers again.
                deadline = time.monotonic() + 30
                while not _gone(pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                removed.set()

        remover = threading.Thread(target=remove, daemon=True)
        remover.start()
        got = semframe.llm(df).map(TEMPLATE, **settings)
        remover.join()
        assert _gone(pid)
        pd.testing.assert_frame_equal(got, want)
        stats = semframe.last_run()
        assert stats is not None
        assert stats.replicas[lost].died and not stats.replicas[1 - lost].died
        assert stats.replicas[lost].node == worker.node_id
        assert sum(r.rows for r in stats.replicas) == 40
        billed = len(emu.ledger)
        # The lost replica had at most one request in flight and one answer on its
        # way: only those can be sent twice; every answered row is billed once.
        assert 40 <= billed <= 42
        assert max(received.values()) <= 2
        assert sum(c - 1 for c in received.values()) == billed - 40
        assert stats.requests == 40
        assert stats.requests + stats.unconfirmed >= billed
        reset_backends("openai")  # close the in-process run's connections to the emulator


class _Actor:
    """A replica whose stream of answer batches is ``refs`` (an exception: lost on get)."""

    def __init__(self, refs: list[object]) -> None:
        self.run = self
        self._refs = refs

    def options(self, **kwargs: object) -> _Actor:
        return self

    def remote(
        self, shard: object, settings: object, *, completions: bool, token: str, warm: bool
    ) -> Iterator[object]:
        return iter(self._refs)


class _Ray:
    """The part of ``ray`` a feeder uses: ``put``, ``get``, ``kill`` and the exceptions."""

    exceptions = ray.exceptions

    def __init__(self) -> None:
        self.killed: list[object] = []

    def put(self, value: object) -> object:
        return value

    def get(self, ref: object) -> object:
        if isinstance(ref, BaseException):
            raise ref
        return ref

    def kill(self, actor: object) -> None:
        self.killed.append(actor)


def test_a_batch_lost_with_its_node_counts_as_the_replica_dying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of answers over Ray's inline limit lives on the replica's node: lost with it.

    The feeder reports the replica dead (its rows go to the others) and kills it,
    so that, were it still alive, it sends nothing more; its later pieces, never
    sent, are named with it. Before, the whole run failed with the ObjectLostError.
    """
    monkeypatch.setattr(ray_executor.Shard, "of", lambda plan, ids: ids)
    lost = ray.exceptions.ObjectReconstructionFailedError("ab" * 14)
    actor = _Actor([["first batch"], lost, ["never read"]])
    stub = _Ray()
    run = ray_executor._Run(stub, plan=None, actors=[actor])  # type: ignore[arg-type]
    run._feed([(0, (0, 1)), (1, (2,)), (2, (3,))], actor)
    events = [run.events.get_nowait() for _ in range(2)]
    assert events[0] == ("answers", 0, ["first batch"])
    assert events[1][:2] == ("died", 0) and events[1][2] == (lost, (1, 2))
    assert run.events.empty()
    assert stub.killed == [actor]
