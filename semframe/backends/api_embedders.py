"""Embedding models behind an API: ``embed_model="openai:<model>"`` and ``"gemini:<model>"``.

The models are those of the price table's ``[embeddings."<model>"]`` entries
(:func:`semframe.cost.pricing.embedding_models`: ``text-embedding-3-small``,
``text-embedding-3-large``, ``gemini-embedding-001``), sent through the
official SDKs (``openai``, ``google-genai``) with the settings the chat
backends use: ``base_url``, ``timeout`` (``None``: 120 s), ``connect_timeout``
and ``max_retries``; keys come from ``OPENAI_API_KEY``, and from
``GEMINI_API_KEY`` or ``GOOGLE_API_KEY``.

An :class:`ApiEmbedder` is an :class:`~semframe.backends.embedders.Embedder`:

- before anything is sent, every text is counted
  (:func:`semframe.cost.tokens.count_for_model`: ``cl100k_base`` for OpenAI,
  an ``o200k_base`` approximation for Gemini); an empty text, or one over the
  model's ``max_input_tokens``, is an :class:`~semframe.errors.InputError`
  naming it (the providers refuse both; semframe never truncates);
- texts go in requests of at most ``max_inputs`` texts and
  ``max_request_tokens`` tokens (the price table's limits);
- 408, 409, 429, 5xx, timeouts and dropped connections are retried
  ``max_retries`` times with exponential backoff (the server's
  ``Retry-After`` wins); other errors stop the call;
- vectors come back L2-normalised float32, at the model's full size.

Its ``name`` (the embedding store's key) is ``"<provider>:<model>"``, with
``"@<endpoint>"`` appended when the requests go elsewhere than the provider's
own API (``base_url``, or ``OPENAI_BASE_URL``), so vectors of another server
never mix with the provider's.

What the requests cost is counted in :class:`EmbedUsage` while a
:func:`usage_scope` is open (:func:`semframe.operators.embed.embed_groups`
opens one per call): tokens as the provider bills them (OpenAI's reported
``usage.prompt_tokens``; Gemini reports none, so its counted tokens), dollars
at the table's ``input`` price.

Examples
--------
>>> split_model("openai:text-embedding-3-small")
('openai', 'text-embedding-3-small')
>>> split_model("minilm") is None
True
>>> api_price("gemini:gemini-embedding-001").max_inputs
100
>>> batches([3, 3, 3, 3, 3], max_inputs=2, max_tokens=0)
[(0, 2), (2, 4), (4, 5)]
>>> batches([3, 3, 3, 3], max_inputs=10, max_tokens=7)
[(0, 2), (2, 4)]
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semframe.backends._api import backoff, classify_error
from semframe.backends.base import DEFAULT_TIMEOUT
from semframe.backends.gemini import classify_error as gemini_error
from semframe.cost.pricing import EmbeddingPrice, embedding_models, embedding_price
from semframe.cost.tokens import count_for_model
from semframe.errors import (
    ConfigError,
    InputError,
    MissingDependencyError,
    SemframeError,
    TransientError,
    format_choices,
)

__all__ = [
    "DEFAULT_ENDPOINTS",
    "INSTALL",
    "PROVIDERS",
    "ApiEmbedder",
    "EmbedUsage",
    "api_price",
    "batches",
    "endpoint",
    "from_settings",
    "require_sdk",
    "split_model",
    "store_name",
    "usage_scope",
]

PROVIDERS = ("openai", "gemini")
"""The ``embed_model`` prefixes of API embedders."""
INSTALL = {
    "openai": "pip install 'semframe[openai]'",
    "gemini": "pip install 'semframe[gemini]'",
}
"""The install line of each provider's SDK."""
DEFAULT_ENDPOINTS = {
    "openai": "https://api.openai.com/v1",
    "gemini": "https://generativelanguage.googleapis.com",
}
"""Each provider's own API: vectors from there are stored under ``"<provider>:<model>"``."""
_GEMINI_KEYS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")  # the SDK's order of precedence
_PREVIEW = 60  # characters of a text quoted in an error


def split_model(name: str) -> tuple[str, str] | None:
    """``(provider, model)`` of an ``"openai:<model>"`` / ``"gemini:<model>"`` name, or ``None``."""
    provider, sep, model = name.partition(":")
    if not sep or provider not in PROVIDERS:
        return None
    return provider, model


def api_price(name: str) -> EmbeddingPrice:
    """The price and limits of the API embedder ``name`` (``"<provider>:<model>"``).

    Raises
    ------
    InputError
        For a model the price table does not list under that provider, naming the ones it does.
    """
    split = split_model(name)
    if split is None:
        msg = f"{name!r} is not an API embedder name ('openai:<model>' or 'gemini:<model>')."
        raise InputError(msg)
    provider, model = split
    known = [f"{p}:{m}" for p in PROVIDERS for m in embedding_models(p)]
    try:
        price = embedding_price(model)
    except ConfigError:
        price = None
    if price is None or price.provider != provider:
        msg = (
            f"unknown embed_model {name!r}: semframe knows the price and limits of "
            f"{format_choices(known)} (the [embeddings] table of semframe/data/prices.toml)."
        )
        raise InputError(msg)
    return price


def require_sdk(provider: str) -> None:
    """Fail unless ``provider``'s SDK can be imported.

    Raises
    ------
    MissingDependencyError
        With the install line.
    """
    try:
        if provider == "openai":
            import openai  # noqa: F401
        else:
            from google import genai  # noqa: F401
    except ImportError:
        sdk = "openai" if provider == "openai" else "google-genai"
        msg = f'embed_model="{provider}:..." needs the {sdk} SDK: {INSTALL[provider]}'
        raise MissingDependencyError(msg) from None


def endpoint(provider: str, base_url: str | None) -> str:
    """Where ``provider``'s requests go: ``base_url``, the SDK's variable, or its own API.

    Examples
    --------
    >>> endpoint("gemini", None)
    'https://generativelanguage.googleapis.com'
    >>> endpoint("openai", "http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000/v1'
    """
    if base_url is None:
        variable = "OPENAI_BASE_URL" if provider == "openai" else "GOOGLE_GEMINI_BASE_URL"
        base_url = os.environ.get(variable) or None
    return (base_url or DEFAULT_ENDPOINTS[provider]).rstrip("/")


def store_name(name: str, base_url: str | None) -> str:
    """The embedding store's name for the vectors of API embedder ``name`` from ``base_url``.

    Examples
    --------
    >>> store_name("openai:text-embedding-3-small", "https://api.openai.com/v1")
    'openai:text-embedding-3-small'
    >>> store_name("openai:text-embedding-3-small", "http://127.0.0.1:9/v1")
    'openai:text-embedding-3-small@http://127.0.0.1:9/v1'
    """
    split = split_model(name)
    assert split is not None, name
    where = endpoint(split[0], base_url)
    return name if where == DEFAULT_ENDPOINTS[split[0]] else f"{name}@{where}"


def batches(counts: Sequence[int], *, max_inputs: int, max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, stop)`` runs of texts, each within both request limits.

    ``counts`` are the texts' tokens; ``max_tokens`` 0 means no token limit.
    Each text must fit a request alone (see :meth:`ApiEmbedder.check`).
    """
    out: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, n in enumerate(counts):
        full = i - start >= max_inputs or (max_tokens and used + n > max_tokens)
        if i > start and full:
            out.append((start, i))
            start, used = i, 0
        used += n
    if start < len(counts):
        out.append((start, len(counts)))
    return out


@dataclass
class EmbedUsage:
    """What API embedding requests cost (while a :func:`usage_scope` is open).

    Attributes
    ----------
    requests : int
        Requests sent, retries included.
    retries : int
        Of those, the ones sent again after a transient error.
    rate_limited : int
        429s received.
    texts : int
        Texts embedded.
    tokens : int
        Input tokens billed (OpenAI's reported counts; Gemini's counted, approximate),
        including, as counted, those of attempts that may have been billed though no
        answer came back (a read timeout, a dropped connection, a malformed answer).
    dollars : float
        Their price.
    seconds : float
        Time spent in requests, backoff included.
    """

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    texts: int = 0
    tokens: int = 0
    dollars: float = 0.0
    seconds: float = 0.0


_USAGE: ContextVar[EmbedUsage | None] = ContextVar("semframe_embed_usage", default=None)


@contextlib.contextmanager
def usage_scope() -> Iterator[EmbedUsage]:
    """Count the API embedding requests made inside the block (in this context)."""
    usage = EmbedUsage()
    token = _USAGE.set(usage)
    try:
        yield usage
    finally:
        _USAGE.reset(token)


Sender = Callable[[list[str]], tuple[list[list[float]], int | None]]
"""Sends one request: the texts' vectors and the billed tokens (``None``: not reported)."""


class ApiEmbedder:
    """An embedding model behind the OpenAI or Gemini API (see the module docs).

    Parameters
    ----------
    name : str
        ``"openai:<model>"`` or ``"gemini:<model>"``.
    base_url : str, optional
        Another endpoint (an emulator, a proxy); ``None``: the provider's API.
    timeout : float, optional
        Seconds one attempt may take (``None``: :data:`~semframe.backends.base.DEFAULT_TIMEOUT`).
    connect_timeout : float
        Seconds to connect.
    max_retries : int
        Retries of a transient failure.
    price : EmbeddingPrice, optional
        The model's price and limits (``None``: the price table's).

    Raises
    ------
    InputError
        For an unknown model.
    MissingDependencyError
        Without the provider's SDK.
    ConfigError
        Without an API key (OpenAI: unless ``base_url`` is given, for servers without keys).
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        timeout: float | None = None,
        connect_timeout: float = 10.0,
        max_retries: int = 3,
        price: EmbeddingPrice | None = None,
    ) -> None:
        self.price = price if price is not None else api_price(name)
        split = split_model(name)
        assert split is not None
        self.provider, self.model = split
        require_sdk(self.provider)
        self.endpoint = endpoint(self.provider, base_url)
        self.name = store_name(name, base_url)
        self.dim = self.price.dimensions
        self.max_retries = max_retries
        seconds = timeout or DEFAULT_TIMEOUT
        if self.provider == "openai":
            self._send, self._secret = _openai_sender(
                self.model, base_url, seconds, connect_timeout
            )
        else:
            self._send, self._secret = _gemini_sender(self.model, base_url, seconds)

    def __repr__(self) -> str:
        return f"ApiEmbedder({self.provider}:{self.model}, endpoint={self.endpoint!r})"

    def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text, as the provider counts them (Gemini: approximately)."""
        return list(count_for_model(list(texts), self.model).tokens)

    def check(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens; an empty text or one over ``max_input_tokens`` is an error.

        Raises
        ------
        InputError
            Naming the first such text; nothing has been sent.
        """
        counts = self.count(texts)
        limit = self.price.max_input_tokens
        for i, (text, n) in enumerate(zip(texts, counts, strict=True)):
            if not text:
                msg = (
                    f"embed_model={self.provider}:{self.model} cannot embed an empty text "
                    f"(text {i + 1} of {len(texts)}; the API refuses it). Nothing was sent; "
                    "drop or fill the empty cells first."
                )
                raise InputError(msg)
            if n > limit:
                preview = text[:_PREVIEW] + ("..." if len(text) > _PREVIEW else "")
                msg = (
                    f"embed_model={self.provider}:{self.model} takes at most {limit:,} tokens "
                    f"per text; text {i + 1} of {len(texts)} ({preview!r}) has {n:,}. Nothing "
                    "was sent; shorten the long texts (e.g. keep their first few thousand "
                    "characters) or use another embed_model."
                )
                raise InputError(msg)
        return counts

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """One unit-length float32 row per text, in order (see the module docs)."""
        texts = list(texts)
        counts = self.check(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        spans = batches(
            counts, max_inputs=self.price.max_inputs, max_tokens=self.price.max_request_tokens
        )
        for start, stop in spans:
            vectors = self._request(texts[start:stop], sum(counts[start:stop]))
            out[start:stop] = vectors
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        unit: NDArray[np.float32] = (out / np.maximum(norms, 1e-12)).astype(np.float32)
        return unit

    def _request(self, texts: list[str], counted: int) -> NDArray[np.float32]:
        """One request, retried on transient errors; its usage counted."""
        usage = _USAGE.get()
        began = time.monotonic()
        attempt = 0
        try:
            while True:
                attempt += 1
                if usage is not None:
                    usage.requests += 1
                    usage.retries += attempt > 1
                try:
                    vectors, billed = self._send(texts)
                except Exception as exc:  # the SDK's errors, mapped to semframe's
                    error = self._classify(exc)
                    if isinstance(error, TransientError):
                        if usage is not None:
                            usage.rate_limited += error.rate_limited
                            if error.maybe_billed:  # counted, so nothing billed goes unseen
                                usage.tokens += counted
                                usage.dollars += self.price.dollars(counted)
                        if attempt <= self.max_retries:
                            time.sleep(backoff(attempt, error.retry_after))
                            continue
                        msg = (
                            f"{error} (embedding {len(texts)} texts with "
                            f"{self.provider}:{self.model}, after {attempt} attempts; raise "
                            "max_retries or try again later)"
                        )
                        raise TransientError(
                            msg, rate_limited=error.rate_limited, maybe_billed=error.maybe_billed
                        ) from exc
                    if error is exc:
                        raise
                    raise error from exc
                break
        finally:
            if usage is not None:
                usage.seconds += time.monotonic() - began
        tokens = counted if billed is None else billed
        if usage is not None:  # answered, so billed, whatever the answer holds
            usage.texts += len(texts)
            usage.tokens += tokens
            usage.dollars += self.price.dollars(tokens)
        array = np.asarray(vectors, dtype=np.float32)
        if array.shape != (len(texts), self.dim):
            msg = (
                f"{self.provider}:{self.model} answered {len(texts)} texts with vectors of "
                f"shape {array.shape}; expected ({len(texts)}, {self.dim})."
            )
            raise SemframeError(msg)
        return array

    def _classify(self, exc: BaseException) -> BaseException:
        if self.provider == "openai":
            return classify_error(exc, provider="openai", secrets=(self._secret,))
        return gemini_error(exc, secrets=(self._secret,))


def _openai_sender(
    model: str, base_url: str | None, timeout: float, connect_timeout: float
) -> tuple[Sender, str]:
    import openai

    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        if base_url is None and not os.environ.get("OPENAI_BASE_URL"):
            msg = (
                f'embed_model="openai:{model}" needs an API key: set the OPENAI_API_KEY '
                "environment variable (for an OpenAI-compatible server without keys, set "
                "base_url=)."
            )
            raise ConfigError(msg)
        key = "no-key-needed"
    client = openai.OpenAI(
        api_key=key,
        base_url=base_url,
        timeout=openai.Timeout(timeout, connect=connect_timeout),
        max_retries=0,
    )

    def send(texts: list[str]) -> tuple[list[list[float]], int | None]:
        answer = client.embeddings.create(model=model, input=texts)
        data = sorted(answer.data, key=lambda d: d.index)
        usage = getattr(answer, "usage", None)
        billed = getattr(usage, "prompt_tokens", None)
        return [list(d.embedding) for d in data], billed if isinstance(billed, int) else None

    return send, key


def _gemini_sender(model: str, base_url: str | None, timeout: float) -> tuple[Sender, str]:
    from google import genai
    from google.genai import types

    key = next((os.environ[k] for k in _GEMINI_KEYS if os.environ.get(k)), None)
    if not key:
        msg = (
            f'embed_model="gemini:{model}" needs an API key: set the GEMINI_API_KEY (or '
            "GOOGLE_API_KEY) environment variable."
        )
        raise ConfigError(msg)
    options = types.HttpOptions(
        base_url=base_url,
        timeout=round(timeout * 1000),
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    # the Gemini API, never Vertex AI (GOOGLE_GENAI_USE_VERTEXAI): the store names the endpoint
    client = genai.Client(api_key=key, http_options=options, vertexai=False)

    def send(texts: list[str]) -> tuple[list[list[float]], int | None]:
        contents: list[Any] = list(texts)  # one Content per text
        answer = client.models.embed_content(model=model, contents=contents)
        found = answer.embeddings or []
        return [list(e.values or []) for e in found], None  # Gemini reports no token usage

    return send, key


def from_settings(name: str, settings: Mapping[str, Any]) -> ApiEmbedder:
    """The API embedder ``name`` built from resolved settings (see :class:`ApiEmbedder`)."""
    return ApiEmbedder(
        name,
        base_url=settings.get("base_url"),
        timeout=settings.get("timeout"),
        connect_timeout=settings.get("connect_timeout") or 10.0,
        max_retries=int(settings.get("max_retries", 3)),
    )
