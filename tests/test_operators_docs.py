"""The examples in docs/operators/*.md (one page per operator) run as written."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

PAGES_DIR = Path(__file__).resolve().parents[1] / "docs" / "operators"
OPERATORS = ("map", "filter", "extract", "classify", "agg", "topk", "join")
EXPECTED_PAGES = {"index.md", *(f"{op}.md" for op in OPERATORS)}


def test_one_page_per_operator() -> None:
    pages = {p.name for p in PAGES_DIR.glob("*.md")}
    assert pages == EXPECTED_PAGES


@pytest.mark.parametrize("page", sorted(EXPECTED_PAGES))
def test_operator_page_examples_run(page: str) -> None:
    path = PAGES_DIR / page
    assert path.is_file(), f"missing page docs/operators/{page}"
    result = doctest.testfile(
        str(path), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False
    )
    assert result.attempted >= 2, f"{page}: only {result.attempted} example(s)"
    assert result.failed == 0, f"{page}: {result.failed} of {result.attempted} examples failed"
