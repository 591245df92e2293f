"""A hung response, a wrong address, an unknown model: each costs seconds, not minutes.

Against the provider emulator through the official SDK. The attempt limits
are learned from the run's own answers (:mod:`semframe.runtime.deadlines`);
their floor (10 s and 0.05 s per ``max_tokens``) is scaled down here so that
a hang shows in a second instead of twenty.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pandas as pd
import pytest

import semframe
from semframe.errors import ConfigError, InputError, RunAborted
from semframe.runtime import deadlines
from semframe.runtime.progress import Progress
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

TEMPLATE = "Echo {t}"


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt limits with a floor of 0.4 s (10 s by default)."""
    monkeypatch.setattr(deadlines, "BASE_SECONDS", 0.4)
    monkeypatch.setattr(deadlines, "PER_OUTPUT_TOKEN", 0.001)


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"t": [f"row {i}" for i in range(n)]})


def _stats() -> semframe.RunStats:
    stats = semframe.last_run()
    assert stats is not None
    return stats


def test_a_hung_row_fails_in_seconds_and_the_others_are_kept(
    emu: ProviderEmulator, quick: None
) -> None:
    """With the default timeout (120 s) a hung row used to hold the run 4 x 120 s."""
    emu.faults.inject(Fault.hang(8.0), when=lambda prompt: "row 7" in prompt)
    start = time.monotonic()
    out = _rows(20).llm.map(TEMPLATE, backend="openai", base_url=emu.openai_url, errors="keep")
    took = time.monotonic() - start
    # Well under the hang, with room for a loaded machine (3.5 s against a 4 s hang
    # failed once under the whole suite).
    assert took < 6.0, f"the hung row held the run {took:.1f} s"
    assert out["llm_output"].notna().sum() == 19
    error = out["llm_output_error"][7]
    assert "no answer within the row's deadline" in error
    assert "set row_timeout to change it" in error
    stats = _stats()
    assert stats.unconfirmed >= 1, "a timed-out attempt may have been billed: it is charged"


def test_row_timeout_setting_bounds_a_row(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.hang(4.0), when=lambda prompt: "row 2" in prompt)
    start = time.monotonic()
    out = _rows(6).llm.map(
        TEMPLATE, backend="openai", base_url=emu.openai_url, errors="keep", row_timeout=1.0
    )
    assert time.monotonic() - start < 2.5
    assert out["llm_output"].isna().tolist() == [i == 2 for i in range(6)]
    assert "row_timeout=1" in out["llm_output_error"][2]


def test_a_hung_group_leader_does_not_hold_its_group(emu: ProviderEmulator, quick: None) -> None:
    """Rows sharing their leading field wait for the first; not for longer than an answer takes."""
    emu.faults.inject(Fault.hang(4.0), count=1)  # the group's leader goes alone, and hangs
    frame = pd.DataFrame({"movie": ["Alien"] * 8, "t": [f"row {i}" for i in range(8)]})
    start = time.monotonic()
    out = frame.llm.map(
        "About {movie}: {t}", backend="openai", base_url=emu.openai_url, max_concurrency=4
    )
    assert time.monotonic() - start < 3.5
    assert out["llm_output"].notna().all(), "the leader's retry was answered"
    stats = _stats()
    assert stats.retries >= 1 and stats.errors == 0


def test_a_server_slow_for_every_row_is_waited_for(emu: ProviderEmulator, quick: None) -> None:
    """Every answer takes 1.5 s, past the floor: the limits learn it, nothing times out."""
    emu.faults.inject(Fault.hang(1.5))
    out = _rows(8).llm.map(TEMPLATE, backend="openai", base_url=emu.openai_url, max_concurrency=4)
    assert out["llm_output"].notna().all()
    stats = _stats()
    assert (stats.retries, stats.errors, stats.unconfirmed) == (0, 0, 0)


def test_timeout_settings_are_checked() -> None:
    for name, bad in (("row_timeout", -1), ("connect_timeout", 0), ("timeout", "soon")):
        with pytest.raises(ConfigError, match=name):
            semframe.config(**{name: bad})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_a_wrong_base_url_stops_at_once_naming_it(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    start = time.monotonic()
    with pytest.raises(RunAborted) as info:
        _rows(30).llm.map(TEMPLATE, backend=backend, base_url=url)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert f"cannot reach http://127.0.0.1:{url.split(':')[2]}" in message
    assert "Check base_url" in message


def test_an_unknown_model_is_bounded_by_the_context_window_setting(emu: ProviderEmulator) -> None:
    frame = pd.DataFrame({"t": ["short", "word " * 3000]})
    with pytest.raises(InputError, match="truncate=") as info:
        frame.llm.map(
            TEMPLATE,
            backend="openai",
            base_url=emu.openai_url,
            model="my-finetune",
            context_window=2048,
        )
    assert "allows 2,048 per request" in str(info.value)
    assert emu.ledger.entries() == [], "refused before anything was sent"


class _ModelsOnly(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that describes its model as vLLM does, and answers nothing."""

    posts: list[str] = []  # noqa: RUF012 - one test's record

    def do_GET(self) -> None:
        entry = {"id": "my-finetune", "object": "model", "created": 0, "owned_by": "vllm"}
        body = json.dumps({"object": "list", "data": [{**entry, "max_model_len": 2048}]})
        self.send_response(200 if self.path.endswith("/v1/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self) -> None:
        self.posts.append(self.path)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_an_unknown_model_gets_the_window_its_server_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    server = HTTPServer(("127.0.0.1", 0), _ModelsOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        frame = pd.DataFrame({"t": ["word " * 3000]})
        with pytest.raises(InputError, match="truncate=") as info:
            frame.llm.map(TEMPLATE, backend="openai", base_url=url, model="my-finetune")
    finally:
        server.shutdown()
        server.server_close()
    assert "allows 2,048 per request" in str(info.value)
    assert _ModelsOnly.posts == [], "refused before anything was sent"


def test_an_unknown_model_nobody_describes_still_gets_a_bound(emu: ProviderEmulator) -> None:
    """A 6 MB cell is more than any model's window: refused before sending."""
    frame = pd.DataFrame({"t": ["word " * 1_200_000]})  # 6 MB, about 1.2M tokens
    with pytest.raises(InputError, match="truncate="):
        frame.llm.map(TEMPLATE, backend="openai", base_url=emu.openai_url, model="my-finetune")
    assert emu.ledger.entries() == []


def test_progress_shows_requests_still_waiting() -> None:
    stream = io.StringIO()
    waits = deadlines.InFlight()
    waits.start(1, now=time.monotonic() - 12)
    bar = Progress(20, "map on openai", mode="on", delay=0, stream=stream, waiting=waits.waiting)
    bar.update(19)
    time.sleep(0.7)  # redrawn while no answer arrives
    bar.close()
    lines = stream.getvalue().split("\r")
    assert any("19/20 rows | 1 waiting (longest 0:12)" in line for line in lines)
    assert lines[-1].endswith("\n") and "waiting" not in lines[-1]
