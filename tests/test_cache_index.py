"""The result cache's key index: answers appended, indexed in batches, the newest found.

New answers are appended to the answers' table and indexed (``keyidx``) in
key order when they outnumber those indexed, or when the writing session
closes; until then they are found by reading past the watermark. These tests
check that every answer stored is found, the newest of its key, once per
position asked, whatever was indexed when, and that the index and the
watermark stay true through re-answers, eviction, sessions that never closed
and old files.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.backends.base import Completion, Usage
from semframe.backends.fake import FakeBackend
from semframe.cache import store
from semframe.cache.salvage import salvage
from semframe.cache.store import FILENAME, ResultCache


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def answer(text: str) -> Completion:
    return Completion(0, text, Usage(3, 1, 0, 2), "stop")


BIG = "x" * 10_000  # an answer of about 10 kB: a cap of 0.05 MiB holds about five


def put_timed(
    cache: ResultCache, names: range, now: list[float], step: float = 1.0, *, flush: bool = False
) -> None:
    """Store a :data:`BIG` answer of key ``k{i}`` for each ``i``, moving ``now`` by ``step``."""
    for i in names:
        now[0] += step
        cache.put(digest(f"k{i}"), FakeBackend(), answer(BIG))
        if flush:
            cache.flush()


def put_numbered(cache: ResultCache, names: range) -> None:
    """Store the answer ``a{i}`` of key ``k{i}`` for each ``i``."""
    fake = FakeBackend()
    for i in names:
        cache.put(digest(f"k{i}"), fake, answer(f"a{i}"))


def state(path: Path) -> tuple[int, int, int, int]:
    """(answers stored, keys indexed, watermark, largest rowid) of the file."""
    with sqlite3.connect(path) as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
        (indexed,) = db.execute("SELECT COUNT(*) FROM keyidx").fetchone()
        (mark,) = db.execute("SELECT value FROM meta WHERE name = 'indexed'").fetchone()
        (top,) = db.execute("SELECT coalesce(max(rowid), 0) FROM results").fetchone()
    db.close()
    return int(rows), int(indexed), int(mark), int(top)


def index_is_true(path: Path) -> None:
    """Every answer up to the watermark is the one its key points to; every other key in
    the index (an evicted answer's) points to no answer of that key."""
    with sqlite3.connect(path) as db:
        (mark,) = db.execute("SELECT value FROM meta WHERE name = 'indexed'").fetchone()
        below = dict(db.execute("SELECT rowid, key FROM results WHERE rowid <= ?", (mark,)))
        index = dict(db.execute("SELECT key, rid FROM keyidx"))
        stored = dict(db.execute("SELECT rowid, key FROM results"))
    db.close()
    assert all(index.get(key) == rowid for rowid, key in below.items())
    assert all(stored.get(rid) != key for key, rid in index.items() if key not in below.values())


def test_answers_are_indexed_when_the_session_closes(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    with ResultCache(path) as cache:
        put_numbered(cache, range(20))
        cache.flush()
        assert state(path) == (20, 0, 0, 20), "appended, not indexed yet"
        found = cache.get_many([digest(f"k{i}") for i in range(20)])
        expected = {digest(f"k{i}"): f"a{i}" for i in range(20)}
        assert {k: e.text for k, e in found.items()} == expected
    assert state(path) == (20, 20, 20, 20)
    index_is_true(path)
    with ResultCache(path) as cache:
        found = cache.get_many([digest(f"k{i}") for i in range(20)])
    assert len(found) == 20
    assert state(path) == (20, 20, 20, 20), "a session that stored nothing writes nothing"


def test_the_newest_answer_of_a_key_is_found_and_the_older_deleted(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    fake = FakeBackend()
    key = digest("k")
    with ResultCache(path) as cache:
        cache.put(key, fake, answer("first"))
    with ResultCache(path) as cache:  # indexed: "first"; now a newer answer past the mark
        cache.put(key, fake, answer("second"))
        cache.put(key, fake, answer("third"))
        cache.flush()
        assert state(path)[0] == 3
        for factor in (0, 10**9):  # the whole table read, and the key index
            with mock.patch.object(store, "SCAN_FACTOR", factor):
                found = cache.rows([key, key])
                assert found[key][0] == "third"
                pairs: list[tuple[int, tuple[object, ...]]] = []
                assert cache.read_answers(bytes.fromhex(key) * 2, pairs.extend)
                assert sorted((i, row[0]) for i, row in pairs) == [(0, "third"), (1, "third")]
    assert state(path) == (1, 1, 3, 3), "the older answers are deleted when the newest is indexed"
    index_is_true(path)
    with ResultCache(path) as cache:
        assert cache.get_many([key])[key].text == "third"


def test_answers_of_a_session_that_never_closed_are_found_then_indexed(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    fake = FakeBackend()
    crashed = ResultCache(path)
    for i in range(10):
        crashed.put(digest(f"k{i}"), fake, answer(f"a{i}"))
    crashed.flush()
    crashed._disconnect()  # as a killed process would: nothing indexed
    assert state(path) == (10, 0, 0, 10)
    with ResultCache(path) as reader:
        assert len(reader.get_many([digest(f"k{i}") for i in range(10)])) == 10
        reader.touch([digest("k3")])  # marks an answer not indexed yet
    assert state(path) == (10, 0, 0, 10), "a session that stored nothing indexes nothing"
    with ResultCache(path) as writer:
        writer.put(digest("new"), fake, answer("new"))
    assert state(path) == (11, 11, 11, 11)
    index_is_true(path)


def test_a_long_session_indexes_as_it_goes(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    fake = FakeBackend()
    with (
        mock.patch.object(store, "MERGE_ROWS", 4),
        mock.patch.object(store, "MERGE_FACTOR", 1.0),
        ResultCache(path) as cache,
    ):
        marks = []
        for i in range(40):
            cache.put(digest(f"k{i}"), fake, answer(f"a{i}"))
            cache.flush()
            marks.append(state(path)[2])
        # Indexed once 4 answers wait, then each time those waiting outnumber those indexed.
        assert sorted(set(marks)) == [0, 4, 8, 16, 32]
        index_is_true(path)
    assert state(path) == (40, 40, 40, 40)


def test_eviction_of_answers_indexed_or_not(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    now = [1000.0]
    with ResultCache(path, clock=lambda: now[0]) as cache:
        put_timed(cache, range(4), now)
    assert state(path) == (4, 4, 4, 4)
    with ResultCache(path, max_mib=0.05, clock=lambda: now[0]) as cache:  # ~5 answers
        put_timed(cache, range(4, 8), now, flush=True)
    rows, indexed, mark, top = state(path)
    assert rows == 4 and mark == top
    assert indexed == 8, "k0-k3 evicted, their keys still in the index; k4-k7 indexed at close"
    index_is_true(path)
    with ResultCache(path) as cache:
        found = cache.get_many([digest(f"k{i}") for i in range(8)])
    assert len(found) == rows
    assert set(found) == {digest(f"k{i}") for i in range(8 - rows, 8)}, "the newest are kept"


def test_the_index_is_rebuilt_once_evicted_keys_outnumber_the_answers(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    now = [1000.0]
    with (
        mock.patch.object(store, "MERGE_ROWS", 1),
        ResultCache(path, max_mib=0.05, clock=lambda: now[0]) as cache,
    ):
        for i in range(30):
            put_timed(cache, range(i, i + 1), now, flush=True)
            rows, indexed, _, _ = state(path)
            assert indexed <= 2 * rows + 1, "rebuilt before evicted keys outnumber the answers"
        index_is_true(path)
        found = cache.get_many([digest(f"k{i}") for i in range(30)])
        assert len(found) == state(path)[0]


def test_evicting_the_newest_answers_lowers_the_watermark(tmp_path: Path) -> None:
    """A rowid freed at the top is given again: it must not land below the watermark."""
    path = tmp_path / FILENAME
    fake = FakeBackend()
    now = [1000.0]
    with ResultCache(path, clock=lambda: now[0]) as cache:
        put_timed(cache, range(5), now, -1.0)  # each older than the one before: newest go first
    assert state(path) == (5, 5, 5, 5)
    with ResultCache(path, max_mib=0.03, clock=lambda: now[0]) as cache:  # ~3 answers
        now[0] = 2000.0
        cache.put(digest("new"), fake, answer("new"))
        cache.flush()
        assert state(path) == (3, 5, 5, 6), "k2-k4 (rows 3-5) evicted"
        index_is_true(path)
        assert cache.get_many([digest("new")])[digest("new")].text == "new"
    assert state(path) == (3, 6, 6, 6)
    with ResultCache(path, clock=lambda: now[0]) as cache:
        now[0] = 10**6
        assert cache.clear(older_than_days=1) == 3  # the newest (row 6) too
        assert state(path) == (0, 3, 0, 0), "only the evicted keys are left, pointing nowhere"
        cache.put(digest("newer"), fake, answer("newer"))  # rowid 1 again
        cache.flush()
        assert cache.get_many([digest("newer")])[digest("newer")].text == "newer"
    assert state(path)[::2] == (1, 1)
    index_is_true(path)


def test_an_answer_deleted_by_other_means_is_not_served(tmp_path: Path) -> None:
    """Its key stays in the index, pointing to nothing (or to a rowid given again)."""
    path = tmp_path / FILENAME
    fake = FakeBackend()
    with ResultCache(path) as cache:
        put_numbered(cache, range(3))
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM results WHERE rowid = 3")  # k2, the newest
    db.close()
    with ResultCache(path) as cache:
        cache.put(digest("other"), fake, answer("other"))  # rowid 3 again
        cache.flush()
        for factor in (0, 10**9):
            with mock.patch.object(store, "SCAN_FACTOR", factor):
                found = cache.get_many([digest(f"k{i}") for i in range(3)] + [digest("other")])
                assert {k: e.text for k, e in found.items()} == {
                    digest("k0"): "a0",
                    digest("k1"): "a1",
                    digest("other"): "other",
                }
        cache.put(digest("k2"), fake, answer("again"))
    with ResultCache(path) as cache:
        found = cache.get_many([digest("k2"), digest("other")])
    expected = {digest("k2"): "again", digest("other"): "other"}
    assert {k: e.text for k, e in found.items()} == expected


def test_clearing_empties_the_index(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    fake = FakeBackend()
    with ResultCache(path) as cache:
        put_numbered(cache, range(5))
    with ResultCache(path) as cache:
        assert cache.clear() == 5
        cache.put(digest("k0"), fake, answer("again"))
        cache.flush()
        assert cache.get_many([digest("k0")])[digest("k0")].text == "again"
    assert state(path) == (1, 1, 1, 1)
    index_is_true(path)


# One step of a session: store an answer of key i, commit, or end the session (closing it
# or, as a killed process would, not).
_step = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 11)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.sampled_from(["close", "crash"]), st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(_step, max_size=40),
    merge_rows=st.sampled_from([1, 3, 10**6]),
    scan=st.sampled_from([0, 10**9]),
)
def test_every_answer_stored_is_found_the_newest_once(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, int]],
    merge_rows: int,
    scan: int,
) -> None:
    """Property: whatever was indexed when, each key's newest answer is found, once a position."""
    path = tmp_path_factory.mktemp("index") / FILENAME
    fake = FakeBackend()
    model: dict[str, str] = {}  # key -> the newest answer committed
    pending: dict[str, str] = {}
    keys = [digest(f"k{i}") for i in range(12)]
    with (
        mock.patch.object(store, "MERGE_ROWS", merge_rows),
        mock.patch.object(store, "SCAN_FACTOR", scan),
    ):
        cache = ResultCache(path)
        for n, (what, i) in enumerate(steps):
            if what == "put":
                cache.put(keys[i], fake, answer(f"answer {n}"))
                pending[keys[i]] = f"answer {n}"
            elif what == "flush":
                cache.flush()
                model.update(pending)
                pending.clear()
            else:
                if what == "close":
                    cache.close()
                else:
                    cache.flush()
                    cache._disconnect()
                model.update(pending)
                pending.clear()
                cache = ResultCache(path)
        cache.flush()
        model.update(pending)
        asked = keys + keys[::-1]  # every key asked at two positions
        pairs: list[tuple[int, tuple[object, ...]]] = []
        assert cache.read_answers(bytes.fromhex("".join(asked)), pairs.extend)
        given_at = [i for i, _ in pairs]
        assert sorted(given_at) == sorted(set(given_at)), "a position given twice"
        assert {asked[i]: row[0] for i, row in pairs} == model
        cache.close()
    with ResultCache(path) as reopened:
        found = reopened.get_many(keys)
    assert {k: e.text for k, e in found.items()} == model
    index_is_true(path)
    with ResultCache(path) as writer:  # a session that stores indexes everything at its close
        writer.put(digest("last"), fake, answer("last"))
    rows, indexed, mark, top = state(path)
    index_is_true(path)
    assert rows == indexed == len(model) + 1 and mark == top


def test_salvage_keeps_the_latest_used_answer_of_a_key_stored_twice(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    fake = FakeBackend()
    key = digest("k")
    with ResultCache(path, clock=lambda: 1000.0) as cache:
        cache.put(key, fake, answer("old"))
        cache.put(digest("other"), fake, answer("other"))
    crashed = ResultCache(path, clock=lambda: 2000.0)
    crashed.put(key, fake, answer("new"))
    crashed.flush()
    crashed._disconnect()  # "new" not indexed: the file holds both answers of the key
    assert state(path)[:3] == (3, 2, 2)
    fresh = ResultCache(tmp_path / "fresh" / FILENAME)
    try:
        found = salvage(path, fresh._db, version=store._SCHEMA_VERSION)
        assert found.answers == 2
        with fresh._transaction():
            store._index_tail(fresh._db, force=True)
        texts = {k: e.text for k, e in fresh.get_many([key, digest("other")]).items()}
    finally:
        fresh.close()
    assert texts == {key: "new", digest("other"): "other"}
    index_is_true(tmp_path / "fresh" / FILENAME)


def test_answers_go_in_statements_of_a_few_sizes(tmp_path: Path) -> None:
    """A connection keeps each statement it prepared: one per size of remainder held MBs."""
    db = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    for statement in store._split_script(store._SCHEMA):
        db.execute(statement)
    sizes: set[int] = set()
    db.set_trace_callback(lambda sql: sizes.add(sql.count("),(") + 1) if "INSERT" in sql else None)
    stored = 0
    for n in (5000, 3001, 77, 1, 2048):
        rows = [
            (digest(f"{n}-{i}").encode()[:32], "b", "m", "t", None, 1, 0, 0, 1, None, 1.0, 1.0, 1)
            for i in range(n)
        ]
        store._insert_rows(db, rows)
        stored += n
        (count,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
        assert count == stored
    db.close()
    assert sizes <= {2**k for k in range(12)}, sizes
