"""``backend="openai"``: the OpenAI API, or any OpenAI-compatible server (``base_url``).

Requests go through the official ``openai`` SDK (its async client, on semframe's
I/O loop). OpenAI caches prompt prefixes automatically: prompts of 1,024 tokens
or more are served from cache in 128-token steps when a recent request started
the same way and was routed to the same machine. Routing hashes the start of the
prompt together with ``prompt_cache_key``, so semframe sets that key from the
request's prefix group: the rows that share a prefix (in GGR order, neighbours)
land on the same cache, and different groups spread over different machines
instead of overflowing one. A group too small to repay its route's cold
instructions shares the relQuery's instruction-level key instead
(:func:`semframe.cost.models.routing_key`). The shared instructions are byte-identical across
a relQuery's requests by construction (the planner renders them once).

From GPT-5.6 (``caching = "breakpoints"`` in the price table) OpenAI caches
only at breakpoints and bills cache writes at 1.25x input. By default it puts
one implicit breakpoint at the end of every prompt, so each row would write its
whole prompt and no other row could read it. semframe sends
``prompt_cache_options = {"mode": "explicit"}`` and marks
``prompt_cache_breakpoint`` on the prompt's parts only at the shared prefixes
whose write is repaid by later reads (the cost model decides, so the estimate
prices exactly what is sent). ``cache_retention`` sends
``prompt_cache_retention`` to the models that take it (before GPT-5.6).
``service_tier`` sends ``service_tier`` (``"flex"``: the batch price,
synchronously; ``"priority"``) with live requests, to the models the price table
lists the tier for; batch requests go without one.

Keys come from ``OPENAI_API_KEY`` (or a client you pass); they never appear in
reprs, errors or logs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from semframe.backends import aio as _aio
from semframe.backends._api import (
    PROBE_TIMEOUT,
    ApiBackend,
    custom_id,
    jsonable,
    request_id_of,
    scrub,
)
from semframe.backends.base import DEFAULT_TIMEOUT, BatchResult, BatchStatus, Capabilities
from semframe.core.wire import Completion, Request, TokenLogprob, Usage
from semframe.cost.models import OpenAICost, openai_cost, routing_key
from semframe.errors import ConfigError, MissingDependencyError, RequestRejected, TransientError

DEFAULT_MODEL = "gpt-4.1-mini"
FLEX_TIMEOUT = 900.0
"""Seconds an attempt on the flex tier may wait by default: OpenAI's flex guide
(developers.openai.com/api/docs/guides/flex-processing, stored copy read 2026-11-24)
raises the client timeout to 15 minutes "due to slower processing speeds"."""
MAX_CONCURRENCY = 64
"""Requests in flight when the ``max_concurrency`` setting does not say."""
BATCH_LIMIT = 50_000
"""Requests per batch file (OpenAI's limit)."""

_WINDOWS = (
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("gpt-4o", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
)


def _require() -> Any:
    try:
        import openai
    except ImportError:
        msg = "backend 'openai' needs the openai SDK: pip install 'semframe[openai]'"
        raise MissingDependencyError(msg) from None
    return openai


LARGEST_WINDOW = max(window for _, window in _WINDOWS)
"""The largest context window of any known model: a bound for a model nobody describes."""


def context_window(model: str) -> int | None:
    """Context window of a known OpenAI model family, else ``None``.

    Examples
    --------
    >>> context_window("gpt-4o-mini"), context_window("my-local-model")
    (128000, None)
    """
    name = model.lower().rsplit("/", 1)[-1]
    for prefix, window in _WINDOWS:
        if name.startswith(prefix):
            return window
    return None


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON schema in the form OpenAI's strict structured outputs accept.

    Every object lists all its properties as required and forbids others.

    Examples
    --------
    >>> s = strict_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    >>> s["required"], s["additionalProperties"]
    (['a'], False)
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {k: strict_schema(v) for k, v in value.items()}
        elif (key == "items" and isinstance(value, Mapping)) or isinstance(value, Mapping):
            out[key] = strict_schema(value)
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out:
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


class OpenAIBackend(ApiBackend):
    """Chat Completions on the OpenAI API or an OpenAI-compatible server.

    Parameters
    ----------
    model : str
        Model name as the server knows it.
    client : openai.OpenAI or openai.AsyncOpenAI, optional
        A client you built; semframe uses a copy with its own timeout and with
        the SDK's retries off (semframe retries, honouring ``Retry-After``).
    base_url : str, optional
        Server URL (``http://127.0.0.1:8080/v1`` for a llama.cpp server).
    timeout : float, optional
        Seconds per request; by default :data:`FLEX_TIMEOUT` on the flex tier,
        else :data:`~semframe.backends.base.DEFAULT_TIMEOUT` (the backend's
        ``capabilities.answer_timeout``).
    max_concurrency : int
        Requests in flight at once.
    prices : mapping, optional
        Price-table overrides (the ``prices`` setting).
    connect_timeout : float
        Seconds to connect before an attempt fails.
    window : int, optional
        The model's context window when it is not a known OpenAI model (the
        ``context_window`` setting); otherwise an OpenAI-compatible server is
        asked (``/v1/models``), and a model nobody describes is bounded by the
        largest known window.
    directives : bool
        Send cache directives (the ``cache_directives`` setting):
        ``prompt_cache_key``, and on breakpoint models explicit breakpoints.
        False sends none, as a client unaware of caching would.
    retention : {"in_memory", "24h"}, optional
        ``prompt_cache_retention`` to send (the ``cache_retention`` setting);
        only for the models the price table lists it for.
    service_tier : {"default", "flex", "priority"}, optional
        ``service_tier`` to send with live requests (the ``service_tier``
        setting); ``"flex"`` and ``"priority"`` only for the models the price
        table lists them for, and billed at their prices.
    """

    name = "openai"
    cost: OpenAICost

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        client: Any = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_concurrency: int = MAX_CONCURRENCY,
        prices: Mapping[str, Mapping[str, Any]] | None = None,
        connect_timeout: float = 10.0,
        window: int | None = None,
        directives: bool = True,
        retention: str | None = None,
        service_tier: str | None = None,
    ) -> None:
        openai = _require()
        self.model = model
        self.cost = openai_cost(
            model,
            prices,
            concurrency=max_concurrency,
            directives=directives,
            retention=retention,
            service_tier=service_tier,
        )
        # What the request bodies follow (a subclass may bill with another cost model).
        self._rules: OpenAICost = self.cost
        self._compatible = base_url is not None or bool(os.environ.get("OPENAI_BASE_URL"))
        if client is None:
            key = os.environ.get("OPENAI_API_KEY")
            if not key:
                if not self._compatible:
                    msg = (
                        "backend 'openai' needs an API key: set the OPENAI_API_KEY "
                        "environment variable, or pass client=openai.OpenAI(api_key=...). "
                        "For an OpenAI-compatible server without keys, pass base_url=."
                    )
                    raise ConfigError(msg)
                key = "no-key-needed"
            client = openai.AsyncOpenAI(api_key=key, base_url=base_url)
            self._owns_client = True
        elif not isinstance(client, openai.OpenAI | openai.AsyncOpenAI):
            msg = (
                f"client must be an openai.OpenAI or openai.AsyncOpenAI, got "
                f"{type(client).__name__}."
            )
            raise ConfigError(msg)
        else:
            self._compatible = self._compatible or "api.openai.com" not in str(client.base_url)
        # Flex answers come slower: cutting them at the standard limit would send
        # again (and may bill again) requests the provider is still answering.
        answer_timeout = FLEX_TIMEOUT if service_tier == "flex" else DEFAULT_TIMEOUT
        self._client = client.with_options(
            timeout=openai.Timeout(timeout or answer_timeout, connect=connect_timeout),
            max_retries=0,
        )
        self._async = isinstance(client, openai.AsyncOpenAI)
        self._secrets = (getattr(client, "api_key", None),)
        self.endpoint = str(self._client.base_url)
        # OpenAI and Azure OpenAI take max_completion_tokens (their reasoning models
        # refuse max_tokens); other compatible servers know only max_tokens.
        azure = isinstance(client, openai.AzureOpenAI | openai.AsyncAzureOpenAI) or any(
            host in self.endpoint for host in _AZURE_HOSTS
        )
        self._limit_field = (
            "max_tokens" if self._compatible and not azure else "max_completion_tokens"
        )
        if window is None:
            window = context_window(model)
        if window is None and self._compatible:
            window = self._server_window()
        self.capabilities = Capabilities(
            prefix_cache="shared",
            json_schema=True,
            logprobs=True,
            max_concurrency=max_concurrency,
            context_window=window or LARGEST_WINDOW,
            async_io=True,
            batch_api=True,
            batch_limit=BATCH_LIMIT,
            answer_timeout=answer_timeout,
        )

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.endpoint!r})"

    def _server_window(self) -> int | None:
        """The context window the server reports for the model (``/v1/models``), if any.

        vLLM reports ``max_model_len``, llama.cpp ``meta.n_ctx_train``; a
        server that does not answer, or says nothing, gives ``None``.
        """
        client = self._client.with_options(timeout=PROBE_TIMEOUT)

        async def listed() -> Any:
            return await client.models.list()

        try:
            page = _aio.run(listed()) if self._async else client.models.list()
        except Exception:  # an unreachable server is named when a request fails
            return None
        for entry in getattr(page, "data", None) or []:
            data = jsonable(entry)
            if not isinstance(data, Mapping) or data.get("id") != self.model:
                continue
            found = data.get("meta")
            meta: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            for value in (
                data.get("max_model_len"),
                data.get("context_window"),
                data.get("context_length"),
                meta.get("n_ctx"),
                meta.get("n_ctx_train"),
            ):
                if isinstance(value, int) and value > 0:
                    return value
        return None

    # -- one request -------------------------------------------------------------

    def body(self, request: Request) -> dict[str, Any]:
        """The Chat Completions request body for ``request`` (no secrets)."""
        messages: list[dict[str, Any]] = list(request.messages())
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": request.temperature,
        }
        cost = self._rules
        if cost.directives:
            body["prompt_cache_key"] = self.routing_key(request)
            if cost.by_breakpoints:
                body["prompt_cache_options"] = {"mode": "explicit"}
                messages[-1] = {"role": "user", "content": _parts(request, cost)}
        if cost.retention is not None:
            body["prompt_cache_retention"] = cost.retention
        if cost.service_tier is not None:
            body["service_tier"] = cost.service_tier
        # Compatible servers (llama.cpp, vLLM) know max_tokens; OpenAI prefers the new name.
        body[self._limit_field] = request.max_tokens
        if request.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.logprobs
        if request.schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": strict_schema(request.schema),
                    "strict": True,
                },
            }
        return body

    routing_key = staticmethod(routing_key)
    """``prompt_cache_key`` of a request (:func:`semframe.cost.models.routing_key`)."""

    async def acomplete(self, request: Request) -> Completion:
        """Send one request; raise semframe's error types on failure."""
        body = self.body(request)
        # Newer parameters travel as extra_body so that older SDKs send them too.
        extra = {k: body.pop(k) for k in _EXTRA_BODY if k in body} | body.pop("extra_body", {})
        response, limits = await self._call_raw(
            self._client.chat.completions.with_raw_response.create,
            **body,
            extra_body=extra or None,
        )
        return _completion(request.id, response)._replace(limits=limits)

    # -- batch API ---------------------------------------------------------------

    def batch_submit(self, requests: Sequence[Request]) -> str:
        """Upload ``requests`` as a JSONL file and start a batch; returns its id."""
        lines = [
            json.dumps(
                {
                    "custom_id": custom_id(r.id),
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": _batch_body(self.body(r)),
                },
                ensure_ascii=False,
            )
            for r in requests
        ]
        payload = ("\n".join(lines) + "\n").encode()
        name = f"semframe-{hashlib.sha256(payload).hexdigest()[:12]}.jsonl"

        async def submit() -> str:
            upload = await self._call(
                self._client.files.create, file=(name, io.BytesIO(payload)), purpose="batch"
            )
            batch = await self._call(
                self._client.batches.create,
                input_file_id=upload.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"source": "semframe"},
            )
            return str(batch.id)

        return _aio.run(submit())

    def batch_status(self, batch_id: str) -> BatchStatus:
        batch = _aio.run(self._call(self._client.batches.retrieve, batch_id))
        counts = batch.request_counts
        state = str(batch.status)
        return BatchStatus(
            batch_id,
            state,
            state in {"completed", "failed", "expired", "cancelled"},
            {
                "total": counts.total if counts else 0,
                "completed": counts.completed if counts else 0,
                "failed": counts.failed if counts else 0,
            },
        )

    def batch_results(self, batch_id: str) -> dict[int, BatchResult]:
        """Outcomes by plan position; requests missing from the output are absent."""

        async def fetch() -> dict[int, BatchResult]:
            batch = await self._call(self._client.batches.retrieve, batch_id)
            out: dict[int, BatchResult] = {}
            for file_id in (batch.output_file_id, batch.error_file_id):
                if not file_id:
                    continue
                content = await self._call(self._client.files.content, file_id)
                for line in content.text.splitlines():
                    if line.strip():
                        self._batch_line(json.loads(line), out)
            return out

        return _aio.run(fetch())

    def _batch_line(self, record: Mapping[str, Any], out: dict[int, BatchResult]) -> None:
        rid = request_id_of(str(record.get("custom_id", "")))
        if rid is None:
            return
        response = record.get("response") or {}
        status = int(response.get("status_code") or 0)
        error = record.get("error")
        if status == 200 and isinstance(response.get("body"), Mapping):
            out[rid] = _completion_from_json(rid, response["body"])
            return
        detail = scrub(json.dumps(error or response.get("body") or {})[:300], self._secrets)
        if status in {408, 409, 429} or status >= 500 or status == 0:
            out[rid] = TransientError(f"openai batch: HTTP {status or 'error'}: {detail}")
        else:
            out[rid] = RequestRejected(f"openai batch: HTTP {status}: {detail}")


_AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")
"""Hosts of Azure OpenAI endpoints (a plain ``openai.OpenAI`` client may point there)."""


_EXTRA_BODY = ("prompt_cache_options", "prompt_cache_retention")
"""Body fields sent as ``extra_body`` (SDK releases before 2026 lack them as arguments)."""


def _batch_body(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as a batch line carries it: without ``service_tier`` (batch has its own)."""
    body.pop("service_tier", None)
    return body


def _parts(request: Request, cost: OpenAICost) -> list[dict[str, Any]]:
    """The prompt as text parts, ``prompt_cache_breakpoint`` where the cost model places one.

    Examples
    --------
    >>> from semframe.cost.models import openai_cost
    >>> r = Request(0, 0, "Instructions. Row 1", None, 8, 0.0, None, 0, prefix=((13, 50),))
    >>> _parts(r, openai_cost("gpt-4o-mini", None, concurrency=1))
    [{'type': 'text', 'text': 'Instructions. Row 1'}]
    """
    mark = {"mode": "explicit"}
    parts: list[dict[str, Any]] = []
    start = 0
    for end in cost.breakpoints(request):
        parts.append(
            {"type": "text", "text": request.prompt[start:end], "prompt_cache_breakpoint": mark}
        )
        start = end
    if start < len(request.prompt) or not parts:
        parts.append({"type": "text", "text": request.prompt[start:]})
    return parts


def _completion(request_id: int, response: Any) -> Completion:
    if not response.choices:
        msg = "openai: response has no choices"
        raise TransientError(msg)
    choice = response.choices[0]
    usage = response.usage
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    # DeepSeek reports its cache hits as usage.prompt_cache_hit_tokens instead.
    cached = (
        getattr(details, "cached_tokens", None) or getattr(usage, "prompt_cache_hit_tokens", 0) or 0
    )
    return Completion(
        request_id,
        choice.message.content or "",
        Usage(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            cached_tokens=cached,
            cache_write_tokens=getattr(details, "cache_write_tokens", None) or 0,
            output_tokens=usage.completion_tokens if usage else 0,
        ),
        choice.finish_reason,
        *parse_logprobs(getattr(choice, "logprobs", None)),
    )


def parse_logprobs(
    logprobs: Any,
) -> tuple[tuple[float, ...] | None, tuple[TokenLogprob, ...] | None]:
    """``(logprobs, tokens)`` of a choice's ``logprobs`` (SDK object or JSON), or Nones.

    Examples
    --------
    >>> parse_logprobs({"content": [{"token": "a", "logprob": -0.5,
    ...                         "top_logprobs": [{"token": "a", "logprob": -0.5}]}]})
    ((-0.5,), (TokenLogprob(token='a', logprob=-0.5, top=(('a', -0.5),)),))
    >>> parse_logprobs(None)
    (None, None)
    """

    def get(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    content = get(logprobs, "content") if logprobs is not None else None
    if not content:
        return None, None
    tokens = tuple(
        TokenLogprob(
            str(get(t, "token")),
            float(get(t, "logprob")),
            tuple(
                (str(get(a, "token")), float(get(a, "logprob")))
                for a in get(t, "top_logprobs") or ()
            ),
        )
        for t in content
    )
    return tuple(t.logprob for t in tokens), tokens


def _completion_from_json(request_id: int, body: Mapping[str, Any]) -> Completion:
    choices = body.get("choices") or [{}]
    message = choices[0].get("message") or {}
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Completion(
        request_id,
        message.get("content") or "",
        Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(
                details.get("cached_tokens") or usage.get("prompt_cache_hit_tokens") or 0
            ),
            cache_write_tokens=int(details.get("cache_write_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
        ),
        choices[0].get("finish_reason"),
        *parse_logprobs(choices[0].get("logprobs")),
    )


def create(model: str | None, settings: Mapping[str, Any]) -> OpenAIBackend:
    """Factory for ``backend="openai"`` (the registry reuses the client across calls)."""
    return OpenAIBackend(
        model or DEFAULT_MODEL,
        client=settings["client"],
        base_url=settings["base_url"],
        timeout=settings["timeout"],
        max_concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
        prices=settings["prices"],
        connect_timeout=settings["connect_timeout"],
        window=settings["context_window"],
        directives=settings["cache_directives"],
        retention=settings["cache_retention"],
        service_tier=settings["service_tier"],
    )


def cost_model(model: str | None, settings: Mapping[str, Any]) -> OpenAICost:
    """The cost model of ``backend="openai"`` without a client (pricing needs no key)."""
    return openai_cost(
        model or DEFAULT_MODEL,
        settings["prices"],
        concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
        directives=settings["cache_directives"],
        retention=settings["cache_retention"],
        service_tier=settings["service_tier"],
    )
