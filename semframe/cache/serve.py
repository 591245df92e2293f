"""Serving stored answers: look a plan's keys up, parse what is there, keep what parses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

from semframe.cache.store import TOUCH_SECONDS, ResultCache, load_tokens
from semframe.core.parse import ParseError, accept
from semframe.core.plan import without_gc
from semframe.core.wire import Outcome, Usage

__all__ = ["Served", "serve_answers", "serve_stored"]


class Served(NamedTuple):
    """What :func:`serve_stored` served: rows, their stored usage, keys due a touch."""

    rows: int
    usage: Usage
    stale: list[str]


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
    found = cache.rows([k for k in keys if k is not None])  # it reads each key once
    if not found:
        return Served(0, Usage(), [])
    answers = list(map(found.get, keys))  # type: ignore[arg-type]  # None is never found
    rows, usage, stale = serve_answers(answers, parse, outcomes, cache.clock() - TOUCH_SECONDS)
    return Served(rows, usage, [cast("str", keys[i]) for i in stale])


@without_gc()  # an outcome per answer: nothing here forms a cycle
def serve_answers(
    answers: Sequence[tuple[Any, ...] | None],
    parse: Callable[[str], Any],
    outcomes: list[Outcome | None],
    stale_before: float,
) -> tuple[int, Usage, list[int]]:
    """Set ``outcomes[i]`` from ``answers[i]`` (an entry as :meth:`ResultCache.rows` gives it).

    What :func:`serve_stored` does once the entries are read. Returns how
    many were served, their stored usage, and the positions of those last
    used before ``stale_before``.
    """
    served = 0
    stale: list[int] = []
    p = c = w = o = 0
    new, check = tuple.__new__, accept  # an Outcome without its Python-level __new__ frame
    for i, row in enumerate(answers):
        if row is None:
            continue
        text, tokens, prompt, cached, written, output, _, used, _ = row
        try:
            value = check(parse, text, None)[0]
        except ParseError:
            continue
        logprobs = None if tokens is None else load_tokens(tokens)
        outcomes[i] = new(Outcome, (value, text, None, None, 0, logprobs))
        served += 1
        if used < stale_before:
            stale.append(i)
        p += prompt
        c += cached
        w += written
        o += output
    return served, Usage(p, c, w, o), stale
