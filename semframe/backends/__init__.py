"""Backends: where requests go. Chosen by configuration, never by code change.

``get_backend(name, model=..., settings=...)`` builds one from the registry
and keeps it: one instance per backend name, model, the settings that backend
reads and the credential it found (a digest of it; the key itself is not
kept), so an engine starts once and an API client is reused.
:func:`reset_backends` forgets them (tests, or after changing a key).
:func:`cost_model` gives a backend's cost model, also where the backend itself
cannot be built here (an API without its key can still be priced).

Backends register lazily (by module path), so importing semframe imports no
engine or SDK.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from semframe.backends.base import Backend, Capabilities
from semframe.backends.providers import route
from semframe.config import SETTINGS, ResolvedConfig
from semframe.core.wire import Completion, Request, Usage
from semframe.cost.models import CostModel
from semframe.errors import ConfigError, MissingDependencyError, did_you_mean, format_choices

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendSpec",
    "Capabilities",
    "Completion",
    "Request",
    "Usage",
    "cost_model",
    "default_model",
    "describe",
    "get_backend",
    "register_backend",
    "reset_backends",
]

Factory = Callable[[str | None, Mapping[str, Any]], Any]
"""``(model, settings) -> backend`` (or cost model): model ``None`` means the default."""

ModelRule = Callable[[Mapping[str, Any]], str | None]
"""``settings -> model``: the model a backend runs when ``model`` is not set."""

Check = Callable[[str | None], str | None]
"""``model -> None`` where a backend can run here, else what it lacks."""


@dataclass(frozen=True)
class BackendSpec:
    """How to build one backend.

    Attributes
    ----------
    factory : str or callable
        ``(model, settings) -> Backend``, or its ``"module:function"`` path.
    settings : tuple of str
        The settings the factory reads: instances with different values of
        these are different instances.
    secrets : tuple of str
        Environment variables holding its credential: instances built with
        different keys are different instances.
    cost : str or callable or None
        ``(model, settings) -> CostModel`` for pricing without building the
        backend (an API without its key); ``None`` when the backend must be built.
    model : str or callable or None
        The model it runs when ``model`` is not set, read without building
        it (``semframe.config()`` shows it): the ``"module:NAME"`` path of the
        constant the factory falls back on, or ``settings -> model``; ``None``:
        not known before the backend is built.
    check : str or callable or None
        ``model -> None`` where the backend can run here, else what it lacks
        and how to install it (``semframe.config()`` says so): a callable or
        its ``"module:function"`` path; ``None``: not checked.
    threads : str or None
        The setting (one of :attr:`settings`) giving the CPU threads it
        computes with, ``None`` there meaning every core: a Ray replica
        (``executor="ray"``) fills it with the CPUs it reserves
        (``ray_num_cpus``), so replicas sharing a node do not each take every
        core. ``None``: it computes on no CPU threads of its own (an API client).
    """

    factory: str | Factory
    settings: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    cost: str | Factory | None = None
    model: str | ModelRule | None = None
    check: str | Check | None = None
    threads: str | None = None


def _vllm_model(settings: Mapping[str, Any]) -> str | None:
    """In process, its default model; a server at ``base_url`` has none (``model=`` names it)."""
    return None if settings["base_url"] else _named("semframe.backends.vllm:DEFAULT_MODEL")


_API = ("client", "base_url", "timeout", "connect_timeout", "max_concurrency", "prices")
BACKENDS: dict[str, BackendSpec] = {
    "local": BackendSpec(
        "semframe.backends.local:create",
        settings=(
            "local_parallel",
            "local_n_ctx",
            "local_threads",
            "local_cache_ram_mib",
            "cache_dir",
        ),
        model="semframe.backends.local:DEFAULT_MODEL",
        check="semframe.backends.local:lacking",
        threads="local_threads",
    ),
    "openai": BackendSpec(
        "semframe.backends.openai:create",
        settings=(
            *_API,
            "context_window",
            "cache_directives",
            "cache_retention",
            "service_tier",
        ),
        secrets=("OPENAI_API_KEY",),
        cost="semframe.backends.openai:cost_model",
        model="semframe.backends.openai:DEFAULT_MODEL",
    ),
    "anthropic": BackendSpec(
        "semframe.backends.anthropic:create",
        settings=(*_API, "cache_ttl", "cache_directives"),
        secrets=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
        cost="semframe.backends.anthropic:cost_model",
        model="semframe.backends.anthropic:DEFAULT_MODEL",
    ),
    "gemini": BackendSpec(
        "semframe.backends.gemini:create",
        settings=(*_API, "cache_ttl", "cache_directives"),
        secrets=("GOOGLE_API_KEY", "GEMINI_API_KEY"),
        cost="semframe.backends.gemini:cost_model",
        model="semframe.backends.gemini:DEFAULT_MODEL",
    ),
    "vllm": BackendSpec(
        "semframe.backends.vllm:create",
        settings=(*_API, "context_window", "vllm_scheduler", "vllm_args", "cache_dir"),
        secrets=("OPENAI_API_KEY",),
        model=_vllm_model,
    ),
    "fake": BackendSpec(
        "semframe.backends.fake:create", model="semframe.backends.fake:DEFAULT_MODEL"
    ),
}
"""Backend name -> how to build it."""

_instances: dict[tuple[Any, ...], Any] = {}
_lock = threading.RLock()


def register_backend(
    name: str,
    factory: str | Factory | BackendSpec,
    *,
    settings: tuple[str, ...] = (),
    secrets: tuple[str, ...] = (),
    cost: str | Factory | None = None,
    model: str | ModelRule | None = None,
    check: str | Check | None = None,
    threads: str | None = None,
) -> None:
    """Register (or replace) the backend called ``name``; its instances are rebuilt.

    Parameters
    ----------
    name : str
        What ``backend=`` names.
    factory : str, callable or BackendSpec
        ``(model, settings) -> Backend``, or its ``"module:function"`` path; or
        a whole spec (one saved from :data:`BACKENDS`, say).
    settings, secrets, cost, model, check, threads
        As for :class:`BackendSpec` (with a factory).

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> mine = FakeBackend(model="mine")
    >>> register_backend("mine", lambda model, settings: mine)
    >>> get_backend("mine", model=None, settings={}) is mine
    True
    """
    spec = (
        factory
        if isinstance(factory, BackendSpec)
        else BackendSpec(factory, settings, secrets, cost, model, check, threads)
    )
    with _lock:
        BACKENDS[name] = spec
    reset_backends(name)


def reset_backends(name: str | None = None) -> None:
    """Close and forget the backends built so far (those called ``name``, or all).

    The next call builds them again.

    Examples
    --------
    >>> first = get_backend("fake", model="m", settings={})
    >>> reset_backends("fake")
    >>> get_backend("fake", model="m", settings={}) is first
    False
    """
    with _lock:
        dropped = [_instances.pop(k) for k in list(_instances) if name is None or k[0] == name]
    for backend in dropped:
        backend.close()


def _spec(name: str) -> BackendSpec:
    spec = BACKENDS.get(name)
    if spec is None:
        # A provider reached through backend="openai" gets its route, not a near-miss name.
        provider = route(name)
        hint = f" {provider}" if provider is not None else did_you_mean(name, BACKENDS)
        msg = f"unknown backend {name!r}.{hint} Valid backends: {format_choices(BACKENDS)}."
        raise ConfigError(msg)
    return spec


def _load(target: str | Factory) -> Factory:
    if callable(target):
        return target
    loaded: Factory = _named(target)
    return loaded


def _named(path: str) -> Any:
    """The object at ``"module:NAME"`` (its module imported once)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _complete(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every missing setting at its default (the settings table's)."""
    return {**{k: s.default for k, s in SETTINGS.items()}, **settings}


def _identity(name: str, model: str | None, spec: BackendSpec, settings: Mapping[str, Any]) -> Any:
    values = []
    for key in spec.settings:
        value = settings[key]
        try:
            hash(value)
        except TypeError:
            value = repr(value)  # price tables, engine arguments
        values.append((key, value))
    secret = next((os.environ[k] for k in spec.secrets if os.environ.get(k)), "")
    digest = hashlib.sha256(secret.encode()).hexdigest() if spec.secrets else ""
    return (name, model, tuple(values), digest)


def get_backend(name: str, *, model: str | None, settings: Mapping[str, Any]) -> Backend:
    """The backend called ``name`` for ``model`` (``None``: its default), built once.

    ``settings`` are resolved settings (``semframe.config()``); missing ones
    take their defaults.

    Raises
    ------
    ConfigError
        For an unknown name, listing the valid ones; for a provider reached
        through another backend (``"ollama"``), how to reach it
        (:mod:`semframe.backends.providers`). Or the backend's own
        configuration error, e.g. a missing API key.

    Examples
    --------
    >>> get_backend("fake", model=None, settings={}).name
    'fake'
    >>> get_backend("opnai", model=None, settings={})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.ConfigError: unknown backend 'opnai'. Did you mean 'openai'? Valid backends: ...
    """
    spec = _spec(name)
    full = _complete(settings)
    key = _identity(name, model, spec, full)
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            backend = _instances[key] = _load(spec.factory)(model, full)
    result: Backend = backend
    return result


def cost_model(name: str, *, model: str | None, settings: Mapping[str, Any]) -> CostModel:
    """The cost model of backend ``name``: the built backend's, or one made without it.

    Where the backend cannot be built here (an API without its key or SDK),
    a backend that declares a cost factory is priced without a client.

    Raises
    ------
    ConfigError, MissingDependencyError
        When the backend cannot be built and has no cost factory (or the
        model has no price).
    """
    spec = _spec(name)
    try:
        return get_backend(name, model=model, settings=settings).cost
    except (ConfigError, MissingDependencyError):
        if spec.cost is None:
            raise
    built: CostModel = _load(spec.cost)(model, _complete(settings))
    return built


def default_model(name: str, settings: Mapping[str, Any]) -> str | None:
    """The model backend ``name`` runs when ``model`` is not set; nothing is built.

    ``None`` where it has none (a vLLM server needs ``model=``) or does not say
    (a backend registered without ``model``).

    Raises
    ------
    ConfigError
        For an unknown name, as :func:`get_backend`.

    Examples
    --------
    >>> default_model("openai", {})
    'gpt-4.1-mini'
    >>> default_model("vllm", {"base_url": "http://127.0.0.1:8000/v1"}) is None
    True
    """
    rule = _spec(name).model
    if rule is None:
        return None
    found = _named(rule) if isinstance(rule, str) else rule(_complete(settings))
    return None if found is None else str(found)


def describe(settings: ResolvedConfig) -> ResolvedConfig:
    """``settings`` with the model a run would use named, where ``model`` is not set.

    What ``semframe.config()`` shows: the settings layer resolves values, the
    backend knows its default model. An unknown backend name is left as it is
    (a call with it fails, naming the valid ones).

    Examples
    --------
    >>> from semframe.config import config
    >>> describe(config(backend="anthropic")).effective["model"]
    'claude-haiku-4-5'
    """
    name = settings["backend"]
    if name not in BACKENDS:
        return settings
    check = BACKENDS[name].check
    lacking = None if check is None else _load_check(check)(settings["model"])
    if lacking is not None:
        settings = settings.explain("backend", name, f"cannot run here: {lacking}")
    if settings["model"] is not None:
        return settings
    model = default_model(name, settings)
    if model is None:
        return settings
    return settings.explain("model", model, f"the {name!r} backend's model")


def _load_check(target: str | Check) -> Check:
    if callable(target):
        return target
    loaded: Check = _named(target)
    return loaded
