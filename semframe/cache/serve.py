"""Serving stored answers: look a plan's keys up, parse what is there, keep what parses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from semframe.cache.store import TOUCH_SECONDS, ResultCache, load_tokens
from semframe.core.parse import ParseError, accept
from semframe.core.plan import without_gc
from semframe.core.wire import Outcome, Usage

__all__ = ["Served", "serve_stored"]


class Served(NamedTuple):
    """What :func:`serve_stored` served: rows, their stored usage, keys due a touch."""

    rows: int
    usage: Usage
    stale: list[str]


@without_gc()  # a row and an outcome per key: nothing here forms a cycle
def serve_stored(
    cache: ResultCache,
    keys: Sequence[str | None],
    parse: Callable[[str], Any],
    outcomes: list[Outcome | None],
) -> Served:
    """Set ``outcomes[i]`` for each ``keys[i]`` whose answer ``cache`` holds and parses.

    Outcomes of keys not stored (or ``None``), or whose answer is not accepted
    (:func:`~semframe.core.parse.accept`: empty, or not parsing), stay as they
    are. Only answers that finished are stored (a kept cut answer is not), so
    a served answer is never marked as cut. Served entries last used more than
    :data:`~semframe.cache.store.TOUCH_SECONDS` ago are listed as stale.

    Raises
    ------
    sqlite3.Error
        When the cache cannot be read.
    """
    found = cache.rows([k for k in dict.fromkeys(keys) if k is not None])
    served = 0
    stale: list[str] = []
    p = c = w = o = 0
    if not found:
        return Served(0, Usage(), stale)
    stale_before = cache.clock() - TOUCH_SECONDS
    get = found.get
    for i, key in enumerate(keys):
        row = get(key)  # type: ignore[arg-type]  # None (not cacheable) is never found
        if row is None:
            continue
        text, tokens, prompt, cached, written, output, _, used = row
        try:
            value, _ = accept(parse, text, None)
        except ParseError:
            continue
        outcomes[i] = Outcome(
            value, text, None, None, 0, None if tokens is None else load_tokens(tokens)
        )
        served += 1
        if used < stale_before:
            stale.append(key)  # type: ignore[arg-type]
        p += prompt
        c += cached
        w += written
        o += output
    return Served(served, Usage(p, c, w, o), stale)
