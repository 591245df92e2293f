"""The emulator's Anthropic Messages endpoint, through the official SDK."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from semframe.cost.pricing import price_for
from semframe.testing.emulator import Latency, ManualClock, ProviderEmulator, anthropic_blocks

# The SDK warns that claude-sonnet-4-5 is deprecated (and pytest turns warnings into
# errors), so the tests use a Sonnet-priced model of their own, added as a user price.
MODEL = "claude-test-sonnet"
PRICES = {
    MODEL: {
        "provider": "anthropic",
        "input": 3.0,
        "cache_write_5m": 3.75,
        "cache_write_1h": 6.0,
        "cache_read": 0.30,
        "output": 15.0,
        "min_cacheable_tokens": 1024,
    }
}
SHARED = "Instructions: " + " ".join(f"rule{i} applies." for i in range(600)) + "\n"


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderEmulator]:
    with ProviderEmulator(latency=Latency(0), prices=PRICES) as emu:
        yield emu


@pytest.fixture
def emu(server: ProviderEmulator) -> ProviderEmulator:
    server.reset()
    return server


@pytest.fixture
def client(server: ProviderEmulator) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.anthropic_url, api_key="k", max_retries=0) as c:
        yield c


def _block(text: str, ttl: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if ttl is not None:
        block["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return block


def _user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def _send(client: anthropic.Anthropic, messages: Any, system: Any = None, **kw: Any) -> Any:
    extra = {"system": system} if system is not None else {}
    return client.messages.create(
        model=kw.pop("model", MODEL), max_tokens=kw.pop("max_tokens", 64), messages=messages,
        **extra, **kw,
    )  # fmt: skip


def test_message_shape_and_usage(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    r = _send(client, [{"role": "user", "content": "Say hi"}], system="Be brief.")
    assert r.type == "message"
    assert r.role == "assistant"
    assert r.stop_reason == "end_turn"
    assert r.content[0].type == "text"
    blocks = anthropic_blocks("Be brief.", [{"role": "user", "content": "Say hi"}])
    assert r.usage.input_tokens == sum(len(b.tokens) for b in blocks)
    assert r.usage.cache_read_input_tokens == 0
    assert r.usage.cache_creation_input_tokens == 0


def test_breakpoint_writes_then_reads(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    system = [_block(SHARED, "5m")]
    r1 = _send(client, _user(_block("Row: Alien")), system=system)
    r2 = _send(client, _user(_block("Row: Heat")), system=system)
    written = r1.usage.cache_creation_input_tokens
    assert written >= 1024
    assert r1.usage.cache_creation.ephemeral_5m_input_tokens == written
    assert r1.usage.cache_read_input_tokens == 0
    assert r2.usage.cache_read_input_tokens == written
    assert r2.usage.cache_creation_input_tokens == 0
    total = sum(len(b.tokens) for b in anthropic_blocks(system, _user(_block("Row: Heat"))))
    assert r2.usage.input_tokens == total - written


def test_below_minimum_not_cached_and_no_error(
    emu: ProviderEmulator, client: anthropic.Anthropic
) -> None:
    short = [_block("Short instructions.", "5m")]
    for _ in range(2):
        r = _send(client, _user(_block("Row")), system=short)
        assert r.usage.cache_creation_input_tokens == 0
        assert r.usage.cache_read_input_tokens == 0
    # Haiku 4.5 needs 4,096 tokens: the same ~1,800-token prefix is not cached there.
    for _ in range(2):
        r = _send(client, _user(_block("Row")), system=[_block(SHARED, "5m")],
                  model="claude-haiku-4-5")  # fmt: skip
        assert r.usage.cache_creation_input_tokens == 0
        assert r.usage.cache_read_input_tokens == 0


def test_two_breakpoints_split_ttls(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    group = "movie_title: Alien\nmovie_info: " + "A crew meets a creature. " * 20
    r = _send(client, _user(_block(group, "5m"), _block("review: great")),
              system=[_block(SHARED, "1h")])  # fmt: skip
    c = r.usage.cache_creation
    assert c.ephemeral_1h_input_tokens > 1024
    assert c.ephemeral_5m_input_tokens > 0
    assert r.usage.cache_creation_input_tokens == (
        c.ephemeral_1h_input_tokens + c.ephemeral_5m_input_tokens
    )
    # Same group, other review: reads both segments.
    r2 = _send(client, _user(_block(group, "5m"), _block("review: awful")),
               system=[_block(SHARED, "1h")])  # fmt: skip
    assert r2.usage.cache_read_input_tokens == r.usage.cache_creation_input_tokens
    # Other group: reads the instructions, writes the new group prefix.
    r3 = _send(client, _user(_block("movie_title: Heat\n", "5m"), _block("review: ok")),
               system=[_block(SHARED, "1h")])  # fmt: skip
    assert r3.usage.cache_read_input_tokens == c.ephemeral_1h_input_tokens
    assert r3.usage.cache_creation.ephemeral_5m_input_tokens > 0


def test_more_than_four_breakpoints_is_400(
    emu: ProviderEmulator, client: anthropic.Anthropic
) -> None:
    blocks = [_block(f"part {i}", "5m") for i in range(5)]
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks") as info:
        _send(client, _user(*blocks))
    assert info.value.status_code == 400
    assert emu.ledger.totals().requests == 0


def test_1h_after_5m_is_400(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="1h"):
        _send(client, _user(_block("a", "5m"), _block("b", "1h")))


def test_lookback_reaches_20_blocks(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    """A prefix cached at block k is found from a breakpoint < 20 blocks later, not further."""
    head = _block(SHARED, "5m")
    _send(client, _user(head))  # caches the prefix ending at block 0 (the system-less head)
    near = [_block(SHARED)] + [_block(f" f{i}") for i in range(18)] + [_block(" end", "5m")]
    r = _send(client, _user(*near))
    assert r.usage.cache_read_input_tokens > 1024  # block 0 is within the window (20 blocks)
    far = [_block(SHARED)] + [_block(f" g{i}") for i in range(19)] + [_block(" end", "5m")]
    r = _send(client, _user(*far))
    assert r.usage.cache_read_input_tokens == 0  # block 0 is 20 blocks back: out of the window


def test_ttl_expiry_and_refresh_with_manual_clock() -> None:
    clock = ManualClock()
    with (
        ProviderEmulator(latency=Latency(0), clock=clock, prices=PRICES) as emu,
        anthropic.Anthropic(base_url=emu.anthropic_url, api_key="k", max_retries=0) as client,
    ):
        system = [_block(SHARED, "5m")]

        def read() -> int:
            return int(
                _send(client, _user(_block("q")), system=system).usage.cache_read_input_tokens
            )

        assert read() == 0
        clock.advance(290)
        assert read() > 0  # refreshed
        clock.advance(290)
        assert read() > 0
        clock.advance(301)
        assert read() == 0  # expired, written again
        system = [_block(SHARED + "1h variant", "1h")]
        assert read() == 0
        clock.advance(3000)
        assert read() > 0
        clock.advance(3601)
        assert read() == 0


def test_concurrent_first_requests_all_miss() -> None:
    with ProviderEmulator(latency=Latency(fixed_s=0.4), prices=PRICES) as emu:
        reads: list[int] = []
        writes: list[int] = []
        lock = threading.Lock()
        barrier = threading.Barrier(3)

        def one(i: int) -> None:
            with anthropic.Anthropic(base_url=emu.anthropic_url, api_key="k", max_retries=0) as c:
                barrier.wait()
                r = _send(c, _user(_block(str(i))), system=[_block(SHARED, "5m")])
            with lock:
                reads.append(r.usage.cache_read_input_tokens)
                writes.append(r.usage.cache_creation_input_tokens)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert reads == [0, 0, 0]
        assert min(writes) > 1024  # each one paid for the write


def test_billing_with_writes_and_reads(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    for row in ("a", "b", "c"):
        _send(client, _user(_block(row)), system=[_block(SHARED, "5m")])
    p = price_for(MODEL, PRICES)
    expected = 0.0
    for e in emu.ledger.entries():
        expected += e.uncached_tokens * p.input + e.cached_tokens * p.cache_read
        expected += e.cache_write_5m_tokens * p.cache_write_5m + e.output_tokens * p.output
    t = emu.ledger.totals()
    assert t.dollars == pytest.approx(expected / 1e6, rel=1e-12)
    assert p.cache_write_5m == pytest.approx(1.25 * p.input)
    assert p.cache_read == pytest.approx(0.1 * p.input)


def test_count_tokens_matches_usage(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    msgs = _user(_block("Hello there"), _block(" and more"))
    n = client.messages.count_tokens(model=MODEL, messages=msgs, system="Sys").input_tokens  # type: ignore[arg-type]
    r = _send(client, msgs, system="Sys")
    assert n == r.usage.input_tokens


def test_max_tokens_cut_and_schema(emu: ProviderEmulator, client: anthropic.Anthropic) -> None:
    r = _send(client, _user(_block("Summarize: a long story about a ship")), max_tokens=2)
    assert r.stop_reason == "max_tokens"
    assert r.usage.output_tokens == 2
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}}
    r = _send(client, _user(_block("Is it good?")),
              extra_body={"output_format": {"type": "json_schema", "schema": schema}})  # fmt: skip
    assert json.loads(r.content[0].text)["answer"] in ("yes", "no")


def test_missing_max_tokens_is_400(emu: ProviderEmulator) -> None:
    import httpx

    with httpx.Client() as http:
        req = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        r = http.post(f"{emu.anthropic_url}/v1/messages", headers={"x-api-key": "k"}, json=req)
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"


def test_auth_errors() -> None:
    with (
        ProviderEmulator(latency=Latency(0), api_keys={"good"}, prices=PRICES) as emu,
        anthropic.Anthropic(base_url=emu.anthropic_url, api_key="bad", max_retries=0) as client,
    ):
        with pytest.raises(anthropic.AuthenticationError) as info:
            _send(client, _user(_block("x")))
        assert info.value.status_code == 401
        assert info.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            "request_id": info.value.body["request_id"],  # type: ignore[index]
        }
