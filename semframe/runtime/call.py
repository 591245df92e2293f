"""Run a compiled call: resolve its backend, check it fits, execute it.

Operators (``semframe.operators.common``) compile a call into a :class:`Call`; this module
sends it. Keeping the two apart lets every operator share one way of running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from semframe.backends import Backend, get_backend
from semframe.backends.base import Usage
from semframe.cache.store import ResultCache, call_key, open_cache
from semframe.config import ResolvedConfig, cache_dir
from semframe.core.frames import FrameAdapter
from semframe.core.plan import Plan, RelQuery, fingerprint, make_plan
from semframe.errors import InputError
from semframe.runtime.execute import (
    Outcome,
    RunStats,
    bill,
    execute,
    plan_keys,
    record_run,
    serve_stored,
)

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

    def build(self) -> Plan:
        """Order and render the relQuery."""
        from semframe import reorder as _reorder

        ordering = _reorder.order(self.relquery.table, self.reorder)
        return make_plan(self.relquery, ordering, self.reorder)


@dataclass(frozen=True)
class Call:
    """Everything an operator call resolved to, before anything is sent.

    Attributes
    ----------
    frame : object
        The (eager) frame of the call.
    adapter : FrameAdapter
        Its adapter.
    settings : ResolvedConfig
        The call's settings.
    source : Plan or Recipe
        The plan, or how to build it: :attr:`plan` builds it on first use.
    """

    frame: Any
    adapter: FrameAdapter
    settings: ResolvedConfig
    source: Plan | Recipe

    @functools.cached_property
    def plan(self) -> Plan:
        """The plan (ordered and rendered on first use when the call holds a recipe)."""
        source = self.source
        return source if isinstance(source, Plan) else source.build()

    @property
    def relquery(self) -> RelQuery:
        """What is asked, without planning it."""
        return self.source.relquery

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
    requests = tuple(r._replace(logprobs=top) for r in source.requests)
    return dataclasses.replace(call, source=dataclasses.replace(source, requests=requests))


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
    suspects = [r for r in plan.requests if len(r.prompt.encode()) + system_bytes > budget]
    if not suspects:
        return
    counts = backend.count_tokens([r.prompt + (r.system or "") for r in suspects])
    for request, tokens in zip(suspects, counts, strict=True):
        if tokens <= budget:
            continue
        table = plan.relquery.table
        longest = max(table.columns, key=lambda c: len(table.cells[c][request.row]))
        length = len(table.cells[longest][request.row])
        label = call.adapter.labels(call.frame)[request.row]
        suggestion = max(1, length * budget // max(tokens, 1) // 2)
        msg = (
            f"row {request.row} (label {label!r}) needs about {tokens} prompt tokens, but "
            f"{backend.name}/{backend.model} allows {window} per request including "
            f"max_tokens={plan.relquery.max_tokens}. Its longest cell is column {longest!r} "
            f"({length:,} characters). Shorten it, or pass truncate={{{longest!r}: "
            f"{suggestion}}} to cut cells to that many characters."
        )
        raise InputError(msg)


def run_call(call: Call) -> tuple[list[Outcome], RunStats]:
    """Resolve the backend, check the context window, execute; outcomes in input order.

    With the result cache on, a call indexed there whose every answer is
    stored (a re-run) is served whole without being planned (see
    :func:`replay`); any other call is planned, its stored answers are served
    and the rest sent, and the call is indexed once its run ends.
    """
    cfg = call.settings
    backend = get_backend(cfg["backend"], model=cfg["model"], settings=cfg)
    cache = (
        open_cache(cache_dir(cfg["cache_dir"]), max_mib=cfg["cache_max_mib"])
        if cfg["cache"]
        else None
    )
    try:
        if cache is not None:
            replayed = replay(call, backend, cache)
            if replayed is not None:
                return replayed
        check_context(call, backend)
        plan = call.plan
        keys = plan_keys(plan, backend) if cache is not None else None
        if cfg["batch"]:
            from semframe.runtime.batch import run_batch

            outcomes, stats = run_batch(
                plan,
                backend,
                directory=cache_dir(cfg["cache_dir"]),
                poll_seconds=cfg["batch_poll_seconds"],
                max_retries=cfg["max_retries"],
                progress=cfg["progress"],
                prices=cfg["prices"],
                cache=cache,
                cache_keys=keys,
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
                # A guard above the SDK's own timeout, for servers that trickle bytes.
                deadline=cfg["timeout"] * 1.5 + 5,
                prices=cfg["prices"],
                cache=cache,
                cache_keys=keys,
            )
        if cache is not None and keys is not None and call.fingerprint is not None:
            by_row = plan.restore(keys)
            info = {"expected_hit_rate": plan.expected_hit_rate, "batch": stats.batch}
            cache.put_call(call_key(backend, call.fingerprint), by_row, info)
    finally:
        if cache is not None:
            cache.close()
    return plan.restore(outcomes), stats


def replay(
    call: Call, backend: Backend, cache: ResultCache
) -> tuple[list[Outcome], RunStats] | None:
    """Serve a call whole from ``cache``, without planning it; ``None`` when it cannot be.

    It can be when the cache indexes the call (its backend and
    :attr:`Call.fingerprint`) and holds a parsable answer for every row: each
    row gets its stored answer, nothing is sent, and the statistics count every
    row as a cache hit with the usage (and dollars) it was first paid for.
    """
    fp = call.fingerprint
    if fp is None:
        return None
    start = time.monotonic()
    key = call_key(backend, fp)
    rq = call.relquery
    n = rq.table.n_rows
    outcomes: list[Outcome | None] = [None] * n
    try:
        entry = cache.get_call(key)
        if entry is None or len(entry[0]) != n:
            return None
        keys, info = entry
        served = serve_stored(cache, keys, rq.output.parse, outcomes)
    except sqlite3.Error:
        return None
    if served.rows != n:
        return None
    with contextlib.suppress(sqlite3.Error):
        cache.touch(dict.fromkeys(served.stale))
        cache.touch_call(key)
        cache.count_hits(backend.name, backend.model, n)
    batch = bool(info.get("batch", False))
    prices = call.settings["prices"]
    stats = RunStats(
        op=rq.op,
        backend=backend.name,
        model=backend.model,
        reorder=cast(Recipe, call.source).reorder,
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
        dollars=bill(backend, Usage(), batch=batch, prices=prices),
        batch=batch,
        cache_hits=n,
        cache_saved_dollars=bill(backend, served.usage, batch=batch, prices=prices),
    )
    record_run(stats)
    return cast(list[Outcome], outcomes), stats


def uncached_part(plan: Plan, settings: Mapping[str, Any]) -> tuple[Plan, int]:
    """The part of ``plan`` the result cache cannot answer now, and how many rows it can.

    What an estimate or a budget should count: rows whose answers are stored
    cost nothing. The part is planned again (its rows in ``plan``'s order,
    each with its field order), so that it is a plan of its own. With the
    cache off, or a backend that cannot be built here (an API without its
    key), the whole plan.
    """
    from semframe.core.ordering import Ordering
    from semframe.errors import ConfigError, MissingDependencyError

    if not settings["cache"] or not plan.requests:
        return plan, 0
    try:
        backend = get_backend(settings["backend"], model=settings["model"], settings=settings)
    except (ConfigError, MissingDependencyError):
        return plan, 0
    cache = open_cache(cache_dir(settings["cache_dir"]), max_mib=settings["cache_max_mib"])
    if cache is None:
        return plan, 0
    outcomes: list[Outcome | None] = [None] * len(plan.requests)
    try:
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
    sub = dataclasses.replace(rq, table=rq.table.take([plan.requests[i].row for i in left]))
    order = Ordering(tuple(range(len(left))), tuple(plan.ordering.fields[i] for i in left))
    return make_plan(sub, order, plan.reorder), served.rows
