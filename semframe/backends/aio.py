"""One background event loop for all asynchronous API work of the process.

Async SDK clients bind their connection pools to the event loop they first run
on, so semframe keeps them on a single long-lived loop in a daemon thread
(started on first use, never at import). Code on any thread, including a
notebook whose own loop is running, submits coroutines with :func:`run`.
"""

from __future__ import annotations

import asyncio
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


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the shared loop and wait for its result.

    Ctrl-C while waiting cancels the coroutine (its ``finally`` blocks run)
    before ``KeyboardInterrupt`` propagates.

    Examples
    --------
    >>> async def answer() -> int:
    ...     return 42
    >>> run(answer())
    42
    """
    future = asyncio.run_coroutine_threadsafe(coro, loop())
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        with contextlib.suppress(BaseException):  # cancelled or failed: we stop either way
            future.result(timeout=10)
        raise
