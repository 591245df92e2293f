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
(an answer that no longer parses is asked again), and hands new answers to
:meth:`ResultCache.put` as they arrive. A writer thread commits them as soon
as it is free, at most every :data:`COMMIT_INTERVAL` (one transaction per
answer when answers are slow, many per transaction when they are fast), and
the end of a run waits for the last commit, however the run ends. A crash,
even ``kill -9``, therefore loses only the requests in flight and the answers
of the last :data:`COMMIT_INTERVAL` (10 ms). When the disk is full the answers
stay in memory, a warning is logged, writing is tried again every
:data:`RETRY_SECONDS`, and the run goes on.

A whole call is indexed too (the ``calls`` table): keyed by the backend and
the call's :func:`~semframe.core.plan.fingerprint` (everything that decides its
requests), an entry lists the request key of each row. A re-run of the same
call finds it and serves every row without ordering or rendering anything;
when a row's answer is missing (evicted, never stored) or no longer parses,
the call takes the ordinary way and sends only what is missing.

Eviction (past ``cache_max_mib``) removes answers and call entries alike,
least recently used first; it scans the table, which is rare (it frees 10% of
the cap at a time), so that storing an answer updates one B-tree only.

Examples
--------
>>> import tempfile, pathlib
>>> from semframe.backends.base import Completion, Request, Usage
>>> from semframe.backends.fake import FakeBackend
>>> from semframe.cache.keys import request_key
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> backend = FakeBackend()
>>> request = Request(0, 0, "Say hi to Bob", None, 8, 0.0, None, 0)
>>> with ResultCache(folder / "results.sqlite") as cache:
...     key = request_key(backend, request)
...     cache.put(key, backend, Completion(0, "hi Bob", Usage(4, 0, 0, 2), "stop"))
...     cache.flush()
...     cache.get_many([key])[key].text
True
'hi Bob'
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from semframe.core.wire import Completion, TokenLogprob, Usage

if TYPE_CHECKING:
    from semframe.backends.base import Backend

__all__ = [
    "COMMIT_INTERVAL",
    "FILENAME",
    "RETRY_SECONDS",
    "TOUCH_SECONDS",
    "CacheInfo",
    "Entry",
    "ResultCache",
    "load_tokens",
    "open_cache",
]

FILENAME = "results.sqlite"
"""The cache file's name inside semframe's cache directory."""

RETRY_SECONDS = 1.0
"""Seconds a failed write (a full disk) waits before the writer tries again."""

COMMIT_INTERVAL = 0.01
"""Least seconds between the starts of two commits of the writer thread.

Answers that arrive slower than this are committed one by one as they come;
faster ones are grouped, so that a fast local engine does not pay a commit
per answer. A ``kill -9`` loses at most this long's answers besides the
requests in flight.
"""

TOUCH_SECONDS = 3600.0
"""A served entry's last-used time is refreshed only when older than this (LRU granularity)."""

_SCHEMA_VERSION = 2  # PRAGMA user_version; a file of another version is emptied on open
_ROW_OVERHEAD = 128  # bytes counted per row besides its text (key, numbers, index entries)

_log = logging.getLogger("semframe.cache.store")

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
    size INTEGER NOT NULL
) WITHOUT ROWID;
DROP INDEX IF EXISTS results_last_used;
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    keys BLOB NOT NULL,
    info TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    size INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS hits (
    backend TEXT NOT NULL,
    model TEXT NOT NULL,
    hits INTEGER NOT NULL,
    PRIMARY KEY (backend, model)
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('bytes', 0);
"""

_INSERT = (
    "INSERT INTO results (key, backend, model, text, tokens, prompt_tokens, cached_tokens, "
    "cache_write_tokens, output_tokens, finish_reason, created, last_used, size) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET text = excluded.text, tokens = excluded.tokens, "
    "prompt_tokens = excluded.prompt_tokens, cached_tokens = excluded.cached_tokens, "
    "cache_write_tokens = excluded.cache_write_tokens, output_tokens = excluded.output_tokens, "
    "finish_reason = excluded.finish_reason, last_used = excluded.last_used, size = excluded.size"
)


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
    last_used : float
        When it was last served or stored (wall clock seconds).
    """

    text: str
    usage: Usage
    finish_reason: str | None
    tokens: tuple[TokenLogprob, ...] | None
    last_used: float = 0.0


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
    calls : int
        Calls indexed (re-runs served whole).
    """

    path: Path
    entries: int
    bytes: int
    file_bytes: int
    by_model: tuple[tuple[str, str, int, int], ...]
    calls: int = 0

    def __str__(self) -> str:
        lines = [
            f"cache: {self.path}",
            f"entries: {self.entries:,}",
            f"calls indexed: {self.calls:,}",
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

    Answers given to :meth:`put` are committed by a background writer thread
    as soon as it is free and :data:`COMMIT_INTERVAL` has passed since its last
    commit (group commit): one at a time when answers arrive slowly, many per
    transaction when they arrive fast. When a write fails (a
    full disk, a lock held too long), the answers stay in memory, a warning
    is logged once, and the writer tries again after :data:`RETRY_SECONDS`;
    the run itself never sees the failure.

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
        self._db_lock = threading.RLock()  # the connection
        self._cond = threading.Condition()  # the fields below
        # Appended to by put() without a lock (deque operations are atomic); drained
        # under _cond by whoever writes.
        self._pending: deque[tuple[Any, ...]] = deque()
        self._writing = False
        self._idle = False  # the writer waits with nothing pending (put() must wake it)
        self._stopping = False
        self._retry_at = 0.0
        self._last_commit = 0.0
        self._writer: threading.Thread | None = None
        self._closed = False
        self.write_errors = 0
        """Writes that failed (their answers were kept in memory and tried again)."""
        self.last_error: str | None = None
        """The last write failure, as SQLite reported it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        try:
            self._db.execute("PRAGMA busy_timeout = 30000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute("PRAGMA cache_size = -65536")  # 64 MiB: bulk inserts stay in memory
            with self._transaction():
                (version,) = self._db.execute("PRAGMA user_version").fetchone()
                if version != _SCHEMA_VERSION:  # an older format: it is only a cache
                    for kind, name in self._db.execute(
                        "SELECT type, name FROM sqlite_master "
                        "WHERE type IN ('table', 'trigger') AND name NOT LIKE 'sqlite_%'"
                    ).fetchall():
                        self._db.execute(f'DROP {kind} IF EXISTS "{name}"')
                for statement in _split_script(_SCHEMA):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
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
        """Commit what is pending and close the connection (idempotent).

        Answers that still cannot be written are reported in a warning.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = self._stopping = True
            self._cond.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join()
        try:
            self.flush()
            with self._cond:
                lost = len(self._pending)
            if lost:
                _log.warning(
                    "result cache: %d answers could not be stored (%s); this run's results "
                    "are complete, but a re-run will send those requests again",
                    lost,
                    self.last_error,
                )
        finally:
            with self._db_lock:
                self._db.close()

    def __repr__(self) -> str:
        return f"ResultCache({str(self.path)!r}, max_bytes={self.max_bytes})"

    # -- reading -----------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The stored entries among ``keys`` (missing keys are absent).

        Hits are not counted: call :meth:`count_hits` (and :meth:`touch`) for
        the entries actually served.
        """
        return {
            key: Entry(text, Usage(p, c, w, o), finish, load_tokens(tokens), used)
            for key, (text, tokens, p, c, w, o, finish, used) in self.rows(keys).items()
        }

    def rows(self, keys: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        """:meth:`get_many` as plain rows, for speed.

        Each is ``key -> (text, tokens as JSON or None, prompt, cached,
        cache-write and output tokens, finish reason, last used)``.
        """
        found: dict[str, tuple[Any, ...]] = {}
        with self._db_lock:
            if self._closed:
                return found
            for lo in range(0, len(keys), 500):
                chunk = list(keys[lo : lo + 500])
                marks = ",".join("?" * len(chunk))
                cursor = self._db.execute(
                    "SELECT key, text, tokens, prompt_tokens, cached_tokens, "
                    "cache_write_tokens, output_tokens, finish_reason, last_used "
                    f"FROM results WHERE key IN ({marks})",
                    chunk,
                )
                for row in cursor:
                    found[row[0]] = row[1:]
        return found

    def get_call(self, key: str) -> tuple[list[str], dict[str, Any]] | None:
        """A call's entry (see :func:`call_key`); ``None`` when absent.

        Returns the request key of each of the call's rows, in the caller's row
        order, and what was recorded with the entry.
        """
        with self._db_lock:
            if self._closed:
                return None
            row = self._db.execute("SELECT keys, info FROM calls WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        blob, info = row
        text = bytes(blob).hex()
        return [text[i : i + 64] for i in range(0, len(text), 64)], json.loads(info)

    def put_call(self, key: str, keys: Sequence[str], info: Mapping[str, Any]) -> None:
        """Store a call's entry: ``keys[i]`` is the request key of the call's row ``i``.

        Written at once (one row), after the answers pending before it. A
        failed write is logged, never raised: the call is only not indexed.
        """
        if not self.flush():
            return
        blob = bytes.fromhex("".join(keys))
        text = json.dumps(dict(info), separators=(",", ":"))
        size = len(blob) + len(text) + _ROW_OVERHEAD
        now = self.clock()
        try:
            with self._db_lock:
                if self._closed:
                    return
                with self._transaction():
                    self._db.execute(
                        "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
                        "SET keys = excluded.keys, info = excluded.info, "
                        "last_used = excluded.last_used, size = excluded.size",
                        (key, blob, text, now, now, size),
                    )
                    self._db.execute(
                        "UPDATE meta SET value = value + ? WHERE name = 'bytes'", (size,)
                    )
                    self._evict_locked()
        except sqlite3.Error as exc:
            _log.warning("result cache: the call could not be indexed (%s)", exc)

    def touch_call(self, key: str) -> None:
        """Mark a call's entry as used now."""
        self._apply("UPDATE calls SET last_used = ? WHERE key = ?", [(self.clock(), key)])

    def touch(self, keys: Iterable[str]) -> None:
        """Mark ``keys`` as used now (for the least-recently-used eviction)."""
        keys = list(keys)
        if not keys:
            return
        now = self.clock()
        self._apply("UPDATE results SET last_used = ? WHERE key = ?", [(now, k) for k in keys])

    def count_hits(self, backend: str, model: str, hits: int) -> None:
        """Add ``hits`` served answers to the count of ``backend``/``model`` (``cache info``)."""
        if hits <= 0:
            return
        self._apply(
            "INSERT INTO hits VALUES (?, ?, ?) "
            "ON CONFLICT (backend, model) DO UPDATE SET hits = hits + excluded.hits",
            [(backend, model, hits)],
        )

    def _apply(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run ``statement`` once per row of parameters, in one transaction (no-op once closed)."""
        with self._db_lock:
            if self._closed:
                return
            with self._transaction():
                self._db.executemany(statement, rows)

    # -- writing -----------------------------------------------------------------------

    def put(self, key: str, backend: Backend, completion: Completion) -> None:
        """Queue an answer for storage; the writer thread commits it shortly.

        An answer that is not valid Unicode (a lone surrogate) cannot be stored
        as text and is skipped; so is one given after :meth:`close`.
        """
        tokens = None if completion.tokens is None else _dump_tokens(completion.tokens)
        u = completion.usage
        text = completion.text
        try:
            size = len(text) if text.isascii() else len(text.encode("utf-8"))
            if tokens is not None:
                size += len(tokens.encode("utf-8"))
        except UnicodeEncodeError:
            _log.debug("result cache: answer with a lone surrogate not stored")
            return
        size += _ROW_OVERHEAD
        now = self.clock()
        row = (
            key,
            backend.name,
            backend.model,
            text,
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
        self._pending.append(row)  # after close() it is never written, as documented
        # The writer sets _idle before it last looks at the queue, so reading it after
        # the append never misses a writer going to sleep; one waiting on a timer
        # (answers pending) wakes by itself.
        if self._writer is None or self._idle:
            with self._cond:
                if self._closed:
                    return
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._write_loop, name="semframe-cache-writer", daemon=True
                    )
                    self._writer.start()
                elif self._idle:
                    self._idle = False
                    self._cond.notify()

    @property
    def pending(self) -> int:
        """Answers given to :meth:`put` and not yet committed."""
        with self._cond:
            return len(self._pending)

    def flush(self) -> bool:
        """Commit every pending answer now; whether everything is stored.

        A failed write is logged, never raised; its answers stay pending.
        """
        with self._cond:
            while self._writing:
                self._cond.wait()
            rows = self._drain()
            self._writing = True
        try:
            ok = self._write(rows)
        finally:
            with self._cond:
                if not ok:
                    self._pending.extendleft(reversed(rows))
                self._writing = False
                self._cond.notify_all()
        return ok

    def _drain(self) -> list[tuple[Any, ...]]:
        """Take every queued row (``put`` may append meanwhile: those stay queued)."""
        queue = self._pending
        return [queue.popleft() for _ in range(len(queue))]

    def _write_loop(self) -> None:
        """The writer thread: commit whatever is pending, one transaction at a time."""
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    if self._pending and not self._writing:
                        ready = max(self._retry_at, self._last_commit + COMMIT_INTERVAL)
                        wait = ready - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._idle = True
                        if not self._pending:  # looked at after _idle is set: see put()
                            self._cond.wait()
                        self._idle = False
                rows = self._drain()
                self._writing = True
                self._last_commit = time.monotonic()
            ok = False
            try:
                ok = self._write(rows)
            finally:
                with self._cond:
                    if not ok:
                        self._pending.extendleft(reversed(rows))
                        self._retry_at = time.monotonic() + RETRY_SECONDS
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, rows: list[tuple[Any, ...]]) -> bool:
        if not rows:
            return True
        try:
            with self._db_lock:
                if self._db_closed():
                    return False
                with self._transaction():
                    # In key order: the B-tree is filled page by page, not at random.
                    self._db.executemany(_INSERT, sorted(rows) if len(rows) > 1 else rows)
                    self._db.execute(
                        "UPDATE meta SET value = value + ? WHERE name = 'bytes'",
                        (sum(row[-1] for row in rows),),
                    )
                    self._evict_locked()
        except sqlite3.Error as exc:  # disk full, locked for too long: the run goes on
            self.write_errors += 1
            self.last_error = str(exc)
            log = _log.warning if self.write_errors == 1 else _log.debug
            log(
                "result cache write failed (%s): %d answers kept in memory, tried again "
                "in %g s; the run goes on",
                exc,
                len(rows),
                RETRY_SECONDS,
            )
            return False
        return True

    def _db_closed(self) -> bool:
        try:
            self._db.total_changes  # noqa: B018 - raises on a closed connection
        except sqlite3.ProgrammingError:
            return True
        return False

    def _evict_locked(self) -> None:
        """Delete least recently used rows until the stored bytes fit the cap (in a transaction).

        The ``bytes`` counter only ever over-counts (an answer that replaces
        another adds its size without taking the old one's off), so it is
        recounted exactly before anything is evicted.
        """
        if self.max_bytes is None:
            return
        (total,) = self._db.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()
        if total <= self.max_bytes:
            return
        total = self._recount_locked()
        if total <= self.max_bytes:
            return
        excess = total - self.max_bytes * 9 // 10  # evict down to 90% so eviction is rare
        freed = 0
        doomed: tuple[list[tuple[str]], list[tuple[str]]] = ([], [])
        for table, key, size, _ in self._db.execute(
            "SELECT 0, key, size, last_used FROM results "
            "UNION ALL SELECT 1, key, size, last_used FROM calls ORDER BY 4, 1, 2"
        ):
            doomed[table].append((key,))
            freed += size
            if freed >= excess:
                break
        self._db.executemany("DELETE FROM results WHERE key = ?", doomed[0])
        self._db.executemany("DELETE FROM calls WHERE key = ?", doomed[1])
        self._db.execute("UPDATE meta SET value = ? WHERE name = 'bytes'", (total - freed,))

    def _recount_locked(self) -> int:
        """Sum the stored sizes exactly and store the sum in ``meta``."""
        (total,) = self._db.execute(
            "SELECT (SELECT COALESCE(SUM(size), 0) FROM results) "
            "+ (SELECT COALESCE(SUM(size), 0) FROM calls)"
        ).fetchone()
        self._db.execute("UPDATE meta SET value = ? WHERE name = 'bytes'", (total,))
        return int(total)

    # -- maintenance -------------------------------------------------------------------

    def info(self) -> CacheInfo:
        """Entries, sizes and per-model counts."""
        self.flush()
        with self._db_lock:
            (entries,) = self._db.execute("SELECT COUNT(*) FROM results").fetchone()
            (calls,) = self._db.execute("SELECT COUNT(*) FROM calls").fetchone()
            with self._transaction():
                stored = self._recount_locked()
            by_model = self._db.execute(
                "SELECT r.backend, r.model, COUNT(*), "
                "(SELECT hits FROM hits h WHERE h.backend = r.backend AND h.model = r.model) "
                "FROM results r GROUP BY r.backend, r.model "
                "ORDER BY COUNT(*) DESC, r.backend, r.model"
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
            int(calls),
        )

    def clear(self, older_than_days: float | None = None) -> int:
        """Delete every entry, or those not used for ``older_than_days``; returns how many."""
        self.flush()
        with self._db_lock:
            with self._transaction():
                if older_than_days is None:
                    cur = self._db.execute("DELETE FROM results")
                    self._db.execute("DELETE FROM hits")
                    self._db.execute("DELETE FROM calls")
                else:
                    cutoff = self.clock() - older_than_days * 86400.0
                    cur = self._db.execute("DELETE FROM results WHERE last_used < ?", (cutoff,))
                    self._db.execute("DELETE FROM calls WHERE last_used < ?", (cutoff,))
                removed = cur.rowcount
                self._recount_locked()
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
            try:
                self.db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        else:
            self._rollback()

    def _rollback(self) -> None:
        # SQLite may have rolled back already (SQLITE_FULL does): nothing left to undo.
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
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


def load_tokens(text: str | None) -> tuple[TokenLogprob, ...] | None:
    """Token logprobs stored as JSON (``None`` stays ``None``)."""
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
