"""The embedding store: each (model, text) is embedded once, on any call, in any process.

Vectors live beside the result cache, in ``cache_dir()/embeddings.sqlite``
(SQLite in WAL mode, so several processes share it): one row per model and
text, keyed by the first 16 bytes of the text's SHA-256, holding the vector
as float16 (768 bytes for MiniLM's 384 dimensions). Every vector an operator
uses is the stored float16 value (a fresh one is rounded the same way before
use), so results do not depend on whether the store already held a text.

:func:`embed_texts` is the one way texts become vectors: repeated texts are
embedded once, stored vectors are read, only the rest go to the model, in
chunks that are stored as each finishes (an interrupted run keeps what it
computed). A store that cannot be opened or written never stops a run: it
goes on without one, and a logged warning says so. ``cache=False`` neither
reads nor writes it.

Examples
--------
>>> import tempfile, pathlib, numpy as np
>>> class Letters:
...     name, dim, calls = "letters", 2, 0
...     def embed(self, texts):
...         Letters.calls += len(texts)
...         v = np.array([[len(t), 1.0] for t in texts], dtype=np.float32)
...         return v / np.linalg.norm(v, axis=1, keepdims=True)
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> with VectorStore(folder / FILENAME) as store:
...     _, first = embed_texts(Letters(), ["ab", "ab", "c"], store=store)
...     _, again = embed_texts(Letters(), ["c", "ab", "abc"], store=store)
>>> first
EmbedStats(texts=3, unique=2, stored=0, computed=2)
>>> again, Letters.calls
(EmbedStats(texts=3, unique=3, stored=2, computed=1), 3)
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from semframe.backends.embedders import Embedder

__all__ = [
    "CHUNK",
    "FILENAME",
    "EmbedStats",
    "VectorStore",
    "embed_texts",
    "open_store",
    "text_key",
]

FILENAME = "embeddings.sqlite"
"""The store's file name inside semframe's cache directory."""
CHUNK = 1024
"""Texts embedded (and stored) at a time."""
BUSY_SECONDS = 5.0
"""Longest a write waits for another process's write lock."""
_READ_AT_ONCE = 500  # keys per SELECT ... IN (...)

_log = logging.getLogger(__name__)


def text_key(text: str) -> bytes:
    """A text's key in the store: the first 16 bytes of its UTF-8 SHA-256.

    Examples
    --------
    >>> text_key("hi").hex()
    '8f434346648f6b96df89dda901c5176b'
    """
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]


@dataclass(frozen=True)
class EmbedStats:
    """What :func:`embed_texts` did: texts asked for, distinct, read from the store, computed."""

    texts: int
    unique: int
    stored: int
    computed: int


class VectorStore:
    """Float16 vectors by (model, text key) in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS vectors (model TEXT NOT NULL, key BLOB NOT NULL, "
            "dim INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (model, key)) WITHOUT ROWID"
        )

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    def get_many(self, model: str, keys: Sequence[bytes]) -> dict[bytes, NDArray[np.float16]]:
        """The stored vectors of ``keys`` (those the store has)."""
        out: dict[bytes, NDArray[np.float16]] = {}
        for start in range(0, len(keys), _READ_AT_ONCE):
            part = list(keys[start : start + _READ_AT_ONCE])
            marks = ",".join("?" * len(part))
            rows = self._db.execute(
                f"SELECT key, dim, data FROM vectors WHERE model = ? AND key IN ({marks})",
                [model, *part],
            )
            for key, dim, data in rows:
                vec = np.frombuffer(data, dtype=np.float16)
                if len(vec) == dim:
                    out[bytes(key)] = vec
        return out

    def put_many(self, model: str, items: Sequence[tuple[bytes, NDArray[np.float16]]]) -> None:
        """Store ``(key, vector)`` pairs in one transaction (an existing key is replaced)."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "INSERT OR REPLACE INTO vectors (model, key, dim, data) VALUES (?, ?, ?, ?)",
                [(model, k, len(v), v.astype("<f2").tobytes()) for k, v in items],
            )

    def count(self, model: str | None = None) -> int:
        """Vectors stored (of ``model``, or all)."""
        if model is None:
            return int(self._db.execute("SELECT count(*) FROM vectors").fetchone()[0])
        row = self._db.execute("SELECT count(*) FROM vectors WHERE model = ?", [model]).fetchone()
        return int(row[0])


def open_store(directory: Path) -> VectorStore | None:
    """Open ``directory/embeddings.sqlite``; ``None`` (and a logged warning) when that fails."""
    try:
        return VectorStore(directory / FILENAME)
    except (OSError, sqlite3.Error) as exc:
        _log.warning(
            "embedding store unavailable (%s): embedding without it (nothing is reused or "
            "stored; set cache_dir to another folder)",
            exc,
        )
        return None


def embed_texts(
    embedder: Embedder,
    texts: Sequence[str],
    *,
    store: VectorStore | None,
    before: Callable[[list[str]], object] | None = None,
) -> tuple[NDArray[np.float32], EmbedStats]:
    """The vectors of ``texts`` (float16 precision, as float32 rows) and what it took.

    Distinct texts are embedded once; those ``store`` holds for this
    embedder are read, the rest computed :data:`CHUNK` at a time and stored.
    ``before``, if given, sees the texts to compute before the first is
    embedded (an API embedder checks them there, so that a bad one fails
    before any request).
    """
    unique = list(dict.fromkeys(texts))
    keys = [text_key(t) for t in unique]
    found: dict[bytes, NDArray[np.float16]] = {}
    if store is not None:
        try:
            found = store.get_many(embedder.name, keys)
        except sqlite3.Error as exc:
            _log.warning("embedding store unreadable (%s): computing every vector", exc)
            store = None
    missing = [i for i, k in enumerate(keys) if k not in found]
    if before is not None and missing:
        before([unique[i] for i in missing])
    for start in range(0, len(missing), CHUNK):
        part = missing[start : start + CHUNK]
        vectors = np.asarray(embedder.embed([unique[i] for i in part]), dtype=np.float32)
        half = vectors.astype(np.float16)
        fresh = [(keys[i], half[j]) for j, i in enumerate(part)]
        found.update(fresh)
        if store is not None:
            try:
                store.put_many(embedder.name, fresh)
            except sqlite3.Error as exc:
                _log.warning("embedding store not writable (%s): vectors not stored", exc)
                store = None
    dim = len(next(iter(found.values()))) if found else embedder.dim
    table = np.zeros((len(unique), dim), dtype=np.float32)
    for i, k in enumerate(keys):
        table[i] = found[k]
    position = {t: i for i, t in enumerate(unique)}
    rows = table[[position[t] for t in texts]] if texts else table[:0]
    stats = EmbedStats(len(texts), len(unique), len(unique) - len(missing), len(missing))
    return rows, stats
