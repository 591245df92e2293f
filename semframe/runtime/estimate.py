"""Estimates as a run would see them: the backend's cost model, stored answers, a probe.

:func:`estimate_plan` prices a plan the way ``settings`` would run it: it
resolves the backend's cost model (an API without its key is still priced),
the concurrency the executor would use, and, with ``probe=N``, sends ``N``
sample rows to measure answer lengths; the arithmetic is
:func:`semframe.cost.estimate.price_plan`. :func:`estimate_call` first leaves
out the rows the result cache already answers: they cost nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from semframe.backends import Backend, cost_model, get_backend
from semframe.config import cache_dir
from semframe.core.plan import Plan, make_plan
from semframe.core.requests import rows_of
from semframe.cost.estimate import Estimate, Figures, price_plan
from semframe.cost.models import CostModel, LatencyModel, RunShape, warm_start
from semframe.errors import ConfigError, InputError, MissingDependencyError, plural
from semframe.runtime.call import uncached_part
from semframe.runtime.execute import execute
from semframe.runtime.ray_executor import PER_REQUEST_CHARS
from semframe.serving.partition import partition

__all__ = ["estimate_call", "estimate_first_round", "estimate_plan", "probe_output"]


def _resolve(settings: Mapping[str, Any]) -> tuple[Backend | None, CostModel]:
    """The backend, when it can be built here, and its cost model."""
    name, model = settings["backend"], settings["model"]
    try:
        backend = get_backend(name, model=model, settings=settings)
    except (ConfigError, MissingDependencyError):
        # An API without its key (or SDK) can still be priced.
        return None, cost_model(name, model=model, settings=settings)
    return backend, backend.cost


def probe_output(
    plan: Plan, backend: Backend, rows: int, *, workers: int
) -> tuple[float, float | None, int]:
    """Send ``rows`` sampled requests of ``plan``: (mean output tokens, dollars, rows sent)."""
    n = len(plan.requests)
    k = min(rows, n)
    if k == 0:
        return 0.0, None, 0
    picked = sorted(random.Random(0).sample(range(n), k))
    rq = plan.relquery
    sub = dataclasses.replace(
        rq, table=rq.table.take(rows_of(plan.requests)[picked].tolist()), logprobs=0
    )
    _, stats = execute(
        make_plan(sub, plan.ordering.subset(picked), "probe"),
        backend,
        max_concurrency=workers,
        progress="off",
    )
    sent = max(stats.requests - stats.retries, 1)
    return stats.output_tokens / sent, stats.dollars, k


def estimate_plan(
    plan: Plan,
    settings: Mapping[str, Any],
    *,
    op: str | None = None,
    probe: int = 0,
    latency: LatencyModel | None = None,
    scale: float = 1.0,
    notes: Sequence[str] = (),
) -> Estimate:
    """Estimate ``plan`` as ``settings`` (a resolved configuration) would run it.

    Parameters
    ----------
    plan : Plan
        The plan the run would execute.
    settings : mapping
        Resolved settings (``semframe.config(...)``): backend, model, prices,
        batch, cache_ttl, max_concurrency, cache_dir.
    op : str, optional
        Operator name to report (default: the relQuery's).
    probe : int
        Rows to send first to measure output lengths (0: use ``max_tokens``).
    latency : LatencyModel, optional
        Per-request latency of API backends (default: the cost model's).
    scale : float
        Multiply every figure (a first round standing for a whole operator call).
    notes : sequence of str
        Extra caveats to report.

    Examples
    --------
    >>> import pandas as pd, semframe
    >>> from semframe.operators.common import compile_call
    >>> call = compile_call(pd.DataFrame({"t": ["a", "b"]}), "Echo {t}", op="map",
    ...                     backend="fake")
    >>> estimate_plan(call.plan, call.settings).planned.output_tokens_max
    512
    """
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 0:
        msg = f"probe must be a number of rows >= 0, got {probe!r}."
        raise InputError(msg)
    backend, model = _resolve(settings)
    model.check()
    limit = backend.capabilities.max_concurrency if backend is not None else model.concurrency
    slots = max(1, min(limit, settings["max_concurrency"] or limit))
    workers = min(slots, len(plan) or 1)
    out_mean = float(plan.relquery.max_tokens)
    source = "max_tokens"
    probe_cost = None
    if probe:
        if backend is None:
            msg = (
                f"probe= sends requests, so backend {settings['backend']!r} needs its API key "
                "(or a client) for it; estimate without probe= to price by max_tokens."
            )
            raise ConfigError(msg)
        out_mean, probe_cost, k = probe_output(plan, backend, probe, workers=workers)
        source = f"probe of {plural(k, 'row')}"
    shape = RunShape(
        workers=workers,
        batch=bool(settings["batch"]),
        out_mean=out_mean,
        cache_dir=cache_dir(settings["cache_dir"]),
        latency=latency,
        warm=warm_start(model, settings["warm_start"]),
        slots=slots,
        token_sample=settings["token_sample"],
    )
    replicas = settings["replicas"] if settings["executor"] == "ray" else 1
    if replicas > 1 and not settings["batch"]:
        if backend is not None and backend.endpoint is None and len(plan) > 1:
            shaped = _Shaped(shape, source, probe_cost)
            return _on_replicas(plan, settings, model, shaped, replicas, op, scale, notes)
        if model.per_client:
            # Replicas of an API backend share its endpoint, cache and limits: each
            # sends its shard as a client of its own, with its share of max_concurrency.
            shape = dataclasses.replace(
                shape,
                workers=max(1, slots // replicas),
                split=functools.partial(_shards, replicas=replicas),
            )
            how = (
                "each replica's share of the plan (partitioned as the run partitions it) "
                "replayed as a client of its own with its share of max_concurrency, all "
                "against the one cache"
            )
        else:
            how = "priced as one client sending the whole plan"
        notes = (
            *notes,
            f"executor='ray': the {replicas} replicas reach one endpoint, its cache and its "
            f"limits: {how}",
        )
    return price_plan(
        plan,
        model,
        shape,
        backend=settings["backend"],
        op=op,
        output_source=source,
        probe_cost=probe_cost,
        scale=scale,
        notes=notes,
    )


def _on_replicas(  # noqa: PLR0917
    plan: Plan,
    settings: Mapping[str, Any],
    model: CostModel,
    shaped: _Shaped,
    replicas: int,
    op: str | None,
    scale: float,
    notes: Sequence[str],
) -> Estimate:
    """``plan`` as ``executor="ray"`` sends it: partitioned, each replica priced on its own.

    The requests are partitioned as the run partitions them (whole prefix
    groups, :func:`~semframe.serving.partition.partition`); each shard is
    planned again and simulated on an engine of its own (each replica owns
    one), so a prefix split across replicas is paid on each. Counts and
    dollars add up; the wall time is the slowest replica's.
    """
    shape = shaped.shape
    rq = plan.relquery
    parts = []
    for ids in _shards(plan, replicas):
        rows = rows_of(plan.requests)[ids].tolist()
        sub = dataclasses.replace(rq, table=rq.table.take(rows))
        shard = make_plan(sub, plan.ordering.subset(ids), plan.reorder)
        parts.append(
            price_plan(
                shard,
                model,
                dataclasses.replace(shape, workers=min(shape.workers, len(ids))),
                backend=settings["backend"],
                op=op,
                output_source=shaped.source,
                scale=scale,
            )
        )
    first = parts[0]
    note = (
        f"executor='ray': {plural(len(parts), 'replica')} with work, prefix groups partitioned "
        "as the run partitions them; each replica's cache simulated on its own (a prefix "
        "split across replicas is paid on each), the wall time is the slowest replica's"
    )
    return dataclasses.replace(
        first,
        rows=sum(e.rows for e in parts),
        planned=Figures.side_by_side([e.planned for e in parts]),
        original=Figures.side_by_side([e.original for e in parts]),
        notes=(*notes, *dict.fromkeys(n for e in parts for n in e.notes), note),
        seconds_to_estimate=sum(e.seconds_to_estimate for e in parts),
        probe_cost=shaped.probe_cost,
    )


def _shards(plan: Plan, replicas: int) -> list[list[int]]:
    """The plan positions each replica sends, as the Ray executor partitions ``plan``."""
    part = partition(plan.requests, plan.groups, replicas, per_request=PER_REQUEST_CHARS)
    return [list(ids) for ids in part.shards if ids]


@dataclass(frozen=True)
class _Shaped:
    """How the run would send the plan, and where its output lengths come from."""

    shape: RunShape
    source: str
    probe_cost: float | None


def estimate_call(plan: Plan, settings: Mapping[str, Any], *, op: str, probe: int = 0) -> Estimate:
    """:func:`estimate_plan` of the rows the result cache cannot answer (they cost nothing)."""
    n = len(plan.requests)
    left, cached = uncached_part(plan, settings)
    notes = (
        (
            f"{cached:,} of {plural(n, 'row')} {'is' if cached == 1 else 'are'} answered by "
            "the result cache and not counted "
            "(they cost nothing; cache=False estimates every row)",
        )
        if cached
        else ()
    )
    return estimate_plan(left, settings, op=op, probe=probe, notes=notes)


def estimate_first_round(
    first: Plan, settings: Mapping[str, Any], *, op: str, probe: int, total: int, what: str
) -> Estimate:
    """An operator of several rounds (``agg`` levels, ``topk`` comparisons), from its first.

    The first relQuery is simulated exactly and every figure scaled to
    ``total`` requests; ``what`` says how the later rounds were extrapolated.
    """
    n = len(first.requests)
    return estimate_plan(
        first,
        settings,
        op=op,
        probe=probe,
        scale=total / n if n else 1.0,
        notes=(
            f"first relQuery ({plural(n, 'request')}) simulated; {what}: "
            f"{plural(total, 'request')}",
        ),
    )
