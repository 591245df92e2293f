"""The emulator's OpenAI Chat Completions endpoint, through the official SDK."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema

from semframe.cost.cachesim import OpenAIRules, openai_cached_grid
from semframe.cost.pricing import price_for
from semframe.testing.emulator import Latency, ManualClock, ProviderEmulator, openai_prompt_tokens

MODEL = "gpt-4.1-mini"
SHARED = "Instructions: " + " ".join(f"rule{i} applies." for i in range(600)) + "\n"


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderEmulator]:
    with ProviderEmulator(latency=Latency(0)) as emu:
        yield emu


@pytest.fixture
def emu(server: ProviderEmulator) -> ProviderEmulator:
    server.reset()
    return server


@pytest.fixture
def client(server: ProviderEmulator) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0) as c:
        yield c


def _msgs(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_completion_shape_and_usage(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=_msgs("Say hi"), temperature=0)
    assert r.object == "chat.completion"
    assert r.model == MODEL
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(openai_prompt_tokens(_msgs("Say hi")))
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.usage.completion_tokens > 0


def test_answers_are_deterministic(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    a = client.chat.completions.create(model=MODEL, messages=_msgs("Tell me about Alien"))
    b = client.chat.completions.create(model=MODEL, messages=_msgs("Tell me about Alien"))
    assert a.choices[0].message.content == b.choices[0].message.content


def test_below_minimum_never_cached(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    text = " ".join(["short"] * 500)
    assert len(openai_prompt_tokens(_msgs(text))) < 1024
    for _ in range(3):
        r = client.chat.completions.create(model=MODEL, messages=_msgs(text))
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_shared_prefix_hits_on_128_grid(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    first, second = _msgs(SHARED + "Row: Alien, 1979."), _msgs(SHARED + "Row: Heat, 1995.")
    r1 = client.chat.completions.create(model=MODEL, messages=first, prompt_cache_key="g")
    r2 = client.chat.completions.create(model=MODEL, messages=second, prompt_cache_key="g")
    common = _common(openai_prompt_tokens(first), openai_prompt_tokens(second))
    assert common >= 1024
    assert r1.usage is not None and r2.usage is not None
    assert r1.usage.prompt_tokens_details is not None and r2.usage.prompt_tokens_details is not None
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached == openai_cached_grid(common)
    assert (cached - 1024) % 128 == 0


def test_billing_matches_price_table(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    for row in ("a", "b"):
        client.chat.completions.create(model=MODEL, messages=_msgs(SHARED + row))
    price = price_for(MODEL)
    expected = 0.0
    for e in emu.ledger.entries():
        expected += (e.prompt_tokens - e.cached_tokens) * price.input / 1e6
        expected += e.cached_tokens * price.cache_read / 1e6
        expected += e.output_tokens * price.output / 1e6
    totals = emu.ledger.totals()
    assert totals.requests == 2
    assert totals.cached_tokens > 0
    assert totals.dollars == pytest.approx(expected, rel=1e-12)
    assert totals.cache_write_tokens == 0  # writes are free on OpenAI


def test_ttl_expiry_with_manual_clock() -> None:
    clock = ManualClock()
    rules = OpenAIRules(ttl_s=300.0)
    with (
        ProviderEmulator(latency=Latency(0), clock=clock, openai_rules=rules) as emu,
        openai.OpenAI(base_url=emu.openai_url, api_key="k", max_retries=0) as client,
    ):

        def cached(text: str) -> int:
            r = client.chat.completions.create(model=MODEL, messages=_msgs(text))
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            return r.usage.prompt_tokens_details.cached_tokens or 0

        assert cached(SHARED + "1") == 0
        clock.advance(299)
        assert cached(SHARED + "2") > 0  # refreshes the entry
        clock.advance(299)
        assert cached(SHARED + "3") > 0
        clock.advance(301)
        assert cached(SHARED + "4") == 0  # idle longer than the TTL


def test_concurrent_first_requests_all_miss() -> None:
    with ProviderEmulator(latency=Latency(fixed_s=0.4)) as emu:
        results: list[int] = []
        lock = threading.Lock()
        barrier = threading.Barrier(4)

        def one(i: int) -> None:
            with openai.OpenAI(base_url=emu.openai_url, api_key="k", max_retries=0) as c:
                barrier.wait()
                r = c.chat.completions.create(model=MODEL, messages=_msgs(SHARED + str(i)))
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            with lock:
                results.append(r.usage.prompt_tokens_details.cached_tokens or 0)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [0, 0, 0, 0]
        with openai.OpenAI(base_url=emu.openai_url, api_key="k", max_retries=0) as c:
            r = c.chat.completions.create(model=MODEL, messages=_msgs(SHARED + "late"))
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        assert (r.usage.prompt_tokens_details.cached_tokens or 0) > 0


def test_json_schema_answer_and_max_tokens(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    fmt: ResponseFormatJSONSchema = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": schema, "strict": True},
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=_msgs("Is Alien good?"),
        response_format=fmt,
    )
    content = r.choices[0].message.content
    assert content is not None
    assert json.loads(content)["answer"] in ("yes", "no")
    cut = client.chat.completions.create(
        model=MODEL, messages=_msgs("Summarize: a long story about a ship"), max_completion_tokens=2
    )
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 2


def test_prompt_cache_key_is_recorded(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=_msgs("x"), prompt_cache_key="group-7")
    assert emu.ledger.entries()[0].prompt_cache_key == "group-7"


def test_unknown_model_is_404(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="no-such-model"):
        client.chat.completions.create(model="no-such-model", messages=_msgs("x"))
    with pytest.raises(openai.NotFoundError, match="anthropic model"):
        client.chat.completions.create(model="claude-sonnet-4-5", messages=_msgs("x"))


def test_bad_request_is_400(emu: ProviderEmulator, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="non-empty list"):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=_msgs("x"), temperature=5)


def test_wrong_key_is_401() -> None:
    with (
        ProviderEmulator(latency=Latency(0), api_keys={"good"}) as emu,
        openai.OpenAI(base_url=emu.openai_url, api_key="bad", max_retries=0) as client,
    ):
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(model=MODEL, messages=_msgs("x"))
        assert info.value.status_code == 401
        assert info.value.code == "invalid_api_key"


def test_missing_key_is_401(emu: ProviderEmulator) -> None:
    import httpx

    with httpx.Client() as http:
        r = http.post(f"{emu.openai_url}/chat/completions", json={"model": MODEL})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
