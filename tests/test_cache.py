"""The persistent result cache: re-runs are free, crashes resume, keys hold no secrets."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import pickle
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends.base import Completion, Request, Usage
from semframe.backends.fake import FakeBackend, default_answer
from semframe.cache import serve_stored, store
from semframe.cache.keys import Keys, request_key
from semframe.cache.store import FILENAME, ResultCache
from semframe.cli import main
from semframe.core.parse import TEXT
from semframe.core.wire import Outcome
from semframe.errors import RunAborted
from semframe.runtime.stats import RunStats
from semframe.testing.emulator import Fault, Latency, ProviderEmulator
from tests.conftest import digest

KEY = "sk-test-cache-secret-0123456789"


@pytest.fixture(autouse=True)
def _fake_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMFRAME_BACKEND", "fake")


def _frame(n: int = 12) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "movie": [f"movie {i % 3}" for i in range(n)],
            "review": [f"review {i}" for i in range(n)],
        },
        index=[f"id{i}" for i in range(n)],
    )


def _cache_file() -> Path:
    return Path(semframe.config()["cache_dir"]) / FILENAME


def test_rerun_is_served_from_cache_byte_for_byte(fake: FakeBackend) -> None:
    df = _frame()
    first = df.llm.map("Summarize {review} of {movie}", out="s")
    assert len(fake.history) == 12
    stats = semframe.last_run()
    assert stats is not None
    assert stats.cache_hits == 0
    second = df.llm.map("Summarize {review} of {movie}", out="s")
    assert len(fake.history) == 12, "nothing sent on the re-run"
    stats = semframe.last_run()
    assert stats is not None
    assert (stats.cache_hits, stats.requests, stats.prompt_tokens) == (12, 0, 0)
    assert "all 12 answers came from the result cache" in repr(stats)
    assert "nothing was sent" in repr(stats) and "cache=False" in repr(stats)
    assert pickle.dumps(first) == pickle.dumps(second)
    # filter with a schema, and extract, too
    liked = df.llm.filter("Is {review} great?")
    sent = len(fake.history)
    assert df.llm.filter("Is {review} great?").equals(liked)
    assert len(fake.history) == sent


def test_partial_hits_send_only_the_rest(fake: FakeBackend) -> None:
    df = _frame()
    df.iloc[:5].llm.map("Summarize {review} of {movie}")
    out = df.llm.map("Summarize {review} of {movie}")
    assert len(fake.history) == 5 + 7
    assert out["llm_output"].tolist() == [default_answer(r) for r in _requests_of(df, fake)]
    stats = semframe.last_run()
    assert stats is not None
    assert (stats.cache_hits, stats.requests, stats.rows) == (5, 7, 12)


def _requests_of(df: pd.DataFrame, fake: FakeBackend) -> list[Request]:
    by_review = {r.prompt.rsplit("review: ", 1)[-1].strip(): r for r in fake.history}
    return [by_review[v] for v in df["review"]]


def test_crash_midway_resumes_paying_only_for_the_rest(fake: FakeBackend) -> None:
    df = _frame(200)
    calls = 0

    def dies_after_120(request: Request) -> str:
        nonlocal calls
        calls += 1
        if calls > 120:
            raise KeyboardInterrupt
        return default_answer(request)

    fake.responder = dies_after_120
    with pytest.raises(KeyboardInterrupt):
        df.llm.map("Summarize {review} of {movie}")
    assert len(fake.history) == 121
    fake.responder = default_answer
    out = df.llm.map("Summarize {review} of {movie}")
    assert len(fake.history) == 121 + 80, "the 120 answered rows were not paid again"
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None
    assert (stats.cache_hits, stats.requests) == (120, 80)


def test_cache_false_bypasses_reading_and_writing(fake: FakeBackend) -> None:
    df = _frame()
    df.llm.map("Summarize {review}", cache=False)
    assert not _cache_file().exists()
    df.llm.map("Summarize {review}")
    df.llm.map("Summarize {review}", cache=False)
    assert len(fake.history) == 36
    with semframe.using(cache=False):
        df.llm.map("Summarize {review}")
    assert len(fake.history) == 48


def test_only_temperature_zero_is_cached(fake: FakeBackend) -> None:
    df = _frame(4)
    df.llm.map("Summarize {review}", temperature=0.7)
    df.llm.map("Summarize {review}", temperature=0.7)
    assert len(fake.history) == 8


def test_unparseable_cached_answer_is_asked_again(fake: FakeBackend) -> None:
    df = _frame(3)
    fake.enqueue('{"answer": "maybe"}')  # row sent first: unparseable, retried once
    fake.enqueue('{"answer": "maybe"}')
    out = df.llm.filter("Is {review} great?", errors="keep")
    assert out["llm_error"].notna().sum() == 1
    # a stale unparseable answer planted under a key is not served either
    plan = df.llm.plan("Is {review} great?", op="filter")
    with ResultCache(_cache_file()) as cache:
        for r in plan.requests:
            cache.put(request_key(fake, r), fake, Completion(r.id, "garbage", Usage(1, 0, 0, 1)))
    sent = len(fake.history)
    out = df.llm.filter("Is {review} great?", errors="keep")
    assert len(fake.history) == sent + 3
    assert out["llm_error"].isna().all()
    stats = semframe.last_run()
    assert stats is not None
    assert stats.cache_hits == 0
    df.llm.filter("Is {review} great?", errors="keep")
    assert len(fake.history) == sent + 3, "the fresh answers replaced the garbage"


def test_key_covers_what_determines_the_answer() -> None:
    fake = FakeBackend()
    r = Request(0, 0, "Summarize\n\nreview: x\n", None, 16, 0.0, {"type": "object"}, 0)
    base = request_key(fake, r)
    variants = [
        request_key(FakeBackend(model="other"), r),
        request_key(fake, r._replace(temperature=0.5)),
        request_key(fake, r._replace(max_tokens=17)),
        request_key(fake, r._replace(schema={"type": "string"})),
        request_key(fake, r._replace(schema=None)),
        request_key(fake, r._replace(system="be brief")),
        request_key(fake, r._replace(prompt=r.prompt + " ")),
        request_key(fake, r._replace(logprobs=5)),
    ]
    assert len({base, *variants}) == len(variants) + 1
    # not: position, row, group, prefix; schema key order
    same = r._replace(id=9, row=3, group=2, prefix=((5, 2),))
    assert request_key(fake, same) == base
    a = r._replace(schema={"type": "object", "required": ["a"]})
    b = r._replace(schema={"required": ["a"], "type": "object"})
    assert request_key(fake, a) == request_key(fake, b)


def test_size_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    now = [1000.0]
    fake = FakeBackend()
    path = tmp_path / "c.sqlite"
    text = "x" * 10_000
    with ResultCache(path, max_mib=0.1, clock=lambda: now[0]) as cache:  # ~104 kB
        keys = {digest(f"k{i}"): f"k{i}" for i in range(12)}
        for key in list(keys)[:8]:
            now[0] += 1
            cache.put(key, fake, Completion(0, text, Usage(1, 0, 0, 1)))
        cache.flush()
        now[0] += 1
        cache.touch([digest("k0")])  # k0 is now the most recently used
        for key in list(keys)[8:]:
            now[0] += 1
            cache.put(key, fake, Completion(0, text, Usage(1, 0, 0, 1)))
        cache.flush()
        left = {keys[key] for key in cache.get_many(list(keys))}
        info = cache.info()
    assert info.bytes <= 0.1 * 2**20
    assert "k0" in left and {"k8", "k9", "k10", "k11"} <= left
    assert "k1" not in left and "k2" not in left, "the least recently used went first"


def _writer(path: str, start: int, count: int) -> None:
    fake = FakeBackend()
    with ResultCache(path) as cache:
        for i in range(start, start + count):
            cache.put(digest(f"key{i}"), fake, Completion(0, f"answer {i}", Usage(3, 0, 0, 2)))
            if i % 7 == 0:
                cache.flush()


def test_two_processes_write_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / FILENAME)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, lo, 600)) for lo in (0, 300)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    with ResultCache(path) as cache:
        found = cache.get_many([digest(f"key{i}") for i in range(900)])
        info = cache.info()
    assert len(found) == info.entries == 900
    assert found[digest("key450")].text == "answer 450"


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> ProviderEmulator:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server  # type: ignore[misc]


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_api_rerun_costs_nothing_and_reports_the_saving(
    emu: ProviderEmulator, backend: str
) -> None:
    df = _frame(6)
    url = emu.openai_url if backend == "openai" else emu.anthropic_url
    model = "gpt-4o-mini" if backend == "openai" else None
    first = df.llm.map("Summarize {review} of {movie}", backend=backend, base_url=url, model=model)
    paid = semframe.last_run()
    requests = emu.ledger.totals().requests
    second = df.llm.map("Summarize {review} of {movie}", backend=backend, base_url=url, model=model)
    assert emu.ledger.totals().requests == requests, "no request reached the provider"
    stats = semframe.last_run()
    assert paid is not None and stats is not None
    assert pickle.dumps(first) == pickle.dumps(second)
    assert stats.cache_hits == 6 and stats.dollars == 0
    assert paid.dollars is not None and paid.dollars > 0
    assert stats.cache_saved_dollars == pytest.approx(paid.dollars, rel=1e-9)
    assert stats.cache_saved_usage == Usage(
        paid.prompt_tokens, paid.cached_tokens, paid.cache_write_tokens, paid.output_tokens
    )
    # another endpoint is another cache key
    with ProviderEmulator(latency=Latency(0)) as other:
        other_url = other.openai_url if backend == "openai" else other.anthropic_url
        df.llm.map(
            "Summarize {review} of {movie}", backend=backend, base_url=other_url, model=model
        )
        assert other.ledger.totals().requests == 6
    data = b"".join(p.read_bytes() for p in _cache_file().parent.glob(FILENAME + "*"))
    assert KEY.encode() not in data
    assert KEY[-12:].encode() not in data


def test_rejected_key_midway_resumes_paying_only_for_the_rest(emu: ProviderEmulator) -> None:
    df = _frame(10)
    seen = 0

    def revoke_after_five(prompt: str) -> bool:  # the key is revoked mid-run
        nonlocal seen
        seen += 1
        if seen == 5:
            emu.api_keys = frozenset({"sk-someone-else-000000"})
        return False

    emu.faults.inject(Fault.server_error(500), when=revoke_after_five)
    with pytest.raises(RunAborted, match="401") as info:
        df.llm.map(
            "Summarize {review}", backend="openai", base_url=emu.openai_url, max_concurrency=1
        )
    assert "5 of 10 rows had been answered" in str(info.value)
    emu.api_keys = None
    before = emu.ledger.totals().requests
    out = df.llm.map("Summarize {review}", backend="openai", base_url=emu.openai_url)
    assert emu.ledger.totals().requests - before == 5
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None
    assert (stats.cache_hits, stats.requests) == (5, 5)


def test_cli_info_and_clear(fake: FakeBackend, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "info"]) == 0
    assert "no result cache yet" in capsys.readouterr().out
    df = _frame(5)
    df.llm.map("Summarize {review}")
    df.llm.map("Summarize {review}")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(_cache_file()) in out
    assert "entries: 5" in out
    assert "fake/fake-model: 5 entries, 5 hits" in out
    assert main(["cache", "clear", "--older-than", "1"]) == 0
    assert "removed 0 answers not used for 1 days" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 5 answers" in capsys.readouterr().out
    df.llm.map("Summarize {review}")
    assert len(fake.history) == 10
    with pytest.raises(SystemExit):
        main(["cache", "purge"])
    capsys.readouterr()


def test_cache_doc_examples_run() -> None:
    import doctest

    doc = Path(__file__).resolve().parents[1] / "docs" / "cache.md"
    result = doctest.testfile(str(doc), module_relative=False)
    assert result.attempted >= 5
    assert result.failed == 0


# -- batch mode ----------------------------------------------------------------------


def _batch_map(df: pd.DataFrame, url: str, **options: object) -> pd.DataFrame:
    return df.llm.map(
        "Summarize {review} of {movie}",
        backend="openai",
        base_url=url,
        batch=True,
        batch_poll_seconds=0.01,
        **options,
    )


def test_batch_runs_read_and_write_the_cache(emu: ProviderEmulator) -> None:
    df = _frame(10)
    _batch_map(df.iloc[:4], emu.openai_url)
    assert sum(e.batch for e in emu.ledger.entries()) == 4
    out = _batch_map(df, emu.openai_url)
    assert sum(e.batch for e in emu.ledger.entries()) == 4 + 6, "only the 6 new rows were sent"
    stats = semframe.last_run()
    assert stats is not None and stats.batch
    assert (stats.cache_hits, stats.requests) == (4, 6)
    assert stats.cache_saved_dollars is not None and stats.cache_saved_dollars > 0
    # a live run of the same call is served by the batch's answers, and the other way round
    before = emu.ledger.totals().requests
    live = df.llm.map("Summarize {review} of {movie}", backend="openai", base_url=emu.openai_url)
    assert emu.ledger.totals().requests == before
    pd.testing.assert_frame_equal(live, out)
    again = _batch_map(df, emu.openai_url)
    assert emu.ledger.totals().requests == before, "no batch submitted when all rows are cached"
    pd.testing.assert_frame_equal(again, out)
    assert not list((Path(semframe.config()["cache_dir"]) / "batches").glob("*.json"))


def test_batch_cache_false_sends_everything(emu: ProviderEmulator) -> None:
    df = _frame(3)
    _batch_map(df, emu.openai_url)
    _batch_map(df, emu.openai_url, cache=False)
    assert sum(e.batch for e in emu.ledger.entries()) == 6


def test_batch_resume_keeps_cached_rows_and_waits_for_recorded_batches(tmp_path: Path) -> None:
    from semframe.backends.base import BatchResult, BatchStatus, Capabilities
    from semframe.cost.models import openai_cost
    from semframe.errors import TransientError
    from semframe.operators.common import compile_call
    from semframe.runtime.batch import run_batch

    class Batches:
        name, model, endpoint = "openai", "gpt-4o-mini", None
        capabilities = Capabilities(
            prefix_cache="shared", max_concurrency=4, batch_api=True, batch_limit=100
        )
        cost = openai_cost("gpt-4o-mini", None, concurrency=4)

        def __init__(self) -> None:
            self.submitted: list[list[int]] = []
            self.fail_once = {1, 4}
            self.ready = True
            self.results: dict[str, dict[int, BatchResult]] = {}

        def batch_submit(self, requests: list[Request]) -> str:
            self.submitted.append([r.id for r in requests])
            return f"b{len(self.submitted) - 1}"

        def batch_status(self, batch_id: str) -> BatchStatus:
            done = batch_id == "b0" or self.ready
            return BatchStatus(batch_id, "ended" if done else "in_progress", done)

        def batch_results(self, batch_id: str) -> dict[int, BatchResult]:
            if batch_id in self.results:  # fetched again: the same results
                return self.results[batch_id]
            out: dict[int, BatchResult] = {}
            self.results[batch_id] = out
            for rid in self.submitted[int(batch_id[1:])]:
                if rid in self.fail_once:
                    self.fail_once.discard(rid)
                    out[rid] = TransientError("HTTP 500")
                else:
                    out[rid] = Completion(rid, f"answer {rid}", Usage(50, 0, 0, 3))
            return out

        def count_tokens(self, texts: list[str]) -> list[int]:
            return [1 for _ in texts]

    plan = compile_call(_frame(6), "Summarize {review}", op="map", backend="fake").plan
    backend = Batches()
    backend.ready = False  # the retry round never ends: the process "dies" waiting for it

    class Died(Exception):
        pass

    def die(_: float) -> None:
        raise Died

    with ResultCache(tmp_path / FILENAME) as cache, pytest.raises(Died):
        run_batch(plan, backend, directory=tmp_path, progress="off", sleep=die, cache=cache)
    assert backend.submitted == [list(range(6)), [1, 4]]
    with ResultCache(tmp_path / FILENAME) as cache:
        assert len(cache.get_many([request_key(backend, r) for r in plan.requests])) == 4
    backend.ready = True
    with ResultCache(tmp_path / FILENAME) as cache:
        outcomes, stats = run_batch(
            plan, backend, directory=tmp_path, progress="off", sleep=die, cache=cache
        )
    assert backend.submitted == [list(range(6)), [1, 4]], "nothing submitted again"
    assert [o.raw for o in outcomes] == [f"answer {i}" for i in range(6)]
    # rows 1 and 4: their failed attempt of the first round (replayed) and their answer
    assert (stats.cache_hits, stats.requests, stats.retries, stats.prompt_tokens) == (4, 4, 2, 100)


def test_summary_of_a_run_the_cache_answered_whole() -> None:
    def stats(rows: int, requests: int, hits: int) -> str:
        return repr(
            RunStats("map", "openai", "gpt-4.1-mini", "ggr", rows, requests, 0, 0, 0, 0, 0, 0,
                     0.0, 1, 0.0, cache_hits=hits, cache_saved_dollars=0.0012)
        )  # fmt: skip

    one = stats(1, 0, 1)
    assert "the answer came from the result cache" in one and "saving $0.0012" in one
    assert "`semframe cache clear`" in one
    partly = stats(12, 7, 5)  # some sent: the figures, and how many the cache gave
    assert "12 rows, 7 requests" in partly and "; 5 from the result cache" in partly
    assert "nothing was sent" not in partly


def test_a_later_answer_for_a_key_replaces_an_earlier_one_in_the_same_write(
    tmp_path: Path,
) -> None:
    # Both answers are queued before the writer takes them (it takes under the
    # condition held here), so one transaction writes both: the later is stored,
    # whatever the order of their texts.
    fake = FakeBackend()
    with ResultCache(tmp_path / "c.sqlite") as cache:
        for texts in (["b", "a"], ["a", "b"]):
            key = digest(f"key-{texts[-1]}")
            with cache._cond:
                for text in texts:
                    cache.put(key, fake, Completion(0, text, Usage(1, 0, 0, 1)))
            cache.flush()
            assert cache.get_many([key])[key].text == texts[-1]


_V2_RESULTS = """CREATE TABLE results (
    key TEXT PRIMARY KEY, backend TEXT NOT NULL, model TEXT NOT NULL, text TEXT NOT NULL,
    tokens TEXT, prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, finish_reason TEXT,
    created REAL NOT NULL, last_used REAL NOT NULL, size INTEGER NOT NULL
) WITHOUT ROWID"""


_V3_RESULTS = """CREATE TABLE results (
    key BLOB PRIMARY KEY NOT NULL, backend TEXT NOT NULL, model TEXT NOT NULL,
    text TEXT NOT NULL, tokens TEXT, prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, cache_write_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL, finish_reason TEXT,
    created REAL NOT NULL, last_used REAL NOT NULL, size INTEGER NOT NULL
)"""


@pytest.mark.parametrize("version", [2, 3])
def test_an_older_file_keeps_its_answers(tmp_path: Path, version: int) -> None:
    """A file of an older format (2: hex keys in a WITHOUT ROWID table; 3: 32-byte keys
    with a unique index on the answers' table) is moved, not emptied."""
    path = tmp_path / FILENAME
    with sqlite3.connect(path) as db:
        db.execute(_V2_RESULTS if version == 2 else _V3_RESULTS)
        db.execute(
            "CREATE TABLE calls (key TEXT PRIMARY KEY, keys BLOB NOT NULL, info TEXT "
            "NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, "
            "size INTEGER NOT NULL)"
        )
        db.execute(
            "CREATE TABLE hits (backend TEXT NOT NULL, model TEXT NOT NULL, "
            "hits INTEGER NOT NULL, PRIMARY KEY (backend, model))"
        )
        db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('bytes', 0)")
        rows = [
            (
                digest(f"k{i}") if version == 2 else bytes.fromhex(digest(f"k{i}")),
                "fake",
                "fake",
                f"answer {i}",
                None,
                5,
                2,
                0,
                3,
                "stop",
                1.0,
                2.0,
                136,
            )
            for i in range(50)
        ]
        if version == 2:
            rows.append(
                ("not a digest", "fake", "fake", "lost", None, 1, 0, 0, 1, "stop", 1.0, 1.0, 132)
            )
        db.executemany(f"INSERT INTO results VALUES ({', '.join('?' * 13)})", rows)
        db.execute(
            "INSERT INTO calls VALUES (?, ?, ?, 1.0, 1.0, 100)",
            ("call", bytes.fromhex(digest("k0")), "{}"),
        )
        db.execute(f"PRAGMA user_version = {version}")
    db.close()
    with ResultCache(path) as cache:
        found = cache.get_many([digest(f"k{i}") for i in range(50)])
        call = cache.get_call("call")
        info = cache.info()
    assert {key: entry.text for key, entry in found.items()} == {
        digest(f"k{i}"): f"answer {i}" for i in range(50)
    }
    assert found[digest("k7")].usage == Usage(5, 2, 0, 3)
    assert call is not None and call[0] == [digest("k0")]
    assert info.entries == 50, "a row whose key is not a digest is left behind"
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (4,)
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        indexed = db.execute("SELECT COUNT(*) FROM keyidx").fetchone()[0]
        watermark = db.execute("SELECT value FROM meta WHERE name = 'indexed'").fetchone()[0]
        top = db.execute("SELECT max(rowid) FROM results").fetchone()[0]
    db.close()
    assert "results_old" not in tables
    assert indexed == 50 and watermark == top, "the moved answers are indexed"


def test_a_key_that_is_not_a_digest_is_refused(tmp_path: Path) -> None:
    with ResultCache(tmp_path / FILENAME) as cache:
        with pytest.raises(ValueError, match="SHA-256 digest in 64 hex digits, not 'k1'"):
            cache.put("k1", FakeBackend(), Completion(0, "x", Usage(1, 0, 0, 1)))
        cache.put(digest("k1"), FakeBackend(), Completion(0, "x", Usage(1, 0, 0, 1)))
        cache.flush()
        assert set(cache.get_many(["abc", "k1", digest("k1")])) == {digest("k1")}


@pytest.mark.parametrize("scan_factor", [0, 4, 10**9])  # look each key up / the default / scan
@settings(max_examples=25, deadline=None)
@given(
    stored=st.sets(st.integers(0, 60), max_size=40),
    asked=st.lists(st.integers(0, 80), max_size=50),
)
def test_a_lookup_finds_exactly_the_stored_keys_asked_for(
    tmp_path_factory: pytest.TempPathFactory, scan_factor: int, stored: set[int], asked: list[int]
) -> None:
    """Whether the lookup reads every stored answer or looks each key up (many stored)."""
    fake = FakeBackend()
    with (
        mock.patch.object(store, "SCAN_FACTOR", scan_factor),
        ResultCache(tmp_path_factory.mktemp("c") / FILENAME) as cache,
    ):
        for i in stored:
            cache.put(digest(str(i)), fake, Completion(0, f"a{i}", Usage(1, 0, 0, 1)))
        cache.flush()
        found = cache.rows([digest(str(i)) for i in asked])
    assert {key: row[0] for key, row in found.items()} == {
        digest(str(i)): f"a{i}" for i in asked if i in stored
    }


@settings(max_examples=25, deadline=None)
@given(
    stored=st.sets(st.integers(0, 20), max_size=15),
    asked=st.lists(st.one_of(st.none(), st.integers(0, 25)), max_size=30),
)
def test_stored_answers_are_served_to_every_row_that_asks_for_them(
    tmp_path_factory: pytest.TempPathFactory, stored: set[int], asked: list[int | None]
) -> None:
    """Repeated keys each get the answer, rows without a key none; an empty cache serves none."""
    fake = FakeBackend()
    with ResultCache(tmp_path_factory.mktemp("c") / FILENAME) as cache:
        for i in stored:
            cache.put(digest(str(i)), fake, Completion(0, f" a{i} ", Usage(i, 0, 0, 1)))
        cache.flush()
        outcomes: list[Outcome | None] = [None] * len(asked)
        keys = [None if i is None else digest(str(i)) for i in asked]
        served = serve_stored(cache, keys, TEXT.parse, outcomes)
    want = [f"a{i}" if i is not None and i in stored else None for i in asked]
    assert [None if o is None else o.value for o in outcomes] == want
    assert served.rows == sum(w is not None for w in want)
    assert served.usage.prompt_tokens == sum(i for i in asked if i is not None and i in stored)


@pytest.mark.parametrize("scan_factor", [0, 10**9])  # look each key up / scan
@settings(max_examples=25, deadline=None)
@given(
    stored=st.sets(st.integers(0, 30), max_size=25),
    rows=st.lists(st.integers(0, 40), max_size=40),  # a prompt may repeat across rows
)
def test_a_call_gets_each_rows_stored_answer_once_in_chunks(
    tmp_path_factory: pytest.TempPathFactory, scan_factor: int, stored: set[int], rows: list[int]
) -> None:
    fake = FakeBackend()
    with (
        mock.patch.object(store, "SCAN_FACTOR", scan_factor),
        ResultCache(tmp_path_factory.mktemp("c") / FILENAME) as cache,
    ):
        for i in sorted(stored, reverse=True):  # stored in another order than asked
            cache.put(digest(str(i)), fake, Completion(0, f"a{i}", Usage(i, 0, 0, 1)))
        cache.put_call("call", [digest(str(i)) for i in rows], {"batch": False})
        cache.flush()
        assert cache.call_entry("another call") is None
        entry = cache.call_entry("call")
        assert entry is not None
        digests, info = entry
        chunks: list[list[tuple[int, tuple[Any, ...]]]] = []
        assert cache.read_answers(digests, lambda pairs: chunks.append(list(pairs)))
    assert digests == b"".join(bytes.fromhex(digest(str(i))) for i in rows)
    given = [pair for chunk in chunks for pair in chunk]
    positions = [i for i, _ in given]
    assert sorted(positions) == [i for i, r in enumerate(rows) if r in stored]  # each row once
    answers = dict(given)
    assert {i: (a[0], a[2]) for i, a in answers.items()} == {
        i: (f"a{r}", r) for i, r in enumerate(rows) if r in stored
    }
    assert all(a[-1] == digests[32 * i : 32 * (i + 1)] for i, a in answers.items())
    assert all(len(a) == 8 for a in answers.values())  # no finish reason: only finished ones
    assert info == {"batch": False}


def test_keys_sharing_their_first_eight_bytes_are_still_told_apart() -> None:
    """The numpy match finds keys by their first word; where two asked share one, a dict does."""
    a, b, c = (bytes(8) + bytes([i]) * 24 for i in (1, 2, 3))
    rows = [("answer b", b), ("answer c", c), ("answer a", a)]
    names = {a: "a", b: "b", c: "c"}
    for asked in ([a, b], [b, a, c], [c], [a, b, a], [b, b, c, b]):  # repeats given at each
        found = list(store._Matcher.of(asked).matches(rows))
        assert sorted(i for i, _ in found) == list(range(len(asked)))
        assert all(row[0] == f"answer {names[asked[i]]}" for i, row in found)


@settings(max_examples=50, deadline=None)
@given(
    asked=st.lists(st.integers(0, 12), max_size=40),
    stored=st.lists(st.integers(0, 15), unique=True, max_size=16),
)
def test_a_stored_key_is_given_to_every_position_that_asks_for_it(
    asked: list[int], stored: list[int]
) -> None:
    keys = [hashlib.sha256(str(i).encode()).digest() for i in range(16)]
    rows = [(f"answer {i}", keys[i]) for i in stored]
    matcher = store._Matcher.of(b"".join(keys[i] for i in asked))
    assert matcher.distinct == len(set(asked))
    found = sorted((i, row[0]) for i, row in matcher.matches(rows))
    assert found == [(i, f"answer {k}") for i, k in enumerate(asked) if k in stored]


def test_a_stored_key_that_is_not_32_bytes_is_never_matched() -> None:
    asked = [bytes([7]) * 32, bytes([9]) * 32]
    rows = [("short", bytes([7]) * 16), ("nine", bytes([9]) * 32), ("long", bytes([7]) * 40)]
    assert [(i, row[0]) for i, row in store._Matcher.of(asked).matches(rows)] == [(1, "nine")]


def _hold_writer(cache: ResultCache) -> None:
    """Mark a commit as under way (the writer thread is not started: no answer was put)."""
    with cache._cond:
        cache._writing = True
        cache._writer = threading.current_thread()  # put() does not start a writer


def _release_writer(cache: ResultCache) -> None:
    with cache._cond:
        cache._writing = False
        cache._writer = None
        cache._cond.notify_all()


def test_put_waits_for_a_commit_under_way_past_max_pending(tmp_path: Path) -> None:
    fake = FakeBackend()
    with mock.patch.object(store, "MAX_PENDING", 5), ResultCache(tmp_path / FILENAME) as cache:
        _hold_writer(cache)
        done = threading.Event()

        def produce() -> None:
            for i in range(10):
                cache.put(digest(str(i)), fake, Completion(0, "x", Usage(1, 0, 0, 1)))
            done.set()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        assert not done.wait(0.3), "the sixth answer waits for the commit"
        assert cache.pending == 6
        _release_writer(cache)
        assert done.wait(5), "the commit's end lets it go on"
        producer.join(5)
        assert cache.flush()
        assert len(cache.get_many([digest(str(i)) for i in range(10)])) == 10


def test_put_does_not_wait_after_a_failed_write_or_on_an_event_loop(tmp_path: Path) -> None:
    fake = FakeBackend()
    with mock.patch.object(store, "MAX_PENDING", 5), ResultCache(tmp_path / FILENAME) as cache:
        _hold_writer(cache)
        with cache._cond:
            cache._retry_at = time.monotonic() + 60  # the last write failed: tried again later
        for i in range(10):
            cache.put(digest(str(i)), fake, Completion(0, "x", Usage(1, 0, 0, 1)))
        assert cache.pending == 10
        with cache._cond:
            cache._retry_at = 0.0

        async def on_a_loop() -> None:
            for i in range(10, 20):
                cache.put(digest(str(i)), fake, Completion(0, "x", Usage(1, 0, 0, 1)))

        asyncio.run(on_a_loop())
        assert cache.pending == 20
        _release_writer(cache)
        assert cache.flush()
        assert cache.pending == 0


def test_a_call_entry_that_is_not_whole_keys_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    with ResultCache(path) as cache:
        cache.put(digest("k0"), FakeBackend(), Completion(0, "a", Usage(1, 0, 0, 1)))
        cache.put_call("call", [digest("k0")], {})
        cache.flush()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE calls SET keys = ? WHERE key = 'call'", (bytes(31),))
    db.close()
    with ResultCache(path) as cache:
        assert cache.call_entry("call") is None


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.one_of(st.none(), st.integers(0, 9)), max_size=30),
    data=st.data(),
)
def test_keys_hold_every_key_in_its_place(keys: list[int | None], data: st.DataObject) -> None:
    """Keys as one buffer read as the hex list they came from; take and present keep places."""
    hexes = [None if k is None else digest(str(k)) for k in keys]
    held = Keys.of(hexes)
    assert list(held) == hexes and held == hexes and len(held) == len(hexes)
    assert all(held.digest(i) == (h and bytes.fromhex(h)) for i, h in enumerate(hexes))
    assert held.complete == (None not in hexes)
    joined, at = held.present()
    assert at.tolist() == [i for i, h in enumerate(hexes) if h is not None]
    assert joined == b"".join(bytes.fromhex(h) for h in hexes if h is not None)
    order = data.draw(st.permutations(range(len(hexes))))
    assert list(held.take(np.array(order, dtype=np.intp))) == [hexes[i] for i in order]
