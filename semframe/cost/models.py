"""Cost models: how a backend's requests are billed and how its prompt cache behaves.

Every backend carries one (``Backend.cost``). The executor bills each
completed request with :meth:`CostModel.bill`; the estimator prices a plan by
asking the model for a tokenizer, the chat framing around each prompt and a
replay of the plan through the backend's prompt cache
(:meth:`CostModel.simulate`). Nothing here knows a backend by name: each
backend builds the model that describes it, with its prices, its cache rules
and its own callbacks (a local engine's tokenizer, Anthropic's breakpoints).

- :class:`OpenAICost`: automatic prefix caching (:class:`~semframe.cost.cachesim.OpenAICacheSim`),
  routed by ``prompt_cache_key`` (:func:`routing_key`), priced from the table;
  from GPT-5.6 (``caching = "breakpoints"`` in the table) explicit breakpoints
  with priced writes, as on Anthropic.
- :class:`AnthropicCost`: explicit breakpoints (:meth:`AnthropicCost.breakpoints`,
  placed only where the write premium pays) and priced writes and reads.
- :class:`GeminiCost`: implicit prefix caching in one shared cache
  (:class:`~semframe.cost.cachesim.GeminiCacheSim`), and an explicit cache of
  the shared instructions where its creation and storage pay
  (:meth:`GeminiCost.explicit_cache`).
- :class:`SlotCost`: an engine with one KV prefix per slot (llama.cpp, the
  fake backend), wall time from a per-machine calibration when one exists.
- :class:`BlockCost`: vLLM's block-granular shared cache, or a replay on the
  engine simulator calibrated to the engine.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol

from semframe.core.capacity import Capacity
from semframe.core.plan import Plan, common_prefix_len
from semframe.core.wire import Request, Usage
from semframe.cost.cachesim import (
    LONG_TTLS,
    TTL,
    Block,
    BreakpointCacheSim,
    BreakpointRules,
    GeminiCacheSim,
    GeminiRules,
    OpenAICacheSim,
    OpenAIRules,
)
from semframe.cost.calibration import LocalCalibration, load_calibration
from semframe.cost.framing import anthropic_framing, gemini_framing, openai_framing
from semframe.cost.pricing import Price, cost, price_for, tier_models
from semframe.cost.simulate import Encoder, Pieces, replay, simulate_async, slots_of
from semframe.cost.tokens import count, encoding_for_model, encoding_name_for_model
from semframe.errors import ConfigError, plural
from semframe.reorder.metrics import Granularity
from semframe.serving.vllm.timing import predict

__all__ = [
    "AT_ONCE_FLOOR_S",
    "EXPLICIT_CACHE_MARGIN_S",
    "MAX_BREAKPOINTS",
    "OPENAI_BREAKPOINT_TTL",
    "PACES",
    "PACE_MEANING",
    "READ_MULTIPLIER",
    "RETENTION_SECONDS",
    "TTL_SECONDS",
    "TYPICAL_LATENCY",
    "WRITE_MULTIPLIER",
    "AnthropicCost",
    "BlockCost",
    "CacheFigures",
    "CostModel",
    "GeminiCost",
    "LatencyModel",
    "OpenAICost",
    "Pace",
    "RunShape",
    "SlotCost",
    "Timing",
    "Tokenizer",
    "cache_key",
    "choose_breakpoints",
    "explicit_cache_pays",
    "min_cacheable_tokens",
    "min_sharers",
    "routing_key",
    "warm_start",
]

MAX_BREAKPOINTS = 4
"""Cache breakpoints semframe places per request (Anthropic accepts 4; OpenAI writes 4)."""
READ_MULTIPLIER = 0.1
"""Anthropic cache reads, as a multiple of the input price (for a model without a price)."""
WRITE_MULTIPLIER = {"5m": 1.25, "1h": 2.0}
"""Anthropic cache writes, as a multiple of the input price, per TTL (model without a price)."""
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""Seconds of each cache TTL setting."""
OPENAI_BREAKPOINT_TTL: TTL = "30m"
"""The TTL of OpenAI's breakpoints (``prompt_cache_options.ttl``: "30m is currently the only
supported value")."""
RETENTION_SECONDS = {"in_memory": (300.0, 3600.0), "24h": (86_400.0, 86_400.0)}
"""OpenAI ``prompt_cache_retention``: (idle TTL, longest life) of an automatic cache entry."""
EXPLICIT_CACHE_MARGIN_S = 30.0
"""A Gemini explicit cache is replaced by a new one this long before its TTL ends.

No request is sent naming a cache about to expire; the backend and the
estimator both use the cache for ``TTL - margin`` seconds."""


@dataclass(frozen=True)
class LatencyModel:
    """Seconds one API request takes, and the client's own time per request.

    ``fixed_s + per_output_token_s * output_tokens + per_input_token_s *
    uncached_input_tokens``. The client works on one I/O loop: ``send_s`` is
    its time to send a request, ``receive_s`` its time to take in an answer
    (parse it, free the slot), both spent one at a time. So the first wave
    leaves fast (a send every ``send_s``), and once answers come back each
    request costs the client ``send_s + receive_s``. Measured here with the
    official OpenAI SDK against the emulator (same process, 2 shared cores):
    the first 64 requests left 1.4-1.5 ms apart, and then one left every
    5.5-6.5 ms. Which requests find a prefix cached depends on these times: a
    request only sees what completed before it arrived. ``at_least`` marks a
    model that is only a lower bound: a tier slower than the one modelled, by
    an amount its provider does not publish (OpenAI's flex), so times derived
    from it are lower bounds too.

    Examples
    --------
    >>> LatencyModel(0.5, 0.01).seconds(20, 1000)
    0.7
    """

    fixed_s: float = 0.6
    per_output_token_s: float = 0.01
    per_input_token_s: float = 0.0
    send_s: float = 0.0015
    receive_s: float = 0.0045
    at_least: bool = False

    def seconds(self, output_tokens: float, uncached_input_tokens: float = 0.0) -> float:
        """Seconds from arrival to completion of one request."""
        return (
            self.fixed_s
            + self.per_output_token_s * output_tokens
            + self.per_input_token_s * uncached_input_tokens
        )


TYPICAL_LATENCY: Mapping[str, LatencyModel] = MappingProxyType(
    {
        "openai": LatencyModel(0.6, 0.01),
        "anthropic": LatencyModel(0.8, 0.015),
        "gemini": LatencyModel(0.6, 0.01),
    }
)
"""A typical answer time of each provider's API, for a short prompt: an assumption.

The shape is what the providers say decides latency: "the model and the
number of tokens generated" (OpenAI), the time to the first token and then
the output tokens per second (Anthropic). No provider publishes a typical
figure for its standard tier; OpenAI's priority tier guarantees 50 to 100
output tokens a second (90 for gpt-4.1-mini) for 99% of requests. Here: 0.6 s
(0.8 s for Claude) to the first token, then 10 ms (15 ms) per output token.
The cost models' point figures use these, and the provider emulator answers
after them by default (``semframe.testing.emulator.Latency.typical``).
"""

AT_ONCE_FLOOR_S = 1.0
"""Seconds a request takes in the ``"at once"`` pace where the modelled latency is 0."""

Pace = Literal["modelled", "instant", "at once"]
"""A dispatch timing the estimator replays (see :class:`Timing`)."""

PACES: tuple[Pace, ...] = ("modelled", "instant", "at once")


@dataclass(frozen=True)
class Timing:
    """The dispatch timing a replay assumed: what the figures of one pace rest on.

    Which requests find a prefix cached depends on when each was sent and
    answered, and the provider's timing is not known in advance. Three paces
    of the same dispatch are replayed:

    ``"modelled"``
        Every request answered ``latency.seconds(output_tokens)`` after it
        was sent, the client spending ``latency.send_s`` on each send and
        ``latency.receive_s`` on each answer: the point figure.
    ``"instant"``
        Every answer at once (0 s): each prefix readable as soon as its
        request was processed, the most a client sending one request at a
        time can find cached (a provider faster than its client).
    ``"at once"``
        Every request the dispatcher holds in flight sent together (no client
        time), each answered after the modelled time (:data:`AT_ONCE_FLOOR_S`
        where that is 0): in each wave every prefix is written before any is
        read. A low figure, not a floor: where a provider routes requests to
        cache machines (OpenAI), answers that come back spread out rather
        than in waves can find less cached still.

    Attributes
    ----------
    latency : LatencyModel
        The latency model of the point figure.
    output_tokens : float
        Output tokens per request the model was given.
    workers : int
        Requests in flight at most.
    warm : bool
        The run's first request goes alone (warm start).
    pace : {"modelled", "instant", "at once"}
        Which of the three.

    Examples
    --------
    >>> t = Timing(LatencyModel(0.6, 0.01), 32, workers=20)
    >>> round(t.request_s, 2), t.send_s, t.receive_s
    (0.92, 0.0015, 0.0045)
    >>> t.at("instant").request_s, t.at("at once").send_s, t.at("at once").receive_s
    (0.0, 0.0, 0.0)
    >>> print(t.describe())  # doctest: +NORMALIZE_WHITESPACE
    each request answered 0.92 s after it is sent (0.6 s + 0.01 s x 32 output tokens),
    up to 20 in flight, the client taking 1.5 ms to send one and 4.5 ms to take in an answer
    """

    latency: LatencyModel
    output_tokens: float
    workers: int
    warm: bool = False
    pace: Pace = "modelled"

    @property
    def request_s(self) -> float:
        """Seconds from a request's arrival to its answer at this pace."""
        seconds = self.latency.seconds(self.output_tokens)
        if self.pace == "instant":
            return 0.0
        if self.pace == "at once":
            return seconds if seconds > 0 else AT_ONCE_FLOOR_S
        return seconds

    @property
    def send_s(self) -> float:
        """Client seconds per request sent at this pace."""
        return 0.0 if self.pace == "at once" else self.latency.send_s

    @property
    def receive_s(self) -> float:
        """Client seconds per answer taken in at this pace."""
        return 0.0 if self.pace == "at once" else self.latency.receive_s

    def at(self, pace: Pace) -> Timing:
        """The same dispatch at another pace."""
        return replace(self, pace=pace)

    def describe(self) -> str:
        """The modelled pace in words: latency per request, concurrency, client time."""
        lat = self.latency
        parts = [f"{lat.fixed_s:g} s"]
        if lat.per_output_token_s:
            parts.append(f"{lat.per_output_token_s:g} s x {self.output_tokens:,.0f} output tokens")
        shape = f" ({' + '.join(parts)})" if len(parts) > 1 else ""
        text = (
            f"each request answered {'at least ' if lat.at_least else ''}"
            f"{_seconds(lat.seconds(self.output_tokens))} after it is "
            f"sent{shape}, up to {self.workers:,} in flight, the client taking "
            f"{lat.send_s * 1000:g} ms to send one and {lat.receive_s * 1000:g} ms to take in "
            "an answer"
        )
        return text + ("; the first alone (warm start)" if self.warm else "")


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x < 10 else f"{x:,.1f} s"


PACE_MEANING: Mapping[Pace, str] = MappingProxyType(
    {
        "modelled": "at the modelled latency",
        "instant": "with every answer instant (each prefix readable as soon as its request "
        "was processed)",
        "at once": "with every request in flight sent at once (each prefix written before "
        "any is read)",
    }
)
"""Each pace in words, as the estimate explains its ranges."""


@dataclass(frozen=True)
class Tokenizer:
    """How the estimator counts a backend's tokens.

    Attributes
    ----------
    encode : Encoder
        Texts to token ids (pseudo-ids where only counts are known).
    exact : bool
        Whether the counts are the provider's own.
    note : str or None
        What to tell the user about the counts.
    bytes_bound : bool
        Whether no text has more tokens than UTF-8 bytes (byte-level BPE that
        adds no special tokens), so that a byte count bounds a token count
        without tokenizing.
    """

    encode: Encoder
    exact: bool = True
    note: str | None = None
    bytes_bound: bool = False


@dataclass(frozen=True)
class RunShape:
    """How a run would send a plan: the executor's choices the estimator replays.

    Attributes
    ----------
    workers : int
        Requests in flight at once (slots of a local engine).
    batch : bool
        Sent through the provider's batch API.
    out_mean : float
        Expected output tokens per request.
    cache_dir : Path
        semframe's directory (calibrations live there).
    latency : LatencyModel or None
        Per-request latency of an API backend (None: the model's own).
    warm : bool
        The first request goes alone, so the head every request shares is
        cached before the rest are sent (the ``warm_start`` setting, or the
        cost model's :attr:`CostModel.warm_start`).
    pace : {"modelled", "instant", "at once"}
        The dispatch timing to replay (:class:`Timing`; API backends).
    slots : int or None
        Requests the run would keep in flight with rows to spare (the engine's
        slots, or ``max_concurrency``): a local engine's calibration is looked
        up by it, whatever the row count. None: ``workers``.
    split : callable or None
        How the run divides a plan among clients that share one endpoint and
        its cache (``executor="ray"`` replicas of an API backend): the plan
        positions each client sends, in order; ``workers`` is then each
        client's. None: one client sends the whole plan.
    token_sample : int
        Where no prompt can reach the cache's minimum, a field with more
        distinct values than this has this many tokenized and the others
        counted by their bytes (the ``token_sample`` setting; 0: all tokenized).
    """

    workers: int
    batch: bool
    out_mean: float
    cache_dir: Path
    latency: LatencyModel | None = None
    warm: bool = False
    pace: Pace = "modelled"
    slots: int | None = None
    split: Callable[[Plan], Sequence[Sequence[int]]] | None = None
    token_sample: int = 0


@dataclass(frozen=True)
class CacheFigures:
    """Expected prompt-side figures of one request order.

    ``writes_5m`` and ``writes_1h`` are cache writes per TTL (Anthropic);
    ``wall`` is the expected wall time, ``None`` where it is not modelled;
    ``timing`` is the dispatch timing the figures were replayed at, ``None``
    where they do not depend on one (batch runs, local engines).
    """

    input_tokens: int
    cached: int
    writes_5m: int = 0
    writes_1h: int = 0
    wall: float | None = None
    timing: Timing | None = None


class CostModel(Protocol):
    """What the executor and the estimator know of a backend's costs.

    Attributes
    ----------
    model : str
        The model priced.
    price : Price or None
        Its price (``None``: no price, e.g. your own hardware).
    concurrency : int
        Requests the backend serves at once (for estimates made without it).
    """

    model: str
    price: Price | None
    concurrency: int

    @property
    def warm_start(self) -> bool:
        """Whether a run should send its first request alone (``warm_start`` setting: None).

        True where the first wave would otherwise each write the shared head
        at a price (Anthropic's breakpoints).
        """
        ...

    @property
    def per_client(self) -> bool:
        """Whether clients sharing one endpoint are replayed each as a client of its own.

        True for the APIs: their cache sees each request as it arrives, so the
        estimate of ``executor="ray"`` replicas replays each replica's share
        (:attr:`RunShape.split`). An engine server schedules every client's
        requests itself and is priced as one client.
        """
        ...

    @property
    def granularity(self) -> Granularity:
        """The units in which the backend's prompt cache serves a prefix.

        Declared from the cache rules the model already holds (the price
        table's minimum and step, the engine's block size): the reordering's
        choice counts served tokens at it.
        """
        ...

    def capacity(self, concurrency: int, cache_dir: Path) -> Capacity:
        """What the backend's prefix cache holds, shared by ``concurrency`` requests in flight.

        Declared from what the model knows (an engine's measured or configured
        KV blocks, a slot's context, an API's entry lifetime); ``cache_dir``
        holds a local engine's calibration. :meth:`Plan.explain` says it.
        """
        ...

    def check(self) -> None:
        """Raise :class:`~semframe.errors.ConfigError` when the model cannot be priced.

        An API model missing from the price table (or priced for another
        provider) runs, unpriced, but cannot be estimated.
        """
        ...

    def bill(self, usage: Usage, *, batch: bool = False) -> float | None:
        """Dollars for ``usage`` (token totals), ``None`` without a price."""
        ...

    def tokenizer(self) -> Tokenizer:
        """How to count this backend's tokens."""
        ...

    def framing_tokens(self, system: str | None, pieces: Pieces) -> int:
        """Tokens the chat framing adds to every request (system message included)."""
        ...

    def cacheable(self, longest_prompt_tokens: int) -> bool:
        """Whether a prompt this long (framing included) can be cached at all."""
        ...

    def simulate(self, plan: Plan, pieces: Pieces, shape: RunShape) -> CacheFigures:
        """Replay ``plan`` through the backend's cache as the executor would send it."""
        ...

    def uncached(
        self, groups: Sequence[tuple[int, int]], input_tokens: int, shape: RunShape
    ) -> CacheFigures:
        """Figures when nothing can be cached (prompts under the minimum)."""
        ...

    def notes(self, shape: RunShape) -> list[str]:
        """Caveats of this model's figures."""
        ...


def warm_start(model: CostModel, setting: bool | None) -> bool:
    """Whether a run sends its first request alone: the ``warm_start`` setting, else ``model``'s.

    The executor and the estimator both ask here, so an estimate replays the
    dispatch the run will use.
    """
    return model.warm_start if setting is None else setting


# ---------------------------------------------------------------- the APIs


def _tiktoken_encoder(model: str) -> Encoder:
    enc = encoding_for_model(model)

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [enc.encode_ordinary(t) for t in texts]

    return encode


def api_price(
    provider: str, model: str, prices: Mapping[str, Mapping[str, Any]] | None
) -> tuple[Price | None, str | None]:
    """The price of ``model`` on ``provider``'s API, or ``None`` and why there is none.

    There is none for a model the table does not know (the message names the
    known ones) or one priced for another provider.
    """
    try:
        price = price_for(model, prices)
    except ConfigError as exc:
        return None, str(exc)
    if price.provider != provider:
        return None, f"model {model!r} is priced as a {price.provider} model, not {provider}."
    return price, None


@dataclass(eq=False)
class _ApiCost:
    """What the two providers' models share: prices, tokenizer, framing, dispatch timing.

    ``price`` is ``None`` for a model the table does not know (a model of an
    OpenAI-compatible server, say): it runs unpriced, and ``problem`` says why
    it cannot be estimated.
    """

    model: str
    price: Price | None
    concurrency: int
    latency: LatencyModel
    problem: str | None = None
    directives: bool = True  # the cache_directives setting
    _token_cache: dict[str, int] = field(default_factory=dict, repr=False)

    def check(self) -> None:
        self._priced()

    def _tokens(self, text: str) -> int:
        """Approximate (o200k) tokens of ``text``, memoized: pieces repeat across rows."""
        found = self._token_cache.get(text)
        if found is None:
            found = count([text])[0] if text else 0
            if len(self._token_cache) > 200_000:
                self._token_cache.clear()
            self._token_cache[text] = found
        return found

    def _multipliers(self, ttl: str) -> tuple[float, float]:
        """(write, read) prices as multiples of input: the table's, else Anthropic's rule."""
        p = self.price
        if p is None or p.input <= 0:
            return WRITE_MULTIPLIER.get(ttl, WRITE_MULTIPLIER["5m"]), READ_MULTIPLIER
        write = p.cache_write_1h if ttl in LONG_TTLS else p.cache_write_5m
        return write / p.input, p.cache_read / p.input

    def _breakpoint_offsets(self, request: Request, *, minimum: int, ttl: str) -> list[int]:
        """Where ``request``'s cache breakpoints go (offsets into its prompt).

        At the prefixes that reach ``minimum`` tokens and are shared by enough
        requests to repay the write premium (:func:`choose_breakpoints`); none
        without the ``cache_directives`` setting.
        """
        if not self.directives or not request.prefix:
            return []
        # Approximate (o200k) counts, added up piece by piece: the pieces (system,
        # instructions, labeled fields) repeat across rows, so each is counted once.
        total = self._tokens(request.system or "")
        counts: list[int] = []
        start = 0
        for end, _ in request.prefix:
            total += self._tokens(request.prompt[start:end])
            counts.append(total)
            start = end
        write, read = self._multipliers(ttl)
        need = min_sharers(write, read)
        return choose_breakpoints(request.prefix, counts, minimum=minimum, sharers=need)

    def breakpoints(self, request: Request) -> list[int]:
        """Where ``request``'s cache breakpoints go; none where the model caches automatically."""
        return []

    def _breakpoint_figures(
        self,
        plan: Plan,
        pieces: Pieces,
        shape: RunShape,
        *,
        rules: BreakpointRules,
        ttl: TTL,
        implicit: bool = False,
    ) -> CacheFigures:
        """Replay ``plan`` through a breakpoint cache, breakpoints where :meth:`breakpoints` says.

        ``implicit``: the provider adds its own breakpoint at the end of the
        prompt (OpenAI's implicit mode, what a request without directives gets).
        """
        sim = BreakpointCacheSim(rules)
        sys_h, user_h, reply = self._chat_framing()
        system = plan.relquery.system
        sys_block = [Block(tuple(sys_h + pieces.tokens(system)))] if system else []
        tickets: dict[int, Any] = {}
        totals = [0, 0, 0, 0]

        def arrive(i: int, t: float) -> None:
            req = plan.requests[i]
            blocks = list(sys_block)
            start = 0
            first = True
            for end in self.breakpoints(req):
                toks = (user_h if first else []) + pieces.span(i, start, end)
                blocks.append(Block(tuple(toks), ttl))
                start, first = end, False
            if start < len(req.prompt):
                toks = (user_h if first else []) + pieces.span(i, start, len(req.prompt))
                blocks.append(Block(tuple(toks)))
            if implicit and blocks and blocks[-1].cache_ttl is None:
                blocks[-1] = Block(blocks[-1].tokens, ttl)
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

        wall = self._replay(plan, shape, arrive, complete)
        return CacheFigures(totals[0], totals[1], totals[2], totals[3], wall, self.timing(shape))

    @property
    def warm_start(self) -> bool:
        return False  # each provider's model says (OpenAI, Anthropic, Gemini)

    @property
    def per_client(self) -> bool:
        return True

    def _chat_framing(self) -> tuple[list[int], list[int], list[int]]:
        """(system header, user header, reply priming) tokens of this provider's requests."""
        return openai_framing()

    def _priced(self) -> Price:
        if self.price is None:
            raise ConfigError(self.problem or f"model {self.model!r} has no price.")
        return self.price

    def bill(self, usage: Usage, *, batch: bool = False) -> float | None:
        if self.price is None:
            return None
        uncached = usage.prompt_tokens - usage.cached_tokens - self._written(usage)
        return cost(
            self.price,
            uncached_input_tokens=max(0, uncached),
            cached_input_tokens=usage.cached_tokens,
            cache_write_5m_tokens=0 if self._ttl() == "1h" else usage.cache_write_tokens,
            cache_write_1h_tokens=usage.cache_write_tokens if self._ttl() == "1h" else 0,
            output_tokens=usage.output_tokens,
            batch=batch,
        ).total

    def _written(self, usage: Usage) -> int:
        """Writes counted in ``prompt_tokens`` beside the cached ones."""
        return 0

    def _ttl(self) -> str:
        return "5m"

    def _idle_ttl_s(self) -> float | None:
        """Seconds an unused cache entry lives (``None``: not published)."""
        return TTL_SECONDS.get(self._ttl())

    def capacity(self, concurrency: int, cache_dir: Path) -> Capacity:
        """No size published: unbounded, entries dropped after their lifetime."""
        return Capacity(
            None, concurrency=concurrency, ttl_s=self._idle_ttl_s(), source="the provider's cache"
        )

    def tokenizer(self) -> Tokenizer:
        choice = encoding_name_for_model(self.model)
        return Tokenizer(_tiktoken_encoder(self.model), choice.exact, choice.note, bytes_bound=True)

    def framing_tokens(self, system: str | None, pieces: Pieces) -> int:
        sys_h, user_h, reply = self._chat_framing()
        extra = len(sys_h) + pieces.count(system) if system else 0
        return len(user_h) + len(reply) + extra

    def cacheable(self, longest_prompt_tokens: int) -> bool:
        return longest_prompt_tokens >= self._priced().min_cacheable_tokens

    def _latency(self, shape: RunShape) -> LatencyModel:
        return shape.latency or self.latency

    def timing(self, shape: RunShape) -> Timing | None:
        """The dispatch timing a live run of ``shape`` is replayed at; None for batch runs."""
        if shape.batch:
            return None
        return Timing(self._latency(shape), shape.out_mean, shape.workers, shape.warm, shape.pace)

    def uncached(
        self, groups: Sequence[tuple[int, int]], input_tokens: int, shape: RunShape
    ) -> CacheFigures:
        timing = self.timing(shape)
        wall = None
        if timing is not None:
            n = groups[-1][1] if groups else 0
            wall = simulate_async(
                groups,
                n,
                shape.workers,
                timing.request_s,
                timing.send_s,
                receive_s=timing.receive_s,
                warm=shape.warm,
            )
        return CacheFigures(input_tokens, 0, wall=wall, timing=timing)

    def notes(self, shape: RunShape) -> list[str]:
        if not shape.batch:
            return []
        return ["batch API: prices at the batch discount; results within 24 h"]

    def _replay(
        self,
        plan: Plan,
        shape: RunShape,
        arrive: Callable[[int, float], None],
        complete: Callable[[int, float], None],
    ) -> float | None:
        timing = self.timing(shape)
        return replay(
            plan,
            workers=shape.workers,
            batch=timing is None,
            latency=0.0 if timing is None else timing.request_s,
            send_s=0.0 if timing is None else timing.send_s,
            receive_s=0.0 if timing is None else timing.receive_s,
            arrive=arrive,
            complete=complete,
            warm=shape.warm,
            clients=None if shape.split is None else shape.split(plan),
        )


def cache_key(*parts: str) -> str:
    """A short stable digest of ``parts``, for cache keys and routing keys.

    Examples
    --------
    >>> cache_key("a", "b") == cache_key("a", "b") != cache_key("ab")
    True
    """
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:16]


def routing_key(request: Request, rules: OpenAIRules | None = None) -> str:
    """OpenAI's ``prompt_cache_key`` for ``request``: a digest of the prefix it routes by.

    A key picks the cache machine; a route taking more than
    ``rules.overflow_per_minute`` requests a minute spills to the next machine.
    A relQuery of at least ``machines x overflow_per_minute`` requests spreads
    over every machine whatever the keys, so there each prefix group (same
    instructions and first field) gets a key of its own and its requests meet
    on one machine. A smaller relQuery on one key stays on fewer machines, and
    a machine that has not seen the relQuery holds none of its instructions:
    the first request routed there pays them again. There a group gets a key
    of its own only where its followers repay that: ``(group size - 1) x
    (characters the first field adds)`` at least the characters of the
    instructions (system message included). The others share the relQuery's
    instruction-level key, as does every request when no field is shared.

    Examples
    --------
    >>> from semframe.core.wire import Request
    >>> def req(prompt, levels):
    ...     return Request(0, 0, prompt, None, 8, 0.0, None, 0, levels)
    >>> rules = "R" * 100
    >>> big = req(rules + "movie: Alien\\nreview: x", ((100, 40), (113, 30)))
    >>> small = req(rules + "movie: Alien\\nreview: y", ((100, 40), (113, 2)))
    >>> plain = req(rules + "movie: Heat\\nreview: z", ((100, 40),))
    >>> routing_key(big) == routing_key(small)  # 29 x 13 >= 100 > 1 x 13
    False
    >>> routing_key(small) == routing_key(plain)  # both on the instruction-level key
    True
    >>> many = req(rules + "movie: Alien\\nreview: y", ((100, 500), (113, 2)))
    >>> routing_key(many) == routing_key(small)  # 500 requests: every group its own key
    False
    """
    r = rules or _OPENAI_RULES
    levels = request.prefix
    head, size = levels[0] if levels else (0, 1)
    end = head
    if len(levels) > 1:
        group_end, shared_by = levels[1]
        instructions = head + len(request.system or "")
        spread = size >= r.machines * r.overflow_per_minute
        if spread or (shared_by - 1) * (group_end - head) >= instructions:
            end = group_end
    return "semframe-" + cache_key(request.system or "", request.prompt[:end])


_OPENAI_RULES = OpenAIRules()


class _FastOpenAICacheSim(OpenAICacheSim):
    """OpenAICacheSim with the route of a (key, leading tokens) pair memoized.

    Routing hashes up to ``route_tokens`` tokens per request in Python; the
    requests of a relQuery share a handful of routes, so the digest is
    computed once per distinct pair. Same answers as the parent.
    """

    def __init__(self, rules: OpenAIRules | None = None) -> None:
        super().__init__(rules)
        self._route_memo: dict[tuple[str | None, tuple[int, ...]], tuple[bytes, int]] = {}

    def _home(self, tokens: Sequence[int], cache_key: str | None) -> tuple[bytes, int]:
        key = (cache_key, tuple(tokens[: self.rules.route_tokens]))
        found = self._route_memo.get(key)
        if found is None:
            found = super()._home(tokens, cache_key)
            self._route_memo[key] = found
        return found


@dataclass(eq=False)
class OpenAICost(_ApiCost):
    """OpenAI: automatic prefix caching routed by ``prompt_cache_key``, or breakpoints (GPT-5.6+).

    Automatic (``caching = "automatic"`` in the table, models before GPT-5.6):
    prompts of at least the model's minimum are served from cache in steps
    (1,024 and 128 tokens) when a request with the same start and routing key
    (:func:`routing_key`) completed before; writes are free, cached tokens are
    part of ``prompt_tokens``. Entries live as ``retention`` says
    (:data:`RETENTION_SECONDS`; the model's first listed value when unset).

    Breakpoints (``caching = "breakpoints"``, GPT-5.6 and later): a prefix is
    cached only at a breakpoint and read back only at one; writes cost 1.25x
    input and are reported as ``cache_write_tokens``. Without directives
    OpenAI puts one implicit breakpoint at the end of every prompt, so each
    row writes its whole prompt and no other row reads it; semframe sends
    ``prompt_cache_options.mode = "explicit"`` with breakpoints only where
    :meth:`breakpoints` finds the write repaid, as on Anthropic.
    """

    latency: LatencyModel = field(default_factory=lambda: TYPICAL_LATENCY["openai"])
    retention: str | None = None  # prompt_cache_retention sent; None: none sent
    service_tier: str | None = None  # service_tier sent (price: at it); None: none sent

    @property
    def by_breakpoints(self) -> bool:
        """Whether the model caches at breakpoints (the table's ``caching``), not automatically."""
        return self.price is not None and self.price.caching == "breakpoints"

    @property
    def granularity(self) -> Granularity:
        """The model's minimum and step (an unknown model: the cache simulator's defaults)."""
        if self.price is None:
            rules = OpenAIRules()
            return Granularity(rules.min_tokens, rules.step)
        if self.by_breakpoints:
            return Granularity(self.price.min_cacheable_tokens, breakpoints=MAX_BREAKPOINTS)
        return Granularity(self.price.min_cacheable_tokens, self.price.cache_step_tokens)

    @property
    def warm_start(self) -> bool:
        # Breakpoints: a first wave would write the head once per request at 1.25x.
        # Automatic: measured both ways (the first request's cache machine is warmed,
        # the others are not): 1.5x cheaper on a 20-row run, 1.5x dearer on a
        # 300-row one (benchmarks/warm_prefix.py, benchmarks/estimator.py).
        return self.by_breakpoints and self.directives

    def _written(self, usage: Usage) -> int:
        return usage.cache_write_tokens

    def _latency(self, shape: RunShape) -> LatencyModel:
        latency = super()._latency(shape)
        if self.service_tier == "flex" and not latency.at_least:
            # The default tier's answer times; flex answers come slower (OpenAI
            # publishes no figure), so every time modelled on them is a lower bound.
            return replace(latency, at_least=True)
        return latency

    def breakpoints(self, request: Request) -> list[int]:
        if not self.by_breakpoints:
            return []
        minimum = self.price.min_cacheable_tokens if self.price else 1024
        return self._breakpoint_offsets(request, minimum=minimum, ttl=OPENAI_BREAKPOINT_TTL)

    def notes(self, shape: RunShape) -> list[str]:
        notes = super().notes(shape)
        tier = self.service_tier
        if tier in ("flex", "priority") and self.price is not None:
            if shape.batch:
                notes.append(f"service_tier={tier!r} is not sent with batch requests")
            elif tier == "flex":
                notes.append(
                    f"flex tier: prices at {self.price.tier_multiplier:g}x (the batch price); "
                    "answers come slower than the default tier's latency modelled here (OpenAI "
                    "publishes no flex figure: the wall time is a lower bound) and may meet 429 "
                    "'resource unavailable' (retried, not billed)"
                )
            else:
                notes.append(f"priority tier: prices at {self.price.tier_multiplier:g}x")
        return notes

    def _idle_ttl_s(self) -> float | None:
        if self.by_breakpoints:
            return 1800.0  # OPENAI_BREAKPOINT_TTL, "30m"
        return RETENTION_SECONDS[self.effective_retention()][0]

    def effective_retention(self) -> str:
        """The retention the cache is modelled with: the setting, else the model's first."""
        if self.retention is not None:
            return self.retention
        listed = self.price.retention if self.price is not None else ()
        return listed[0] if listed else "in_memory"

    def simulate(self, plan: Plan, pieces: Pieces, shape: RunShape) -> CacheFigures:
        price = self._priced()
        if self.by_breakpoints:
            return self._breakpoint_figures(
                plan,
                pieces,
                shape,
                rules=BreakpointRules.openai(price.min_cacheable_tokens),
                ttl=OPENAI_BREAKPOINT_TTL,
                implicit=not self.directives,
            )
        ttl_s, life_s = RETENTION_SECONDS[self.effective_retention()]
        grid = OpenAIRules(
            min_tokens=price.min_cacheable_tokens,
            step=price.cache_step_tokens,
            ttl_s=ttl_s,
            max_lifetime_s=life_s,
        )
        sim = _FastOpenAICacheSim(grid)
        sys_h, user_h, reply = self._chat_framing()
        system = plan.relquery.system
        head = (sys_h + pieces.tokens(system) if system else []) + user_h
        tickets: dict[int, Any] = {}
        totals = [0, 0]

        def arrive(i: int, t: float) -> None:
            tokens = list(head)
            for p in pieces.parts(i):
                tokens += pieces.tokens(p)
            key = routing_key(plan.requests[i]) if self.directives else None
            ticket = sim.begin(tokens + reply, arrival=t, cache_key=key)
            tickets[i] = ticket
            totals[0] += ticket.result.prompt_tokens
            totals[1] += ticket.result.cached_tokens

        def complete(i: int, t: float) -> None:
            sim.complete(tickets.pop(i), at=t)

        wall = self._replay(plan, shape, arrive, complete)
        return CacheFigures(totals[0], totals[1], wall=wall, timing=self.timing(shape))


def min_sharers(write: float, read: float = READ_MULTIPLIER) -> int:
    """Fewest requests sharing a prefix for a cache write to pay for itself.

    Parameters
    ----------
    write, read : float
        Cache write and read prices as multiples of the input price.

    Examples
    --------
    >>> min_sharers(WRITE_MULTIPLIER["5m"]), min_sharers(WRITE_MULTIPLIER["1h"])
    (2, 3)
    >>> min_sharers(1.25, 0.1)  # OpenAI from GPT-5.6
    2
    """
    if read >= 1.0:
        return 1 << 30  # reads save nothing: never worth a write
    # n sharers: one write and n - 1 reads against n uncached sends; the floor's
    # estimate is settled exactly (floating point can land on either side of a tie).
    n = max(1, math.floor((write - read) / (1 - read)) + 1)
    while write + read * (n - 1) >= n:
        n += 1
    while n > 1 and write + read * (n - 2) < n - 1:
        n -= 1
    return n


def min_cacheable_tokens(model: str, prices: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """The model's minimum cacheable prompt length (1,024 when the model is unknown)."""
    try:
        return price_for(model, prices).min_cacheable_tokens
    except ConfigError:
        return 1024


def choose_breakpoints(
    levels: Sequence[tuple[int, int]],
    tokens: Sequence[int],
    *,
    minimum: int,
    sharers: int,
    limit: int = MAX_BREAKPOINTS,
) -> list[int]:
    """Character offsets of the cache breakpoints to place, shortest prefix first.

    Parameters
    ----------
    levels : sequence of (end, shared_by)
        ``Request.prefix``.
    tokens : sequence of int
        Tokens of the whole cached part (system and prompt) up to each level.
    minimum : int
        The model's minimum cacheable length.
    sharers : int
        Fewest requests a prefix must be shared by to repay its write
        (:func:`min_sharers` of the write and read prices).
    limit : int
        Most breakpoints per request.

    Examples
    --------
    >>> choose_breakpoints([(100, 50), (400, 6), (900, 1)], [900, 1500, 2600],
    ...                    minimum=1024, sharers=2)
    [400]
    >>> choose_breakpoints([(100, 50), (400, 2)], [1100, 1500], minimum=1024, sharers=3)
    [100]
    """
    useful = [
        end
        for (end, shared), n in zip(levels, tokens, strict=True)
        if shared >= sharers and n >= minimum
    ]
    if len(useful) > limit:  # keep the most shared one and the deepest ones
        useful = [useful[0], *useful[-(limit - 1) :]]
    return useful


@dataclass(eq=False)
class AnthropicCost(_ApiCost):
    """Anthropic: caching only up to explicit breakpoints, priced writes and reads.

    Writes cost 1.25x input (5-minute TTL) or 2x (1 hour), reads 0.1x;
    ``prompt_tokens`` counts fresh, read and written tokens. The model also
    decides where the backend places its breakpoints (:meth:`breakpoints`):
    at the prefixes that reach the minimum cacheable length and are shared by
    enough requests to repay the write premium.
    """

    latency: LatencyModel = field(default_factory=lambda: TYPICAL_LATENCY["anthropic"])
    ttl: Literal["5m", "1h"] = "5m"
    minimum: int = 1024  # the shortest cacheable prefix (1,024 for an unknown model)

    @property
    def granularity(self) -> Granularity:
        """The model's minimum, any token past it, up to a breakpoint."""
        return Granularity(self.minimum, breakpoints=MAX_BREAKPOINTS)

    def _written(self, usage: Usage) -> int:
        return usage.cache_write_tokens

    def _chat_framing(self) -> tuple[list[int], list[int], list[int]]:
        return anthropic_framing()

    @property
    def warm_start(self) -> bool:
        # Every first-wave request would write the head at 1.25x; Anthropic: "wait for
        # the first response before sending subsequent requests".
        return self.directives

    def _ttl(self) -> str:
        return self.ttl

    def breakpoints(self, request: Request) -> list[int]:
        return self._breakpoint_offsets(request, minimum=self.minimum, ttl=self.ttl)

    def simulate(self, plan: Plan, pieces: Pieces, shape: RunShape) -> CacheFigures:
        rules = BreakpointRules(min_tokens=self._priced().min_cacheable_tokens)
        return self._breakpoint_figures(plan, pieces, shape, rules=rules, ttl=self.ttl)


def explicit_cache_pays(sharers: int, price: Price, ttl: str) -> bool:
    """Whether a Gemini explicit cache read by ``sharers`` requests costs less than none.

    The cache is created once (its tokens at the input price) and stored for
    its TTL (``cache_write_5m`` / ``cache_write_1h`` hold both, per token);
    each of its readers then pays the cache price instead of the input price.
    Implicit hits are not counted on: Google guarantees none.

    Examples
    --------
    >>> from semframe.cost.pricing import price_for
    >>> pro = price_for("gemini-2.5-pro")  # 1.25 input, 0.125 cached, 4.50 storage
    >>> explicit_cache_pays(5, pro, "1h"), explicit_cache_pays(6, pro, "1h")
    (False, True)
    >>> explicit_cache_pays(2, pro, "5m")
    True
    """
    write = price.cache_write_1h if ttl == "1h" else price.cache_write_5m
    return sharers * (price.input - price.cache_read) > write


@dataclass(eq=False)
class GeminiCost(_ApiCost):
    """Gemini: implicit prefix caching in one shared cache, explicit caches where they pay.

    Implicit caching (Gemini 2.5 and later) is automatic and prefix-based: no
    routing key exists, so it is modelled as one shared cache per model
    (:class:`~semframe.cost.cachesim.GeminiCacheSim`) where only the order of
    requests decides hits; cached tokens are part of ``prompt_tokens`` and
    cost 10% of input. The model also decides when the backend puts the shared
    instructions (and system prompt) in an explicit cache
    (:meth:`explicit_cache`): when they reach the model's minimum and enough
    requests will read the cache within its lifetime to repay its creation
    and its storage for the TTL. A created cache is billed as a write
    (``cache_write_tokens``, counted in ``prompt_tokens`` beside the reads;
    priced creation + storage). Batch runs use no explicit caches (Gemini's
    batch API does not take them).
    """

    latency: LatencyModel = field(default_factory=lambda: TYPICAL_LATENCY["gemini"])
    ttl: Literal["5m", "1h"] = "5m"
    minimum: int = 2048  # the shortest cacheable prefix

    @property
    def granularity(self) -> Granularity:
        """The model's minimum and step (implicit caching)."""
        step = self.price.cache_step_tokens if self.price is not None else 1
        return Granularity(self.minimum, step)

    def _idle_ttl_s(self) -> float | None:
        return None  # implicit caching publishes no lifetime (``ttl`` is the explicit cache's)

    @property
    def warm_start(self) -> bool:
        # One shared cache: once the first request is answered, every request
        # after it finds the head every prompt shares.
        return True

    def _written(self, usage: Usage) -> int:
        return usage.cache_write_tokens

    def _ttl(self) -> str:
        return self.ttl

    def _chat_framing(self) -> tuple[list[int], list[int], list[int]]:
        return gemini_framing()

    @property
    def lifetime_s(self) -> float:
        """Seconds one explicit cache is used before a new one replaces it."""
        return TTL_SECONDS[self.ttl] - EXPLICIT_CACHE_MARGIN_S

    def readers(self, shared_by: int, max_tokens: int) -> int:
        """Requests expected to read one explicit cache: its sharers, or those one lifetime serves.

        At ``concurrency`` requests in flight, each taking the latency model's
        time for ``max_tokens`` of output.
        """
        per_request = max(self.latency.seconds(max_tokens), 1e-3)
        served = math.ceil(self.concurrency * self.lifetime_s / per_request)
        return max(1, min(shared_by, served))

    def explicit_cache(self, request: Request, *, batch: bool = False) -> int:
        """Where ``request``'s explicit cache ends (an offset into its prompt); 0: none.

        Only the instruction block (``Request.prefix[0]``, shared by the whole
        relQuery) is considered, with the system prompt: it must reach the
        model's minimum (counted approximately, with o200k) and
        :func:`explicit_cache_pays` for the requests one cache serves.
        """
        if batch or not self.directives or self.price is None or not request.prefix:
            return 0
        end, shared = request.prefix[0]
        tokens = self._tokens(request.system or "") + self._tokens(request.prompt[:end])
        if tokens < self.minimum:
            return 0
        readers = self.readers(shared, request.max_tokens)
        return end if explicit_cache_pays(readers, self.price, self.ttl) else 0

    def simulate(self, plan: Plan, pieces: Pieces, shape: RunShape) -> CacheFigures:
        price = self._priced()
        rules = GeminiRules(min_tokens=price.min_cacheable_tokens, step=price.cache_step_tokens)
        sim = GeminiCacheSim(rules)
        _, _, reply = self._chat_framing()
        system = plan.relquery.system
        head = pieces.tokens(system) if system else []
        created: dict[str, float] = {}  # explicit cache -> when it was made
        tickets: dict[int, Any] = {}
        totals = [0, 0, 0]  # prompt (writes included), cached, written

        def arrive(i: int, t: float) -> None:
            req = plan.requests[i]
            tokens = list(head)
            for p in pieces.parts(i):
                tokens += pieces.tokens(p)
            tokens += reply
            explicit = 0
            cut = self.explicit_cache(req, batch=shape.batch)
            if cut:
                explicit = len(head) + len(pieces.span(i, 0, cut))
                key = cache_key(system or "", req.prompt[:cut])
                since = created.get(key)
                if since is None or t - since >= self.lifetime_s:
                    created[key] = t
                    totals[0] += explicit
                    totals[2] += explicit
            ticket = sim.begin(tokens, arrival=t, explicit=explicit)
            tickets[i] = ticket
            totals[0] += ticket.result.prompt_tokens
            totals[1] += ticket.result.cached_tokens

        def complete(i: int, t: float) -> None:
            sim.complete(tickets.pop(i), at=t)

        wall = self._replay(plan, shape, arrive, complete)
        written = totals[2]
        w5, w1 = (0, written) if self.ttl == "1h" else (written, 0)
        return CacheFigures(totals[0], totals[1], w5, w1, wall, self.timing(shape))

    def notes(self, shape: RunShape) -> list[str]:
        notes = [
            "Gemini's implicit cache hits are not guaranteed: modelled as one shared cache "
            "that finds a prefix once a request with it has been answered"
        ]
        if shape.batch:
            notes.append(
                "batch API: 50% off uncached input and output; cached tokens at the cache "
                "price (Gemini's discounts do not stack), no explicit caches; results "
                "within 24 h"
            )
        return notes


def openai_cost(
    model: str,
    prices: Mapping[str, Mapping[str, Any]] | None,
    *,
    concurrency: int,
    directives: bool = True,
    retention: str | None = None,
    service_tier: str | None = None,
) -> OpenAICost:
    """The cost model of ``model`` on the OpenAI API (prices from the table).

    ``service_tier`` (``"flex"``, ``"priority"``) prices synchronous requests
    at that tier (:meth:`~semframe.cost.pricing.Price.at_tier`).

    Raises
    ------
    ConfigError
        A ``retention`` or ``service_tier`` the model does not take (the valid
        values, or the models that take the tier, listed in the message).
    """
    price, problem = api_price("openai", model, prices)
    if retention is not None and price is not None and retention not in price.retention:
        takes = ", ".join(repr(r) for r in price.retention) or "none (it caches by breakpoints)"
        msg = f"cache_retention={retention!r} is not offered for {model!r}; it takes: {takes}."
        raise ConfigError(msg)
    if service_tier is not None and price is not None:
        if service_tier != "default" and service_tier not in dict(price.service_tiers):
            offered = ", ".join(tier_models(service_tier, prices)) or "none"
            msg = (
                f"service_tier={service_tier!r} is not offered for {model!r}; the models "
                f'priced for it: {offered} (a [prices."{model}"] entry may list it in '
                "service_tiers)."
            )
            raise ConfigError(msg)
        price = price.at_tier(service_tier)
    return OpenAICost(
        model,
        price,
        concurrency,
        problem=problem,
        directives=directives,
        retention=retention,
        service_tier=service_tier,
    )


def _cache_ttl(ttl: str) -> Literal["5m", "1h"]:
    """The ``cache_ttl`` setting, checked: ``"5m"`` or ``"1h"``."""
    if ttl in ("5m", "1h"):
        return "1h" if ttl == "1h" else "5m"
    msg = f"cache_ttl must be '5m' or '1h', got {ttl!r}."
    raise ConfigError(msg)


def anthropic_cost(
    model: str,
    prices: Mapping[str, Mapping[str, Any]] | None,
    *,
    concurrency: int,
    ttl: str,
    directives: bool = True,
) -> AnthropicCost:
    """The cost model of ``model`` on the Anthropic API (prices from the table)."""
    checked = _cache_ttl(ttl)
    price, problem = api_price("anthropic", model, prices)
    return AnthropicCost(
        model,
        price,
        concurrency,
        problem=problem,
        directives=directives,
        ttl=checked,
        minimum=min_cacheable_tokens(model, prices),
    )


def gemini_cost(
    model: str,
    prices: Mapping[str, Mapping[str, Any]] | None,
    *,
    concurrency: int,
    ttl: str,
    directives: bool = True,
) -> GeminiCost:
    """The cost model of ``model`` on the Gemini API (prices from the table)."""
    checked = _cache_ttl(ttl)
    price, problem = api_price("gemini", model, prices)
    return GeminiCost(
        model,
        price,
        concurrency,
        problem=problem,
        directives=directives,
        ttl=checked,
        minimum=price.min_cacheable_tokens if price is not None else 2048,
    )


# ---------------------------------------------------------------- engines


def counting_encoder(count_tokens: Callable[[Sequence[str]], list[int]]) -> Encoder:
    """Pseudo-tokens from a backend's own counts (local engines; only counts matter)."""
    ids: dict[str, int] = {}

    def encode(texts: Sequence[str]) -> list[list[int]]:
        counts = count_tokens(list(texts)) if texts else []
        out = []
        for t, n in zip(texts, counts, strict=True):
            base = ids.setdefault(t, len(ids) + 1) * 1_000_003
            out.append([base + k for k in range(n)])
        return out

    return encode


@dataclass(eq=False)
class _EngineCost:
    """Engines on your own hardware: no price, the engine's own token counts.

    ``framing(system)``, where the engine gives it, is the number of tokens
    its chat template adds before and after each prompt; the head (a default
    system prompt, role markers) is the same for every request, so it is
    cacheable.
    """

    model: str
    count_tokens: Callable[[Sequence[str]], list[int]]
    concurrency: int
    engine: str  # how notes name the engine
    price: Price | None = field(default=None, init=False)
    framing: Callable[[str | None], tuple[int, int]] | None = field(default=None, kw_only=True)

    def check(self) -> None:
        return None

    def bill(self, usage: Usage, *, batch: bool = False) -> float | None:
        return None

    def tokenizer(self) -> Tokenizer:
        framed = self._framed()
        note = f"tokens counted with the {self.engine} engine's own tokenizer " + (
            "(chat template included)" if framed else "(chat-template tokens not included)"
        )
        return Tokenizer(counting_encoder(self.count_tokens), True, note)

    def _framed(self) -> bool:
        return self.framing is not None

    def _frame(self, system: str | None) -> tuple[int, int]:
        return (0, 0) if self.framing is None else self.framing(system)

    @property
    def warm_start(self) -> bool:
        return False  # slot caches fill group by group; vLLM's scheduler orders its own

    @property
    def per_client(self) -> bool:
        return False

    def framing_tokens(self, system: str | None, pieces: Pieces) -> int:
        return 0

    def cacheable(self, longest_prompt_tokens: int) -> bool:
        return True

    def uncached(
        self, groups: Sequence[tuple[int, int]], input_tokens: int, shape: RunShape
    ) -> CacheFigures:
        return CacheFigures(input_tokens, 0)


def _slots(shape: RunShape) -> int:
    """The slot count a run of ``shape`` has with rows to spare (its calibration's key)."""
    return shape.slots or shape.workers


@dataclass(eq=False)
class SlotCost(_EngineCost):
    """An engine whose slots each keep one KV prefix (llama.cpp; the fake backend).

    The thread executor gives each slot a prefix group; a request reuses the
    whole pieces it shares with the slot's previous prompt. Wall time comes
    from the machine's calibration (:mod:`semframe.cost.calibration`) when
    ``calibrated`` engines have one.
    """

    calibrated: bool = False
    context: int | None = None  # tokens each slot holds (llama.cpp's n_ctx per slot)

    @property
    def granularity(self) -> Granularity:
        """Every shared token: a slot reuses its KV prefix token by token."""
        return Granularity()

    def capacity(self, concurrency: int, cache_dir: Path) -> Capacity:
        """One slot per request in flight, each keeping the prefix of its last prompt."""
        return Capacity(self.context, concurrency=concurrency, slots=True)

    def calibration(self, shape: RunShape) -> LocalCalibration | None:
        """The stored calibration for this machine, model and slot count, if any.

        The slot count is the run's with rows to spare (``shape.slots``): a
        call of fewer rows than the engine has slots uses the engine's
        calibration.
        """
        if not self.calibrated:
            return None
        return load_calibration(shape.cache_dir, self.model, _slots(shape))

    def simulate(self, plan: Plan, pieces: Pieces, shape: RunShape) -> CacheFigures:
        n = len(plan.requests)
        slots = slots_of(plan, shape.workers)
        last: dict[int, list[str]] = {}
        head, tail = self._frame(plan.relquery.system)
        total = sum(pieces.counts()) + (head + tail) * n
        cached = 0
        for i in range(n):
            parts = pieces.parts(i)
            prev = last.get(slots[i])
            if prev is None:
                prev = []
            else:
                cached += head  # the template's head, the same on every prompt
            for a, b in zip(prev, parts, strict=False):
                if a != b:
                    # The slot reuses tokens, so also the start both pieces share (a field's
                    # label, a restated question up to its values), less the token the
                    # rest of each piece may merge into.
                    shared = a[: common_prefix_len(a, b)]
                    cached += max(0, pieces.count(shared) - 1) if shared else 0
                    break
                cached += pieces.count(a)
            last[slots[i]] = parts
        cal = self.calibration(shape)
        wall = None if cal is None else cal.wall(total - cached, shape.out_mean * n, n)
        return CacheFigures(total, cached, wall=wall)

    def uncached(
        self, groups: Sequence[tuple[int, int]], input_tokens: int, shape: RunShape
    ) -> CacheFigures:
        cal = self.calibration(shape)
        n = groups[-1][1] if groups else 0
        wall = None if cal is None else cal.wall(input_tokens, shape.out_mean * n, n)
        return CacheFigures(input_tokens, 0, wall=wall)

    def notes(self, shape: RunShape) -> list[str]:
        if not self.calibrated:
            return [f"backend {self.engine!r} has no price and no time model"]
        cal = self.calibration(shape)
        if cal is None:
            return [
                "local engine uncalibrated: no wall time; run semframe.calibrate_local("
                f"model={self.model!r}, slots={_slots(shape)}) once on this machine (about a "
                "minute) and estimate again"
            ]
        busy = (
            f"; this call keeps {plural(shape.workers, 'slot')} busy"
            if shape.workers < cal.slots
            else ""
        )
        return [
            f"wall time from the calibration of {cal.measured_at} ({cal.slots} slots{busy}); "
            "prefix reuse per slot only (the engine's RAM prompt cache is not modelled)"
        ]


@dataclass(eq=False)
class BlockCost(_EngineCost):
    """vLLM in process: one shared cache of fixed-size blocks.

    With a calibrated engine model (``engine_model()`` returns one), a replay
    on the simulator gives cached tokens and wall time
    (:func:`semframe.serving.vllm.timing.predict`); without one, each request
    reuses, in whole blocks, what it shares with its prefix group's first
    request, and there is no wall time. ``framing(system)`` gives the chat
    template's tokens before and after each prompt (the head is shared by
    every request, so it is cacheable).
    """

    block_size: int = 16
    engine_model: Callable[[Path], Any] | None = None
    num_blocks: int | None = None  # set in the engine's arguments (num_gpu_blocks_override)

    @property
    def granularity(self) -> Granularity:
        """Whole KV blocks of ``block_size`` tokens."""
        return Granularity(step=self.block_size)

    def capacity(self, concurrency: int, cache_dir: Path) -> Capacity:
        """The engine's KV blocks: as its arguments set them, else as calibrated, else unknown."""
        if self.num_blocks is not None:
            blocks, source = self.num_blocks, "num_gpu_blocks_override"
        else:
            model = self.engine_model(cache_dir) if self.engine_model is not None else None
            if model is None:
                return Capacity(
                    None,
                    block=self.block_size,
                    concurrency=concurrency,
                    source="size unknown until calibrate_vllm measures the engine",
                )
            blocks, source = model.num_blocks, f"measured {model.measured_at}"
        return Capacity(
            blocks * self.block_size, block=self.block_size, concurrency=concurrency, source=source
        )

    def simulate(self, plan: Plan, pieces: Pieces, shape: RunShape) -> CacheFigures:
        n = len(plan.requests)
        h, t = self._frame(plan.relquery.system)
        head, tail = [-1 - k for k in range(h)], [-1_000_001 - k for k in range(t)]
        prompts = [
            head + [t for part in pieces.parts(i) for t in pieces.tokens(part)] + tail
            for i in range(n)
        ]
        groups = [(g.start, g.stop) for g in plan.groups]
        model = self.engine_model(shape.cache_dir) if self.engine_model is not None else None
        if model is not None:
            p = predict(prompts, groups, shape.out_mean, model, max_tokens=plan.relquery.max_tokens)
            return CacheFigures(p.prompt_tokens, p.cached_tokens, wall=p.wall_seconds)
        cached = 0
        for start, stop in groups:
            lead = prompts[start]
            for i in range(start + 1, stop):
                same = 0
                for a, b in zip(lead, prompts[i], strict=False):
                    if a != b:
                        break
                    same += 1
                cached += same - same % self.block_size
        return CacheFigures(sum(len(p) for p in prompts), cached)

    def notes(self, shape: RunShape) -> list[str]:
        model = self.engine_model(shape.cache_dir) if self.engine_model is not None else None
        if model is not None:
            return [
                "cached tokens and wall time from a replay on the simulator calibrated to this "
                f"vLLM engine ({model.measured_at}); no price (your own hardware)"
            ]
        return [
            "vLLM engine uncalibrated: cached tokens from block-granular reuse within prefix "
            "groups, no wall time (run semframe.backends.vllm.calibrate_vllm once on "
            "this machine); no price (your own hardware)"
        ]
