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
