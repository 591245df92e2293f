"""Result-cache keys: a digest of everything that determines an answer.

A request's key covers the backend's name, model and endpoint and the
rendered request (system message, prompt, ``max_tokens``, temperature, output
schema, logprobs asked for); never its position, row or group, and never a
credential. A call's key covers the backend and the call's plan fingerprint
(:func:`semframe.core.plan.fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from semframe.core.requests import Requests
from semframe.core.wire import Request

if TYPE_CHECKING:
    from semframe.backends.base import Backend
    from semframe.core.plan import Plan

__all__ = ["KEY_VERSION", "cacheable", "call_key", "plan_keys", "request_key", "request_keys"]

_CHUNK = 8192
"""Prompts rendered together while keys are computed."""

KEY_VERSION = "semframe-result-v2"
"""Part of every key: bump it when what a key covers changes."""


def cacheable(request: Request) -> bool:
    """Whether ``request`` is cached: only deterministic (temperature 0) requests are.

    Examples
    --------
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> cacheable(r), cacheable(r._replace(temperature=0.7))
    (True, False)
    """
    return request.temperature == 0


def call_key(backend: Backend, fingerprint: str) -> str:
    """The key of a call's entry: its plan ``fingerprint`` on ``backend`` (model, endpoint).

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> call_key(FakeBackend(), "ab") == call_key(FakeBackend(model="other"), "ab")
    False
    """
    base = [KEY_VERSION, "call", backend.name, backend.model, backend.endpoint]
    text = json.dumps([*base, fingerprint], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def request_key(backend: Backend, request: Request) -> str:
    """The cache key of ``request`` on ``backend``: a SHA-256 hex digest.

    It covers the backend name, model and ``base_url`` (when the backend has
    one) and the request's content and decoding parameters; not its position,
    row or prefix group, and never a credential.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> k = request_key(FakeBackend(), r)
    >>> len(k), k == request_key(FakeBackend(), r._replace(id=5, row=9, group=2))
    (64, True)
    >>> k == request_key(FakeBackend(model="other"), r)
    False
    """
    return request_keys(backend, [request])[0]


def request_keys(backend: Backend, requests: Sequence[Request]) -> list[str]:
    """:func:`request_key` of each of ``requests`` (fast for the requests of one plan).

    Everything but the prompt is hashed once per distinct combination, as JSON
    (which never holds a NUL byte); the prompt follows after a NUL, so distinct
    requests cannot collide by shifting text between fields.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> rs = [Request(i, i, f"p{i}", None, 8, 0.0, None, 0) for i in range(3)]
    >>> request_keys(FakeBackend(), rs)[2] == request_key(FakeBackend(), rs[2])
    True
    """
    heads: dict[tuple[Any, ...], Any] = {}
    keys: list[str] = []
    for r in requests:
        ident = (r.system, r.max_tokens, r.temperature, id(r.schema), r.logprobs)
        found = heads.get(ident)
        if found is None:  # the schema is held so that its id stays unique
            found = heads[ident] = (_head(backend, r), r.schema)
        digest = found[0].copy()
        digest.update(r.prompt.encode("utf-8", "surrogatepass"))
        keys.append(digest.hexdigest())
    return keys


def plan_keys(plan: Plan, backend: Backend) -> list[str | None]:
    """The cache key of each request of ``plan`` (``None``: not cacheable), in plan order."""
    requests = plan.requests
    if isinstance(requests, Requests):  # one set of decoding parameters: hash the prompts
        if not requests or not cacheable(requests[0]):  # every request is alike
            return [None] * len(requests)
        return list(_prompt_keys(backend, requests))
    wanted = [r for r in requests if cacheable(r)]
    if len(wanted) == len(plan.requests):
        return list(request_keys(backend, wanted))
    keys: list[str | None] = [None] * len(plan.requests)
    for r, key in zip(wanted, request_keys(backend, wanted), strict=True):
        keys[r.id] = key
    return keys


def _head(backend: Backend, request: Request) -> Any:
    """A hash of everything in ``request``'s key but its prompt, then the NUL before it."""
    schema = None if request.schema is None else json.dumps(request.schema, sort_keys=True)
    parts: list[Any] = [KEY_VERSION, backend.name, backend.model, backend.endpoint]
    parts.append(request.system)
    parts += [request.max_tokens, repr(float(request.temperature)), schema, request.logprobs]
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass") + b"\x00")


def _prompt_keys(backend: Backend, requests: Requests) -> Iterator[str]:
    """:func:`request_keys` of ``requests``, whose decoding parameters are shared.

    Prompts are rendered a chunk at a time and no request is built.
    """
    head = _head(backend, requests[0])
    for start in range(0, len(requests), _CHUNK):
        for prompt in requests.prompts(start, start + _CHUNK):
            digest = head.copy()
            digest.update(prompt.encode("utf-8", "surrogatepass"))
            yield digest.hexdigest()
