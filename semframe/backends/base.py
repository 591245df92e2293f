"""The one narrow backend protocol and the plain data that crosses it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

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


class Completion(NamedTuple):
    """A backend's answer to one request.

    ``logprobs`` holds the generated tokens' log probabilities and ``tokens``
    the same tokens with their text and top alternatives, when the request
    asked for them (``Request.logprobs``) and the backend gives them.
    """

    request_id: int
    text: str
    usage: Usage
    finish_reason: str | None = None
    logprobs: tuple[float, ...] | None = None
    tokens: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do; the executor reads these instead of type checks.

    Attributes
    ----------
    prefix_cache : {"none", "per_slot", "shared"}
        Where prefix reuse happens: nowhere, in a per-slot KV cache (llama.cpp:
        route a prefix group to one slot), or in one shared cache (vLLM, APIs).
    json_schema : bool
        Whether ``Request.schema`` constrains decoding.
    logprobs : bool
        Whether completions carry token logprobs.
    max_concurrency : int
        Requests the backend serves at once.
    context_window : int or None
        Tokens per request (prompt + output), when known.
    relquery_aware : bool
        The engine schedules by relQuery (our scheduler inside vLLM): the
        executor tags each request with its run's identity and size
        (``Request.rel``, ``Request.rel_size``).
    """

    prefix_cache: Literal["none", "per_slot", "shared"] = "none"
    json_schema: bool = False
    logprobs: bool = False
    max_concurrency: int = 1
    context_window: int | None = None
    relquery_aware: bool = False


@runtime_checkable
class Backend(Protocol):
    """What the executor needs from an LLM engine or API."""

    name: str
    model: str
    capabilities: Capabilities

    def generate(
        self, requests: Sequence[Request], *, slot: int | None = None
    ) -> Iterator[Completion]:
        """Answer ``requests`` in order, one completion each.

        ``slot`` is a routing hint: requests given the same slot should be
        served by the same cache (a llama.cpp slot, a cache key). A request that
        fails in a retryable way raises :class:`semframe.errors.TransientError`.
        """
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts of ``texts`` under the backend's tokenizer."""
        ...
