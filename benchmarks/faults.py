"""What a hostile run costs: time to stop, rows lost, dollars billed and counted.

Each scenario runs the public API against the provider emulator (the OpenAI
SDK over HTTP on localhost) with default settings unless it says otherwise:

- ``ctrl_c``: 1,280 rows at the default concurrency; SIGINT (a terminal's
  Ctrl-C, a notebook's interrupt) once 100 answers are in, with Polars
  imported (it installs its own SIGINT handler). Seconds from the signal to
  the exception, requests the provider billed after the signal, answers kept.
  Run in a child process, which interrupts itself.
- ``hung_row``: 20 rows; every attempt of one row hangs (the provider never
  answers it). Seconds until the call returns, rows with a value.
- ``lost_bodies``: 60 rows (``max_tokens=40``, near the answers' length);
  30% of responses are dropped half-way through the body, after the
  provider billed them. The run's reported dollars against the provider's
  bill; then a budget 10% above the estimate (the run starts; the dropped
  answers sent again cost more than the margin), and what the provider
  billed against it.
- ``bad_base_url``: 30 rows sent to a port nothing listens on. Seconds to
  the error, and whether it names the URL.
- ``big_cell``: one 6 MB cell (about 1.2M tokens) for a model whose
  context window semframe does not know, behind ``base_url`` (priced, so
  the provider answers and bills it). Requests billed.

Prints a table and writes ``benchmarks/results/faults.json``. To measure
another version of semframe the same way, put it first on ``PYTHONPATH``::

    python benchmarks/faults.py
    python benchmarks/faults.py --only hung_row,bad_base_url
    PYTHONPATH=../old-checkout python benchmarks/faults.py --out /tmp/faults-old.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

RESULTS = Path(__file__).parent / "results"

CTRL_C = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    import pandas as pd
    import polars  # noqa: F401  (installs its own SIGINT handler)
    import semframe
    from semframe.testing.emulator import Latency, ProviderEmulator

    os.environ["OPENAI_API_KEY"] = "test-key"
    n = 1280
    df = pd.DataFrame({"t": [f"text {i}" for i in range(n)]})
    with ProviderEmulator(latency=Latency(0.05)) as emu:
        sent = {}

        def interrupt():
            while emu.ledger.totals().requests < 100:
                time.sleep(0.005)
            sent["at"] = time.monotonic()
            sent["billed"] = emu.ledger.totals().requests
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        out = {"rows": n}
        try:
            df.llm.map("Echo {t}", backend="openai", base_url=emu.openai_url, cache=False,
                       progress="off")
            out["stopped"] = False
        except KeyboardInterrupt as exc:
            out["stopped"] = True
            out["message"] = str(exc)
            outcomes = getattr(exc, "outcomes", None) or []
            out["kept"] = sum(1 for o in outcomes if o is not None and o.error_kind is None)
        out["stop_seconds"] = time.monotonic() - sent["at"]
        time.sleep(0.5)  # what was cancelled in flight must not be billed later
        out["billed_at_signal"] = sent["billed"]
        out["billed"] = emu.ledger.totals().requests
    print(json.dumps(out))
    """
)


def ctrl_c() -> dict[str, Any]:
    child = subprocess.run(  # from this folder, so that the child imports what we import
        [sys.executable, "-c", CTRL_C],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).parent,
    )
    if child.returncode != 0 or not child.stdout.strip():
        return {"error": child.stderr.strip()[-500:]}
    out: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    out["billed_after_signal"] = out["billed"] - out["billed_at_signal"]
    return out


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"t": [f"row {i}" for i in range(n)]})


def hung_row() -> dict[str, Any]:
    with ProviderEmulator(latency=Latency(0)) as emu:
        emu.faults.inject(Fault.hang(3600), when=lambda prompt: "row 7" in prompt)
        start = time.monotonic()
        out = _rows(20).llm.map(
            "Echo {t}", backend="openai", base_url=emu.openai_url, errors="keep", cache=False
        )
        seconds = time.monotonic() - start
        error_column = "llm_output_error"
        error = out[error_column][7] if error_column in out.columns else None
    return {
        "rows": 20,
        "seconds": round(seconds, 1),
        "with_value": int(out["llm_output"].notna().sum()),
        "error": error,
    }


def lost_bodies() -> dict[str, Any]:
    words = " ".join(f"word{i}" for i in range(60))
    df = pd.DataFrame({"review": [f"review {i}: {words}" for i in range(60)]})
    template = "Summarize the review {review} in one sentence."
    with ProviderEmulator(latency=Latency(0)) as emu:
        settings = {"backend": "openai", "base_url": emu.openai_url, "cache": False}
        settings["max_tokens"] = 40
        emu.faults.inject(Fault.drop(), probability=0.3, seed=3)
        df.llm.map(template, max_retries=8, **settings)
        stats = semframe.last_run()
        billed = emu.ledger.totals().dollars
        reported = stats.dollars if stats is not None else None
        unconfirmed = getattr(stats, "unconfirmed", None)
        emu.faults.clear()
        emu.reset()
        full = df.llm.estimate(template, **settings).dollars
        budget = full * 1.1
        emu.faults.inject(Fault.drop(), probability=0.3, seed=5)
        stopped = False
        try:
            df.llm.map(template, budget=budget, max_retries=8, **settings)
        except semframe.errors.BudgetExceeded:
            stopped = True
        spent = emu.ledger.totals().dollars
    return {
        "rows": 60,
        "billed_dollars": billed,
        "reported_dollars": reported,
        "reported_over_billed": None if not reported else round(reported / billed, 3),
        "unconfirmed_answers": unconfirmed,
        "budget_dollars": budget,
        "billed_under_budget": spent,
        "requests_billed_under_budget": emu.ledger.totals().requests,
        "billed_over_budget": round(spent / budget, 3),
        "budget_stopped_run": stopped,
    }


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def bad_base_url() -> dict[str, Any]:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    start = time.monotonic()
    try:
        _rows(30).llm.map("Echo {t}", backend="openai", base_url=url, cache=False)
        error: Exception | None = None
    except Exception as exc:  # what the user sees
        error = exc
    seconds = time.monotonic() - start
    first_line = str(error).split("\n", maxsplit=1)[0]
    port = url.rsplit(":", 1)[1].split("/", maxsplit=1)[0]
    return {
        "rows": 30,
        "seconds": round(seconds, 2),
        "error": type(error).__name__,
        "names_the_url": f"127.0.0.1:{port}" in first_line,
        "message": first_line[:200],
    }


def big_cell() -> dict[str, Any]:
    frame = pd.DataFrame({"t": ["word " * 1_200_000]})
    # Priced (here and at the provider), so the provider answers and bills it.
    prices = {"my-finetune": {"provider": "openai", "input": 0.4, "output": 1.6}}
    with ProviderEmulator(prices=prices, latency=Latency(0)) as emu:
        try:
            frame.llm.map("Echo {t}", backend="openai", base_url=emu.openai_url,
                          model="my-finetune", prices=prices, cache=False)  # fmt: skip
            error: Exception | None = None
        except Exception as exc:
            error = exc
        sent = emu.ledger.totals().requests
    return {
        "cell_mb": 6.0,
        "requests_sent": sent,
        "error": type(error).__name__,
        "message": str(error).split("\n", maxsplit=1)[0][:200],
    }


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "ctrl_c": ctrl_c,
    "hung_row": hung_row,
    "lost_bodies": lost_bodies,
    "bad_base_url": bad_base_url,
    "big_cell": big_cell,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated scenarios")
    parser.add_argument("--out", default=str(RESULTS / "faults.json"))
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "test-key")
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; valid: {', '.join(SCENARIOS)}")
    semframe.configure(progress="off")
    results: dict[str, Any] = {"semframe": str(Path(semframe.__file__).parent)}
    print(f"{'scenario':<14} figures")
    for name in names:
        results[name] = SCENARIOS[name]()
        shown = {k: v for k, v in results[name].items() if k not in ("message", "error")}
        print(f"{name:<14} {shown}")
        if "error" in results[name]:
            print(f"{'':<14} error: {results[name]['error']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
