"""Fault injection: whatever fails, no answered row is lost and nothing paid for is paid twice.

Each scenario runs a real call against the provider emulator or the fake
backend with one kind of fault, then checks three things: every row ends with
a value or an explicit per-row error, no answer that had been received is lost
(its row has its own answer, in the caller's order), and the run statistics
agree with what the backend saw. The two kill scenarios run the call in a
child process, kill it with SIGKILL once some answers are in the result cache,
and resume in this process: rows re-billed on resume must be requests that
were in flight at the kill.

``FAULT_TABLE=faults.md pytest tests/test_faults.py`` writes the table of the
issue (faults tried, rows lost, rows re-billed on resume) to ``faults.md``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import semframe
from semframe.backends import register_backend
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend, default_answer
from semframe.cache.store import COMMIT_INTERVAL, FILENAME, ResultCache
from semframe.testing.emulator import Fault, Latency, ProviderEmulator, default_responder
from tests.conftest import digest

KEY = "sk-test-faults-0123456789abcdef"
TEMPLATE = "Summarize {review} of {movie}"
QUESTION = "Is {review} of {movie} positive or negative?"
LABELS = ["positive", "negative"]
_ROW = re.compile(r"review: review (\d+)\b")


@dataclass(frozen=True)
class FaultReport:
    """One scenario's outcome: a row of the table in the issue."""

    fault: str
    rows: int
    valued: int
    errors: int
    lost: int
    rebilled: int
    in_flight: int
    note: str = ""


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "movie": [f"movie {i % 7}" for i in range(n)],
            "review": [f"review {i}" for i in range(n)],
        },
        index=[f"id{i}" for i in range(n)],
    )


def _row(prompt: str) -> int:
    found = _ROW.search(prompt)
    assert found is not None, prompt
    return int(found.group(1))


def _errors_by_row(out: pd.DataFrame) -> dict[int, str]:
    """``classify(errors="keep")``: the error of each failed row, by row number."""
    return {
        int(review.split()[-1]): error
        for review, error in zip(out["review"], out["label_error"], strict=True)
        if isinstance(error, str)
    }


def _lost(out: pd.DataFrame, column: str, error: str | None = None) -> int:
    """Rows with neither a value nor an explicit error, or with another row's answer."""
    lost = 0
    for i, (label, value) in enumerate(out[column].items()):
        has_error = error is not None and isinstance(out[error].iloc[i], str)
        if pd.isna(value):
            lost += not has_error
        elif f"review {label[2:]}" not in str(value) and column == "llm_output":
            lost += 1  # a value, but not this row's answer
    return lost


class Recorder:
    """An emulator responder that records the row of every answer it produces (= billed)."""

    def __init__(self, answer: Callable[..., str] = default_responder) -> None:
        self.answer = answer
        self.rows: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, provider: str, model: str, prompt: str, schema: Any) -> str:
        text = self.answer(provider, model, prompt, schema)
        with self.lock:
            self.rows.append(_row(prompt))
        return text

    def count(self) -> int:
        with self.lock:
            return len(self.rows)


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(0)) as server:
        server.responder = Recorder()
        yield server


def _recorder(emu: ProviderEmulator) -> Recorder:
    assert isinstance(emu.responder, Recorder)
    return emu.responder


def _stats() -> semframe.RunStats:
    stats = semframe.last_run()
    assert stats is not None
    return stats


# -- kill -9 mid-run, then resume ----------------------------------------------------

_EMULATOR_CHILD = """
import sys, pandas as pd, semframe
df = pd.read_pickle(sys.argv[1])
df.llm.map(sys.argv[4], backend="openai", base_url=sys.argv[2], model="gpt-4o-mini",
           max_concurrency=int(sys.argv[3]))
print("finished")
"""

_FAKE_CHILD = """
import os, random, sys, time, pandas as pd, semframe
from semframe.backends import register_backend
from semframe.backends.fake import FakeBackend, default_answer
df = pd.read_pickle(sys.argv[1])
ledger = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def respond(request):
    time.sleep(random.uniform(0.002, 0.006))  # answers finish out of order
    text = default_answer(request)
    os.write(ledger, f"{request.row} {time.monotonic()}\\n".encode())  # billed: it exists
    return text
backend = FakeBackend(respond, max_concurrency=int(sys.argv[3]))
register_backend("fake", lambda model, settings: backend)
df.llm.map(sys.argv[4], backend="fake")
print("finished")
"""


def _cached_rows(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
    except sqlite3.Error:  # not created yet
        return 0


def _kill_when_cached(
    child: subprocess.Popen[str],
    path: Path,
    n: int,
    timeout: float,
    ready: Callable[[], bool] = lambda: True,
) -> tuple[int, float]:
    """SIGKILL ``child`` once ``n`` answers are committed (and ``ready()``); the count and time."""
    deadline = time.monotonic() + timeout
    while _cached_rows(path) < n or not ready():
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"the child ended before the kill:\n{out}\n{err}")
        if time.monotonic() > deadline:
            child.kill()
            child.communicate()
            pytest.fail(f"no {n} answers in the cache after {timeout} s")
        time.sleep(0.005)
    killed = time.monotonic()  # the same clock as the child's (CLOCK_MONOTONIC)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=10)  # reaps it and closes the pipes
    assert child.returncode == -signal.SIGKILL
    return _cached_rows(path), killed


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SEMFRAME_PROGRESS="off")
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_and_resume_emulator(emu: ProviderEmulator, tmp: Path) -> FaultReport:
    """OpenAI through the SDK; after 12 answers every request hangs, so 4 are in flight."""
    n, answered_first, concurrency = 40, 12, 4
    df = _frame(n)
    df.to_pickle(tmp / "frame.pkl")
    arrivals = 0
    lock = threading.Lock()

    def after_the_first_answers(prompt: str) -> bool:
        nonlocal arrivals
        with lock:
            arrivals += 1
            return arrivals > answered_first

    hang = emu.faults.inject(Fault.hang(2.0), when=after_the_first_answers)
    cache = Path(semframe.config()["cache_dir"]) / FILENAME
    child = _spawn(
        _EMULATOR_CHILD, str(tmp / "frame.pkl"), emu.openai_url, str(concurrency), TEMPLATE
    )
    # and once a request is on its way: on a loaded machine the 12th answer can be
    # committed before the next request has reached the provider
    stored, _ = _kill_when_cached(
        child, cache, answered_first, timeout=60, ready=lambda: hang.fired >= 1
    )
    in_flight = hang.fired
    recorder = _recorder(emu)
    deadline = time.monotonic() + 10
    while recorder.count() < answered_first + in_flight and time.monotonic() < deadline:
        time.sleep(0.02)  # the hung requests are answered (and billed) to a dead client
    first = list(recorder.rows)
    emu.faults.clear()
    out = df.llm.map(TEMPLATE, backend="openai", base_url=emu.openai_url, model="gpt-4o-mini")
    stats = _stats()
    second = recorder.rows[len(first) :]
    rebilled = set(first) & set(second)
    assert stored == answered_first
    assert 1 <= in_flight <= concurrency
    assert (stats.cache_hits, stats.requests, stats.errors) == (stored, n - stored, 0)
    assert len(second) == n - stored, "each row not in the cache was sent once"
    assert len(rebilled) == in_flight, "only requests in flight at the kill were paid twice"
    return FaultReport(
        "kill -9 mid-run, resume (OpenAI via emulator)",
        n,
        int(out["llm_output"].notna().sum()),
        0,
        _lost(out, "llm_output"),
        len(rebilled),
        in_flight,
        f"{stored} answers in the cache at the kill",
    )


def kill_and_resume_fake(tmp: Path) -> FaultReport:
    """Fake backend, 8 threads, random delays: killed at a random moment of a busy run."""
    n, kill_after, concurrency = 800, 400, 8
    df = _frame(n)
    df.to_pickle(tmp / "frame.pkl")
    ledger = tmp / "billed.txt"
    cache = Path(semframe.config()["cache_dir"]) / FILENAME
    child = _spawn(_FAKE_CHILD, str(tmp / "frame.pkl"), str(ledger), str(concurrency), TEMPLATE)
    stored, killed = _kill_when_cached(child, cache, kill_after, timeout=60)
    billed = [line.split() for line in ledger.read_text().splitlines()]
    first = [int(row) for row, _ in billed]
    # answers of the last moment before the kill (the cache commits every 10 ms; the slack
    # is for a loaded machine, where the writer thread may wait for the CPU)
    window = COMMIT_INTERVAL + 0.05
    recent = sum(1 for _, at in billed if float(at) > killed - window)
    backend = FakeBackend(max_concurrency=concurrency)
    register_backend("fake", lambda model, settings: backend)
    try:
        out = df.llm.map(TEMPLATE, backend="fake")
    finally:
        register_backend("fake", "semframe.backends.fake:create")
    stats = _stats()
    second = [r.row for r in backend.history]
    rebilled = set(first) & set(second)
    unstored = len(set(first)) - stored  # answered before the kill, not yet committed
    assert len(first) == len(set(first)), "no row was answered twice before the kill"
    assert (stats.cache_hits, stats.requests, stats.errors) == (stored, n - stored, 0)
    assert len(rebilled) == unstored
    # lost at the kill: up to one request in flight per thread, and the last moment's answers
    assert unstored <= concurrency + recent
    return FaultReport(
        "kill -9 mid-run, resume (fake, 8 threads, random delays)",
        n,
        int(out["llm_output"].notna().sum()),
        0,
        _lost(out, "llm_output"),
        len(rebilled),
        unstored,
        f"{stored} answers in the cache at the kill, {len(first)} answered; "
        f"{recent} in its last {window * 1000:.0f} ms",
    )


def ctrl_c_and_resume(tmp: Path) -> FaultReport:
    """KeyboardInterrupt raised inside the backend after 120 answers; the run resumes."""
    n = 200
    df = _frame(n)
    calls = 0

    def interrupted(request: Request) -> str:
        nonlocal calls
        calls += 1
        if calls > 120:
            raise KeyboardInterrupt
        return default_answer(request)

    backend = FakeBackend(interrupted)
    register_backend("fake", lambda model, settings: backend)
    try:
        with pytest.raises(KeyboardInterrupt):
            df.llm.map(TEMPLATE, backend="fake")
        first = {r.row for r in backend.history[:120]}
        backend.history.clear()
        backend.responder = default_answer
        out = df.llm.map(TEMPLATE, backend="fake")
    finally:
        register_backend("fake", "semframe.backends.fake:create")
    stats = _stats()
    rebilled = first & {r.row for r in backend.history}
    assert (stats.cache_hits, stats.requests) == (120, 80)
    return FaultReport(
        "Ctrl-C mid-run, resume (fake)",
        n,
        int(out["llm_output"].notna().sum()),
        0,
        _lost(out, "llm_output"),
        len(rebilled),
        1,
        "the interrupted request was never answered",
    )


# -- provider faults -----------------------------------------------------------------


def storm_429(emu: ProviderEmulator, backend: str) -> FaultReport:
    """Half of all requests answered 429 (seeded), Retry-After 10 ms."""
    emu.faults.inject(Fault.rate_limit(retry_after=0.01), probability=0.5, seed=7)
    n = 30
    url = emu.openai_url if backend == "openai" else emu.anthropic_url
    out = _frame(n).llm.map(TEMPLATE, backend=backend, base_url=url, max_retries=12)
    stats = _stats()
    limited = sum(e.status == 429 for e in emu.ledger.entries())
    assert limited >= 10
    assert (stats.errors, stats.retries, stats.requests) == (0, limited, n + limited)
    assert _recorder(emu).count() == n, "each row billed once"
    return FaultReport(
        f"429 storm, 50% of requests ({backend})",
        n,
        n,
        0,
        _lost(out, "llm_output"),
        0,
        0,
        f"{limited} 429s, all retried",
    )


def timeouts(emu: ProviderEmulator) -> FaultReport:
    """Three requests hang past the client timeout; retried, each row paid for once per answer."""
    emu.faults.inject(Fault.hang(2.5), count=3)
    n = 12
    # warm_start=False: the faults hit the next requests to arrive, and a warm start
    # sends one request alone, so one row would meet them all in a row. The timeout
    # leaves room for a loaded machine: an answer slower than it would be retried too.
    out = _frame(n).llm.map(
        TEMPLATE,
        backend="openai",
        base_url=emu.openai_url,
        timeout=1.0,
        max_concurrency=4,
        warm_start=False,
    )
    stats = _stats()
    assert (stats.errors, stats.retries) == (0, 3)
    return FaultReport(
        "timeouts (3 requests hang past the client timeout)",
        n,
        n,
        0,
        _lost(out, "llm_output"),
        0,
        0,
        "retried",
    )


def malformed_and_dropped(emu: ProviderEmulator) -> FaultReport:
    """Truncated JSON bodies, connections closed mid-body and 5xx: all retried."""
    emu.faults.inject(Fault.malformed(), count=3)
    emu.faults.inject(Fault.drop(), count=3)
    emu.faults.inject(Fault.server_error(502), count=3)
    n = 20
    out = _frame(n).llm.map(  # spread over the first wave (see ``timeouts``)
        TEMPLATE, backend="openai", base_url=emu.openai_url, warm_start=False
    )
    stats = _stats()
    assert (stats.errors, stats.retries) == (0, 9)
    return FaultReport(
        "malformed bodies, dropped connections, 502s",
        n,
        n,
        0,
        _lost(out, "llm_output"),
        0,
        0,
        "retried",
    )


def empty_answers(emu: ProviderEmulator) -> FaultReport:
    """Rows 3 and 8 always get an empty answer: explicit parse errors, never cached."""
    emu.faults.inject(Fault.empty(), when=lambda p: _row(p) in {3, 8})
    n = 12
    df = _frame(n)
    out = df.llm.classify(
        QUESTION, LABELS, backend="openai", base_url=emu.openai_url, errors="keep"
    )
    stats = _stats()
    errors = _errors_by_row(out)
    assert set(errors) == {3, 8}
    assert all("parse" in e for e in errors.values())
    assert stats.errors == 2 and stats.retries == 2  # one parse retry each
    billed = len(emu.ledger)  # empty answers are billed too (the responder never sees them)
    df.llm.classify(QUESTION, LABELS, backend="openai", base_url=emu.openai_url, errors="keep")
    assert len(emu.ledger) - billed == 4, "only the two failed rows were asked again"
    assert _stats().cache_hits == n - 2
    return FaultReport(
        "empty answers (2 rows, every attempt)",
        n,
        n - 2,
        2,
        _lost(out, "label", "label_error"),
        0,
        0,
        "explicit parse errors; not cached",
    )


def ignores_format(emu: ProviderEmulator) -> FaultReport:
    """The model answers in prose instead of the JSON it was asked for, on some rows."""
    prose_rows = {1, 5, 6}

    def chatty(provider: str, model: str, prompt: str, schema: Any) -> str:
        if _row(prompt) in prose_rows:
            return "Sure! Having read the review carefully, I would say it is rather positive."
        return default_responder(provider, model, prompt, schema)

    emu.responder = Recorder(chatty)
    n = 10
    df = _frame(n)
    out = df.llm.classify(
        QUESTION, LABELS, backend="openai", base_url=emu.openai_url, errors="keep"
    )
    stats = _stats()
    errors = _errors_by_row(out)
    assert set(errors) == prose_rows
    assert all("Sure!" in e for e in errors.values()), "the raw answer is shown"
    assert stats.errors == 3 and stats.retries == 3
    with pytest.raises(semframe.RowErrors) as info:
        df.llm.classify(QUESTION, LABELS, backend="openai", base_url=emu.openai_url)
    assert [e.row for e in info.value.errors] == sorted(prose_rows)
    assert _stats().cache_hits == n - 3
    return FaultReport(
        "model ignores the output format (3 rows)",
        n,
        n - 3,
        3,
        _lost(out, "label", "label_error"),
        0,
        0,
        "explicit parse errors with the raw answer",
    )


def out_of_order(tmp: Path) -> FaultReport:
    """16 threads, random per-request delays: answers arrive in any order."""
    n = 400
    rng = random.Random(3)
    delays = {i: rng.uniform(0, 0.004) for i in range(n)}

    def slow(request: Request) -> str:
        time.sleep(delays[request.row])
        return default_answer(request)

    backend = FakeBackend(slow, max_concurrency=16)
    finished: list[int] = []
    original = backend.complete

    def complete(request: Any, *, slot: int | None = None) -> Any:
        completion = original(request, slot=slot)
        finished.append(request.row)
        return completion

    backend.complete = complete  # type: ignore[method-assign]
    register_backend("fake", lambda model, settings: backend)
    try:
        df = _frame(n).sample(frac=1.0, random_state=1)
        out = df.llm.map(TEMPLATE, backend="fake")
    finally:
        register_backend("fake", "semframe.backends.fake:create")
    stats = _stats()
    sent = [r.row for r in backend.history]
    assert finished != sent, "answers did come back out of order"
    assert list(out.index) == list(df.index)
    assert (stats.requests, stats.errors, stats.workers) == (n, 0, 16)
    return FaultReport(
        "answers out of order (16 threads, random delays)",
        n,
        n,
        0,
        _lost(out, "llm_output"),
        0,
        0,
        "each value is its own row's",
    )


def disk_full(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> FaultReport:
    """The cache's disk fills up mid-run (SQLite's own SQLITE_FULL, from a page limit)."""
    import semframe.runtime.call

    opened: list[ResultCache] = []
    real_open = semframe.runtime.call.open_cache

    def tiny_disk(directory: Path, *, max_mib: float | None) -> ResultCache | None:
        cache = real_open(directory, max_mib=max_mib)
        assert cache is not None
        (pages,) = cache._db.execute("PRAGMA page_count").fetchone()
        cache._db.execute(f"PRAGMA max_page_count = {pages + 3}")
        opened.append(cache)
        return cache

    monkeypatch.setattr(semframe.runtime.call, "open_cache", tiny_disk)
    n = 400
    df = _frame(n)
    backend = FakeBackend(max_concurrency=4)
    register_backend("fake", lambda model, settings: backend)
    try:
        with caplog.at_level(logging.WARNING, logger="semframe.cache.store"):
            out = df.llm.map(TEMPLATE, backend="fake")
        stats = _stats()
        assert (stats.requests, stats.errors, stats.cache_hits) == (n, 0, 0)
        assert opened[0].write_errors >= 1 and "full" in (opened[0].last_error or "")
        messages = [r.getMessage() for r in caplog.records]
        assert any("write failed (database or disk is full)" in m for m in messages)
        assert any("could not be stored" in m and "re-run will send" in m for m in messages)
        monkeypatch.setattr(
            semframe.runtime.call, "open_cache", real_open
        )  # the disk has room again
        backend.history.clear()
        again = df.llm.map(TEMPLATE, backend="fake")
    finally:
        register_backend("fake", "semframe.backends.fake:create")
    stored = _stats().cache_hits
    assert stored < n and len(backend.history) == n - stored
    pd.testing.assert_frame_equal(out, again)
    return FaultReport(
        "disk full on the cache (SQLITE_FULL)",
        n,
        int(out["llm_output"].notna().sum()),
        0,
        _lost(out, "llm_output"),
        0,
        0,
        f"run completes in memory with a warning; {n - stored} answers not "
        "stored are sent again by a later run",
    )


def corrupt_cache(tmp: Path, caplog: pytest.LogCaptureFixture) -> FaultReport:
    """The cache file is not a database: it is moved aside, and a fresh cache takes its place."""
    path = Path(semframe.config()["cache_dir"]) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    n = 10
    backend = FakeBackend()
    register_backend("fake", lambda model, settings: backend)
    try:
        with caplog.at_level(logging.WARNING, logger="semframe.cache.store"):
            out = _frame(n).llm.map(TEMPLATE, backend="fake")
    finally:
        register_backend("fake", "semframe.backends.fake:create")
    assert any(
        "moved it aside" in r.getMessage() and "started a fresh cache" in r.getMessage()
        for r in caplog.records
    )
    assert list(path.parent.glob(f"{FILENAME}.damaged-*"))
    assert _stats().requests == n
    again = _frame(n).llm.map(TEMPLATE, backend="fake")  # the fresh cache stored them
    assert _stats().requests == 0
    assert list(again["llm_output"]) == list(out["llm_output"])
    return FaultReport(
        "corrupt cache file",
        n,
        n,
        0,
        _lost(out, "llm_output"),
        0,
        0,
        "moved aside with a warning; a fresh cache stores this run's answers",
    )


# -- the tests -----------------------------------------------------------------------


REPORTS: list[FaultReport] = []


@pytest.fixture(autouse=True, scope="module")
def _fault_table() -> Iterator[None]:
    yield
    target = os.environ.get("FAULT_TABLE")
    if target and REPORTS:
        lines = [
            "| fault | rows | with a value | explicit errors | rows lost | re-billed on resume "
            "| in flight or uncommitted at the kill | notes |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.fault} | {r.rows} | {r.valued} | {r.errors} | {r.lost} | {r.rebilled} "
            f"| {r.in_flight} | {r.note} |"
            for r in REPORTS
        ]
        Path(target).write_text("\n".join(lines) + "\n")


def _check(report: FaultReport) -> None:
    REPORTS.append(report)
    assert report.lost == 0
    assert report.valued + report.errors == report.rows
    assert report.rebilled <= report.in_flight


def test_kill_9_mid_run_resume_on_the_emulator(emu: ProviderEmulator, tmp_path: Path) -> None:
    _check(kill_and_resume_emulator(emu, tmp_path))


def test_kill_9_mid_run_resume_on_the_fake_backend(tmp_path: Path) -> None:
    _check(kill_and_resume_fake(tmp_path))


def test_ctrl_c_mid_run_resume(tmp_path: Path) -> None:
    _check(ctrl_c_and_resume(tmp_path))


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_429_storm(emu: ProviderEmulator, backend: str) -> None:
    _check(storm_429(emu, backend))


def test_timeouts(emu: ProviderEmulator) -> None:
    _check(timeouts(emu))


def test_malformed_and_dropped(emu: ProviderEmulator) -> None:
    _check(malformed_and_dropped(emu))


def test_empty_answers(emu: ProviderEmulator) -> None:
    _check(empty_answers(emu))


def test_model_ignores_the_output_format(emu: ProviderEmulator) -> None:
    _check(ignores_format(emu))


def test_answers_out_of_order(tmp_path: Path) -> None:
    _check(out_of_order(tmp_path))


def test_disk_full_on_the_cache(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _check(disk_full(monkeypatch, caplog))


def test_corrupt_cache_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _check(corrupt_cache(tmp_path, caplog))


def test_write_failure_keeps_answers_and_retries(tmp_path: Path) -> None:
    """A write that fails is retried with the answers it had; none is dropped."""
    from semframe.backends.base import Completion, Usage

    fake = FakeBackend()
    with ResultCache(tmp_path / FILENAME) as cache:
        (pages,) = cache._db.execute("PRAGMA page_count").fetchone()
        cache._db.execute(f"PRAGMA max_page_count = {pages}")
        for i in range(20):
            cache.put(digest(f"k{i}"), fake, Completion(0, "x" * 5000, Usage(1, 0, 0, 1)))
        assert cache.flush() is False
        assert cache.pending == 20
        cache._db.execute("PRAGMA max_page_count = 1000000")  # room again
        assert cache.flush() is True
        assert cache.pending == 0
        assert len(cache.get_many([digest(f"k{i}") for i in range(20)])) == 20
