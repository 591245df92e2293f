"""Ctrl-C stops a run promptly, keeps the answers received, and says how to resume.

Each scenario runs in a subprocess that interrupts itself with SIGINT (what a
terminal's Ctrl-C and a notebook's interrupt send) once some answers are in.
semframe registers ``df.llm`` on Polars at import, and Polars installs its own
SIGINT handler: the run must stop anyway.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "SIGINT") or os.name != "posix", reason="needs POSIX signals"
)

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    import pandas as pd
    import polars  # noqa: F401  (installs its own SIGINT handler)
    import semframe
    from semframe.errors import RunInterrupted
    from semframe.testing.emulator import Latency, ProviderEmulator

    os.environ["OPENAI_API_KEY"] = "test-key"
    CACHE = sys.argv[1] == "cache"
    n = 120
    df = pd.DataFrame({"t": [f"text {i}" for i in range(n)]})
    settings = dict(backend="openai", max_concurrency=4, cache=CACHE, progress="off")
    with ProviderEmulator(latency=Latency(0.05)) as emu:
        settings["base_url"] = emu.openai_url
        sent = {}

        def interrupt():
            while emu.ledger.totals().requests < 12:
                time.sleep(0.01)
            sent["at"] = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        out = {}
        try:
            df.llm.map("Echo {t}", **settings)
            out["interrupted"] = False
        except RunInterrupted as exc:
            out.update(interrupted=True, message=str(exc), answered=exc.answered,
                       kept=sum(o is not None for o in exc.outcomes), stored=exc.stored)
        out["stop_seconds"] = time.monotonic() - sent.get("at", time.monotonic())
        time.sleep(0.3)  # requests cancelled in flight must not be answered and billed later
        out["billed"] = emu.ledger.totals().requests
        if CACHE:
            emu.reset()
            df.llm.map("Echo {t}", **settings)
            out["rerun_sent"] = emu.ledger.totals().requests
        print(json.dumps(out))
    """
)


def _run(mode: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SEMFRAME_CACHE_DIR": os.environ["SEMFRAME_CACHE_DIR"]},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_ctrl_c_stops_an_api_run_and_a_rerun_resumes() -> None:
    out = _run("cache")
    assert out["interrupted"] is True
    # Stops at once, not after every row (before the fix: every row billed, seconds later).
    assert float(out["stop_seconds"]) < 5.0  # type: ignore[arg-type]
    billed, answered = int(out["billed"]), int(out["answered"])  # type: ignore[call-overload]
    assert billed < 60
    assert answered == out["kept"]
    assert answered >= 1
    # Paid for and lost: only what was in flight (max_concurrency=4) when the run stopped.
    assert billed - answered <= 4
    assert out["stored"] is True
    message = str(out["message"])
    assert f"{answered} of 120 rows had been answered" in message
    assert "running the same call again sends only the other" in message
    # The re-run pays only for what the first run did not receive.
    assert out["rerun_sent"] == 120 - answered


def test_ctrl_c_without_the_result_cache_hands_back_the_answers() -> None:
    out = _run("nocache")
    assert out["interrupted"] is True
    assert float(out["stop_seconds"]) < 5.0  # type: ignore[arg-type]
    assert int(out["billed"]) < 60  # type: ignore[call-overload]
    assert out["stored"] is False
    assert out["kept"] == out["answered"]
    assert ".outcomes of this exception" in str(out["message"])
