"""A dependency-free progress line for runs longer than a moment."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

Waiting = Callable[[], tuple[int, float]]
"""``() -> (requests waiting for an answer, seconds the longest has waited)``."""


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Rows done, tokens, cached share, elapsed and ETA on one redrawn line.

    With ``waiting``, the line also says how many requests are waiting for an
    answer and how long the longest has waited, and it is redrawn every half
    second even when no answer arrives (a hung request shows, and its wait grows).

    Parameters
    ----------
    total : int
        Rows to do.
    label : str
        What is running (e.g. ``"map on local"``).
    mode : {"auto", "on", "off"}
        ``auto`` draws only on a terminal; ``on`` always; ``off`` never.
    delay : float
        Seconds before the first draw, so quick runs print nothing.
    stream : file, optional
        Where to draw (default: ``sys.stderr``).
    waiting : callable, optional
        Requests in flight and the longest wait (:data:`Waiting`).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> p = Progress(2, "map", mode="on", delay=0, stream=out)
    >>> p.update(1, prompt_tokens=100, cached_tokens=50)
    >>> "1/2 rows" in out.getvalue() and "50% cached" in out.getvalue()
    True
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        mode: str = "auto",
        delay: float = 1.0,
        stream: TextIO | None = None,
        waiting: Waiting | None = None,
    ) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = mode == "on" or (mode == "auto" and isatty)
        self.delay = delay
        self.start = time.monotonic()
        self.rows = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.errors = 0
        self._last_draw = 0.0
        self._drawn = False
        self.waiting = waiting
        self._lock = threading.Lock()
        self._closed = threading.Event()
        if self.enabled and waiting is not None:
            threading.Thread(target=self._tick, name="semframe-progress", daemon=True).start()

    def _tick(self) -> None:
        """Redraw every half second until closed (answers may not be arriving)."""
        while not self._closed.wait(0.5):
            now = time.monotonic()
            if now - self.start >= self.delay:
                with self._lock:
                    if not self._closed.is_set():
                        self._draw(now)

    def update(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, errors: int = 0
    ) -> None:
        """Set the totals so far; redraw at most ten times a second."""
        self.rows = rows
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.errors = errors
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay or (
            now - self._last_draw < 0.1 and self.rows < self.total
        ):
            return
        self._last_draw = now
        with self._lock:
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = now - self.start
        rate = self.rows / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.rows) / rate if rate > 0 else 0.0
        share = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        err = f" | {self.errors} errors" if self.errors else ""
        wait = ""
        if self.waiting is not None:
            count, longest = self.waiting()
            if count:
                wait = f" | {count} waiting"
                if longest >= 5:
                    wait += f" (longest {_clock(longest)})"
        line = (
            f"\rsemframe {self.label}: {self.rows}/{self.total} rows{wait} | "
            f"{self.prompt_tokens:,} prompt tok ({share:.0%} cached){err} | "
            f"{_clock(elapsed)} elapsed | ETA {_clock(eta)}\x1b[K"
        )
        self.stream.write(line)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Finish the line if anything was drawn (and stop redrawing)."""
        with self._lock:
            self._closed.set()
            if self._drawn:
                self.waiting = None  # nothing is waiting any more
                self._draw(time.monotonic())
                self.stream.write("\n")
                self.stream.flush()
