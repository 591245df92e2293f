"""Serving stored answers: look a plan's keys up, parse what is there, keep what parses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

from semframe.cache.keys import Keys
from semframe.cache.store import TOUCH_SECONDS, ResultCache, load_tokens
from semframe.core.parse import TEXT, ParseError
from semframe.core.plan import without_gc
from semframe.core.wire import Answered, Outcome, TokenLogprob, Usage

__all__ = ["Served", "Serving", "serve_stored"]


class Served(NamedTuple):
    """What :func:`serve_stored` served: rows, their stored usage, keys due a touch."""

    rows: int
    usage: Usage
    stale: list[str]


@without_gc()  # the entries read and an outcome per answer: nothing here forms a cycle
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
    keys = Keys.of(keys)
    digests, at = keys.present()
    serving = Serving(parse, len(outcomes), cache.clock() - TOUCH_SECONDS)
    if digests:
        position = at.tolist()  # among the keys present -> in ``keys``
        cache.read_answers(digests, lambda pairs: serving.take((position[i], e) for i, e in pairs))
        serving.into(outcomes)
    return Served(serving.rows, serving.usage, [cast("str", keys[i]) for i in serving.stale])


class Serving:
    """Answers served from stored entries, a chunk of ``(position, entry)`` pairs at a time.

    What :func:`serve_stored` and a re-run (:meth:`ResultCache.read_answers`)
    do with the entries they read: each entry (as
    :meth:`ResultCache.read_answers` gives it) whose answer is accepted
    (:func:`~semframe.core.parse.accept`) is the answer of row ``position``.
    The answers are kept as columns (:meth:`answered`, :meth:`into`); it
    counts the rows served, sums their stored usage and lists the positions of
    those last used before ``stale_before``. Without ``usage``, the entries
    were read without their usage (``text, tokens, last used, key``; a
    re-run whose call entry records it) and none is summed.

    Examples
    --------
    >>> from semframe.core.parse import TEXT
    >>> serving = Serving(TEXT.parse, 3, stale_before=100.0)
    >>> serving.take([(2, ("late", None, 9, 4, 0, 2, 50.0, b"k")),
    ...               (0, (" ", None, 9, 0, 0, 1, 150.0, b"j"))])  # empty: not served
    >>> serving.values, serving.rows, serving.stale
    ([None, None, 'late'], 1, [2])
    >>> serving.usage
    Usage(prompt_tokens=9, cached_tokens=4, cache_write_tokens=0, output_tokens=2)
    """

    __slots__ = (
        "_usage",
        "logprobs",
        "parse",
        "raws",
        "rows",
        "stale",
        "stale_before",
        "usage_read",
        "values",
    )

    def __init__(
        self, parse: Callable[[str], Any], n: int, stale_before: float, *, usage: bool = True
    ) -> None:
        self.parse = parse
        self.usage_read = usage
        self.values: list[Any] = [None] * n
        self.raws: list[str | None] = [None] * n
        self.logprobs: list[tuple[TokenLogprob, ...] | None] | None = None  # made when needed
        self.stale_before = stale_before
        self.rows = 0
        self.stale: list[int] = []
        self._usage = [0, 0, 0, 0]

    @property
    def usage(self) -> Usage:
        """The stored usage of the rows served."""
        return Usage(*self._usage)

    def take(self, pairs: Iterable[tuple[int, tuple[Any, ...]]]) -> None:
        """Serve the entries of ``pairs`` (``(position, entry)``) that are accepted.

        A stored answer has no finish reason (only finished answers are
        stored), so :func:`~semframe.core.parse.accept` comes down to: an
        empty answer is not served, any other is parsed. Its callers
        pause the cyclic garbage collector around reading the entries and
        taking them (:func:`~semframe.core.plan.without_gc`).
        """
        served = 0
        stale = self.stale
        values, raws, parse, stale_before = self.values, self.raws, self.parse, self.stale_before
        p = c = w = o = 0
        plain = parse is TEXT.parse  # free text: the answer stripped is its value
        lean = not self.usage_read
        for i, row in pairs:
            if lean:
                text, tokens, used, _ = row
            else:
                text, tokens, prompt, cached, written, output, used, _ = row
            stripped = text.strip()
            if not stripped:
                continue
            if plain:
                values[i] = stripped
            else:
                try:
                    values[i] = parse(text)
                except ParseError:
                    continue
            raws[i] = text
            if tokens is not None:
                if self.logprobs is None:
                    self.logprobs = [None] * len(values)
                self.logprobs[i] = load_tokens(tokens)
            served += 1
            if used < stale_before:
                stale.append(i)
            if lean:
                continue
            p += prompt
            c += cached
            w += written
            o += output
        self.rows += served
        total = self._usage
        total[0] += p
        total[1] += c
        total[2] += w
        total[3] += o

    def answered(self) -> Answered:
        """Every row's answer, when every row was served (:attr:`rows` is their number)."""
        if self.rows != len(self.values):  # pragma: no cover - callers check first
            msg = f"internal error: {self.rows} of {len(self.values)} rows were served"
            raise RuntimeError(msg)
        return Answered(self.values, cast("list[str]", self.raws), self.logprobs)

    def into(self, outcomes: list[Outcome | None]) -> None:
        """Set ``outcomes[i]`` for each row ``i`` served (no error, no attempt)."""
        lp = self.logprobs
        for i, raw in enumerate(self.raws):
            if raw is not None:
                tokens = None if lp is None else lp[i]
                outcomes[i] = Outcome(self.values[i], raw, None, None, 0, tokens)
