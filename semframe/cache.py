"""Persistent result cache: never pay twice for the same deterministic answer.

Every answered request is stored in one SQLite file (``cache_dir()/results.sqlite``,
WAL mode, so readers never block the writer and two processes can share it).
A row is keyed by a SHA-256 digest of everything that determines the answer:
the backend name, model and endpoint (``base_url``), and the rendered request
(system message, prompt, ``max_tokens``, temperature, the output schema as JSON
with sorted keys, and how many logprobs were asked for). The row holds the raw
answer text, the token logprobs when asked for, the usage the provider
reported, the finish reason, and when it was created and last used.

Only deterministic requests (temperature 0) are cached: a sampled answer is a
draw, not *the* answer. API keys never enter the digest or the file; neither
does the client object.

The executor looks every request up before sending anything, serves the hits
(an answer that no longer parses is asked again), and writes new answers as
they arrive, committing every :data:`FLUSH_EVERY` answers or
:data:`FLUSH_SECONDS` seconds and at the end of a run, however it ends. A crash
therefore loses at most the answers of the last second.

Examples
--------
>>> import tempfile, pathlib
>>> from semframe.backends.base import Completion, Request, Usage
>>> from semframe.backends.fake import FakeBackend
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> backend = FakeBackend()
>>> request = Request(0, 0, "Say hi to Bob", None, 8, 0.0, None, 0)
>>> with ResultCache(folder / "results.sqlite") as cache:
...     key = request_key(backend, request)
...     cache.put(key, backend, Completion(0, "hi Bob", Usage(4, 0, 0, 2), "stop"))
...     cache.flush()
...     cache.get_many([key])[key].text
'hi Bob'
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from semframe.backends.base import Backend, Completion, Request, TokenLogprob, Usage

__all__ = [
    "FILENAME",
    "FLUSH_EVERY",
    "FLUSH_SECONDS",
    "CacheInfo",
    "Entry",
    "ResultCache",
    "cacheable",
    "request_key",
]

FILENAME = "results.sqlite"
"""The cache file's name inside semframe's cache directory."""

FLUSH_EVERY = 50
"""Pending answers that trigger a commit."""

FLUSH_SECONDS = 1.0
"""Seconds after which pending answers are committed with the next answer."""

_KEY_VERSION = "semframe-result-v1"
_ROW_OVERHEAD = 128  # bytes counted per row besides its text (key, numbers, index entries)

_log = logging.getLogger("semframe.cache")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    tokens TEXT,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    finish_reason TEXT,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS results_last_used ON results (last_used);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('bytes', 0);
CREATE TRIGGER IF NOT EXISTS results_ins AFTER INSERT ON results BEGIN
    UPDATE meta SET value = value + NEW.size WHERE name = 'bytes';
END;
CREATE TRIGGER IF NOT EXISTS results_del AFTER DELETE ON results BEGIN
    UPDATE meta SET value = value - OLD.size WHERE name = 'bytes';
END;
CREATE TRIGGER IF NOT EXISTS results_upd AFTER UPDATE OF size ON results BEGIN
    UPDATE meta SET value = value - OLD.size + NEW.size WHERE name = 'bytes';
END;
"""


def cacheable(request: Request) -> bool:
    """Whether ``request`` is cached: only deterministic (temperature 0) requests are.

    Examples
    --------
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> cacheable(r), cacheable(r._replace(temperature=0.7))
    (True, False)
    """
    return request.temperature == 0


def request_key(backend: Backend, request: Request) -> str:
    """The cache key of ``request`` on ``backend``: a SHA-256 hex digest.

    It covers the backend name, model and ``base_url`` (when the backend has
    one) and the request's content and decoding parameters; not its position,
    row or prefix group, and never a credential.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> k = request_key(FakeBackend(), r)
    >>> len(k), k == request_key(FakeBackend(), r._replace(id=5, row=9, group=2))
    (64, True)
    >>> k == request_key(FakeBackend(model="other"), r)
    False
    """
    schema = None if request.schema is None else json.dumps(request.schema, sort_keys=True)
    parts = [
        _KEY_VERSION,
        backend.name,
        backend.model,
        getattr(backend, "base_url", None),
        request.system,
        request.prompt,
        request.max_tokens,
        repr(float(request.temperature)),
        schema,
        request.logprobs,
    ]
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class Entry(NamedTuple):
    """One stored answer.

    Attributes
    ----------
    text : str
        The raw answer text.
    usage : Usage
        What the provider reported when it was answered.
    finish_reason : str or None
        The provider's finish reason.
    tokens : tuple of TokenLogprob or None
        Token logprobs, when the request asked for them.
    """

    text: str
    usage: Usage
    finish_reason: str | None
    tokens: tuple[TokenLogprob, ...] | None


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """What ``semframe cache info`` shows.

    Attributes
    ----------
    path : Path
        The cache file.
    entries : int
        Stored answers.
    bytes : int
        Bytes the stored answers account for (what ``cache_max_mib`` caps).
    file_bytes : int
        Size of the file and its WAL on disk.
    by_model : tuple of (str, str, int, int)
        ``(backend, model, entries, hits)`` per model, most entries first.
    """

    path: Path
    entries: int
    bytes: int
    file_bytes: int
    by_model: tuple[tuple[str, str, int, int], ...]

    def __str__(self) -> str:
        lines = [
            f"cache: {self.path}",
            f"entries: {self.entries:,}",
            f"size: {self.bytes / 2**20:.2f} MiB of answers, "
            f"{self.file_bytes / 2**20:.2f} MiB on disk",
        ]
        if self.by_model:
            lines.append("by model (entries, hits served):")
            lines.extend(
                f"  {backend}/{model}: {entries:,} entries, {hits:,} hits"
                for backend, model, entries, hits in self.by_model
            )
        return "\n".join(lines)


class ResultCache:
    """The SQLite result cache (one connection, safe to share between threads).

    Parameters
    ----------
    path : Path
        The database file; its folder is created when missing.
    max_mib : float, optional
        Size cap in MiB of stored answers; the least recently used are evicted
        past it. ``None``: no cap.
    clock : callable
        Wall clock for created/last-used times (tests pass their own).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_mib: float | None = None,
        clock: Any = time.time,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = None if max_mib is None else int(max_mib * 2**20)
        self.clock = clock
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, ...]] = []
        self._last_flush = time.monotonic()
        self._closed = False
        self.write_errors = 0
        """Commits that failed (their answers were dropped, the run went on)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        try:
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            with self._transaction():
                for statement in _split_script(_SCHEMA):
                    self._db.execute(statement)
        except BaseException:
            self._db.close()
            raise

    # -- context ---------------------------------------------------------------------

    def __enter__(self) -> ResultCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Commit what is pending and close the connection (idempotent)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._safe_flush_locked()
            finally:
                self._closed = True
                self._db.close()

    def __repr__(self) -> str:
        return f"ResultCache({str(self.path)!r}, max_bytes={self.max_bytes})"

    # -- reading -----------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The stored entries among ``keys`` (missing keys are absent).

        Hits are not yet counted: call :meth:`touch` with the keys actually served.
        """
        found: dict[str, Entry] = {}
        with self._lock:
            if self._closed:
                return found
            for lo in range(0, len(keys), 500):
                chunk = list(keys[lo : lo + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    "SELECT key, text, tokens, prompt_tokens, cached_tokens, "
                    "cache_write_tokens, output_tokens, finish_reason "
                    f"FROM results WHERE key IN ({marks})",
                    chunk,
                ).fetchall()
                for key, text, tokens, p, c, w, o, finish in rows:
                    found[key] = Entry(text, Usage(p, c, w, o), finish, _load_tokens(tokens))
        return found

    def touch(self, keys: Iterable[str]) -> None:
        """Mark ``keys`` as used now and count one hit each."""
        keys = list(keys)
        if not keys:
            return
        now = self.clock()
        with self._lock:
            if self._closed:
                return
            with self._transaction():
                self._db.executemany(
                    "UPDATE results SET last_used = ?, hits = hits + 1 WHERE key = ?",
                    [(now, k) for k in keys],
                )

    # -- writing -----------------------------------------------------------------------

    def put(self, key: str, backend: Backend, completion: Completion) -> None:
        """Queue an answer for storage; commits when enough are pending (see module docs)."""
        tokens = _dump_tokens(completion.tokens)
        u = completion.usage
        size = len(completion.text.encode("utf-8", "surrogatepass")) + _ROW_OVERHEAD
        size += len(tokens) if tokens else 0
        now = self.clock()
        row = (
            key,
            backend.name,
            backend.model,
            completion.text,
            tokens,
            u.prompt_tokens,
            u.cached_tokens,
            u.cache_write_tokens,
            u.output_tokens,
            completion.finish_reason,
            now,
            now,
            size,
        )
        with self._lock:
            if self._closed:
                return
            self._pending.append(row)
            if (
                len(self._pending) >= FLUSH_EVERY
                or time.monotonic() - self._last_flush >= FLUSH_SECONDS
            ):
                self._safe_flush_locked()

    def flush(self) -> None:
        """Commit every pending answer now (a failed write is logged, never raised)."""
        with self._lock:
            if not self._closed:
                self._safe_flush_locked()

    def _safe_flush_locked(self) -> None:
        try:
            self._flush_locked()
        except sqlite3.Error as exc:  # disk full, locked for too long: the run goes on
            self.write_errors += 1
            _log.warning("result cache write failed (%s): answers not stored", exc)

    def _flush_locked(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        with self._transaction():
            self._db.executemany(
                "INSERT INTO results (key, backend, model, text, tokens, prompt_tokens, "
                "cached_tokens, cache_write_tokens, output_tokens, finish_reason, created, "
                "last_used, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET text = excluded.text, tokens = excluded.tokens, "
                "prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens, "
                "cache_write_tokens = excluded.cache_write_tokens, "
                "output_tokens = excluded.output_tokens, finish_reason = excluded.finish_reason, "
                "last_used = excluded.last_used, size = excluded.size",
                rows,
            )
            self._evict_locked()

    def _evict_locked(self) -> None:
        """Delete least recently used rows until the stored bytes fit the cap (in a transaction)."""
        if self.max_bytes is None:
            return
        (total,) = self._db.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()
        if total <= self.max_bytes:
            return
        excess = total - self.max_bytes * 9 // 10  # evict down to 90% so eviction is rare
        freed = 0
        doomed: list[str] = []
        for key, size in self._db.execute("SELECT key, size FROM results ORDER BY last_used, key"):
            doomed.append(key)
            freed += size
            if freed >= excess:
                break
        self._db.executemany("DELETE FROM results WHERE key = ?", [(k,) for k in doomed])

    # -- maintenance -------------------------------------------------------------------

    def info(self) -> CacheInfo:
        """Entries, sizes and per-model counts."""
        with self._lock:
            self._flush_locked()
            (entries,) = self._db.execute("SELECT COUNT(*) FROM results").fetchone()
            (stored,) = self._db.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()
            by_model = self._db.execute(
                "SELECT backend, model, COUNT(*), SUM(hits) FROM results "
                "GROUP BY backend, model ORDER BY COUNT(*) DESC, backend, model"
            ).fetchall()
        file_bytes = sum(
            p.stat().st_size
            for p in (self.path, self.path.with_name(self.path.name + "-wal"))
            if p.exists()
        )
        return CacheInfo(
            self.path,
            int(entries),
            int(stored),
            file_bytes,
            tuple((str(b), str(m), int(n), int(h or 0)) for b, m, n, h in by_model),
        )

    def clear(self, older_than_days: float | None = None) -> int:
        """Delete every entry, or those not used for ``older_than_days``; returns how many."""
        with self._lock:
            self._flush_locked()
            with self._transaction():
                if older_than_days is None:
                    cur = self._db.execute("DELETE FROM results")
                else:
                    cutoff = self.clock() - older_than_days * 86400.0
                    cur = self._db.execute("DELETE FROM results WHERE last_used < ?", (cutoff,))
                removed = cur.rowcount
            if older_than_days is None:
                self._db.execute("VACUUM")
        return int(removed)

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception, Ctrl-C included)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")


def _split_script(script: str) -> list[str]:
    """Statements of ``script`` (triggers kept whole: their bodies end in ``END;``)."""
    statements: list[str] = []
    current = ""
    for line in script.strip().splitlines():
        current += line + "\n"
        stripped = line.strip()
        inside_trigger = current.lstrip().upper().startswith("CREATE TRIGGER")
        if stripped.endswith(";") and (not inside_trigger or stripped.upper() == "END;"):
            statements.append(current.strip())
            current = ""
    return statements


def _dump_tokens(tokens: Sequence[TokenLogprob] | None) -> str | None:
    if tokens is None:
        return None
    return json.dumps(
        [[t.token, t.logprob, [list(pair) for pair in t.top]] for t in tokens],
        ensure_ascii=False,
    )


def _load_tokens(text: str | None) -> tuple[TokenLogprob, ...] | None:
    if text is None:
        return None
    return tuple(
        TokenLogprob(str(tok), float(lp), tuple((str(a), float(b)) for a, b in top))
        for tok, lp, top in json.loads(text)
    )


def open_cache(directory: Path, *, max_mib: float | None) -> ResultCache | None:
    """Open ``directory/results.sqlite``; ``None`` (and a logged warning) when that fails.

    A cache that cannot be opened (a read-only home, a corrupt file) never
    stops a run: the run goes on uncached.
    """
    try:
        return ResultCache(directory / FILENAME, max_mib=max_mib)
    except (OSError, sqlite3.Error) as exc:
        _log.warning("result cache unavailable (%s): running without it", exc)
        return None
