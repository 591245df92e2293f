"""How long one attempt, and one row, may wait for an answer.

A request that hangs (a stalled connection, a server that accepted it and
never answers) must not hold a run for minutes while every other row is done.
Two limits apply to requests sent on the I/O loop (API backends, vLLM):

- **one attempt** waits at most :meth:`Deadlines.attempt_limit` seconds, then
  counts as a timeout and is retried like one. Until the run has its first
  answer the limit is ``timeout`` itself (a slow or busy server must get the
  chance to answer at all). From then on it is scaled to the request and to
  the run: at least :data:`BASE_SECONDS` plus :data:`PER_OUTPUT_TOKEN`
  seconds per ``max_tokens`` and :data:`PER_PROMPT_CHAR` per prompt
  character, and at least :data:`SLOWEST_MARGIN` times the slowest answer
  seen so far (so a server that is slow, or queues requests, for every row
  is waited for), but never more than ``timeout``. The limit is re-read
  while an attempt waits, so a request sent before the first answer arrived
  is held to it too.
- **one row**'s attempts wait at most ``row_timeout`` seconds in all; then it
  is not sent again but reported as failed, saying so, and the run goes on.
  By default a row may wait twice its attempt limit (one retry of a hung
  attempt). Pauses between attempts (backoff, a 429's ``Retry-After``) are
  not counted, nor is waiting before the run's first answer (an attempt cut
  when the limits tightened gets its retry).
- **a prefix group** waits for its leader (whose answer puts the shared
  prefix in the provider's cache) at most :meth:`Deadlines.hold` seconds;
  then its other requests are sent anyway.

Examples
--------
>>> from semframe.core.wire import Request
>>> request = Request(0, 0, "Summarize: a short review", None, 256, 0.0, None, 0)
>>> limits = Deadlines(timeout=120.0)
>>> limits.attempt_limit(request)  # no answer yet: the whole timeout
120.0
>>> limits.observe(1.2)
>>> round(limits.attempt_limit(request), 1)  # 10 s + 256 x 0.05 s + 25 chars x 0.2 ms
22.8
>>> round(limits.row_limit(request), 1)
45.6
>>> limits.observe(30.0)  # a slow answer: every attempt may wait 3 x as long
>>> limits.attempt_limit(request)
90.0
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from semframe.core.wire import Request

__all__ = [
    "BASE_SECONDS",
    "PER_OUTPUT_TOKEN",
    "PER_PROMPT_CHAR",
    "SLOWEST_MARGIN",
    "Deadlines",
    "InFlight",
]

BASE_SECONDS = 10.0
"""The smallest attempt limit once answers arrive: connection, queueing, first token."""
PER_OUTPUT_TOKEN = 0.05
"""Seconds allowed per token of ``max_tokens`` (an answer produced at 20 tokens a second)."""
PER_PROMPT_CHAR = 0.0002
"""Seconds allowed per prompt character (about 1,200 tokens of prompt a second)."""
SLOWEST_MARGIN = 3.0
"""An attempt may wait this many times the slowest answer of the run so far."""


@dataclass
class Deadlines:
    """The attempt and row limits of one run, learning from the answers it gets.

    Parameters
    ----------
    timeout : float
        The most one attempt may wait (the ``timeout`` setting).
    row_timeout : float or None
        The most one row may wait over all its attempts (``None``: twice its
        attempt limit).
    """

    timeout: float
    row_timeout: float | None = None
    slowest: float = 0.0
    answers: int = 0
    first_answer: float | None = None  # time.monotonic() of the run's first answer
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def scaled(self, request: Request) -> float:
        """The attempt limit ``request``'s size calls for (before the run's evidence)."""
        chars = len(request.prompt) + len(request.system or "")
        return BASE_SECONDS + PER_OUTPUT_TOKEN * request.max_tokens + PER_PROMPT_CHAR * chars

    def attempt_limit(self, request: Request) -> float:
        """Seconds one attempt of ``request`` may wait for its answer, as of now."""
        if not self.answers:
            return self.timeout
        return min(self.timeout, max(self.scaled(request), SLOWEST_MARGIN * self.slowest))

    def row_limit(self, request: Request) -> float:
        """Seconds ``request``'s row may wait over all its attempts, as of now."""
        if self.row_timeout is not None:
            return self.row_timeout
        return 2 * self.attempt_limit(request)

    def counted(self, start: float, now: float) -> float:
        """Of an attempt's wait from ``start`` to ``now``, what counts against its row's limit.

        All of it with ``row_timeout`` or before the run's first answer;
        otherwise only the wait since that answer.
        """
        if self.row_timeout is not None or self.first_answer is None:
            return now - start
        return now - max(start, self.first_answer)

    def hold(self, request: Request) -> float:
        """Seconds a group waits for its leader ``request`` before the rest is sent anyway.

        As long as a normal answer would take: the request's scaled limit, or
        the slowest answer so far when that is longer.
        """
        return max(self.scaled(request), self.slowest)

    def observe(self, seconds: float) -> None:
        """Learn from one answer that took ``seconds``."""
        with self._lock:
            self.answers += 1
            self.slowest = max(self.slowest, seconds)
            if self.first_answer is None:
                self.first_answer = time.monotonic()

    def describe(self, request: Request) -> str:
        """Where ``request``'s attempt limit comes from, for messages."""
        limit = self.attempt_limit(request)
        if limit >= self.timeout:
            return f"timeout={self.timeout:g}"
        return (
            f"an attempt's limit for this request: {SLOWEST_MARGIN:g} x the slowest answer "
            f"so far, and at least {BASE_SECONDS:g} s + {PER_OUTPUT_TOKEN:g} s per max_tokens; "
            f"at most timeout={self.timeout:g}"
        )


class InFlight:
    """Requests sent and not yet answered, for the progress line.

    Examples
    --------
    >>> waits = InFlight()
    >>> waits.start(7, now=100.0)
    >>> waits.start(8, now=103.0)
    >>> waits.waiting(now=110.0)
    (2, 10.0)
    >>> waits.stop(7)
    >>> waits.waiting(now=110.0)
    (1, 7.0)
    """

    def __init__(self) -> None:
        self._since: dict[int, float] = {}
        self._lock = threading.Lock()

    def start(self, key: int, now: float | None = None) -> None:
        """Request ``key`` was sent."""
        # One dict operation is atomic: start and stop need no lock (once per request).
        self._since[key] = time.monotonic() if now is None else now

    def stop(self, key: int) -> None:
        """Request ``key`` has its answer (or its error)."""
        self._since.pop(key, None)

    def waiting(self, now: float | None = None) -> tuple[int, float]:
        """How many requests wait for an answer, and how long the longest has waited."""
        with self._lock:
            since = list(self._since.values())  # one copy, atomic
        if not since:
            return 0, 0.0
        return len(since), (time.monotonic() if now is None else now) - min(since)
