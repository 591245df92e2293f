"""Batch mode (``batch=True``): the providers' batch APIs, resumable.

A plan is sent as one or more provider batches (at most ``backend.batch_limit``
requests each). Results come back by custom id (``r<plan position>``) and are
mapped to rows, so order never depends on the provider. Requests that failed in
a retryable way (rate limits, server errors, expiry) or whose answers did not
parse are sent again in a further round, up to the retry limits; refused ones
become row errors at once. Answers are judged by the same rule as a live
run's (:func:`semframe.core.parse.accept`): an empty answer, or one cut at
``max_tokens``, does not count as parsed (unless ``truncated="keep"`` keeps a
cut answer that parses, marked and not stored in the result cache).

Batches run for minutes to hours. As soon as a batch has been created, its id
is written to a state file named by a digest of the backend, model and every
request; if the process dies while waiting, running the same call again finds
the file and waits for the same batches instead of paying twice. The file is
deleted once every row has an outcome.

With a result cache (:mod:`semframe.cache.store`, on by default), rows whose answers
are stored are not sent at all, and each batch's parsed answers are stored as
soon as its results are fetched, like the answers of a live run: a batch run
and a live run of the same call serve each other. A resumed run fetches the
results of batches recorded in the state file again (fetching is free) but
keeps the cached answer of any row that already has one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from semframe.backends.base import Backend, BatchBackend, BatchResult
from semframe.core.parse import ParseError, accept
from semframe.core.plan import Plan
from semframe.core.wire import Completion, Outcome
from semframe.errors import ConfigError, RequestRejected, TransientError
from semframe.runtime.execute import Totals, run_stats, serve_from_cache
from semframe.runtime.progress import Progress
from semframe.runtime.stats import RunStats, record_run

if TYPE_CHECKING:
    from semframe.cache.store import ResultCache


def state_path(plan: Plan, backend: Backend, directory: Path) -> Path:
    """The state file of ``plan`` on ``backend`` (a digest of everything sent)."""
    digest = hashlib.sha256()
    for part in (backend.name, backend.model, str(backend.endpoint or "")):
        digest.update(part.encode() + b"\x00")
    for r in plan.requests:
        schema = json.dumps(r.schema, sort_keys=True) if r.schema is not None else ""
        digest.update(
            f"{r.id}\x00{r.system or ''}\x00{r.prompt}\x00{r.max_tokens}\x00"
            f"{r.temperature}\x00{schema}\x01".encode()
        )
    return directory / "batches" / f"{backend.name}-{digest.hexdigest()[:24]}.json"


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return []  # unreadable state: start over rather than guess
    rounds = data.get("rounds") if isinstance(data, dict) else None
    return rounds if isinstance(rounds, list) else []


def _save(path: Path, rounds: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"rounds": rounds}))
    tmp.replace(path)


def run_batch(
    plan: Plan,
    backend: Backend,
    *,
    directory: Path,
    poll_seconds: float = 30.0,
    max_retries: int = 3,
    parse_retries: int = 1,
    progress: str = "auto",
    sleep: Callable[[float], None] = time.sleep,
    cache: ResultCache | None = None,
    cache_keys: Sequence[str | None] | None = None,
) -> tuple[list[Outcome], RunStats]:
    """Run ``plan`` through ``backend``'s batch API; outcomes in plan order.

    Parameters
    ----------
    plan : Plan
        What to send.
    backend : Backend
        Must have a batch API (``capabilities.batch_api``: a :class:`BatchBackend`).
    directory : Path
        semframe's cache directory; state files go under ``batches/``.
    poll_seconds : float
        Seconds between status checks.
    max_retries, parse_retries : int
        Further rounds for retryable failures and for unparseable answers.
    progress : {"auto", "on", "off"}
        Progress line mode.
    sleep : callable
        Waits between polls (tests pass a fake clock).
    cache : ResultCache, optional
        The result cache: stored answers are served without being sent, new
        ones are stored as each batch's results arrive. The caller closes it.
    cache_keys : sequence of str or None, optional
        The requests' cache keys (:func:`~semframe.runtime.execute.plan_keys`), when known.
    """
    if not backend.capabilities.batch_api:
        msg = (
            f"backend {backend.name!r} has no batch API; batch=True works with backends "
            "that have one ('openai', 'anthropic' and 'gemini')."
        )
        raise ConfigError(msg)
    bb = cast(BatchBackend, backend)
    limit = backend.capabilities.batch_limit
    start = time.monotonic()
    n = len(plan.requests)
    parse = plan.relquery.output.parse
    path = state_path(plan, backend, directory)
    rounds = _load(path)
    outcomes: list[Outcome | None] = [None] * n
    attempts = [0] * n
    transient_left = [max_retries] * n
    parse_left = [parse_retries] * n
    raw: list[str | None] = [None] * n
    totals = Totals()
    keep = None
    if cache is not None:
        keep = serve_from_cache(plan, backend, cache, outcomes, totals, keys=cache_keys)
    bar = Progress(
        n,
        f"{plan.relquery.op} on {backend.name} (batch)",
        mode=progress,
        dollars=lambda: backend.cost.bill(totals.charged(), batch=True),
    )

    def fold(results: dict[int, BatchResult], sent: Sequence[int]) -> None:
        for rid in sent:
            if outcomes[rid] is not None:  # a recorded batch re-fetched on resume: row was cached
                continue
            attempts[rid] += 1
            result = results.get(rid)
            if result is None:
                result = TransientError("no result for this request in the batch output")
            if isinstance(result, Completion):
                totals.add(result.usage)
                raw[rid] = result.text
                request = plan.requests[rid]
                try:
                    value, note = accept(
                        parse, result.text, result.finish_reason, request.max_tokens
                    )
                    outcomes[rid] = Outcome(value, result.text, None, note, attempts[rid])
                    if keep is not None and note is None:  # a kept cut answer is never stored
                        keep(rid, result)
                except ParseError as exc:
                    if parse_left[rid] <= 0:
                        outcomes[rid] = Outcome(None, result.text, "parse", str(exc), attempts[rid])
                    else:
                        parse_left[rid] -= 1
                        totals.retries += 1
                continue
            totals.sent += 1
            if isinstance(result, RequestRejected) or transient_left[rid] <= 0:
                outcomes[rid] = Outcome(None, raw[rid], "backend", str(result), attempts[rid])
            else:
                transient_left[rid] -= 1
                totals.retries += 1
        if cache is not None:
            cache.flush()  # this batch's answers are stored before anything else happens
        done = sum(o is not None for o in outcomes)
        totals.done = done
        totals.errors = sum(1 for o in outcomes if o is not None and not o.ok)
        if bar.enabled:
            bar.update(done, totals.prompt_tokens, totals.cached_tokens, totals.errors)

    try:
        index = 0
        while True:
            if index < len(rounds):  # a round recorded earlier (maybe by a dead process)
                record = rounds[index]
            else:
                pending = [i for i in range(n) if outcomes[i] is None]
                if not pending:
                    break
                record = {"requests": pending, "batches": []}
                rounds.append(record)
                for lo in range(0, len(pending), limit):
                    chunk = pending[lo : lo + limit]
                    batch_id = bb.batch_submit([plan.requests[i] for i in chunk])
                    record["batches"].append({"id": batch_id, "requests": [lo, lo + len(chunk)]})
                    _save(path, rounds)
            results: dict[int, BatchResult] = {}
            for entry in record["batches"]:
                while not (status := bb.batch_status(str(entry["id"]))).done:
                    sleep(poll_seconds)
                if status.state in {"failed"}:  # the whole batch was refused
                    continue
                results.update(bb.batch_results(status.id))
            fold(results, record["requests"])
            index += 1
    finally:
        bar.close()
    path.unlink(missing_ok=True)
    done = [o for o in outcomes if o is not None]
    stats = run_stats(plan, backend, totals, start, 1, batch=True)
    record_run(stats)
    return done, stats
