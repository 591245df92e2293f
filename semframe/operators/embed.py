"""Texts to vectors for the embedding operators and for ``join(block="embedding")``.

:func:`embed_groups` embeds groups of texts (a column, a query; a join's two
sides) with the model ``embed_model`` names (:mod:`semframe.backends.embedders`):

- a stored model (``"minilm"`` by default when installed, a model folder, a
  registered embedder): each distinct text once, through the embedding store
  (:mod:`semframe.cache.vectors`), so a text embedded by any earlier call or
  process is read, not computed;
- ``"tfidf"`` (numpy only, the fallback): character 3-grams of the
  casefolded text (padded with a space on each side), hashed into
  :data:`DIMENSIONS` buckets, weighted by smoothed inverse document frequency
  over all the groups' texts, L2-normalised. Catches shared words, spellings
  and word pieces; knows no synonyms. Vectors are sparse
  (:class:`~semframe.core.vectors.SparseRows`: a row holds its few hundred
  non-zero buckets, not 4,096 floats) and depend on the corpus, so they are
  never stored.

An API embedder (``"openai:<model>"``, ``"gemini:<model>"``:
:mod:`semframe.backends.api_embedders`) is a stored model whose texts not in
the store are checked (length, emptiness) before any is sent; what its
requests cost is in :attr:`Embedded.usage`, ``last_op().counts``
(``embedding_requests``, ``embedding_tokens``) and ``semframe.last_run()``
(a run of the embedding model: its requests, tokens and dollars).
:func:`api_cost` prices such a call before it runs.
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semframe.backends.api_embedders import (
    ApiEmbedder,
    EmbedUsage,
    api_price,
    batches,
    split_model,
    store_name,
    usage_scope,
)
from semframe.backends.embedders import BUILT_IN, Embedder, get_embedder, resolve_embed_model
from semframe.cache.index import VectorIndex, build_index, index_key
from semframe.cache.vectors import (
    CHUNK,
    EmbedStats,
    VectorStore,
    embed_texts,
    open_store,
    text_key,
)
from semframe.core.paths import cache_dir
from semframe.core.vectors import Rows, SparseRows, dense, n_rows
from semframe.cost.pricing import EmbeddingPrice
from semframe.cost.tokens import count_for_model
from semframe.runtime.stats import RunStats, record_run

__all__ = [
    "DIMENSIONS",
    "EMBEDDERS",
    "ApiCost",
    "Embedded",
    "api_cost",
    "embed",
    "embed_groups",
    "index_for",
    "tfidf",
    "tfidf_rows",
    "top_k",
]

EMBEDDERS = BUILT_IN
"""Built-in ``embed_model`` / ``block_model`` names (a model folder's path and
``"openai:<model>"`` / ``"gemini:<model>"`` work too)."""
DIMENSIONS = 4096
"""Hash buckets of the TF-IDF embedding."""
NGRAM = 3


def _grams(text: str) -> NDArray[np.int64]:
    padded = f" {text.casefold()} "
    return np.fromiter(
        (
            zlib.crc32(padded[i : i + NGRAM].encode()) % DIMENSIONS
            for i in range(max(len(padded) - NGRAM + 1, 1))
        ),
        dtype=np.int64,
    )


def tfidf_rows(groups: Sequence[Sequence[str]]) -> list[SparseRows]:
    """Hashed character 3-gram TF-IDF rows of each group (IDF over all of them), unit length.

    Examples
    --------
    >>> a, b = tfidf_rows([["The Matrix"], ["the matrix (1999)", "Amelie"]])
    >>> a.n_rows, b.n_rows, a.width
    (1, 2, 4096)
    >>> sims = (a.dense(0, 1) @ b.dense(0, 2).T)[0]
    >>> bool(sims[0] > 0.5 > sims[1])
    True
    """
    texts = [t for g in groups for t in g]
    buckets: list[NDArray[np.int64]] = []
    counts: list[NDArray[np.int64]] = []
    df = np.zeros(DIMENSIONS, dtype=np.int64)
    for text in texts:
        b, c = np.unique(_grams(text), return_counts=True)
        buckets.append(b)
        counts.append(c)
        df[b] += 1
    idf = (np.log((1 + len(texts)) / (1 + df)) + 1.0).astype(np.float32)
    out: list[SparseRows] = []
    at = 0
    for group in groups:
        rows = range(at, at + len(group))
        at += len(group)
        indptr = np.zeros(len(group) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(buckets[r]) for r in rows])
        if len(group):
            indices = np.concatenate([buckets[r] for r in rows]).astype(np.int32)
            weights = [np.log1p(counts[r].astype(np.float32)) * idf[buckets[r]] for r in rows]
            values = np.concatenate(
                [w / max(float(np.linalg.norm(w)), 1e-12) for w in weights]
            ).astype(np.float32)
        else:
            indices, values = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        out.append(SparseRows(indptr, indices, values, DIMENSIONS))
    return out


def tfidf(left: Sequence[str], right: Sequence[str]) -> tuple[SparseRows, SparseRows]:
    """:func:`tfidf_rows` of two sides (IDF over both)."""
    a, b = tfidf_rows([left, right])
    return a, b


@dataclass(frozen=True)
class Embedded:
    """Groups of texts as vectors.

    Attributes
    ----------
    groups : tuple of Rows
        One set of rows per group of texts, in order.
    model : str
        The embedder used (``"auto"`` resolved).
    stats : EmbedStats or None
        What the embedding store served and what was computed (``None`` for TF-IDF).
    keys : tuple of tuple of bytes
        Each group's text keys (empty for TF-IDF): what a saved index is named by.
    usage : EmbedUsage or None
        What an API embedder's requests cost (``None`` for a local model).
    run : RunStats or None
        Those requests as a run (``semframe.last_run()``), ``None`` when none
        was sent: what a call's budget counts (``BudgetGuard.add``).
    """

    groups: tuple[Rows, ...]
    model: str
    stats: EmbedStats | None
    keys: tuple[tuple[bytes, ...], ...] = ()
    usage: EmbedUsage | None = None
    run: RunStats | None = None

    def counts(self) -> dict[str, int]:
        """``texts_embedded``, ``vectors_reused`` for ``last_op().counts``.

        An API model adds ``embedding_requests`` (retries included) and
        ``embedding_tokens`` (billed).
        """
        if self.stats is None:
            total = sum(n_rows(g) for g in self.groups)
            return {"texts_embedded": total, "vectors_reused": 0}
        out = {"texts_embedded": self.stats.computed, "vectors_reused": self.stats.stored}
        if self.usage is not None:
            out |= {
                "embedding_requests": self.usage.requests,
                "embedding_tokens": self.usage.tokens,
            }
        return out


def embed_groups(
    groups: Sequence[Sequence[str]], settings: Mapping[str, Any], *, op: str = "embed"
) -> Embedded:
    """Embed each group of texts with ``settings["embed_model"]`` (through the store).

    ``settings`` are resolved settings (``embed_model``, ``cache``, ``cache_dir``;
    for an API model ``base_url``, ``timeout``, ``connect_timeout``,
    ``max_retries``). ``op`` names the operator in an API model's
    ``semframe.last_run()``.

    Raises
    ------
    MissingDependencyError
        For a model whose packages are missing, with the install line.
    InputError
        For an API model, a text it cannot take (empty, too long), before any request.
    """
    model = resolve_embed_model(settings["embed_model"])
    if model == "tfidf":
        return Embedded(tuple(tfidf_rows(groups)), model, None)
    texts = [t for g in groups for t in g]
    store = open_store(cache_dir(settings["cache_dir"])) if settings["cache"] else None
    api: ApiEmbedder | None = None
    try:
        embedder = _embedder_for(model, settings, store, texts)
        api = embedder if isinstance(embedder, ApiEmbedder) else None
        with usage_scope() as usage:
            try:
                check = None if api is None else api.check
                vectors, stats = embed_texts(embedder, texts, store=store, before=check)
            except BaseException:
                if api is not None and usage.requests:
                    _record(op, api, usage, failed=True)  # what was sent before it failed
                raise
    finally:
        if store is not None:
            store.close()
    run = _record(op, api, usage, failed=False) if api is not None and usage.requests else None
    out: list[Rows] = []
    keys: list[tuple[bytes, ...]] = []
    at = 0
    for g in groups:
        out.append(vectors[at : at + len(g)])
        keys.append(tuple(text_key(t) for t in g))
        at += len(g)
    return Embedded(tuple(out), embedder.name, stats, tuple(keys), usage if api else None, run)


def _embedder_for(
    model: str, settings: Mapping[str, Any], store: VectorStore | None, texts: Sequence[str]
) -> Embedder:
    """The embedder of ``model``; for an API model whose vectors ``store`` all holds, none.

    Those vectors are read without a client: no key is needed and nothing is sent.
    """
    if split_model(model) is not None:
        name = store_name(model, settings.get("base_url"))
        unique = list(dict.fromkeys(texts))
        if len(_stored(store, name, unique)) == len(unique):
            return _Stored(name, api_price(model).dimensions)
    return get_embedder(model, settings)


@dataclass
class _Stored:
    """An API embedder's name and size, for reading vectors the store holds (never embeds)."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        msg = f"{self.name}: every vector was to be read from the embedding store"
        raise AssertionError(msg)


def _record(op: str, embedder: ApiEmbedder, usage: EmbedUsage, *, failed: bool) -> RunStats:
    """Make an API embedder's requests ``semframe.last_run()`` (``failed``: the call raised)."""
    stats = RunStats(
        op=op,
        backend=embedder.provider,
        model=embedder.model,
        reorder="none",
        rows=usage.texts,
        requests=usage.requests,
        prompt_tokens=usage.tokens,
        cached_tokens=0,
        cache_write_tokens=0,
        output_tokens=0,
        errors=int(failed),
        retries=usage.retries,
        wall_seconds=usage.seconds,
        workers=1,
        expected_hit_rate=0.0,
        dollars=usage.dollars,
        rate_limited=usage.rate_limited,
    )
    record_run(stats)
    return stats


@dataclass(frozen=True)
class ApiCost:
    """What embedding texts with an API model is expected to cost (:func:`api_cost`).

    Attributes
    ----------
    model : str
        The ``embed_model`` name (``"openai:<model>"``, ``"gemini:<model>"``).
    price : EmbeddingPrice
        The model's price and limits.
    texts : int
        Distinct texts.
    stored : int
        Of those, the ones the embedding store holds (not sent).
    tokens : int
        Tokens of the others.
    requests : int
        Requests they take.
    exact : bool
        False where token counts are approximate (Gemini).
    """

    model: str
    price: EmbeddingPrice
    texts: int
    stored: int
    tokens: int
    requests: int
    exact: bool

    @property
    def dollars(self) -> float:
        """The price of :attr:`tokens`."""
        return self.price.dollars(self.tokens)


_log = logging.getLogger(__name__)


def _stored(store: VectorStore | None, name: str, unique: Sequence[str]) -> set[bytes]:
    """The keys of the distinct texts ``unique`` whose vectors ``store`` holds under ``name``."""
    if store is None or not unique:
        return set()
    try:
        return set(store.get_many(name, [text_key(t) for t in unique]))
    except sqlite3.Error as exc:
        _log.warning("embedding store unreadable (%s): counting every text as not stored", exc)
        return set()


def api_cost(texts: Sequence[str], settings: Mapping[str, Any]) -> ApiCost | None:
    """What embedding ``texts`` with ``settings["embed_model"]`` costs; ``None`` for a local model.

    Texts the embedding store already holds (with ``cache`` on) cost nothing;
    the others are counted as the client counts them. Nothing is sent and no
    API key is needed.

    Examples
    --------
    >>> c = api_cost(["hello world", "hello world", "bye"],
    ...              {"embed_model": "openai:text-embedding-3-small", "cache": False,
    ...               "cache_dir": None, "base_url": None})
    >>> c.texts, c.tokens, c.requests, f"{c.dollars:.8f}"
    (2, 3, 1, '0.00000006')
    """
    model = resolve_embed_model(settings["embed_model"])
    if split_model(model) is None:
        return None
    price = api_price(model)
    unique = list(dict.fromkeys(texts))
    store = open_store(cache_dir(settings["cache_dir"])) if settings["cache"] else None
    try:
        found = _stored(store, store_name(model, settings.get("base_url")), unique)
    finally:
        if store is not None:
            store.close()
    todo = [t for t in unique if text_key(t) not in found]
    counted = count_for_model(todo, price.model)
    counts = list(counted.tokens)
    # the store computes CHUNK texts at a time, and each chunk is batched on its own
    requests = sum(
        len(
            batches(
                counts[at : at + CHUNK],
                max_inputs=price.max_inputs,
                max_tokens=price.max_request_tokens,
            )
        )
        for at in range(0, len(counts), CHUNK)
    )
    return ApiCost(
        model, price, len(unique), len(unique) - len(todo), sum(counts), requests, counted.exact
    )


def index_for(embedded: Embedded, group: int, settings: Mapping[str, Any]) -> VectorIndex:
    """The search index over group ``group``: exact, or approximate by size (saved when cached)."""
    rows = embedded.groups[group]
    key = index_key(embedded.model, embedded.keys[group]) if embedded.keys else None
    return build_index(
        rows,
        ann=settings["ann"],
        threshold=settings["ann_threshold"],
        directory=cache_dir(settings["cache_dir"]) if settings["cache"] else None,
        key=key,
    )


def embed(left: Sequence[str], right: Sequence[str], model: str = "tfidf") -> tuple[Rows, Rows]:
    """Unit-length embeddings of ``left`` and ``right`` with the embedder ``model`` (no store).

    Raises
    ------
    InputError
        For an unknown embedder.
    """
    settings = {"embed_model": model, "cache": False, "cache_dir": None}
    a, b = embed_groups([left, right], settings).groups
    return a, b


def top_k(left: Rows, right: Rows, k: int, candidates: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each left row, its ``k`` most similar right rows among ``candidates[i]``.

    Similarity is the dot product of unit vectors (cosine). Ties go to the
    earlier right row; the result lists each row's picks in right-row order.

    Examples
    --------
    >>> left = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    >>> right = np.array([[0.0, 1.0], [0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
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
        picked = (
            right.take(list(js)).dense(0, len(js)) if isinstance(right, SparseRows) else right[idx]
        )
        sims = picked @ dense(left, i, i + 1)[0]
        order = np.lexsort((idx, -sims))[:k]
        out.append(sorted(int(j) for j in idx[order]))
    return out
