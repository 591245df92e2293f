"""The Gemini API's wire format and rules, for :class:`~semframe.testing.emulator.ProviderEmulator`.

Point the official ``google-genai`` SDK at ``emu.gemini_url``::

    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=emu.gemini_url))

Routes (under ``/gemini/{v1,v1beta,v1alpha}/``, and ``/v1beta/`` or
``/v1alpha/`` at the root): ``models/{model}:generateContent``,
``models/{model}:countTokens``, ``models/{model}:batchGenerateContent``,
``models/{model}:batchEmbedContents``, ``models/{model}:embedContent``,
``batches/{id}`` (GET), ``batches/{id}:cancel``, ``cachedContents`` (POST,
GET), ``cachedContents/{id}`` (GET, DELETE). Keys come in ``x-goog-api-key``
(or ``?key=``). Errors are Google's JSON: ``{"error": {"code", "message",
"status", "details"}}``.

Rules (documented in ``docs/emulator.md``): prompts are counted as
:func:`semframe.cost.framing.gemini_prompt_tokens` counts them; implicit
caching is :class:`semframe.cost.cachesim.GeminiCacheSim` (one shared cache
per model); an explicit cache is billed at creation, its tokens at the input
price plus its storage for the whole TTL (a ledger entry of kind ``"cache"``),
and read at the cache price by the requests naming it until it expires;
batches cost half, except cached tokens (the discount does not stack).
Embeddings are :mod:`semframe.testing.emulator.embeddings`' vectors, billed
by input tokens, at most ``max_inputs`` (100) texts per batch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from semframe.cost.cachesim import GeminiCacheSim, GeminiRules
from semframe.cost.framing import (
    FramingError,
    gemini_content_tokens,
    gemini_prompt_tokens,
    gemini_text,
)
from semframe.cost.pricing import Cost, Price, cost, price_for
from semframe.cost.tokens import count_for_model, encoding
from semframe.errors import ConfigError
from semframe.testing.emulator.clock import Clock
from semframe.testing.emulator.embeddings import vector
from semframe.testing.emulator.faults import Fault, FaultPlan
from semframe.testing.emulator.ledger import Ledger, LedgerEntry
from semframe.testing.emulator.reply import JSON, Reply
from semframe.testing.emulator.responder import Responder

__all__ = ["GeminiService"]

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_PATH = re.compile(r"^(?:/gemini)?/(?:v1|v1beta|v1alpha)/(?P<rest>.+)$")
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), name)
    for m, p, name in [
        ("POST", r"models/(?P<model>[^/:]+):generateContent", "generate"),
        ("POST", r"models/(?P<model>[^/:]+):countTokens", "count"),
        ("POST", r"models/(?P<model>[^/:]+):batchGenerateContent", "batch_create"),
        ("POST", r"models/(?P<model>[^/:]+):batchEmbedContents", "embed_batch"),
        ("POST", r"models/(?P<model>[^/:]+):embedContent", "embed_one"),
        ("GET", r"batches/(?P<id>[^/:]+)", "batch_get"),
        ("POST", r"batches/(?P<id>[^/:]+):cancel", "batch_cancel"),
        ("POST", r"cachedContents", "cache_create"),
        ("GET", r"cachedContents", "cache_list"),
        ("GET", r"cachedContents/(?P<id>[^/]+)", "cache_get"),
        ("DELETE", r"cachedContents/(?P<id>[^/]+)", "cache_delete"),
    ]
]
_TTL = re.compile(r"^(\d+(?:\.\d+)?)s$")
DEFAULT_CACHE_TTL_S = 3600.0
"""An explicit cache's TTL when the request gives none (Google's default: 1 hour)."""


class GeminiHost(Protocol):
    """What the Gemini routes use of the emulator that serves them (read when used)."""

    @property
    def clock(self) -> Clock: ...
    @property
    def responder(self) -> Responder: ...
    @property
    def prices(self) -> Mapping[str, Any]: ...
    def latency_for(self, provider: str) -> Any: ...  # ``Latency``: ``.of(output_tokens)`` s
    @property
    def ledger(self) -> Ledger: ...
    @property
    def faults(self) -> FaultPlan: ...
    @property
    def api_keys(self) -> Collection[str] | None: ...
    @property
    def batch_delay_s(self) -> float: ...
    @property
    def batch_polls(self) -> int: ...
    def embedding_price(self, model: Any, provider: str) -> Any: ...  # ``EmbeddingPrice``


class _Failure(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        retry_after: float | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.reason = reason


@dataclass
class _Cached:
    name: str
    model: str
    tokens: list[int]
    text: str
    display_name: str
    created: float  # emulator clock
    expires: float  # emulator clock
    created_at: float  # unix seconds
    expires_at: float


@dataclass
class _Job:
    id: str
    model: str
    created: float  # emulator clock
    created_at: float  # unix seconds
    lines: list[tuple[Any, Any]]  # (metadata, request)
    display_name: str | None = None
    state: str = "BATCH_STATE_PENDING"
    started: bool = False
    polls: int = 0
    ended_at: float | None = None
    succeeded: int = 0
    failed: int = 0
    responses: list[dict[str, Any]] = field(default_factory=list)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _model_name(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise _Failure(400, "model: a model name is required")
    return raw.removeprefix("models/")


def _schema(gen: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON schema the answer must follow (``responseJsonSchema`` or ``responseSchema``)."""
    schema = gen.get("responseJsonSchema", gen.get("responseSchema"))
    if schema is None:
        return None
    if gen.get("responseMimeType") != JSON:
        raise _Failure(400, "response_schema requires response_mime_type 'application/json'")
    if not isinstance(schema, Mapping):
        raise _Failure(400, "responseJsonSchema: must be a JSON schema object")

    def lower(node: Any) -> Any:  # responseSchema spells types OBJECT, STRING...
        if isinstance(node, Mapping):
            return {
                k: v.lower() if k == "type" and isinstance(v, str) else lower(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [lower(v) for v in node]
        return node

    return lower(schema)  # type: ignore[no-any-return]


def _cost_of_cache(price: Price, tokens: int, ttl_s: float) -> Cost:
    """An explicit cache's creation (input price) and its storage for ``ttl_s``."""
    if ttl_s == 300.0:
        return cost(price, cache_write_5m_tokens=tokens)
    if ttl_s == 3600.0:
        return cost(price, cache_write_1h_tokens=tokens)
    per_token = price.input + price.cache_storage_per_hour * ttl_s / 3600.0
    return Cost(cache_writes=tokens * per_token / 1_000_000)


class GeminiService:
    """The Gemini routes of one emulator: its caches (implicit and explicit) and batches.

    Parameters
    ----------
    host : GeminiHost
        The emulator (clock, responder, prices, latency, ledger, faults, keys,
        batch timing).
    stopping : threading.Event
        Set when the emulator stops; latency and hangs wait on it.
    """

    def __init__(self, host: GeminiHost, stopping: threading.Event) -> None:
        self.host = host
        self._stopping = stopping
        self._lock = threading.RLock()
        self._sims: dict[str, GeminiCacheSim] = {}
        self._caches: dict[str, _Cached] = {}
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)

    @staticmethod
    def owns(path: str) -> bool:
        """Whether ``path`` is a Gemini route (under ``/gemini``, ``/v1beta`` or ``/v1alpha``)."""
        return path.startswith(("/gemini/", "/v1beta/", "/v1alpha/"))

    def reset(self) -> None:
        """Forget caches (implicit and explicit) and batches."""
        with self._lock:
            self._sims.clear()
            self._caches.clear()
            self._jobs.clear()

    # ------------------------------------------------------------ plumbing

    def _new_id(self) -> str:
        with self._lock:
            n = next(self._ids)
        return f"{n:012x}"

    def _error(self, failure: _Failure) -> Reply:
        error: dict[str, Any] = {
            "code": failure.status,
            "message": failure.message,
            "status": _STATUS.get(failure.status, "UNKNOWN"),
        }
        details: list[dict[str, Any]] = []
        headers: list[tuple[str, str]] = []
        if failure.reason is not None:
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": failure.reason,
                    "domain": "googleapis.com",
                }
            )
        if failure.retry_after is not None:
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": f"{failure.retry_after:g}s",
                }
            )
            headers.append(("retry-after", f"{failure.retry_after:g}"))
        if details:
            error["details"] = details
        return Reply(failure.status, _dumps({"error": error}), headers=tuple(headers))

    def _ok(self, payload: Any) -> Reply:
        return Reply(200, _dumps(payload))

    def _price(self, model: str) -> Price:
        try:
            price = price_for(model, self.host.prices)
        except ConfigError:
            price = None
        if price is None or price.provider != "gemini":
            msg = (
                f"models/{model} is not found for API version v1beta, or is not supported "
                "for generateContent."
            )
            raise _Failure(404, msg)
        return price

    def _sim(self, price: Price) -> GeminiCacheSim:
        sim = self._sims.get(price.model)
        if sim is None:
            rules = GeminiRules(min_tokens=price.min_cacheable_tokens, step=price.cache_step_tokens)
            sim = self._sims[price.model] = GeminiCacheSim(rules)
        return sim

    def _authorized(self, target: str, headers: Mapping[str, str]) -> None:
        key = headers.get("x-goog-api-key")
        if not key:
            found = parse_qs(urlsplit(target).query).get("key")
            key = found[0] if found else None
        if not key:
            msg = (
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API."
            )
            raise _Failure(403, msg)
        keys = self.host.api_keys
        if keys is not None and key not in keys:
            raise _Failure(
                400, "API key not valid. Please pass a valid API key.", reason="API_KEY_INVALID"
            )

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            obj = json.loads(body or b"{}")
        except ValueError as exc:
            raise _Failure(400, f"Invalid JSON payload received. {exc}") from None
        if not isinstance(obj, dict):
            raise _Failure(400, "Invalid JSON payload received: expected an object")
        return obj

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        """Answer one HTTP request to a Gemini route."""
        path = urlsplit(target).path.rstrip("/")
        try:
            self._authorized(target, headers)
            m = _PATH.match(path)
            if m is None:
                raise _Failure(404, f"Unknown request URL: {method} {path}")
            rest = m.group("rest")
            for route_method, pattern, name in _ROUTES:
                found = pattern.fullmatch(rest)
                if found is None or route_method != method:
                    continue
                return getattr(self, f"_r_{name}")(body, **found.groupdict())  # type: ignore[no-any-return]
            raise _Failure(404, f"Unknown request URL: {method} {path}")
        except _Failure as failure:
            return self._error(failure)

    # ------------------------------------------------------------ generateContent

    def _live_cache(self, name: Any) -> _Cached:
        now = self.host.clock.now()
        with self._lock:
            cache = self._caches.get(str(name))
            if cache is not None and now >= cache.expires:
                del self._caches[cache.name]
                cache = None
        if cache is None:
            raise _Failure(403, f"CachedContent not found (or permission denied): {name}")
        return cache

    def _answer(
        self, model: str, text: str, schema: Mapping[str, Any] | None, max_tokens: int | None,
        fault: Fault | None,
    ) -> tuple[str, int, bool]:  # fmt: skip
        answer = "" if fault is not None and fault.kind == "empty" else None
        if answer is None:
            answer = self.host.responder("gemini", model, text, schema)
        enc = encoding("o200k_base")
        toks = enc.encode_ordinary(answer)
        if max_tokens is not None and len(toks) > max_tokens:
            return enc.decode(toks[:max_tokens]), max_tokens, True
        return answer, len(toks), False

    def _refuse(self, model: str, fault: Fault, *, batch: bool, key: str | None) -> _Failure:
        now = self.host.clock.now()
        self.host.ledger.record(
            LedgerEntry(
                "gemini", model, 429 if fault.kind == "rate_limit" else min(fault.status, 503),
                0, 0, 0, 0, 0, Cost(), now, now, batch, key, None, fault.kind,
            )
        )  # fmt: skip
        if fault.kind == "rate_limit":
            msg = "Resource has been exhausted (injected by the semframe emulator)."
            return _Failure(429, msg, retry_after=fault.retry_after)
        status = 503 if fault.status == 529 else fault.status
        return _Failure(status, "The service is currently unavailable (injected by the emulator).")

    def _generate(
        self, model: str, req: Mapping[str, Any], *, batch: bool, key: str | None = None
    ) -> tuple[dict[str, Any], Fault | None]:
        """Run one generateContent request; returns the response and the fault that fired."""
        price = self._price(model)
        if req.get("tools") or req.get("toolConfig"):
            raise _Failure(400, "tools: tool use is not supported by the semframe emulator")
        contents = req.get("contents")
        if not isinstance(contents, list) or not contents:
            raise _Failure(400, "* GenerateContentRequest.contents: contents is not specified")
        system = req.get("systemInstruction")
        gen = req.get("generationConfig") or {}
        if not isinstance(gen, Mapping):
            raise _Failure(400, "generationConfig: must be an object")
        try:
            tokens = gemini_prompt_tokens(system, contents)
            text = gemini_text(system, contents)
        except FramingError as exc:
            raise _Failure(400, str(exc)) from None
        explicit: list[int] = []
        name = req.get("cachedContent")
        if name is not None:
            if batch:
                msg = f"Model {model} does not support cached content with batch prediction."
                raise _Failure(400, msg)
            if system is not None:
                msg = (
                    "CachedContent can not be used with GenerateContent request setting "
                    "system_instruction, tools or tool_config.\n\nProposed fix: move those "
                    "values to CachedContent from GenerateContent request."
                )
                raise _Failure(400, msg)
            cache = self._live_cache(name)
            if cache.model != model:
                msg = (
                    f"Model used by GenerateContent request ({model}) and CachedContent "
                    f"({cache.model}) has to be the same."
                )
                raise _Failure(400, msg)
            explicit = cache.tokens
            tokens = explicit + tokens
            text = f"{cache.text}\n\n{text}"
        max_tokens = gen.get("maxOutputTokens")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise _Failure(400, f"max_output_tokens: must be an integer >= 1, got {max_tokens!r}")
        temperature = gen.get("temperature", 1.0)
        if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise _Failure(400, f"temperature: must be a number in [0, 2], got {temperature!r}")
        schema = _schema(gen)

        fault = self.host.faults.pick("gemini", text)
        if batch and fault is not None and fault.kind not in ("empty", "rate_limit"):
            fault = Fault.server_error(500)
        if fault is not None and fault.kind in ("rate_limit", "server_error"):
            raise self._refuse(model, fault, batch=batch, key=key)
        if fault is not None and fault.kind == "hang":
            self._wait(fault.seconds)

        clock = self.host.clock
        arrival = clock.now()
        with self._lock:
            ticket = self._sim(price).begin(tokens, arrival=arrival, explicit=len(explicit))
        answer, out_tokens, cut = self._answer(model, text, schema, max_tokens, fault)
        if not batch:
            self._wait(self.host.latency_for("gemini").of(out_tokens))
        completion = clock.now()
        with self._lock:
            self._sim(price).complete(ticket, at=completion)
        prompt, cached = ticket.result.prompt_tokens, ticket.result.cached_tokens
        bill = cost(
            price,
            uncached_input_tokens=prompt - cached,
            cached_input_tokens=cached,
            output_tokens=out_tokens,
            batch=batch,
        )
        self.host.ledger.record(
            LedgerEntry(
                "gemini", model, 200, prompt, cached, 0, 0, out_tokens, bill, arrival,
                completion, batch, key, None, fault.kind if fault else None,
            )
        )  # fmt: skip
        usage: dict[str, Any] = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": out_tokens,
            "totalTokenCount": prompt + out_tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
        }
        if cached:
            usage["cachedContentTokenCount"] = cached
            usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
        payload = {
            "candidates": [
                {
                    "content": {"parts": [{"text": answer}], "role": "model"},
                    "finishReason": "MAX_TOKENS" if cut else "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": self._new_id(),
        }
        return payload, fault

    def _r_generate(self, body: bytes, model: str) -> Reply:
        payload, fault = self._generate(model, self._json(body), batch=False)
        reply = self._ok(payload)
        if fault is not None and fault.kind == "malformed":
            return Reply(200, reply.body[: max(1, len(reply.body) // 3)])
        if fault is not None and fault.kind == "drop":
            return Reply(200, reply.body, drop=True)
        return reply

    def _r_count(self, body: bytes, model: str) -> Reply:
        req = self._json(body)
        inner = req.get("generateContentRequest")
        inner = inner if isinstance(inner, Mapping) else req
        self._price(model)
        try:
            tokens = gemini_content_tokens(
                inner.get("systemInstruction"), inner.get("contents") or []
            )
        except FramingError as exc:
            raise _Failure(400, str(exc)) from None
        out: dict[str, Any] = {"totalTokens": len(tokens)}
        if inner.get("cachedContent") is not None:
            cached = len(self._live_cache(inner["cachedContent"]).tokens)
            out["totalTokens"] += cached
            out["cachedContentTokenCount"] = cached
        out["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": out["totalTokens"]}]
        return self._ok(out)

    # ------------------------------------------------------------ embeddings

    def _embed(self, model: str, requests: list[Any]) -> list[dict[str, Any]]:
        """Embed the texts of ``requests`` (``EmbedContentRequest`` objects); bill them as one."""
        try:
            price = self.host.embedding_price(model, "gemini")
        except LookupError:
            msg = (
                f"models/{model} is not found for API version v1beta, or is not supported "
                "for embedContent."
            )
            raise _Failure(404, msg) from None
        if not requests:
            raise _Failure(400, "* BatchEmbedContentsRequest.requests: requests is empty")
        if len(requests) > price.max_inputs:
            msg = (
                "* BatchEmbedContentsRequest.requests: at most "
                f"{price.max_inputs} requests can be in one batch"
            )
            raise _Failure(400, msg)
        texts: list[str] = []
        dims: list[int] = []
        for i, req in enumerate(requests):
            content = req.get("content") if isinstance(req, Mapping) else None
            parts = content.get("parts") if isinstance(content, Mapping) else None
            if not isinstance(parts, list) or not parts:
                raise _Failure(400, f"* requests[{i}].content: content is not specified")
            if not all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in parts):
                raise _Failure(400, f"* requests[{i}].content: only text parts are supported")
            texts.append("".join(str(p["text"]) for p in parts))
            dim = req.get("outputDimensionality", price.dimensions)
            if (
                isinstance(dim, bool)
                or not isinstance(dim, int)
                or not 1 <= dim <= price.dimensions
            ):
                msg = f"* requests[{i}].output_dimensionality: must be in [1, {price.dimensions}]"
                raise _Failure(400, msg)
            dims.append(dim)
        counts = count_for_model(texts, model).tokens
        for i, n in enumerate(counts):
            if n > price.max_input_tokens:
                msg = (
                    f"* requests[{i}]: the input token count ({n}) exceeds the maximum number "
                    f"of tokens allowed ({price.max_input_tokens})."
                )
                raise _Failure(400, msg)
        fault = self.host.faults.pick("gemini", "\n".join(texts))
        if fault is not None and fault.kind in ("rate_limit", "server_error"):
            raise self._refuse(model, fault, batch=False, key=None)
        if fault is not None and fault.kind == "hang":
            self._wait(fault.seconds)
        clock = self.host.clock
        arrival = clock.now()
        self._wait(self.host.latency_for("gemini").of(0))
        total = sum(counts)
        bill = Cost(uncached_input=price.dollars(total))
        self.host.ledger.record(
            LedgerEntry(
                "gemini", model, 200, total, 0, 0, 0, 0, bill, arrival, clock.now(),
                False, None, None, fault.kind if fault else None,
            )
        )  # fmt: skip
        # Like Google's, a vector cut by output_dimensionality is not unit length again.
        return [
            {"values": [float(x) for x in vector(model, t, price.dimensions)[:d]]}
            for t, d in zip(texts, dims, strict=True)
        ]

    def _r_embed_batch(self, body: bytes, model: str) -> Reply:
        requests = self._json(body).get("requests")
        if not isinstance(requests, list):
            raise _Failure(400, "* BatchEmbedContentsRequest.requests: must be a list")
        return self._ok({"embeddings": self._embed(model, requests)})

    def _r_embed_one(self, body: bytes, model: str) -> Reply:
        return self._ok({"embedding": self._embed(model, [self._json(body)])[0]})

    # ------------------------------------------------------------ cachedContents

    def _cache_object(self, cache: _Cached) -> dict[str, Any]:
        return {
            "name": cache.name,
            "model": f"models/{cache.model}",
            "displayName": cache.display_name,
            "createTime": _iso(cache.created_at),
            "updateTime": _iso(cache.created_at),
            "expireTime": _iso(cache.expires_at),
            "usageMetadata": {"totalTokenCount": len(cache.tokens)},
        }

    def _r_cache_create(self, body: bytes) -> Reply:
        req = self._json(body)
        model = _model_name(req.get("model"))
        price = self._price(model)
        system, contents = req.get("systemInstruction"), req.get("contents") or []
        try:
            tokens = gemini_content_tokens(system, contents)
            text = gemini_text(system, contents)
        except FramingError as exc:
            raise _Failure(400, str(exc)) from None
        minimum = price.min_cacheable_tokens
        if len(tokens) < minimum:
            msg = (
                f"Cached content is too small. total_token_count={len(tokens)}, "
                f"min_total_token_count={minimum}"
            )
            raise _Failure(400, msg)
        wall = time.time()
        ttl_s = DEFAULT_CACHE_TTL_S
        if req.get("ttl") is not None:
            m = _TTL.match(str(req["ttl"]))
            if m is None:
                raise _Failure(400, f"ttl: expected a duration like '300s', got {req['ttl']!r}")
            ttl_s = float(m.group(1))
        elif req.get("expireTime") is not None:
            try:
                when = datetime.fromisoformat(str(req["expireTime"]).replace("Z", "+00:00"))
            except ValueError:
                raise _Failure(400, f"expireTime: not a timestamp: {req['expireTime']!r}") from None
            ttl_s = when.timestamp() - wall
        if ttl_s <= 0:
            raise _Failure(400, "ttl: must be positive (the cache would expire at once)")
        now = self.host.clock.now()
        digest = hashlib.blake2b(self._new_id().encode(), digest_size=6).hexdigest()
        cache = _Cached(
            f"cachedContents/{digest}", model, tokens, text, str(req.get("displayName") or ""),
            now, now + ttl_s, wall, wall + ttl_s,
        )  # fmt: skip
        with self._lock:
            self._caches[cache.name] = cache
        n = len(tokens)
        short = ttl_s <= 300.0
        self.host.ledger.record(
            LedgerEntry(
                "gemini", model, 200, n, 0, n if short else 0, 0 if short else n, 0,
                _cost_of_cache(price, n, ttl_s), now, now, kind="cache",
            )
        )  # fmt: skip
        return self._ok(self._cache_object(cache))

    def _r_cache_get(self, body: bytes, id: str) -> Reply:
        return self._ok(self._cache_object(self._live_cache(f"cachedContents/{id}")))

    def _r_cache_list(self, body: bytes) -> Reply:
        now = self.host.clock.now()
        with self._lock:
            live = [c for c in self._caches.values() if now < c.expires]
        return self._ok({"cachedContents": [self._cache_object(c) for c in live]})

    def _r_cache_delete(self, body: bytes, id: str) -> Reply:
        cache = self._live_cache(f"cachedContents/{id}")
        with self._lock:
            self._caches.pop(cache.name, None)
        return self._ok({})

    # ------------------------------------------------------------ batches

    def _r_batch_create(self, body: bytes, model: str) -> Reply:
        self._price(model)
        batch = self._json(body).get("batch")
        if not isinstance(batch, Mapping):
            raise _Failure(400, "batch: a batch object is required")
        source = batch.get("inputConfig") or {}
        if isinstance(source, Mapping) and source.get("fileName"):
            raise _Failure(400, "inputConfig.fileName: file input is not supported by the emulator")
        items = (
            (source.get("requests") or {}).get("requests") if isinstance(source, Mapping) else None
        )
        if not isinstance(items, list) or not items:
            raise _Failure(400, "batch.inputConfig.requests.requests: must be a non-empty list")
        lines = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or not isinstance(item.get("request"), Mapping):
                raise _Failure(400, f"batch.inputConfig.requests.requests[{i}]: needs a 'request'")
            lines.append((item.get("metadata"), item["request"]))
        job = _Job(self._new_id(), model, self.host.clock.now(), time.time(), lines)
        job.display_name = str(batch.get("displayName") or "") or None
        with self._lock:
            self._jobs[job.id] = job
        return self._ok(self._operation(job))

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise _Failure(404, f"Batch batches/{job_id} not found.")
        return job

    def _operation(self, job: _Job) -> dict[str, Any]:
        done = job.state in ("BATCH_STATE_SUCCEEDED", "BATCH_STATE_CANCELLED")
        meta: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "model": f"models/{job.model}",
            "name": f"batches/{job.id}",
            "createTime": _iso(job.created_at),
            "updateTime": _iso(job.ended_at or job.created_at),
            "state": job.state,
            "batchStats": {
                "requestCount": str(len(job.lines)),
                "successfulRequestCount": str(job.succeeded),
                "failedRequestCount": str(job.failed),
                "pendingRequestCount": str(0 if done else len(job.lines)),
            },
        }
        if job.display_name:
            meta["displayName"] = job.display_name
        if job.ended_at is not None:
            meta["endTime"] = _iso(job.ended_at)
        if job.state == "BATCH_STATE_SUCCEEDED":
            meta["output"] = {"inlinedResponses": {"inlinedResponses": job.responses}}
        return {"name": f"batches/{job.id}", "metadata": meta, "done": done}

    def _run(self, job: _Job) -> None:
        responses: list[dict[str, Any]] = []
        for n, (metadata, request) in enumerate(job.lines):
            key = None
            if isinstance(metadata, Mapping) and metadata.get("key") is not None:
                key = str(metadata["key"])
            entry: dict[str, Any] = {}
            try:
                payload, _ = self._generate(job.model, request, batch=True, key=key or f"#{n}")
                entry["response"] = payload
                job.succeeded += 1
            except _Failure as failure:
                entry["error"] = {"code": failure.status, "message": failure.message}
                job.failed += 1
            if metadata is not None:
                entry["metadata"] = metadata
            responses.append(entry)
        with self._lock:
            job.responses = responses
            job.state, job.ended_at = "BATCH_STATE_SUCCEEDED", time.time()

    def _r_batch_get(self, body: bytes, id: str) -> Reply:
        job = self._job(id)
        with self._lock:
            job.polls += 1
            due = (
                not job.started
                and job.state in ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING")
                and self.host.clock.now() - job.created >= self.host.batch_delay_s
                and job.polls > self.host.batch_polls
            )
            if job.state == "BATCH_STATE_PENDING":
                job.state = "BATCH_STATE_RUNNING"
            job.started = job.started or due
        if due:
            self._run(job)
        return self._ok(self._operation(job))

    def _r_batch_cancel(self, body: bytes, id: str) -> Reply:
        job = self._job(id)
        with self._lock:
            if job.state not in ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING"):
                raise _Failure(400, f"Batch batches/{id} has ended and cannot be cancelled.")
            job.state, job.ended_at = "BATCH_STATE_CANCELLED", time.time()
        return self._ok({})
