"""Salvaging a damaged cache file: copy every row that can still be read into a fresh one.

A cache file can be damaged by a truncated copy, a disk that lost writes, or
pages overwritten with zeros. SQLite then reports ``database disk image is
malformed`` for any read that reaches a damaged page, and the rest of the file
is often intact. :func:`salvage` reads it two ways:

1. Through SQLite, table by table, in key order, 500 rows at a time; when a
   read fails, the rows before the damaged page are read one by one, and the
   table is read again from its other end down to the damaged page. (The
   file's write-ahead log, when it has one, is folded into it first.)
2. When that met a damaged page (or the file cannot be opened at all), page
   by page, straight from the file: every table leaf page that is not on the
   free list is parsed, and every ``results`` or ``calls`` row in it that is
   whole is kept. This finds rows whose path from the table's root runs
   through a damaged page, as in a file cut in half, where the pages that
   lead to the rest are often in the missing half. A row read this way does
   not replace one read through SQLite unless it was used more recently.

A row is copied only when it is whole: its columns have the schema's types,
no text holds a NUL (a torn or truncated page reads as zeros), and its
recorded size matches its text. Rows on damaged pages are lost: their
requests are sent again by the next run that needs them.
"""

from __future__ import annotations

import contextlib
import mmap
import sqlite3
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["PROBES", "Salvaged", "salvage"]

PROBES = 20_000
"""Most reads of one table through SQLite (rows are read one at a time near a damaged page)."""

_CHUNK = 500  # rows per read while nothing fails
_BATCH = 2000  # rows per transaction in the fresh file

_RESULTS = (
    "key, backend, model, text, tokens, prompt_tokens, cached_tokens, cache_write_tokens, "
    "output_tokens, finish_reason, created, last_used, size"
)
_CALLS = "key, keys, info, created, last_used, size"
# Answers are gathered here first, one per key (the most recently used), then
# appended to the fresh file's answers, whose keys are not unique until indexed.
_STAGED = "temp.semframe_salvaged"
_STAGED_SCHEMA = """CREATE TEMP TABLE IF NOT EXISTS semframe_salvaged (
    key BLOB PRIMARY KEY, backend, model, text, tokens, prompt_tokens, cached_tokens,
    cache_write_tokens, output_tokens, finish_reason, created, last_used, size)"""
_HITS = "backend, model, hits"


def _insert_newer(table: str, columns: str, op: str) -> str:
    """An insert into ``table`` (``columns``, key first) that keeps the latest used row.

    A row of a key already copied (read again, from the other end of a table
    or from its page) is replaced only when ``excluded.last_used {op}
    last_used``.
    """
    names = columns.split(", ")
    sets = ", ".join(f"{c} = excluded.{c}" for c in names[1:])
    bare = table.rpartition(".")[2]  # an upsert names the conflicting row without its schema
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(names))}) "
        f"ON CONFLICT DO UPDATE SET {sets} WHERE excluded.last_used {op} {bare}.last_used"
    )


Row = tuple[Any, ...]


class Salvaged(NamedTuple):
    """What :func:`salvage` copied into the fresh file."""

    answers: int
    calls: int


class _Table(NamedTuple):
    name: str
    order: str  # the column rows are read in order of (rowid, read along and not copied)
    columns: str
    check: Callable[[Row], bool]  # of a row as read, rowid first
    into: str  # the table of the fresh file the rows are copied into


_OVERHEAD = 128  # what the store counts per row besides its text (store._ROW_OVERHEAD)
_KEY_BYTES = 32  # a request key: a SHA-256 digest


def _is_text(value: object) -> bool:
    # A NUL is never in an answer or a key; zeros are what a torn or truncated page reads as.
    return isinstance(value, str) and "\x00" not in value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and value >= 0


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and value > 0


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _results_row(row: Row) -> bool:
    """Whether a ``results`` row is whole: types, no NULs, and its recorded size matches."""
    if not (
        len(row) == 13
        and isinstance(row[0], bytes)
        and len(row[0]) == _KEY_BYTES
        and all(_is_text(v) for v in row[1:4])
        and (row[4] is None or _is_text(row[4]))
        and all(_is_int(v) for v in row[5:9])
        and (row[9] is None or _is_text(row[9]))
        and _is_time(row[10])
        and _is_time(row[11])
        and _is_int(row[12])
    ):
        return False
    size = _utf8(row[3]) + (0 if row[4] is None else _utf8(row[4])) + _OVERHEAD
    return bool(row[12] == size)


def _calls_row(row: Row) -> bool:
    """Whether a ``calls`` row (rowid first) is whole: 32 bytes a key, sizes that match."""
    return (
        len(row) == 7
        and _is_text(row[1])
        and isinstance(row[2], bytes)
        and len(row[2]) % 32 == 0
        and _is_text(row[3])
        and _is_time(row[4])
        and _is_time(row[5])
        and row[6] == len(row[2]) + _utf8(row[3]) + _OVERHEAD
    )


def _hits_row(row: Row) -> bool:
    return len(row) == 4 and _is_text(row[1]) and _is_text(row[2]) and _is_int(row[3])


_TABLES = (
    _Table("results", "rowid", "rowid, " + _RESULTS, lambda row: _results_row(row[1:]), _STAGED),
    _Table("calls", "rowid", "rowid, " + _CALLS, _calls_row, "calls"),
    _Table("hits", "rowid", "rowid, " + _HITS, _hits_row, "hits"),
)


class _Reader:
    """Reads one table of the damaged file from either end, counting its reads."""

    def __init__(self, db: sqlite3.Connection, table: _Table, emit: Callable[[Row], None]):
        self.db = db
        self.table = table
        self.emit = emit
        self.reads = 0
        self.failed = False  # a read met a damaged page

    def _select(self, after: Any, descending: bool, limit: int) -> list[Row]:
        """Up to ``limit`` rows past ``after`` (``None``: from the start), in order."""
        self.reads += 1
        order = self.table.order
        clause = "" if after is None else f" WHERE {order} {'<' if descending else '>'} ?"
        direction = " DESC" if descending else ""
        return self.db.execute(
            f"SELECT {self.table.columns} FROM {self.table.name}{clause} "
            f"ORDER BY {order}{direction} LIMIT {limit}",
            () if after is None else (after,),
        ).fetchall()

    def run(self, descending: bool, stop: Any = None) -> tuple[Any, bool]:
        """Read from one end of the table until it ends, a read fails, or ``stop`` (descending).

        Returns the key of the last row read (``None``: none) and whether the
        table was read to its other end (or to ``stop``). Rows are read 500 at
        a time; after a failed read, one at a time (a failed read loses the
        rows it had), back to 500 after 500 good ones.
        """
        edge: Any = None
        limit = _CHUNK
        singles = 0
        while self.reads < PROBES:
            try:
                rows = self._select(edge, descending, limit)
            except sqlite3.DatabaseError:
                self.failed = True
                if limit == 1:
                    return edge, False
                limit, singles = 1, 0
                continue
            for row in rows:
                if stop is not None and row[0] <= stop:  # read already, from the other end
                    return edge, True
                self.emit(row)
                edge = row[0]
            if len(rows) < limit:
                return edge, True
            if limit == 1:
                singles += 1
                if singles >= _CHUNK:
                    limit = _CHUNK
        return edge, False


def _read_table(db: sqlite3.Connection, table: _Table, emit: Callable[[Row], None]) -> bool:
    """Read ``table`` through SQLite from both ends; whether every page of it could be read."""
    reader = _Reader(db, table, emit)
    last, done = reader.run(descending=False)
    if not done:
        reader.run(descending=True, stop=last)
    return not reader.failed


def salvage(source: Path, target: sqlite3.Connection, *, version: int) -> Salvaged:
    """Copy the readable rows of the damaged cache file ``source`` into ``target``.

    Parameters
    ----------
    source : Path
        The damaged file. Its ``-wal`` beside it, when there is one, is folded
        into it first (a checkpoint); nothing else is written to it.
    target : sqlite3.Connection
        A fresh cache file with the schema in place, in autocommit mode.
        Answers are gathered in a temporary table first (one per key: the
        most recently used), then appended to ``results`` unindexed (the
        caller indexes them); rows are committed 2,000 at a time, so a
        salvage cut short (a full disk) keeps what it copied.
    version : int
        The schema version of the rows to copy; a file whose header says
        another version gives nothing.

    Returns
    -------
    Salvaged
        How many answers and call entries ``target`` holds afterwards.
    """
    try:
        target.execute(_STAGED_SCHEMA)
        _gather(source, target, version)
    finally:
        with contextlib.suppress(sqlite3.Error):
            _append_staged(target)
    return _count(target)


def _gather(source: Path, target: sqlite3.Connection, version: int) -> None:
    """Copy the readable rows of ``source`` into ``target`` (answers into :data:`_STAGED`)."""
    whole = False
    try:
        db = sqlite3.connect(source, isolation_level=None, timeout=1.0)
    except sqlite3.Error:
        db = None
    if db is not None:
        try:
            # SQLite refuses a file shorter than its header says unless the schema is
            # "writable". The log is folded in so that reading the pages sees it too;
            # nothing else is written (query_only).
            db.execute("PRAGMA writable_schema = ON")
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("PRAGMA query_only = ON")
            (found,) = db.execute("PRAGMA user_version").fetchone()
            if found != version:
                return
            whole = True
            for table in _TABLES:  # every table, even after one met a damaged page
                whole = _copy(db, table, target) and whole
        except sqlite3.Error:
            pass  # the schema cannot be read, or the target is full: keep what is in
        finally:
            db.close()
    if not whole:
        with contextlib.suppress(sqlite3.Error, OSError):
            _copy_pages(source, target)


def _append_staged(target: sqlite3.Connection) -> None:
    """Append the gathered answers to ``results``, :data:`_BATCH` a transaction; drop them."""
    (top,) = target.execute(f"SELECT max(rowid) FROM {_STAGED}").fetchone()
    write = _writer(
        target,
        f"INSERT INTO results ({_RESULTS}) SELECT {_RESULTS} FROM {_STAGED} "
        "WHERE rowid > ? AND rowid <= ?",
    )
    for lo in range(0, top or 0, _BATCH):
        write([(lo, lo + _BATCH)])
    target.execute(f"DROP TABLE {_STAGED}")


def _writer(target: sqlite3.Connection, insert: str) -> Callable[[Sequence[Row]], None]:
    def write(rows: Sequence[Row]) -> None:
        target.execute("BEGIN IMMEDIATE")
        try:
            target.executemany(insert, rows)
            target.execute("COMMIT")
        except BaseException:
            if target.in_transaction:
                target.execute("ROLLBACK")
            raise

    return write


def _copy(db: sqlite3.Connection, table: _Table, target: sqlite3.Connection) -> bool:
    """Copy what SQLite can read of ``table``; whether all of it could be read."""
    columns = table.columns.split(", ")[1:]  # the rowid read along, not copied
    if table.into == _STAGED:  # a key stored twice (one not indexed yet): the latest used
        insert = _insert_newer(_STAGED, ", ".join(columns), ">=")
    else:
        insert = (
            f"INSERT OR REPLACE INTO {table.into} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' * len(columns))})"
        )
    write = _writer(target, insert)
    batch: list[Row] = []

    def emit(row: Row) -> None:
        if not table.check(row):
            return
        batch.append(row[1:])
        if len(batch) >= _BATCH:
            write(batch)
            batch.clear()

    try:
        return _read_table(db, table, emit)
    finally:
        if batch:
            write(batch)


# -- page by page ----------------------------------------------------------------------

_TABLE_LEAF = 0x0D


class _Bad(Exception):
    """A cell or record that does not parse."""


class _File(NamedTuple):
    """The mapped file and its page geometry."""

    data: mmap.mmap
    size: int  # page size
    usable: int  # bytes of a page that hold content (page size less reserved bytes)
    pages: int


def _copy_pages(source: Path, target: sqlite3.Connection) -> None:
    """Copy the whole ``results`` and ``calls`` rows found on the file's pages."""
    write = {
        "results": _writer(target, _insert_newer(_STAGED, _RESULTS, ">")),
        "calls": _writer(target, _insert_newer("calls", _CALLS, ">")),
    }
    batches: dict[str, list[Row]] = {"results": [], "calls": []}
    with source.open("rb") as f:
        if source.stat().st_size < 512:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for table, row in _page_rows(data):
                batch = batches[table]
                batch.append(row)
                if len(batch) >= _BATCH:
                    write[table](batch)
                    batch.clear()
    for table, batch in batches.items():
        if batch:
            write[table](batch)


def _page_rows(data: mmap.mmap) -> Iterator[tuple[str, Row]]:
    """``("results", row)`` and ``("calls", row)`` for each whole row on a live B-tree page."""
    size = int.from_bytes(data[16:18], "big")
    size = 65536 if size == 1 else size
    if size < 512 or size > 65536 or size & (size - 1):
        size = 4096  # the header is damaged: the default
    usable = size - data[20] if data[:16] == b"SQLite format 3\x00" else size
    pages = (len(data) + size - 1) // size
    file = _File(data, size, usable, pages)
    free = _free_pages(data, size, pages)
    for number in range(1, pages + 1):
        if number in free:
            continue
        start = (number - 1) * size
        head = start + (100 if number == 1 else 0)
        kind = data[head] if head < len(data) else 0
        if kind != _TABLE_LEAF:
            continue  # an inner page, or an index's (its keys are in the table's rows)
        cells = int.from_bytes(data[head + 3 : head + 5], "big")
        pointers = head + 8
        for i in range(min(cells, size // 4)):
            at = pointers + 2 * i
            offset = int.from_bytes(data[at : at + 2], "big")
            try:
                row = _cell(file, start + offset)
            except (_Bad, IndexError, UnicodeDecodeError, struct.error):
                continue
            if _calls_row(row):
                yield "calls", row[1:]
            elif _results_row(row[1:]):
                yield "results", row[1:]


def _free_pages(data: mmap.mmap, size: int, pages: int) -> set[int]:
    """The pages on the free list (they hold deleted rows), as far as it can be read."""
    free: set[int] = set()
    trunk = int.from_bytes(data[32:36], "big")
    while 0 < trunk <= pages and trunk not in free:
        free.add(trunk)
        at = (trunk - 1) * size
        count = int.from_bytes(data[at + 4 : at + 8], "big")
        for i in range(min(count, size // 4 - 2)):
            leaf = int.from_bytes(data[at + 8 + 4 * i : at + 12 + 4 * i], "big")
            if 0 < leaf <= pages:
                free.add(leaf)
        trunk = int.from_bytes(data[at : at + 4], "big")
    return free


def _varint(data: mmap.mmap | bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    raise _Bad  # pragma: no cover - the loop returns


def _cell(file: _File, at: int) -> Row:
    """The record of one table leaf cell, rowid first, its overflow pages followed."""
    data, size, usable, pages = file
    length, at = _varint(data, at)
    rowid, at = _varint(data, at)
    most = usable - 35
    least = (usable - 12) * 32 // 255 - 23
    if length <= most:
        local = length
    else:
        local = least + (length - least) % (usable - 4)
        local = local if local <= most else least
    if length > 1 << 24 or at + local > len(data):
        raise _Bad
    payload = bytearray(data[at : at + local])
    overflow = int.from_bytes(data[at + local : at + local + 4], "big") if local < length else 0
    seen = 0
    while len(payload) < length:
        if not 0 < overflow <= pages or seen > pages:
            raise _Bad
        seen += 1
        page = (overflow - 1) * size
        overflow = int.from_bytes(data[page : page + 4], "big")
        payload += data[page + 4 : page + min(usable, 4 + length - len(payload))]
    values = _record(bytes(payload))
    return (rowid, *values)


def _record(payload: bytes) -> Row:
    """The values of one SQLite record."""
    header, at = _varint(payload, 0)
    if not 0 < header <= len(payload):
        raise _Bad
    types = []
    while at < header:
        kind, at = _varint(payload, at)
        types.append(kind)
    values: list[Any] = []
    at = header
    for kind in types:
        if kind == 0:
            values.append(None)
        elif kind <= 6:
            width = (0, 1, 2, 3, 4, 6, 8)[kind]
            values.append(int.from_bytes(payload[at : at + width], "big", signed=True))
            at += width
        elif kind == 7:
            (number,) = struct.unpack(">d", payload[at : at + 8])
            values.append(number)
            at += 8
        elif kind in (8, 9):
            values.append(kind - 8)
        elif kind >= 12:
            width = (kind - 12) // 2
            chunk = payload[at : at + width]
            values.append(chunk.decode("utf-8") if kind % 2 else bytes(chunk))
            at += width
        else:
            raise _Bad
        if at > len(payload):
            raise _Bad
    return tuple(values)


def _count(target: sqlite3.Connection) -> Salvaged:
    (answers,) = target.execute("SELECT COUNT(*) FROM results").fetchone()
    (calls,) = target.execute("SELECT COUNT(*) FROM calls").fetchone()
    return Salvaged(int(answers), int(calls))
