"""What a call will cost and how long it will take, before anything is sent.

The estimator prices the :class:`~semframe.core.plan.Plan` the run would execute,
request by request, in the order the executor would send it:

1. Tokens are counted offline (:mod:`semframe.cost.tokens`, the provider's
   encoding; Claude counts are approximate and flagged) or, for local engines,
   with the engine's own tokenizer. Each distinct
   piece of a prompt (the shared instructions, each labeled field value) is
   counted once.
2. A model of the executor's dispatch gives every request an arrival and a
   completion time: API backends send a prefix group's first request alone and
   its followers once it has been answered, with at most ``max_concurrency``
   requests in flight and a :class:`LatencyModel` per request; local engines
   give each slot a prefix group, as the group-aware dispatcher does.
3. The backend's cost model (:mod:`semframe.cost.models`) runs its cache
   rules on that sequence: OpenAI through
   :class:`~semframe.cost.cachesim.OpenAICacheSim` with the ``prompt_cache_key``
   the backend sends, Anthropic through
   :class:`~semframe.cost.cachesim.BreakpointCacheSim` with breakpoints exactly
   where the backend places them, llama.cpp as one KV prefix per slot, vLLM
   in whole cache blocks.
4. The price table (:mod:`semframe.cost.pricing`, batch prices with ``batch=True``)
   turns tokens into dollars by component.

The same figures are computed for the original row order (``reorder="none"``)
so the saving of reordering is visible. Local engines' wall time comes from a
per-machine calibration (:func:`semframe.calibrate_local`), stored in the
cache directory and reused. This module is pure arithmetic over a plan:
:func:`semframe.runtime.estimate.estimate_plan` resolves the backend's cost
model, measures answer lengths with a probe when asked, and calls
:func:`price_plan`.

Examples
--------
>>> import pandas as pd, semframe
>>> df = pd.DataFrame({"movie": ["Alien", "Alien", "Heat"], "review": ["tense", "slow", "long"]})
>>> est = df.llm.estimate("Is {review} of {movie} positive?", op="filter", backend="fake")
>>> est.requests, est.planned.input_tokens > 0
(3, True)
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any, cast

from semframe.core.display import html_table, pyplot
from semframe.core.ordering import Ordering
from semframe.core.plan import Plan, make_plan
from semframe.core.requests import bytes_of
from semframe.cost.budget import Budget
from semframe.cost.models import (
    PACE_MEANING,
    PACES,
    CacheFigures,
    CostModel,
    Pace,
    RunShape,
    Timing,
    Tokenizer,
)
from semframe.cost.pricing import Cost, Price, cost
from semframe.cost.simulate import Pieces, bounds, identity_bounds, simulate_clients
from semframe.errors import plural

__all__ = ["RANGE_MAX_REQUESTS", "Estimate", "Figures", "Span", "price_plan", "span_of"]

RANGE_MAX_REQUESTS = 20_000
"""Largest plan whose range over dispatch timings is computed (two more replays per order)."""


@dataclass(frozen=True)
class Span:
    """The cache-dependent figures of one request order over the dispatch timings.

    Which requests find a prefix cached depends on when each was sent and
    answered. The estimate replays the run's dispatch at three paces
    (:class:`~semframe.cost.models.Timing`): the modelled latency (the point
    figure), every answer instant, and every request in flight sent at once.
    Each pair here is the (lowest, highest) over them.

    Attributes
    ----------
    cached_tokens : tuple of int
        Prompt tokens read from the cache.
    cached_share : tuple of float
        Cached tokens over all prompt tokens.
    cache_write_tokens : tuple of int
        Prompt tokens written to the cache.
    dollars : tuple of float, or None
        Total dollars at the expected output; ``None`` without a price.
    wall_seconds : tuple of float, or None
        Wall time; ``None`` where it is not modelled.
    fewest, most : str
        The pace giving the fewest and the most cached tokens.
    """

    cached_tokens: tuple[int, int]
    cached_share: tuple[float, float]
    cache_write_tokens: tuple[int, int]
    dollars: tuple[float, float] | None
    wall_seconds: tuple[float, float] | None
    fewest: Pace
    most: Pace

    def contains(self, cached_share: float, margin: float = 0.0) -> bool:
        """Whether a measured cached share lies in the range (``margin`` either side)."""
        lo, hi = self.cached_share
        return lo - margin <= cached_share <= hi + margin

    def scaled(self, factor: float) -> Span:
        """Every count and amount times ``factor`` (shares unchanged)."""

        def ints(pair: tuple[int, int]) -> tuple[int, int]:
            return round(pair[0] * factor), round(pair[1] * factor)

        def floats(pair: tuple[float, float] | None) -> tuple[float, float] | None:
            return None if pair is None else (pair[0] * factor, pair[1] * factor)

        return replace(
            self,
            cached_tokens=ints(self.cached_tokens),
            cache_write_tokens=ints(self.cache_write_tokens),
            dollars=floats(self.dollars),
            wall_seconds=floats(self.wall_seconds),
        )


def span_of(paced: Mapping[Pace, Figures]) -> Span:
    """The range of each cache-dependent figure over the figures of several paces.

    Examples
    --------
    >>> from semframe.cost.pricing import Cost
    >>> def figs(cached, dollars, wall):
    ...     return Figures(4, 1000, cached, 0, 8, 8, Cost(dollars), dollars, wall)
    >>> s = span_of({"modelled": figs(100, 0.9, 2.0), "instant": figs(700, 0.4, 0.1),
    ...              "at once": figs(0, 1.0, 1.9)})
    >>> s.cached_tokens, s.cached_share, s.dollars, s.fewest, s.most
    ((0, 700), (0.0, 0.7), (0.4, 1.0), 'at once', 'instant')
    """
    items = list(paced.items())

    def pair(values: Sequence[float]) -> tuple[float, float]:
        return min(values), max(values)

    cached = [f.cached_tokens for _, f in items]
    dollars = [f.dollars for _, f in items]
    walls = [f.wall_seconds for _, f in items]
    writes = [f.cache_write_tokens for _, f in items]
    # On a tie the pace further from the modelled one names the end: it says more.
    rank = {"at once": 0, "modelled": 1, "instant": 2}
    fewest = min(items, key=lambda item: (item[1].cached_tokens, rank.get(item[0], 1)))
    most = max(items, key=lambda item: (item[1].cached_tokens, rank.get(item[0], 1)))
    return Span(
        cached_tokens=(min(cached), max(cached)),
        cached_share=pair([f.cached_share for _, f in items]),
        cache_write_tokens=(min(writes), max(writes)),
        dollars=None if None in dollars else pair([d or 0.0 for d in dollars]),
        wall_seconds=None if None in walls else pair([w or 0.0 for w in walls]),
        fewest=fewest[0],
        most=most[0],
    )


def _counts(parts: Sequence[Figures]) -> tuple[int, int, int, int, int, int]:
    """The token and request counts of ``parts`` added up, in :class:`Figures`' order."""
    return (
        sum(p.requests for p in parts),
        sum(p.input_tokens for p in parts),
        sum(p.cached_tokens for p in parts),
        sum(p.cache_write_tokens for p in parts),
        sum(p.output_tokens for p in parts),
        sum(p.output_tokens_max for p in parts),
    )


@dataclass(frozen=True)
class Figures:
    """Expected figures of one request order.

    Attributes
    ----------
    requests : int
        Requests sent.
    input_tokens : int
        All prompt tokens (cached, written and uncached).
    cached_tokens : int
        Prompt tokens expected to be read from the provider's / engine's cache.
    cache_write_tokens : int
        Prompt tokens expected to be written to the cache (Anthropic).
    output_tokens : int
        Expected output tokens (from the probe), or the ``max_tokens`` bound.
    output_tokens_max : int
        ``max_tokens`` times the requests: the upper bound.
    cost : Cost or None
        Dollars by component at the expected output; ``None`` without a price
        (local engines).
    cost_max : float or None
        Total dollars with every answer at ``max_tokens``.
    wall_seconds : float or None
        Expected wall time; ``None`` when not modelled (uncalibrated engine).
    span : Span or None
        The cache-dependent figures over the dispatch timings the provider
        allows (the figures above are its modelled point); ``None`` where they
        do not depend on the timing (nothing cacheable, batch runs, local
        engines) and above :data:`RANGE_MAX_REQUESTS` requests.
    """

    requests: int
    input_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    output_tokens_max: int
    cost: Cost | None
    cost_max: float | None
    wall_seconds: float | None
    span: Span | None = None

    @property
    def dollars(self) -> float | None:
        """Total expected dollars."""
        return None if self.cost is None else self.cost.total

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens billed at the full input price."""
        return self.input_tokens - self.cached_tokens - self.cache_write_tokens

    @property
    def cached_share(self) -> float:
        """Cached prompt tokens over all prompt tokens."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def tokens(self) -> int:
        """Input plus expected output tokens (what a token budget counts)."""
        return self.input_tokens + self.output_tokens

    @classmethod
    def side_by_side(cls, parts: Sequence[Figures]) -> Figures:
        """The figures of plans run at once on separate engines (Ray replicas).

        Counts and dollars add up; the wall time is the slowest part's. No
        range by dispatch timing is kept.

        Examples
        --------
        >>> from semframe.cost.pricing import Cost
        >>> a = Figures(2, 100, 40, 0, 8, 10, Cost(1.0), 1.5, 3.0)
        >>> b = Figures(3, 150, 90, 0, 9, 15, Cost(2.0), 2.5, 5.0)
        >>> both = Figures.side_by_side([a, b])
        >>> both.requests, both.cached_tokens, both.dollars, both.wall_seconds
        (5, 130, 3.0, 5.0)
        """
        costs = [p.cost for p in parts]
        total: Cost | None = None
        if parts and all(c is not None for c in costs):
            total = functools.reduce(operator.add, cast("list[Cost]", costs))
        maxima = [p.cost_max for p in parts]
        walls = [p.wall_seconds for p in parts]
        return cls(
            *_counts(parts),
            total,
            None if not parts or None in maxima else sum(cast("list[float]", maxima)),
            None if not parts or None in walls else max(cast("list[float]", walls)),
        )

    def then(self, after: Figures) -> Figures:
        """These figures, then ``after``'s (a step run once these are done).

        Counts and dollars add up, a part without a price adding none; the
        wall time is the two added where ``after``'s is modelled (this part's
        counting as 0 where it is not), else unknown.

        Examples
        --------
        >>> from semframe.cost.pricing import Cost
        >>> embed = Figures(0, 0, 0, 0, 0, 0, Cost(), 0.0, None)
        >>> ask = Figures(3, 90, 0, 0, 12, 96, None, None, 1.5)
        >>> both = embed.then(ask)
        >>> both.requests, both.tokens, both.dollars, both.wall_seconds
        (3, 102, 0.0, 1.5)
        """

        def total(x: float | None, y: float | None) -> float | None:
            return None if x is None and y is None else (x or 0.0) + (y or 0.0)

        costs = [c for c in (self.cost, after.cost) if c is not None]
        wall = after.wall_seconds
        return Figures(
            *_counts((self, after)),
            None if not costs else functools.reduce(operator.add, costs),
            total(self.cost_max, after.cost_max),
            None if wall is None else (self.wall_seconds or 0.0) + wall,
        )

    def scaled(self, factor: float) -> Figures:
        """Every figure times ``factor`` (extrapolating a first round to a whole call)."""
        c = self.cost
        return Figures(
            round(self.requests * factor),
            round(self.input_tokens * factor),
            round(self.cached_tokens * factor),
            round(self.cache_write_tokens * factor),
            round(self.output_tokens * factor),
            round(self.output_tokens_max * factor),
            None
            if c is None
            else Cost(
                c.uncached_input * factor,
                c.cached_input * factor,
                c.cache_writes * factor,
                c.output * factor,
            ),
            None if self.cost_max is None else self.cost_max * factor,
            None if self.wall_seconds is None else self.wall_seconds * factor,
            None if self.span is None else self.span.scaled(factor),
        )


@dataclass(frozen=True)
class Estimate:
    """What a call is expected to cost, for the planned order and the original one.

    Attributes
    ----------
    op : str
        The operator.
    backend, model : str
        Where it would run.
    reorder : str
        The planned order's method.
    rows : int
        Requests of the (first) relQuery.
    planned : Figures
        The order the run would execute.
    original : Figures
        The caller's row order with the template's field order (``reorder="none"``).
    batch : bool
        Priced at batch-API prices.
    exact_tokens : bool
        False where token counts are approximate (Claude, unknown models).
    output_source : str
        ``"max_tokens"`` (upper bound) or ``"probe of N rows"``.
    probe_cost : float or None
        Dollars the probe itself cost (already spent).
    price : Price or None
        The price used.
    notes : tuple of str
        Caveats: approximations, extrapolations, calibration state.
    seconds_to_estimate : float
        How long the estimate took.
    timing : Timing or None
        The dispatch timing the point figures assume (latency per request,
        requests in flight, client time per request); ``None`` where the
        figures do not depend on one (batch runs, local engines).
    """

    op: str
    backend: str
    model: str
    reorder: str
    rows: int
    planned: Figures
    original: Figures
    batch: bool = False
    exact_tokens: bool = True
    output_source: str = "max_tokens"
    probe_cost: float | None = None
    price: Price | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    seconds_to_estimate: float = 0.0
    timing: Timing | None = field(default=None, repr=False)

    # convenient views of the planned figures
    @property
    def requests(self) -> int:
        """Requests of the planned order."""
        return self.planned.requests

    @property
    def dollars(self) -> float | None:
        """Expected dollars of the planned order (``None`` without a price)."""
        return self.planned.dollars

    @property
    def tokens(self) -> int:
        """Input plus expected output tokens of the planned order."""
        return self.planned.tokens

    @property
    def savings(self) -> float | None:
        """Dollars saved by the planned order against the original one."""
        a, b = self.original.dollars, self.planned.dollars
        return None if a is None or b is None else a - b

    def exceeds(self, budget: Budget) -> bool:
        """Whether the expected spend is over ``budget`` (no price: $0)."""
        if budget.tokens is not None:
            return self.tokens > budget.tokens
        return (self.dollars or 0.0) > (budget.dollars or 0.0)

    @property
    def wall_at_least(self) -> bool:
        """Whether the wall times are lower bounds (a tier slower than its modelled latency).

        Examples
        --------
        >>> from semframe.cost.models import LatencyModel, Timing
        >>> none = Figures(0, 0, 0, 0, 0, 0, None, None, None)
        >>> timing = Timing(LatencyModel(at_least=True), 16, workers=8)
        >>> est = Estimate("map", "openai", "gpt-5-mini", "ggr", 0, none, none, timing=timing)
        >>> est.wall_at_least
        True
        """
        return self.timing is not None and self.timing.latency.at_least

    @property
    def _bound(self) -> bool:
        """Output priced at ``max_tokens`` (no probe): output, dollars and time are bounds."""
        return self.output_source == "max_tokens"

    def _rows(self) -> list[tuple[str, str, str]]:
        def money(x: float | None) -> str:
            return "-" if x is None else f"${x:,.4f}"

        at_least = "≥ " if self.wall_at_least else ""

        def secs(x: float | None) -> str:
            return "uncalibrated" if x is None else f"{at_least}{x:,.1f} s"

        p, o = self.planned, self.original
        approx = "" if self.exact_tokens else " (approx.)"
        bound = " (max_tokens bound)" if self._bound else ""
        rows = [
            ("requests", f"{p.requests:,}", f"{o.requests:,}"),
            (f"input tokens{approx}", f"{p.input_tokens:,}", f"{o.input_tokens:,}"),
            (
                "  cached",
                f"{p.cached_tokens:,} ({p.cached_share:.1%})",
                f"{o.cached_tokens:,} ({o.cached_share:.1%})",
            ),
        ]
        spans = p.span is not None or o.span is not None
        if spans:
            rows.append(("    cached range", _cached_range(p), _cached_range(o)))
        rows.append(("  cache writes", f"{p.cache_write_tokens:,}", f"{o.cache_write_tokens:,}"))
        if self._bound:
            rows.append(
                ("output tokens (max_tokens bound)", f"{p.output_tokens:,}", f"{o.output_tokens:,}")
            )
        else:
            rows += [
                (
                    f"output tokens ({self.output_source})",
                    f"{p.output_tokens:,}",
                    f"{o.output_tokens:,}",
                ),
                (
                    "output tokens, max_tokens bound",
                    f"{p.output_tokens_max:,}",
                    f"{o.output_tokens_max:,}",
                ),
            ]
        if p.cost is not None and o.cost is not None:
            rows += [
                ("$ uncached input", money(p.cost.uncached_input), money(o.cost.uncached_input)),
                ("$ cached input", money(p.cost.cached_input), money(o.cost.cached_input)),
                ("$ cache writes", money(p.cost.cache_writes), money(o.cost.cache_writes)),
                (f"$ output{bound}", money(p.cost.output), money(o.cost.output)),
                (f"$ total{bound}", money(p.dollars), money(o.dollars)),
            ]
            if spans:
                rows.append((f"  $ range{bound}", _money_range(p), _money_range(o)))
            if not self._bound:
                rows.append(("$ total, max_tokens bound", money(p.cost_max), money(o.cost_max)))
        timed = p.wall_seconds is not None or o.wall_seconds is not None
        rows.append(
            (f"wall time{bound if timed else ''}", secs(p.wall_seconds), secs(o.wall_seconds))
        )
        if spans and timed:
            rows.append(
                (
                    f"  wall time range{bound}",
                    at_least + _time_range(p) if p.span else _time_range(p),
                    at_least + _time_range(o) if o.span else _time_range(o),
                )
            )
        return rows

    def _head(self) -> str:
        mode = ", batch prices" if self.batch else ""
        return (
            f"Estimate({self.op} on {self.backend}/{self.model}{mode}: {plural(self.rows, 'row')})"
        )

    def _lines(self) -> list[str]:
        """What the table does not say: the saving, bounds, the probe, the notes."""
        lines = []
        saved, before = self.savings, self.original.dollars
        if saved is not None and before and self.reorder != "none":
            if abs(saved) <= 1e-9 * before:  # the same figures, summed in another order
                lines.append("reordering does not change the cost here")
            elif saved > 0:
                lines.append(
                    f"reordering saves ${saved:,.4f} ({saved / before:.1%} of the original "
                    "order's cost)"
                )
            elif saved < 0:
                lines.append(
                    f"the planned order costs ${-saved:,.4f} more than the original order "
                    f"({-saved / before:.1%})"
                )
        if self._bound and self.planned.requests:
            per = round(self.planned.output_tokens_max / self.planned.requests)
            k = min(20, self.rows)
            lines.append(
                f"max_tokens bound: every answer taken as {plural(per, 'token')} long (the "
                f"limit), an upper bound; probe={k} measures answer lengths on "
                f"{plural(k, 'row')} first (it sends them)"
            )
        lines += self._timing_lines()
        if self.probe_cost:
            lines.append(f"the probe cost ${self.probe_cost:,.4f} (already spent)")
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def _timing_lines(self) -> list[str]:
        """Which dispatch timing gives the point figures, and what the ranges span."""
        if self.timing is None:
            return []
        lines = [f"point figures: {self.timing.describe()}"]
        span = self.planned.span or self.original.span
        if span is None:
            return lines
        if span.cached_tokens[0] == span.cached_tokens[1]:
            lines.append(
                "ranges, over the dispatch timings the provider allows: the cached tokens "
                "are the same with every answer instant and with every request in flight "
                "sent at once"
            )
        else:
            lines.append(
                "ranges, over the dispatch timings the provider allows: fewest cached tokens "
                f"{PACE_MEANING[span.fewest]}, most {PACE_MEANING[span.most]}"
            )
        return lines

    def __repr__(self) -> str:
        rows = self._rows()
        planned = f"planned ({self.reorder})"
        original = "original order"
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in [*rows, ("", planned, "")])
        w2 = max(16, *(len(r[2]) for r in rows))
        lines = [
            self._head(),
            f"  {'':<{w0}}  {planned:>{w1}}  {original:>{w2}}",
        ]
        lines += [f"  {a:<{w0}}  {b:>{w1}}  {c:>{w2}}" for a, b, c in rows]
        lines += [f"  {line}" for line in self._lines()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        table = html_table(self._rows(), head=("", f"planned ({self.reorder})", "original order"))
        notes = "".join(f"<li>{escape(line)}</li>" for line in self._lines())
        return (
            f"<div><b>{escape(self._head())}</b>{table}"
            + (f"<ul>{notes}</ul>" if notes else "")
            + "</div>"
        )

    def plot(self, ax: Any = None) -> Any:
        """The planned order against the original one, stacked by cost component.

        Dollars by component (uncached input, cached input, cache writes,
        output) where the model has a price; tokens by the same components
        where it has none (local engines). The output part is the
        ``max_tokens`` bound unless a probe measured it (the legend says which).

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw (default: a new figure).

        Returns
        -------
        matplotlib Axes

        Raises
        ------
        MissingDependencyError
            matplotlib is not installed (``pip install matplotlib``).

        Examples
        --------
        >>> import pandas as pd
        >>> df = pd.DataFrame({"movie": ["Alien", "Alien", "Heat"], "review": ["a", "b", "c"]})
        >>> est = df.llm.estimate("Is {review} of {movie} good?", op="filter", backend="fake")
        >>> ax = est.plot()
        >>> ax.get_xlabel(), [t.get_text() for t in ax.get_yticklabels()]
        ('tokens', ['original order', 'planned (ggr)'])
        >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
        """
        plt = pyplot("Estimate.plot()")
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 2.6))
        orders = [self.original, self.planned]
        labels = ["original order", f"planned ({self.reorder})"]
        if self.reorder == "none":
            orders, labels = orders[1:], labels[1:]
        out = "output" + (" (max_tokens bound)" if self._bound else f" ({self.output_source})")
        names = ["uncached input", "cached input", "cache writes", out]
        priced = all(f.cost is not None for f in orders)
        parts: list[list[float]] = []
        for f in orders:
            if f.cost is not None and priced:
                c = f.cost
                parts.append([c.uncached_input, c.cached_input, c.cache_writes, c.output])
            else:
                parts.append(
                    [f.uncached_tokens, f.cached_tokens, f.cache_write_tokens, f.output_tokens]
                )
        left = [0.0] * len(orders)
        for k, name in enumerate(names):
            widths = [p[k] for p in parts]
            ax.barh(labels, widths, left=left, label=name, color=f"C{k}")
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_xlabel("dollars" if priced else "tokens")
        ax.set_title(self._head())
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.12), ncol=4, fontsize="small")
        return ax


def _cached_range(f: Figures) -> str:
    if f.span is None:
        return "-"
    (lo, hi), (slo, shi) = f.span.cached_tokens, f.span.cached_share
    if lo == hi:
        return f"{lo:,} ({slo:.1%})"
    return f"{lo:,}-{hi:,} ({slo:.1%}-{shi:.1%})"


def _money_range(f: Figures) -> str:
    if f.span is None or f.span.dollars is None:
        return "-"
    lo, hi = f.span.dollars
    return f"${lo:,.4f}" if f"{lo:.4f}" == f"{hi:.4f}" else f"${lo:,.4f}-${hi:,.4f}"


def _time_range(f: Figures) -> str:
    if f.span is None or f.span.wall_seconds is None:
        return "-"
    lo, hi = f.span.wall_seconds
    return f"{lo:,.1f} s" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:,.1f}-{hi:,.1f} s"


def _figures(plan: Plan, model: CostModel, s: CacheFigures, shape: RunShape) -> Figures:
    n = len(plan.requests)
    out_max = plan.relquery.max_tokens * n
    out = round(shape.out_mean * n)
    c = c_max = None
    price = model.price
    if price is not None:
        writes = s.writes_5m + s.writes_1h

        def bill(output: int, price: Price = price) -> Cost:
            return cost(
                price,
                uncached_input_tokens=max(0, s.input_tokens - s.cached - writes),
                cached_input_tokens=s.cached,
                cache_write_5m_tokens=s.writes_5m,
                cache_write_1h_tokens=s.writes_1h,
                output_tokens=output,
                batch=shape.batch,
            )

        c = bill(out)
        c_max = bill(out_max).total
    return Figures(n, s.input_tokens, s.cached, writes_of(s), out, out_max, c, c_max, s.wall)


def writes_of(s: CacheFigures) -> int:
    """Cache writes of every TTL."""
    return s.writes_5m + s.writes_1h


def _clients_wall(plan: Plan, shape: RunShape, point: CacheFigures) -> CacheFigures:
    """Uncached figures whose wall time is that of ``shape.split``'s clients, where it is set."""
    timing = point.timing
    if shape.split is None or point.wall is None or timing is None:
        return point

    def ignore(i: int, t: float) -> None:
        pass

    wall = simulate_clients(
        plan,
        shape.split(plan),
        shape.workers,
        timing.request_s,
        timing.send_s,
        ignore,
        ignore,
        receive_s=timing.receive_s,
        warm=shape.warm,
    )
    return replace(point, wall=wall)


FRAMING_SLACK = 64
"""Tokens allowed for the chat framing (roles, separators) when prompts are bounded by bytes."""


def _never_cached(plan: Plan, model: CostModel, tokenizer: Tokenizer) -> bool:
    """Whether no prompt of ``plan`` can reach ``model``'s cache minimum.

    Known without tokenizing when the tokenizer's tokens are bounded by the
    text's UTF-8 bytes: the longest prompt's bytes, the system message's and
    :data:`FRAMING_SLACK` bound every request's tokens.
    """
    if not tokenizer.bytes_bound or not plan.requests:
        return False
    system = plan.relquery.system or ""
    longest = int(bytes_of(plan.requests).max()) + len(system.encode("utf-8", "surrogatepass"))
    return not model.cacheable(longest + FRAMING_SLACK)


def _original(plan: Plan) -> Plan:
    rq = plan.relquery
    return make_plan(rq, Ordering.identity(rq.table.n_rows, rq.fields), "none")


def price_plan(
    plan: Plan,
    model: CostModel,
    shape: RunShape,
    *,
    backend: str,
    op: str | None = None,
    output_source: str = "max_tokens",
    probe_cost: float | None = None,
    scale: float = 1.0,
    notes: Sequence[str] = (),
) -> Estimate:
    """The figures of ``plan`` sent as ``shape`` says, under the cost ``model``.

    Parameters
    ----------
    plan : Plan
        The plan the run would execute.
    model : CostModel
        The backend's cost model (``backend.cost``).
    shape : RunShape
        Concurrency, batch mode and expected output tokens per request.
    backend : str
        The backend's name, as the estimate reports it.
    op : str, optional
        Operator name to report (default: the relQuery's).
    output_source : str
        Where ``shape.out_mean`` comes from (``"max_tokens"``, ``"probe of N rows"``).
    probe_cost : float, optional
        Dollars a probe already spent.
    scale : float
        Multiply every figure (a first round standing for a whole operator call).
    notes : sequence of str
        Extra caveats to report.

    Examples
    --------
    >>> from semframe.core.parse import TEXT
    >>> from semframe.core.plan import RelQuery
    >>> from semframe.core.table import Table
    >>> from semframe.core.template import parse_template
    >>> from semframe.cost.models import openai_cost
    >>> rq = RelQuery("map", parse_template("Echo {t}"), Table.from_columns({"t": ["a", "b"]}),
    ...               TEXT, max_tokens=10)
    >>> plan = make_plan(rq, Ordering.identity(2, ("t",)), "none")
    >>> from pathlib import Path
    >>> shape = RunShape(workers=4, batch=False, out_mean=10.0, cache_dir=Path("."))
    >>> est = price_plan(plan, openai_cost("gpt-4.1-mini", None, concurrency=64), shape,
    ...                  backend="openai")
    >>> est.requests, est.planned.output_tokens_max, est.dollars > 0
    (2, 20, True)
    """
    started = time.perf_counter()
    model.check()
    tokenizer = model.tokenizer()
    all_notes = list(notes)
    if tokenizer.note:
        all_notes.append(tokenizer.note)
    all_notes += model.notes(shape)
    # Token ids are kept only where a prompt may reach the cache's minimum: a
    # tokenizer whose tokens are bounded by the text's UTF-8 bytes says when none can.
    never = _never_cached(plan, model, tokenizer)
    pieces = Pieces(plan, tokenizer.encode, ids=not never, sample=shape.token_sample * never)
    counts = pieces.counts()
    framing = model.framing_tokens(plan.relquery.system, pieces)
    n = len(plan.requests)
    total = sum(counts) + framing * n
    cacheable = model.cacheable(max(counts, default=0) + framing)
    if cacheable and not pieces.ids:  # the framing's slack was passed: count again, with ids
        pieces = Pieces(plan, tokenizer.encode)
        counts = pieces.counts()
        total = sum(counts) + framing * n
    for name, (tokenized, values) in pieces.sampled.items():
        all_notes.append(
            f"token counts of {name!r}: {tokenized:,} of its {values:,} distinct values "
            "tokenized, the others counted by their UTF-8 bytes at the same tokens per byte "
            "(token_sample=0 tokenizes every value)"
        )
    if cacheable:
        point = model.simulate(plan, pieces, shape)
        planned = _paced(plan, model, pieces, shape, point)
    else:
        point = _clients_wall(plan, shape, model.uncached(bounds(plan), total, shape))
        planned = _figures(plan, model, point, shape)
    if plan.reorder == "none":
        original = planned
    elif cacheable:
        base = _original(plan)
        base_pieces = Pieces(base, tokenizer.encode, pieces.cache)
        original = _paced(base, model, base_pieces, shape, model.simulate(base, base_pieces, shape))
    else:
        first = model.uncached(identity_bounds(plan), total, shape)
        if shape.split is not None:
            first = _clients_wall(_original(plan), shape, first)
        original = _figures(plan, model, first, shape)
    if cacheable and point.timing is not None and n > RANGE_MAX_REQUESTS:
        all_notes.append(
            f"no range by dispatch timing above {RANGE_MAX_REQUESTS:,} requests (it takes two "
            "more replays of each order): the figures are at the modelled latency only"
        )
    if scale != 1.0:
        planned, original = planned.scaled(scale), original.scaled(scale)
    return Estimate(
        op=op or plan.relquery.op,
        backend=backend,
        model=model.model,
        reorder=plan.reorder,
        rows=n,
        planned=planned,
        original=original,
        batch=shape.batch and model.price is not None,
        exact_tokens=tokenizer.exact and not pieces.sampled,
        output_source=output_source,
        probe_cost=probe_cost,
        price=model.price,
        notes=tuple(all_notes),
        seconds_to_estimate=time.perf_counter() - started,
        timing=point.timing,
    )


def _paced(
    plan: Plan, model: CostModel, pieces: Pieces, shape: RunShape, point: CacheFigures
) -> Figures:
    """The figures of ``point`` (the modelled pace), with their range over the other paces.

    A replay that did not depend on a dispatch timing (``point.timing`` is
    ``None``: batch runs, local engines) has no range.
    """
    figures = _figures(plan, model, point, shape)
    if point.timing is None or shape.pace != "modelled" or len(plan) > RANGE_MAX_REQUESTS:
        return figures
    paced: dict[Pace, Figures] = {"modelled": figures}
    for pace in PACES[1:]:
        sim = model.simulate(plan, pieces, replace(shape, pace=pace))
        paced[pace] = _figures(plan, model, sim, shape)
    return replace(figures, span=span_of(paced))
