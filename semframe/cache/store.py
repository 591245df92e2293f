"""Persistent result cache: never pay twice for the same deterministic answer.

Every answered request is stored in one SQLite file (``cache_dir()/results.sqlite``,
WAL mode, so readers never wait for a writer and two processes can share it).
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
of the last :data:`COMMIT_INTERVAL` (10 ms).

Nothing the cache does stops or stalls a run:

- Reads have a connection of their own and never wait for a write, ours or
  another process's; opening a file whose schema is in place takes no lock.
- A write waits at most :data:`BUSY_SECONDS` for another process's write lock;
  when it fails, its answers stay in memory and are tried again every
  :data:`RETRY_SECONDS`. The end of a run waits at most
  :data:`LOCK_WAIT_SECONDS` in all, then says in a warning how many answers
  could not be stored (a re-run sends those requests again).
- On a full disk a failed batch is split in halves, so what fits is stored;
  the rest is counted in a warning.
- A damaged file (``database disk image is malformed``, found on opening or
  on any read or write) is moved aside next to the cache as
  ``results.sqlite.damaged-<time>``, a fresh file takes its place, and every
  row that can still be read is salvaged into it (:mod:`~semframe.cache.salvage`).
- A cache whose folder or file is not writable is opened read-only: its
  answers are served, nothing is written, and a warning says so once.

A whole call is indexed too (the ``calls`` table): keyed by the backend and
the call's :func:`~semframe.core.plan.fingerprint` (everything that decides its
requests), an entry lists the request key of each row. A re-run of the same
call finds it and serves every row without ordering or rendering anything;
when a row's answer is missing (evicted, never stored) or no longer parses,
the call takes the ordinary way and sends only what is missing.

Answers are appended to a table in the order they are committed and found
by an index of their keys (32 bytes each, ``keyidx``: key to rowid) that is
written in batches, in key order. Keys are digests, in random order: a table
keyed by them took a random page write for every answer once it outgrew the
page cache, and an index of them taking each commit's keys rewrote most of
its pages at every commit. The answers past the last one indexed (the
watermark) are indexed when they outnumber those indexed
(:data:`MERGE_FACTOR`) and when the writing session closes; until then they
are read past the watermark, newest first. A key stored again (an answer
that no longer parsed, asked again) is appended too: the newest answer is the
one found, and the older is deleted when the newer is indexed. Eviction
leaves the keys of the answers it deletes in the index, pointing to nothing
(or to a rowid given again, another key's answer): every answer read is
matched to the keys asked by its own key, so such an entry finds nothing; the
index is rebuilt once those keys outnumber the answers stored. Deleting the
newest answers lowers the watermark (a trigger), so that a rowid given again
is never below it.

Eviction (past ``cache_max_mib``) removes answers and call entries alike,
least recently used first (it frees 10% of the cap at a time), reading an
index of last-used times and sizes: answers are stored with the time they
come, so that index is appended to, not written at random.

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

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from semframe.cache.keys import KEY_BYTES, Keys
from semframe.cache.salvage import salvage
from semframe.core.wire import Completion, TokenLogprob, Usage

if TYPE_CHECKING:
    from semframe.backends.base import Backend

__all__ = [
    "BUSY_SECONDS",
    "COMMIT_INTERVAL",
    "FILENAME",
    "LOCK_WAIT_SECONDS",
    "MAX_PENDING",
    "RETRY_SECONDS",
    "SCAN_FACTOR",
    "TOUCH_SECONDS",
    "CacheInfo",
    "Entry",
    "Recovery",
    "ResultCache",
    "load_tokens",
    "open_cache",
]

FILENAME = "results.sqlite"
"""The cache file's name inside semframe's cache directory."""

RETRY_SECONDS = 1.0
"""Seconds a failed write (a full disk, a held lock) waits before the writer tries again."""

COMMIT_INTERVAL = 0.01
"""Least seconds between the starts of two commits of the writer thread.

Answers that arrive slower than this are committed one by one as they come;
faster ones are grouped, so that a fast local engine does not pay a commit
per answer. A ``kill -9`` loses at most this long's answers besides the
requests in flight.
"""

BUSY_SECONDS = 1.0
"""Longest one write waits for another connection's write lock (SQLite's busy timeout).

Another process's commits take milliseconds; a lock held longer than this
(a long ``cache clear``, a stuck process) fails the write, whose answers stay
in memory and are tried again.
"""

LOCK_WAIT_SECONDS = 2.0
"""Longest the end of a run waits, in all, for the write lock before giving up.

Answers still not stored then are counted in a warning: the run's results are
complete, and a re-run sends only those requests again.
"""

TOUCH_SECONDS = 3600.0
"""A served entry's last-used time is refreshed only when older than this (LRU granularity)."""

_SCHEMA_VERSION = 4  # PRAGMA user_version; see _create_schema for the older ones
_TEXT_KEYS_VERSION = 2  # keys as hex text in a WITHOUT ROWID table: moved on open
_KEY_INDEX_VERSION = 3  # a unique index of the keys on the answers' table: moved on open
_ROW_OVERHEAD = 128  # bytes counted per row besides its text (key, numbers, index entries)
_CHORE_WAIT = 0.1  # seconds bookkeeping alone (last-used times, hit counts) waits at close
_CLEAR_WAIT = 10.0  # seconds `clear` waits for the write lock
_TABLES = frozenset({"results", "keyidx", "calls", "hits", "meta"})
_OLD_TABLES = frozenset({"results", "calls", "hits", "meta"})  # versions 2 and 3
_READ_ONLY_CODES = frozenset(
    {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM}
)  # opening for writing failed: the file can still be read

_log = logging.getLogger("semframe.cache.store")
_warned_read_only: set[Path] = set()  # folders already reported read-only (once a process)

_T = TypeVar("_T")

Pair = tuple[int, tuple[Any, ...]]
"""A stored entry and a position among the keys asked that it answers."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key BLOB NOT NULL,
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
);
CREATE TABLE IF NOT EXISTS keyidx (key BLOB PRIMARY KEY, rid INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS results_lru ON results (last_used, size);
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
INSERT OR IGNORE INTO meta VALUES ('indexed', 0);
INSERT OR IGNORE INTO meta VALUES ('dangling', 0);
CREATE TRIGGER IF NOT EXISTS results_deleted AFTER DELETE ON results BEGIN
    UPDATE meta SET value = min(value, coalesce((SELECT max(rowid) FROM results), 0))
        WHERE name = 'indexed' AND NOT EXISTS (SELECT 1 FROM results WHERE rowid > old.rowid);
END;
CREATE TRIGGER IF NOT EXISTS keyidx_replaced AFTER UPDATE OF rid ON keyidx
WHEN old.rid != new.rid BEGIN
    DELETE FROM results WHERE rowid = old.rid AND key = new.key;
END;
"""

_RESULT_COLUMNS = (
    "key, backend, model, text, tokens, prompt_tokens, cached_tokens, "
    "cache_write_tokens, output_tokens, finish_reason, created, last_used, size"
)
_INSERT_INTO = f"INSERT INTO results ({_RESULT_COLUMNS}) VALUES "
_ENTRY = (
    "text, tokens, prompt_tokens, cached_tokens, cache_write_tokens, output_tokens, "
    "finish_reason, last_used"
)  # what a lookup reads of an answer, its key after it
# What serving reads: no finish reason (only answers that finished are stored), whose
# text was a fifth of the time reading a 300,000-answer table took.
_SERVED = "text, tokens, prompt_tokens, cached_tokens, cache_write_tokens, output_tokens, last_used"
_SERVED_LEAN = "text, tokens, last_used"  # a re-run that knows its call's usage
_CHUNK = 500  # keys (or rowids) looked up by one statement
_SCAN_ROWS = 65_536  # answers matched at a time while the whole table is read
_INSERT_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# An answer found through the key index, or past the watermark: a commit marks answers
# used before it appends its own, so that only answers another session left unindexed
# (none, once it closed) are read past the watermark for each key.
_TOUCH = (
    "UPDATE results SET last_used = ?1 WHERE rowid = (SELECT rid FROM keyidx WHERE key = ?2) "
    "OR (rowid > (SELECT value FROM meta WHERE name = 'indexed') AND key = ?2)"
)
# Index the answers past the watermark: in key order, each page of the key index is
# written once, however many keys land on it; a key indexed already points to its
# newer answer (the keyidx_replaced trigger deletes the older).
_MERGE = (
    "INSERT INTO keyidx (key, rid) SELECT key, rowid FROM results WHERE rowid > ? "
    "ORDER BY key, rowid ON CONFLICT (key) DO UPDATE SET rid = excluded.rid"
)

MAX_PENDING = 200_000
"""Answers waiting for the writer beyond which :meth:`ResultCache.put` waits for it.

An instant backend (the fake, a local engine answering from its cache) answers
faster than SQLite stores; unbounded, the answers waiting grew to gigabytes at
millions of rows (18.1 GB at the peak of a 10,000,000-row run against 13.0 GB
without the cache). ``put`` waits until the writer takes them, during a
commit or between two: never once a write has failed (another process's
lock, a full disk), where the answers wait in memory as before, and never on
an event loop's thread.
"""

SCAN_FACTOR = 4
"""A lookup reads every stored answer when there are at most this many per key asked for.

Reading the table in the order it is stored costs less than looking up each
key in the index and reading its answer, wherever it is, until the table holds
several times the answers asked for.
"""

MERGE_ROWS = 65_536
"""Answers not yet in the key index beyond which a commit indexes them (see :data:`MERGE_FACTOR`).

New answers are appended to the answers' table and found, until they are
indexed, by reading the table past the last answer indexed (the watermark);
the end of a writing session indexes them all (:meth:`ResultCache.close`).
"""

MERGE_FACTOR = 1.0
"""A commit indexes the answers past the watermark once they outnumber this times those indexed.

Answers are appended in the order they come and indexed in batches, in key
order: the key index's pages are each written once a batch, not once an
answer. Keys are digests, in random order; an index taking them one commit
at a time rewrote most of its pages at every commit once it outgrew the page
cache (a 10,000,000-row run spent 410 s of its 589 s storing answers). A
batch at least as large as what is indexed keeps the work of indexing
proportional to the answers stored (each key is rewritten a bounded number of
times), and the answers read past the watermark at most as many as indexed.
"""

ROWS_PER_INSERT = 2048
"""Answers written by one ``INSERT`` statement (fewer where SQLite allows fewer parameters).

SQLite runs a statement without Python's global lock and takes it back after
each; a statement per answer made the writer thread wait for that lock once
per answer behind a busy main thread, and a fast run end waiting for it.
Beside a busy 3,000,000-row run, 2,048 answers a statement (256 before) halved
the writer's time inserting (78 s to 41 s).
"""


def _insert_rows(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Append ``rows`` to the results table, :data:`ROWS_PER_INSERT` a statement.

    A key stored already is stored again; the newer answer is the one found,
    and the older is deleted when the newer is indexed (:data:`_MERGE`).
    What is left after the full statements goes in statements of half as
    many rows, then a quarter, ...: a connection keeps each statement it
    prepared, and one statement per size of remainder held 118 MB of SQLite's
    memory at the end of a 300,000-row run (a 2,048-row statement is about
    1 MB prepared).
    """
    width = len(rows[0]) if rows else 1
    size = max(1, min(ROWS_PER_INSERT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width))
    at = 0
    while at < len(rows):
        while size > len(rows) - at:
            size //= 2
        chunk = rows[at : at + size]
        at += size
        db.execute(_INSERT_INTO + ",".join([_INSERT_ROW] * size), list(chain.from_iterable(chunk)))


_CALL_UPSERT = (
    " ON CONFLICT (key) DO UPDATE SET keys = excluded.keys, info = excluded.info, "
    "last_used = excluded.last_used, size = excluded.size"
)
_INSERT_CALL = "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)" + _CALL_UPSERT
_INSERT_CALL_ZEROS = "INSERT INTO calls VALUES (?, zeroblob(?), ?, ?, ?, ?)" + _CALL_UPSERT


@dataclass(frozen=True, slots=True)
class _Gather:
    """A call's keys in row order, gathered from plan order as they are written."""

    keys: Keys  # in plan order
    order: NDArray[np.integer[Any]]  # row i's key is keys[order[i]]

    def __len__(self) -> int:
        return int(self.order.size) * KEY_BYTES


def _insert_call(db: sqlite3.Connection, call: tuple[Any, ...]) -> None:
    """Insert (or replace) a call's entry; gathered keys are written through a blob handle."""
    key, keys, *rest = call
    if not isinstance(keys, _Gather):
        db.execute(_INSERT_CALL, call)
        return
    db.execute(_INSERT_CALL_ZEROS, (key, len(keys), *rest))
    (rowid,) = db.execute("SELECT rowid FROM calls WHERE key = ?", (key,)).fetchone()
    with db.blobopen("calls", "keys", rowid) as blob:
        for chunk in keys.keys.taken(keys.order):
            blob.write(chunk)


def _switch_to_wal(db: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode = WAL``, waiting up to 5x ``LOCK_WAIT_SECONDS`` for a lock."""
    deadline = time.monotonic() + 5 * LOCK_WAIT_SECONDS
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


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
class Recovery:
    """What was done about a damaged cache file.

    Attributes
    ----------
    path : Path
        The cache file (now a fresh one).
    damaged : Path or None
        Where the damaged file was moved (its ``-wal`` beside it, when it had
        one); ``None`` when another process had moved it aside already.
    reason : str
        What SQLite reported.
    answers : int
        Answers salvaged into the fresh file.
    calls : int
        Call entries salvaged into the fresh file.
    """

    path: Path
    damaged: Path | None
    reason: str
    answers: int
    calls: int

    def __str__(self) -> str:
        if self.damaged is None:
            return (
                f"the cache file {self.path} was damaged ({self.reason}); another process "
                "had already moved it aside and started a fresh one"
            )
        start = (
            f"the cache file {self.path} was damaged ({self.reason}): moved it aside to "
            f"{self.damaged} and started a fresh cache"
        )
        if self.answers or self.calls:
            salvaged = (
                f" with the {self.answers:,} answers and {self.calls:,} call entries that "
                "could still be read (answers on damaged pages are lost: their requests are "
                "sent again when needed)"
            )
        else:
            salvaged = (
                "; nothing in it could be read, so this run is running without its old "
                "answers (their requests are sent again)"
            )
        return f"{start}{salvaged}. Delete {self.damaged.name} once you no longer need it"


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
    damaged : tuple of Path
        Damaged cache files kept beside this one (see :class:`Recovery`).
    read_only : bool
        Whether the cache could only be opened for reading.
    """

    path: Path
    entries: int
    bytes: int
    file_bytes: int
    by_model: tuple[tuple[str, str, int, int], ...]
    calls: int = 0
    damaged: tuple[Path, ...] = ()
    read_only: bool = False

    def __str__(self) -> str:
        lines = [
            f"cache: {self.path}" + (" (read-only)" if self.read_only else ""),
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
        if self.damaged:
            lines.append("damaged files kept aside (delete them once you no longer need them):")
            lines.extend(f"  {path}" for path in self.damaged)
        return "\n".join(lines)


class _Work(NamedTuple):
    """What one write commits: answers, call entries, and bookkeeping statements."""

    rows: list[tuple[Any, ...]]
    calls: list[tuple[Any, ...]]
    chores: list[tuple[str, list[tuple[Any, ...]]]]

    def empty(self) -> bool:
        return not (self.rows or self.calls or self.chores)


class ResultCache:
    """The SQLite result cache (safe to share between threads).

    Answers given to :meth:`put` are committed by a background writer thread
    as soon as it is free and :data:`COMMIT_INTERVAL` has passed since its last
    commit (group commit): one at a time when answers arrive slowly, many per
    transaction when they arrive fast. When a write fails (a full disk, a
    lock held too long), the answers stay in memory, a warning is logged
    once, and the writer tries again after :data:`RETRY_SECONDS`; the run
    itself never sees the failure. Reads use a connection of their own, so
    they never wait for a write.

    Parameters
    ----------
    path : Path
        The database file; its folder is created when missing.
    max_mib : float, optional
        Size cap in MiB of stored answers; the least recently used are evicted
        past it. ``None``: no cap.
    clock : callable
        Wall clock for created/last-used times (tests pass their own).

    Raises
    ------
    sqlite3.Error or OSError
        When the file can be neither opened nor replaced (the caller runs
        without a cache: see :func:`open_cache`).
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
        self._db_lock = threading.RLock()  # the writing connection (taken before _read_lock)
        self._read_lock = threading.Lock()  # the reading connection
        self._cond = threading.Condition()  # the fields below
        # Appended to by put() without a lock (deque operations are atomic); drained
        # under _cond by whoever writes.
        self._pending: deque[tuple[Any, ...]] = deque()
        self._calls: list[tuple[Any, ...]] = []  # call entries waiting for the writer
        self._chores: list[tuple[str, list[tuple[Any, ...]]]] = []  # touches, hit counts
        self._writing = False
        self._idle = False  # the writer waits with nothing pending (put() must wake it)
        self._stopping = False
        self._unindexed = False  # answers stored here are not all in the key index yet
        self._retry_at = 0.0
        self._last_commit = 0.0
        self._writer: threading.Thread | None = None
        self._closed = False
        self._disconnected = False
        self._gave_up = False  # a flush gave up waiting for the lock: later ones do not wait
        self._failure = ""  # the kind of the last failed write: "busy", "full", ...
        self._warned = False  # a failed write of answers was reported
        self._generation = 0  # bumped when a damaged file is replaced
        self._inode: tuple[int, int] | None = None
        self._broken = False  # a damaged file could not be replaced: nothing is read or stored
        self.read_only = False
        """Whether the folder or file is not writable: answers are served, nothing is stored."""
        self.recovered: Recovery | None = None
        """What was done about a damaged file, when one was found."""
        self.write_errors = 0
        """Writes that failed (their answers were kept in memory and tried again)."""
        self.last_error: str | None = None
        """The last write failure, as SQLite reported it."""
        self.not_stored = 0
        """Answers given up on at :meth:`close` (counted in its warning)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not _writable(self.path):
            self._open_read_only()
            return
        try:
            self._open_writable()
        except sqlite3.DatabaseError as exc:
            if _is_corrupt(exc):
                self._recover(exc, self._generation, opening=True)
            elif _code(exc) in _READ_ONLY_CODES and self.path.exists():
                self._open_read_only()  # not writable after all (a read-only mount, say)
            else:
                raise

    # -- opening -----------------------------------------------------------------------

    def _open_writable(self) -> None:
        """Connect for writing and for reading; create the schema only when it is missing."""
        db = _connect(self.path, BUSY_SECONDS)
        reader: sqlite3.Connection | None = None
        try:
            self._inode = _inode(self.path)
            db.execute("PRAGMA synchronous = NORMAL")
            # 8 MiB of pages for the writer (also what its sorter holds in memory before it
            # spills): answers are appended, and the key index takes them sorted, a batch
            # at a time. 16 MiB stored 3,000,000 answers in 30.6 / 38.0 s against 34.3 /
            # 37.9 s and a cold 300,000-row run no faster, with up to 10 MB more at its
            # peak; 64 MiB (when the index took each commit's keys) held 48 MB more.
            db.execute("PRAGMA cache_size = -8192")
            # Takes no lock when the file is already in WAL mode (it always is once made);
            # on a new file it waits, for another process making the same file at the
            # same moment (SQLite may answer "locked" there without calling its busy
            # handler, so the wait is a loop).
            _switch_to_wal(db)
            # The reader keeps SQLite's default page cache (2 MB): it reads the table in
            # order or looks keys up in key order, each page once; 64 MB there was held
            # by a 1,000,000-row re-run (37 MB of its peak) for no speed.
            reader = _connect(self.path, BUSY_SECONDS)
            self._db, self._reader = db, reader
            if not _schema_ok(reader):
                self._create_schema()
        except BaseException:
            db.close()
            if reader is not None:
                reader.close()
            raise

    def _create_schema(self) -> None:
        """Create the tables: in a new file, or in one of an older format.

        A version 2 file (keys as hex text, the table keyed by them) and a
        version 3 file (keys as 32 bytes, a unique index of them on the
        answers' table) keep their answers: they are copied into this
        version's table and indexed, in the same transaction. A file of any
        other version is emptied (it is only a cache).
        """
        self._db.execute(f"PRAGMA busy_timeout = {int(LOCK_WAIT_SECONDS * 1000)}")
        moved = None
        try:
            with self._transaction():
                (version,) = self._db.execute("PRAGMA user_version").fetchone()
                names = {
                    name
                    for (name,) in self._db.execute(
                        "SELECT name FROM sqlite_master WHERE type = 'table'"
                    )
                }
                move = version in (_TEXT_KEYS_VERSION, _KEY_INDEX_VERSION) and names >= _OLD_TABLES
                if move:
                    self._db.execute("ALTER TABLE results RENAME TO results_old")
                elif version != _SCHEMA_VERSION:
                    for kind, name in self._db.execute(
                        "SELECT type, name FROM sqlite_master "
                        "WHERE type IN ('table', 'trigger') AND name NOT LIKE 'sqlite_%'"
                    ).fetchall():
                        self._db.execute(f'DROP {kind} IF EXISTS "{name}"')
                for statement in _split_script(_SCHEMA):
                    self._db.execute(statement)
                if move:
                    moved = _move_answers(self._db, text_keys=version == _TEXT_KEYS_VERSION)
                    _index_tail(self._db, force=True)
                self._db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
        if moved is not None:
            _log.info("result cache %s: %d answers moved to the current format", self.path, moved)

    def _open_read_only(self) -> None:
        """Open for reading only (``mode=ro``; ``immutable=1`` when no ``-shm`` can be made)."""
        folder = self.path.parent
        if not self.path.exists():
            msg = f"the cache folder {folder} is not writable and holds no {FILENAME} yet"
            raise sqlite3.OperationalError(msg)
        uri = self.path.absolute().as_uri()
        failure: sqlite3.Error | None = None
        for mode in ("mode=ro", "immutable=1"):
            conn = sqlite3.connect(
                f"{uri}?{mode}",
                uri=True,
                timeout=BUSY_SECONDS,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                usable = _schema_ok(conn)
            except sqlite3.DatabaseError as exc:
                conn.close()
                if _is_corrupt(exc):
                    msg = (
                        f"the cache file {self.path} is damaged ({exc}) and cannot be moved "
                        f"aside: {folder} is not writable"
                    )
                    raise sqlite3.DatabaseError(msg) from exc
                failure = exc
                continue
            if not usable:
                conn.close()
                msg = (
                    f"the cache file {self.path} is read-only and holds no answers this "
                    "version of semframe can read"
                )
                raise sqlite3.OperationalError(msg)
            break
        else:
            assert failure is not None
            raise failure
        self._db = self._reader = conn
        self.read_only = True
        if folder not in _warned_read_only:
            _warned_read_only.add(folder)
            what = "folder" if not os.access(folder, os.W_OK) else "file"
            _log.warning(
                "result cache %s %s is not writable: the answers already in %s are served, "
                "but new answers will not be stored (make it writable, or set cache_dir "
                "to a writable folder)",
                what,
                folder if what == "folder" else self.path,
                self.path,
            )

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
        """Commit what is pending and close the connections (idempotent).

        Waits at most :data:`LOCK_WAIT_SECONDS` for another process's write
        lock (less when an earlier flush already gave up on it); answers that
        still cannot be written are counted in a warning.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = self._stopping = True
            self._cond.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join()  # at most one write attempt: BUSY_SECONDS
        with self._cond:
            answers = len(self._pending) + len(self._calls)
        try:
            self.flush(None if answers else _CHORE_WAIT)
            self._index_stored()
            with self._cond:
                lost, calls, chores = len(self._pending), len(self._calls), len(self._chores)
                self._pending.clear()
                self._calls.clear()
                self._chores.clear()
            self.not_stored = lost
            if lost:
                _log.warning(
                    "result cache: %d answers could not be stored (%s); this run's results "
                    "are complete, but a re-run will send those %d requests again%s",
                    lost,
                    self.last_error,
                    lost,
                    self._advice(),
                )
            if calls:
                _log.debug(
                    "result cache: %d calls not indexed (%s): a re-run is planned again, "
                    "its answers served from the cache",
                    calls,
                    self.last_error,
                )
            if chores:
                _log.debug("result cache: %d last-used or hit-count updates dropped", chores)
        finally:
            self._disconnect()

    def _index_stored(self) -> None:
        """Index the answers this cache stored that are not indexed yet (at :meth:`close`).

        Waits for another process's write lock as a flush would; when it
        cannot be had (or the write fails), the answers stay where they are,
        found by reading past the watermark, and the next session to close
        indexes them.
        """
        if not self._unindexed or self.read_only or self._broken:
            return
        wait = _CHORE_WAIT if self._gave_up else LOCK_WAIT_SECONDS
        try:
            with self._db_lock:
                if self._disconnected:
                    return
                self._db.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
                with self._transaction():
                    _index_tail(self._db, force=True)
                self._unindexed = False
        except sqlite3.Error as exc:
            _log.debug("result cache: answers left to index later (%s)", exc)

    def _advice(self) -> str:
        if self._failure == "busy":
            return (
                f": another process held the write lock of {self.path} for more than "
                f"{LOCK_WAIT_SECONDS:g} s"
            )
        if self._failure == "full":
            return f": free space on the disk that holds {self.path.parent}"
        return ""

    def _disconnect(self) -> None:
        with self._db_lock, self._read_lock:
            self._disconnect_locked()

    def _disconnect_locked(self) -> None:
        self._disconnected = True
        for conn in {id(c): c for c in self._connections()}.values():
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _connections(self) -> list[sqlite3.Connection]:
        return [c for c in (getattr(self, "_db", None), getattr(self, "_reader", None)) if c]

    def __repr__(self) -> str:
        return f"ResultCache({str(self.path)!r}, max_bytes={self.max_bytes})"

    # -- damaged files -----------------------------------------------------------------

    def _recover(self, exc: sqlite3.Error, generation: int, *, opening: bool = False) -> None:
        """Move the damaged file aside, start a fresh one and salvage what can be read into it.

        Does nothing when another thread replaced the file since ``generation``.

        Raises
        ------
        sqlite3.DatabaseError
            When the file cannot be replaced (a read-only folder, say); the
            cache then stores nothing and serves nothing.
        """
        with self._db_lock, self._read_lock:
            if generation != self._generation:
                return
            if self._disconnected and not opening:
                msg = "the result cache is closed"
                raise sqlite3.OperationalError(msg)
            self._disconnect_locked()
            reason = str(exc)
            damaged: Path | None = None
            try:
                if self.read_only:
                    msg = f"{self.path.parent} is not writable"
                    raise sqlite3.OperationalError(msg)
                current = _inode(self.path)
                if current is not None and current == self._inode:
                    damaged = _move_aside(self.path)
                self._generation += 1
                self._open_writable()
                self._disconnected = False
                found = salvage(damaged, self._db, version=_SCHEMA_VERSION) if damaged else None
                with self._transaction():
                    _index_tail(self._db, force=True)
                    self._recount_locked()
            except (OSError, sqlite3.Error) as failure:
                self._generation += 1
                self._disconnect_locked()
                self._broken = True
                msg = (
                    f"the cache file {self.path} is damaged ({reason}) and could not be "
                    f"replaced ({failure})"
                    + (f"; it was moved to {damaged}" if damaged is not None else "")
                )
                self.last_error = msg
                if not opening:
                    _log.warning("result cache: %s: running without it", msg)
                raise sqlite3.DatabaseError(msg) from exc
            self.recovered = Recovery(
                self.path,
                damaged,
                reason,
                found.answers if found else 0,
                found.calls if found else 0,
            )
            _log.warning("result cache: %s", self.recovered)

    def _read(self, read: Callable[[sqlite3.Connection], _T]) -> _T | None:
        """Run ``read`` on the reading connection; a damaged file is replaced and read again.

        ``None`` once the cache is closed (or replaced unsuccessfully).
        """
        for attempt in (0, 1):
            with self._read_lock:
                if self._closed or self._disconnected:
                    return None
                generation = self._generation
                try:
                    return read(self._reader)
                except sqlite3.DatabaseError as exc:
                    if attempt or not _is_corrupt(exc):
                        raise
                    error = exc
            self._recover(error, generation)
        return None  # pragma: no cover - the second attempt returns or raises

    # -- reading -----------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The stored entries among ``keys`` (missing keys are absent).

        Hits are not counted: call :meth:`count_hits` (and :meth:`touch`) for
        the entries actually served.
        """
        return {
            key: Entry(text, Usage(p, c, w, o), finish, load_tokens(tokens), used)
            for key, (text, tokens, p, c, w, o, finish, used, _) in self.rows(keys).items()
        }

    def rows(self, keys: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        """:meth:`get_many` as plain rows, for speed.

        Each is ``key -> (text, tokens as JSON or None, prompt, cached,
        cache-write and output tokens, finish reason, last used, the key's
        32 bytes)``; a key that
        is not a request key (a SHA-256 digest in hex) is never found. A
        damaged file is replaced (see :class:`Recovery`) and what was salvaged
        is read.

        Raises
        ------
        sqlite3.Error
            When the file cannot be read (nor replaced).
        """
        if not keys or self._read(_top_rowid) is None:
            return {}  # nothing asked, or nothing stored (a first run): no key is converted
        try:
            wanted = dict(zip(map(bytes.fromhex, keys), keys, strict=True))
            if any(len(d) != KEY_BYTES for d in wanted):
                raise ValueError
        except (TypeError, ValueError):  # a key that is not a digest in hex is never found
            wanted = {d: key for key in keys if (d := _unhex(key)) is not None}
        digests = list(wanted)
        found = self._read(lambda db: _stored(db, digests)) or []
        return {wanted[d]: row for d, row in zip(digests, found, strict=False) if row is not None}

    def call_entry(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """A call's entry: its rows' request keys (32 bytes each, joined) and its info.

        ``None`` when the call is not indexed (see :func:`call_key`), or its
        entry is not whole keys (never served). A re-run reads this and then
        :meth:`read_answers`, rather than :meth:`get_call` and :meth:`rows`: no
        key is turned into hex text and back.

        Raises
        ------
        sqlite3.Error
            When the file cannot be read (nor replaced).
        """
        row = self._call_row(key)
        if row is None or len(row[0]) % KEY_BYTES:
            return None
        return bytes(row[0]), json.loads(row[1])

    def read_answers(
        self, digests: bytes, take: Callable[[Iterable[Pair]], None], *, usage: bool = True
    ) -> bool:
        """Give ``take`` the stored entries of ``digests``, a chunk at a time; whether all came.

        ``digests`` are 32-byte keys, joined (a call entry's, from
        :meth:`call_entry`). Each chunk is ``(position, entry)`` pairs: the
        entry stored for the key at that position of ``digests``, as
        :meth:`rows` gives it but without the finish reason (``text, tokens,
        prompt, cached, cache-write and output tokens, last used, key``;
        without ``usage``, ``text, tokens, last used, key``: SQLite makes
        fewer values, a sixth of a re-run's time at 300,000 rows);
        keys not stored are not given. Only a chunk's entries
        are held at a time (a re-run of a million rows held every entry
        before: 280 MB).

        ``False`` when the reading did not finish in one pass: the cache was
        closed, or found damaged and replaced midway. Chunks given before
        that are not given again; the caller should drop what it took.

        Raises
        ------
        sqlite3.Error
            When the file cannot be read (nor replaced).
        """
        passes = 0

        def read(db: sqlite3.Connection) -> bool:
            nonlocal passes
            passes += 1
            if passes > 1:  # read again after a damaged file was replaced
                return False
            for pairs in _each_stored(db, digests, _SERVED if usage else _SERVED_LEAN):
                take(pairs)
            return True

        return self._read(read) is True

    def get_call(self, key: str) -> tuple[list[str], dict[str, Any]] | None:
        """A call's entry (see :func:`call_key`); ``None`` when absent.

        Returns the request key of each of the call's rows, in the caller's row
        order, and what was recorded with the entry.
        """
        row = self._call_row(key)
        if row is None:
            return None
        blob, info = row
        text = bytes(blob).hex()
        return [text[i : i + 64] for i in range(0, len(text), 64)], json.loads(info)

    def _call_row(self, key: str) -> tuple[Any, ...] | None:
        """A call's ``(keys blob, info JSON)`` as stored; ``None`` when absent."""

        def read(db: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = db.execute(
                "SELECT keys, info FROM calls WHERE key = ?", (key,)
            ).fetchone()
            return row

        return self._read(read)

    # -- writing -----------------------------------------------------------------------

    def put_call(
        self,
        key: str,
        keys: Sequence[str] | Keys,
        info: Mapping[str, Any],
        *,
        order: NDArray[np.integer[Any]] | None = None,
    ) -> None:
        """Store a call's entry: ``keys[i]`` is the request key of the call's row ``i``.

        With ``order``, row ``i``'s key is ``keys[order[i]]`` instead (``keys``
        a :class:`Keys` in plan order, ``order`` the plan's inverse ordering):
        the keys are gathered into row order a chunk at a time as they are
        written, never copied whole (at 1,000,000 rows a copy in row order and
        SQLite's copy of it were 64 MB of a map's peak).

        Written at once with the answers pending before it (at most
        :data:`LOCK_WAIT_SECONDS` of waiting for the write lock). A failed
        write is logged, never raised: the call is only not indexed.
        """
        if self.read_only or self._broken:
            return
        keys = Keys.of(keys)
        blob = keys.joined() if order is None else _Gather(keys, np.asarray(order))
        text = json.dumps(dict(info), separators=(",", ":"))
        size = len(blob) + len(text) + _ROW_OVERHEAD
        now = self.clock()
        with self._cond:
            if self._closed:
                return
            self._calls.append((key, blob, text, now, now, size))
        self.flush()

    def touch_call(self, key: str) -> None:
        """Mark a call's entry as used now (written with the next commit)."""
        self._chore("UPDATE calls SET last_used = ? WHERE key = ?", [(self.clock(), key)])

    def touch(self, keys: Iterable[str]) -> None:
        """Mark ``keys`` as used now, for LRU eviction (written with the next commit)."""
        keys = list(keys)
        if not keys:
            return
        now = self.clock()
        self._chore(_TOUCH, [(now, _key_bytes(k)) for k in keys])

    def count_hits(self, backend: str, model: str, hits: int) -> None:
        """Add ``hits`` served answers to the count of ``backend``/``model`` (``cache info``)."""
        if hits <= 0:
            return
        self._chore(
            "INSERT INTO hits VALUES (?, ?, ?) "
            "ON CONFLICT (backend, model) DO UPDATE SET hits = hits + excluded.hits",
            [(backend, model, hits)],
        )

    def _chore(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        """Queue bookkeeping for the next commit (never waits; dropped if it cannot be written)."""
        if self.read_only or self._broken:
            return
        with self._cond:
            if not self._closed:
                self._chores.append((statement, rows))

    def put(self, key: str | bytes, backend: Backend, completion: Completion) -> None:
        """Queue an answer for storage; the writer thread commits it shortly.

        ``key`` is the request's key in hex, or its 32 bytes
        (:meth:`~semframe.cache.keys.Keys.digest`).

        An answer that is not valid Unicode (a lone surrogate) cannot be stored
        as text and is skipped; so is one given after :meth:`close`, or to a
        read-only cache.
        """
        if self.read_only or self._broken:
            return
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
            key if isinstance(key, bytes) else _key_bytes(key),
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
        if len(self._pending) > MAX_PENDING:
            self._wait_for_writer()

    def _wait_for_writer(self) -> None:
        """Wait while more than :data:`MAX_PENDING` answers are queued for the writer.

        Until the writer takes them (it wakes this thread when it does),
        between its commits as well as during one: the queue stays bounded
        however late the machine's scheduler runs the writer again (waiting
        only during a commit, nothing bounded what was queued between two).
        Never on an event loop's thread, and not once a write has failed (a
        lock held elsewhere, a full disk) or the writer is gone: those
        answers wait in memory.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop on this thread: waiting stalls no one else
        else:
            return
        with self._cond:
            while (
                len(self._pending) > MAX_PENDING
                and not self._closed
                and self._retry_at <= time.monotonic()
                and (self._writing or (self._writer is not None and self._writer.is_alive()))
            ):
                if self._idle:  # asleep with nothing pending when it last looked
                    self._idle = False
                    self._cond.notify_all()
                self._cond.wait(BUSY_SECONDS)

    @property
    def pending(self) -> int:
        """Answers given to :meth:`put` and not yet committed."""
        with self._cond:
            return len(self._pending)

    def flush(self, timeout: float | None = None) -> bool:
        """Commit every pending answer now; whether everything is stored.

        Waits at most ``timeout`` seconds (default :data:`LOCK_WAIT_SECONDS`)
        for another process's write lock, and only a moment once a flush has
        given up on it. A failed write is logged, never raised: its answers
        stay pending (on a full disk, those that did not fit).
        """
        wait = LOCK_WAIT_SECONDS if timeout is None else timeout
        if self._gave_up:
            wait = min(wait, _CHORE_WAIT)
        deadline = time.monotonic() + wait
        with self._cond:
            while self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            work = self._take()
            self._writing = True
        if not work.rows:  # only a call entry or bookkeeping: nothing paid for waits long
            deadline = min(deadline, time.monotonic() + _CHORE_WAIT)
        try:
            while True:
                work, kind = self._write(work, deadline)
                if work.empty() or kind != "busy":
                    break
                if time.monotonic() >= deadline:
                    self._gave_up = True
                    break
        finally:
            with self._cond:
                self._give_back(work)
                self._writing = False
                self._cond.notify_all()
        return not (work.rows or work.calls)

    def _take(self) -> _Work:
        """Take everything queued (under ``_cond``; ``put`` may append meanwhile: those stay)."""
        queue = self._pending
        work = _Work([queue.popleft() for _ in range(len(queue))], self._calls, self._chores)
        self._calls, self._chores = [], []
        return work

    def _give_back(self, work: _Work) -> None:
        """Queue again what a write left (under ``_cond``), ahead of what came meanwhile."""
        self._pending.extendleft(reversed(work.rows))
        self._calls[:0] = work.calls
        self._chores[:0] = work.chores

    def _write_loop(self) -> None:
        """The writer thread: commit whatever is pending, one transaction at a time."""
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    if (self._pending or self._calls) and not self._writing:
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
                work = self._take()
                self._writing = True
                self._last_commit = time.monotonic()
                self._cond.notify_all()  # a put() waiting for the queue to shrink goes on
            left = work
            try:
                left, _ = self._write(work, None)
            finally:
                with self._cond:
                    self._give_back(left)
                    if left.rows or left.calls:
                        self._retry_at = time.monotonic() + RETRY_SECONDS
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, work: _Work, deadline: float | None) -> tuple[_Work, str | None]:
        """Commit ``work`` in one transaction; returns what is left and why (``None``: nothing).

        A write waits for another connection's lock at most :data:`BUSY_SECONDS`,
        and never past ``deadline`` (a :func:`time.monotonic` time). On a full
        disk the answers are split (:meth:`_write_parts`); a damaged file is
        replaced and the write tried once more.
        """
        if work.empty():
            return work, None
        for attempt in (0, 1):
            generation = self._generation
            try:
                with self._db_lock:
                    if self._disconnected:
                        return work, "closed"
                    busy = _CHORE_WAIT if self._gave_up else BUSY_SECONDS
                    if deadline is not None:
                        busy = max(0.0, min(busy, deadline - time.monotonic()))
                    self._db.execute(f"PRAGMA busy_timeout = {int(busy * 1000)}")
                    self._commit(work.rows, work.calls, work.chores)
                self._gave_up = False  # the lock came: later flushes may wait for it again
                return _Work([], [], []), None
            except sqlite3.Error as exc:
                if _is_corrupt(exc) and attempt == 0:
                    try:
                        self._recover(exc, generation)
                    except sqlite3.Error:
                        return work, "corrupt"
                    continue
                if _is_full(exc):
                    return self._write_parts(work, exc), "full"
                kind = "busy" if _is_busy(exc) else "error"
                self._failed(exc, kind, len(work.rows), 0)
                return work, kind
        return work, "corrupt"  # pragma: no cover - the loop returns

    def _write_parts(self, work: _Work, exc: sqlite3.Error) -> _Work:
        """On a full disk: store what fits, halving a failed batch down to single answers.

        Stops at the first single answer that does not fit (the disk is full);
        returns what was not stored. Bookkeeping that does not fit is dropped.
        """
        rows = list(work.rows)
        left: list[tuple[Any, ...]] = []
        parts = deque([rows] if rows else [])
        with self._db_lock:
            while parts:
                part = parts.popleft()
                try:
                    self._commit(part, [], [])
                    continue
                except sqlite3.Error as again:
                    if len(part) > 1 and _is_full(again):
                        half = len(part) // 2
                        parts.extendleft([part[half:], part[:half]])
                        continue
                left.extend(part)
                for rest in parts:
                    left.extend(rest)
                break
            calls = []
            for call in work.calls:
                try:
                    self._commit([], [call], [])
                except sqlite3.Error:
                    calls.append(call)
            with contextlib.suppress(sqlite3.Error):
                self._commit([], [], work.chores)
        self._failed(exc, "full", len(rows), len(rows) - len(left))
        return _Work(left, calls, [])

    def _commit(
        self,
        rows: list[tuple[Any, ...]],
        calls: list[tuple[Any, ...]],
        chores: list[tuple[str, list[tuple[Any, ...]]]],
    ) -> None:
        """One transaction: bookkeeping, answers (appended, maybe indexed), call entries, eviction.

        The answers past the watermark are indexed when they outnumber those
        indexed (:data:`MERGE_FACTOR`) or when the cache is closing.
        """
        if not (rows or calls or chores):
            return
        indexed = False
        with self._transaction():
            for statement, params in chores:
                self._db.executemany(statement, params)
            if rows:
                _insert_rows(self._db, rows)
                self._unindexed = True
                indexed = _index_tail(self._db, force=self._stopping)
            for call in calls:
                _insert_call(self._db, call)
            added = sum(row[-1] for row in rows) + sum(call[-1] for call in calls)
            if added:
                self._db.execute("UPDATE meta SET value = value + ? WHERE name = 'bytes'", (added,))
                self._evict_locked()
        if indexed:
            self._unindexed = False

    def _failed(self, exc: sqlite3.Error, kind: str, answers: int, stored: int) -> None:
        """Record a failed write; the first with answers is a warning, the others debug."""
        self.write_errors += 1
        self.last_error = str(exc)
        self._failure = kind
        # Once a cache, and only for answers: a call entry or bookkeeping is not paid for.
        log = _log.debug
        if answers and not self._warned:
            self._warned = True
            log = _log.warning
        if kind == "full":
            log(
                "result cache write failed (%s): stored %d of %d answers, %d kept in memory "
                "and tried again in %g s; the run goes on (free space on the disk that "
                "holds %s)",
                exc,
                stored,
                answers,
                answers - stored,
                RETRY_SECONDS,
                self.path.parent,
            )
        elif kind == "busy":
            log(
                "result cache write failed (%s): another process holds the write lock of %s; "
                "%d answers kept in memory and tried again in %g s; the run goes on",
                exc,
                self.path,
                answers,
                RETRY_SECONDS,
            )
        else:
            log(
                "result cache write failed (%s): %d answers kept in memory, tried again "
                "in %g s; the run goes on",
                exc,
                answers,
                RETRY_SECONDS,
            )

    def _evict_locked(self) -> None:
        """Delete least recently used rows until the stored bytes fit the cap (in a transaction).

        The ``bytes`` counter only ever over-counts (an answer that replaces
        another adds its size without taking the old one's off), so it is
        recounted exactly before anything is evicted. Both the recount and
        the answers in last-used order are read from the ``results_lru``
        index (last used, size), not from the table: at 3,000,000 answers
        each eviction sorted the whole table, 10 s a time.
        """
        if self.max_bytes is None:
            return
        row = self._db.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()
        if row is not None and row[0] <= self.max_bytes:
            return
        total = self._recount_locked()
        if total <= self.max_bytes:
            return
        excess = total - self.max_bytes * 9 // 10  # evict down to 90% so eviction is rare
        freed = 0
        doomed: tuple[list[tuple[Any]], list[tuple[Any]]] = ([], [])
        for table, key, size, _ in self._db.execute(
            "SELECT 0, rowid, size, last_used FROM results "
            "UNION ALL SELECT 1, key, size, last_used FROM calls ORDER BY 4, 1, 2"
        ):
            doomed[table].append((key,))
            freed += size
            if freed >= excess:
                break
        # Out of the table, in the order it is stored; their keys stay in the key index,
        # pointing to nothing, until it is rebuilt (_drop_dangling): taking a tenth of
        # the answers out of it, at random keys, wrote most of its pages at every eviction.
        rowids = sorted(rowid for (rowid,) in doomed[0])
        self._db.executemany("DELETE FROM results WHERE rowid = ?", [(r,) for r in rowids])
        self._db.executemany("DELETE FROM calls WHERE key = ?", doomed[1])
        self._db.execute("UPDATE meta SET value = ? WHERE name = 'bytes'", (total - freed,))
        self._db.execute(
            "UPDATE meta SET value = value + ? WHERE name = 'dangling'", (len(rowids),)
        )
        _drop_dangling(self._db)

    def _recount_locked(self) -> int:
        """Sum the stored sizes exactly and store the sum in ``meta``."""
        total = _stored_bytes(self._db)
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('bytes', ?)", (total,))
        return total

    # -- maintenance -------------------------------------------------------------------

    def info(self) -> CacheInfo:
        """Entries, sizes and per-model counts (read without taking the write lock)."""
        self.flush()

        def read(db: sqlite3.Connection) -> tuple[int, int, int, list[tuple[Any, ...]]]:
            (entries,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
            (calls,) = db.execute("SELECT COUNT(*) FROM calls").fetchone()
            by_model = db.execute(
                "SELECT r.backend, r.model, COUNT(*), "
                "(SELECT hits FROM hits h WHERE h.backend = r.backend AND h.model = r.model) "
                "FROM results r GROUP BY r.backend, r.model "
                "ORDER BY COUNT(*) DESC, r.backend, r.model"
            ).fetchall()
            return int(entries), int(calls), _stored_bytes(db), by_model

        found = self._read(read)
        if found is None:
            msg = f"the result cache {self.path} is closed"
            raise sqlite3.OperationalError(msg)
        entries, calls, stored, by_model = found
        file_bytes = sum(
            p.stat().st_size
            for p in (self.path, self.path.with_name(self.path.name + "-wal"))
            if p.exists()
        )
        return CacheInfo(
            self.path,
            entries,
            stored,
            file_bytes,
            tuple((str(b), str(m), int(n), int(h or 0)) for b, m, n, h in by_model),
            calls,
            tuple(sorted(self.path.parent.glob(f"{FILENAME}.damaged-*[0-9]"))),
            self.read_only,
        )

    def clear(self, older_than_days: float | None = None) -> int:
        """Delete every entry, or those not used for ``older_than_days``; returns how many.

        Waits up to 10 s for another process's write lock.

        Raises
        ------
        sqlite3.Error
            When the cache is read-only, or the lock could not be had.
        """
        if self.read_only:
            msg = f"the result cache {self.path} is read-only"
            raise sqlite3.OperationalError(msg)
        self.flush()
        for attempt in (0, 1):
            generation = self._generation
            try:
                return self._clear(older_than_days)
            except sqlite3.DatabaseError as exc:
                if attempt or not _is_corrupt(exc):
                    raise
                self._recover(exc, generation)
        return 0  # pragma: no cover - the loop returns or raises

    def _clear(self, older_than_days: float | None) -> int:
        with self._db_lock:
            self._db.execute(f"PRAGMA busy_timeout = {int(_CLEAR_WAIT * 1000)}")
            try:
                with self._transaction():
                    if older_than_days is None:
                        self._db.execute("DELETE FROM keyidx")
                        self._db.execute("UPDATE meta SET value = 0 WHERE name = 'dangling'")
                        cur = self._db.execute("DELETE FROM results")
                        self._db.execute("DELETE FROM hits")
                        self._db.execute("DELETE FROM calls")
                    else:
                        cutoff = self.clock() - older_than_days * 86400.0
                        self._db.execute(
                            "DELETE FROM keyidx WHERE rid IN "
                            "(SELECT rowid FROM results WHERE last_used < ?)",
                            (cutoff,),
                        )
                        cur = self._db.execute("DELETE FROM results WHERE last_used < ?", (cutoff,))
                        self._db.execute("DELETE FROM calls WHERE last_used < ?", (cutoff,))
                    removed = cur.rowcount
                    self._recount_locked()
                if older_than_days is None:
                    with contextlib.suppress(sqlite3.OperationalError):  # only to give space back
                        self._db.execute("VACUUM")
            finally:
                self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
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


# -- helpers ---------------------------------------------------------------------------


def _key_bytes(key: str) -> bytes:
    """A request key (a SHA-256 digest, 64 hex digits) as the 32 bytes the table holds.

    Raises
    ------
    ValueError
        When ``key`` is not 64 hex digits.
    """
    try:
        digest = bytes.fromhex(key)
    except (TypeError, ValueError):
        digest = b""
    if len(digest) != KEY_BYTES:
        msg = f"a result cache key is a SHA-256 digest in 64 hex digits, not {key!r}"
        raise ValueError(msg)
    return digest


def _watermark(db: sqlite3.Connection) -> int:
    """The largest rowid whose answer is in the key index (every answer up to it is)."""
    row = db.execute("SELECT value FROM meta WHERE name = 'indexed'").fetchone()
    return 0 if row is None else int(row[0])


def _index_tail(db: sqlite3.Connection, *, force: bool) -> bool:
    """Index the answers past the watermark (in the caller's transaction); whether it did.

    Without ``force``, only once they outnumber :data:`MERGE_ROWS` and
    :data:`MERGE_FACTOR` times the answers indexed.
    """
    top = _top_rowid(db)
    indexed = _watermark(db)
    if top is None or top <= indexed:
        return False
    if not force and top - indexed < max(MERGE_ROWS, MERGE_FACTOR * indexed):
        return False
    db.execute(_MERGE, (indexed,))
    db.execute("UPDATE meta SET value = ? WHERE name = 'indexed'", (top,))
    return True


def _drop_dangling(db: sqlite3.Connection) -> None:
    """Rebuild the key index once the keys of evicted answers outnumber the answers stored.

    Eviction leaves its answers' keys in the index (see ``_evict_locked``);
    each is found pointing to nothing, or to another key's answer, and never
    served. Rebuilt in key order from the answers stored, at most once every
    time as many answers were evicted as are stored.
    """
    (dangling,) = db.execute("SELECT value FROM meta WHERE name = 'dangling'").fetchone()
    if dangling < MERGE_ROWS:
        return
    (stored,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    if dangling <= stored:
        return
    db.execute("DELETE FROM keyidx")
    db.execute("UPDATE meta SET value = 0 WHERE name IN ('indexed', 'dangling')")
    _index_tail(db, force=True)


def _top_rowid(db: sqlite3.Connection) -> int | None:
    """The largest rowid of the results table; ``None`` while it holds no answer."""
    top: int | None = db.execute("SELECT max(rowid) FROM results").fetchone()[0]
    return top


def _stored(db: sqlite3.Connection, digests: Sequence[bytes]) -> list[tuple[Any, ...] | None]:
    """The stored entry of each of ``digests`` (32-byte keys), ``None`` where there is none.

    Entries are as :meth:`ResultCache.rows` gives them (see :func:`_each_stored`).
    """
    found: list[tuple[Any, ...] | None] = [None] * len(digests)
    if not digests:
        return found
    for pairs in _each_stored(db, b"".join(digests)):
        for i, row in pairs:
            found[i] = row
    return found


def _each_stored(
    db: sqlite3.Connection, digests: bytes, columns: str = _ENTRY
) -> Iterator[Iterable[Pair]]:
    """The stored entries of ``digests`` (32-byte keys, joined), a chunk at a time.

    An entry is its ``columns``, then its key. Each chunk is ``(position among
    the keys asked, entry)`` pairs; a key asked at several positions is given
    at each, and each position at most once: the newest answer of its key.

    The answers not indexed yet (past the watermark; none once the session
    that stored them closed) are read first, newest first. Then a cache
    holding at most :data:`SCAN_FACTOR` answers per distinct key asked is read
    whole, in the order its answers are stored (a re-run of the only call
    cached), and matched to the keys asked in numpy; otherwise each key's
    rowid comes from the key index alone, in key order, then the answers in
    rowid order, the order they are stored in (read in key order, they would
    be read from pages all over the table). Only a chunk's entries are held at
    a time. Everything is read from one snapshot of the file.
    """
    if not digests:
        return
    own = not db.in_transaction
    if own:  # one snapshot: an answer indexed meanwhile is neither lost nor doubled
        db.execute("BEGIN")
    try:
        # At least as many as the answers stored (rowids may be skipped).
        top = _top_rowid(db)
        if top is None:
            return  # nothing stored (a first run): no key is even sorted
        indexed = _watermark(db)
        matcher = _Matcher.of(digests)
        given: set[int] = set()  # positions given an answer not indexed yet
        if top > indexed:
            cursor = db.execute(
                f"SELECT {columns}, key FROM results WHERE rowid > ? ORDER BY rowid DESC",
                (indexed,),
            )
            while chunk := cursor.fetchmany(_SCAN_ROWS):
                newest: list[Pair] = []
                for i, row in matcher.matches(chunk):  # in the chunk's order: newest first
                    if i not in given:
                        given.add(i)
                        newest.append((i, row))
                yield newest
        for pairs in _indexed_stored(db, matcher, columns, top, indexed):
            yield [(i, row) for i, row in pairs if i not in given] if given else pairs
    finally:
        if own and db.in_transaction:
            _end_read(db)


def _end_read(db: sqlite3.Connection) -> None:
    """End a read transaction, whatever ended the read (an error must not outlive it)."""
    try:
        db.execute("COMMIT")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def _indexed_stored(
    db: sqlite3.Connection, matcher: _Matcher, columns: str, top: int, indexed: int
) -> Iterator[Iterable[Pair]]:
    """The indexed answers (rowids up to ``indexed``) of the keys ``matcher`` asks for."""
    if not indexed:
        return
    if top <= SCAN_FACTOR * matcher.distinct:
        cursor = db.execute(f"SELECT {columns}, key FROM results WHERE rowid <= ?", (indexed,))
        while chunk := cursor.fetchmany(_SCAN_ROWS):
            yield matcher.matches(chunk)
        return
    ordered = sorted(matcher.keys())
    at: list[tuple[int, bytes]] = []
    for lo in range(0, len(ordered), _CHUNK):
        chunk_keys = ordered[lo : lo + _CHUNK]
        marks = ",".join("?" * len(chunk_keys))
        sql = f"SELECT rid, key FROM keyidx WHERE key IN ({marks})"
        at.extend(db.execute(sql, chunk_keys))
    at.sort()
    rows: list[tuple[Any, ...]] = []
    for lo in range(0, len(at), _CHUNK):
        rowids = [rowid for rowid, _ in at[lo : lo + _CHUNK]]
        marks = ",".join("?" * len(rowids))
        rows += db.execute(f"SELECT {columns}, key FROM results WHERE rowid IN ({marks})", rowids)
        if len(rows) >= _SCAN_ROWS:
            yield matcher.matches(rows)
            rows = []
    if rows:
        yield matcher.matches(rows)


@dataclass(frozen=True, slots=True)
class _Matcher:
    """Finds which stored rows hold keys asked for, in numpy (32-byte keys, repeats allowed).

    The keys asked are grouped by key: a stored row is given to every
    position asking for its key. Keys are compared as four big-endian 64-bit
    words, found by their first word. Where two distinct keys asked share a
    first word (about one table in 10^8 of a million keys), or a stored key
    is not 32 bytes, rows are matched through a dict instead.
    """

    blob: bytes  # the keys asked, joined
    words: NDArray[np.uint64]  # the distinct keys asked, sorted by their first word, (d, 4)
    first: NDArray[np.uint64]  # their first words, ascending
    start: NDArray[np.intp]  # key j's positions are positions[start[j]:start[j + 1]], (d + 1,)
    positions: NDArray[np.intp]  # positions among the keys asked, grouped by key
    by_key: dict[bytes, list[int]] | None  # the dict fallback (first words not distinct)

    @classmethod
    def of(cls, keys: bytes | Sequence[bytes]) -> _Matcher:
        """The matcher of ``keys``: 32-byte keys, or their concatenation."""
        blob = keys if isinstance(keys, bytes) else b"".join(keys)
        n = len(blob) // KEY_BYTES
        words = np.frombuffer(blob, dtype=">u8").reshape(n, 4)
        positions = np.argsort(words[:, 0], kind="stable")
        words = words[positions]
        head = np.ones(n, dtype=bool)
        head[1:] = (words[1:] != words[:-1]).any(axis=1)  # a new key (runs of one key)
        heads = np.flatnonzero(head)
        first = np.ascontiguousarray(words[heads, 0])
        distinct = first.size < 2 or bool((first[1:] != first[:-1]).all())
        by_key = None if distinct else _positions_by_key(blob)  # runs may interleave
        start = np.append(heads, n).astype(np.intp)
        return cls(blob, words[heads], first, start, positions.astype(np.intp), by_key)

    @property
    def distinct(self) -> int:
        """How many distinct keys are asked for."""
        return len(self.by_key) if self.by_key is not None else int(self.first.size)

    def keys(self) -> list[bytes]:
        """The distinct keys asked for."""
        if self.by_key is not None:
            return list(self.by_key)
        return [w.tobytes() for w in self.words]

    def matches(self, rows: list[tuple[Any, ...]]) -> Iterable[Pair]:
        """``(position among the keys asked, row)`` for the ``rows`` (key last) asked for."""
        try:
            joined = b"".join([row[-1] for row in rows])
        except TypeError:  # a key stored as text (or NULL): matched through the dict
            joined = b""
        if self.by_key is not None or len(joined) != KEY_BYTES * len(rows) or not rows:
            by_key = self.by_key if self.by_key is not None else _positions_by_key(self.blob)
            return [(i, row) for row in rows for i in by_key.get(row[-1], ())]
        if not self.first.size:
            return []
        stored = np.frombuffer(joined, dtype=">u8").reshape(len(rows), 4)
        at = np.searchsorted(self.first, stored[:, 0])
        np.minimum(at, self.first.size - 1, out=at)
        hit = np.flatnonzero((self.words[at] == stored).all(axis=1))
        key = at[hit]
        lo = self.start[key]
        counts = self.start[key + 1] - lo
        if counts.size and int(counts.max()) > 1:  # keys asked at several positions
            ends = np.cumsum(counts)
            offsets = np.arange(int(ends[-1])) - np.repeat(ends - counts, counts)
            lo = np.repeat(lo, counts) + offsets
            hit = np.repeat(hit, counts)
        given = self.positions[lo].tolist()
        return zip(given, map(rows.__getitem__, hit.tolist()), strict=True)


def _positions_by_key(blob: bytes) -> dict[bytes, list[int]]:
    """Each distinct 32-byte key of ``blob`` (keys joined) and its positions there."""
    groups: dict[bytes, list[int]] = {}
    for i in range(len(blob) // KEY_BYTES):
        groups.setdefault(blob[i * KEY_BYTES : (i + 1) * KEY_BYTES], []).append(i)
    return groups


def _unhex(text: Any) -> bytes | None:
    """A key in 64 hex digits as its 32 bytes; ``None`` for anything else."""
    try:
        return _key_bytes(text)
    except ValueError:
        return None


def _move_answers(db: sqlite3.Connection, *, text_keys: bool) -> int:
    """Copy the answers of an older version's table (``results_old``) into ``results``; drop it.

    With ``text_keys`` (version 2) each key is turned from hex text into its
    32 bytes. Runs inside the caller's transaction; returns how many answers
    were copied (a row whose key is not a digest is left behind). Each key is
    stored once in either older table.
    """
    if not text_keys:
        cursor = db.execute(
            f"INSERT INTO results ({_RESULT_COLUMNS}) "
            f"SELECT {_RESULT_COLUMNS} FROM results_old ORDER BY rowid"
        )
        db.execute("DROP TABLE results_old")
        return max(cursor.rowcount, 0)
    db.create_function("semframe_unhex", 1, _unhex, deterministic=True)
    try:
        cursor = db.execute(
            f"INSERT INTO results ({_RESULT_COLUMNS}) "
            f"SELECT * FROM (SELECT semframe_unhex(key) AS key, {_RESULT_COLUMNS[5:]} "
            "FROM results_old) WHERE key IS NOT NULL"
        )
        db.execute("DROP TABLE results_old")
    finally:
        db.create_function("semframe_unhex", 1, None)
    return max(cursor.rowcount, 0)


def _connect(path: Path, busy: float) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=busy, isolation_level=None, check_same_thread=False)


def _schema_ok(db: sqlite3.Connection) -> bool:
    """Whether the file has this version's tables (read only: takes no lock)."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    names = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return bool(version == _SCHEMA_VERSION and names >= _TABLES)


def _stored_bytes(db: sqlite3.Connection) -> int:
    (total,) = db.execute(
        "SELECT (SELECT COALESCE(SUM(size), 0) FROM results) "
        "+ (SELECT COALESCE(SUM(size), 0) FROM calls)"
    ).fetchone()
    return int(total)


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def _is_corrupt(exc: sqlite3.Error) -> bool:
    """SQLite found the file damaged (``malformed``, ``not a database``)."""
    code = _code(exc)
    if code is not None:
        return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


def _is_full(exc: sqlite3.Error) -> bool:
    code = _code(exc)
    return code == sqlite3.SQLITE_FULL if code is not None else "is full" in str(exc)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = _code(exc)
    if code is not None:
        return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc)


def _writable(path: Path) -> bool:
    """Whether the cache can be written: its folder, and the file and its WAL when present."""
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return False
    return all(
        os.access(p, os.W_OK)
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
        if p.exists()
    )


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _move_aside(path: Path) -> Path:
    """Rename a damaged file (and its ``-wal`` and ``-shm``) to ``<name>.damaged-<time>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    path.rename(aside)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            side.rename(aside.with_name(aside.name + suffix))
    return aside


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

    A cache that cannot be opened never stops a run: the run goes on uncached.
    A damaged file is replaced by a fresh one with what could be salvaged, and
    a read-only one is only read (see :class:`ResultCache`).
    """
    try:
        return ResultCache(directory / FILENAME, max_mib=max_mib)
    except (OSError, sqlite3.Error) as exc:
        _log.warning(
            "result cache unavailable (%s): running without it; this run's answers are not "
            "stored (pass cache=False to skip the cache, or set cache_dir to another folder)",
            exc,
        )
        return None
