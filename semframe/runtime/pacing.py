"""Pacing a run's requests by the account's rate limits: slow down before a 429 storm.

A run on an API shares the account's limits (requests and tokens per minute)
with everything else that uses the key. Sending at full concurrency until the
provider answers 429, then retrying, wastes time and, at scale, whole waves
of requests. :class:`Pacer` keeps each run under the limits it knows of:

- **the configured ones** (``rpm``/``tpm`` settings): token buckets
  (:class:`~semframe.runtime.dispatch.RateLimiter`) whose token reservations
  are settled to each answer's actual usage, so a request that used less than
  its reservation gives the difference back;
- **the provider's own**, read from every response's rate-limit headers
  (:class:`~semframe.core.wire.RateLimits`: OpenAI's ``x-ratelimit-*``,
  Anthropic's ``anthropic-ratelimit-*``): a mirror of the provider's bucket,
  reset to what it says it has left (less what this run has in flight) and
  refilled at the rate its reset time implies. A request waits when the
  mirror says the provider would refuse it, instead of being refused;
- **429s**: every request waits out the provider's ``Retry-After`` (the whole
  run, not only the request that was refused), and the number of requests in
  flight is halved, then grows back by one per window of answers (additive
  increase, multiplicative decrease).

Token reservations start from an estimate (characters / 4, plus
``max_tokens``) and are scaled by what the answers report (the provider's
own count of the same prompts). The provider-side state (:class:`Account`)
is shared by every run on one backend instance, so two runs at once in one
process share the account's limits; other processes using the key are seen
only through the headers and their 429s.

All of this happens on semframe's I/O loop (one pacer per run); the
dispatcher (:mod:`semframe.runtime.dispatch`) still decides which request goes
next, the pacer only when.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from semframe.core.wire import Completion, RateLimits
from semframe.runtime.dispatch import RateLimiter

__all__ = ["Account", "Mirror", "Pacer", "Ticket", "account_of"]

MAX_PAUSE_S = 60.0
"""Longest pause after a 429 without a ``Retry-After`` (doubling from 1 s)."""


@dataclass
class Mirror:
    """One of the provider's buckets (requests or tokens), as its headers last showed it.

    Attributes
    ----------
    limit : float
        The bucket's size (the account's limit).
    level : float
        What was left at ``at`` (negative: more is in flight than was left).
    rate : float
        Refill per second.
    at : float
        When ``level`` was true (the pacer's clock).

    Examples
    --------
    >>> m = Mirror(limit=60, level=0, rate=1.0, at=0.0)
    >>> m.wait(1, now=0.5), m.wait(1, now=2.0)
    (0.5, 0.0)
    """

    limit: float
    level: float
    rate: float
    at: float

    def now_level(self, now: float) -> float:
        """What is left at ``now``."""
        return min(self.limit, self.level + self.rate * max(0.0, now - self.at))

    def wait(self, need: float, now: float) -> float:
        """Seconds until ``need`` is available (a need above the limit waits for a full bucket)."""
        short = min(need, self.limit) - self.now_level(now)
        if short <= 0:
            return 0.0
        return short / self.rate if self.rate > 0 else MAX_PAUSE_S

    def take(self, amount: float, now: float) -> None:
        """Spend ``amount`` at ``now``."""
        self.level = self.now_level(now) - amount
        self.at = now


def _mirror(
    limit: int | None,
    left: int | None,
    reset_s: float | None,
    in_flight: float,
    now: float,
) -> Mirror | None:
    """The provider's bucket from one response's headers, less what is still in flight.

    The refill rate is what the reset time implies (``(limit - left) /
    reset``), or a per-minute limit's when the bucket is full.

    Examples
    --------
    >>> _mirror(60, 30, 30.0, in_flight=2, now=0.0)
    Mirror(limit=60, level=28, rate=1.0, at=0.0)
    >>> _mirror(60, None, 1.0, in_flight=0, now=0.0) is None
    True
    """
    if left is None:
        return None
    size = limit if limit is not None and limit > 0 else max(left, 1)
    if reset_s is not None and reset_s > 0 and left < size:
        rate = (size - left) / reset_s
    else:
        rate = size / 60.0
    return Mirror(size, left - in_flight, rate, now)


@dataclass(frozen=True)
class Ticket:
    """One attempt's place in the pace: what was reserved for it.

    Attributes
    ----------
    prompt : int
        Its prompt tokens as estimated before sending (characters / 4).
    reserved : int
        Tokens reserved from the provider's bucket: the estimate scaled by
        what answers so far showed (the provider's own count), plus
        ``max_tokens`` (which OpenAI reserves too).
    """

    prompt: int
    reserved: int


class Account:
    """The provider account's rate-limit state as this process sees it.

    Shared by every run on one backend instance (one key, one endpoint:
    :func:`account_of`), so that two runs at once share the account's limits
    instead of each assuming it has them all.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.requests: Mirror | None = None
        self.tokens: Mirror | None = None
        self.paused_until = 0.0
        self.refusals = 0  # 429s in a row
        self.active = 0  # requests in flight, every run
        self.active_tokens = 0
        self.estimated = 0  # prompt tokens estimated / reported, for the scale
        self.reported = 0

    @property
    def scale(self) -> float:
        """Reported prompt tokens per estimated one (1 until an answer says)."""
        return self.reported / self.estimated if self.estimated and self.reported else 1.0

    def delay(self, tokens: int) -> float:
        """Seconds a request reserving ``tokens`` must wait now (pause, provider limits)."""
        now = self.clock()
        wait = self.paused_until - now
        if self.requests is not None:
            wait = max(wait, self.requests.wait(1, now))
        if self.tokens is not None:
            wait = max(wait, self.tokens.wait(tokens, now))
        return max(0.0, wait)

    def take(self, tokens: int) -> None:
        now = self.clock()
        if self.requests is not None:
            self.requests.take(1, now)
        if self.tokens is not None:
            self.tokens.take(tokens, now)
        self.active += 1
        self.active_tokens += tokens

    def observe(self, limits: RateLimits) -> None:
        """Reset the mirrors to what a response's headers reported, less what is in flight."""
        now = self.clock()
        found = _mirror(
            limits.requests_limit, limits.requests_left, limits.requests_reset_s, self.active, now
        )
        if found is not None:
            self.requests = found
        found = _mirror(
            limits.tokens_limit, limits.tokens_left, limits.tokens_reset_s, self.active_tokens, now
        )
        if found is not None:
            self.tokens = found

    def refused(self, retry_after: float | None) -> None:
        """A 429: every request waits ``retry_after`` (else 1 s, doubling), buckets empty."""
        now = self.clock()
        self.refusals += 1
        pause = retry_after
        if pause is None:
            pause = min(MAX_PAUSE_S, 2.0 ** (self.refusals - 1))
        self.paused_until = max(self.paused_until, now + pause)
        for mirror in (self.requests, self.tokens):
            if mirror is not None:  # the provider says it is short: nothing left now
                mirror.level, mirror.at = min(0.0, mirror.now_level(now)), now


_accounts: weakref.WeakKeyDictionary[object, Account] = weakref.WeakKeyDictionary()


def account_of(backend: object) -> Account:
    """The :class:`Account` of ``backend`` (one per backend instance, for the process).

    Examples
    --------
    >>> class Api: ...
    >>> one, other = Api(), Api()
    >>> account_of(one) is account_of(one) is not account_of(other)
    True
    """
    found = _accounts.get(backend)
    if found is None:
        found = _accounts[backend] = Account()
    return found


class Pacer:
    """When each request of one run may go: configured limits, the provider's, and 429s.

    Parameters
    ----------
    window : int
        Requests in flight at most (the run's concurrency); halved by each
        429, grown back by one after each window of answers.
    rpm, tpm : int, optional
        Configured client-side limits (requests, tokens per minute).
    account : Account, optional
        The account's shared state (:func:`account_of` the backend); a fresh
        one by default.
    clock : callable
        Seconds, monotonic (tests pass a fake).

    Attributes
    ----------
    throttled : int
        429s the run met.
    paced_s : float
        Seconds requests waited for the pace (summed over requests).

    Examples
    --------
    >>> import asyncio
    >>> from semframe.core.wire import Completion, RateLimits, Usage
    >>> async def run():
    ...     pacer = Pacer(4)
    ...     ticket = await pacer.acquire(100, max_tokens=0)
    ...     seen = RateLimits(requests_limit=60, requests_left=0, requests_reset_s=60.0)
    ...     await pacer.done(ticket, Completion(0, "ok", Usage()), limits=seen)
    ...     return pacer.account.delay(100)  # none left: one refills in 1 s
    >>> round(asyncio.run(run()), 1)
    1.0
    """

    def __init__(
        self,
        window: int,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        account: Account | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.account = account or Account(clock)
        self.max_window = max(1, window)
        self.window = self.max_window
        self.limiter = RateLimiter(rpm, tpm, clock) if (rpm or tpm) else None
        self.active = 0
        self.streak = 0  # answers since the window last changed
        self.throttled = 0
        self.paced_s = 0.0
        self.cond = asyncio.Condition()

    async def acquire(self, prompt: int, *, max_tokens: int) -> Ticket:
        """Wait until a request may go (``prompt`` tokens estimated), and count it in flight."""
        start = self.clock()
        account = self.account
        async with self.cond:
            while True:
                reserved = round(prompt * account.scale) + max_tokens
                if self.active >= self.window:
                    await self.cond.wait()
                    continue
                wait = account.delay(reserved)
                if wait <= 0:
                    break
                with contextlib.suppress(TimeoutError):  # or woken early by an answer
                    await asyncio.wait_for(self.cond.wait(), wait)
            account.take(reserved)
            self.active += 1
        if self.limiter is not None:
            await self.limiter.acquire(reserved)
        self.paced_s += self.clock() - start
        return Ticket(prompt, reserved)

    async def done(
        self,
        ticket: Ticket,
        answer: Completion | None,
        *,
        limits: RateLimits | None = None,
        rate_limited: bool = False,
        retry_after: float | None = None,
    ) -> None:
        """An attempt :meth:`acquire` let go ended.

        Parameters
        ----------
        ticket : Ticket
            What :meth:`acquire` returned for it.
        answer : Completion or None
            Its answer; ``None`` when it failed. Its usage settles the
            configured token bucket (the unused part of the reservation is
            given back) and teaches the estimate the provider's count.
        limits : RateLimits, optional
            The rate-limit state its response reported.
        rate_limited : bool
            The provider refused it with a 429.
        retry_after : float, optional
            The 429's ``Retry-After``.
        """
        account = self.account
        async with self.cond:
            self.active -= 1
            account.active -= 1
            account.active_tokens -= ticket.reserved
            if answer is not None and answer.usage.prompt_tokens:
                account.estimated += ticket.prompt
                account.reported += answer.usage.prompt_tokens
                if self.limiter is not None:
                    used = answer.usage.prompt_tokens + answer.usage.output_tokens
                    self.limiter.refund(ticket.reserved - used)
            if limits is not None:
                account.observe(limits)
            if rate_limited:
                self.throttled += 1
                account.refused(retry_after)
                self.window = max(1, self.window // 2)
                self.streak = 0
            elif answer is not None:
                account.refusals = 0
                self.streak += 1
                if self.window < self.max_window and self.streak >= self.window:
                    self.window += 1
                    self.streak = 0
            self.cond.notify_all()
