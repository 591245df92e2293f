"""A local HTTP server speaking the OpenAI, Anthropic and Gemini wire formats.

See :class:`ProviderEmulator`; the rules it applies are documented in
``docs/emulator.md`` and in :mod:`semframe.cost.cachesim`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

from semframe.cost.cachesim import (
    Block,
    BreakpointCacheSim,
    BreakpointRules,
    CacheRuleError,
    OpenAICacheSim,
    OpenAIRules,
    check_breakpoints,
)
from semframe.cost.framing import (
    FramingError,
    anthropic_blocks,
    openai_blocks,
    openai_prompt_tokens,
    prompt_text,
)
from semframe.cost.models import TYPICAL_LATENCY
from semframe.cost.pricing import Cost, EmbeddingPrice, Price, cost, embedding_price, price_for
from semframe.cost.tokens import count_for_model, encoding
from semframe.errors import ConfigError
from semframe.testing.emulator.clock import Clock, MonotonicClock
from semframe.testing.emulator.embeddings import as_base64, vector
from semframe.testing.emulator.faults import Fault, FaultPlan
from semframe.testing.emulator.gemini import GeminiService
from semframe.testing.emulator.ledger import Ledger, LedgerEntry
from semframe.testing.emulator.limits import AccountLimits, LimitState
from semframe.testing.emulator.reply import Reply
from semframe.testing.emulator.responder import Responder, default_responder

__all__ = ["Latency", "ProviderEmulator"]

Provider = Literal["openai", "anthropic"]

_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    502: ("server_error", None),
    503: ("server_error", None),
    529: ("server_error", "overloaded"),
}


@dataclass(frozen=True)
class Latency:
    """Simulated response time: ``fixed_s + per_output_token_s * output_tokens``.

    The emulator really waits this long before answering (not in batches).
    ``Latency(0)`` answers at once (what most tests want); an emulator built
    without a latency answers after :meth:`typical` for each provider.

    Examples
    --------
    >>> Latency(0).of(50), round(Latency.typical("openai").of(32), 3)
    (0.0, 0.92)
    """

    fixed_s: float = 0.0
    per_output_token_s: float = 0.0

    def of(self, output_tokens: int) -> float:
        """Seconds for an answer of ``output_tokens`` tokens."""
        return self.fixed_s + self.per_output_token_s * output_tokens

    @classmethod
    def typical(cls, provider: str) -> Latency:
        """A typical answer time of ``provider``'s API (``openai``, ``anthropic``, ``gemini``).

        The time to the first token, then a time per output token, as the
        cost estimator assumes by default
        (:data:`semframe.cost.models.TYPICAL_LATENCY`, where the figures are
        justified): 0.6 s + 10 ms per output token (OpenAI, Gemini), 0.8 s +
        15 ms (Anthropic).
        """
        model = TYPICAL_LATENCY[provider]
        return cls(model.fixed_s, model.per_output_token_s)


class _Failure(Exception):
    """An error answer, in a provider-neutral form."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int


@dataclass
class _Batch:
    id: str
    provider: Provider
    created: float  # emulator clock
    created_at: int  # unix seconds
    lines: list[tuple[str, Any]]  # (custom_id, request body)
    input_file_id: str | None = None
    endpoint: str = "/v1/chat/completions"
    completion_window: str = "24h"
    metadata: Any = None
    status: str = "validating"
    polls: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: Any = None
    completed: int = 0
    failed: int = 0
    canceled: int = 0
    ended_at: int | None = None
    cancel_at: int | None = None
    results: list[dict[str, Any]] = field(default_factory=list)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _iso(ts: int | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True

    # A client sends bursts of up to max_concurrency connections; socketserver's
    # default backlog of 5 would refuse some of them.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], emu: ProviderEmulator) -> None:
        self.emu = emu
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120.0  # idle keep-alive connections end after this
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request log lines."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = self.server.emu._handle(method, self.path, headers, body)
            self._send(reply)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        for k, v in reply.headers:
            self.send_header(k, v)
        if reply.drop:
            self.send_header("Connection", "close")
        self.end_headers()
        if reply.drop:
            self.wfile.write(reply.body[: len(reply.body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(reply.body)


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), name)
    for m, p, name in [
        ("POST", r"/v1/chat/completions", "chat"),
        ("POST", r"/v1/embeddings", "embeddings"),
        # Azure OpenAI's layout (openai.AzureOpenAI): the model is the deployment.
        ("POST", r"/openai/deployments/[^/]+/chat/completions", "chat"),
        ("POST", r"/v1/files", "file_upload"),
        ("GET", r"/v1/files/(?P<id>[^/]+)", "file_get"),
        ("GET", r"/v1/files/(?P<id>[^/]+)/content", "file_content"),
        ("POST", r"/v1/batches", "oa_batch_create"),
        ("GET", r"/v1/batches/(?P<id>[^/]+)", "oa_batch_get"),
        ("POST", r"/v1/batches/(?P<id>[^/]+)/cancel", "oa_batch_cancel"),
        ("POST", r"/v1/messages", "messages"),
        ("POST", r"/v1/messages/count_tokens", "count_tokens"),
        ("POST", r"/v1/messages/batches", "an_batch_create"),
        ("GET", r"/v1/messages/batches/(?P<id>[^/]+)", "an_batch_get"),
        ("GET", r"/v1/messages/batches/(?P<id>[^/]+)/results", "an_batch_results"),
        ("POST", r"/v1/messages/batches/(?P<id>[^/]+)/cancel", "an_batch_cancel"),
    ]
]


class ProviderEmulator:
    """OpenAI, Anthropic and Gemini on loopback, with their caching and billing rules.

    Use it as a context manager; point the official SDK clients at
    :attr:`openai_url`, :attr:`anthropic_url` and :attr:`gemini_url` (Gemini's
    routes live in :mod:`semframe.testing.emulator.gemini`)::

        with ProviderEmulator() as emu:
            client = openai.OpenAI(base_url=emu.openai_url, api_key="x")
            ...
            emu.ledger.totals().dollars

    Parameters
    ----------
    host, port : str, int
        Where to listen; port 0 picks a free one.
    clock : Clock, optional
        Time for the cache rules and the ledger (default: monotonic seconds
        since start). A :class:`~semframe.testing.emulator.ManualClock` makes TTL
        expiry testable; latency and hangs still wait in real time.
    responder : callable, optional
        ``(provider, model, prompt_text, schema) -> text``; default
        :func:`~semframe.testing.emulator.default_responder`.
    prices : mapping, optional
        Price overrides / extra models, as ``[prices."model"]`` tables.
    latency : Latency, optional
        Simulated response time of live (non-batch) requests, every provider
        alike. Default: each provider's typical time (:meth:`Latency.typical`:
        0.6 s + 10 ms per output token for OpenAI and Gemini, 0.8 s + 15 ms
        for Anthropic), so caching behaves as it does against the real APIs,
        where requests sent together all miss. ``Latency(0)`` answers at once.
    openai_rules : OpenAIRules, optional
        OpenAI cache parameters (TTL, machines, overflow rate...). The minimum
        and step come from the price table.
    anthropic_lookback : int
        Block boundaries checked per breakpoint.
    api_keys : collection of str, optional
        Accepted keys; default any non-empty key.
    batch_delay_s : float
        Batches complete no earlier than this long (emulator clock) after creation.
    batch_polls : int
        Batches complete on the first retrieval after this many retrievals.
    rate_limits : AccountLimits, optional
        The account's requests and tokens per minute, enforced on live
        requests (a 429 with ``Retry-After`` when a bucket is short) and
        reported in every response's rate-limit headers
        (:mod:`~semframe.testing.emulator.limits`); default unlimited.
    embedding_prices : mapping, optional
        Overrides of the embedding models' prices and limits, as
        ``{model: {field: value}}`` (:func:`semframe.cost.pricing.embedding_price`):
        ``{"text-embedding-3-small": {"max_inputs": 4}}`` refuses requests of
        more than 4 texts, as OpenAI refuses more than 2,048.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        responder: Responder | None = None,
        prices: Mapping[str, Mapping[str, Any]] | None = None,
        latency: Latency | None = None,
        openai_rules: OpenAIRules | None = None,
        anthropic_lookback: int = 20,
        api_keys: Collection[str] | None = None,
        batch_delay_s: float = 0.0,
        batch_polls: int = 0,
        rate_limits: AccountLimits | None = None,
        embedding_prices: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.clock: Clock = clock or MonotonicClock()
        self.responder: Responder = responder or default_responder
        self.prices = dict(prices or {})
        self.latency = latency
        self.openai_rules = openai_rules or OpenAIRules()
        self.anthropic_lookback = anthropic_lookback
        self.api_keys = frozenset(api_keys) if api_keys is not None else None
        self.batch_delay_s = batch_delay_s
        self.batch_polls = batch_polls
        self.rate_limits = rate_limits
        self.embedding_prices = dict(embedding_prices or {})
        self.limits = LimitState(rate_limits, self.clock) if rate_limits else None
        self.ledger = Ledger()
        self.faults = FaultPlan()
        self._lock = threading.RLock()  # caches, files, batches, ids
        self._openai_sims: dict[tuple[str, str], OpenAICacheSim] = {}
        self._anthropic_sims: dict[str, BreakpointCacheSim] = {}
        self._openai_bp_sims: dict[str, BreakpointCacheSim] = {}
        self._files: dict[str, _File] = {}
        self._batches: dict[str, _Batch] = {}
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._gemini = GeminiService(self, self._stopping)  # the Gemini routes
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def latency_for(self, provider: str) -> Latency:
        """How long a live request to ``provider`` waits for its answer."""
        return self.latency if self.latency is not None else Latency.typical(provider)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ProviderEmulator:
        """Start serving in a background thread; returns self."""
        if self._server is not None:
            msg = "the emulator is already running"
            raise RuntimeError(msg)
        self._stopping.clear()
        encoding("o200k_base")  # build the tokenizer now, not inside the first request
        self._server = _Server((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="semframe-emulator",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end open connections and join every handler thread."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        with server.sockets_lock:
            open_sockets = list(server.open_sockets)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ProviderEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def wait(self) -> None:
        """Block until :meth:`stop` is called (or KeyboardInterrupt)."""
        while not self._stopping.wait(0.5):
            pass

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        """``base_url`` for ``openai.OpenAI`` (``.../v1``)."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_url(self) -> str:
        """``base_url`` for ``anthropic.Anthropic``."""
        return self.base_url

    @property
    def gemini_url(self) -> str:
        """``base_url`` for ``google.genai.Client`` (its ``HttpOptions``): ``.../gemini``."""
        return f"{self.base_url}/gemini"

    def reset(self) -> None:
        """Forget caches, ledger, fault rules, files and batches."""
        with self._lock:
            self._openai_sims.clear()
            self._anthropic_sims.clear()
            self._openai_bp_sims.clear()
            self._files.clear()
            self._batches.clear()
        self._gemini.reset()
        self.ledger.reset()
        self.faults.clear()
        if self.rate_limits is not None:
            self.limits = LimitState(self.rate_limits, self.clock)

    # ------------------------------------------------------------ plumbing

    def _new_id(self, prefix: str) -> str:
        with self._lock:
            n = next(self._ids)
        return f"{prefix}{n:012x}"

    def _price(self, model: Any, provider: Provider) -> Price:
        if not isinstance(model, str) or not model:
            raise _Failure(400, "model: a model name is required")
        try:
            price = price_for(model, self.prices)
        except ConfigError as exc:
            raise _Failure(404, f"The model {model!r} does not exist ({exc})") from None
        if price.provider != provider:
            msg = (
                f"The model {model!r} is a {price.provider} model, not served by the {provider} API"
            )
            raise _Failure(404, msg)
        return price

    def _openai_sim(self, price: Price, retention: str) -> OpenAICacheSim:
        """The automatic cache of ``price.model`` for requests with ``retention``.

        ``in_memory`` entries live as ``openai_rules`` says; ``24h`` entries a
        day (a simplification: the two retentions are separate caches here).
        """
        sim = self._openai_sims.get((price.model, retention))
        if sim is None:
            r = self.openai_rules
            ttl_s, life_s = (
                (r.ttl_s, r.max_lifetime_s) if retention == "in_memory" else (86_400.0,) * 2
            )
            rules = OpenAIRules(
                min_tokens=price.min_cacheable_tokens,
                step=price.cache_step_tokens,
                ttl_s=ttl_s,
                max_lifetime_s=life_s,
                machines=r.machines,
                route_tokens=r.route_tokens,
                overflow_per_minute=r.overflow_per_minute,
            )
            sim = self._openai_sims[price.model, retention] = OpenAICacheSim(rules)
        return sim

    def _openai_bp_sim(self, price: Price) -> BreakpointCacheSim:
        """The breakpoint cache of a model that caches by breakpoints (GPT-5.6 on)."""
        sim = self._openai_bp_sims.get(price.model)
        if sim is None:
            rules = BreakpointRules.openai(price.min_cacheable_tokens)
            sim = self._openai_bp_sims[price.model] = BreakpointCacheSim(rules)
        return sim

    def _anthropic_sim(self, price: Price) -> BreakpointCacheSim:
        sim = self._anthropic_sims.get(price.model)
        if sim is None:
            rules = BreakpointRules(
                min_tokens=price.min_cacheable_tokens, lookback_blocks=self.anthropic_lookback
            )
            sim = self._anthropic_sims[price.model] = BreakpointCacheSim(rules)
        return sim

    def _error(self, provider: Provider, failure: _Failure) -> Reply:
        request_id = self._new_id("req_")
        headers: list[tuple[str, str]] = []
        if failure.retry_after is not None:
            headers += [
                ("retry-after", f"{failure.retry_after:g}"),
                ("retry-after-ms", str(round(failure.retry_after * 1000))),
            ]
        if provider == "openai":
            kind, code = _OPENAI_ERRORS.get(failure.status, ("invalid_request_error", None))
            payload: dict[str, Any] = {
                "error": {"message": failure.message, "type": kind, "param": None, "code": code}
            }
            headers.append(("x-request-id", request_id))
        else:
            kind = _ANTHROPIC_ERRORS.get(failure.status, "api_error")
            payload = {
                "type": "error",
                "error": {"type": kind, "message": failure.message},
                "request_id": request_id,
            }
            headers.append(("request-id", request_id))
        if self.limits is not None:
            headers += self.limits.headers(provider)
        return Reply(failure.status, _dumps(payload), headers=tuple(headers))

    def _ok(self, provider: Provider, payload: Any) -> Reply:
        name = "x-request-id" if provider == "openai" else "request-id"
        headers = [(name, self._new_id("req_"))]
        if self.limits is not None:
            headers += self.limits.headers(provider)
        return Reply(200, _dumps(payload), headers=tuple(headers))

    def _admit(self, provider: Provider, model: str, tokens: int) -> None:
        """Take a live request from the account's rate limits; a 429 when they are short."""
        if self.limits is None:
            return
        wait = self.limits.admit(tokens)
        if wait is None:
            return
        now = self.clock.now()
        self.ledger.record(
            LedgerEntry(
                provider, model, 429, 0, 0, 0, 0, 0, Cost(), now, now,
                False, None, None, "rate_limit",
            )
        )  # fmt: skip
        msg = (
            f"Rate limit reached for {model} (the emulator's account limits: "
            f"{self.rate_limits}). Please try again in {wait:g}s."
        )
        raise _Failure(429, msg, retry_after=wait)

    def _authorized(self, provider: Provider, headers: Mapping[str, str]) -> bool:
        # Anthropic sends x-api-key; Azure OpenAI clients send api-key.
        key = headers.get("x-api-key" if provider == "anthropic" else "api-key")
        auth = headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        if not key:
            return False
        return self.api_keys is None or key in self.api_keys

    def _handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        path = urlsplit(target).path.rstrip("/")
        if self._gemini.owns(path):
            return self._gemini.handle(method, target, headers, body)
        provider: Provider = "anthropic" if path.startswith("/v1/messages") else "openai"
        if not self._authorized(provider, headers):
            msg = (
                "invalid x-api-key"
                if provider == "anthropic"
                else "Incorrect API key provided. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
            return self._error(provider, _Failure(401, msg))
        for route_method, pattern, name in _ROUTES:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            if route_method != method:
                return self._error(provider, _Failure(405, f"{method} is not allowed on {path}"))
            try:
                return getattr(self, f"_r_{name}")(body, headers, **m.groupdict())  # type: ignore[no-any-return]
            except _Failure as failure:
                return self._error(provider, failure)
        return self._error(provider, _Failure(404, f"Unknown request URL: {method} {path}"))

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise _Failure(400, f"The request body is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise _Failure(400, "The request body must be a JSON object")
        return obj

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _answer(
        self,
        provider: Provider,
        model: str,
        text: str,
        *,
        schema: Mapping[str, Any] | None,
        max_tokens: int | None,
        fault: Fault | None,
    ) -> tuple[str, int, bool]:
        """Answer text, output tokens and whether it was cut at ``max_tokens``."""
        answer = "" if fault is not None and fault.kind == "empty" else None
        if answer is None:
            answer = self.responder(provider, model, text, schema)
        enc = encoding("o200k_base")
        toks = enc.encode_ordinary(answer)
        if max_tokens is not None and len(toks) > max_tokens:
            return enc.decode(toks[:max_tokens]), max_tokens, True
        return answer, len(toks), False

    def _refuse(
        self,
        provider: Provider,
        model: str,
        fault: Fault,
        *,
        batch: bool,
        custom_id: str | None,
        cache_key: str | None,
    ) -> _Failure:
        now = self.clock.now()
        self.ledger.record(
            LedgerEntry(
                provider, model, fault.status, 0, 0, 0, 0, 0, Cost(), now, now,
                batch, custom_id, cache_key, fault.kind,
            )
        )  # fmt: skip
        if fault.kind == "rate_limit":
            msg = "Rate limit reached (injected by the semframe emulator). Please try again later."
            return _Failure(429, msg, retry_after=fault.retry_after)
        if fault.status == 529:
            return _Failure(529, "Overloaded (injected by the semframe emulator)")
        return _Failure(fault.status, "The server had an error (injected by the semframe emulator)")

    # ------------------------------------------------------------ OpenAI

    def _chat(
        self, req: Mapping[str, Any], *, batch: bool, custom_id: str | None = None
    ) -> tuple[dict[str, Any], Fault | None]:
        """Run one chat completion; returns the ChatCompletion and the fault that fired."""
        price = self._price(req.get("model"), "openai")
        model = str(req["model"])
        if req.get("stream"):
            raise _Failure(400, "stream: streaming is not supported by the semframe emulator")
        if req.get("n", 1) != 1:
            raise _Failure(400, "n: only n=1 is supported by the semframe emulator")
        messages = req.get("messages")
        try:
            tokens = openai_prompt_tokens(messages if isinstance(messages, list) else [])
            text = prompt_text(None, messages if isinstance(messages, list) else [])
        except FramingError as exc:
            raise _Failure(400, str(exc)) from None
        max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise _Failure(400, f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        temperature = req.get("temperature", 1.0)
        if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise _Failure(400, f"temperature: must be a number in [0, 2], got {temperature!r}")
        schema = _openai_schema(req.get("response_format"))
        top_logprobs = _openai_top_logprobs(req)
        cache_key = req.get("prompt_cache_key") or req.get("user")
        cache_key = str(cache_key) if cache_key is not None else None
        blocks, retention = _openai_cache_rules(req, price, messages)
        tier = _openai_service_tier(req, price)

        if not batch:
            self._admit("openai", model, len(tokens) + (max_tokens or 0))
        fault = self.faults.pick("openai", text)
        if batch and fault is not None and fault.kind not in ("empty", "rate_limit"):
            fault = Fault.server_error(500)
        if fault is not None and fault.kind in ("rate_limit", "server_error"):
            raise self._refuse(
                "openai", model, fault, batch=batch, custom_id=custom_id, cache_key=cache_key
            )
        if fault is not None and fault.kind == "hang":
            self._wait(fault.seconds)

        arrival = self.clock.now()
        with self._lock:
            if blocks is None:
                auto = self._openai_sim(price, retention)
                ticket = auto.begin(tokens, arrival=arrival, cache_key=cache_key)
                prompt, cached = ticket.result.prompt_tokens, ticket.result.cached_tokens
                written = 0
            else:
                bp = self._openai_bp_sim(price).begin(blocks, arrival=arrival)
                prompt, cached = bp.result.prompt_tokens, bp.result.cache_read_input_tokens
                written = bp.result.cache_creation_input_tokens
        answer, out_tokens, cut = self._answer(
            "openai", model, text, schema=schema, max_tokens=max_tokens, fault=fault
        )
        if not batch:
            self._wait(self.latency_for("openai").of(out_tokens))
        completion = self.clock.now()
        with self._lock:
            if blocks is None:
                self._openai_sim(price, retention).complete(ticket, at=completion)
            else:
                self._openai_bp_sim(price).complete(bp, at=completion)
        bill = cost(
            price if batch else price.at_tier(tier),  # a batch line is billed at batch prices
            uncached_input_tokens=prompt - cached - written,
            cached_input_tokens=cached,
            cache_write_5m_tokens=written,
            output_tokens=out_tokens,
            batch=batch,
        )
        self.ledger.record(
            LedgerEntry(
                "openai", model, 200, prompt, cached, written, 0, out_tokens, bill, arrival,
                completion, batch, custom_id, cache_key, fault.kind if fault else None,
            )
        )  # fmt: skip
        details: dict[str, int] = {"cached_tokens": cached, "audio_tokens": 0}
        if blocks is not None:
            details["cache_write_tokens"] = written
        payload = {
            "id": self._new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": answer,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": (
                        None if top_logprobs is None else openai_logprobs(answer, top_logprobs)
                    ),
                    "finish_reason": "length" if cut else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": out_tokens,
                "total_tokens": prompt + out_tokens,
                "prompt_tokens_details": details,
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            },
            "service_tier": "default" if batch else tier,
            "system_fingerprint": "fp_semframe_emulator",
        }
        return payload, fault

    def _live(self, provider: Provider, payload: dict[str, Any], fault: Fault | None) -> Reply:
        reply = self._ok(provider, payload)
        if fault is not None and fault.kind == "malformed":
            return Reply(200, reply.body[: max(1, len(reply.body) // 3)], headers=reply.headers)
        if fault is not None and fault.kind == "drop":
            return Reply(200, reply.body, headers=reply.headers, drop=True)
        return reply

    def _r_chat(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        payload, fault = self._chat(self._json(body), batch=False)
        return self._live("openai", payload, fault)

    def embedding_price(self, model: Any, provider: str) -> EmbeddingPrice:
        """The price and limits of embedding ``model`` at ``provider``; ``LookupError`` if none."""
        try:
            price = embedding_price(str(model), self.embedding_prices)
        except ConfigError as exc:
            raise LookupError(str(exc)) from None
        if price.provider != provider:
            msg = f"{model!r} is a {price.provider} embedding model"
            raise LookupError(msg)
        return price

    def _r_embeddings(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        """OpenAI ``POST /v1/embeddings``: one vector per input, billed by input tokens."""
        req = self._json(body)
        model = req.get("model")
        try:
            price = self.embedding_price(model, "openai")
        except LookupError as exc:
            raise _Failure(404, f"The model {model!r} does not exist ({exc})") from None
        raw = req.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts:
            raise _Failure(400, "'$.input' is invalid: expected a string or a non-empty array")
        if not all(isinstance(t, str) for t in texts):
            raise _Failure(
                400, "'$.input': token arrays are not supported by the semframe emulator"
            )
        if any(not t for t in texts):
            raise _Failure(400, "'$.input' is invalid: an input cannot be an empty string")
        if len(texts) > price.max_inputs:
            msg = f"'$.input' is invalid: an array must be {price.max_inputs} dimensions or less"
            raise _Failure(400, msg)
        fmt = req.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise _Failure(400, f"encoding_format: must be 'float' or 'base64', got {fmt!r}")
        dim = req.get("dimensions", price.dimensions)
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= price.dimensions:
            msg = f"dimensions: must be an integer in [1, {price.dimensions}], got {dim!r}"
            raise _Failure(400, msg)
        counts = count_for_model(texts, price.model).tokens
        for i, n in enumerate(counts):
            if n > price.max_input_tokens:
                msg = (
                    f"This model's maximum context length is {price.max_input_tokens} tokens, "
                    f"however you requested {n} tokens ({n} in your prompt; input {i}). "
                    "Please reduce your prompt."
                )
                raise _Failure(400, msg)
        total = sum(counts)
        if price.max_request_tokens and total > price.max_request_tokens:
            msg = f"Requested {total} tokens, max {price.max_request_tokens} tokens per request"
            raise _Failure(400, msg)
        name = str(model)
        self._admit("openai", name, total)
        fault = self.faults.pick("openai", "\n".join(texts))
        if fault is not None and fault.kind in ("rate_limit", "server_error"):
            raise self._refuse("openai", name, fault, batch=False, custom_id=None, cache_key=None)
        if fault is not None and fault.kind == "hang":
            self._wait(fault.seconds)
        arrival = self.clock.now()
        self._wait(self.latency_for("openai").of(0))
        vectors = [vector(name, t, price.dimensions)[:dim] for t in texts]
        if dim < price.dimensions:  # OpenAI's shortened vectors are unit length again
            vectors = [v / max(float((v @ v) ** 0.5), 1e-12) for v in vectors]
        bill = Cost(uncached_input=price.dollars(total))
        self.ledger.record(
            LedgerEntry(
                "openai", name, 200, total, 0, 0, 0, 0, bill, arrival, self.clock.now(),
                False, None, None, fault.kind if fault else None,
            )
        )  # fmt: skip
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": as_base64(v) if fmt == "base64" else [float(x) for x in v],
            }
            for i, v in enumerate(vectors)
        ]
        payload = {
            "object": "list",
            "data": data,
            "model": name,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }
        return self._live("openai", payload, fault)

    def _r_file_upload(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        ctype = headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise _Failure(400, "files: expected a multipart/form-data upload")
        msg = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + ctype.encode("latin-1") + b"\r\n\r\n" + body
        )
        purpose, data, filename = None, None, "upload.jsonl"
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            raw = payload if isinstance(payload, bytes) else b""
            if name == "purpose":
                purpose = raw.decode("utf-8")
            elif name == "file":
                data = raw
                filename = part.get_filename() or filename
        if data is None:
            raise _Failure(400, "file: a file part is required")
        if purpose != "batch":
            raise _Failure(400, f"purpose: only 'batch' is supported, got {purpose!r}")
        f = _File(self._new_id("file-"), filename, purpose, data, int(time.time()))
        with self._lock:
            self._files[f.id] = f
        return self._ok("openai", _file_object(f))

    def _file(self, file_id: str) -> _File:
        with self._lock:
            f = self._files.get(file_id)
        if f is None:
            raise _Failure(404, f"No such File object: {file_id}")
        return f

    def _r_file_get(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        return self._ok("openai", _file_object(self._file(id)))

    def _r_file_content(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        return Reply(200, self._file(id).data, content_type="application/octet-stream")

    def _r_oa_batch_create(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        req = self._json(body)
        endpoint = req.get("endpoint")
        if endpoint != "/v1/chat/completions":
            raise _Failure(
                400, f"endpoint: only '/v1/chat/completions' is supported, got {endpoint!r}"
            )
        if req.get("completion_window") != "24h":
            raise _Failure(400, "completion_window: must be '24h'")
        f = self._file(str(req.get("input_file_id")))
        b = _Batch(
            self._new_id("batch_"),
            "openai",
            self.clock.now(),
            int(time.time()),
            [],
            input_file_id=f.id,
            endpoint=endpoint,
            metadata=req.get("metadata"),
        )
        seen: set[str] = set()
        for n, line in enumerate(f.data.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                custom_id = obj["custom_id"]
                if obj.get("url") != endpoint or obj.get("method", "POST") != "POST":
                    b.errors = _batch_error("invalid_url", f"line {n}: url must be {endpoint}", n)
                    break
                if custom_id in seen:
                    msg = f"line {n}: duplicate custom_id {custom_id!r}"
                    b.errors = _batch_error("duplicate_custom_id", msg, n)
                    break
                seen.add(custom_id)
                b.lines.append((str(custom_id), obj.get("body")))
            except (ValueError, KeyError, TypeError) as exc:
                b.errors = _batch_error("invalid_json_line", f"line {n}: {exc}", n)
                break
        if b.errors is not None:
            b.status, b.lines = "failed", []
        with self._lock:
            self._batches[b.id] = b
        return self._ok("openai", self._oa_batch_object(b))

    def _get_batch(self, batch_id: str, provider: Provider) -> _Batch:
        with self._lock:
            b = self._batches.get(batch_id)
        if b is None or b.provider != provider:
            raise _Failure(404, f"No batch found with id '{batch_id}'")
        return b

    def _poll(self, b: _Batch) -> None:
        """Count one retrieval and run the batch when it is due."""
        with self._lock:
            b.polls += 1
            if b.status in ("cancelling", "canceling"):
                b.status = "cancelled" if b.provider == "openai" else "ended"
                b.canceled, b.ended_at = len(b.lines), int(time.time())
                return
            due = (
                b.status in ("validating", "in_progress")
                and self.clock.now() - b.created >= self.batch_delay_s
                and b.polls > self.batch_polls
            )
            if not due:
                if b.status == "validating":
                    b.status = "in_progress"
                return
            b.status = "finalizing"
        if b.provider == "openai":
            self._run_openai_batch(b)
        else:
            self._run_anthropic_batch(b)

    def _run_openai_batch(self, b: _Batch) -> None:
        out: list[bytes] = []
        err: list[bytes] = []
        for custom_id, req in b.lines:
            line_id = self._new_id("batch_req_")
            try:
                if not isinstance(req, dict):
                    raise _Failure(400, "body: must be a JSON object")
                payload, _ = self._chat(req, batch=True, custom_id=custom_id)
                response = {"status_code": 200, "request_id": self._new_id("req_"), "body": payload}
                out.append(
                    _dumps(
                        {"id": line_id, "custom_id": custom_id, "response": response, "error": None}
                    )
                )
                b.completed += 1
            except _Failure as failure:
                body = json.loads(self._error("openai", failure).body)
                response = {
                    "status_code": failure.status,
                    "request_id": self._new_id("req_"),
                    "body": body,
                }
                err.append(
                    _dumps(
                        {"id": line_id, "custom_id": custom_id, "response": response, "error": None}
                    )
                )
                b.failed += 1
        now = int(time.time())
        with self._lock:
            if out:
                f = _File(
                    self._new_id("file-"),
                    "batch_output.jsonl",
                    "batch_output",
                    b"\n".join(out) + b"\n",
                    now,
                )
                self._files[f.id] = f
                b.output_file_id = f.id
            if err:
                f = _File(
                    self._new_id("file-"),
                    "batch_errors.jsonl",
                    "batch_output",
                    b"\n".join(err) + b"\n",
                    now,
                )
                self._files[f.id] = f
                b.error_file_id = f.id
            b.status, b.ended_at = "completed", now

    def _oa_batch_object(self, b: _Batch) -> dict[str, Any]:
        total = len(b.lines)
        return {
            "id": b.id,
            "object": "batch",
            "endpoint": b.endpoint,
            "errors": b.errors,
            "input_file_id": b.input_file_id,
            "completion_window": b.completion_window,
            "status": b.status,
            "output_file_id": b.output_file_id,
            "error_file_id": b.error_file_id,
            "created_at": b.created_at,
            "in_progress_at": b.created_at if b.status != "validating" else None,
            "expires_at": b.created_at + 86400,
            "finalizing_at": b.ended_at,
            "completed_at": b.ended_at if b.status == "completed" else None,
            "failed_at": b.created_at if b.status == "failed" else None,
            "expired_at": None,
            "cancelling_at": b.cancel_at,
            "cancelled_at": b.ended_at if b.status == "cancelled" else None,
            "request_counts": {"total": total, "completed": b.completed, "failed": b.failed},
            "metadata": b.metadata,
        }

    def _r_oa_batch_get(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        b = self._get_batch(id, "openai")
        self._poll(b)
        return self._ok("openai", self._oa_batch_object(b))

    def _r_oa_batch_cancel(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        b = self._get_batch(id, "openai")
        with self._lock:
            if b.status not in ("validating", "in_progress"):
                raise _Failure(400, f"Cannot cancel a batch with status '{b.status}'.")
            b.status, b.cancel_at = "cancelling", int(time.time())
        return self._ok("openai", self._oa_batch_object(b))

    # ------------------------------------------------------------ Anthropic

    def _message(
        self, req: Mapping[str, Any], *, batch: bool, custom_id: str | None = None
    ) -> tuple[dict[str, Any], Fault | None]:
        """Run one Messages request; returns the Message and the fault that fired."""
        price = self._price(req.get("model"), "anthropic")
        model = str(req["model"])
        if req.get("stream"):
            raise _Failure(400, "stream: streaming is not supported by the semframe emulator")
        if req.get("tools"):
            raise _Failure(400, "tools: tool use is not supported by the semframe emulator")
        max_tokens = req.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _Failure(400, "max_tokens: Field required (an integer >= 1)")
        messages = req.get("messages")
        system = req.get("system")
        try:
            blocks = anthropic_blocks(system, messages if isinstance(messages, list) else [])
            text = prompt_text(system, messages if isinstance(messages, list) else [])
            check_breakpoints(blocks)
        except (FramingError, CacheRuleError) as exc:
            raise _Failure(400, str(exc)) from None
        fmt = req.get("output_format")
        schema = fmt.get("schema") if isinstance(fmt, Mapping) else None

        if not batch:
            self._admit("anthropic", model, sum(len(b.tokens) for b in blocks) + max_tokens)
        fault = self.faults.pick("anthropic", text)
        if batch and fault is not None and fault.kind not in ("empty", "rate_limit"):
            fault = Fault.server_error(500)
        if fault is not None and fault.kind in ("rate_limit", "server_error"):
            raise self._refuse(
                "anthropic", model, fault, batch=batch, custom_id=custom_id, cache_key=None
            )
        if fault is not None and fault.kind == "hang":
            self._wait(fault.seconds)

        arrival = self.clock.now()
        with self._lock:
            ticket = self._anthropic_sim(price).begin(blocks, arrival=arrival)
        answer, out_tokens, cut = self._answer(
            "anthropic", model, text, schema=schema, max_tokens=max_tokens, fault=fault
        )
        if not batch:
            self._wait(self.latency_for("anthropic").of(out_tokens))
        completion = self.clock.now()
        with self._lock:
            self._anthropic_sim(price).complete(ticket, at=completion)
        r = ticket.result
        bill = cost(
            price,
            uncached_input_tokens=r.input_tokens,
            cached_input_tokens=r.cache_read_input_tokens,
            cache_write_5m_tokens=r.ephemeral_5m_input_tokens,
            cache_write_1h_tokens=r.ephemeral_1h_input_tokens,
            output_tokens=out_tokens,
            batch=batch,
        )
        self.ledger.record(
            LedgerEntry(
                "anthropic", model, 200, r.prompt_tokens, r.cache_read_input_tokens,
                r.ephemeral_5m_input_tokens, r.ephemeral_1h_input_tokens, out_tokens, bill,
                arrival, completion, batch, custom_id, None, fault.kind if fault else None,
            )
        )  # fmt: skip
        payload = {
            "id": self._new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": answer}],
            "stop_reason": "max_tokens" if cut else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": r.input_tokens,
                "cache_creation_input_tokens": r.cache_creation_input_tokens,
                "cache_read_input_tokens": r.cache_read_input_tokens,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": r.ephemeral_5m_input_tokens,
                    "ephemeral_1h_input_tokens": r.ephemeral_1h_input_tokens,
                },
                "output_tokens": out_tokens,
                "service_tier": "batch" if batch else "standard",
            },
        }
        return payload, fault

    def _r_messages(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        payload, fault = self._message(self._json(body), batch=False)
        return self._live("anthropic", payload, fault)

    def _r_count_tokens(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        req = self._json(body)
        self._price(req.get("model"), "anthropic")
        messages = req.get("messages")
        try:
            blocks = anthropic_blocks(
                req.get("system"), messages if isinstance(messages, list) else []
            )
        except FramingError as exc:
            raise _Failure(400, str(exc)) from None
        return self._ok("anthropic", {"input_tokens": sum(len(b.tokens) for b in blocks)})

    def _r_an_batch_create(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        req = self._json(body)
        requests = req.get("requests")
        if not isinstance(requests, list) or not requests:
            raise _Failure(400, "requests: must be a non-empty list")
        lines: list[tuple[str, Any]] = []
        seen: set[str] = set()
        for i, item in enumerate(requests):
            if not isinstance(item, Mapping) or "custom_id" not in item or "params" not in item:
                raise _Failure(400, f"requests.{i}: needs 'custom_id' and 'params'")
            cid = str(item["custom_id"])
            if cid in seen:
                raise _Failure(400, f"requests.{i}.custom_id: duplicate custom_id {cid!r}")
            seen.add(cid)
            lines.append((cid, item["params"]))
        b = _Batch(
            self._new_id("msgbatch_"), "anthropic", self.clock.now(), int(time.time()), lines
        )
        b.status = "in_progress"
        with self._lock:
            self._batches[b.id] = b
        return self._ok("anthropic", self._an_batch_object(b))

    def _run_anthropic_batch(self, b: _Batch) -> None:
        results: list[dict[str, Any]] = []
        for custom_id, params in b.lines:
            try:
                if not isinstance(params, dict):
                    raise _Failure(400, "params: must be a JSON object")
                payload, _ = self._message(params, batch=True, custom_id=custom_id)
                results.append(
                    {"custom_id": custom_id, "result": {"type": "succeeded", "message": payload}}
                )
                b.completed += 1
            except _Failure as failure:
                error = json.loads(self._error("anthropic", failure).body)
                results.append(
                    {"custom_id": custom_id, "result": {"type": "errored", "error": error}}
                )
                b.failed += 1
        with self._lock:
            b.results = results
            b.status, b.ended_at = "ended", int(time.time())

    def _an_batch_object(self, b: _Batch) -> dict[str, Any]:
        ended = b.status == "ended"
        processing = 0 if ended else len(b.lines)
        return {
            "id": b.id,
            "type": "message_batch",
            "processing_status": b.status,
            "request_counts": {
                "processing": processing,
                "succeeded": b.completed,
                "errored": b.failed,
                "canceled": b.canceled,
                "expired": 0,
            },
            "ended_at": _iso(b.ended_at),
            "created_at": _iso(b.created_at),
            "expires_at": _iso(b.created_at + 86400),
            "archived_at": None,
            "cancel_initiated_at": _iso(b.cancel_at),
            "results_url": f"{self.base_url}/v1/messages/batches/{b.id}/results" if ended else None,
        }

    def _r_an_batch_get(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        b = self._get_batch(id, "anthropic")
        self._poll(b)
        return self._ok("anthropic", self._an_batch_object(b))

    def _r_an_batch_results(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        b = self._get_batch(id, "anthropic")
        with self._lock:
            if b.status != "ended":
                raise _Failure(400, f"Batch {id} has not ended; results are not available yet.")
            if b.canceled and not b.results:
                lines = [{"custom_id": cid, "result": {"type": "canceled"}} for cid, _ in b.lines]
            else:
                lines = list(b.results)
        data = b"".join(_dumps(line) + b"\n" for line in lines)
        return Reply(200, data, content_type="application/binary")

    def _r_an_batch_cancel(self, body: bytes, headers: Mapping[str, str], id: str) -> Reply:
        b = self._get_batch(id, "anthropic")
        with self._lock:
            if b.status != "in_progress":
                raise _Failure(400, f"Cannot cancel a batch with processing_status '{b.status}'.")
            b.status, b.cancel_at = "canceling", int(time.time())
        return self._ok("anthropic", self._an_batch_object(b))


def _openai_cache_rules(
    req: Mapping[str, Any], price: Price, messages: Any
) -> tuple[list[Block] | None, str]:
    """How a chat request is cached: its breakpoint blocks (None: automatic), and its retention.

    Breakpoint models (GPT-5.6 on) take ``prompt_cache_options`` (``mode``
    implicit or explicit, ``ttl`` 30m) and ``prompt_cache_breakpoint`` on text
    parts; the other models take neither, and ``prompt_cache_retention`` only
    with a value the price table lists for them. Setting ``prompt_cache_options``
    and ``prompt_cache_retention`` together is refused.
    """
    options = req.get("prompt_cache_options")
    retention = req.get("prompt_cache_retention")
    marked = isinstance(messages, list) and any(
        isinstance(m, Mapping)
        and isinstance(m.get("content"), list)
        and any(isinstance(p, Mapping) and "prompt_cache_breakpoint" in p for p in m["content"])
        for m in messages
    )
    if price.caching != "breakpoints":
        if options is not None or marked:
            field = "prompt_cache_options" if options is not None else "prompt_cache_breakpoint"
            msg = f"{field}: supported for gpt-5.6 and later models, not {price.model!r}"
            raise _Failure(400, msg)
        if retention is None:
            return None, price.retention[0] if price.retention else "in_memory"
        if retention not in price.retention:
            takes = ", ".join(repr(r) for r in price.retention) or "none"
            msg = (
                f"prompt_cache_retention: {retention!r} is not supported for {price.model!r} "
                f"(supported: {takes})"
            )
            raise _Failure(400, msg)
        return None, str(retention)
    if options is not None and retention is not None:
        msg = (
            "prompt_cache_options.ttl supersedes prompt_cache_retention: set one of them, not both"
        )
        raise _Failure(400, msg)
    mode, ttl = "implicit", "30m"
    if options is not None:
        if not isinstance(options, Mapping):
            raise _Failure(400, f"prompt_cache_options: must be an object, got {options!r}")
        mode = options.get("mode", "implicit")
        ttl = options.get("ttl", "30m")
        if mode not in ("implicit", "explicit"):
            msg = f"prompt_cache_options.mode: must be 'implicit' or 'explicit', got {mode!r}"
            raise _Failure(400, msg)
        if ttl != "30m":
            raise _Failure(400, f"prompt_cache_options.ttl: only '30m' is supported, got {ttl!r}")
    try:
        blocks = openai_blocks(messages, implicit=mode == "implicit", ttl="30m")
    except FramingError as exc:
        raise _Failure(400, str(exc)) from None
    return blocks, "in_memory"


_SERVICE_TIERS = ("auto", "default", "flex", "priority")
"""``service_tier`` values a chat request may carry (``auto`` is served at ``default``)."""


def _openai_service_tier(req: Mapping[str, Any], price: Price) -> str:
    """The tier a chat request is served and billed at: ``default``, ``flex`` or ``priority``.

    ``flex`` and ``priority`` only for a model whose price entry lists them in
    ``service_tiers``; another model is refused with a 400, as OpenAI does (no
    fall-back to the default tier).
    """
    tier = req.get("service_tier")
    if tier is None or tier in ("auto", "default"):
        return "default"
    if tier not in _SERVICE_TIERS:
        valid = ", ".join(repr(t) for t in _SERVICE_TIERS)
        raise _Failure(400, f"service_tier: must be one of {valid}, got {tier!r}")
    if tier not in dict(price.service_tiers):
        msg = f"service_tier: {tier!r} is not supported for model {price.model!r}"
        raise _Failure(400, msg)
    return str(tier)


def _openai_top_logprobs(req: Mapping[str, Any]) -> int | None:
    """``top_logprobs`` asked for (0 with bare ``logprobs``), or None when none are."""
    top = req.get("top_logprobs")
    if not req.get("logprobs"):
        if top is not None:
            raise _Failure(400, "top_logprobs: requires logprobs to be true")
        return None
    if top is None:
        return 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise _Failure(400, f"top_logprobs: must be an integer in [0, 20], got {top!r}")
    return top


_LOGPROB_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


def openai_logprobs(answer: str, top: int) -> dict[str, Any]:
    """A deterministic ``choices[0].logprobs`` for ``answer``, in OpenAI's shape.

    Tokens are words and punctuation (with leading spaces); each gets a
    logprob in ``(-1, 0]`` derived from its text and position, and ``top``
    alternatives: the token itself, then made-up ones each less likely.

    Examples
    --------
    >>> lp = openai_logprobs('{"a": "b"}', 2)
    >>> "".join(t["token"] for t in lp["content"])
    '{"a": "b"}'
    >>> [len(t["top_logprobs"]) for t in lp["content"]][:2]
    [2, 2]
    """
    content = []
    for n, m in enumerate(_LOGPROB_TOKEN.finditer(answer)):
        token = m.group()
        logprob = -(hash_fraction(f"{n}:{token}"))
        alts = [(token, logprob)] + [(f"{token}~{k}", logprob - k) for k in range(1, top)]
        content.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alts[:top]
                ],
            }
        )
    return {"content": content, "refusal": None}


def hash_fraction(text: str) -> float:
    """A deterministic number in ``[0, 1)`` from ``text``."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _openai_schema(fmt: Any) -> Mapping[str, Any] | None:
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise _Failure(400, "response_format: must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise _Failure(
                400, "response_format.json_schema.schema: a JSON schema object is required"
            )
        return spec["schema"]  # type: ignore[no-any-return]
    raise _Failure(
        400, f"response_format.type: must be 'text', 'json_object' or 'json_schema', got {kind!r}"
    )


def _file_object(f: _File) -> dict[str, Any]:
    return {
        "id": f.id,
        "object": "file",
        "bytes": len(f.data),
        "created_at": f.created_at,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def _batch_error(code: str, message: str, line: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"code": code, "message": message, "line": line, "param": None}],
    }
