"""The ``semframe`` command itself: its version, and what it does without a command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from semframe._version import __version__
from semframe.cli import main


def test_version_prints_the_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"semframe {__version__}\n"


def test_no_command_prints_the_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("usage: semframe")
    for command in ("cache", "serve", "vllm-model", "--version"):
        assert command in printed.out
    assert printed.err == ""


def test_the_command_line_exits_0() -> None:
    """Through ``sys.exit(main())``, as the installed ``semframe`` script runs it."""
    for argv in (["--version"], []):
        done = subprocess.run(
            [sys.executable, "-m", "semframe.cli", *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "required" not in done.stderr
    assert done.stdout.startswith("usage: semframe")


def test_a_command_still_needs_its_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["cache"])
    assert info.value.code == 2
    assert "ACTION" in capsys.readouterr().err
