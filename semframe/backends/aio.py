"""One background event loop for all asynchronous API work of the process.

Async SDK clients bind their connection pools to the event loop they first run
on, so semframe keeps them on a single long-lived loop in a daemon thread
(started on first use, never at import). Code on any thread, including a
notebook whose own loop is running, submits coroutines with :func:`run`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """The shared loop, started on first call."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            new = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(ready.set)
                new.run_forever()

            threading.Thread(target=serve, name="semframe-io", daemon=True).start()
            ready.wait()
            _loop = new
        return _loop


WAKE_SECONDS = 0.1
"""The waiting thread wakes this often, so that a signal handler (Ctrl-C) runs.

An untimed wait on a future can sleep through Ctrl-C: a library that installs
its own SIGINT handler with ``SA_RESTART`` (Polars does) makes the blocked
lock wait resume instead of returning to Python, and the interrupt is only
seen when the whole run has finished."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the shared loop and wait for its result.

    The wait wakes every :data:`WAKE_SECONDS`; Ctrl-C while waiting cancels the
    coroutine (its ``finally`` blocks run) before ``KeyboardInterrupt``
    propagates.

    Examples
    --------
    >>> async def answer() -> int:
    ...     return 42
    >>> run(answer())
    42
    """
    future = asyncio.run_coroutine_threadsafe(coro, loop())
    try:
        while not concurrent.futures.wait([future], timeout=WAKE_SECONDS).done:
            pass
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        with contextlib.suppress(BaseException):  # cancelled or failed: we stop either way
            future.result(timeout=10)
        raise
