"""Batch round trips through the official SDKs' batch APIs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from semframe.cost.pricing import price_for
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

OPENAI_MODEL = "gpt-4.1-nano"
CLAUDE = "claude-haiku-4-5"
SHARED = "Instructions: " + " ".join(f"rule{i} applies." for i in range(600)) + "\n"


@pytest.fixture
def emu() -> Iterator[ProviderEmulator]:
    with ProviderEmulator(latency=Latency(0), batch_polls=1) as e:
        yield e


@pytest.fixture
def oai(emu: ProviderEmulator) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=emu.openai_url, api_key="k", max_retries=0) as c:
        yield c


@pytest.fixture
def claude(emu: ProviderEmulator) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=emu.anthropic_url, api_key="k", max_retries=0) as c:
        yield c


def _line(custom_id: str, text: str) -> bytes:
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": text}]}
    obj = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(obj).encode() + b"\n"


def _upload(client: openai.OpenAI, data: bytes) -> str:
    f = client.files.create(file=("in.jsonl", data), purpose="batch")
    assert f.purpose == "batch"
    assert client.files.retrieve(f.id).bytes == len(data)
    return f.id


def test_openai_batch_round_trip(emu: ProviderEmulator, oai: openai.OpenAI) -> None:
    rows = {f"row-{i}": SHARED + f"Row {i}" for i in range(4)}
    emu.faults.inject(Fault.server_error(500), when=lambda p: p.endswith("Row 2"))
    file_id = _upload(oai, b"".join(_line(k, v) for k, v in rows.items()))
    batch = oai.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    assert oai.batches.retrieve(batch.id).status == "in_progress"  # batch_polls=1
    done = oai.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    assert done.output_file_id is not None and done.error_file_id is not None

    out = [json.loads(x) for x in oai.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == ["row-0", "row-1", "row-3"]
    assert all(o["response"]["status_code"] == 200 for o in out)
    cached = [o["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for o in out]
    assert cached[0] == 0 and min(cached[1:]) > 0  # lines run in order and share the cache
    err = [json.loads(x) for x in oai.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in err] == ["row-2"]
    assert err[0]["response"]["status_code"] == 500
    assert "error" in err[0]["response"]["body"]

    p = price_for(OPENAI_MODEL)
    billed = [e for e in emu.ledger.entries() if e.status == 200]
    assert all(e.batch for e in billed)
    expected = sum(
        ((e.prompt_tokens - e.cached_tokens) * p.input + e.cached_tokens * p.cache_read
         + e.output_tokens * p.output) * 0.5 / 1e6
        for e in billed
    )  # fmt: skip
    assert emu.ledger.totals().dollars == pytest.approx(expected, rel=1e-12)
    assert {e.custom_id for e in billed} == {"row-0", "row-1", "row-3"}


def test_openai_batch_cancel(emu: ProviderEmulator, oai: openai.OpenAI) -> None:
    file_id = _upload(oai, _line("a", "x"))
    batch = oai.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert oai.batches.cancel(batch.id).status == "cancelling"
    assert oai.batches.retrieve(batch.id).status == "cancelled"
    assert emu.ledger.totals().requests == 0
    with pytest.raises(openai.BadRequestError):
        oai.batches.cancel(batch.id)


def test_openai_batch_invalid_input_fails(oai: openai.OpenAI) -> None:
    file_id = _upload(oai, _line("dup", "x") + _line("dup", "y"))
    batch = oai.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    assert batch.errors.data[0].code == "duplicate_custom_id"
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve("batch_missing")


def _params(text: str) -> dict[str, Any]:
    return {
        "model": CLAUDE,
        "max_tokens": 32,
        "system": [{"type": "text", "text": SHARED * 3, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": text}],
    }


def test_anthropic_batch_round_trip(emu: ProviderEmulator, claude: anthropic.Anthropic) -> None:
    requests: Any = [{"custom_id": f"r{i}", "params": _params(f"Row {i}")} for i in range(3)]
    requests.append({"custom_id": "bad", "params": {"model": CLAUDE, "messages": []}})
    batch = claude.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress"
    assert claude.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    done = claude.messages.batches.retrieve(batch.id)
    assert done.processing_status == "ended"
    assert (done.request_counts.succeeded, done.request_counts.errored) == (3, 1)
    results = {r.custom_id: r.result for r in claude.messages.batches.results(batch.id)}
    assert set(results) == {"r0", "r1", "r2", "bad"}
    assert results["bad"].type == "errored"
    usages = []
    for cid in ("r0", "r1", "r2"):
        res = results[cid]
        assert res.type == "succeeded"
        usages.append(res.message.usage)
    assert (usages[0].cache_creation_input_tokens or 0) >= 4096  # Haiku 4.5 minimum reached
    assert usages[1].cache_read_input_tokens == usages[0].cache_creation_input_tokens
    billed = [e for e in emu.ledger.entries() if e.status == 200]
    p = price_for(CLAUDE)
    expected = sum(
        (e.uncached_tokens * p.input + e.cached_tokens * p.cache_read
         + e.cache_write_5m_tokens * p.cache_write_5m + e.output_tokens * p.output) * 0.5 / 1e6
        for e in billed
    )  # fmt: skip
    assert emu.ledger.totals().dollars == pytest.approx(expected, rel=1e-12)


def test_anthropic_batch_cancel(emu: ProviderEmulator, claude: anthropic.Anthropic) -> None:
    batch = claude.messages.batches.create(requests=[{"custom_id": "a", "params": _params("x")}])  # type: ignore[typeddict-item]
    assert claude.messages.batches.cancel(batch.id).processing_status == "canceling"
    ended = claude.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.request_counts.canceled == 1
    assert [r.result.type for r in claude.messages.batches.results(batch.id)] == ["canceled"]
    assert emu.ledger.totals().requests == 0
