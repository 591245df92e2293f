"""Clocks for the emulator: real (monotonic) time, or a manual clock for tests."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    """Source of the emulator's notion of time, in seconds."""

    def now(self) -> float:
        """Current time in seconds."""
        ...


class MonotonicClock:
    """Seconds since the clock was created (``time.monotonic``)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0


class ManualClock:
    """A clock that only moves when told to; thread-safe.

    Examples
    --------
    >>> c = ManualClock()
    >>> c.advance(301.5)
    >>> c.now()
    301.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0)."""
        if seconds < 0:
            msg = f"a clock cannot go back in time (advance({seconds}))"
            raise ValueError(msg)
        with self._lock:
            self._t += seconds

    def set(self, t: float) -> None:
        """Jump to time ``t`` (not earlier than now)."""
        with self._lock:
            if t < self._t:
                msg = f"a clock cannot go back in time (now {self._t}, set({t}))"
                raise ValueError(msg)
            self._t = t
