"""Isolation for the doctests under ``semframe/`` (``tests/conftest.py`` covers ``tests/``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from semframe.serving.vllm import installed_version

# The scheduler module subclasses vLLM's and is loaded by vLLM's engine process;
# without vLLM its docstrings cannot be imported.
collect_ignore = [] if installed_version() else ["semframe/serving/vllm/scheduler.py"]


@pytest.fixture(autouse=True)
def _doctest_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test or docstring gets its own result cache: never the user's, never shared."""
    monkeypatch.setenv("SEMFRAME_CACHE_DIR", str(tmp_path / "cache"))
