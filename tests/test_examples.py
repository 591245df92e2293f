"""Every script in ``examples/`` runs, here on the fake backend (fast, no model)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


CASES = [
    ("movies.py", ["reviews are positive", "RunStats(filter on fake"]),
    (
        "operators.py",
        ["extract:", "classify:", "agg (one answer per movie):", "topk (3 of", "join"],
    ),
    ("contributions.py", ["Before sending anything:", "sector counts:", "extract:"]),
    ("reorder_cost.py", ["estimate", "actual", "ggr"]),
]
"""Each example and fragments of what it must print."""


@pytest.mark.parametrize(("script", "expected"), CASES)
def test_example_runs_on_the_fake_backend(
    script: str,
    expected: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "argv", [script, "--backend", "fake"])
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    printed = capsys.readouterr().out
    for fragment in expected:
        assert fragment in printed


def test_every_example_is_exercised() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == {script for script, _ in CASES}


def test_demo_rerun_says_its_answers_came_from_the_result_cache(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def demo(*flags: str) -> str:
        monkeypatch.setattr(sys, "argv", ["movies.py", "--backend", "fake", *flags])
        runpy.run_path(str(EXAMPLES / "movies.py"), run_name="__main__")
        return capsys.readouterr().out

    first = demo()
    assert "result cache" not in first
    again = demo()
    assert "answers came from the result cache (stored by an earlier run); nothing was sent" in (
        again
    )
    assert "reorder=ggr" not in again  # no row of zeros
    assert "SEMFRAME_CACHE=false make demo" in again
    assert "python examples/movies.py --no-cache" in again
    fresh = demo("--no-cache")
    assert "result cache" not in fresh
    assert "RunStats(filter on fake/fake-model, reorder=ggr: " in fresh
