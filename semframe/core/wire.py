"""The plain data of one request's life: what is sent, what comes back, what it became.

A :class:`Request` is rendered by the planner (:mod:`semframe.core.plan`),
answered by a backend with a :class:`Completion` (with its :class:`Usage`
and, when asked for, :class:`TokenLogprob` tokens), and ends as an
:class:`Outcome`: a parsed value, or why there is none.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

# Request, Usage and Completion are immutable NamedTuples rather than frozen
# dataclasses: one of each is made per row, and a frozen dataclass costs several
# times more to build (100,000-row relQueries are routine).


class Request(NamedTuple):
    """One prompt of a relQuery, as the planner rendered it.

    Attributes
    ----------
    id : int
        Position in execution order (``Plan.requests[id]``).
    row : int
        Position of the row in the caller's frame.
    prompt : str
        The user message: shared instructions, then the row's labeled fields.
    system : str or None
        Optional system message (shared by the whole relQuery).
    max_tokens : int
        Upper bound on generated tokens.
    temperature : float
        Sampling temperature.
    schema : mapping or None
        JSON schema the answer must follow, for backends that constrain decoding.
    group : int
        Prefix group: consecutive requests sharing their leading field.
    prefix : tuple of (int, int)
        Cacheable prefixes of ``prompt``, shortest first: ``(end, shared_by)``
        means ``prompt[:end]`` (whole labeled segments) is the start of
        ``shared_by`` consecutive requests including this one. The first is the
        instruction block, shared by the whole relQuery. API backends place
        cache breakpoints here.
    logprobs : int
        Top alternatives per generated token to report (0: no logprobs).
    rel : str
        The relQuery run this request belongs to, for engines that schedule by
        relQuery (set by the executor when the backend is ``relquery_aware``).
    rel_size : int
        Requests in that run.
    """

    id: int
    row: int
    prompt: str
    system: str | None
    max_tokens: int
    temperature: float
    schema: Mapping[str, Any] | None
    group: int
    prefix: tuple[tuple[int, int], ...] = ()
    logprobs: int = 0
    rel: str = ""
    rel_size: int = 0

    def messages(self) -> list[dict[str, str]]:
        """Chat messages for this request (system first, when given)."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        msgs.append({"role": "user", "content": self.prompt})
        return msgs


class Usage(NamedTuple):
    """Token usage of one completion, as the backend reported it."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0


class TokenLogprob(NamedTuple):
    """One generated token with its log probability and the top alternatives.

    ``top`` holds ``(token, logprob)`` pairs as the backend reported them (the
    chosen token usually among them); empty when none were asked for.
    """

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


class RateLimits(NamedTuple):
    """The provider's rate-limit state, as its response headers stated it.

    ``*_limit`` is the account's limit, ``*_left`` what remains of it and
    ``*_reset_s`` the seconds until it is fully replenished; ``None`` where the
    response did not say. Tokens are the provider's own measure (OpenAI counts
    a request's estimated prompt plus ``max_tokens`` when it arrives).
    """

    requests_limit: int | None = None
    requests_left: int | None = None
    requests_reset_s: float | None = None
    tokens_limit: int | None = None
    tokens_left: int | None = None
    tokens_reset_s: float | None = None


class Completion(NamedTuple):
    """A backend's answer to one request.

    ``logprobs`` holds the generated tokens' log probabilities and ``tokens``
    the same tokens with their text and top alternatives, when the request
    asked for them (``Request.logprobs``) and the backend gives them.
    ``limits`` is the rate-limit state the response's headers reported.
    """

    request_id: int
    text: str
    usage: Usage
    finish_reason: str | None = None
    logprobs: tuple[float, ...] | None = None
    tokens: tuple[TokenLogprob, ...] | None = None
    limits: RateLimits | None = None


class Outcome(NamedTuple):
    """What became of one request: a parsed value, or why there is none.

    Attributes
    ----------
    value : object
        The parsed answer (``None`` when ``error`` is set).
    raw : str or None
        The raw answer text of the last attempt.
    error_kind : str or None
        ``"parse"`` or ``"backend"`` when the row failed.
    error : str or None
        Detail of the failure.
    attempts : int
        Times the request was sent.
    logprobs : tuple of TokenLogprob or None
        The answer's tokens with their log probabilities, when the request asked
        for them and the backend gave them.
    """

    value: Any
    raw: str | None
    error_kind: str | None
    error: str | None
    attempts: int
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def ok(self) -> bool:
        """Whether the row has a value."""
        return self.error_kind is None


class Answered(Sequence[Outcome]):
    """The outcomes of rows that all have a value, held as columns.

    What a re-run served whole from the result cache gives: a row's
    :class:`Outcome` (no error, no attempt) is made only when it is read, so
    a million served rows are two lists, not a million tuples. Consumers
    that want the values alone read :attr:`values` (:func:`values_of`).

    Attributes
    ----------
    values : list
        Each row's parsed answer.
    raws : list of str
        Each row's raw answer text.
    logprobs : list or None
        Each row's tokens with their log probabilities (``None`` entries where
        there are none); ``None`` when no row has any.

    Examples
    --------
    >>> served = Answered(["A slow film."], [" A slow film. "])
    >>> served[0].value, served[0].raw, served[0].ok, served[0].attempts
    ('A slow film.', ' A slow film. ', True, 0)
    >>> len(served), values_of(served)
    (1, ['A slow film.'])
    """

    __slots__ = ("logprobs", "raws", "values")

    def __init__(
        self,
        values: list[Any],
        raws: list[str],
        logprobs: list[tuple[TokenLogprob, ...] | None] | None = None,
    ) -> None:
        if len(raws) != len(values) or (logprobs is not None and len(logprobs) != len(values)):
            msg = "internal error: an Answered's columns differ in length"
            raise ValueError(msg)
        self.values = values
        self.raws = raws
        self.logprobs = logprobs

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> Outcome: ...

    @overload
    def __getitem__(self, index: slice) -> list[Outcome]: ...

    def __getitem__(self, index: int | slice) -> Outcome | list[Outcome]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        tokens = None if self.logprobs is None else self.logprobs[index]
        return Outcome(self.values[index], self.raws[index], None, None, 0, tokens)

    def __iter__(self) -> Iterator[Outcome]:
        tokens = self.logprobs if self.logprobs is not None else itertools.repeat(None)
        new = tuple.__new__  # an Outcome without its Python-level __new__ frame
        for value, raw, lp in zip(self.values, self.raws, tokens, strict=False):
            yield new(Outcome, (value, raw, None, None, 0, lp))


def values_of(outcomes: Sequence[Outcome]) -> list[Any]:
    """Each outcome's value (``None`` where the row failed).

    Of an :class:`Answered`, its values, without making an outcome per row.
    """
    if isinstance(outcomes, Answered):
        return list(outcomes.values)
    return [o.value for o in outcomes]


def failed(outcomes: Sequence[Outcome]) -> list[int]:
    """Positions of the outcomes that have an error (none in an :class:`Answered`)."""
    if isinstance(outcomes, Answered):
        return []
    return [i for i, o in enumerate(outcomes) if o.error_kind is not None]
