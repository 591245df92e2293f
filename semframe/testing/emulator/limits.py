"""An account's rate limits, as the providers enforce and report them.

Both providers describe their limits as token buckets: a bucket per limit
(requests per minute, tokens per minute) holding at most the limit, refilled
continuously at limit / 60 per second, and a request is refused with a 429
when a bucket holds less than it needs. Every response reports the buckets in
headers: OpenAI ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
(reset as a duration, ``"6m0s"``, ``"20ms"``), Anthropic
``anthropic-ratelimit-{requests,tokens,input-tokens}-{limit,remaining,reset}``
(reset as an RFC 3339 time). A request needs its prompt tokens plus its
``max_tokens`` from the token bucket (OpenAI's documented estimate; the
emulator uses it for Anthropic too, whose input and output limits are
separate).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from semframe.testing.emulator.clock import Clock

__all__ = ["AccountLimits", "LimitState"]

Provider = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class AccountLimits:
    """Requests and tokens per minute an account may use (``None``: unlimited).

    Examples
    --------
    >>> AccountLimits(rpm=60).rpm
    60
    """

    rpm: int | None = None
    tpm: int | None = None


def duration(seconds: float) -> str:
    """OpenAI's reset format.

    Examples
    --------
    >>> duration(0.02), duration(1.5), duration(360)
    ('20ms', '1.5s', '6m0s')
    """
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3g}s" if rest != int(rest) else f"{int(rest)}s"
    return f"{int(minutes)}m{text}" if minutes else text


class _Bucket:
    def __init__(self, limit: int, now: float) -> None:
        self.limit = limit
        self.level = float(limit)
        self.rate = limit / 60.0
        self.at = now

    def refill(self, now: float) -> None:
        self.level = min(self.limit, self.level + self.rate * max(0.0, now - self.at))
        self.at = now

    def short(self, need: float) -> float:
        """Seconds until ``need`` (at most the limit) is in the bucket."""
        missing = min(need, self.limit) - self.level
        return max(0.0, missing / self.rate)

    def reset(self) -> float:
        return (self.limit - self.level) / self.rate


class LimitState:
    """The buckets of one account, shared by every request to the emulator (thread-safe).

    Examples
    --------
    >>> from semframe.testing.emulator.clock import ManualClock
    >>> clock = ManualClock()
    >>> state = LimitState(AccountLimits(rpm=2), clock)
    >>> state.admit(10), state.admit(10), state.admit(10)
    (None, None, 30.0)
    >>> clock.advance(30.0)
    >>> state.admit(10) is None
    True
    """

    def __init__(self, limits: AccountLimits, clock: Clock) -> None:
        self.clock = clock
        now = clock.now()
        self.requests = _Bucket(limits.rpm, now) if limits.rpm else None
        self.tokens = _Bucket(limits.tpm, now) if limits.tpm else None
        self.refused = 0
        self._lock = threading.Lock()

    def _buckets(self) -> list[tuple[_Bucket, float]]:
        return [(b, n) for b, n in ((self.requests, 1.0), (self.tokens, 0.0)) if b is not None]

    def admit(self, tokens: int) -> float | None:
        """Take a request of ``tokens`` from the buckets; seconds to wait when refused."""
        with self._lock:
            now = self.clock.now()
            needs = []
            for bucket, unit in self._buckets():
                bucket.refill(now)
                needs.append((bucket, unit or float(tokens)))
            wait = max((b.short(n) for b, n in needs), default=0.0)
            if wait > 0:
                self.refused += 1
                return math.ceil(wait * 1000) / 1000
            for bucket, need in needs:
                bucket.level -= min(need, bucket.limit)
            return None

    def headers(self, provider: Provider) -> list[tuple[str, str]]:
        """The rate-limit headers of a response sent now."""
        out: list[tuple[str, str]] = []
        with self._lock:
            now = self.clock.now()
            for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
                if bucket is None:
                    continue
                bucket.refill(now)
                left, reset = str(max(0, math.floor(bucket.level))), bucket.reset()
                if provider == "openai":
                    out += [
                        (f"x-ratelimit-limit-{kind}", str(bucket.limit)),
                        (f"x-ratelimit-remaining-{kind}", left),
                        (f"x-ratelimit-reset-{kind}", duration(reset)),
                    ]
                else:
                    when = datetime.now(UTC) + timedelta(seconds=reset)
                    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
                    names = [kind] if kind == "requests" else [kind, "input-tokens"]
                    for name in names:
                        out += [
                            (f"anthropic-ratelimit-{name}-limit", str(bucket.limit)),
                            (f"anthropic-ratelimit-{name}-remaining", left),
                            (f"anthropic-ratelimit-{name}-reset", stamp),
                        ]
        return out
