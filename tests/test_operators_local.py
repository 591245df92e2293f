"""extract, classify, agg, topk and join on the embedded engine with its real model.

SmolLM2-135M is weak: these assert structure (types, order, index, constrained
answers), not quality. A few rows each, so the whole file takes seconds.
"""

from __future__ import annotations

from typing import Literal

import pandas as pd
import pytest

from semframe import last_op
from tests.conftest import LOCAL_REVIEWS as REVIEWS
from tests.conftest import skip_without_local_engine

pytestmark = pytest.mark.local

skip_without_local_engine()

LOCAL = {"backend": "local", "errors": "keep", "local_parallel": 2}


def test_extract_constrained_to_the_schema() -> None:
    schema = {"stars": int, "mood": Literal["happy", "angry"]}
    out = REVIEWS.llm.extract("Rate the review {review} of {movie}.", schema, **LOCAL)
    assert list(out.index) == ["x", "y", "z"]
    assert str(out["stars"].dtype) == "Int64"
    ok = out["llm_error"].isna()
    assert ok.any(), "constrained decoding yields valid records"
    assert set(out.loc[ok, "mood"]) <= {"happy", "angry"}


def test_classify_gives_only_labels() -> None:
    out = REVIEWS.llm.classify("Sentiment of {review}?", ["positive", "negative"], **LOCAL)
    assert list(out.index) == ["x", "y", "z"]
    assert set(out["label"].dropna()) <= {"positive", "negative"}
    assert out["label"].notna().any()


def test_agg_one_answer_per_group() -> None:
    # the 135M model's "few words" often run past 24 tokens: kept, and marked
    out = REVIEWS.llm.agg(
        "In a few words, what do the reviews {review} say?",
        by="movie",
        max_tokens=24,
        truncated="keep",
        **LOCAL,
    )
    assert out["movie"].tolist() == ["Alien", "Cats"]
    assert all(isinstance(v, str) and v for v in out["llm_output"])
    assert all(isinstance(v, bool) for v in out["llm_output_truncated"].tolist())


def test_topk_and_join_structure() -> None:
    top = REVIEWS.llm.topk("The most enthusiastic review {review}", 2, **LOCAL)
    assert len(top) >= 2
    assert set(top.index) <= {"x", "y", "z"}
    stats = last_op()
    assert stats is not None
    assert stats.llm_calls <= 3
    movies = pd.DataFrame({"movie": ["Alien", "Cats"], "genre": ["horror", "musical"]})
    joined = movies.llm.join(REVIEWS, "Is {review} about a {genre} film?", on="movie", **LOCAL)
    assert list(joined.columns)[:2] == ["movie", "genre"]
    assert len(joined) <= 3
