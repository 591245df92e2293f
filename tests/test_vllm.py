"""vLLM for real, on its CPU build: map/filter/classify end to end in process, our
scheduler deciding admission order inside the engine, and ``semframe serve``.

Run by ``make test-vllm`` (its own environment, ``.venv-vllm``); skipped, with
the reason, where vLLM is not installed. The model is SmolLM2-135M converted
once from the pip-installed GGUF file; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import semframe
from semframe.serving.vllm import installed_version

pytestmark = [
    pytest.mark.vllm,
    # vLLM and torch deprecate things inside themselves; ours still fail the run
    pytest.mark.filterwarnings("default::DeprecationWarning", "default::FutureWarning"),
]

if installed_version() is None:
    pytest.skip(
        "vLLM is not installed here; `make test-vllm` installs its CPU build in .venv-vllm "
        "and runs these tests",
        allow_module_level=True,
    )

DATA = Path(__file__).resolve().parent / "data" / "movies_slice.csv"
ENGINE = {"max_model_len": 2048, "max_num_seqs": 2}


@pytest.fixture(scope="module", autouse=True)
def _cpu_env() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm") / "trace.jsonl"


@pytest.fixture(scope="module")
def opts(trace: Path) -> Iterator[dict[str, Any]]:
    """Settings of the one in-process engine these tests share (RelServe, 2 sequences)."""
    args = dict(ENGINE)
    args["additional_config"] = {
        "semframe": {"trace": str(trace), "options": {"starvation_threshold": None}}
    }
    yield {
        "backend": "vllm",
        "vllm_scheduler": "relserve",
        "vllm_args": args,
        "cache": False,
        "max_tokens": 24,
        # the 135M model's "five words" run on: a cut answer is kept (marked), not re-asked
        "truncated": "keep",
    }
    from semframe.backends import reset_backends

    reset_backends("vllm")  # stops the in-process engine


def _reviews(n: int) -> pd.DataFrame:
    df = pd.read_csv(DATA)
    df = df[df.review_content.fillna("").str.strip() != ""]
    df = df[df.movie_info.fillna("").str.len() > 400]  # long shared info: whole cache blocks
    top = df.movie_title.value_counts().index[:2]
    df = df[df.movie_title.isin(top)].head(n)
    df.index = [f"row{i}" for i in range(len(df))]
    return df[["movie_title", "movie_info", "review_content"]]


def _admissions(trace: Path) -> list[tuple[str, str, int]]:
    out = []
    for line in trace.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        out.extend((r[0], r[1], r[2]) for r in record["admitted"])
    return out


def test_map_keeps_order_and_reports_cached_tokens(opts: dict[str, Any]) -> None:
    df = _reviews(8)
    assert len(df) == 8
    shuffled = df.sample(frac=1.0, random_state=3)
    out = shuffled.llm.map(
        "Movie: {movie_title}. {movie_info} In five words, what does this review say? "
        "{review_content}",
        **opts,
    )
    assert list(out.index) == list(shuffled.index)
    assert out["llm_output"].map(lambda s: isinstance(s, str) and s.strip() != "").all()
    stats = semframe.last_run()
    assert stats is not None and stats.requests == len(df) and stats.errors == 0
    assert stats.prompt_tokens > 0
    assert stats.cached_tokens > 0  # rows of one movie share its long info block


def test_filter_and_classify_are_constrained(opts: dict[str, Any]) -> None:
    df = _reviews(6)
    kept = df.llm.filter("Is this review of {movie_title} positive? {review_content}", **opts)
    assert list(kept.index) == [i for i in df.index if i in set(kept.index)]
    stats = semframe.last_run()
    assert stats is not None and stats.errors == 0  # every answer parsed as JSON
    labels = ["positive", "negative", "mixed"]
    classified = df.llm.classify(
        "What is the tone of this review? {review_content}", labels, confidence=True, **opts
    )
    assert list(classified.index) == list(df.index)
    assert set(classified["label"]) <= set(labels)
    conf = classified["label_confidence"]
    assert ((conf > 0) & (conf <= 1)).all()


def test_our_scheduler_decides_admission_order(opts: dict[str, Any], trace: Path) -> None:
    """A small relQuery that arrives after a large one is admitted before most of it:
    the waiting queue is ordered by RelServe, not by arrival (FCFS would admit every
    request of the large relQuery first)."""
    from semframe.backends import aio as _aio
    from semframe.backends import get_backend
    from semframe.backends.base import Request
    from semframe.config import config

    cfg = config(**{k: v for k, v in opts.items() if k != "max_tokens"})
    backend: Any = get_backend("vllm", model=None, settings=cfg)
    before = len(_admissions(trace)) if trace.exists() else 0
    big = [
        Request(
            i,
            i,
            f"Write a long story about dragon number {i}.",
            None,
            48,
            0.0,
            None,
            i,
            rel="big",
            rel_size=6,
        )
        for i in range(6)
    ]
    small = [
        Request(10 + i, i, f"Say hello {i}.", None, 4, 0.0, None, i, rel="small", rel_size=2)
        for i in range(2)
    ]

    async def run() -> list[Any]:
        first = [asyncio.ensure_future(backend.acomplete(r)) for r in big]
        await asyncio.sleep(0.5)  # the big relQuery is queued first
        second = [asyncio.ensure_future(backend.acomplete(r)) for r in small]
        return list(await asyncio.gather(*first, *second))

    answers = _aio.run(run())
    assert len(answers) == 8
    order = [rel for _, rel, _ in _admissions(trace)[before:]]
    assert sorted(order) == ["big"] * 6 + ["small"] * 2
    last_small = max(i for i, rel in enumerate(order) if rel == "small")
    big_after = sum(1 for rel in order[last_small:] if rel == "big")
    assert big_after >= 2, order  # big requests that arrived earlier were admitted later
    sizes = {rel: size for _, rel, size in _admissions(trace)[before:]}
    assert sizes == {"big": 6, "small": 2}  # relQuery size reached the scheduler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    port = _free_port()
    trace = tmp_path_factory.mktemp("serve") / "trace.jsonl"
    log = trace.with_suffix(".log")
    cmd = [
        sys.executable, "-m", "semframe.cli", "serve",
        "--scheduler", "k-lpm", "--port", str(port), "--max-model-len", "2048",
        "--kv-cache-gib", "1", "--trace", str(trace), "--vllm-arg=--max-num-seqs=4",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 420
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"semframe serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"semframe serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield url, trace
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_runs_our_scheduler_and_reports_cached_tokens(server: tuple[str, Path]) -> None:
    url, trace = server
    df = _reviews(6)
    out = df.llm.map(
        "Movie: {movie_title}. {movie_info} In five words: {review_content}",
        backend="vllm",
        base_url=url,
        model="smollm2-135m",
        cache=False,
        max_tokens=16,
        truncated="keep",  # one request per row: cut answers are kept, not re-asked
    )
    assert list(out.index) == list(df.index)
    stats = semframe.last_run()
    assert stats is not None and stats.errors == 0
    assert stats.cached_tokens > 0  # usage.prompt_tokens_details from the server
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {r["policy"] for r in records} == {"k-lpm"}
    admitted = [a for r in records for a in r["admitted"]]
    assert len(admitted) >= len(df)
    # the relQuery's identity and size came through the request body's vllm_xargs
    assert {a[2] for a in admitted} == {len(df)}
    assert len({a[1] for a in admitted}) == 1
