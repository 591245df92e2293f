"""Embeddings as the emulator serves them: deterministic vectors, token counts, limits.

A text's vector is a pure function of the model and the text: its casefolded
character 3-grams (padded with a space each side) and its words, each hashed
(CRC-32 seeded by the model's name) to a bucket and a sign among the model's
dimensions, summed and L2-normalised. Texts that share words or spellings
get similar vectors; the same text always gets the same vector.

Both providers' routes (``POST /v1/embeddings``, Gemini's
``batchEmbedContents`` / ``embedContent``) price and limit requests with
:func:`semframe.cost.pricing.embedding_price` (the emulator's
``embedding_prices`` overrides applied): texts per request, tokens per text
and per request. Tokens are counted as the client counts them
(:func:`semframe.cost.tokens.count_for_model`: ``cl100k_base`` for OpenAI's
``text-embedding-3`` models, ``o200k_base`` for Gemini).

Examples
--------
>>> a, b, c = (vector("text-embedding-3-small", t, 1536) for t in
...            ("The Matrix", "the matrix (1999)", "Amelie"))
>>> a.shape, round(float(a @ a), 6)
((1536,), 1.0)
>>> bool(a @ b > 0.5 > a @ c)
True
"""

from __future__ import annotations

import base64
import re
import zlib

import numpy as np
from numpy.typing import NDArray

__all__ = ["as_base64", "vector"]

_WORD = re.compile(r"\w+")


def vector(model: str, text: str, dim: int) -> NDArray[np.float32]:
    """The unit vector of ``text`` under ``model``, ``dim`` long (see the module docs)."""
    seed = zlib.crc32(model.encode("utf-8"))
    folded = text.casefold()
    padded = f" {folded} "
    grams = [padded[i : i + 3] for i in range(max(len(padded) - 2, 1))]
    grams += [f"w:{w}" for w in _WORD.findall(folded)]
    hashes = np.fromiter(
        (zlib.crc32(g.encode("utf-8", "surrogatepass"), seed) for g in grams),
        dtype=np.uint64,
        count=len(grams),
    )
    out = np.zeros(dim, dtype=np.float64)
    signs = np.where((hashes >> np.uint64(31)) & np.uint64(1), -1.0, 1.0)
    np.add.at(out, (hashes % np.uint64(dim)).astype(np.int64), signs)
    norm = float(np.linalg.norm(out))
    if norm == 0.0:
        out[seed % dim] = 1.0
        norm = 1.0
    return (out / norm).astype(np.float32)


def as_base64(vec: NDArray[np.float32]) -> str:
    """``vec`` as OpenAI's ``encoding_format="base64"`` sends it (little-endian float32).

    Examples
    --------
    >>> as_base64(np.array([1.0], dtype=np.float32))
    'AACAPw=='
    """
    return base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
