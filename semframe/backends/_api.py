"""What the OpenAI and Anthropic backends share: errors, secrets, batching records.

The SDKs of both providers come from the same generator and raise the same
family of exceptions; :func:`classify_error` turns any of them into one of
semframe's three outcomes for a request:

- :class:`~semframe.errors.TransientError`: worth retrying (timeouts, connection
  errors, 408, 409, 429, 5xx, 529 and malformed responses), with the server's
  ``Retry-After`` when it sent one;
- :class:`~semframe.errors.RequestRejected`: this one prompt was refused (400,
  413, 422); retrying cannot help, the row gets the error and the run goes on;
- :class:`~semframe.errors.RunAborted`: every request would fail alike (401,
  402, 403, 404: a bad key, no credit, an unknown model); the run stops.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from semframe.backends import aio as _aio
from semframe.backends.base import Capabilities
from semframe.core.wire import Completion, RateLimits, Request
from semframe.cost.models import CostModel
from semframe.cost.tokens import count_for_model
from semframe.errors import RequestRejected, RunAborted, SemframeError, TransientError

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_FATAL_STATUS = frozenset({401, 402, 403, 404})
_KEYLIKE = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|AIza[A-Za-z0-9_\-]{35})\b"
)  # OpenAI, Anthropic, Google API keys


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove API keys from ``text``: the given secrets, and anything key-shaped.

    Examples
    --------
    >>> scrub("bad key sk-proj-abcdefghijkl given", [])
    'bad key *** given'
    >>> scrub("token=hunter2hunter2", ["hunter2hunter2"])
    'token=***'
    >>> scrub("key=AIzaSyA1234567890abcdefghijklmnopqrstuv.", [])
    'key=***.'
    """
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "***")
    return _KEYLIKE.sub("***", text)


def backoff(attempt: int, retry_after: float | None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential backoff with full jitter.

    ``Retry-After`` wins when given. Used by the executor and the API embedders.
    """
    if retry_after is not None:
        return max(0.0, retry_after)
    return float(random.uniform(0, min(30.0, 0.5 * 2 ** (attempt - 1))))


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``retry-after``).

    Examples
    --------
    >>> retry_after({"retry-after-ms": "1500"}), retry_after({"retry-after": "2"})
    (1.5, 2.0)
    >>> retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    True
    """
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if 0 <= value <= 600:
            return value
    return None


_DURATION = re.compile(
    r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?"
    r"(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?"
)
# (prefix, suffix) of each provider's header family, tried in order: OpenAI's
# ``x-ratelimit-remaining-tokens``, Anthropic's ``anthropic-ratelimit-tokens-remaining``
# (its ``tokens-*`` family reports the most restrictive of the input and output
# token limits; ``input-tokens-*`` is read when it is absent).
_FAMILIES = (
    ("requests", ("x-ratelimit-{}-requests", "anthropic-ratelimit-requests-{}")),
    (
        "tokens",
        (
            "x-ratelimit-{}-tokens",
            "anthropic-ratelimit-tokens-{}",
            "anthropic-ratelimit-input-tokens-{}",
        ),
    ),
)
_FIELD = {"limit": "limit", "remaining": "left", "reset": "reset_s"}


def _seconds(raw: str, now: datetime | None) -> float | None:
    """A reset header as seconds from now: ``6m0s`` / ``20ms`` (OpenAI) or RFC 3339 (Anthropic)."""
    raw = raw.strip()
    match = _DURATION.fullmatch(raw)
    if match and any(match.groups()):
        h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
        return h * 3600 + m * 60 + s + ms / 1000
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        try:
            return max(0.0, float(raw))
        except ValueError:
            return None
    if when.tzinfo is None:
        return None
    reference = now or datetime.now(when.tzinfo)
    return max(0.0, (when - reference).total_seconds())


def rate_limits(headers: Mapping[str, str] | None) -> RateLimits | None:
    """The rate-limit state a response's headers report, or ``None`` when they report none.

    Reads OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
    (resets as durations) and Anthropic's ``anthropic-ratelimit-*`` (resets as
    RFC 3339 times, taken against the response's own ``date`` when given).

    Examples
    --------
    >>> seen = rate_limits({"x-ratelimit-limit-requests": "60",
    ...     "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "1s",
    ...     "x-ratelimit-reset-tokens": "6m0s"})
    >>> seen.requests_limit, seen.requests_left, seen.requests_reset_s, seen.tokens_reset_s
    (60, 59, 1.0, 360.0)
    >>> rate_limits({"anthropic-ratelimit-tokens-remaining": "0",
    ...              "anthropic-ratelimit-tokens-reset": "2026-11-23T12:00:30Z",
    ...              "date": "Mon, 23 Nov 2026 12:00:00 GMT"}).tokens_reset_s
    30.0
    >>> rate_limits({"content-type": "application/json"}) is None
    True
    """
    if not headers:
        return None
    now = None
    if headers.get("date"):
        try:
            now = parsedate_to_datetime(headers["date"])
        except (TypeError, ValueError):
            now = None
    found: dict[str, float | int] = {}
    for kind, patterns in _FAMILIES:
        for pattern in patterns:
            for header, field in _FIELD.items():
                raw = headers.get(pattern.format(header))
                name = f"{kind}_{field}"
                if raw is None or name in found:
                    continue
                if header == "reset":
                    value = _seconds(raw, now)
                    if value is not None:
                        found[name] = value
                else:
                    try:
                        found[name] = int(float(raw))
                    except ValueError:
                        continue
    if not found:
        return None
    return RateLimits(**found)  # type: ignore[arg-type]


def classify_error(
    exc: BaseException, *, provider: str, secrets: Iterable[str | None]
) -> Exception:
    """Map an SDK exception to a semframe error (see the module docs).

    Anything that is not an SDK error comes back unchanged.
    """
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    detail = scrub(_message(exc), secrets)
    if name == "APITimeoutError" or isinstance(exc, TimeoutError):
        return TransientError(
            f"{provider}: request timed out ({detail})", maybe_billed=_was_sent(exc)
        )
    if name == "APIConnectionError":
        return TransientError(
            f"{provider}: connection failed ({detail})", maybe_billed=_was_sent(exc)
        )
    if name == "APIResponseValidationError" or isinstance(exc, json.JSONDecodeError):
        # The provider answered (and billed); the body could not be read.
        return TransientError(f"{provider}: malformed response ({detail})", maybe_billed=True)
    if isinstance(status, int):
        headers = getattr(getattr(exc, "response", None), "headers", None)
        text = f"{provider}: HTTP {status}: {detail}"
        if status in _RETRYABLE_STATUS or status >= 500:
            return TransientError(
                text, retry_after=retry_after(headers), rate_limited=status == 429
            )
        if status in _FATAL_STATUS:
            return RunAborted(text + _fatal_hint(status, provider))
        return RequestRejected(text)
    return exc if isinstance(exc, Exception) else SemframeError(detail)


_NOT_SENT = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "ConnectionRefusedError"})
"""Transport errors raised before a request reached the server: nothing can be billed."""


def _was_sent(exc: BaseException) -> bool:
    """Whether a connection error or timeout may have come after the provider got the request.

    The SDKs wrap the transport's error (its ``__cause__``): failing to connect
    means nothing was sent; a connection dropped while reading the answer, or
    a read timeout, means the provider may have answered, and billed.
    """
    cause = exc.__cause__
    while cause is not None:
        if type(cause).__name__ in _NOT_SENT:
            return False
        cause = cause.__cause__
    return True


PROBE_SECONDS = 60.0
"""An endpoint that answered a probe is not probed again for this long."""
PROBE_TIMEOUT = 5.0
"""Seconds a probe of the endpoint may take."""


def _message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return str(exc) or type(exc).__name__


def _fatal_hint(status: int, provider: str) -> str:
    env = "OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY"
    if status == 401:
        return f". Check the API key ({env}, or the client you passed)."
    if status == 404:
        return ". Check the model name and base_url."
    return ""


class ApiBackend:
    """What both API backends share: the sync entry point, token counts, SDK calls.

    Subclasses set ``name``, ``model``, ``endpoint`` (the client's base URL),
    ``capabilities``, ``cost``, ``_client`` (an SDK client with semframe's
    timeout and no SDK retries), ``_async`` (whether it is the async client)
    and ``_secrets`` (its keys, to scrub from errors), and implement
    :meth:`acomplete`.
    """

    name: str
    model: str
    endpoint: str | None
    capabilities: Capabilities
    cost: CostModel
    _client: Any
    _async: bool
    _secrets: tuple[str | None, ...]
    _owns_client: bool = False  # built here (closed here), not passed in by the caller
    _reached_at: float | None = None  # when the endpoint last answered a probe

    async def acomplete(self, request: Request) -> Completion:
        """Send one request; raise semframe's error types on failure."""
        raise NotImplementedError

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        """Send one request and wait for it (the executor awaits :meth:`acomplete`)."""
        return _aio.run(self.acomplete(request))

    def close(self) -> None:
        """Close the connections of a client semframe built (a client you passed stays open)."""
        if not self._owns_client:
            return
        if self._async:
            _aio.run(self._client.close())
        else:
            self._client.close()

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Offline counts (exact for OpenAI models, approximate for Claude)."""
        return list(count_for_model(texts, self.model).tokens)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call an SDK method (sync ones in a thread); SDK errors become semframe's.

        When a request cannot even connect, the endpoint is probed once: if
        it cannot be reached either, the run stops at once naming the URL
        (a wrong ``base_url``, a server that is not running) instead of every
        row failing after its retries.
        """
        return await self._guarded(self._send(fn, *args, **kwargs))

    async def _call_raw(self, raw: Any, **kwargs: Any) -> tuple[Any, RateLimits | None]:
        """Call an SDK method's ``with_raw_response`` form: ``(parsed response, rate limits)``.

        Same error handling as :meth:`_call` (a body that does not parse
        included); the headers give the account's rate-limit state, which the
        executor paces the run by.
        """

        async def send() -> tuple[Any, RateLimits | None]:
            response = await self._send(raw, **kwargs)
            parsed = response.parse()
            if inspect.isawaitable(parsed):  # the Anthropic SDK's async raw response
                parsed = await parsed
            headers = getattr(response, "headers", None)
            return parsed, rate_limits(dict(headers) if headers is not None else None)

        result: tuple[Any, RateLimits | None] = await self._guarded(send())
        return result

    async def _send(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._async:
            return await fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _guarded(self, call: Any) -> Any:
        """Await ``call``; an SDK error becomes semframe's (see :meth:`_call`)."""
        try:
            return await call
        except Exception as exc:
            error = classify_error(exc, provider=self.name, secrets=self._secrets)
            if isinstance(error, TransientError) and not _was_sent(exc):
                await self._check_reachable(error)
            raise error from None

    async def _check_reachable(self, error: TransientError) -> None:
        """Raise :class:`RunAborted` naming the endpoint when nothing answers there."""
        now = time.monotonic()
        if self._reached_at is not None and now - self._reached_at < PROBE_SECONDS:
            return
        probe = self._client.with_options(timeout=PROBE_TIMEOUT)
        try:
            if self._async:
                await probe.models.list()
            else:
                await asyncio.to_thread(probe.models.list)
        except Exception as exc:
            if type(exc).__name__ in ("APIConnectionError", "APITimeoutError"):
                msg = (
                    f"{self.name}: cannot reach {self.endpoint} ({error}). Check base_url, "
                    "and that the server there is running."
                )
                raise RunAborted(msg) from None
        self._reached_at = time.monotonic()  # it answered (any HTTP status): a glitch


def custom_id(request_id: int) -> str:
    """Batch custom id of the request at plan position ``request_id``."""
    return f"r{request_id}"


def request_id_of(custom: str) -> int | None:
    """Inverse of :func:`custom_id`; ``None`` for ids semframe did not make."""
    if custom.startswith("r") and custom[1:].isdigit():
        return int(custom[1:])
    return None


def jsonable(obj: Any) -> Any:
    """A pydantic SDK object (or plain data) as plain JSON data."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return obj
