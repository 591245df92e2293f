"""Run a compiled call: resolve its backend, check it fits, serve or send it.

An operator compiles its work into one or more :class:`Call` objects (a
relQuery, or how to plan it, with the caller's row labels and the settings)
and runs them through one :class:`Runner`, which keeps the operator call's
statistics and its budget. Nothing here sees a DataFrame: a call carries a
frame-neutral table and, for messages, the labels of the rows it stands for
(the caller's index labels, or "chunk 2 of group 'Alien'" for a derived
relQuery).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from semframe import reorder
from semframe.backends import Backend, cost_model, get_backend
from semframe.cache.keys import KEY_BYTES, Keys, cacheable, call_key, plan_keys, request_keys
from semframe.cache.serve import Serving, serve_stored
from semframe.cache.store import TOUCH_SECONDS, ResultCache, open_cache
from semframe.config import ResolvedConfig, cache_dir
from semframe.core.capacity import Capacity
from semframe.core.plan import Plan, RelQuery, fingerprint, make_plan, without_gc
from semframe.core.requests import byte_lengths, bytes_of, rows_of, subset, with_options
from semframe.core.wire import Outcome, Usage
from semframe.cost.models import CostModel, warm_start
from semframe.errors import BudgetExceeded, ConfigError, InputError, MissingDependencyError
from semframe.reorder import Objective
from semframe.runtime.batch import run_batch
from semframe.runtime.execute import StopWhen, execute
from semframe.runtime.guard import BudgetGuard
from semframe.runtime.ray_executor import execute_ray
from semframe.runtime.stats import OpStats, RunStats, record_op, record_run

__all__ = [
    "Call",
    "Recipe",
    "Runner",
    "cache_capacity",
    "cache_objective",
    "check_context",
    "replay",
    "run_call",
    "uncached_part",
    "with_logprobs",
]

_CHAT_OVERHEAD_TOKENS = 32  # chat-template tokens around the messages, generously


@dataclass(frozen=True)
class Recipe:
    """How to plan a relQuery, kept until the plan is needed.

    Ordering and rendering a large relQuery takes seconds; a call whose
    answers are all in the result cache needs neither (see :func:`run_call`).

    Attributes
    ----------
    relquery : RelQuery
        What is asked (validated).
    reorder : str
        The reordering method.
    """

    relquery: RelQuery
    reorder: str

    def build(self, objective: Objective | None = None) -> Plan:
        """Order and render the relQuery (``objective``: see :func:`cache_objective`)."""
        ordering = reorder.order(self.relquery.table, self.reorder, objective=objective)
        return make_plan(self.relquery, ordering, self.reorder)


def cache_objective(settings: Mapping[str, Any], relquery: RelQuery) -> Objective | None:
    """What GGR's choice between its solves counts for the backend ``settings`` name.

    The backend's cost model declares its cache's granularity
    (``CostModel.granularity``: OpenAI's 1,024-token minimum and 128-token
    steps, vLLM's KV blocks, Anthropic's minimum): the choice then counts the
    tokens (the backend's tokenizer) that cache serves of each prompt,
    instructions included, rounded down to that granularity. ``None`` where
    every shared token is served (characters rank orders as well, with no
    tokenizer calls) or the backend's cost model cannot be had here.
    """
    try:
        model: CostModel = cost_model(
            settings["backend"], model=settings["model"], settings=settings
        )
    except (ConfigError, MissingDependencyError):
        return None
    granularity = model.granularity
    if granularity.per_token:
        return None
    return _objective(model, granularity, relquery)


def cache_capacity(settings: Mapping[str, Any], requests: int) -> Capacity | None:
    """The prefix cache a run of ``requests`` with ``settings`` is sent to, and its concurrency.

    The backend's cost model declares it (``CostModel.capacity``); the
    concurrency is the executor's, ``max_concurrency`` capped by the backend's
    and by the requests. ``None`` where the cost model cannot be had here.
    """
    try:
        model: CostModel = cost_model(
            settings["backend"], model=settings["model"], settings=settings
        )
    except (ConfigError, MissingDependencyError):
        return None
    rows = requests or 1
    workers = max(1, min(model.concurrency, settings["max_concurrency"] or rows, rows))
    return model.capacity(workers, cache_dir(settings["cache_dir"]))


def _objective(
    model: CostModel, granularity: reorder.Granularity, rq: RelQuery
) -> Objective | None:
    """Token counts of every distinct value and segment, in one call to the backend's tokenizer.

    They are counted on first use: GGR solves in these tokens (each value and
    each field's label), and counts the segments when its two solves order
    the rows differently. ``None`` where no prompt can reach the cache's
    minimum (its UTF-8 bytes bound its tokens, for a tokenizer that says so):
    the cache then serves neither solve anything and segment units decide, as
    without an objective, with nothing tokenized.
    """
    tokenizer = model.tokenizer()
    encode = tokenizer.encode
    head_texts = [rq.instructions + "\n\n", rq.system or ""]
    head = sum(len(t) for t in encode(head_texts))
    if tokenizer.bytes_bound and head + _longest_bytes(rq) < granularity.minimum:
        return None

    @functools.cache
    def tokens() -> dict[str, int]:
        distinct = [(f, rq.table.coded(f)[0]) for f in rq.fields]
        texts = [f"{f}: {v}\n" for f, values in distinct for v in values]
        texts += [v for _, values in distinct for v in values]
        texts += [f"{f}: \n" for f in rq.fields]
        texts = list(dict.fromkeys(texts))
        return dict(zip(texts, (len(t) for t in encode(texts)), strict=True))

    def count(text: str) -> int:
        found = tokens().get(text)
        return found if found is not None else len(encode([text])[0])

    return Objective(granularity, count, head=head)


def _longest_bytes(rq: RelQuery) -> int:
    """UTF-8 bytes of the longest labeled segment of each field, summed over the fields.

    No prompt's segments hold more (a bound, not a row's own sum).
    """
    total = 0
    for f in rq.fields:
        longest = int(byte_lengths(rq.table.coded(f)[0]).max(initial=0))
        total += len(f"{f}: \n".encode("utf-8", "surrogatepass")) + longest
    return total


@dataclass(frozen=True)
class Call:
    """Everything one relQuery resolved to, before anything is sent.

    Attributes
    ----------
    labels : sequence of object
        One label per row of the relQuery, as error messages name the row:
        the caller's index labels, or what a derived request stands for.
    settings : ResolvedConfig
        The call's settings.
    source : Plan or Recipe
        The plan, or how to build it: :attr:`plan` builds it on first use.
    """

    labels: Sequence[object]
    settings: ResolvedConfig
    source: Plan | Recipe

    @functools.cached_property
    def plan(self) -> Plan:
        """The plan (ordered and rendered on first use when the call holds a recipe)."""
        source = self.source
        if isinstance(source, Plan):
            plan = source
        else:
            objective = None
            if source.reorder == "ggr":
                objective = cache_objective(self.settings, source.relquery)
            plan = source.build() if objective is None else source.build(objective)
        capacity = cache_capacity(self.settings, len(plan.requests))
        return plan if capacity is None else dataclasses.replace(plan, capacity=capacity)

    @property
    def relquery(self) -> RelQuery:
        """What is asked, without planning it."""
        return self.source.relquery

    def take(self, rows: Sequence[int]) -> Call:
        """The same call over ``rows`` only (positions, in this order), planned anew.

        Raises
        ------
        InputError
            For a call holding a ready plan (a derived relQuery has no rows to take).
        """
        source = self.source
        if isinstance(source, Plan):
            msg = "internal: a call holding a ready plan cannot be cut to some of its rows"
            raise InputError(msg)
        rq = dataclasses.replace(source.relquery, table=source.relquery.table.take(rows))
        labels = tuple(self.labels[r] for r in rows)
        return Call(labels, self.settings, Recipe(rq, source.reorder))

    @functools.cached_property
    def fingerprint(self) -> str | None:
        """The call's :func:`~semframe.core.plan.fingerprint`, or ``None``.

        ``None`` for a call holding a ready plan, and for one whose requests are
        not cacheable (temperature above 0).
        """
        source = self.source
        if isinstance(source, Plan) or source.relquery.temperature != 0:
            return None
        return fingerprint(source.relquery, source.reorder)


def with_logprobs(call: Call, top: int) -> Call:
    """``call`` with every request asking for token logprobs (``top`` alternatives each)."""
    source = call.source
    if isinstance(source, Recipe):
        rq = dataclasses.replace(source.relquery, logprobs=top)
        return dataclasses.replace(call, source=Recipe(rq, source.reorder))
    requests = with_options(source.requests, logprobs=top)
    return dataclasses.replace(call, source=dataclasses.replace(source, requests=requests))


def backend_of(settings: Mapping[str, Any]) -> Backend:
    """The backend ``settings`` name (built once, see :func:`semframe.backends.get_backend`)."""
    return get_backend(settings["backend"], model=settings["model"], settings=settings)


def check_context(call: Call, backend: Backend) -> None:
    """Fail before sending if a prompt cannot fit the backend's context window.

    A prompt's UTF-8 byte length bounds its token count from above, so only
    prompts whose byte length might not fit are counted exactly.

    Raises
    ------
    InputError
        Naming the row, its longest column and the ``truncate=`` option.
    """
    window = backend.capabilities.context_window
    if window is None:
        return
    plan = call.plan
    budget = window - plan.relquery.max_tokens - _CHAT_OVERHEAD_TOKENS
    system_bytes = len((plan.relquery.system or "").encode())
    room = budget - system_bytes
    over = [i for i, size in enumerate(bytes_of(plan.requests).tolist()) if size > room]
    suspects = [plan.requests[i] for i in over]
    if not suspects:
        return
    counts = backend.count_tokens([r.prompt + (r.system or "") for r in suspects])
    for request, tokens in zip(suspects, counts, strict=True):
        if tokens <= budget:
            continue
        table = plan.relquery.table
        longest = max(table.columns, key=lambda c: len(table.cells[c][request.row]))
        length = len(table.cells[longest][request.row])
        label = call.labels[request.row]
        suggestion = max(1, length * budget // max(tokens, 1) // 2)
        msg = (
            f"row {request.row} (label {label!r}) needs about {tokens:,} prompt tokens, but "
            f"{backend.name}/{backend.model} allows {window:,} per request including "
            f"max_tokens={plan.relquery.max_tokens}. Its longest cell is column {longest!r} "
            f"({length:,} characters). Shorten it, or pass truncate={{{longest!r}: "
            f"{suggestion}}} to cut cells to that many characters."
        )
        raise InputError(msg)


def _open(settings: Mapping[str, Any]) -> ResultCache | None:
    if not settings["cache"]:
        return None
    return open_cache(cache_dir(settings["cache_dir"]), max_mib=settings["cache_max_mib"])


def run_call(
    call: Call, *, stop_when: StopWhen | None = None
) -> tuple[Sequence[Outcome], RunStats]:
    """Resolve the backend, check the context window, execute; outcomes in input order.

    With the result cache on, a call indexed there whose every answer is
    stored (a re-run) is served whole without being planned (see
    :func:`replay`); any other call is planned, its stored answers are served
    and the rest sent, and the call is indexed once its run ends.
    ``stop_when`` is the budget hook (:data:`semframe.runtime.execute.StopWhen`).
    """
    cfg = call.settings
    backend = backend_of(cfg)
    cache = _open(cfg)
    fp = call.fingerprint if cache is not None else None
    key = None if fp is None else call_key(backend, fp)
    try:
        if cache is not None and key is not None:
            replayed = replay(call, backend, cache, key)
            if replayed is not None:
                return replayed
        check_context(call, backend)
        plan = call.plan
        keys = plan_keys(plan, backend) if cache is not None else None
        if cfg["batch"]:
            outcomes, stats = run_batch(
                plan,
                backend,
                directory=cache_dir(cfg["cache_dir"]),
                poll_seconds=cfg["batch_poll_seconds"],
                max_retries=cfg["max_retries"],
                progress=cfg["progress"],
                cache=cache,
                cache_keys=keys,
            )
        elif cfg["executor"] == "ray":
            outcomes, stats = execute_ray(
                plan, backend, cfg, stop_when=stop_when, cache=cache, cache_keys=keys
            )
        else:
            outcomes, stats = execute(
                plan,
                backend,
                max_concurrency=cfg["max_concurrency"],
                max_retries=cfg["max_retries"],
                progress=cfg["progress"],
                rpm=cfg["rpm"],
                tpm=cfg["tpm"],
                timeout=cfg["timeout"] or backend.capabilities.answer_timeout,
                row_timeout=cfg["row_timeout"],
                warm=warm_start(backend.cost, cfg["warm_start"]),
                stop_when=stop_when,
                cache=cache,
                cache_keys=keys,
            )
        if cache is not None and keys is not None and key is not None:
            # A call with a fingerprint is deterministic: every request has a key.
            info = {
                "expected_hit_rate": stats.expected_hit_rate,
                "batch": stats.batch,
                "usage": _paid(stats),
            }
            cache.put_call(key, keys, info, order=plan.ordering.inverse())
    finally:
        if cache is not None:
            cache.close()
    return plan.ordering.restore(outcomes), stats


def replay(
    call: Call, backend: Backend, cache: ResultCache, key: str
) -> tuple[Sequence[Outcome], RunStats] | None:
    """Serve a call whole from ``cache``, without planning it; ``None`` when it cannot be.

    It can be when the cache indexes the call under ``key`` (its backend and
    :attr:`Call.fingerprint`, :func:`~semframe.cache.keys.call_key`) and holds
    a parsable answer for every row: each row gets its stored answer, nothing
    is sent, and the statistics count every row as a cache hit with the usage
    (and dollars) it was first paid for.
    """
    source = call.source
    if not isinstance(source, Recipe):
        return None
    start = time.monotonic()
    rq = source.relquery
    n = rq.table.n_rows
    try:
        entry = cache.call_entry(key)
        if entry is None or len(entry[0]) != n * KEY_BYTES:
            return None
        keys, info = Keys(entry[0]), entry[1]
        paid = _recorded_usage(info)
        serving = Serving(rq.output.parse, n, cache.clock() - TOUCH_SECONDS, usage=paid is None)
        with without_gc():  # the entries read and the answers: no cycle among them
            if not cache.read_answers(keys.joined(), serving.take, usage=paid is None):
                return None
    except sqlite3.Error:
        return None
    if serving.rows != n:
        return None  # a row's answer is not stored, or no longer parses
    usage = serving.usage if paid is None else paid
    with contextlib.suppress(sqlite3.Error):
        cache.touch(dict.fromkeys(cast("str", keys[i]) for i in serving.stale))
        cache.touch_call(key)
        cache.count_hits(backend.name, backend.model, n)
    batch = bool(info.get("batch", False))
    stats = RunStats(
        op=rq.op,
        backend=backend.name,
        model=backend.model,
        reorder=source.reorder,
        rows=n,
        requests=0,
        prompt_tokens=0,
        cached_tokens=0,
        cache_write_tokens=0,
        output_tokens=0,
        errors=0,
        retries=0,
        wall_seconds=time.monotonic() - start,
        workers=0,
        expected_hit_rate=float(info.get("expected_hit_rate", 0.0)),
        dollars=backend.cost.bill(Usage(), batch=batch),
        batch=batch,
        cache_hits=n,
        cache_saved_dollars=backend.cost.bill(usage, batch=batch),
        cache_saved_usage=usage,
    )
    record_run(stats)
    return serving.answered(), stats


def _recorded_usage(info: Mapping[str, Any]) -> Usage | None:
    """The usage a call entry records its rows were paid for; ``None`` when it records none.

    Entries written before the usage was recorded (or damaged) have none: a
    re-run then sums each row's stored usage.

    Examples
    --------
    >>> _recorded_usage({"usage": [90, 40, 0, 12]})
    Usage(prompt_tokens=90, cached_tokens=40, cache_write_tokens=0, output_tokens=12)
    >>> _recorded_usage({"expected_hit_rate": 0.5}) is None
    True
    """
    got = info.get("usage")
    if (
        not isinstance(got, list)
        or len(got) != len(Usage._fields)
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in got)
    ):
        return None
    return Usage(*got)


def _paid(stats: RunStats) -> list[int]:
    """What a run's rows were paid for: its sent usage plus its served rows' (a call entry's)."""
    saved = stats.cache_saved_usage
    return [
        stats.prompt_tokens + saved.prompt_tokens,
        stats.cached_tokens + saved.cached_tokens,
        stats.cache_write_tokens + saved.cache_write_tokens,
        stats.output_tokens + saved.output_tokens,
    ]


def uncached_part(plan: Plan, settings: Mapping[str, Any]) -> tuple[Plan, int]:
    """The part of ``plan`` the result cache cannot answer now, and how many rows it can.

    What an estimate or a budget should count: rows whose answers are stored
    cost nothing. The part is planned again (its rows in ``plan``'s order,
    each with its field order), so that it is a plan of its own. With the
    cache off, or a backend that cannot be built here (an API without its
    key), the whole plan.

    A plan of more than :data:`PROBE_ABOVE` requests is first probed: when
    none of :data:`PROBE_KEYS` of its requests (a fixed draw) is stored, the
    whole plan is counted without computing every key. Whatever share ``p``
    of the rows the cache holds, that probe misses it with probability
    ``(1 - p) ** PROBE_KEYS``: what it can overstate is ``p`` times that, at
    most 0.04% of the rows, in expectation.
    """
    if not settings["cache"] or not plan.requests:
        return plan, 0
    try:
        backend = backend_of(settings)
    except (ConfigError, MissingDependencyError):
        return plan, 0
    cache = _open(settings)
    if cache is None:
        return plan, 0
    outcomes: list[Outcome | None] = [None] * len(plan.requests)
    try:
        if not _probe_finds_any(plan, backend, cache):
            return plan, 0
        keys = plan_keys(plan, backend)
        served = serve_stored(cache, keys, plan.relquery.output.parse, outcomes)
    except sqlite3.Error:
        return plan, 0
    finally:
        cache.close()
    if not served.rows:
        return plan, 0
    left = [i for i, o in enumerate(outcomes) if o is None]
    rq = plan.relquery
    sub = dataclasses.replace(rq, table=rq.table.take(rows_of(plan.requests)[left].tolist()))
    return make_plan(sub, plan.ordering.subset(left), plan.reorder), served.rows


PROBE_ABOVE = 20_000
"""Requests above which an estimate probes the result cache before looking every key up."""

PROBE_KEYS = 1_000
"""Requests (a fixed draw) whose keys the probe looks up."""


def _probe_finds_any(plan: Plan, backend: Backend, cache: ResultCache) -> bool:
    """Whether any of a fixed draw of ``plan``'s requests is stored (small plans: True)."""
    n = len(plan.requests)
    if n <= PROBE_ABOVE:
        return True
    drawn = np.sort(np.random.default_rng(n).choice(n, PROBE_KEYS, replace=False))
    wanted = [r for r in subset(plan.requests, drawn.tolist()) if cacheable(r)]
    return bool(wanted) and bool(cache.rows(request_keys(backend, wanted)))


@dataclass
class Runner:
    """Runs the relQueries of one operator call; keeps their statistics and its budget.

    Every relQuery of the call goes through :meth:`run` (``agg`` runs one per
    reduction level, ``topk`` one per comparison round). With a budget
    ``guard``, a run stops once the spend of the whole operator call would
    pass the budget: rows not sent get an outcome with ``error_kind="budget"``
    and later relQueries send nothing. :meth:`finish` records the call's
    :class:`~semframe.runtime.stats.OpStats` (``semframe.last_op()``).

    Attributes
    ----------
    op : str
        The operator.
    guard : BudgetGuard or None
        The call's budget.
    runs : list of RunStats
        One per relQuery run so far.
    """

    op: str
    guard: BudgetGuard | None = None
    runs: list[RunStats] = field(default_factory=list)

    def run(self, call: Call, *, calibration: int = 0) -> Sequence[Outcome]:
        """Run one relQuery; outcomes in the call's row order.

        Its first ``calibration`` rows calibrate the others' decisions: they are
        counted as :attr:`RunStats.calibration`, not as rows.
        """
        guard = self.guard
        if guard is None:
            outcomes, stats = run_call(call)
            self._add(stats, calibration)
            return outcomes
        n = call.relquery.table.n_rows
        if guard.stopped is not None:
            return [guard.unsent()] * n
        try:
            outcomes, stats = run_call(call, stop_when=guard.hook(backend_of(call.settings)))
        except BudgetExceeded as exc:
            guard.stopped = exc
            if exc.stats is not None:
                self._add(exc.stats, calibration)
                guard.add(exc.stats)
            return [o if o is not None else guard.unsent() for o in exc.outcomes]
        self._add(stats, calibration)
        guard.add(stats)
        return outcomes

    def _add(self, stats: RunStats, calibration: int) -> None:
        if calibration:
            stats = dataclasses.replace(
                stats, rows=stats.rows - calibration, calibration=calibration
            )
            record_run(stats)  # what last_run() returns
        self.runs.append(stats)

    def finish(self, *, detail: object = None, **counts: int) -> OpStats:
        """Record the call's statistics (``semframe.last_op()``)."""
        return record_op(self.op, self.runs, detail=detail, **counts)
