"""Provider prompt-cache rules over token sequences, with an explicit clock.

Pure and deterministic: no wall time, no randomness, no I/O. The provider
emulator runs every request it receives through these simulators, and the cost
estimator runs the planned request sequence through the same code, so an
estimate and an emulated run agree by construction.

Both simulators split a request in two steps so concurrency is modelled
honestly: :meth:`~OpenAICacheSim.begin` looks the prompt up at its arrival
time, and :meth:`~OpenAICacheSim.complete` stores its prefixes at its
completion time. An entry is readable only from the completion time of the
request that wrote it, so requests that start before the first one finishes all
miss, as on the real APIs. ``request(...)`` does both in one call.

OpenAI (automatic caching)
    * Prompts shorter than ``min_tokens`` (1,024) are never cached.
    * Hits come in steps: ``cached = 1024 + 128 k``, the longest stored prefix
      on that grid (never more than the prompt).
    * A completed request stores its prefixes at every grid point.
    * An entry expires ``ttl_s`` (default 300 s) after its last use (a hit
      refreshes it) and at most ``max_lifetime_s`` (3,600 s) after it was
      written.
    * Routing: a request goes to one of ``machines`` caches chosen by a hash of
      ``(prompt_cache_key, first 256 tokens)``; each machine has its own
      entries. Once one route has received ``overflow_per_minute`` (15)
      requests in the last 60 s, further requests spill to the next machine
      (request ``n`` of the window goes to machine ``(home + n // 15) %
      machines``), where the prefix is cold. Distinct ``prompt_cache_key``
      values per prefix group spread a job's load over routes.
    * Writes are free.

Breakpoints (Anthropic; OpenAI from GPT-5.6)
    * A prompt is a sequence of blocks (system blocks, then message content
      blocks); a block may carry a breakpoint (Anthropic ``cache_control``,
      OpenAI ``prompt_cache_breakpoint``) with a TTL (Anthropic ``"5m"`` or
      ``"1h"``; OpenAI ``"30m"`` or ``"12h"``). On Anthropic more than
      ``max_breakpoints`` (4) breakpoints, or a ``1h`` breakpoint after a
      ``5m`` one, is an error (the real API answers 400); OpenAI has no such
      limit but writes only the latest ``max_writes`` (4) of them.
    * Lookup: at each breakpoint, the prefixes ending at that block and at the
      block boundaries before it, ``lookback_blocks`` boundaries in all
      (Anthropic 20; OpenAI 1: "matched exactly at a breakpoint"), are
      checked; the longest stored one is read (``cache_read``).
    * Write: the tokens after the hit up to the last breakpoint whose prefix
      reaches ``min_tokens`` (the model's minimum) are written
      (``cache_creation``), each segment at the TTL of the breakpoint that
      ends it. Breakpoints below the minimum are ignored without error.
    * Tokens after that are ordinary input (``input_tokens``).
    * On completion the prefix at every eligible breakpoint is stored; reads
      refresh an entry's TTL.

Gemini (implicit caching, and explicit caches)
    * Implicit caching is OpenAI's rule with one shared cache per model: no
      routing key exists, so only the order of requests decides hits. Prompts
      under the model's minimum (2,048 / 4,096) are never cached; hits come on
      the ``min + step k`` grid (the granularity is not published: 128 here);
      entries live ``ttl_s`` after their last use.
    * A request that names an explicit cache gets the cache's tokens as cached
      (guaranteed), or the implicit hit on the whole prompt when that is longer.
    * Explicit caches themselves (creation, TTL, storage) are kept by their
      users (the emulator, the estimator); this module only applies the reads.

Examples
--------
>>> sim = OpenAICacheSim()
>>> prompt = list(range(2000))
>>> sim.request(prompt, arrival=0.0, completion=1.0).cached_tokens
0
>>> sim.request(prompt, arrival=2.0, completion=3.0).cached_tokens
1920
>>> sim.request(prompt, arrival=400.0, completion=401.0).cached_tokens  # expired
0
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from semframe.errors import InputError

__all__ = [
    "LONG_TTLS",
    "Block",
    "BreakpointCacheSim",
    "BreakpointResult",
    "BreakpointRules",
    "BreakpointTicket",
    "CacheRuleError",
    "GeminiCacheSim",
    "GeminiResult",
    "GeminiRules",
    "GeminiTicket",
    "OpenAICacheSim",
    "OpenAIResult",
    "OpenAIRules",
    "OpenAITicket",
    "check_breakpoints",
    "openai_cached_grid",
]

TTL = Literal["5m", "30m", "1h", "12h"]
_TTL_SECONDS: dict[str, float] = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "12h": 43200.0}
LONG_TTLS = ("1h", "12h")
"""TTLs whose writes count as ``ephemeral_1h_input_tokens`` (the others as the 5-minute kind)."""
_CHUNK = 128


class CacheRuleError(InputError):
    """A request breaks a provider's caching rules (the real API answers 400)."""


def openai_cached_grid(n: int, min_tokens: int = 1024, step: int = 128) -> int:
    """Largest cacheable length ``<= n`` on OpenAI's grid (0 below the minimum).

    Examples
    --------
    >>> openai_cached_grid(1023), openai_cached_grid(1024), openai_cached_grid(1300)
    (0, 1024, 1280)
    """
    if n < min_tokens:
        return 0
    return min_tokens + (n - min_tokens) // step * step


class _Prefixes:
    """Content keys of the prefixes of one token sequence, O(n) to build."""

    __slots__ = ("_chain", "_tokens")

    def __init__(self, tokens: Sequence[int]) -> None:
        self._tokens = tuple(tokens)
        chain = [0]
        h = 0
        for start in range(0, len(self._tokens) - _CHUNK + 1, _CHUNK):
            h = hash((h, self._tokens[start : start + _CHUNK]))
            chain.append(h)
        self._chain = chain

    def key(self, n: int) -> int:
        k = n // _CHUNK
        return hash((n, self._chain[k], self._tokens[k * _CHUNK : n]))


@dataclass
class _Entry:
    available_from: float  # completion time of the request that wrote it
    last_used: float
    created: float
    ttl: float

    def alive(self, now: float, max_lifetime: float) -> bool:
        return (
            self.available_from <= now <= self.last_used + self.ttl
            and now <= self.created + max_lifetime
        )


def _put(store: dict[int, _Entry], key: int, at: float, ttl: float, max_lifetime: float) -> None:
    entry = store.get(key)
    if entry is not None and entry.alive(at, max_lifetime):
        entry.last_used = max(entry.last_used, at)
        entry.ttl = max(entry.ttl, ttl)
        entry.available_from = min(entry.available_from, at)
    else:
        store[key] = _Entry(available_from=at, last_used=at, created=at, ttl=ttl)


def _prune(store: dict[int, _Entry], now: float, max_lifetime: float) -> None:
    dead = [
        k for k, e in store.items() if e.available_from <= now and not e.alive(now, max_lifetime)
    ]
    for k in dead:
        del store[k]


# ---------------------------------------------------------------- OpenAI


@dataclass(frozen=True)
class OpenAIRules:
    """Parameters of OpenAI's automatic prompt caching.

    Attributes
    ----------
    min_tokens : int
        Shortest prompt that is cached (1,024).
    step : int
        Cached prefixes grow in steps of this many tokens (128).
    ttl_s : float
        Inactivity time after which an entry is evicted (5 to 10 min in
        OpenAI's docs; 300 s here).
    max_lifetime_s : float
        Hard limit on an entry's life, refreshes included (1 h).
    machines : int
        Cache machines a model's traffic is spread over.
    route_tokens : int
        Leading tokens hashed (with ``prompt_cache_key``) to pick the machine.
    overflow_per_minute : int
        Requests per minute one route takes before spilling to other machines.
    """

    min_tokens: int = 1024
    step: int = 128
    ttl_s: float = 300.0
    max_lifetime_s: float = 3600.0
    machines: int = 8
    route_tokens: int = 256
    overflow_per_minute: int = 15


@dataclass(frozen=True)
class OpenAIResult:
    """What one request got from the cache.

    Attributes
    ----------
    prompt_tokens : int
        Tokens of the prompt.
    cached_tokens : int
        Of which served from the cache (``prompt_tokens_details.cached_tokens``).
    machine : int
        Cache machine the request was routed to.
    overflowed : bool
        True when the route was over its rate and the request spilled over.
    """

    prompt_tokens: int
    cached_tokens: int
    machine: int
    overflowed: bool


@dataclass(frozen=True)
class OpenAITicket:
    """A request in flight: its lookup result and what to store on completion."""

    result: OpenAIResult
    tokens: tuple[int, ...] = field(repr=False)
    prefixes: _Prefixes | None = field(default=None, repr=False, compare=False)


class OpenAICacheSim:
    """OpenAI's prompt cache for one model (see the module docstring for the rules).

    Not thread-safe; callers serialise access (the emulator holds a lock).

    Examples
    --------
    >>> sim = OpenAICacheSim(OpenAIRules(machines=1))
    >>> shared = list(range(1500))
    >>> t = sim.begin(shared + [1, 2, 3], arrival=0.0, cache_key="g1")
    >>> sim.complete(t, at=0.5)
    >>> sim.request(shared + [7, 8], arrival=1.0, cache_key="g1").cached_tokens
    1408
    """

    def __init__(self, rules: OpenAIRules | None = None) -> None:
        self.rules = rules or OpenAIRules()
        self._machines: list[dict[int, _Entry]] = [{} for _ in range(self.rules.machines)]
        self._routes: dict[bytes, deque[float]] = {}
        self._last_prune = 0.0

    def _home(self, tokens: Sequence[int], cache_key: str | None) -> tuple[bytes, int]:
        h = hashlib.blake2b(digest_size=8)
        h.update((cache_key or "").encode("utf-8") + b"\x00")
        for t in tokens[: self.rules.route_tokens]:
            h.update(t.to_bytes(4, "little", signed=True))
        route = h.digest()
        return route, int.from_bytes(route, "little") % self.rules.machines

    def begin(
        self, tokens: Sequence[int], *, arrival: float, cache_key: str | None = None
    ) -> OpenAITicket:
        """Look ``tokens`` up at time ``arrival``; refreshes the entry it hits."""
        r = self.rules
        route, home = self._home(tokens, cache_key)
        window = self._routes.setdefault(route, deque())
        while window and window[0] <= arrival - 60.0:
            window.popleft()
        spill = len(window) // r.overflow_per_minute
        window.append(arrival)
        machine = (home + spill) % r.machines
        store = self._machines[machine]
        n = len(tokens)
        cached = 0
        top = openai_cached_grid(n, r.min_tokens, r.step)
        prefixes = None
        if top:
            prefixes = _Prefixes(tokens)
            for length in range(top, r.min_tokens - 1, -r.step):
                entry = store.get(prefixes.key(length))
                if entry is not None and entry.alive(arrival, r.max_lifetime_s):
                    cached = length
                    break
            if cached:
                for length in range(r.min_tokens, cached + 1, r.step):
                    e = store.get(prefixes.key(length))
                    if e is not None and e.alive(arrival, r.max_lifetime_s):
                        e.last_used = max(e.last_used, arrival)
        result = OpenAIResult(n, cached, machine, spill > 0)
        kept = prefixes._tokens if prefixes is not None else tuple(tokens)
        return OpenAITicket(result, kept, prefixes)

    def complete(self, ticket: OpenAITicket, *, at: float) -> None:
        """Store the prefixes of a request that finished at time ``at``."""
        r = self.rules
        top = openai_cached_grid(len(ticket.tokens), r.min_tokens, r.step)
        store = self._machines[ticket.result.machine]
        if at - self._last_prune > r.ttl_s:
            for s in self._machines:
                _prune(s, at, r.max_lifetime_s)
            self._last_prune = at
        if not top:
            return
        prefixes = ticket.prefixes or _Prefixes(ticket.tokens)
        for length in range(r.min_tokens, top + 1, r.step):
            _put(store, prefixes.key(length), at, r.ttl_s, r.max_lifetime_s)

    def request(
        self,
        tokens: Sequence[int],
        *,
        arrival: float,
        completion: float | None = None,
        cache_key: str | None = None,
    ) -> OpenAIResult:
        """:meth:`begin` then :meth:`complete` (at ``completion``, default ``arrival``)."""
        ticket = self.begin(tokens, arrival=arrival, cache_key=cache_key)
        self.complete(ticket, at=arrival if completion is None else completion)
        return ticket.result


# ---------------------------------------------------------------- Anthropic


@dataclass(frozen=True)
class Block:
    """One content block of a prompt with cache breakpoints, as tokens.

    Attributes
    ----------
    tokens : tuple of int
        The block's tokens (including any per-message framing tokens).
    cache_ttl : {"5m", "30m", "1h", "12h"} or None
        TTL of the block's breakpoint (Anthropic ``cache_control``, OpenAI
        ``prompt_cache_breakpoint``); None for no breakpoint.
    """

    tokens: tuple[int, ...]
    cache_ttl: TTL | None = None


@dataclass(frozen=True)
class BreakpointRules:
    """Parameters of breakpoint caching for one model (Anthropic's by default).

    Attributes
    ----------
    min_tokens : int
        Model's minimum cacheable prompt length (1,024 for Sonnet/Opus 4.x,
        2,048 for Haiku 3 and 3.5, 4,096 for Opus 4.5 and Haiku 4.5; 1,024 on
        OpenAI).
    lookback_blocks : int
        Block boundaries checked per breakpoint, the breakpoint's own included.
    max_breakpoints : int or None
        Breakpoints allowed per request (more is an error); None: no limit.
    max_writes : int or None
        Only the latest this many eligible breakpoints are written; None: all.
    ttls : tuple of str
        The TTLs a breakpoint may carry.
    longer_first : bool
        A breakpoint with a longer TTL must not follow one with a shorter TTL
        (Anthropic's rule).

    Examples
    --------
    >>> BreakpointRules.openai().lookback_blocks, BreakpointRules.openai().ttls
    (1, ('30m', '12h'))
    """

    min_tokens: int = 1024
    lookback_blocks: int = 20
    max_breakpoints: int | None = 4
    max_writes: int | None = None
    ttls: tuple[str, ...] = ("5m", "1h")
    longer_first: bool = True

    @classmethod
    def openai(cls, min_tokens: int = 1024) -> BreakpointRules:
        """OpenAI's explicit breakpoints (GPT-5.6 and later).

        Matched exactly at a breakpoint (no fallback to a shorter unmarked
        prefix), up to four written per request, TTL ``30m`` (the request's
        default) or ``12h`` per breakpoint (the SDK's ``PromptCacheBreakpoint``).
        """
        return cls(
            min_tokens=min_tokens,
            lookback_blocks=1,
            max_breakpoints=None,
            max_writes=4,
            ttls=("30m", "12h"),
            longer_first=False,
        )


@dataclass(frozen=True)
class BreakpointResult:
    """Usage of one request, in Anthropic's terms.

    ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``
    is the whole prompt. Writes are split by TTL: ``ephemeral_5m_input_tokens``
    at the shorter TTLs (5 minutes, OpenAI's 30 minutes),
    ``ephemeral_1h_input_tokens`` at the longer ones (1 hour, 12 hours).
    """

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int

    @property
    def prompt_tokens(self) -> int:
        """All prompt tokens, cached or not."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens


@dataclass(frozen=True)
class BreakpointTicket:
    """A request in flight: its usage and the prefixes to store on completion."""

    result: BreakpointResult
    writes: tuple[tuple[int, float], ...] = field(repr=False)  # (prefix key, ttl seconds)


def check_breakpoints(blocks: Sequence[Block], rules: BreakpointRules | None = None) -> None:
    """Raise :class:`CacheRuleError` where the real API would answer 400.

    Examples
    --------
    >>> check_breakpoints([Block((1,), "5m")] * 5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.cost.cachesim.CacheRuleError: A maximum of 4 blocks with cache_control ... Found 5.
    >>> check_breakpoints([Block((1,), "30m")] * 5, BreakpointRules.openai())
    """
    r = rules or BreakpointRules()
    ttls = [b.cache_ttl for b in blocks if b.cache_ttl is not None]
    if r.max_breakpoints is not None and len(ttls) > r.max_breakpoints:
        msg = (
            f"A maximum of {r.max_breakpoints} blocks with cache_control may be provided. "
            f"Found {len(ttls)}."
        )
        raise CacheRuleError(msg)
    for ttl in ttls:
        if ttl not in r.ttls:
            valid = ", ".join(repr(t) for t in r.ttls)
            msg = f"cache breakpoint ttl must be one of {valid}; got {ttl!r}"
            raise CacheRuleError(msg)
    if r.longer_first:
        for earlier, later in itertools.pairwise(ttls):
            if _TTL_SECONDS[later] > _TTL_SECONDS[earlier]:
                msg = (
                    f"a cache_control block with ttl={later!r} must not come after one "
                    f"with ttl={earlier!r}"
                )
                raise CacheRuleError(msg)


class BreakpointCacheSim:
    """A breakpoint prompt cache for one model (rules in the module docstring).

    Not thread-safe; callers serialise access (the emulator holds a lock).

    Examples
    --------
    >>> sim = BreakpointCacheSim(BreakpointRules(min_tokens=1024))
    >>> instr = Block(tuple(range(1200)), "5m")
    >>> r1 = sim.request([instr, Block((5, 6, 7))], arrival=0.0)
    >>> r1.cache_creation_input_tokens, r1.input_tokens
    (1200, 3)
    >>> r2 = sim.request([instr, Block((8, 9))], arrival=1.0)
    >>> r2.cache_read_input_tokens, r2.input_tokens
    (1200, 2)
    """

    def __init__(self, rules: BreakpointRules | None = None) -> None:
        self.rules = rules or BreakpointRules()
        self._store: dict[int, _Entry] = {}
        self._last_prune = 0.0

    def begin(self, blocks: Sequence[Block], *, arrival: float) -> BreakpointTicket:
        """Look the prompt up at time ``arrival``; refreshes the entry it reads.

        Raises
        ------
        CacheRuleError
            More than ``max_breakpoints`` breakpoints, or a bad TTL order.
        """
        r = self.rules
        check_breakpoints(blocks, r)
        tokens: list[int] = []
        ends: list[int] = []
        for b in blocks:
            tokens.extend(b.tokens)
            ends.append(len(tokens))
        total = len(tokens)
        bps = [i for i, b in enumerate(blocks) if b.cache_ttl is not None]
        eligible = [i for i in bps if ends[i] >= r.min_tokens]
        if r.max_writes is not None:
            eligible = eligible[-r.max_writes :] if r.max_writes else []
        if not eligible:
            return BreakpointTicket(BreakpointResult(total, 0, 0, 0, 0), ())
        prefixes = _Prefixes(tokens)
        never = float("inf")
        hit = 0
        for i in bps:
            for j in range(i, max(-1, i - r.lookback_blocks), -1):
                n = ends[j]
                if n <= hit or n < r.min_tokens:
                    continue
                entry = self._store.get(prefixes.key(n))
                if entry is not None and entry.alive(arrival, never):
                    hit = n
                    entry.last_used = max(entry.last_used, arrival)
                    break
        w5 = w1 = 0
        prev = hit
        writes: list[tuple[int, float]] = []
        for i in eligible:
            ttl = blocks[i].cache_ttl or "5m"  # eligible breakpoints carry a TTL
            seg = ends[i] - prev
            if seg > 0:
                if ttl in LONG_TTLS:
                    w1 += seg
                else:
                    w5 += seg
                prev = ends[i]
            writes.append((prefixes.key(ends[i]), _TTL_SECONDS[ttl]))
        written = w5 + w1
        result = BreakpointResult(total - hit - written, hit, written, w5, w1)
        return BreakpointTicket(result, tuple(writes))

    def complete(self, ticket: BreakpointTicket, *, at: float) -> None:
        """Store the prefixes of a request that finished at time ``at``."""
        never = float("inf")
        if at - self._last_prune > 300.0:
            _prune(self._store, at, never)
            self._last_prune = at
        for key, ttl in ticket.writes:
            _put(self._store, key, at, ttl, never)

    def request(
        self, blocks: Sequence[Block], *, arrival: float, completion: float | None = None
    ) -> BreakpointResult:
        """:meth:`begin` then :meth:`complete` (at ``completion``, default ``arrival``)."""
        ticket = self.begin(blocks, arrival=arrival)
        self.complete(ticket, at=arrival if completion is None else completion)
        return ticket.result


# ---------------------------------------------------------------- Gemini


@dataclass(frozen=True)
class GeminiRules:
    """Parameters of Gemini's implicit prompt caching for one model.

    Attributes
    ----------
    min_tokens : int
        Shortest prompt that is cached (2,048 on 2.5 models, 4,096 on 3.x).
    step : int
        Hits come in steps of this many tokens above the minimum (not published).
    ttl_s : float
        Inactivity after which an entry is evicted (not published; 300 s here).
    max_lifetime_s : float
        Hard limit on an entry's life.
    """

    min_tokens: int = 2048
    step: int = 128
    ttl_s: float = 300.0
    max_lifetime_s: float = 3600.0


@dataclass(frozen=True)
class GeminiResult:
    """What one request got from the cache, as Gemini reports it.

    ``cached_tokens`` (``cached_content_token_count``) is part of
    ``prompt_tokens`` (``prompt_token_count``); ``explicit`` says the request
    named an explicit cache.
    """

    prompt_tokens: int
    cached_tokens: int
    explicit: bool


@dataclass(frozen=True)
class GeminiTicket:
    """A request in flight: its result and what to store on completion."""

    result: GeminiResult
    implicit: OpenAITicket = field(repr=False)


class _OneCache(OpenAICacheSim):
    """OpenAI's rules on a single cache machine: no routing, no overflow."""

    def _home(self, tokens: Sequence[int], cache_key: str | None) -> tuple[bytes, int]:
        return b"", 0


class GeminiCacheSim:
    """Gemini's prompt cache for one model (rules in the module docstring).

    Not thread-safe; callers serialise access (the emulator holds a lock).

    Examples
    --------
    >>> sim = GeminiCacheSim(GeminiRules(min_tokens=2048))
    >>> shared = list(range(3000))
    >>> sim.request(shared + [1], arrival=0.0, completion=1.0).cached_tokens
    0
    >>> sim.request(shared + [2], arrival=2.0).cached_tokens  # implicit: 2048 + 7 x 128
    2944
    >>> r = sim.request(list(range(5000, 8000)) + [3], arrival=3.0, explicit=2500)
    >>> r.cached_tokens, r.explicit
    (2500, True)
    """

    def __init__(self, rules: GeminiRules | None = None) -> None:
        self.rules = rules or GeminiRules()
        r = self.rules
        self._implicit = _OneCache(
            OpenAIRules(
                min_tokens=r.min_tokens,
                step=r.step,
                ttl_s=r.ttl_s,
                max_lifetime_s=r.max_lifetime_s,
                machines=1,
                overflow_per_minute=2**62,
            )
        )

    def begin(self, tokens: Sequence[int], *, arrival: float, explicit: int = 0) -> GeminiTicket:
        """Look ``tokens`` up at ``arrival``; the first ``explicit`` come from an explicit cache."""
        ticket = self._implicit.begin(tokens, arrival=arrival)
        explicit = min(max(explicit, 0), len(tokens))
        cached = max(explicit, ticket.result.cached_tokens)
        return GeminiTicket(GeminiResult(len(tokens), cached, explicit > 0), ticket)

    def complete(self, ticket: GeminiTicket, *, at: float) -> None:
        """Store the prefixes of a request that finished at time ``at``."""
        self._implicit.complete(ticket.implicit, at=at)

    def request(
        self,
        tokens: Sequence[int],
        *,
        arrival: float,
        completion: float | None = None,
        explicit: int = 0,
    ) -> GeminiResult:
        """:meth:`begin` then :meth:`complete` (at ``completion``, default ``arrival``)."""
        ticket = self.begin(tokens, arrival=arrival, explicit=explicit)
        self.complete(ticket, at=arrival if completion is None else completion)
        return ticket.result
