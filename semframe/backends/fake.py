"""A deterministic backend that ships in the package: for tests, doctests and demos.

It answers without a model, records every request it receives, simulates a
per-slot prefix cache (so cached-token statistics behave like a real engine's),
and can be scripted to fail.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from semframe.backends.base import Capabilities
from semframe.core.parse import minimal_instance
from semframe.core.plan import common_prefix_len
from semframe.core.wire import Completion, Request, TokenLogprob, Usage
from semframe.cost.models import SlotCost
from semframe.errors import TransientError

DEFAULT_MODEL = "fake-model"

_POSITIVE = re.compile(
    r"\b(good|great|love[ds]?|best|excellent|wonderful|brilliant|delight\w*|yes|fun|"
    r"masterpiece|superb|enjoy\w*|positive)\b",
    re.IGNORECASE,
)


def _fake_tokens(text: str) -> int:
    """The fake tokenizer: one token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


TokenLogprobs = Callable[[Request, str], Sequence[TokenLogprob]]
"""``(request, answer text) -> tokens``: the fake's logprobs; the tokens must spell the text."""


def chunked_logprobs(logprob: float) -> TokenLogprobs:
    """Fake logprobs: the answer cut into 4-character tokens, each with ``logprob``.

    Examples
    --------
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> [tuple(t) for t in chunked_logprobs(-0.5)(r, '{"a": 1}')]
    [('{"a"', -0.5, ()), (': 1}', -0.5, ())]
    """

    def tokens(request: Request, text: str) -> list[TokenLogprob]:
        return [TokenLogprob(text[i : i + 4], logprob) for i in range(0, len(text), 4)]

    return tokens


def default_answer(request: Request) -> str:
    """The fake model's answer: keyword sentiment for yes/no, or a schema's instance.

    Without a schema the answer echoes the row's values.

    Examples
    --------
    >>> from semframe.core.parse import BOOL_SCHEMA
    >>> r = Request(0, 0, "Is [r] positive?\\n\\nr: a great film\\n", None, 8, 0.0,
    ...             BOOL_SCHEMA, 0)
    >>> default_answer(r)
    '{"answer": "yes"}'
    >>> schema = {"type": "object", "properties": {"year": {"type": "integer"}}}
    >>> default_answer(r._replace(schema=schema))
    '{"year": 0}'
    """
    body = request.prompt.rsplit("\n\n", 1)[-1]
    if request.schema is not None:
        answer = request.schema.get("properties", {}).get("answer", {})
        if set(answer.get("enum", ())) == {"yes", "no"}:
            return '{"answer": "yes"}' if _POSITIVE.search(body) else '{"answer": "no"}'
        return json.dumps(minimal_instance(request.schema, body))
    values = [line.split(": ", 1)[-1] for line in body.strip("\n").splitlines()]
    text = "fake: " + " | ".join(values)
    limit = max(request.max_tokens, 1) * 4
    return text if len(text) <= limit else text[: limit - 3] + "..."


class FakeBackend:
    """Deterministic in-process backend.

    Parameters
    ----------
    responder : callable, optional
        ``Request -> str``; defaults to :func:`default_answer`.
    max_concurrency : int
        Slots it pretends to have (each with its own prefix cache).
    context_window : int
        Context window in fake tokens (4 characters each).
    delay : float
        Seconds each answer takes (a stand-in for a model's latency; benchmarks).

    Attributes
    ----------
    history : list of Request
        Every request received, in arrival order.
    slots : list of int or None
        The slot hint each request of ``history`` came with.

    Examples
    --------
    >>> fake = FakeBackend()
    >>> fake.enqueue("scripted answer")
    >>> r = Request(0, 0, "Say hi to {n}\\n\\nn: Bob\\n", None, 8, 0.0, None, 0)
    >>> [fake.complete(r).text, fake.complete(r).text]
    ['scripted answer', 'fake: Bob']
    >>> len(fake.history)
    2
    """

    name = "fake"
    endpoint = None

    def __init__(
        self,
        responder: Callable[[Request], str] | None = None,
        *,
        model: str = DEFAULT_MODEL,
        max_concurrency: int = 1,
        context_window: int = 32768,
        json_schema: bool = True,
        delay: float = 0.0,
    ) -> None:
        self.model = model
        self.delay = delay
        self.responder = responder or default_answer
        self.capabilities = Capabilities(
            prefix_cache="per_slot",
            json_schema=json_schema,
            logprobs=False,
            max_concurrency=max_concurrency,
            context_window=context_window,
        )
        self.cost = SlotCost(self.model, self.count_tokens, max_concurrency, engine="fake")
        self.history: list[Request] = []
        self.slots: list[int | None] = []
        self._queue: deque[str | BaseException] = deque()
        self._slots: dict[int | None, str] = {}
        self._lock = threading.Lock()
        self.token_logprobs: TokenLogprobs | None = None

    def set_logprobs(self, logprobs: float | TokenLogprobs | None) -> None:
        """Make completions carry token logprobs (``None``: report none, the default).

        A float gives every 4-character token that logprob
        (:func:`chunked_logprobs`); a callable ``(request, text) -> tokens``
        scripts them. Only requests that ask (``Request.logprobs > 0``) get them.

        Examples
        --------
        >>> fake = FakeBackend()
        >>> fake.set_logprobs(-0.1)
        >>> fake.capabilities.logprobs
        True
        >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0, logprobs=5)
        >>> fake.enqueue("yes")
        >>> fake.complete(r).logprobs
        (-0.1,)
        """
        if isinstance(logprobs, int | float):
            logprobs = chunked_logprobs(float(logprobs))
        self.token_logprobs = logprobs
        self.capabilities = dataclasses.replace(self.capabilities, logprobs=logprobs is not None)

    def enqueue(self, *answers: str | BaseException) -> None:
        """Answer the next requests with ``answers`` (an exception is raised instead)."""
        self._queue.extend(answers)

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        """Answer one request; see :class:`semframe.backends.base.Backend`."""
        with self._lock:
            self.history.append(request)
            self.slots.append(slot)
            scripted = self._queue.popleft() if self._queue else None
            cached_prompt = self._slots.get(slot, "")
            self._slots[slot] = request.prompt
        if self.delay:
            time.sleep(self.delay)
        if isinstance(scripted, BaseException):
            raise scripted
        text = scripted if scripted is not None else self.responder(request)
        common = common_prefix_len(cached_prompt, request.prompt)
        tokens = None
        if request.logprobs and self.token_logprobs is not None:
            tokens = tuple(self.token_logprobs(request, text))
        return Completion(
            request.id,
            text,
            Usage(
                prompt_tokens=_fake_tokens(request.prompt),
                cached_tokens=common // 4,
                output_tokens=_fake_tokens(text),
            ),
            finish_reason="stop",
            logprobs=None if tokens is None else tuple(t.logprob for t in tokens),
            tokens=tokens,
        )

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Fake token counts: one per 4 characters."""
        return [_fake_tokens(t) for t in texts]

    def close(self) -> None:
        """Nothing to release."""


def flaky(answer: Callable[[Request], str], fail_rows: dict[int, int]) -> Callable[[Request], str]:
    """Wrap a responder so that row ``r`` fails ``fail_rows[r]`` times with a TransientError.

    Examples
    --------
    >>> respond = flaky(lambda r: "ok", {0: 1})
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> try:
    ...     respond(r)
    ... except TransientError as e:
    ...     print(e)
    injected failure for row 0
    >>> respond(r)
    'ok'
    """
    remaining = dict(fail_rows)
    lock = threading.Lock()

    def respond(request: Request) -> str:
        with lock:
            left = remaining.get(request.row, 0)
            if left:
                remaining[request.row] = left - 1
        if left:
            msg = f"injected failure for row {request.row}"
            raise TransientError(msg)
        return answer(request)

    return respond


def create(model: str | None, settings: Mapping[str, Any]) -> FakeBackend:
    """Factory used by ``backend="fake"``: one instance per model name (the registry keeps it).

    Sharing keeps ``history`` across calls, so a test or a demo can inspect what
    an operator sent.
    """
    return FakeBackend(model=model or DEFAULT_MODEL)
