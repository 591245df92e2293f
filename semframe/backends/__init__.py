"""Backends: where requests go. Chosen by configuration, never by code change.

``get_backend(name, model=..., settings=...)`` builds one from the registry.
Backends register lazily (by module path), so importing semframe imports no
engine or SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from semframe.backends.base import Backend, Capabilities, Completion, Request, Usage
from semframe.errors import ConfigError, did_you_mean, format_choices

__all__ = [
    "BACKENDS",
    "Backend",
    "Capabilities",
    "Completion",
    "Request",
    "Usage",
    "get_backend",
    "register_backend",
]

BACKENDS: dict[str, str] = {
    "local": "semframe.backends.local:create",
    "openai": "semframe.backends.openai:create",
    "anthropic": "semframe.backends.anthropic:create",
    "vllm": "semframe.backends.vllm:create",
    "fake": "semframe.backends.fake:create",
}
"""Backend name -> ``"module:factory"``; the factory takes ``(model, settings)``."""


def register_backend(name: str, factory: str | Callable[..., Backend]) -> None:
    """Register a backend factory under ``name`` (a callable or ``"module:function"``)."""
    if callable(factory):
        _factories[name] = factory
        BACKENDS[name] = f"{factory.__module__}:{getattr(factory, '__name__', 'factory')}"
    else:
        _factories.pop(name, None)
        BACKENDS[name] = factory


_factories: dict[str, Callable[..., Backend]] = {}


def get_backend(name: str, *, model: str | None, settings: Mapping[str, Any]) -> Backend:
    """Build (or reuse) the backend called ``name``.

    Raises
    ------
    ConfigError
        For an unknown name, listing the valid ones.

    Examples
    --------
    >>> get_backend("fake", model=None, settings={}).name
    'fake'
    >>> get_backend("opnai", model=None, settings={})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.ConfigError: unknown backend 'opnai'. Did you mean 'openai'? Valid backends: ...
    """
    if name not in BACKENDS:
        msg = (
            f"unknown backend {name!r}.{did_you_mean(name, BACKENDS)} "
            f"Valid backends: {format_choices(BACKENDS)}."
        )
        raise ConfigError(msg)
    factory = _factories.get(name)
    if factory is None:
        module, _, attr = BACKENDS[name].partition(":")
        factory = getattr(importlib.import_module(module), attr)
    backend: Backend = factory(model, settings)
    return backend
