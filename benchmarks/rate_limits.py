"""Adaptive rate limits: paced by the provider's headers against sending until refused.

An account has a rate limit per minute; a run larger than what is left of it
either slows down before the limit or meets a storm of 429s, each one a
request sent for nothing, retried, and after ``max_retries`` a row lost to
an error. The emulator enforces the limits as the providers describe them
(token buckets refilled continuously, 429 with ``Retry-After``, the state in
every response's headers). Each scenario runs the same ``df.llm.map`` three
ways, side by side:

- ``adaptive``: semframe as it is (paced by the headers, slowed by 429s);
- ``unpaced``: the same executor with the provider's headers and 429s
  ignored (each refused request only retries itself, after its
  ``Retry-After``: the behaviour before the pacer);
- ``configured``: unpaced, but with the user's ``rpm``/``tpm`` set to the
  account's limits, the old advice (a user who knows the limits; it cannot
  know what other clients of the key use).

Scenarios: a run larger than its request limit; a token-bound run; and two
runs sharing one key at once (each sees the other only through the headers).
Reported per way: wall time, requests refused (429s at the emulator), rows
that ended in an error, requests sent in all. Medians over ``--repeats``.

    python benchmarks/rate_limits.py
    python benchmarks/rate_limits.py --repeats 3

Writes ``benchmarks/results/rate_limits.json`` and ``rate_limits.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pandas as pd

import semframe  # noqa: F401  (registers df.llm)
import semframe.runtime.execute as execute_module
from semframe.core.wire import Completion, RateLimits
from semframe.runtime.pacing import Pacer, Ticket
from semframe.runtime.stats import report_scope
from semframe.testing.emulator import AccountLimits, Latency, ProviderEmulator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
KEY = "sk-bench-limits-0123456789abcdef"


class UnpacedPacer(Pacer):
    """The pacer with the provider's headers and 429s ignored (configured limits still apply)."""

    async def done(
        self,
        ticket: Ticket,
        answer: Completion | None,
        *,
        limits: RateLimits | None = None,
        rate_limited: bool = False,
        retry_after: float | None = None,
    ) -> None:
        await super().done(ticket, answer)


@contextmanager
def pacer(kind: type[Pacer]) -> Iterator[None]:
    saved = execute_module.Pacer
    execute_module.Pacer = kind  # type: ignore[misc]
    try:
        yield
    finally:
        execute_module.Pacer = saved  # type: ignore[misc]


@dataclass(frozen=True)
class Scenario:
    name: str
    limits: AccountLimits
    rows: int
    words: int  # words of filler per row (prompt size)
    max_tokens: int
    runs: int = 1  # runs at once in this process, sharing the key
    other_rps: float = 0.0  # another client on the key, requests per second (not semframe)


SCENARIOS = [
    Scenario("requests: 300 rows, 240 rpm", AccountLimits(rpm=240), 300, 5, 32),
    Scenario("tokens: 150 rows, 40k tpm", AccountLimits(tpm=40_000), 150, 120, 64),
    Scenario("shared key: 2 runs x 120 rows, 180 rpm", AccountLimits(rpm=180), 120, 5, 32, runs=2),
    Scenario(
        "other client: 300 rows, 240 rpm, 2 rps elsewhere",
        AccountLimits(rpm=240),
        300,
        5,
        32,
        other_rps=2.0,
    ),
]


def other_client(emu: ProviderEmulator, rps: float, stop: threading.Event) -> None:
    """Another program on the same key: one small request every ``1 / rps`` seconds."""
    with openai.OpenAI(base_url=emu.openai_url, api_key=KEY, max_retries=0) as client:
        while not stop.wait(1.0 / rps):
            with contextlib.suppress(openai.APIError):
                client.chat.completions.create(
                    model="gpt-4.1-mini",  # apart from the run's in the ledger
                    messages=[{"role": "user", "content": "ping"}],
                    max_tokens=4,
                )


def frame(rows: int, words: int, seed: int) -> pd.DataFrame:
    filler = " ".join(f"w{(seed * 7 + j) % 97}" for j in range(words))
    return pd.DataFrame(
        {"item": [f"item {seed}-{i} {filler}" for i in range(rows)]},
        index=[f"r{seed}-{i}" for i in range(rows)],
    )


def one_run(
    emu: ProviderEmulator, s: Scenario, seed: int, settings: dict[str, Any], out: list[Any]
) -> None:
    df = frame(s.rows, s.words, seed)
    with report_scope() as report:
        result = df.llm.map(
            "Name {item}.",
            backend="openai",
            base_url=emu.openai_url,
            model="gpt-4o-mini",
            max_concurrency=32,
            max_tokens=s.max_tokens,
            cache=False,
            progress="off",
            errors="keep",
            **settings,
        )
    stats = report.run
    assert stats is not None
    failed = int(result["llm_output_error"].notna().sum())
    out.append((failed, stats.requests))


def run_way(way: str, s: Scenario, latency: float) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if way == "configured":
        settings = {"rpm": s.limits.rpm, "tpm": s.limits.tpm}
    kind = Pacer if way == "adaptive" else UnpacedPacer
    with ProviderEmulator(rate_limits=s.limits, latency=Latency(latency)) as emu, pacer(kind):
        results: list[Any] = []
        start = time.monotonic()
        threads = [
            threading.Thread(target=one_run, args=(emu, s, seed, settings, results))
            for seed in range(s.runs)
        ]
        stop = threading.Event()
        if s.other_rps:
            threads.append(threading.Thread(target=other_client, args=(emu, s.other_rps, stop)))
        for t in threads:
            t.start()
        for t in threads[: s.runs]:
            t.join()
        wall = time.monotonic() - start
        stop.set()
        for t in threads[s.runs :]:
            t.join()
        refused = sum(1 for e in emu.ledger.entries("openai", "gpt-4o-mini") if e.status == 429)
    return {
        "wall_s": wall,
        "refused": refused,
        "failed_rows": sum(r[0] for r in results),
        "sent": sum(r[1] for r in results),
    }


WAYS = ("adaptive", "unpaced", "configured")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds per answer")
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENAI_API_KEY", KEY)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for s in SCENARIOS:
        table[s.name] = {}
        for way in WAYS:
            runs = [run_way(way, s, args.latency) for _ in range(args.repeats)]
            table[s.name][way] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            row = table[s.name][way]
            print(
                f"{s.name:50} {way:10} {row['wall_s']:7.1f} s  {row['refused']:5.0f} refused  "
                f"{row['failed_rows']:4.0f} rows failed  {row['sent']:5.0f} sent",
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "latency_s": args.latency,
        "repeats": args.repeats,
        "scenarios": [s.__dict__ | {"limits": s.limits.__dict__} for s in SCENARIOS],
        "results": table,
    }
    (RESULTS / "rate_limits.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(table)
    return payload


def plot(table: dict[str, dict[str, dict[str, float]]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dev dependency
        return
    names = list(table)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.26
    metrics: list[tuple[str, str, Callable[[dict[str, float]], float]]] = [
        ("wall time (s)", "wall_s", lambda r: r["wall_s"]),
        ("requests refused (429)", "refused", lambda r: r["refused"]),
    ]
    for ax, (title, _, get) in zip(axes, metrics, strict=True):
        for i, way in enumerate(WAYS):
            xs = [j + (i - 1) * width for j in range(len(names))]
            ax.bar(xs, [get(table[n][way]) for n in names], width, label=way)
        ax.set_xticks(range(len(names)), [n.split(":")[0] for n in names])
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "rate_limits.png", dpi=110)


if __name__ == "__main__":
    main()
