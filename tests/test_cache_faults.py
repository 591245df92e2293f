"""Result cache faults: a held write lock, a damaged file, a read-only folder, a filling disk.

Each scenario runs real calls through the public API on the fake backend (or
the store itself, where the fault is in one write) and checks that the run
finishes quickly with every row, that what the cache holds is served (nothing
stored is paid for again), and that what could not be stored is said, with
its count, in a warning on the ``semframe.cache`` logger.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

import semframe
import semframe.runtime.call
from semframe.backends.base import Completion, Usage
from semframe.backends.fake import FakeBackend
from semframe.cache import store
from semframe.cache.store import FILENAME, ResultCache
from semframe.cli import main
from semframe.runtime.stats import RunStats

TEMPLATE = "Summarize {review} of {movie}"
LOGGER = "semframe.cache"
PADDING = "a long and winding review that goes on " * 8  # ~300 characters an answer


def _frame(n: int, start: int = 0) -> pd.DataFrame:
    rows = range(start, start + n)
    return pd.DataFrame(
        {
            "movie": [f"movie {i % 7}" for i in rows],
            "review": [f"review {i}: {PADDING}" for i in rows],
        },
        index=[f"id{i}" for i in rows],
    )


def _cache_file() -> Path:
    return Path(semframe.config()["cache_dir"]) / FILENAME


def _stats() -> RunStats:
    stats = semframe.last_run()
    assert stats is not None
    return stats


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER)]


def _map(df: pd.DataFrame) -> pd.DataFrame:
    return df.llm.map(TEMPLATE, backend="fake")


@contextlib.contextmanager
def _write_lock(path: Path) -> Iterator[None]:
    """Hold the cache's write lock from another connection, as another process would."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


# -- 1. a write lock held by another process ------------------------------------------


def test_rerun_is_served_while_another_process_holds_the_write_lock(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    df = _frame(100)
    first = _map(df)
    assert len(fake.history) == 100
    with _write_lock(_cache_file()), caplog.at_level(logging.WARNING, logger=LOGGER):
        start = time.monotonic()
        again = _map(df)  # indexed: served whole
        whole = time.monotonic() - start
        assert (_stats().requests, _stats().cache_hits) == (0, 100)
        start = time.monotonic()
        part = _map(df.iloc[:60])  # another call: every answer looked up one by one
        looked_up = time.monotonic() - start
        assert (_stats().requests, _stats().cache_hits) == (0, 60)
    assert len(fake.history) == 100, "nothing was sent again"
    pd.testing.assert_frame_equal(again, first)
    pd.testing.assert_frame_equal(part, first.iloc[:60])
    assert whole < 1.0 and looked_up < 1.0, (whole, looked_up)
    assert not _messages(caplog), "nothing paid for was left unstored, so nothing to say"


def test_a_lock_held_through_a_run_costs_seconds_and_the_unstored_are_counted(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    _map(_frame(1, start=1000))  # the cache file exists, schema and all
    df = _frame(40)
    with _write_lock(_cache_file()), caplog.at_level(logging.WARNING, logger=LOGGER):
        start = time.monotonic()
        out = _map(df)
        elapsed = time.monotonic() - start
    assert out["llm_output"].notna().all()
    assert _stats().requests == 40
    messages = _messages(caplog)
    assert any("holds the write lock" in m for m in messages), messages
    (lost,) = [m for m in messages if "could not be stored" in m]
    assert "40 answers could not be stored" in lost
    assert "re-run will send those 40 requests again" in lost
    assert f"write lock of {_cache_file()} for more than {store.LOCK_WAIT_SECONDS:g} s" in lost
    # the end of the run waited for the lock LOCK_WAIT_SECONDS, and the writer's last try
    assert elapsed < store.LOCK_WAIT_SECONDS + 2 * store.BUSY_SECONDS + 1.0, elapsed
    sent = len(fake.history)
    again = _map(df)  # the lock is gone: exactly the 40 reported are sent again
    assert len(fake.history) - sent == 40
    pd.testing.assert_frame_equal(again, out)


# -- 2. a damaged cache file ----------------------------------------------------------


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size * 55 // 100)


def _zero_pages(path: Path) -> None:
    """Overwrite a fifth of the file's pages, a third of the way in, with zeros."""
    page = 4096
    pages = path.stat().st_size // page
    first, count = pages // 3, max(4, pages // 5)
    with path.open("r+b") as f:
        f.seek(first * page)
        f.write(bytes(count * page))


DAMAGE: dict[str, Callable[[Path], None]] = {"truncated": _truncate, "zeroed": _zero_pages}
READABLE = {"truncated": 0.35, "zeroed": 0.6}  # the least share of answers salvaged


def _fill_and_damage(how: str, n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = _frame(n)
    first = _map(df)
    path = _cache_file()
    assert not path.with_name(FILENAME + "-wal").exists(), "closed: the WAL is folded in"
    DAMAGE[how](path)
    return df, first


def _aside() -> list[Path]:
    return sorted(_cache_file().parent.glob(FILENAME + ".damaged-*[0-9]"))


def _salvaged(message: str) -> int:
    if "nothing in it could be read" in message:
        return 0
    found = re.search(r"with the ([\d,]+) answers", message)
    assert found is not None, message
    return int(found.group(1).replace(",", ""))


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_file_is_moved_aside_and_what_is_readable_is_served(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    n = 300
    df, first = _fill_and_damage(how, n)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = _map(df)
    pd.testing.assert_frame_equal(out, first)
    recovered = [m for m in _messages(caplog) if "was damaged" in m]
    assert len(recovered) == 1, _messages(caplog)
    (aside,) = _aside()
    assert f"moved it aside to {aside}" in recovered[0]
    assert aside.stat().st_size > 0, "the damaged file is kept"
    salvaged = _salvaged(recovered[0])
    stats = _stats()
    # About half the file is gone, or a fifth of its pages: the rest is readable.
    assert n * READABLE[how] < salvaged < n, recovered[0]
    assert (stats.cache_hits, stats.requests) == (salvaged, n - salvaged)
    assert len(fake.history) == n + n - salvaged, "only the unreadable rows were sent again"
    sent = len(fake.history)
    assert _map(df).equals(first)
    assert len(fake.history) == sent, "the fresh file now holds every answer"


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_cli_info_and_clear_work_on_a_damaged_file(
    fake: FakeBackend,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    _fill_and_damage(how, 200)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    (aside,) = _aside()
    salvaged = _salvaged(out)
    assert "was damaged" in out and f"moved it aside to {aside}" in out, out
    assert f"entries: {salvaged:,}" in out
    assert "damaged files kept aside" in out and str(aside) in out
    assert main(["cache", "info"]) == 0, "and it stays repaired"
    assert "was damaged" not in capsys.readouterr().out

    _fill_and_damage(how, 200)  # the same answers again, then damage the fresh file
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "was damaged" in out, out
    assert re.search(r"removed [\d,]+ answers from ", out), out
    assert len(_aside()) == 2
    assert main(["cache", "info"]) == 0
    assert "entries: 0" in capsys.readouterr().out


def test_salvage_reads_pages_the_damaged_tree_no_longer_reaches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut in half, a big file keeps about half its answers, though its inner pages are gone.

    Keys are digests (random order) committed 100 at a time, as in a run: the
    pages that lead from the table's root to most leaves are then in the lost
    half, and reading through SQLite alone salvages a few dozen answers.
    """
    fake = FakeBackend()
    path = tmp_path / FILENAME
    answers = {
        hashlib.sha256(str(i).encode()).hexdigest(): f"answer {i} " + "z" * 300 for i in range(5000)
    }
    with ResultCache(path) as cache:
        for i, (key, text) in enumerate(answers.items()):
            cache.put(key, fake, Completion(0, text, Usage(9, 0, 0, 80)))
            if i % 100 == 99:
                cache.flush()
    os.truncate(path, path.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER), ResultCache(path) as cache:
        found = cache.get_many(list(answers))
        recovery = cache.recovered
    assert recovery is not None and recovery.damaged is not None
    assert recovery.answers == len(found)
    assert len(found) > 0.4 * len(answers), len(found)
    assert all(entry.text == answers[key] for key, entry in found.items())


def test_a_file_that_is_not_a_database_is_replaced(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    path = _cache_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all " * 200)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _map(_frame(10))
    (message,) = [m for m in _messages(caplog) if "was damaged" in m]
    assert "file is not a database" in message and "nothing in it could be read" in message
    assert _aside()[0].read_bytes().startswith(b"not a database")
    _map(_frame(10))
    assert _stats().cache_hits == 10, "the fresh file stores answers"


# -- 3. a read-only cache -------------------------------------------------------------


@contextlib.contextmanager
def _read_only(paths: list[Path]) -> Iterator[None]:
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in paths}
    try:
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def _check_read_only_rerun(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture, df: pd.DataFrame, first: pd.DataFrame
) -> None:
    path = _cache_file()
    before = path.read_bytes()
    sent = len(fake.history)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = _map(df)
        assert (_stats().requests, _stats().cache_hits) == (0, len(df))
        _map(df.iloc[:10])  # another call, looked up answer by answer
        assert _stats().requests == 0
        new = _map(_frame(5, start=500))  # new answers are sent, returned, not stored
        assert _stats().requests == 5 and new["llm_output"].notna().all()
    pd.testing.assert_frame_equal(again, first)
    assert len(fake.history) == sent + 5
    warnings = [m for m in _messages(caplog) if "not writable" in m]
    assert len(warnings) == 1, _messages(caplog)
    assert str(path.parent) in warnings[0] and "will not be stored" in warnings[0]
    assert path.read_bytes() == before, "nothing was written"


def test_read_only_folder_is_served_and_not_written(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    df = _frame(30)
    first = _map(df)
    path = _cache_file()
    with _read_only([path, path.parent]):
        if os.access(path.parent, os.W_OK) or os.access(path, os.W_OK):
            pytest.skip("running as root: chmod does not stop writes")
        _check_read_only_rerun(fake, caplog, df, first)
        assert sorted(p.name for p in path.parent.iterdir()) == [FILENAME]


def test_unwritable_folder_is_detected_before_sqlite_tries(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """The same, where chmod cannot be used (root): the folder reports itself unwritable."""
    df = _frame(30)
    first = _map(df)
    with _unwritable(_cache_file().parent):
        _check_read_only_rerun(fake, caplog, df, first)


@contextlib.contextmanager
def _unwritable(folder: Path) -> Iterator[None]:
    """Make ``folder`` report itself unwritable, as it would to a user other than root."""
    folder = folder.resolve()
    access = os.access

    def unwritable(path: str | os.PathLike[str], mode: int, **kwargs: object) -> bool:
        if mode & os.W_OK and Path(path).resolve().is_relative_to(folder):
            return False
        return access(path, mode, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "access", unwritable)
        yield


def test_cli_on_a_read_only_or_locked_cache_says_why(
    fake: FakeBackend,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _map(_frame(5))
    monkeypatch.setattr(store, "_CLEAR_WAIT", 0.2, raising=False)  # instead of 10 s
    with _write_lock(_cache_file()):
        assert main(["cache", "info"]) == 0, "reading takes no lock"
        assert "entries: 5" in capsys.readouterr().out
        assert main(["cache", "clear"]) == 1
    err = capsys.readouterr().err
    assert "another process holds its write lock" in err and "run this again" in err, err
    with _unwritable(_cache_file().parent), caplog.at_level(logging.WARNING, logger=LOGGER):
        assert main(["cache", "info"]) == 0
        out = capsys.readouterr().out
        assert "(read-only)" in out and "entries: 5" in out, out
        assert main(["cache", "clear"]) == 1
    assert "is read-only" in capsys.readouterr().err
    assert main(["cache", "info"]) == 0
    assert "entries: 5" in capsys.readouterr().out, "nothing was cleared"


# -- 4. a filling disk ----------------------------------------------------------------


def test_full_disk_stores_what_fits_and_counts_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeBackend()
    n = 2000
    keys = [f"{i:064x}" for i in range(n)]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache = ResultCache(tmp_path / FILENAME)
        (pages,) = cache._db.execute("PRAGMA page_count").fetchone()
        cache._db.execute(f"PRAGMA max_page_count = {pages}")  # full while the answers come
        for i, key in enumerate(keys):
            cache.put(key, fake, Completion(0, f"answer {i} " + "x" * 300, Usage(9, 0, 0, 80)))
        assert cache.flush() is False
        # Room for about half of the ~2,000 answers of ~450 bytes (9 a page).
        cache._db.execute(f"PRAGMA max_page_count = {pages + 110}")
        cache.close()
    with ResultCache(tmp_path / FILENAME) as again:
        stored = len(again.get_many(keys))
    assert n * 0.3 < stored < n, stored
    messages = _messages(caplog)
    assert any("write failed (database or disk is full): stored" in m for m in messages)
    assert any(
        f"{n - stored} answers could not be stored" in m and "free space on the disk" in m
        for m in messages
    ), messages
    assert cache.not_stored == n - stored


def test_full_disk_mid_run_the_rest_is_sent_again_and_only_the_rest(
    monkeypatch: pytest.MonkeyPatch, fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    real_open = semframe.runtime.call.open_cache

    def small_disk(directory: Path, *, max_mib: float | None) -> ResultCache | None:
        cache = real_open(directory, max_mib=max_mib)
        assert cache is not None
        (pages,) = cache._db.execute("PRAGMA page_count").fetchone()
        cache._db.execute(f"PRAGMA max_page_count = {pages + 25}")
        return cache

    monkeypatch.setattr(semframe.runtime.call, "open_cache", small_disk)
    n = 400
    df = _frame(n)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = _map(df)
    assert out["llm_output"].notna().all()
    (message,) = [m for m in _messages(caplog) if "could not be stored" in m]
    found = re.search(r"(\d+) answers could not be stored", message)
    assert found is not None
    lost = int(found.group(1))
    assert 0 < lost < n
    monkeypatch.setattr(semframe.runtime.call, "open_cache", real_open)  # room again
    sent = len(fake.history)
    again = _map(df)
    assert len(fake.history) - sent == lost, "exactly the answers reported are sent again"
    assert _stats().cache_hits == n - lost
    pd.testing.assert_frame_equal(again, out)
