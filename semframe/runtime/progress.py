"""A dependency-free progress display for runs longer than a moment.

On a terminal it is one line redrawn in place (``\\r``); in a Jupyter
notebook, where standard error is no terminal, it is a display that IPython
updates in place (``display(..., display_id=True)`` and ``.update()``), with a
bar. Both say the same: rows done, requests waiting, prompt tokens and the
cached share, dollars so far (where the backend has a price), elapsed time
and ETA. IPython is never imported here: a notebook is recognised by an
IPython already imported whose shell is a kernel's (``ZMQInteractiveShell``).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Any, TextIO

from semframe.errors import plural

__all__ = ["Display", "Progress", "ProgressView", "Waiting", "notebook_display"]

Waiting = Callable[[], tuple[int, float]]
"""``() -> (requests waiting for an answer, seconds the longest has waited)``."""

Display = Callable[..., Any]
"""IPython's ``display``: ``display(obj, display_id=True)`` returns a handle whose
``update(obj)`` redraws ``obj`` where it was first shown."""

TERMINAL_INTERVAL = 0.1
"""Least seconds between two redraws of the terminal line."""
NOTEBOOK_INTERVAL = 0.2
"""Least seconds between two updates of the notebook display (each is a kernel message)."""


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def notebook_display() -> Display | None:
    """IPython's ``display`` when this process is a Jupyter kernel, else ``None``.

    A kernel has imported IPython and runs a ``ZMQInteractiveShell`` (or a
    subclass: Colab's, VS Code's); a terminal IPython or plain Python does
    not. IPython is not imported when it is not already.

    Examples
    --------
    >>> notebook_display() is None  # doctests run in no kernel
    True
    """
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    if not callable(get):
        return None
    shell = get()
    if shell is None or not any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__):
        return None
    display: Display | None = getattr(importlib.import_module("IPython.display"), "display", None)
    return display


@dataclass(frozen=True)
class ProgressView:
    """One state of the progress display, as a notebook shows it (a bar and the line).

    Attributes
    ----------
    text : str
        The line, as the terminal shows it.
    done, total : int
        Rows done and to do (the bar).
    """

    text: str
    done: int
    total: int

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return (
            "<div style='font-family:monospace;font-size:90%'>"
            f"<progress value='{self.done}' max='{max(self.total, 1)}' "
            "style='width:14em;vertical-align:middle;margin-right:0.6em'></progress>"
            f"{escape(self.text)}</div>"
        )


class Progress:
    """Rows done, tokens, cached share, dollars, elapsed and ETA, redrawn in place.

    With ``waiting``, the display also says how many requests are waiting for
    an answer and how long the longest has waited, and it is redrawn every half
    second even when no answer arrives (a hung request shows, and its wait grows).

    On a terminal it is one line on ``stream``, redrawn at most ten times a
    second. In a Jupyter notebook (with no ``stream`` given) it is a display
    updated in place at most five times a second. Either way the final state
    is drawn when the run ends, if anything was drawn.

    Parameters
    ----------
    total : int
        Rows to do.
    label : str
        What is running (e.g. ``"map on local"``).
    mode : {"auto", "on", "off"}
        ``auto`` draws only on a terminal or in a notebook; ``on`` always
        (in a notebook, as a notebook display); ``off`` never.
    delay : float
        Seconds before the first draw, so quick runs show nothing.
    stream : file, optional
        Where to draw the line (default: ``sys.stderr``, or the notebook).
    waiting : callable, optional
        Requests in flight and the longest wait (:data:`Waiting`).
    dollars : callable, optional
        ``() -> dollars spent so far`` (``None``: no price), asked at each draw.
    notebook : callable, optional
        A :data:`Display` to draw with instead of finding the notebook's own
        (tests pass a fake one).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> p = Progress(2, "map", mode="on", delay=0, stream=out, dollars=lambda: 0.0123)
    >>> p.update(1, prompt_tokens=100, cached_tokens=50)
    >>> "1/2 rows" in out.getvalue(), "50% cached" in out.getvalue(), "$0.0123" in out.getvalue()
    (True, True, True)

    In a notebook, each draw shows or updates one display:

    >>> class Handle:
    ...     def update(self, view): print("update:", view)
    >>> def display(view, display_id=False):
    ...     print("show:", view)
    ...     return Handle()
    >>> p = Progress(1, "map", delay=0, notebook=display)
    >>> p.update(1, errors=1)
    show: semframe map: 1/1 row | 0 prompt tok (0% cached) | 1 error | 0:00 elapsed | ETA 0:00
    >>> p.close()
    update: semframe map: 1/1 row | 0 prompt tok (0% cached) | 1 error | 0:00 elapsed
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
        dollars: Callable[[], float | None] | None = None,
        notebook: Display | None = None,
    ) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        if notebook is None and stream is None and mode != "off":
            notebook = notebook_display()
        self.notebook = notebook if mode != "off" else None
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = mode == "on" or (mode == "auto" and (isatty or self.notebook is not None))
        self.interval = TERMINAL_INTERVAL if self.notebook is None else NOTEBOOK_INTERVAL
        self.delay = delay
        self.start = time.monotonic()
        self.rows = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.errors = 0
        self.dollars = dollars
        self._last_draw = 0.0
        self._drawn = False
        self._handle: Any = None
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
                        self._last_draw = now
                        self._draw(now)

    def update(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, errors: int = 0
    ) -> None:
        """Set the totals so far; redraw unless the last draw was a moment ago.

        The draw that reaches ``total`` rows is never skipped.
        """
        self.rows = rows
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.errors = errors
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay or (
            now - self._last_draw < self.interval and self.rows < self.total
        ):
            return
        with self._lock:
            self._last_draw = now
            self._draw(now)

    def line(self, now: float | None = None, *, final: bool = False) -> str:
        """The progress as one line of text (what the terminal shows).

        Examples
        --------
        >>> p = Progress(3, "filter on openai", mode="off", dollars=lambda: 1.5)
        >>> p.rows, p.prompt_tokens, p.cached_tokens = 1, 2_000, 500
        >>> p.line(p.start + 10)
        'semframe filter on openai: 1/3 rows | 2,000 prompt tok (25% cached) | $1.5000 | 0:10 elapsed | ETA 0:20'
        """  # noqa: E501
        now = time.monotonic() if now is None else now
        elapsed = now - self.start
        rate = self.rows / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.rows) / rate if rate > 0 else 0.0
        share = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        err = f" | {plural(self.errors, 'error')}" if self.errors else ""
        wait = ""
        if self.waiting is not None:
            count, longest = self.waiting()
            if count:
                wait = f" | {count:,} waiting"
                if longest >= 5:
                    wait += f" (longest {_clock(longest)})"
        spent = self.dollars() if self.dollars is not None else None
        money = "" if spent is None else f" | ${spent:,.4f}"
        rows = "row" if self.total == 1 else "rows"
        return (
            f"semframe {self.label}: {self.rows:,}/{self.total:,} {rows}{wait} | "
            f"{self.prompt_tokens:,} prompt tok ({share:.0%} cached){err}{money} | "
            f"{_clock(elapsed)} elapsed" + ("" if final else f" | ETA {_clock(eta)}")
        )

    def _draw(self, now: float, *, final: bool = False) -> None:
        text = self.line(now, final=final)
        if self.notebook is not None:
            view = ProgressView(text, self.rows, self.total)
            if self._handle is None:
                self._handle = self.notebook(view, display_id=True)
            else:
                self._handle.update(view)
        else:
            self.stream.write(f"\r{text}\x1b[K")
            self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Draw the final state if anything was drawn (and stop redrawing)."""
        with self._lock:
            self._closed.set()
            if self._drawn:
                self.waiting = None  # nothing is waiting any more
                self._draw(time.monotonic(), final=True)
                if self.notebook is None:
                    self.stream.write("\n")
                    self.stream.flush()
