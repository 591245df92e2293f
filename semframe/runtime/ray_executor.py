"""``executor="ray"``: one relQuery across backend replicas on a Ray cluster.

The driver (this process) plans the relQuery once (GGR), serves what the
result cache holds, and cuts the rest into shards with
:func:`semframe.serving.partition.partition`: whole prefix groups per
replica, balanced by their estimated work. Each replica is a Ray actor
(:class:`Replica`) owning one backend built from the call's settings; it runs
its shard through the same :func:`~semframe.runtime.execute.execute` as the
in-process path (retries, parsing, group-aware dispatch) and streams every
outcome back as soon as it has one. The driver stores answers in the result
cache as they arrive, draws one progress line, and puts the outcomes back in
plan order (the caller's order is restored by :func:`~semframe.runtime.call.run_call`).

The replicas outlive a run: a later run whose backend, model, backend
settings and placement are the same (:func:`pool_key`) reuses them and their
engines' caches; settings read on the driver only (``errors``, the result
cache, progress, a budget) or per run (retries, rate limits, timeouts: sent
with each shard) do not start new ones.

Faults: a replica that dies mid-run (its actor killed, its node lost, or a
batch of its answers lost with its node: the replica is then killed) has
its unanswered requests partitioned again over the replicas still alive;
rows whose answers reached the driver are never sent again. Where the backend
bills (``Backend.endpoint`` set), what the dead replica may have had in flight
(:func:`in_flight_window`) is charged as unconfirmed (``RunStats.unconfirmed``),
as a lost answer is in process. A driver killed mid-run resumes from the
result cache.

Rate limits: replicas that reach one endpoint (an API account, a vLLM
server: ``Backend.endpoint`` set) share its limits: ``max_concurrency``,
``rpm`` and ``tpm`` are divided among them; replicas that own their engine
(the fake backend, an in-process engine) keep the full settings.

Ray is imported on first use (``pip install "semframe[ray]"``); importing
semframe does not import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from semframe.backends import BACKENDS, get_backend, register_backend
from semframe.backends.base import AsyncBackend, Backend, Capabilities
from semframe.cache.store import ResultCache
from semframe.config import ResolvedConfig
from semframe.core.plan import Plan, groups_of
from semframe.core.requests import group_ids_of, ids_of, subset
from semframe.core.wire import Completion, Outcome, Request, Usage
from semframe.cost.models import CostModel, warm_start
from semframe.errors import (
    BudgetExceeded,
    ConfigError,
    MissingDependencyError,
    RunAborted,
    SemframeError,
    plural,
)
from semframe.runtime.execute import (
    StopWhen,
    Totals,
    count_answered,
    execute,
    interrupted,
    lost_prompt_tokens,
    paced_collector,
    run_stats,
    serve_from_cache,
    unanswered,
)
from semframe.runtime.progress import Progress
from semframe.runtime.shard import Answer, Answers, Shard
from semframe.runtime.stats import ReplicaStats, RunStats, record_run
from semframe.serving.partition import partition

__all__ = [
    "INSTALL_LINE",
    "PER_REQUEST_CHARS",
    "Replica",
    "connect",
    "execute_ray",
    "in_flight_window",
    "live_replicas",
    "pool_key",
    "release_other_replicas",
    "replica_settings",
    "require_ray",
    "shutdown_replicas",
]

INSTALL_LINE = 'pip install "semframe[ray]"'
"""How to install Ray for ``executor="ray"``."""

PER_REQUEST_CHARS = 400.0
"""Work of one request beyond its prompt, in prompt characters, when balancing replicas.

A stand-in for its decode and per-request overhead (about 100 prompt tokens)."""

GATHER_S = 0.01
"""Seconds a replica lets answers gather before it streams them to the driver as one batch."""

START_TIMEOUT_S = 600.0
"""How long replicas may take to start (an engine loading its model) before the run fails."""

CHUNK_FIRST = 4096
"""Requests in the first piece of a replica's shard (the pieces after it double, to
:data:`CHUNK_MOST`).

A replica starts on its first piece while the driver packs the next: packing,
pickling and unpickling a 500,000-request shard whole took about a second
before the replica's first request."""

CHUNK_MOST = 65_536
"""The most requests in one piece of a replica's shard."""

_TOKENS_KEPT = 64
"""Runs whose stop flag a replica remembers (the latest)."""


def require_ray() -> Any:
    """Import Ray, or fail with the install line.

    Raises
    ------
    MissingDependencyError
        When Ray is not installed.
    """
    try:
        return importlib.import_module("ray")
    except ImportError:
        msg = f"executor='ray' needs Ray, which is not installed. Install it with: {INSTALL_LINE}"
        raise MissingDependencyError(msg) from None


_OUTPUT = Usage._fields.index("output_tokens")


class _Meter:
    """A backend that sums the usage of every attempt, and remembers each request's last answer.

    The usage is summed with each batch of answers (:meth:`take_usage`): the
    driver needs it per batch, not per answer. The answers are kept only
    with ``answers`` (the driver stores them). The executor's workers may be
    threads: each attempt's usage is appended to a list, and each request's
    attempts follow one another, never overlap; a list append, its slice and
    a dict operation are each atomic.
    """

    def __init__(self, inner: Backend, *, answers: bool = True) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.model: str = inner.model
        self.endpoint: str | None = inner.endpoint
        self.capabilities: Capabilities = inner.capabilities
        self.cost: CostModel = inner.cost
        self._answers = answers
        self._usage: list[Usage] = []  # each attempt's, since the last take_usage()
        self._last: dict[int, Completion] = {}

    def _seen(self, request: Request, completion: Completion) -> None:
        self._usage.append(completion.usage)
        if self._answers:
            self._last[request.id] = completion

    def take_usage(self) -> tuple[Usage, int]:
        """The usage of the attempts since the last call, summed, and their largest output."""
        n = len(self._usage)
        if not n:
            return Usage(), 0
        taken = self._usage[:n]
        del self._usage[:n]
        columns = list(zip(*taken, strict=True))
        return Usage(*map(sum, columns)), max(columns[_OUTPUT])

    def take(self, request_id: int) -> Completion | None:
        """The request's last answer (forgotten here); ``None`` without ``answers``."""
        return self._last.pop(request_id, None) if self._answers else None

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        completion = self.inner.complete(request, slot=slot)
        self._seen(request, completion)
        return completion

    async def acomplete(self, request: Request) -> Completion:
        completion = await cast(AsyncBackend, self.inner).acomplete(request)
        self._seen(request, completion)
        return completion

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def close(self) -> None:
        self.inner.close()


class Replica:
    """A Ray actor's state: one backend, built from the pool's settings, and its runs.

    Made into an actor with ``ray.remote`` when a pool starts (Ray is not
    imported by this module).

    Parameters
    ----------
    index : int
        Its number in the pool.
    name : str
        The backend's registry name.
    spec : BackendSpec
        How the driver builds that backend (registered here when it differs,
        so a backend registered in the driver's process works here too).
    settings : ResolvedConfig
        The settings its backend is built with (:func:`replica_settings`);
        each run brings its own (:meth:`run`).
    env : mapping
        Environment variables to set first (the backend's credentials).
    """

    def __init__(
        self,
        index: int,
        name: str,
        spec: Any,
        settings: ResolvedConfig,
        env: Mapping[str, str],
    ) -> None:
        os.environ.update(env)
        if BACKENDS.get(name) != spec:
            register_backend(name, spec)
        self.index = index
        self.backend = get_backend(name, model=settings["model"], settings=settings)
        self._halts: OrderedDict[str, threading.Event] = OrderedDict()
        self._halts_lock = threading.Lock()

    def _halt(self, token: str) -> threading.Event:
        """The stop flag of the driver's run ``token`` (made on first use; the latest kept)."""
        with self._halts_lock:
            flag = self._halts.get(token)
            if flag is None:
                flag = self._halts[token] = threading.Event()
                while len(self._halts) > _TOKENS_KEPT:
                    self._halts.popitem(last=False)
            return flag

    def info(self) -> tuple[int, str]:
        """Its process id and Ray node id (a liveness check)."""
        node = ""
        with contextlib.suppress(Exception):
            node = str(require_ray().get_runtime_context().get_node_id())
        return os.getpid(), node

    def stop(self, token: str = "") -> None:
        """Send nothing more in the driver's run ``token`` (requests in flight complete).

        It holds for the pieces of that run still to come as well.
        """
        self._halt(token).set()

    def run(
        self,
        packed: Shard,
        settings: ResolvedConfig,
        *,
        completions: bool,
        token: str = "",
        warm: bool = True,
    ) -> Iterator[Answers]:
        """Execute ``packed`` with the run's ``settings``; yield its outcomes in batches.

        ``settings`` (:func:`replica_settings` of the run) give what the replica
        reads per run: concurrency, retries, rate limits, timeouts, warm start.
        Its backend was built with the pool's (they agree on what the backend
        reads: :func:`pool_key`). The answers themselves come back only with
        ``completions`` (the driver keeps a result cache). ``token`` names the
        driver's run, whose pieces come one call each (:meth:`stop` stops
        them all); ``warm=False`` leaves out the warm start (a piece after the
        first: the engine is warm).
        """
        halt = self._halt(token)
        if halt.is_set():
            return  # the driver said stop before this piece started
        cfg = settings
        shard = packed.plan()
        meter = _Meter(self.backend, answers=completions)
        # Answers not streamed yet, in the order they came: appended by the executor's
        # thread, taken from the front by this one (each a single list operation,
        # atomic under the interpreter's lock: no queue, no lock per answer).
        done: list[Answer] = []
        ended: list[BaseException | None] = []  # the executor's end: None, or what it raised

        def on_outcome(request_id: int, outcome: Outcome) -> None:
            completion = meter.take(request_id)
            keep = completion if outcome.error_kind is None and outcome.error is None else None
            done.append(tuple.__new__(Answer, (request_id, outcome, keep)))

        def work() -> None:
            try:
                execute(
                    shard,
                    meter,
                    max_concurrency=cfg["max_concurrency"],
                    max_retries=cfg["max_retries"],
                    progress="off",
                    rpm=cfg["rpm"],
                    tpm=cfg["tpm"],
                    timeout=cfg["timeout"] or self.backend.capabilities.answer_timeout,
                    row_timeout=cfg["row_timeout"],
                    warm=warm and warm_start(meter.cost, cfg["warm_start"]),
                    halt=halt,
                    on_outcome=on_outcome,
                )
            except BudgetExceeded:
                pass  # the driver said stop
            except BaseException as exc:
                ended.append(exc)
                return
            ended.append(None)

        threading.Thread(target=work, name=f"semframe-replica-{self.index}", daemon=True).start()
        while True:
            # Answers gather for GATHER_S between batches: woken for each one, this
            # thread would take the interpreter's lock from the executor's once per answer.
            time.sleep(GATHER_S)
            over = bool(ended)  # read first: once it is set, every answer is in ``done``
            n = len(done)
            batch = done[:n]
            del done[:n]
            usage, largest = meter.take_usage()  # after the answers: their attempts are in it
            if batch or any(usage):
                yield Answers.of(
                    batch, usage=usage, largest_output=largest, completions=completions
                )
            if over:
                if ended[0] is not None:
                    raise ended[0]
                return


def replica_settings(settings: ResolvedConfig, backend: Backend, replicas: int) -> ResolvedConfig:
    """The settings each replica runs with: rate limits divided where an endpoint is shared.

    Replicas that reach one endpoint (``backend.endpoint`` set: an API account,
    a vLLM server) get ``max_concurrency``, ``rpm`` and ``tpm`` divided among
    them (at least 1 each); replicas that own their engine keep the full
    settings. A backend computing on CPU threads of its own
    (:attr:`BackendSpec.threads <semframe.backends.BackendSpec.threads>`, the
    embedded engine's ``local_threads``) left at every core gets the CPUs a
    replica reserves (``ray_num_cpus``, at least 1): replicas sharing a node
    must not each take all its cores. The replicas themselves run in process,
    without progress.

    Examples
    --------
    >>> from semframe.config import config
    >>> from semframe.backends.fake import FakeBackend
    >>> api = FakeBackend(max_concurrency=64)
    >>> api.endpoint = "https://api.example.com/v1"
    >>> cfg = replica_settings(config(rpm=1000), api, 4)
    >>> cfg["max_concurrency"], cfg["rpm"], cfg["executor"]
    (16, 250, 'local')
    >>> replica_settings(config(), FakeBackend(), 4)["max_concurrency"] is None
    True
    >>> replica_settings(config(backend="local", ray_num_cpus=2), FakeBackend(), 4)["local_threads"]
    2
    """
    values = dict(settings)
    sources = dict(settings.sources)
    if backend.endpoint is not None:
        cap = settings["max_concurrency"] or backend.capabilities.max_concurrency
        values["max_concurrency"] = max(1, cap // replicas)
        for key in ("rpm", "tpm"):
            if settings[key] is not None:
                values[key] = max(1, settings[key] // replicas)
    spec = BACKENDS.get(settings["backend"])
    threads = spec.threads if spec is not None else None
    if threads is not None and settings.get(threads) is None:
        values[threads] = max(1, int(settings["ray_num_cpus"]))
        sources[threads] = "ray_num_cpus (the CPUs a Ray replica reserves)"
    values.update(executor="local", progress="off", replicas=1)
    return ResolvedConfig(values, sources)


def _reachable(address: str, timeout: float = 3.0) -> None:
    """Fail unless something accepts connections at a ``host:port`` Ray address."""
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        msg = (
            f"ray_address={address!r} is not an address: expected 'host:port', "
            "'ray://host:port' or 'auto'."
        )
        raise ConfigError(msg)
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout):
            pass
    except OSError as exc:
        msg = (
            f"cannot reach the Ray cluster at ray_address={address!r} ({exc}); nothing was "
            "sent. Start one there (`ray start --head`), fix ray_address, or leave it unset "
            "to start a local cluster."
        )
        raise ConfigError(msg) from None


def connect(settings: Mapping[str, Any]) -> Any:
    """Join Ray as ``settings`` say and check the replicas can be placed; returns ``ray``.

    Joins the ``ray.init()`` already made in this process, else the cluster
    at ``ray_address``, else starts a local one.

    Raises
    ------
    ConfigError
        An unreachable ``ray_address``; replicas asking for more CPUs or GPUs
        than any node (or the whole cluster) has; a ``client=`` setting
        (a client object cannot be sent to other processes).
    MissingDependencyError
        When Ray is not installed.
    """
    if settings["client"] is not None:
        msg = (
            "executor='ray' cannot send a client= object to its replicas (each builds its "
            "own client); configure the backend with base_url= and its API key variable."
        )
        raise ConfigError(msg)
    ray = require_ray()
    address = settings["ray_address"]
    if address is not None and address != "auto":
        _reachable(address)
    if ray.is_initialized():
        joined = str(ray.get_runtime_context().gcs_address)
        if address is not None and address not in ("auto", joined):
            msg = (
                f"this process is already connected to the Ray cluster at {joined}; "
                f"ray_address={address!r} names another. Leave ray_address unset to use "
                "the cluster joined, or call ray.shutdown() first."
            )
            raise ConfigError(msg)
    else:
        try:
            ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
        except Exception as exc:
            where = f"at ray_address={address!r}" if address else "locally"
            msg = f"cannot start or join a Ray cluster {where}: {exc}"
            raise ConfigError(msg) from None
    _check_resources(ray, settings)
    return ray


def _check_resources(ray: Any, settings: Mapping[str, Any]) -> None:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    replicas = settings["replicas"]
    for resource, key in (("GPU", "ray_num_gpus"), ("CPU", "ray_num_cpus")):
        per = float(settings[key])
        if per <= 0:
            continue
        sizes = [float(n.get("Resources", {}).get(resource, 0.0)) for n in nodes]
        largest, total = max(sizes, default=0.0), sum(sizes)
        if per > largest:
            msg = (
                f"each replica asks for {key}={per:g} {resource}(s), but the largest node of "
                f"the Ray cluster has {largest:g} ({total:g} over {len(nodes)} node(s)); "
                f"nothing was sent. Lower {key}, or add a node with more {resource}s."
            )
            raise ConfigError(msg)
        if per * replicas > total + 1e-9:
            msg = (
                f"replicas={replicas} x {key}={per:g} needs {per * replicas:g} {resource}(s), "
                f"but the Ray cluster has {total:g}; Ray would wait for them forever. Nothing "
                f"was sent. Lower replicas or {key}."
            )
            raise ConfigError(msg)


@dataclass
class _Pool:
    key: str
    actors: list[Any]
    nodes: list[str]


_pool: _Pool | None = None
_pool_lock = threading.Lock()


PLACEMENT = ("replicas", "ray_address", "ray_num_cpus", "ray_num_gpus")
"""The settings that say how many replicas there are and where they run."""


def pool_key(settings: ResolvedConfig, backend: Backend) -> str:
    """What a pool of replicas for ``settings`` is built from: runs with one key share a pool.

    The backend (its registry name and spec), its model, the settings its spec
    declares its factory reads (:attr:`BackendSpec.settings
    <semframe.backends.BackendSpec.settings>`, as each replica gets them:
    :func:`replica_settings`), the credential it finds (a digest), and the
    replicas' number and placement (:data:`PLACEMENT`). Nothing else: the
    settings a replica reads per run (retries, rate limits, timeouts) are sent
    with each run, and the rest matter on the driver only (``errors``, the
    result cache, progress, a budget), so changing them keeps the engines.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> from semframe.config import config
    >>> fake = FakeBackend()
    >>> base = pool_key(config(backend="fake"), fake)
    >>> base == pool_key(config(backend="fake", errors="keep", max_retries=0), fake)
    True
    >>> base == pool_key(config(backend="fake", model="other"), fake)
    False
    >>> local = pool_key(config(backend="local"), fake)
    >>> local == pool_key(config(backend="local", local_parallel=2), fake)
    False
    """
    return _pool_identity(settings, backend)[0]


def _pool_identity(settings: ResolvedConfig, backend: Backend) -> tuple[str, tuple[Any, ...]]:
    """The key of the pool ``settings`` run on, and the arguments its replicas are built with."""
    name = settings["backend"]
    spec = BACKENDS[name]
    cfg = replica_settings(settings, backend, settings["replicas"])
    env = {k: os.environ[k] for k in spec.secrets if os.environ.get(k)}
    built = [(k, repr(cfg[k])) for k in spec.settings]
    placed = [(k, repr(settings[k])) for k in PLACEMENT]
    secret = hashlib.sha256(repr(sorted(env.items())).encode()).hexdigest()
    text = repr((name, repr(spec), repr(cfg["model"]), built, placed, secret))
    return hashlib.sha256(text.encode()).hexdigest(), (name, spec, cfg, env)


REPLICA_ENV = {"MALLOC_ARENA_MAX": "1"}
"""Environment variables a replica's process starts with, where the driver's sets none.

``MALLOC_ARENA_MAX=1``: every thread allocates from the C library's main heap.
A replica's requests run on a thread of their own, and a thread's own heap
grows a page at a time (a ``mprotect`` call each): 65,663 calls in one
replica's run of 200,000 fake requests, 2 with this setting, which the main
heap grows in steps of 128 KiB. Set ``MALLOC_ARENA_MAX`` in the driver's
environment to give replicas another value."""


def replica_env() -> dict[str, str]:
    """:data:`REPLICA_ENV`, with the driver's own values where it sets them.

    Examples
    --------
    >>> from unittest import mock
    >>> with mock.patch.dict("os.environ"):
    ...     _ = os.environ.pop("MALLOC_ARENA_MAX", None)
    ...     replica_env()
    {'MALLOC_ARENA_MAX': '1'}
    >>> with mock.patch.dict("os.environ", {"MALLOC_ARENA_MAX": "4"}):
    ...     replica_env()
    {'MALLOC_ARENA_MAX': '4'}
    """
    return {name: os.environ.get(name, value) for name, value in REPLICA_ENV.items()}


def _start(ray: Any, index: int, args: tuple[Any, ...], cfg: Mapping[str, Any]) -> Any:
    actor_class = ray.remote(Replica).options(
        num_cpus=float(cfg["ray_num_cpus"]),
        num_gpus=float(cfg["ray_num_gpus"]),
        max_concurrency=2,  # stop() and info() reach a replica while it runs
        max_restarts=0,
        runtime_env={"env_vars": replica_env()},
    )
    return actor_class.remote(index, *args)


def release_other_replicas(settings: ResolvedConfig, backend: Backend) -> None:
    """Kill the replicas kept from an earlier run unless a run with ``settings`` reuses them.

    What a run does when it starts; :mod:`semframe.ray` does it before Ray Data
    reads a Dataset, so that replicas of other settings do not hold the CPUs
    that Ray Data's tasks need.
    """
    global _pool
    key, _ = _pool_identity(settings, backend)
    with _pool_lock:
        if _pool is not None and _pool.key != key:
            _kill(require_ray(), _pool.actors)
            _pool = None


def _pool_for(ray: Any, settings: ResolvedConfig, backend: Backend) -> _Pool:
    """The replicas for ``settings``: reused while alive with the same :func:`pool_key`."""
    global _pool
    n = settings["replicas"]
    key, args = _pool_identity(settings, backend)
    with _pool_lock:
        if _pool is not None and _pool.key != key:
            _kill(ray, _pool.actors)
            _pool = None
        actors: list[Any] = list(_pool.actors) if _pool is not None else [None] * n
        nodes = list(_pool.nodes) if _pool is not None else [""] * n
        for attempt in range(2):
            for i, actor in enumerate(actors):
                if actor is None:
                    actors[i] = _start(ray, i, args, settings)
            probes = [a.info.remote() for a in actors]
            dead = False
            for i, probe in enumerate(probes):
                try:
                    _, nodes[i] = ray.get(probe, timeout=START_TIMEOUT_S)
                except ray.exceptions.GetTimeoutError:
                    _kill(ray, actors)
                    _pool = None
                    msg = (
                        f"{plural(n, 'replica')} could not start within {START_TIMEOUT_S:g} s "
                        "(the Ray cluster may lack free resources for them); nothing was sent."
                    )
                    raise ConfigError(msg) from None
                except ray.exceptions.RayActorError as exc:
                    if attempt:
                        _kill(ray, actors)
                        _pool = None
                        msg = f"a replica died while starting: {exc}"
                        raise SemframeError(msg) from None
                    actors[i] = None
                    dead = True
            if not dead:
                break
        _pool = _Pool(key, actors, nodes)
        return _pool


def _kill(ray: Any, actors: Sequence[Any]) -> None:
    for actor in actors:
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor)


def live_replicas() -> list[Any]:
    """The actors of the current replica pool (empty before the first Ray run)."""
    with _pool_lock:
        return [] if _pool is None else list(_pool.actors)


def shutdown_replicas() -> None:
    """Kill the replicas (their engines and clients are released); the next run starts new ones."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _kill(require_ray(), _pool.actors)
        _pool = None


@dataclass
class _Tally:
    rows: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    last: float = 0.0
    died: bool = False


@dataclass
class _Job:
    replica: int
    ids: tuple[int, ...]  # plan positions, in shard order


@dataclass
class _Run:
    """The driver's state of one Ray run."""

    ray: Any
    plan: Plan
    actors: list[Any]
    settings: ResolvedConfig | None = None  # what replicas read per run (replica_settings)
    completions: bool = False  # replicas send their answers back (for the result cache)
    events: queue.SimpleQueue[tuple[str, int, Any]] = field(default_factory=queue.SimpleQueue)
    jobs: dict[int, _Job] = field(default_factory=dict)
    active: set[int] = field(default_factory=set)
    alive: list[int] = field(default_factory=list)
    token: str = field(default_factory=lambda: os.urandom(8).hex())  # names this run
    stopping: threading.Event = field(default_factory=threading.Event)

    def dispatch(self, ids: Sequence[int]) -> None:
        """Partition the requests ``ids`` (plan order) over the live replicas and start them."""
        if not ids:
            return
        if not self.alive:
            msg = "every Ray replica died"
            raise RunAborted(msg)
        shards: Sequence[Sequence[int]] = [range(len(ids))]
        if len(self.alive) > 1:
            requests = subset(self.plan.requests, ids)  # columns stay columns: no prompt rendered
            groups = groups_of(requests)
            part = partition(requests, groups, len(self.alive), per_request=PER_REQUEST_CHARS)
            shards = part.shards
        group_of = group_ids_of(self.plan.requests)
        for k, positions in enumerate(shards):
            if not positions:
                continue
            replica = self.alive[k]
            mine = np.asarray([ids[p] for p in positions], dtype=np.int64)
            pieces: list[tuple[int, tuple[int, ...]]] = []
            for lo, hi in piece_bounds(group_of[mine], CHUNK_FIRST, CHUNK_MOST):
                job = _Job(replica, tuple(mine[lo:hi].tolist()))
                number = len(self.jobs)
                self.jobs[number] = job
                self.active.add(number)
                pieces.append((number, job.ids))
            threading.Thread(
                target=self._feed,
                args=(pieces, self.actors[replica]),
                name=f"semframe-ray-feed-{pieces[0][0]}",
                daemon=True,
            ).start()

    def _feed(self, pieces: Sequence[tuple[int, tuple[int, ...]]], actor: Any) -> None:
        """Send a replica its pieces (job number, plan positions) in turn; stream their answers.

        The next piece is packed and put in the object store while the
        replica works on the one before. When the replica dies, the piece it
        was on is reported ``died`` with the numbers of the later ones, never
        sent (the driver sends the rows of all of them to the others at once);
        once the run stops, later pieces are not sent.
        """
        ray = self.ray
        numbers = [number for number, _ in pieces]
        ahead = None
        for i, number in enumerate(numbers):
            if self.stopping.is_set():
                for rest in numbers[i:]:
                    self.events.put(("done", rest, None))
                return
            try:
                if ahead is None:
                    ahead = ray.put(Shard.of(self.plan, pieces[i][1]))
                stream = actor.run.options(num_returns="streaming").remote(
                    ahead,
                    self.settings,
                    completions=self.completions,
                    token=self.token,
                    warm=i == 0,
                )
                ahead = None
                if i + 1 < len(numbers):  # packed while the replica answers this piece
                    ahead = ray.put(Shard.of(self.plan, pieces[i + 1][1]))
                for ref in stream:
                    self.events.put(("answers", number, ray.get(ref)))
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                # The replica died (its actor killed, its node lost) or cannot be reached,
                # or a batch of its answers was lost with its node (a batch over Ray's
                # inline limit, 100 KiB, waits in the object store of the replica's
                # node). It must send nothing more: its unanswered requests, in this
                # piece and the later ones, go to the others.
                with contextlib.suppress(Exception):
                    ray.kill(actor)
                self.events.put(("died", number, (exc, tuple(numbers[i + 1 :]))))
                return
            except BaseException as exc:
                self.events.put(("error", number, exc))
                for rest in numbers[i + 1 :]:
                    self.events.put(("done", rest, None))
                return
            self.events.put(("done", number, None))

    def stop(self) -> None:
        """Send nothing more: the replicas stop this run, and no further piece goes out."""
        self.stopping.set()
        for replica in {self.jobs[number].replica for number in self.active}:
            with contextlib.suppress(Exception):
                self.actors[replica].stop.remote(self.token)


def piece_bounds(
    groups: NDArray[np.integer[Any]], first: int = CHUNK_FIRST, most: int = CHUNK_MOST
) -> list[tuple[int, int]]:
    """Where a replica's shard is cut into pieces: ``(start, stop)`` of each, in order.

    The pieces grow from ``first`` requests, doubling up to ``most``. A
    piece ends at the first prefix-group boundary (``groups`` changes) at or
    after its size, unless the group runs on for more than ``most``
    requests past it: a group is split only where it is that large.

    Examples
    --------
    >>> import numpy as np
    >>> piece_bounds(np.zeros(10, dtype=np.int64), first=3, most=4)
    [(0, 3), (3, 7), (7, 10)]
    >>> piece_bounds(np.array([0, 0, 1, 1, 1, 2, 3, 3]), first=2, most=4)
    [(0, 2), (2, 6), (6, 8)]
    >>> piece_bounds(np.array([0, 0, 0, 0, 0, 0, 0, 1, 1]), first=2, most=3)
    [(0, 2), (2, 7), (7, 9)]
    """
    n = int(groups.size)
    if n == 0:
        return []
    starts = np.flatnonzero(groups[1:] != groups[:-1]) + 1  # where a group begins
    out: list[tuple[int, int]] = []
    lo, size = 0, max(1, first)
    while lo < n:
        want = lo + size
        if want >= n:
            out.append((lo, n))
            break
        at = int(np.searchsorted(starts, want))  # the first boundary at or after ``want``
        hi = int(starts[at]) if at < starts.size and starts[at] - want <= most else want
        out.append((lo, hi))
        lo, size = hi, min(size * 2, max(1, most))
    return out


def _unwrap(exc: BaseException) -> BaseException:
    """The error a replica raised, out of Ray's wrapper (``RayTaskError``)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def execute_ray(
    plan: Plan,
    backend: Backend,
    settings: ResolvedConfig,
    *,
    stop_when: StopWhen | None = None,
    cache: ResultCache | None = None,
    cache_keys: Sequence[str | None] | None = None,
) -> tuple[list[Outcome], RunStats]:
    """Send ``plan`` through ``settings["replicas"]`` Ray replicas; outcomes in plan order.

    What :func:`~semframe.runtime.execute.execute` does in process, spread
    over replicas: stored answers are served first, the rest is partitioned
    by prefix group (:func:`~semframe.serving.partition.partition`), each
    replica's outcomes are streamed back and stored as they arrive, and a
    replica that dies has its unanswered requests sent to the others.
    ``stop_when`` (a budget) is asked after each batch of answers; when it
    says stop, every replica sends nothing more and
    :class:`~semframe.errors.BudgetExceeded` is raised with the answers so far.

    Raises
    ------
    ConfigError
        Before anything is sent: Ray cannot be joined, or the replicas cannot be placed.
    RunAborted
        A replica's backend failed for every request alike, or every replica died.
    """
    ray = connect(settings)
    start = time.monotonic()
    n = len(plan.requests)
    outcomes: list[Outcome | None] = [None] * n
    totals = Totals()
    send, keep = plan, None
    if cache is not None:
        keep = serve_from_cache(plan, backend, cache, outcomes, totals, keys=cache_keys)
        if totals.cache_hits:
            send = unanswered(plan, outcomes)
    pool = _pool_for(ray, settings, backend) if send.requests else None
    replicas = settings["replicas"]
    tallies = [_Tally() for _ in range(replicas)]
    bar = None
    if settings["progress"] != "off":
        bar = Progress(
            n,
            f"{plan.relquery.op} on {backend.name} ({replicas} Ray replicas)",
            mode=settings["progress"],
            dollars=lambda: backend.cost.bill(totals.charged()),
        )
        if not bar.enabled:
            bar = None
        elif totals.cache_hits:
            bar.update(totals.done, 0, 0, 0)
    stopped = False
    # Answers and outcomes pile up by the million: see paced_collector.
    with paced_collector() as collect:
        try:
            if pool is not None:
                run = _Run(
                    ray,
                    plan,
                    pool.actors,
                    replica_settings(settings, backend, replicas),
                    completions=keep is not None,
                    alive=list(range(replicas)),
                )
                # What a replica may have in flight (sent, the answer not streamed back).
                window = in_flight_window(settings, backend, replicas)
                run.dispatch(ids_of(send.requests))
                while run.active:
                    try:
                        kind, number, payload = run.events.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    job = run.jobs[number]
                    tally = tallies[job.replica]
                    if kind == "answers":
                        batch = cast(Answers, payload)
                        fresh = _take(batch, job, outcomes, totals, tally, start=start)
                        if keep is not None and batch.completions is not None:
                            for k in fresh:
                                completion = batch.completions[k]
                                if completion is not None:
                                    keep(job.ids[batch.ids[k]], completion)
                        if bar is not None:
                            bar.update(
                                totals.done,
                                totals.prompt_tokens,
                                totals.cached_tokens,
                                totals.errors,
                            )
                        collect()
                        if (
                            stop_when is not None
                            and not stopped
                            and stop_when(totals.charged(), totals.done - totals.cache_hits, 0)
                        ):
                            stopped = True
                            run.stop()
                        continue
                    run.active.discard(number)
                    if kind == "died":
                        tally.died = True
                        if job.replica in run.alive:
                            run.alive.remove(job.replica)
                        left = [i for i in job.ids if outcomes[i] is None]
                        if backend.endpoint:
                            _charge_lost(totals, backend, [plan.requests[i] for i in left], window)
                        # Its later pieces were never sent: their rows go along, uncharged.
                        for later in cast(tuple[int, ...], payload[1]):
                            run.active.discard(later)
                            left += [i for i in run.jobs[later].ids if outcomes[i] is None]
                        if not stopped:
                            run.dispatch(left)
                    elif kind == "error":
                        run.stop()
                        error = _unwrap(cast(BaseException, payload))
                        if isinstance(error, RunAborted):
                            error.outcomes = plan.restore(outcomes)
                            error.answered = count_answered(outcomes)
                        raise error
        except KeyboardInterrupt as exc:
            raise interrupted(plan, outcomes, stored=cache is not None) from exc
        finally:
            if bar is not None:
                bar.close()
            if cache is not None:
                cache.flush()
    nodes = pool.nodes if pool is not None else [""] * replicas
    stats = dataclasses.replace(
        run_stats(plan, backend, totals, start, replicas, batch=False),
        replicas=tuple(
            ReplicaStats(
                i,
                nodes[i],
                t.rows,
                t.requests,
                t.prompt_tokens,
                t.cached_tokens,
                t.output_tokens,
                t.last,
                t.died,
            )
            for i, t in enumerate(tallies)
        ),
    )
    record_run(stats)
    done = [o for o in outcomes if o is not None]
    if len(done) != n:
        if not stopped:  # pragma: no cover - every job ends with all its outcomes
            msg = f"internal error: {n - len(done)} requests were never answered"
            raise SemframeError(msg)
        answered = count_answered(done)
        stop = BudgetExceeded(
            f"stopped after {answered} of {n} requests were answered: the budget hook said "
            f"stop ({n - len(done)} not sent; requests in flight were completed and kept)"
        )
        stop.outcomes = plan.restore(outcomes)
        stop.stats = stats
        raise stop
    return done, stats


def in_flight_window(settings: ResolvedConfig, backend: Backend, replicas: int) -> int:
    """Requests a replica may have sent whose answers the driver has not received.

    Its share of ``max_concurrency`` in flight, plus one answer it may have
    received but not yet streamed back.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> from semframe.config import config
    >>> in_flight_window(config(max_concurrency=8), FakeBackend(), 2)
    9
    """
    cap = replica_settings(settings, backend, replicas)["max_concurrency"]
    return int(cap or backend.capabilities.max_concurrency) + 1


def _charge_lost(totals: Totals, backend: Backend, left: Sequence[Request], window: int) -> None:
    """Charge what a dead replica may have had in flight, as unconfirmed.

    The provider may have billed requests the replica sent before it died;
    no answer will report them. Its first ``window`` unanswered requests are
    charged the way the in-process path charges a lost answer
    (:meth:`Totals.lost`): on the high side, never missing a billed one. They
    are sent again to the live replicas.
    """
    for request in left[:window]:
        totals.lost(lost_prompt_tokens(backend, request), request.max_tokens)


def _take(
    batch: Answers,
    job: _Job,
    outcomes: list[Outcome | None],
    totals: Totals,
    tally: _Tally,
    *,
    start: float,
) -> list[int]:
    """Put ``batch``'s outcomes in place (plan order) and count them; answered rows are skipped.

    A row is answered once: a batch from a replica that was given up on may
    still arrive after its rows were sent to another. Its outcomes for rows
    already answered are dropped, but what they cost is counted: they were
    sent, and billed. Returns the positions in ``batch`` that were taken.
    """
    prompt, cached, written, output = batch.usage
    totals.prompt_tokens += prompt
    totals.cached_tokens += cached
    totals.cache_write_tokens += written
    totals.output_tokens += output
    totals.largest_output = max(totals.largest_output, batch.largest_output)
    tally.prompt_tokens += prompt
    tally.cached_tokens += cached
    tally.output_tokens += output
    tally.last = time.monotonic() - start
    ids = [job.ids[i] for i in batch.ids]
    if not ids:
        return []
    fresh = [k for k, pos in enumerate(ids) if outcomes[pos] is None]
    attempts = batch.outcomes[Outcome._fields.index("attempts")]
    sent = sum(attempts)
    totals.sent += sent
    totals.retries += sent - sum(1 for a in attempts if a)
    tally.requests += sent
    if fresh:
        values = batch.outcome_list()
        kinds = batch.outcomes[Outcome._fields.index("error_kind")]
        if len(fresh) < len(ids):
            values = [values[k] for k in fresh]
            ids = [ids[k] for k in fresh]
            kinds = tuple(kinds[k] for k in fresh)
        for pos, outcome in zip(ids, values, strict=True):
            outcomes[pos] = outcome
        totals.done += len(ids)
        totals.errors += len(kinds) - kinds.count(None)
        tally.rows += len(ids)
    return fresh
