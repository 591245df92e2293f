"""``backend="gemini"``: the Gemini API through the official ``google-genai`` SDK.

Gemini 2.5 and later cache prompt prefixes implicitly: a request that starts
like a recent one (at least 2,048 tokens on 2.5 models, 4,096 on 3.x) is
billed 10% of the input price for the part served from cache
(``usage_metadata.cached_content_token_count``, part of
``prompt_token_count``). There is no routing or cache key: the order of
requests alone decides hits, so GGR's order and group-aware dispatch (a
group's followers sent once its leader is answered; the run's first request
alone) are what semframe can do, and it does them.

Explicit caches (``client.caches.create``, then ``cached_content=``) guarantee
the discount but cost their creation (the cached tokens at the input price)
and their storage for the TTL. semframe puts a relQuery's shared instructions
(and system prompt) in one only where that pays: when they reach the model's
minimum and enough requests will read the cache before it expires. The rule
is the backend's cost model's (:meth:`semframe.cost.models.GeminiCost.explicit_cache`),
so the estimator prices exactly the caches a run creates. Caches live for the
``cache_ttl`` setting (5 minutes or 1 hour; a new one replaces a cache about to
expire) and are deleted when the backend is closed; storage is billed for the
whole TTL either way.

Batch mode (``batch=True``) uses Gemini's batch API with inline requests: 50%
off, but the discount does not stack with caching (a cached token costs the
cache price), and batch requests take no explicit caches.

Keys come from ``GOOGLE_API_KEY`` or ``GEMINI_API_KEY`` (the SDK's order) or a
``google.genai.Client`` you pass; they never appear in reprs, errors or logs.
Token counts are approximate (o200k): Google publishes no offline tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from semframe.backends import aio as _aio
from semframe.backends._api import (
    PROBE_SECONDS,
    PROBE_TIMEOUT,
    ApiBackend,
    custom_id,
    request_id_of,
    retry_after,
    scrub,
)
from semframe.backends.base import DEFAULT_TIMEOUT, BatchResult, BatchStatus, Capabilities
from semframe.core.wire import Completion, Request, Usage
from semframe.cost.models import TTL_SECONDS, GeminiCost, cache_key, gemini_cost
from semframe.errors import (
    ConfigError,
    MissingDependencyError,
    RequestRejected,
    RunAborted,
    SemframeError,
    TransientError,
)

DEFAULT_MODEL = "gemini-2.5-flash"
MAX_CONCURRENCY = 32
"""Requests in flight when the ``max_concurrency`` setting does not say."""
BATCH_LIMIT = 1_000
"""Requests per batch job (inline requests; Google caps their total size at 20 MB)."""
BATCH_BYTES = 20_000_000
"""Largest inline batch request Google accepts, in bytes."""
CONTEXT_WINDOW = 1_048_576
"""Input tokens of the Gemini 2.5 and 3 models."""
KEYS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
"""Environment variables holding the key, in the SDK's order of precedence."""

_RETRYABLE = frozenset({408, 409, 429})
_FATAL = frozenset({401, 402, 403, 404})
_NOT_SENT = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "ConnectionRefusedError"})
_DONE_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})


def _require() -> tuple[Any, Any, Any]:
    """``(google.genai, google.genai.types, httpx)``."""
    try:
        import httpx
        from google import genai
        from google.genai import types
    except ImportError:
        msg = "backend 'gemini' needs the google-genai SDK: pip install 'semframe[gemini]'"
        raise MissingDependencyError(msg) from None
    return genai, types, httpx


def _connect_bounded(httpx: Any, connect_timeout: float) -> Any:
    """An ``httpx.AsyncClient`` whose requests wait at most ``connect_timeout`` to connect.

    The SDK sets one total timeout per request; this keeps it for reading
    and bounds the connection phase the way the other API backends do.
    """

    class Bounded(httpx.AsyncClient):  # type: ignore[misc]
        def build_request(self, *args: Any, **kwargs: Any) -> Any:
            request = super().build_request(*args, **kwargs)
            timeout = dict(request.extensions.get("timeout") or {})
            current = timeout.get("connect")
            timeout["connect"] = (
                connect_timeout if current is None else min(current, connect_timeout)
            )
            request.extensions["timeout"] = timeout
            return request

    return Bounded(timeout=httpx.Timeout(None, connect=connect_timeout))


def _status_word(state: Any) -> str:
    """``JobState.JOB_STATE_SUCCEEDED`` (or its string) as ``"succeeded"``."""
    raw = str(getattr(state, "value", state) or "unknown")
    for prefix in ("JOB_STATE_", "BATCH_STATE_"):
        raw = raw.removeprefix(prefix)
    return raw.lower()


def _retry_delay(details: Any) -> float | None:
    """Seconds from a Google error's ``RetryInfo`` detail (``"retryDelay": "30s"``), if any."""
    error = details.get("error", details) if isinstance(details, Mapping) else None
    items = error.get("details") if isinstance(error, Mapping) else None
    for item in items if isinstance(items, list) else []:
        delay = item.get("retryDelay") if isinstance(item, Mapping) else None
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                seconds = float(delay[:-1])
            except ValueError:
                continue
            if 0 <= seconds <= 600:
                return seconds
    return None


def _reason(details: Any) -> str | None:
    """The ``ErrorInfo`` reason of a Google error (``API_KEY_INVALID``...), if any."""
    error = details.get("error", details) if isinstance(details, Mapping) else None
    items = error.get("details") if isinstance(error, Mapping) else None
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("reason"), str):
            return str(item["reason"])
    return None


def _sent(exc: BaseException) -> bool:
    """Whether a transport error may have come after the request reached Google."""
    cause: BaseException | None = exc
    while cause is not None:
        if type(cause).__name__ in _NOT_SENT:
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def classify_error(exc: BaseException, *, secrets: Sequence[str | None] = ()) -> Exception:
    """Map a ``google-genai`` (or httpx) exception to a semframe error.

    - 408, 409, 429 and 5xx, timeouts, dropped connections and unreadable
      answers: :class:`~semframe.errors.TransientError` (429 with the delay
      Google asks for, from ``Retry-After`` or its ``RetryInfo`` detail);
    - 401, 402, 403, 404, and a 400 saying the key is invalid
      (``API_KEY_INVALID``): :class:`~semframe.errors.RunAborted`;
    - other 4xx: :class:`~semframe.errors.RequestRejected` (this row only).

    Anything else comes back unchanged. Keys are scrubbed from every message.

    Examples
    --------
    >>> from google.genai import errors
    >>> body = {"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}
    >>> e = classify_error(errors.ClientError(429, body))
    >>> type(e).__name__, e.rate_limited
    ('TransientError', True)
    >>> bad = {"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT",
    ...                  "details": [{"reason": "API_KEY_INVALID"}]}}
    >>> type(classify_error(errors.ClientError(400, bad))).__name__
    'RunAborted'
    >>> type(classify_error(errors.ClientError(400, {"error": {"message": "too long"}}))).__name__
    'RequestRejected'
    """
    name = type(exc).__name__
    code = getattr(exc, "code", None)
    if isinstance(code, int) and hasattr(exc, "details"):  # google.genai.errors.APIError
        details = getattr(exc, "details", None)
        message = getattr(exc, "message", None) or str(exc)
        status = getattr(exc, "status", None)
        text = scrub(f"gemini: HTTP {code}{f' {status}' if status else ''}: {message}", secrets)
        if code in _RETRYABLE or code >= 500:
            headers = getattr(getattr(exc, "response", None), "headers", None)
            wait = retry_after(dict(headers) if headers is not None else None)
            return TransientError(
                text,
                retry_after=wait if wait is not None else _retry_delay(details),
                rate_limited=code == 429,
            )
        if code in _FATAL or _reason(details) == "API_KEY_INVALID":
            hint = (
                ". Check the model name and base_url."
                if code == 404
                else ". Check the API key (GEMINI_API_KEY or GOOGLE_API_KEY, or the client you "
                "passed)."
            )
            return RunAborted(text + hint)
        return RequestRejected(text)
    detail = scrub(str(exc) or name, secrets)
    if "Timeout" in name or isinstance(exc, TimeoutError):
        return TransientError(f"gemini: request timed out ({detail})", maybe_billed=_sent(exc))
    if name in {"ConnectError", "RemoteProtocolError", "ReadError", "WriteError"} or (
        name.endswith("NetworkError")
    ):
        return TransientError(f"gemini: connection failed ({detail})", maybe_billed=_sent(exc))
    if name in {"UnknownApiResponseError", "ValidationError"} or isinstance(
        exc, json.JSONDecodeError
    ):
        # Google answered (and billed); the body could not be read.
        return TransientError(f"gemini: malformed response ({detail})", maybe_billed=True)
    return exc if isinstance(exc, Exception) else SemframeError(detail)


@dataclass
class _Cache:
    """An explicit cache this backend created."""

    name: str
    tokens: int
    created: float  # time.monotonic()


class GeminiBackend(ApiBackend):
    """``generateContent`` on the Gemini API, with explicit caches where they pay.

    Parameters
    ----------
    model : str
        Gemini model name (``gemini-2.5-flash``, ``gemini-2.5-pro``...).
    client : google.genai.Client, optional
        A client you built. semframe sends every request with its own timeout
        and the SDK's retries off (per-request options), and leaves the client
        open.
    base_url : str, optional
        API URL (for a proxy or the provider emulator's ``gemini_url``).
    timeout : float
        Seconds per request.
    max_concurrency : int
        Requests in flight at once.
    cache_ttl : {"5m", "1h"}
        Lifetime of the explicit caches semframe creates.
    prices : mapping, optional
        Price-table overrides (they set the minimum cacheable length too).
    connect_timeout : float
        Seconds to connect before an attempt fails (clients semframe builds).
    """

    name = "gemini"
    cost: GeminiCost
    _transport: Any = None  # the httpx client of a client semframe built

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        client: Any = None,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_concurrency: int = MAX_CONCURRENCY,
        cache_ttl: str = "5m",
        prices: Mapping[str, Mapping[str, Any]] | None = None,
        connect_timeout: float = 10.0,
        directives: bool = True,
    ) -> None:
        genai, types, httpx = _require()
        self._types = types
        self.cost = gemini_cost(
            model, prices, concurrency=max_concurrency, ttl=cache_ttl, directives=directives
        )
        self.model = model
        self._timeout = timeout
        if client is None:
            key = next((os.environ[k] for k in KEYS if os.environ.get(k)), None)
            if not key:
                msg = (
                    "backend 'gemini' needs an API key: set the GEMINI_API_KEY (or "
                    "GOOGLE_API_KEY) environment variable, or pass "
                    "client=google.genai.Client(api_key=...)."
                )
                raise ConfigError(msg)
            options = types.HttpOptions(
                base_url=base_url,
                timeout=round(timeout * 1000),
                httpx_async_client=_connect_bounded(httpx, connect_timeout),
            )
            client = genai.Client(api_key=key, http_options=options)
            self._transport = options.httpx_async_client
            self._owns_client = True
        elif not isinstance(client, genai.Client):
            msg = f"client must be a google.genai.Client, got {type(client).__name__}."
            raise ConfigError(msg)
        self._client = client
        self._async = True
        api = getattr(client, "_api_client", None)
        self._secrets = (getattr(api, "api_key", None),)
        found = getattr(getattr(api, "_http_options", None), "base_url", None)
        self.endpoint = str(found or base_url or "https://generativelanguage.googleapis.com/")
        self._caches: dict[str, _Cache] = {}
        self._uncacheable: set[str] = set()  # prefixes Google refused to cache
        self._pending_writes = 0  # tokens of created caches not yet reported in a Usage
        self._lock: asyncio.Lock | None = None
        self.capabilities = Capabilities(
            prefix_cache="shared",
            json_schema=True,
            logprobs=False,
            max_concurrency=max_concurrency,
            context_window=CONTEXT_WINDOW,
            async_io=True,
            batch_api=True,
            batch_limit=BATCH_LIMIT,
        )

    def __repr__(self) -> str:
        return (
            f"GeminiBackend(model={self.model!r}, base_url={self.endpoint!r}, "
            f"cache_ttl={self.cost.ttl!r})"
        )

    # -- request shaping ---------------------------------------------------------

    def _http(self) -> Any:
        """Per-request options: semframe's timeout, the SDK's retries off."""
        t = self._types
        return t.HttpOptions(
            timeout=round(self._timeout * 1000), retry_options=t.HttpRetryOptions(attempts=1)
        )

    def explicit_cache(self, request: Request, *, batch: bool = False) -> int:
        """Where ``request``'s explicit cache ends (an offset into its prompt); 0: none.

        The cost model decides (:meth:`semframe.cost.models.GeminiCost.explicit_cache`),
        so that the estimate prices exactly the caches created.
        """
        return self.cost.explicit_cache(request, batch=batch)

    def _thinking(self) -> Any:
        """No thinking on 2.5 Flash models; the model's default elsewhere.

        Gemini counts thinking tokens against ``max_output_tokens`` (a short
        answer could be cut by them) and bills them as output; 2.5 Pro and 3.x
        cannot turn thinking off.
        """
        name = self.model.rsplit("/", 1)[-1]
        if name.startswith("gemini-2.5-flash"):
            return self._types.ThinkingConfig(thinking_budget=0)
        return None

    def config(self, request: Request, *, cache: str | None = None, http: bool = True) -> Any:
        """The ``GenerateContentConfig`` of ``request`` (with ``cache``: naming that cache)."""
        t = self._types
        fields: dict[str, Any] = {
            "max_output_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        thinking = self._thinking()
        if thinking is not None:
            fields["thinking_config"] = thinking
        if cache is not None:
            fields["cached_content"] = cache  # the system prompt is in the cache
        elif request.system:
            fields["system_instruction"] = request.system
        if request.schema is not None:
            fields["response_mime_type"] = "application/json"
            fields["response_json_schema"] = dict(request.schema)
        if http:
            fields["http_options"] = self._http()
        return t.GenerateContentConfig(**fields)

    def contents(self, request: Request, cut: int = 0) -> list[Any]:
        """The request's ``contents``: its prompt after ``cut`` (the part no cache holds)."""
        t = self._types
        return [t.Content(role="user", parts=[t.Part(text=request.prompt[cut:])])]

    # -- explicit caches -----------------------------------------------------------

    def _cache_config(self, request: Request, cut: int) -> Any:
        t = self._types
        fields: dict[str, Any] = {
            "contents": [t.Content(role="user", parts=[t.Part(text=request.prompt[:cut])])],
            "ttl": f"{TTL_SECONDS[self.cost.ttl]:.0f}s",
            "display_name": "semframe",
            "http_options": self._http(),
        }
        if request.system:
            fields["system_instruction"] = request.system
        return t.CreateCachedContentConfig(**fields)

    async def _cache_for(self, request: Request, cut: int) -> str | None:
        """The name of a live explicit cache of ``request``'s first ``cut`` characters.

        A cache is used for its TTL less a margin
        (:data:`~semframe.cost.models.EXPLICIT_CACHE_MARGIN_S`), then replaced. A
        prefix Google refuses to cache (its own count is under the minimum)
        is sent inline from then on. ``None``: no cache.
        """
        key = cache_key(self.model, request.system or "", request.prompt[:cut])
        if key in self._uncacheable:
            return None
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now = time.monotonic()
            found = self._caches.get(key)
            if found is not None and now - found.created < self.cost.lifetime_s:
                return found.name
            try:
                made = await self._call(
                    self._client.aio.caches.create,
                    model=self.model,
                    config=self._cache_config(request, cut),
                )
            except RequestRejected:
                self._uncacheable.add(key)
                return None
            usage = getattr(made, "usage_metadata", None)
            tokens = int(getattr(usage, "total_token_count", None) or 0)
            self._caches[key] = _Cache(str(made.name), tokens, now)
            self._pending_writes += tokens
        if found is not None:
            await self._delete(found.name)
        return str(made.name)

    async def _delete(self, name: str) -> None:
        t = self._types
        config = t.DeleteCachedContentConfig(http_options=self._http())
        try:
            await self._client.aio.caches.delete(name=name, config=config)
        except Exception:  # expired already, or unreachable: its TTL ends it
            return

    def close(self) -> None:
        """Delete the explicit caches made here; close a client semframe built."""
        caches, self._caches = list(self._caches.values()), {}

        async def finish() -> None:
            for cache in caches:
                await self._delete(cache.name)
            if self._owns_client:
                await self._client.aio.aclose()

            if self._transport is not None:
                await self._transport.aclose()

        if caches or self._owns_client:
            _aio.run(finish())
        if self._owns_client:
            self._client.close()

    # -- one request -------------------------------------------------------------

    async def acomplete(self, request: Request) -> Completion:
        """Send one request (through an explicit cache where it pays); raise semframe's errors."""
        cut = self.explicit_cache(request)
        cache = await self._cache_for(request, cut) if cut else None
        if cache is None:
            cut = 0
        try:
            response = await self._call(
                self._client.aio.models.generate_content,
                model=self.model,
                contents=self.contents(request, cut),
                config=self.config(request, cache=cache),
            )
        except RunAborted as exc:
            if cache is not None and "CachedContent" in str(exc):
                # The cache went away (deleted elsewhere, or Google's clock ran ahead):
                # forget it, and let the retry make a new one.
                self._caches = {k: c for k, c in self._caches.items() if c.name != cache}
                raise TransientError(str(exc)) from None
            raise
        completion = _completion(request.id, response)
        writes, self._pending_writes = self._pending_writes, 0
        if writes:
            u = completion.usage
            usage = Usage(u.prompt_tokens + writes, u.cached_tokens, writes, u.output_tokens)
            completion = completion._replace(usage=usage)
        return completion

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Await an SDK call; its errors become semframe's (see :func:`classify_error`)."""
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            error = classify_error(exc, secrets=self._secrets)
            if isinstance(error, TransientError) and not _sent(exc):
                await self._check_reachable(error)
            raise error from None

    async def _check_reachable(self, error: TransientError) -> None:
        """Raise :class:`RunAborted` naming the endpoint when nothing accepts connections there."""
        now = time.monotonic()
        if self._reached_at is not None and now - self._reached_at < PROBE_SECONDS:
            return
        parts = urlsplit(self.endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(str(parts.hostname), port), PROBE_TIMEOUT
            )
        except (OSError, TimeoutError):
            msg = (
                f"{self.name}: cannot reach {self.endpoint} ({error}). Check base_url, "
                "and that the server there is running."
            )
            raise RunAborted(msg) from None
        writer.close()
        self._reached_at = time.monotonic()

    # -- batch API ---------------------------------------------------------------

    def batch_submit(self, requests: Sequence[Request]) -> str:
        """Start a batch job of ``requests`` (inline, no explicit caches); returns its name."""
        t = self._types
        src = [
            t.InlinedRequest(
                contents=self.contents(r),
                metadata={"key": custom_id(r.id)},
                config=self.config(r, http=False),
            )
            for r in requests
        ]
        size = sum(len(r.prompt.encode()) + len((r.system or "").encode()) for r in requests)
        if size > BATCH_BYTES:
            msg = (
                f"gemini batch: {len(requests)} requests hold {size:,} bytes, over the "
                f"{BATCH_BYTES:,} Google takes inline; send them live (batch=False)."
            )
            raise RequestRejected(msg)
        config = t.CreateBatchJobConfig(display_name="semframe", http_options=self._http())
        job = _aio.run(
            self._call(self._client.aio.batches.create, model=self.model, src=src, config=config)
        )
        return str(job.name)

    def _job(self, batch_id: str) -> Any:
        config = self._types.GetBatchJobConfig(http_options=self._http())
        return _aio.run(self._call(self._client.aio.batches.get, name=batch_id, config=config))

    def batch_status(self, batch_id: str) -> BatchStatus:
        job = self._job(batch_id)
        state = _status_word(job.state)
        stats = getattr(job, "completion_stats", None)
        counts: dict[str, int] = {}
        if stats is not None:
            for field in ("successful_count", "failed_count", "incomplete_count"):
                value = getattr(stats, field, None)
                if isinstance(value, int):
                    counts[field.removesuffix("_count")] = value
        return BatchStatus(batch_id, state, state in _DONE_STATES, counts)

    def batch_results(self, batch_id: str) -> dict[int, BatchResult]:
        """Outcomes by plan position; requests missing from the results are absent."""
        job = self._job(batch_id)
        out: dict[int, BatchResult] = {}
        dest = getattr(job, "dest", None)
        for item in getattr(dest, "inlined_responses", None) or []:
            metadata = getattr(item, "metadata", None) or {}
            rid = request_id_of(str(metadata.get("key", "")))
            if rid is None:
                continue
            error = getattr(item, "error", None)
            response = getattr(item, "response", None)
            if error is None and response is not None:
                try:
                    out[rid] = _completion(rid, response)
                except (TransientError, RequestRejected) as exc:
                    out[rid] = exc
                continue
            code = getattr(error, "code", None)
            said = getattr(error, "message", None) or "no response"
            detail = scrub(f"HTTP {code}: {said}"[:300], self._secrets)
            if not isinstance(code, int) or code in _RETRYABLE or code >= 500:
                out[rid] = TransientError(f"gemini batch: {detail}")
            else:
                out[rid] = RequestRejected(f"gemini batch: {detail}")
        return out


def _completion(request_id: int, response: Any) -> Completion:
    """A :class:`Completion` from a ``GenerateContentResponse``."""
    candidates = getattr(response, "candidates", None) or []
    if not candidates:
        feedback = getattr(response, "prompt_feedback", None)
        reason = getattr(feedback, "block_reason", None)
        if reason is not None:
            msg = f"gemini: prompt blocked ({_status_word(reason)})"
            raise RequestRejected(msg)
        msg = "gemini: response has no candidates"
        raise TransientError(msg, maybe_billed=True)
    candidate = candidates[0]
    parts = getattr(getattr(candidate, "content", None), "parts", None) or []
    text = "".join(p.text for p in parts if getattr(p, "text", None) and not p.thought)
    usage = getattr(response, "usage_metadata", None)
    finish = getattr(candidate, "finish_reason", None)
    return Completion(
        request_id,
        text,
        Usage(
            prompt_tokens=int(getattr(usage, "prompt_token_count", None) or 0),
            cached_tokens=int(getattr(usage, "cached_content_token_count", None) or 0),
            output_tokens=int(getattr(usage, "candidates_token_count", None) or 0)
            + int(getattr(usage, "thoughts_token_count", None) or 0),
        ),
        None if finish is None else _status_word(finish),
    )


def create(model: str | None, settings: Mapping[str, Any]) -> GeminiBackend:
    """Factory for ``backend="gemini"`` (the registry reuses the client across calls)."""
    return GeminiBackend(
        model or DEFAULT_MODEL,
        client=settings["client"],
        base_url=settings["base_url"],
        timeout=settings["timeout"] or DEFAULT_TIMEOUT,
        max_concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
        cache_ttl=settings["cache_ttl"],
        prices=settings["prices"],
        connect_timeout=settings["connect_timeout"],
        directives=settings["cache_directives"],
    )


def cost_model(model: str | None, settings: Mapping[str, Any]) -> GeminiCost:
    """The cost model of ``backend="gemini"`` without a client (pricing needs no key)."""
    return gemini_cost(
        model or DEFAULT_MODEL,
        settings["prices"],
        concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
        ttl=settings["cache_ttl"],
        directives=settings["cache_directives"],
    )
