"""What a call will cost and how long it will take, before anything is sent.

The estimator prices the :class:`~semframe.core.plan.Plan` the run would execute,
request by request, in the order the executor would send it:

1. Tokens are counted offline (:mod:`semframe.cost.tokens`, the provider's
   encoding; Claude counts are approximate and flagged) or, for local engines,
   with the engine's own tokenizer (``backend.count_tokens``). Each distinct
   piece of a prompt (the shared instructions, each labeled field value) is
   counted once.
2. A model of the executor's dispatch gives every request an arrival and a
   completion time: API backends send a prefix group's first request alone and
   its followers once it has been answered, with at most ``max_concurrency``
   requests in flight and a :class:`LatencyModel` per request; local engines
   give each slot a prefix group, as the group-aware dispatcher does.
3. The provider's cache rules run on that sequence: OpenAI through
   :class:`~semframe.cost.cachesim.OpenAICacheSim` with the ``prompt_cache_key`` the
   backend sends, Anthropic through :class:`~semframe.cost.cachesim.AnthropicCacheSim`
   with breakpoints exactly where the backend places them, llama.cpp as one
   KV prefix per slot.
4. The price table (:mod:`semframe.cost.pricing`, batch prices with ``batch=True``)
   turns tokens into dollars by component.

The same figures are computed for the original row order (``reorder="none"``)
so the saving of reordering is visible. Local engines' wall time comes from a
per-machine calibration (:func:`calibrate_local`), stored in the cache
directory and reused.

Examples
--------
>>> import pandas as pd, semframe
>>> df = pd.DataFrame({"movie": ["Alien", "Alien", "Heat"], "review": ["tense", "slow", "long"]})
>>> est = df.llm.estimate("Is {review} of {movie} positive?", op="filter", backend="fake")
>>> est.requests, est.planned.input_tokens > 0
(3, True)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import random
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Literal

from semframe.backends.base import Backend, Request
from semframe.core.ordering import Ordering
from semframe.core.plan import Plan, make_plan
from semframe.cost.pricing import Cost, Price, cost, price_for
from semframe.errors import ConfigError, InputError, MissingDependencyError, SemframeError

__all__ = [
    "Budget",
    "Estimate",
    "Figures",
    "LatencyModel",
    "LocalCalibration",
    "calibrate_local",
    "estimate_plan",
    "parse_budget",
]

API_BACKENDS = ("openai", "anthropic")

# ---------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Budget:
    """A spending limit: dollars or tokens (input + output), never both.

    Examples
    --------
    >>> parse_budget(0.5)
    Budget(dollars=0.5)
    >>> parse_budget("50k tokens")
    Budget(tokens=50000)
    """

    dollars: float | None = None
    tokens: int | None = None

    def __repr__(self) -> str:
        if self.dollars is not None:
            return f"Budget(dollars={self.dollars:g})"
        return f"Budget(tokens={self.tokens})"

    def describe(self) -> str:
        """``"$0.50"`` or ``"50,000 tokens"``."""
        if self.dollars is not None:
            return f"${self.dollars:,.4g}"
        return f"{self.tokens:,} tokens"


_BUDGET_FORMS = (
    "a number of dollars (0.5), '$0.50', '0.50 usd', or a token count such as "
    "'50k tokens', '1.5M tokens', '20000 tokens'"
)
_BUDGET_RE = re.compile(
    r"^\s*(?P<dollar>\$)?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<mult>[kKmM])?\s*"
    r"(?P<unit>tokens?|tok|usd|dollars?)?\s*$"
)


def parse_budget(value: object) -> Budget:
    """Read a ``budget=`` value.

    Parameters
    ----------
    value : float, int, str or Budget
        Dollars as a number; or a string: ``"$0.50"``, ``"0.5 usd"``,
        ``"2 dollars"``, ``"50k tokens"``, ``"1.5M tokens"``, ``"800 tokens"``.

    Raises
    ------
    InputError
        For anything else, naming the accepted forms.

    Examples
    --------
    >>> parse_budget("$2"), parse_budget("1.5M tokens")
    (Budget(dollars=2), Budget(tokens=1500000))
    >>> parse_budget("50k")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: budget='50k' has no unit; ...
    """
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        msg = f"budget must be {_BUDGET_FORMS}; got {value!r} ({type(value).__name__})."
        raise InputError(msg)
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            msg = f"budget must be a positive, finite number of dollars; got {value!r}."
            raise InputError(msg)
        return Budget(dollars=float(value))
    m = _BUDGET_RE.match(value)
    if m is None:
        msg = f"budget={value!r} is not understood; use {_BUDGET_FORMS}."
        raise InputError(msg)
    number = float(m["num"]) * {"k": 1e3, "m": 1e6}.get((m["mult"] or "").lower(), 1.0)
    unit = (m["unit"] or "").lower()
    is_tokens = unit.startswith("tok")
    if m["dollar"] and is_tokens:
        msg = f"budget={value!r} mixes '$' and tokens; use {_BUDGET_FORMS}."
        raise InputError(msg)
    if not m["dollar"] and not unit:
        msg = f"budget={value!r} has no unit; say '${m['num']}' or '{value.strip()} tokens'."
        raise InputError(msg)
    if number <= 0:
        msg = f"budget must be positive; got {value!r}."
        raise InputError(msg)
    if is_tokens:
        return Budget(tokens=int(number))
    return Budget(dollars=number)


# ---------------------------------------------------------------- figures


@dataclass(frozen=True)
class LatencyModel:
    """Seconds one API request takes, and the client's cost of sending one.

    ``fixed_s + per_output_token_s * output_tokens + per_input_token_s *
    uncached_input_tokens``; ``send_s`` is the client's own time per request
    (requests leave one after another from one I/O loop; 7 ms measured here
    with the official SDKs against the emulator on 2 shared cores). Which
    requests find a prefix cached depends on these times: a request only sees
    what completed before it arrived.

    Examples
    --------
    >>> LatencyModel(0.5, 0.01).seconds(20, 1000)
    0.7
    """

    fixed_s: float = 0.6
    per_output_token_s: float = 0.01
    per_input_token_s: float = 0.0
    send_s: float = 0.007

    def seconds(self, output_tokens: float, uncached_input_tokens: float = 0.0) -> float:
        """Seconds from arrival to completion of one request."""
        return (
            self.fixed_s
            + self.per_output_token_s * output_tokens
            + self.per_input_token_s * uncached_input_tokens
        )


DEFAULT_LATENCY = {
    "openai": LatencyModel(0.6, 0.01, 0.0, 0.007),
    "anthropic": LatencyModel(0.8, 0.015, 0.0, 0.007),
}
"""Rough per-request latencies of the public APIs (small models, short prompts)."""


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

    def _rows(self) -> list[tuple[str, str, str]]:
        def money(x: float | None) -> str:
            return "-" if x is None else f"${x:,.4f}"

        def secs(x: float | None) -> str:
            return "uncalibrated" if x is None else f"{x:,.1f} s"

        p, o = self.planned, self.original
        approx = "" if self.exact_tokens else " (approx.)"
        rows = [
            ("requests", f"{p.requests:,}", f"{o.requests:,}"),
            (f"input tokens{approx}", f"{p.input_tokens:,}", f"{o.input_tokens:,}"),
            (
                "  cached",
                f"{p.cached_tokens:,} ({p.cached_share:.1%})",
                f"{o.cached_tokens:,} ({o.cached_share:.1%})",
            ),
            ("  cache writes", f"{p.cache_write_tokens:,}", f"{o.cache_write_tokens:,}"),
            (
                f"output tokens ({self.output_source})",
                f"{p.output_tokens:,}",
                f"{o.output_tokens:,}",
            ),
            ("output tokens (max_tokens bound)", f"{p.output_tokens_max:,}", ""),
        ]
        if p.cost is not None and o.cost is not None:
            rows += [
                ("$ uncached input", money(p.cost.uncached_input), money(o.cost.uncached_input)),
                ("$ cached input", money(p.cost.cached_input), money(o.cost.cached_input)),
                ("$ cache writes", money(p.cost.cache_writes), money(o.cost.cache_writes)),
                ("$ output", money(p.cost.output), money(o.cost.output)),
                ("$ total", money(p.dollars), money(o.dollars)),
                ("$ total, max_tokens bound", money(p.cost_max), money(o.cost_max)),
            ]
        rows.append(("wall time", secs(p.wall_seconds), secs(o.wall_seconds)))
        return rows

    def _head(self) -> str:
        mode = ", batch prices" if self.batch else ""
        return f"Estimate({self.op} on {self.backend}/{self.model}{mode}: {self.rows:,} rows)"

    def __repr__(self) -> str:
        rows = self._rows()
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in [*rows, ("", f"planned ({self.reorder})", "")])
        lines = [
            self._head(),
            f"  {'':<{w0}}  {'planned (' + self.reorder + ')':>{w1}}  {'original order':>16}",
        ]
        lines += [f"  {a:<{w0}}  {b:>{w1}}  {c:>16}" for a, b, c in rows]
        if self.savings is not None and self.original.dollars:
            lines.append(
                f"  reordering saves ${self.savings:,.4f} "
                f"({self.savings / self.original.dollars:.1%} of the original order's cost)"
            )
        if self.probe_cost:
            lines.append(f"  the probe cost ${self.probe_cost:,.4f} (already spent)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><td style='text-align:left'>{escape(a)}</td><td>{escape(b)}</td>"
            f"<td>{escape(c)}</td></tr>"
            for a, b, c in self._rows()
        )
        notes = "".join(f"<li>{escape(n)}</li>" for n in self.notes)
        return (
            f"<div><b>{escape(self._head())}</b><table><thead><tr><th></th>"
            f"<th>planned ({escape(self.reorder)})</th><th>original order</th></tr></thead>"
            f"<tbody>{body}</tbody></table>" + (f"<ul>{notes}</ul>" if notes else "") + "</div>"
        )


# ---------------------------------------------------------------- token pieces


class _Pieces:
    """Prompts as pieces (instructions, labeled fields), each distinct piece tokenized once.

    Token counts per request come from per-column counts of distinct values, so
    they cost one lookup per field; the pieces themselves are built only for
    the requests a cache simulation looks at.
    """

    def __init__(
        self,
        plan: Plan,
        encode: Callable[[Sequence[str]], list[list[int]]],
        cache: dict[str, list[int]] | None = None,
    ) -> None:
        self.plan = plan
        self.encode = encode
        self.cache: dict[str, list[int]] = {} if cache is None else cache
        rq = plan.relquery
        self.head = plan.instructions + "\n\n"
        self.cells = rq.table.cells
        n = len(plan.requests)
        sample = sorted({0, n // 2, n - 1, *range(min(n, 16))} & set(range(n)))
        self.layout = all("".join(self._parts(i)) == plan.requests[i].prompt for i in sample)
        if self.layout:
            texts = {self.head}
            for f in rq.fields:
                texts.update(f"{f}: {v}\n" for v in set(self.cells[f]))
        else:  # not the planner's layout: whole prompts are the pieces
            texts = {r.prompt for r in plan.requests}
        if rq.system:
            texts.add(rq.system)
        self._fill(texts)
        self.col_counts: dict[str, dict[str, int]] = {
            f: {v: len(self.cache[f"{f}: {v}\n"]) for v in set(self.cells[f])}
            for f in (rq.fields if self.layout else ())
        }

    def _parts(self, i: int) -> list[str]:
        req = self.plan.requests[i]
        order = self.plan.ordering.fields[i]
        return [self.head, *(f"{f}: {self.cells[f][req.row]}\n" for f in order)]

    def parts(self, i: int) -> list[str]:
        """The pieces of request ``i``'s prompt."""
        return self._parts(i) if self.layout else [self.plan.requests[i].prompt]

    def _fill(self, texts: set[str]) -> None:
        new = sorted(t for t in texts if t not in self.cache)
        for text, toks in zip(new, self.encode(new), strict=True):
            self.cache[text] = toks

    def tokens(self, text: str) -> list[int]:
        found = self.cache.get(text)
        if found is None:
            self._fill({text})
            found = self.cache[text]
        return found

    def span(self, i: int, start: int, end: int) -> list[int]:
        """Tokens of ``prompt[start:end]`` of request ``i`` (piece boundaries assumed)."""
        out: list[int] = []
        pos = 0
        for p in self.parts(i):
            nxt = pos + len(p)
            if pos >= start and nxt <= end:
                out += self.tokens(p)
            elif pos < end and nxt > start:  # a cut inside a piece: tokenize that slice
                out += self.tokens(p[max(start - pos, 0) : end - pos])
            pos = nxt
        return out

    def counts(self) -> list[int]:
        """Prompt tokens of every request (without chat framing)."""
        plan = self.plan
        if not self.layout:
            return [len(self.cache[r.prompt]) for r in plan.requests]
        head = len(self.cache[self.head])
        cols = [(self.col_counts[f], self.cells[f]) for f in plan.relquery.fields]
        return [head + sum(c[v[r.row]] for c, v in cols) for r in plan.requests]


def _tiktoken_encoder(model: str) -> Callable[[Sequence[str]], list[list[int]]]:
    from semframe.cost.tokens import encoding_for_model

    enc = encoding_for_model(model)

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [enc.encode_ordinary(t) for t in texts]

    return encode


def _backend_encoder(backend: Backend) -> Callable[[Sequence[str]], list[list[int]]]:
    """Pseudo-tokens from the backend's own counts (local engines; only counts matter)."""
    ids: dict[str, int] = {}

    def encode(texts: Sequence[str]) -> list[list[int]]:
        counts = backend.count_tokens(list(texts)) if texts else []
        out = []
        for t, n in zip(texts, counts, strict=True):
            base = ids.setdefault(t, len(ids) + 1) * 1_000_003
            out.append([base + k for k in range(n)])
        return out

    return encode


# ---------------------------------------------------------------- dispatch models


@dataclass
class _G:
    start: int
    stop: int
    next: int
    leader_done: bool = False


def _simulate_async(  # noqa: PLR0917
    groups_of: Sequence[tuple[int, int]],
    n: int,
    workers: int,
    latency: float,
    send_s: float,
    on_arrive: Callable[[int, float], None] | None = None,
    on_complete: Callable[[int, float], None] | None = None,
) -> float:
    """The API executor's dispatch (``execute._AsyncDispatcher``) in simulated time.

    A prefix group's first request goes alone; its followers go once it has
    been answered, ahead of new groups; at most ``workers`` requests are in
    flight; the client sends one request per ``send_s``; each takes
    ``latency`` seconds. Latency being the same for all, requests complete in
    the order they arrive, so two FIFO queues replace an event heap. Returns
    the time the last request completes.
    """
    groups = [_G(a, b, a) for a, b in groups_of]
    group_of = [0] * n
    for gi, g in enumerate(groups):
        group_of[g.start : g.stop] = [gi] * (g.stop - g.start)
    unstarted: deque[int] = deque(range(len(groups)))
    open_: deque[int] = deque()
    arrivals: deque[tuple[float, int]] = deque()
    completions: deque[tuple[float, int]] = deque()
    client_free = 0.0
    idle = workers
    end = 0.0

    def fill(now: float) -> None:
        nonlocal idle, client_free
        while idle > 0:
            while open_ and groups[open_[0]].next >= groups[open_[0]].stop:
                open_.popleft()
            if open_:
                g = groups[open_[0]]
            elif unstarted:
                g = groups[unstarted.popleft()]
            else:
                return
            g.next += 1
            idle -= 1
            client_free = max(client_free, now) + send_s
            arrivals.append((client_free, g.next - 1))

    fill(0.0)
    while arrivals or completions:
        if arrivals and (not completions or arrivals[0][0] < completions[0][0]):
            t, r = arrivals.popleft()
            if on_arrive is not None:
                on_arrive(r, t)
            completions.append((t + latency, r))
            continue
        t, r = completions.popleft()
        if on_complete is not None:
            on_complete(r, t)
        end = t
        idle += 1
        g = groups[group_of[r]]
        if r == g.start:
            g.leader_done = True
            if g.next < g.stop:
                open_.append(group_of[r])
        fill(t)
    return end


def _simulate_slots(plan: Plan, workers: int) -> list[int]:
    """Slot of each request under the thread executor's group-aware dispatch.

    Service times are taken as equal, so workers take turns in slot order.
    """
    groups = [_G(g.start, g.stop, g.start) for g in plan.groups]
    group_of = [0] * len(plan.requests)
    for gi, g in enumerate(groups):
        for r in range(g.start, g.stop):
            group_of[r] = gi
    unstarted: deque[int] = deque(range(len(groups)))
    slot_of = [0] * len(plan.requests)
    current: list[int | None] = [None] * workers
    pending: list[tuple[int, int]] = []  # (slot, request) in flight, finished next turn
    while True:
        progressed = False
        for _, done in pending:
            if done == groups[group_of[done]].start:
                groups[group_of[done]].leader_done = True
        pending = []
        for slot in range(workers):
            pick = current[slot]
            mine = groups[pick] if pick is not None else None
            if mine is not None and mine.next < mine.stop and mine.leader_done:
                pass
            elif unstarted:
                pick = unstarted.popleft()
            else:
                best = [
                    (x.stop - x.next, i)
                    for i, x in enumerate(groups)
                    if x.leader_done and x.next < x.stop
                ]
                pick = max(best)[1] if best else None
            if pick is None:
                continue
            g = groups[pick]
            if g.next >= g.stop or (g.next > g.start and not g.leader_done):
                continue
            slot_of[g.next] = slot
            pending.append((slot, g.next))
            g.next += 1
            current[slot] = pick
            progressed = True
        if not progressed and not pending:
            return slot_of


# ---------------------------------------------------------------- local calibration


@dataclass(frozen=True)
class LocalCalibration:
    """Measured speed of a local engine: ``wall = a * uncached_prompt + b * output + c * requests``.

    Attributes
    ----------
    model : str
        Engine model.
    slots : int
        Slots the calibration ran with (the fit holds for this concurrency).
    seconds_per_prompt_token, seconds_per_output_token, seconds_per_request : float
        The fitted coefficients (seconds of wall time with all slots busy).
    machine : str
        Where it was measured.
    measured_at : str
        When (ISO time).
    """

    model: str
    slots: int
    seconds_per_prompt_token: float
    seconds_per_output_token: float
    seconds_per_request: float
    machine: str
    measured_at: str

    def wall(self, uncached_prompt: float, output: float, requests: int) -> float:
        """Expected wall seconds."""
        return (
            self.seconds_per_prompt_token * uncached_prompt
            + self.seconds_per_output_token * output
            + self.seconds_per_request * requests
        )


def _machine() -> str:
    return f"{platform.node()}|{platform.machine()}|{os.cpu_count()}"


def _calibration_path(directory: Path, model: str, slots: int) -> Path:
    key = hashlib.sha256(f"{_machine()}|{model}|{slots}".encode()).hexdigest()[:16]
    return directory / "estimator" / f"local-{key}.json"


def load_calibration(directory: Path, model: str, slots: int) -> LocalCalibration | None:
    """The stored calibration for this machine, model and slot count, if any."""
    path = _calibration_path(directory, model, slots)
    try:
        data = json.loads(path.read_text("utf-8"))
        return LocalCalibration(**data)
    except (OSError, ValueError, TypeError):
        return None


def calibrate_local(
    backend: Backend, directory: Path, *, slots: int | None = None, rounds: int = 2
) -> LocalCalibration:
    """Time short runs on a local engine, fit its speed, store it as JSON in ``directory``.

    Three kinds of small relQueries are run (long unique prompts with short
    answers, short prompts with long answers, many tiny requests), ``rounds``
    times each with different text, through the real executor at the
    backend's concurrency; a least-squares fit with non-negative coefficients
    gives seconds per uncached prompt token, per output token and per request.
    """
    from semframe.core.parse import TEXT
    from semframe.core.plan import RelQuery
    from semframe.core.table import Table
    from semframe.core.template import parse_template
    from semframe.runtime.execute import execute

    workers = slots or backend.capabilities.max_concurrency
    rng = random.Random(7)
    words = [
        "river", "castle", "engine", "quiet", "storm", "garden", "silver", "market",
        "winter", "signal", "orange", "pilot", "canvas", "harbor", "violet", "thunder",
    ]  # fmt: skip
    samples: list[tuple[float, float, float, float]] = []  # (uncached, output, requests, secs)
    # (rows, words per row, max_tokens): prompt-heavy, output-heavy, request-heavy
    shapes = [(12, 80, 4), (12, 8, 32), (32, 6, 4)]

    def run(plan: Plan) -> tuple[float, Any]:
        start = time.perf_counter()
        _, stats = execute(plan, backend, max_concurrency=workers, progress="off")
        return time.perf_counter() - start, stats

    for rnd in range(-1, rounds):  # round -1 starts the engine and is not timed
        for rows, n_words, max_tokens in shapes if rnd >= 0 else shapes[:1]:
            texts = [
                f"{rnd}-{i}: " + " ".join(rng.choice(words) for _ in range(n_words))
                for i in range(rows)
            ]
            table = Table.from_columns({"text": texts})
            prompt = "Continue this text with a few more words of your own: {text}"
            rq = RelQuery("map", parse_template(prompt), table, TEXT, None, (), max_tokens, 0.0)
            plan = make_plan(rq, Ordering.identity(rows, ("text",)), "none")
            secs, stats = run(plan)
            if rnd < 0:
                continue
            samples.append(
                (
                    float(stats.prompt_tokens - stats.cached_tokens),
                    float(stats.output_tokens),
                    float(stats.requests),
                    secs,
                )
            )
    coef = _nnls3(samples)
    cal = LocalCalibration(
        backend.model,
        workers,
        coef[0],
        coef[1],
        coef[2],
        _machine(),
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    path = _calibration_path(directory, backend.model, workers)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_asdict(cal), indent=1), "utf-8")
    return cal


def _asdict(cal: LocalCalibration) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cal)


def _nnls3(samples: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """Least squares ``y ~ x1 a + x2 b + x3 c`` with ``a, b, c >= 0`` (tiny active-set search).

    Examples
    --------
    >>> _nnls3([(1, 0, 1, 3), (2, 0, 1, 5), (0, 1, 1, 2), (0, 2, 1, 3)])
    (2.0, 1.0, 1.0)
    """
    import itertools

    import numpy as np

    x = np.array([s[:3] for s in samples], dtype=float)
    y = np.array([s[3] for s in samples], dtype=float)
    best: tuple[float, tuple[float, float, float]] | None = None
    for k in (3, 2, 1):
        for cols in itertools.combinations(range(3), k):
            sol, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (sol < 0).any():
                continue
            full = [0.0, 0.0, 0.0]
            for c, v in zip(cols, sol, strict=True):
                full[c] = float(v)
            err = float(((x @ np.array(full) - y) ** 2).sum())
            if best is None or err < best[0] - 1e-12:
                best = (err, (round(full[0], 12), round(full[1], 12), round(full[2], 12)))
    return best[1] if best else (0.0, 0.0, 0.0)


# ---------------------------------------------------------------- the estimator


@dataclass(frozen=True)
class _Context:
    backend_name: str
    model: str
    backend: Backend | None
    price: Price | None
    batch: bool
    cache_ttl: str
    prices: Mapping[str, Mapping[str, Any]] | None
    workers: int
    latency: LatencyModel
    cache_dir: Path
    calibration: LocalCalibration | None
    engine_model: Any = None  # semframe.serving.vllm.timing.EngineModel for backend "vllm"


def _resolve(plan: Plan, settings: Mapping[str, Any], latency: LatencyModel | None) -> _Context:
    from semframe.backends import get_backend
    from semframe.config import cache_dir

    name = settings["backend"]
    prices = settings.get("prices")
    backend: Backend | None
    try:
        backend = get_backend(name, model=settings["model"], settings=settings)
    except (ConfigError, MissingDependencyError):
        # API backends without a key (or SDK) can still be priced.
        if name not in API_BACKENDS:
            raise
        backend = None
    if backend is not None:
        model = backend.model
    else:
        from semframe.backends import anthropic as _an
        from semframe.backends import openai as _oa

        model = settings["model"] or (_oa.DEFAULT_MODEL if name == "openai" else _an.DEFAULT_MODEL)
    price = None
    if name in API_BACKENDS:
        price = price_for(model, prices)  # unknown model: ConfigError naming the known ones
        if price.provider != name:
            msg = f"model {model!r} is priced as a {price.provider} model, not {name}."
            raise ConfigError(msg)
    if backend is not None:
        limit = backend.capabilities.max_concurrency
    else:
        limit = settings.get("max_concurrency") or (64 if name == "openai" else 32)
    workers = max(1, min(limit, settings.get("max_concurrency") or limit, len(plan) or 1))
    lat = latency or DEFAULT_LATENCY.get(name, LatencyModel())
    directory = cache_dir(settings.get("cache_dir"))
    calibration = None
    engine_model = None
    if name == "local" and backend is not None:
        calibration = load_calibration(directory, backend.model, workers)
    if name == "vllm" and backend is not None and hasattr(backend, "engine_args"):
        from semframe.serving.vllm.timing import load_engine_model

        engine_model = load_engine_model(directory, backend.model)
    return _Context(
        name,
        model,
        backend,
        price,
        bool(settings.get("batch")),
        str(settings.get("cache_ttl") or "5m"),
        prices,
        workers,
        lat,
        directory,
        calibration,
        engine_model,
    )


@dataclass(frozen=True)
class _Sim:
    input_tokens: int
    cached: int
    writes_5m: int
    writes_1h: int
    wall: float | None


def _anthropic_cuts(ctx: _Context, pieces: _Pieces, plan: Plan) -> Callable[[Request], list[int]]:
    backend = ctx.backend
    if backend is not None and hasattr(backend, "breakpoints"):
        return backend.breakpoints  # type: ignore[no-any-return]
    from semframe.backends.anthropic import choose_breakpoints, min_cacheable_tokens

    minimum = min_cacheable_tokens(ctx.model, ctx.prices)
    system = len(pieces.tokens(plan.relquery.system or ""))

    def cuts(request: Request) -> list[int]:
        if not request.prefix:
            return []
        counts = []
        start = 0
        total = system
        for end, _ in request.prefix:
            total += len(pieces.span(request.id, start, end))
            counts.append(total)
            start = end
        return choose_breakpoints(request.prefix, counts, minimum=minimum, ttl=ctx.cache_ttl)

    return cuts


def _simulate(plan: Plan, ctx: _Context, pieces: _Pieces, out_mean: float) -> _Sim:
    n = len(plan.requests)
    if ctx.backend_name == "openai":
        return _sim_openai(plan, ctx, pieces, out_mean)
    if ctx.backend_name == "anthropic":
        return _sim_anthropic(plan, ctx, pieces, out_mean)
    if ctx.backend_name == "vllm" and hasattr(ctx.backend, "engine_args"):
        return _sim_vllm(plan, ctx, pieces, out_mean)
    # local engines (and the fake): one KV prefix per slot
    slots = _simulate_slots(plan, ctx.workers)
    last: dict[int, list[str]] = {}
    total = sum(pieces.counts())
    cached = 0
    for i in range(n):
        parts = pieces.parts(i)
        prev = last.get(slots[i], [])
        for a, b in zip(prev, parts, strict=False):
            if a != b:
                break
            cached += len(pieces.tokens(a))
        last[slots[i]] = parts
    wall = None
    if ctx.calibration is not None:
        wall = ctx.calibration.wall(total - cached, out_mean * n, n)
    return _Sim(total, cached, 0, 0, wall)


def _sim_vllm(plan: Plan, ctx: _Context, pieces: _Pieces, out_mean: float) -> _Sim:
    """Backend vllm in process: block-granular prefix reuse in the executor's dispatch order.

    With a calibrated engine model, a replay on the simulator gives cached
    tokens and wall time (:func:`semframe.serving.vllm.timing.predict`); without one,
    each request reuses, in whole blocks, what it shares with its prefix
    group's first request, and there is no wall time.
    """
    n = len(plan.requests)
    backend: Any = ctx.backend
    head: list[int] = []
    tail: list[int] = []
    if hasattr(backend, "framing_tokens"):  # the chat template's tokens around each prompt
        h, t = backend.framing_tokens(plan.relquery.system)
        head, tail = [-1 - k for k in range(h)], [-1_000_001 - k for k in range(t)]
    prompts = [
        head + [t for part in pieces.parts(i) for t in pieces.tokens(part)] + tail for i in range(n)
    ]
    groups = [(g.start, g.stop) for g in plan.groups]
    if ctx.engine_model is not None:
        from semframe.serving.vllm.timing import predict

        p = predict(
            prompts, groups, out_mean, ctx.engine_model, max_tokens=plan.relquery.max_tokens
        )
        return _Sim(p.prompt_tokens, p.cached_tokens, 0, 0, p.wall_seconds)
    block = int(
        backend.engine_args.get("block_size")
        or (128 if backend.engine_args.get("enforce_eager") else 16)
    )
    cached = 0
    for start, stop in groups:
        lead = prompts[start]
        for i in range(start + 1, stop):
            same = 0
            for a, b in zip(lead, prompts[i], strict=False):
                if a != b:
                    break
                same += 1
            cached += same - same % block
    return _Sim(sum(len(p) for p in prompts), cached, 0, 0, None)


def _framing() -> tuple[list[int], list[int], list[int]]:
    """(system header, user header, reply priming) tokens as the emulator frames chat."""
    from semframe.testing.emulator.framing import openai_prompt_tokens

    both = openai_prompt_tokens(
        [{"role": "system", "content": ""}, {"role": "user", "content": ""}]
    )
    return both[:3], both[3:6], both[6:]


def _sim_openai(plan: Plan, ctx: _Context, pieces: _Pieces, out_mean: float) -> _Sim:
    from semframe.backends.openai import OpenAIBackend
    from semframe.cost.cachesim import OpenAIRules

    price = ctx.price
    assert price is not None
    rules = OpenAIRules(min_tokens=price.min_cacheable_tokens, step=price.cache_step_tokens)
    sim = _FastOpenAICacheSim(rules)
    sys_h, user_h, reply = _framing()
    system = plan.relquery.system
    head = (sys_h + pieces.tokens(system) if system else []) + user_h
    key_of = OpenAIBackend.routing_key
    tickets: dict[int, Any] = {}
    totals = [0, 0]

    def tokens_of(i: int) -> list[int]:
        out = list(head)
        for p in pieces.parts(i):
            out += pieces.tokens(p)
        return out + reply

    def arrive(i: int, t: float) -> None:
        req = plan.requests[i]
        ticket = sim.begin(tokens_of(i), arrival=t, cache_key=key_of(req))
        tickets[i] = ticket
        totals[0] += ticket.result.prompt_tokens
        totals[1] += ticket.result.cached_tokens

    def complete(i: int, t: float) -> None:
        sim.complete(tickets.pop(i), at=t)

    wall = _dispatch(plan, ctx, out_mean, arrive, complete)
    return _Sim(totals[0], totals[1], 0, 0, wall)


def _dispatch(
    plan: Plan,
    ctx: _Context,
    out_mean: float,
    arrive: Callable[[int, float], None],
    complete: Callable[[int, float], None],
) -> float | None:
    """Replay the executor's send order through ``arrive``/``complete``; its wall time.

    Batch runs go one after another with no wall time (``None``); live runs
    follow the async dispatcher's model.
    """
    if ctx.batch:
        _sequential(len(plan.requests), arrive, complete)
        return None
    lat = ctx.latency
    return _simulate_async(
        _bounds(plan),
        len(plan.requests),
        ctx.workers,
        lat.seconds(out_mean),
        lat.send_s,
        arrive,
        complete,
    )


def _sequential(
    n: int, arrive: Callable[[int, float], None], complete: Callable[[int, float], None]
) -> None:
    """Batch APIs: requests processed one after another, in plan order."""
    for i in range(n):
        arrive(i, float(i))
        complete(i, float(i) + 0.5)


def _sim_anthropic(plan: Plan, ctx: _Context, pieces: _Pieces, out_mean: float) -> _Sim:
    from semframe.cost.cachesim import AnthropicCacheSim, AnthropicRules, Block

    price = ctx.price
    assert price is not None
    sim = AnthropicCacheSim(AnthropicRules(min_tokens=price.min_cacheable_tokens))
    sys_h, user_h, reply = _framing()
    system = plan.relquery.system
    sys_block = [Block(tuple(sys_h + pieces.tokens(system)))] if system else []
    cuts_of = _anthropic_cuts(ctx, pieces, plan)
    ttl: Literal["5m", "1h"] = "1h" if ctx.cache_ttl == "1h" else "5m"
    tickets: dict[int, Any] = {}
    totals = [0, 0, 0, 0]

    def arrive(i: int, t: float) -> None:
        req = plan.requests[i]
        blocks = list(sys_block)
        start = 0
        first = True
        for end in cuts_of(req):
            toks = (user_h if first else []) + pieces.span(i, start, end)
            blocks.append(Block(tuple(toks), ttl))
            start, first = end, False
        if start < len(req.prompt):
            toks = (user_h if first else []) + pieces.span(i, start, len(req.prompt))
            blocks.append(Block(tuple(toks)))
        blocks.append(Block(tuple(reply)))
        ticket = sim.begin(blocks, arrival=t)
        tickets[i] = ticket
        r = ticket.result
        totals[0] += r.prompt_tokens
        totals[1] += r.cache_read_input_tokens
        totals[2] += r.ephemeral_5m_input_tokens
        totals[3] += r.ephemeral_1h_input_tokens

    def complete(i: int, t: float) -> None:
        sim.complete(tickets.pop(i), at=t)

    wall = _dispatch(plan, ctx, out_mean, arrive, complete)
    return _Sim(totals[0], totals[1], totals[2], totals[3], wall)


def _bounds(plan: Plan) -> list[tuple[int, int]]:
    return [(g.start, g.stop) for g in plan.groups]


def _identity_bounds(plan: Plan) -> list[tuple[int, int]]:
    """Prefix groups of the relQuery in the caller's order (as ``make_plan`` forms them)."""
    from semframe.core.table import MISSING

    rq = plan.relquery
    n = rq.table.n_rows
    if not rq.fields or n == 0:
        return [(0, n)] if n else []
    first = rq.fields[0]
    col = rq.table.cells[first]
    missing = f"{MISSING}"
    starts = [i for i in range(n) if i == 0 or col[i] != col[i - 1] or col[i] == missing]
    return list(zip(starts, [*starts[1:], n], strict=True))


def _framing_tokens(ctx: _Context, pieces: _Pieces) -> int:
    """Chat framing tokens per request (system message included)."""
    if ctx.backend_name not in API_BACKENDS:
        return 0
    sys_h, user_h, reply = _framing()
    system = pieces.plan.relquery.system
    return len(user_h) + len(reply) + (len(sys_h) + len(pieces.tokens(system)) if system else 0)


def _uncached(
    bounds: Sequence[tuple[int, int]], n: int, ctx: _Context, input_tokens: int, out_mean: float
) -> _Sim:
    """Figures when nothing can be cached (every prompt under the provider's minimum)."""
    wall = None
    if ctx.backend_name in API_BACKENDS and not ctx.batch:
        lat = ctx.latency
        wall = _simulate_async(bounds, n, ctx.workers, lat.seconds(out_mean), lat.send_s)
    elif ctx.calibration is not None:
        wall = ctx.calibration.wall(input_tokens, out_mean * n, n)
    return _Sim(input_tokens, 0, 0, 0, wall)


def _figures(plan: Plan, ctx: _Context, s: _Sim, out_mean: float) -> Figures:
    n = len(plan.requests)
    out_max = plan.relquery.max_tokens * n
    out = round(out_mean * n)
    c = c_max = None
    if ctx.price is not None:
        writes = s.writes_5m + s.writes_1h

        def bill(output: int) -> Cost:
            assert ctx.price is not None
            return cost(
                ctx.price,
                uncached_input_tokens=max(0, s.input_tokens - s.cached - writes),
                cached_input_tokens=s.cached,
                cache_write_5m_tokens=s.writes_5m,
                cache_write_1h_tokens=s.writes_1h,
                output_tokens=output,
                batch=ctx.batch,
            )

        c = bill(out)
        c_max = bill(out_max).total
    return Figures(
        n,
        s.input_tokens,
        s.cached,
        s.writes_5m + s.writes_1h,
        out,
        out_max,
        c,
        c_max,
        s.wall,
    )


def _original(plan: Plan) -> Plan:
    rq = plan.relquery
    return make_plan(rq, Ordering.identity(rq.table.n_rows, rq.fields), "none")


def _probe(plan: Plan, ctx: _Context, rows: int) -> tuple[float, float | None, int]:
    """Send ``rows`` sampled requests; (mean output tokens, dollars spent, rows sent)."""
    from semframe.core.plan import RelQuery
    from semframe.runtime.execute import execute

    if ctx.backend is None:
        msg = (
            f"probe= sends requests, so backend {ctx.backend_name!r} needs its API key "
            "(or a client) for it; estimate without probe= to price by max_tokens."
        )
        raise ConfigError(msg)
    n = len(plan.requests)
    k = min(rows, n)
    if k == 0:
        return 0.0, None, 0
    picked = sorted(random.Random(0).sample(range(n), k))
    rq = plan.relquery
    sub_rows = [plan.requests[i].row for i in picked]
    sub = RelQuery(
        rq.op,
        rq.template,
        rq.table.take(sub_rows),
        rq.output,
        rq.system,
        rq.examples,
        rq.max_tokens,
        rq.temperature,
    )
    order = Ordering(tuple(range(k)), tuple(plan.ordering.fields[i] for i in picked))
    _, stats = execute(
        make_plan(sub, order, "probe"),
        ctx.backend,
        max_concurrency=ctx.workers,
        progress="off",
        prices=ctx.prices,
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
        Per-request latency of API backends (default :data:`DEFAULT_LATENCY`).
    scale : float
        Multiply every figure (a first round standing for a whole operator call).
    notes : sequence of str
        Extra caveats to report.

    Examples
    --------
    >>> import semframe
    >>> from semframe.operators.common import compile_call
    >>> import pandas as pd
    >>> call = compile_call(pd.DataFrame({"t": ["a", "b"]}), "Echo {t}", op="map",
    ...                     backend="fake")
    >>> estimate_plan(call.plan, call.settings).planned.output_tokens_max
    512
    """
    started = time.perf_counter()
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 0:
        msg = f"probe must be a number of rows >= 0, got {probe!r}."
        raise InputError(msg)
    ctx = _resolve(plan, settings, latency)
    all_notes = list(notes)
    exact = True
    if ctx.backend_name in API_BACKENDS:
        from semframe.cost.tokens import encoding_name_for_model

        choice = encoding_name_for_model(ctx.model)
        exact = choice.exact
        if choice.note:
            all_notes.append(choice.note)
        encode = _tiktoken_encoder(ctx.model)
    elif ctx.backend is not None:
        encode = _backend_encoder(ctx.backend)
        framed = hasattr(ctx.backend, "framing_tokens")
        all_notes.append(
            f"tokens counted with the {ctx.backend_name} engine's own tokenizer "
            + ("(chat template included)" if framed else "(chat-template tokens not included)")
        )
    else:  # pragma: no cover - non-API backends always resolve
        msg = f"cannot estimate on backend {ctx.backend_name!r}"
        raise SemframeError(msg)
    if ctx.backend_name == "local":
        if ctx.calibration is None:
            all_notes.append(
                "local engine uncalibrated: no wall time (run "
                "semframe.cost.estimate.calibrate_local or estimate(..., calibrate=True) once "
                "on this machine)"
            )
        else:
            all_notes.append(
                f"wall time from the calibration of {ctx.calibration.measured_at} "
                f"({ctx.calibration.slots} slots); prefix reuse per slot only (the engine's RAM "
                "prompt cache is not modelled)"
            )
    elif ctx.backend_name == "vllm" and ctx.engine_model is not None:
        all_notes.append(
            f"cached tokens and wall time from a replay on the simulator calibrated to this "
            f"vLLM engine ({ctx.engine_model.measured_at}); no price (your own hardware)"
        )
    elif ctx.backend_name == "vllm" and hasattr(ctx.backend, "engine_args"):
        all_notes.append(
            "vLLM engine uncalibrated: cached tokens from block-granular reuse within prefix "
            "groups, no wall time (run semframe.serving.vllm.timing.calibrate_vllm once on this "
            "machine); no price (your own hardware)"
        )
    elif ctx.backend_name not in API_BACKENDS:
        all_notes.append(f"backend {ctx.backend_name!r} has no price and no time model")
    if ctx.batch and ctx.backend_name in API_BACKENDS:
        all_notes.append("batch API: prices at the batch discount; results within 24 h")
    out_mean = float(plan.relquery.max_tokens)
    source = "max_tokens"
    probe_cost = None
    if probe:
        out_mean, probe_cost, k = _probe(plan, ctx, probe)
        source = f"probe of {k} rows"
    pieces = _Pieces(plan, encode)
    counts = pieces.counts()
    framing = _framing_tokens(ctx, pieces)
    n = len(plan.requests)
    total = sum(counts) + framing * n
    cacheable = True
    if ctx.price is not None:
        cacheable = max(counts, default=0) + framing >= ctx.price.min_cacheable_tokens
    if cacheable:
        planned = _figures(plan, ctx, _simulate(plan, ctx, pieces, out_mean), out_mean)
    else:
        planned = _figures(plan, ctx, _uncached(_bounds(plan), n, ctx, total, out_mean), out_mean)
    if plan.reorder == "none":
        original = planned
    elif cacheable:
        base = _original(plan)
        sim = _simulate(base, ctx, _Pieces(base, encode, pieces.cache), out_mean)
        original = _figures(base, ctx, sim, out_mean)
    else:
        sim = _uncached(_identity_bounds(plan), n, ctx, total, out_mean)
        original = _figures(plan, ctx, sim, out_mean)
    if scale != 1.0:
        planned, original = planned.scaled(scale), original.scaled(scale)
    return Estimate(
        op=op or plan.relquery.op,
        backend=ctx.backend_name,
        model=ctx.model,
        reorder=plan.reorder,
        rows=len(plan.requests),
        planned=planned,
        original=original,
        batch=ctx.batch and ctx.backend_name in API_BACKENDS,
        exact_tokens=exact,
        output_source=source,
        probe_cost=probe_cost,
        price=ctx.price,
        notes=tuple(all_notes),
        seconds_to_estimate=time.perf_counter() - started,
    )


# ---------------------------------------------------------------- a faster router


def _fast_sim_class() -> type:
    from semframe.cost.cachesim import OpenAICacheSim

    class Fast(OpenAICacheSim):
        """OpenAICacheSim with the route of a (key, leading tokens) pair memoized.

        Routing hashes up to ``route_tokens`` tokens per request in Python; the
        requests of a relQuery share a handful of routes, so the digest is
        computed once per distinct pair. Same answers as the parent.
        """

        def __init__(self, rules: Any = None) -> None:
            super().__init__(rules)
            self._route_memo: dict[tuple[str | None, tuple[int, ...]], tuple[bytes, int]] = {}

        def _home(self, tokens: Sequence[int], cache_key: str | None) -> tuple[bytes, int]:
            key = (cache_key, tuple(tokens[: self.rules.route_tokens]))
            found = self._route_memo.get(key)
            if found is None:
                found = super()._home(tokens, cache_key)
                self._route_memo[key] = found
            return found

    return Fast


def _FastOpenAICacheSim(rules: Any) -> Any:  # noqa: N802 - a class factory
    return _fast_sim_class()(rules)
