"""Every injected fault, as the official SDKs see it (SDK retries disabled)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import anthropic
import openai
import pytest

from semframe.testing.emulator import Fault, FaultPlan, Latency, ProviderEmulator

OPENAI_MODEL = "gpt-4o-mini"
CLAUDE = "claude-test"
PRICES = {CLAUDE: {"provider": "anthropic", "input": 1.0, "output": 5.0}}


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderEmulator]:
    with ProviderEmulator(latency=Latency(0), prices=PRICES) as emu:
        yield emu


@pytest.fixture
def emu(server: ProviderEmulator) -> ProviderEmulator:
    server.reset()
    return server


@pytest.fixture
def oai(server: ProviderEmulator) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_url, api_key="k", max_retries=0, timeout=5) as c:
        yield c


@pytest.fixture
def claude(server: ProviderEmulator) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=server.anthropic_url, api_key="k", max_retries=0, timeout=5
    ) as c:
        yield c


def _ask_openai(client: openai.OpenAI, text: str = "hi") -> str | None:
    r = client.chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": text}]
    )
    return r.choices[0].message.content


def _ask_claude(client: anthropic.Anthropic, text: str = "hi") -> str:
    r = client.messages.create(
        model=CLAUDE, max_tokens=16, messages=[{"role": "user", "content": text}]
    )
    block = r.content[0]
    assert block.type == "text"
    return block.text


def test_rate_limit_with_retry_after(
    emu: ProviderEmulator, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    emu.faults.inject(Fault.rate_limit(2.5), count=1, provider="openai")
    with pytest.raises(openai.RateLimitError) as info:
        _ask_openai(oai)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "2.5"
    assert info.value.response.headers["retry-after-ms"] == "2500"
    assert info.value.code == "rate_limit_exceeded"
    assert _ask_openai(oai)  # count=1: the next request succeeds

    emu.faults.inject(Fault.rate_limit(1.0), count=1)
    with pytest.raises(anthropic.RateLimitError) as ainfo:
        _ask_claude(claude)
    assert ainfo.value.response.headers["retry-after"] == "1"
    assert ainfo.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    t = emu.ledger.totals()
    assert (t.requests, t.failed) == (3, 2)
    assert all(e.dollars == 0 for e in emu.ledger.entries() if e.status != 200)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors(
    emu: ProviderEmulator, oai: openai.OpenAI, claude: anthropic.Anthropic, status: int
) -> None:
    emu.faults.inject(Fault.server_error(status), count=2)
    with pytest.raises(openai.InternalServerError) as info:
        _ask_openai(oai)
    assert info.value.status_code == status
    with pytest.raises(anthropic.InternalServerError) as ainfo:
        _ask_claude(claude)
    assert ainfo.value.status_code == status
    assert ainfo.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_overloaded_529(emu: ProviderEmulator, claude: anthropic.Anthropic) -> None:
    emu.faults.inject(Fault.overloaded(), count=1)
    with pytest.raises(anthropic.OverloadedError) as info:
        _ask_claude(claude)
    assert info.value.status_code == 529


def test_hang_triggers_client_timeout(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.hang(3.0), count=2)
    with openai.OpenAI(base_url=emu.openai_url, api_key="k", max_retries=0, timeout=0.3) as c:
        start = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            _ask_openai(c)
        assert time.monotonic() - start < 2.0
    with (
        anthropic.Anthropic(
            base_url=emu.anthropic_url, api_key="k", max_retries=0, timeout=0.3
        ) as a,
        pytest.raises(anthropic.APITimeoutError),
    ):
        _ask_claude(a)


def test_malformed_body(
    emu: ProviderEmulator, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    # The SDKs surface an unparseable 200 body as the JSON decoder's ValueError.
    emu.faults.inject(Fault.malformed(), count=2)
    with pytest.raises(json.JSONDecodeError):
        _ask_openai(oai)
    with pytest.raises(json.JSONDecodeError):
        _ask_claude(claude)


def test_empty_answer(
    emu: ProviderEmulator, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    emu.faults.inject(Fault.empty(), count=2)
    assert _ask_openai(oai) == ""
    assert _ask_claude(claude) == ""
    assert all(e.output_tokens == 0 and e.fault == "empty" for e in emu.ledger.entries())


def test_connection_drop(
    emu: ProviderEmulator, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    emu.faults.inject(Fault.drop(), count=2)
    with pytest.raises(openai.APIConnectionError):
        _ask_openai(oai)
    with pytest.raises(anthropic.APIConnectionError):
        _ask_claude(claude)
    assert _ask_openai(oai)  # the client recovers on a new connection


def test_predicate_selects_prompts(emu: ProviderEmulator, oai: openai.OpenAI) -> None:
    rule = emu.faults.inject(Fault.server_error(503), when=lambda p: "Alien" in p)
    with pytest.raises(openai.InternalServerError):
        _ask_openai(oai, "Review of Alien")
    assert _ask_openai(oai, "Review of Heat")
    with pytest.raises(openai.InternalServerError):
        _ask_openai(oai, "Alien again")
    assert rule.fired == 2


def test_probability_is_seeded() -> None:
    def pattern(seed: int) -> list[bool]:
        plan = FaultPlan()
        plan.inject(Fault.server_error(500), probability=0.3, seed=seed)
        return [plan.pick("openai", "x") is not None for _ in range(200)]

    a, b = pattern(7), pattern(7)
    assert a == b
    assert 30 < sum(a) < 90
    assert pattern(8) != a


def test_latency_fixed_plus_per_token() -> None:
    with (
        ProviderEmulator(latency=Latency(fixed_s=0.2, per_output_token_s=0.01)) as emu,
        openai.OpenAI(base_url=emu.openai_url, api_key="k", max_retries=0) as c,
    ):
        start = time.monotonic()
        r = c.chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": "Summarize: x y z"}]
        )
        elapsed = time.monotonic() - start
        assert r.usage is not None
        expected = 0.2 + 0.01 * r.usage.completion_tokens
        assert elapsed >= expected
        e = emu.ledger.entries()[0]
        assert e.completion - e.arrival >= expected - 1e-6


def test_fault_arguments_are_checked(emu: ProviderEmulator) -> None:
    with pytest.raises(ValueError, match="count"):
        emu.faults.inject(Fault.empty(), count=0)
    with pytest.raises(ValueError, match="probability"):
        emu.faults.inject(Fault.empty(), probability=2.0)
    with pytest.raises(ValueError, match="status"):
        Fault.server_error(404)
