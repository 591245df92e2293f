"""``backend="anthropic"``: the Anthropic Messages API, with cache breakpoints.

Anthropic caches only where the request says so: a ``cache_control`` breakpoint
(at most 4 per request) marks the end of a prefix to cache. Writing a prefix
costs more than sending it (1.25x input for the 5-minute TTL, 2x for 1 hour);
reading it back costs 0.1x. semframe places breakpoints from the plan:

- at the end of the shared instructions (every request of the relQuery starts
  with them), and
- at the end of each deeper prefix the request shares with its neighbours in
  GGR order (its leading fields; ``Request.prefix`` lists them with how many
  consecutive requests share each),

and only where it pays: the prefix reaches the model's minimum cacheable length
(counted approximately: Anthropic publishes no tokenizer) and enough requests
share it that the reads repay the write premium (``n`` sharers pay when
``w + 0.1 (n - 1) < n`` for write multiplier ``w``: 2 sharers at 5 minutes, 3 at
1 hour). The rule is the backend's cost model's
(:meth:`semframe.cost.models.AnthropicCost.breakpoints`), so the estimator
prices exactly the breakpoints the backend sends.

Keys come from ``ANTHROPIC_API_KEY`` (or a client you pass); they never appear in
reprs, errors or logs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from semframe.backends import aio as _aio
from semframe.backends._api import ApiBackend, custom_id, jsonable, request_id_of, scrub
from semframe.backends.base import DEFAULT_TIMEOUT, BatchResult, BatchStatus, Capabilities
from semframe.core.wire import Completion, Request, Usage
from semframe.cost.models import (
    AnthropicCost,
    anthropic_cost,
)
from semframe.errors import ConfigError, MissingDependencyError, RequestRejected, TransientError

DEFAULT_MODEL = "claude-haiku-4-5"
MAX_CONCURRENCY = 32
"""Requests in flight when the ``max_concurrency`` setting does not say."""
BATCH_LIMIT = 100_000
"""Requests per message batch (Anthropic's limit)."""


def _require() -> Any:
    try:
        import anthropic
    except ImportError:
        msg = "backend 'anthropic' needs the anthropic SDK: pip install 'semframe[anthropic]'"
        raise MissingDependencyError(msg) from None
    return anthropic


class AnthropicBackend(ApiBackend):
    """Messages on the Anthropic API with plan-driven cache breakpoints.

    Parameters
    ----------
    model : str
        Claude model name.
    client : anthropic.Anthropic or anthropic.AsyncAnthropic, optional
        A client you built; semframe uses a copy with its own timeout and the
        SDK's retries off.
    base_url : str, optional
        API URL (for a proxy or the provider emulator).
    timeout : float
        Seconds per request.
    max_concurrency : int
        Requests in flight at once.
    cache_ttl : {"5m", "1h"}
        Lifetime of the cache entries semframe writes.
    prices : mapping, optional
        Price-table overrides (they set the minimum cacheable length too).
    connect_timeout : float
        Seconds to connect before an attempt fails.
    """

    name = "anthropic"
    cost: AnthropicCost

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
        anthropic = _require()
        self.cost = anthropic_cost(
            model, prices, concurrency=max_concurrency, ttl=cache_ttl, directives=directives
        )
        self.model = model
        if client is None:
            if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
                msg = (
                    "backend 'anthropic' needs an API key: set the ANTHROPIC_API_KEY "
                    "environment variable, or pass client=anthropic.Anthropic(api_key=...)."
                )
                raise ConfigError(msg)
            client = anthropic.AsyncAnthropic(base_url=base_url)
            self._owns_client = True
        elif not isinstance(client, anthropic.Anthropic | anthropic.AsyncAnthropic):
            msg = (
                f"client must be an anthropic.Anthropic or anthropic.AsyncAnthropic, got "
                f"{type(client).__name__}."
            )
            raise ConfigError(msg)
        self._client = client.with_options(
            timeout=anthropic.Timeout(timeout, connect=connect_timeout), max_retries=0
        )
        self._async = isinstance(client, anthropic.AsyncAnthropic)
        self._secrets = (getattr(client, "api_key", None), getattr(client, "auth_token", None))
        self.endpoint = str(self._client.base_url)
        self.capabilities = Capabilities(
            prefix_cache="shared",
            json_schema=False,
            logprobs=False,
            max_concurrency=max_concurrency,
            context_window=200_000,
            async_io=True,
            batch_api=True,
            batch_limit=BATCH_LIMIT,
        )

    def __repr__(self) -> str:
        return (
            f"AnthropicBackend(model={self.model!r}, base_url={self.endpoint!r}, "
            f"cache_ttl={self.cost.ttl!r})"
        )

    # -- request shaping ---------------------------------------------------------

    def breakpoints(self, request: Request) -> list[int]:
        """Where this request's cache breakpoints go (offsets into its prompt).

        The cost model decides (:meth:`semframe.cost.models.AnthropicCost.breakpoints`),
        so that the estimate prices exactly the breakpoints sent.
        """
        return self.cost.breakpoints(request)

    def body(self, request: Request) -> dict[str, Any]:
        """The Messages request body for ``request`` (no secrets)."""
        control = {"type": "ephemeral", "ttl": self.cost.ttl}
        cuts = self.breakpoints(request)
        blocks: list[dict[str, Any]] = []
        start = 0
        for end in cuts:
            blocks.append(
                {"type": "text", "text": request.prompt[start:end], "cache_control": control}
            )
            start = end
        if start < len(request.prompt):
            blocks.append({"type": "text", "text": request.prompt[start:]})
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            # No temperature: the Messages API of current models (SDK 2.x) takes none.
            "messages": [{"role": "user", "content": blocks}],
        }
        if request.system:
            body["system"] = [{"type": "text", "text": request.system}]
        return body

    async def acomplete(self, request: Request) -> Completion:
        """Send one request; raise semframe's error types on failure."""
        body = self.body(request)
        message, limits = await self._call_raw(
            self._client.messages.with_raw_response.create, **body
        )
        return _completion(request.id, jsonable(message))._replace(limits=limits)

    # -- batch API ---------------------------------------------------------------

    def batch_submit(self, requests: Sequence[Request]) -> str:
        """Start a message batch of ``requests``; returns its id."""
        items = [{"custom_id": custom_id(r.id), "params": self.body(r)} for r in requests]
        batch = _aio.run(self._call(self._client.messages.batches.create, requests=items))
        return str(batch.id)

    def batch_status(self, batch_id: str) -> BatchStatus:
        batch = _aio.run(self._call(self._client.messages.batches.retrieve, batch_id))
        counts = jsonable(batch.request_counts) or {}
        state = str(batch.processing_status)
        return BatchStatus(batch_id, state, state == "ended", dict(counts))

    def batch_results(self, batch_id: str) -> dict[int, BatchResult]:
        """Outcomes by plan position; requests missing from the results are absent."""

        async def fetch() -> dict[int, BatchResult]:
            out: dict[int, BatchResult] = {}
            results = await self._call(self._client.messages.batches.results, batch_id)
            if self._async:
                async for item in results:
                    self._batch_item(jsonable(item), out)
            else:
                for item in await asyncio.to_thread(list, results):
                    self._batch_item(jsonable(item), out)
            return out

        return _aio.run(fetch())

    def _batch_item(self, item: Mapping[str, Any], out: dict[int, BatchResult]) -> None:
        rid = request_id_of(str(item.get("custom_id", "")))
        if rid is None:
            return
        result = item.get("result") or {}
        kind = result.get("type")
        if kind == "succeeded":
            out[rid] = _completion(rid, result.get("message") or {})
            return
        detail = scrub(str(result.get("error") or kind)[:300], self._secrets)
        error = (result.get("error") or {}).get("error") or result.get("error") or {}
        error_type = error.get("type") if isinstance(error, Mapping) else None
        if kind in {"expired", "canceled"} or error_type in {
            "rate_limit_error",
            "overloaded_error",
            "api_error",
        }:
            out[rid] = TransientError(f"anthropic batch: {kind}: {detail}")
        else:
            out[rid] = RequestRejected(f"anthropic batch: {kind}: {detail}")


def _completion(request_id: int, message: Mapping[str, Any]) -> Completion:
    content = message.get("content") or []
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    usage = message.get("usage") or {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    write = int(usage.get("cache_creation_input_tokens") or 0)
    fresh = int(usage.get("input_tokens") or 0)
    return Completion(
        request_id,
        text,
        Usage(
            prompt_tokens=fresh + read + write,
            cached_tokens=read,
            cache_write_tokens=write,
            output_tokens=int(usage.get("output_tokens") or 0),
        ),
        message.get("stop_reason"),
    )


def create(model: str | None, settings: Mapping[str, Any]) -> AnthropicBackend:
    """Factory for ``backend="anthropic"`` (the registry reuses the client across calls)."""
    return AnthropicBackend(
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


def cost_model(model: str | None, settings: Mapping[str, Any]) -> AnthropicCost:
    """The cost model of ``backend="anthropic"`` without a client (pricing needs no key)."""
    return anthropic_cost(
        model or DEFAULT_MODEL,
        settings["prices"],
        concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
        ttl=settings["cache_ttl"],
        directives=settings["cache_directives"],
    )
