"""The emulator's Gemini API, through the official ``google-genai`` SDK and raw HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from semframe.cost.framing import gemini_content_tokens, gemini_prompt_tokens
from semframe.cost.pricing import price_for
from semframe.testing.emulator import Fault, Latency, ManualClock, ProviderEmulator

MODEL = "gemini-2.5-flash"
SHARED = "Instructions: " + " ".join(f"rule{i} applies." for i in range(800)) + "\n"  # ~3,200
PER = 1_000_000


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def server(clock: ManualClock) -> Iterator[ProviderEmulator]:
    with ProviderEmulator(latency=Latency(0), clock=clock) as emu:
        yield emu


@pytest.fixture
def emu(server: ProviderEmulator) -> ProviderEmulator:
    server.reset()
    return server


@pytest.fixture
def client(server: ProviderEmulator) -> Iterator[genai.Client]:
    c = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server.gemini_url))
    yield c
    c.close()


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "parts": [{"text": text}]}]


def _cache(client: genai.Client, text: str = SHARED, **kw: Any) -> Any:
    config = types.CreateCachedContentConfig(
        contents=[types.Content(role="user", parts=[types.Part(text=text)])], **kw
    )
    return client.caches.create(model=kw.pop("model", MODEL), config=config)


def test_response_shape_and_usage(emu: ProviderEmulator, client: genai.Client) -> None:
    config = types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=50)
    r = client.models.generate_content(model=MODEL, contents="Say hi", config=config)
    assert r.text and r.text.startswith("Answer ")
    assert r.candidates is not None and r.candidates[0].finish_reason == types.FinishReason.STOP
    usage = r.usage_metadata
    assert usage is not None
    system = {"parts": [{"text": "Be brief."}]}
    assert usage.prompt_token_count == len(gemini_prompt_tokens(system, _user("Say hi")))
    assert usage.cached_content_token_count is None
    # countTokens counts the text alone: one token fewer than generateContent reports
    counted = client.models.count_tokens(model=MODEL, contents="Say hi")
    assert counted.total_tokens == len(gemini_content_tokens(None, _user("Say hi")))
    assert counted.total_tokens == usage.prompt_token_count - 3 - 1  # "Be brief." is 3
    entry = emu.ledger.entries()[0]
    assert (entry.provider, entry.model, entry.status) == ("gemini", MODEL, 200)


def test_max_output_tokens_cuts_the_answer(emu: ProviderEmulator, client: genai.Client) -> None:
    config = types.GenerateContentConfig(max_output_tokens=2)
    r = client.models.generate_content(model=MODEL, contents="Tell me a story", config=config)
    assert r.candidates is not None
    assert r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert r.usage_metadata is not None and r.usage_metadata.candidates_token_count == 2


def test_json_schema_answers(emu: ProviderEmulator, client: genai.Client) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}}
    config = types.GenerateContentConfig(
        response_mime_type="application/json", response_json_schema=schema
    )
    r = client.models.generate_content(model=MODEL, contents="Good?", config=config)
    assert r.parsed in ({"answer": "yes"}, {"answer": "no"}) or r.text in (
        '{"answer": "yes"}',
        '{"answer": "no"}',
    )


def test_implicit_cache_hits_after_the_first_answer(
    emu: ProviderEmulator, client: genai.Client
) -> None:
    first = client.models.generate_content(model=MODEL, contents=SHARED + "Row: Alien")
    second = client.models.generate_content(model=MODEL, contents=SHARED + "Row: Heat")
    assert first.usage_metadata is not None and second.usage_metadata is not None
    assert not first.usage_metadata.cached_content_token_count
    cached = second.usage_metadata.cached_content_token_count
    shared = len(gemini_content_tokens(None, _user(SHARED)))
    assert cached is not None and 2048 <= cached <= shared
    assert (cached - 2048) % 128 == 0  # hits on the 2,048 + 128 k grid
    bill = emu.ledger.entries()[1]
    price = price_for(MODEL)
    assert bill.cost.cached_input == pytest.approx(cached * price.cache_read / PER)
    # 3 Pro Preview caches from 4,096 tokens: not this ~3,200-token prefix
    for text in ("a", "b"):
        r = client.models.generate_content(model="gemini-3-pro-preview", contents=SHARED + text)
        assert r.usage_metadata is not None and not r.usage_metadata.cached_content_token_count


def test_explicit_cache_billed_for_creation_and_storage(
    emu: ProviderEmulator, client: genai.Client
) -> None:
    cache = _cache(client, ttl="600s", system_instruction="Be brief.")
    assert cache.name is not None and cache.name.startswith("cachedContents/")
    assert cache.usage_metadata is not None
    tokens = cache.usage_metadata.total_token_count
    system = {"parts": [{"text": "Be brief."}]}
    assert tokens == len(gemini_content_tokens(system, _user(SHARED)))
    (entry,) = emu.ledger.entries()
    assert entry.kind == "cache" and emu.ledger.totals().requests == 0
    assert entry.cache_write_1h_tokens == tokens  # TTLs over 5 minutes are filed under 1h
    # creation at $0.30 and 10 minutes of storage at $1.00 per million per hour
    assert entry.cost.cache_writes == pytest.approx(tokens * (0.30 + 1.00 / 6) / PER)
    r = client.models.generate_content(
        model=MODEL,
        contents="Row: Alien",
        config=types.GenerateContentConfig(cached_content=cache.name),
    )
    assert r.usage_metadata is not None
    assert r.usage_metadata.cached_content_token_count == tokens
    assert r.usage_metadata.prompt_token_count == tokens + 4  # "Row: Alien" 3, +1
    assert client.caches.get(name=cache.name).name == cache.name
    client.caches.delete(name=cache.name)
    with pytest.raises(errors.ClientError) as info:
        client.caches.get(name=cache.name)
    assert info.value.code == 403


def test_five_minute_cache_priced_as_the_table_says(
    emu: ProviderEmulator, client: genai.Client
) -> None:
    cache = _cache(client, ttl="300s")
    assert cache.usage_metadata is not None
    tokens = cache.usage_metadata.total_token_count or 0
    (entry,) = emu.ledger.entries()
    assert entry.cache_write_5m_tokens == tokens
    assert entry.cost.cache_writes == pytest.approx(tokens * price_for(MODEL).cache_write_5m / PER)


def test_explicit_cache_expires_with_its_ttl(
    emu: ProviderEmulator, client: genai.Client, clock: ManualClock
) -> None:
    cache = _cache(client, ttl="300s")
    clock.advance(301)
    with pytest.raises(errors.ClientError) as info:
        client.models.generate_content(
            model=MODEL, contents="x", config=types.GenerateContentConfig(cached_content=cache.name)
        )
    assert info.value.code == 403
    assert "CachedContent not found" in str(info.value.message)


def test_explicit_cache_rules(emu: ProviderEmulator, client: genai.Client) -> None:
    with pytest.raises(errors.ClientError, match="too small") as info:
        _cache(client, text="short")
    assert info.value.code == 400
    cache = _cache(client)
    with pytest.raises(errors.ClientError, match="system_instruction"):
        client.models.generate_content(
            model=MODEL,
            contents="x",
            config=types.GenerateContentConfig(cached_content=cache.name, system_instruction="s"),
        )
    with pytest.raises(errors.ClientError, match="has to be the same"):
        client.models.generate_content(
            model="gemini-2.5-pro",
            contents="x",
            config=types.GenerateContentConfig(cached_content=cache.name),
        )


def test_batch_of_inline_requests(emu: ProviderEmulator, client: genai.Client) -> None:
    src = [
        types.InlinedRequest(contents=SHARED + f"Row {i}", metadata={"key": f"r{i}"})
        for i in range(3)
    ]
    job = client.batches.create(model=MODEL, src=src)
    assert job.name is not None and job.state == types.JobState.JOB_STATE_PENDING
    done = client.batches.get(name=job.name)
    assert done.state == types.JobState.JOB_STATE_SUCCEEDED
    assert done.dest is not None and done.dest.inlined_responses is not None
    keys = [r.metadata["key"] for r in done.dest.inlined_responses if r.metadata]
    assert keys == ["r0", "r1", "r2"]
    entries = emu.ledger.entries()
    assert [e.batch for e in entries] == [True] * 3
    assert entries[1].cached_tokens > 0  # batch lines share the implicit cache
    price = price_for(MODEL)
    e = entries[1]
    assert e.cost.uncached_input == pytest.approx(
        (e.prompt_tokens - e.cached_tokens) * price.input * 0.5 / PER
    )
    assert e.cost.cached_input == pytest.approx(e.cached_tokens * price.cache_read / PER)


def test_batch_line_errors(emu: ProviderEmulator, client: genai.Client) -> None:
    emu.faults.inject(Fault.rate_limit(), when=lambda p: "Row 1" in p)
    src = [types.InlinedRequest(contents=f"Row {i}", metadata={"key": f"r{i}"}) for i in range(3)]
    job = client.batches.create(model=MODEL, src=src)
    assert job.name is not None
    done = client.batches.get(name=job.name)
    assert done.dest is not None and done.dest.inlined_responses is not None
    errored = [r for r in done.dest.inlined_responses if r.error is not None]
    assert len(errored) == 1 and errored[0].error is not None and errored[0].error.code == 429
    assert errored[0].metadata == {"key": "r1"}


def test_batch_delay_and_cancel(emu: ProviderEmulator, client: genai.Client) -> None:
    emu.batch_polls = 1
    try:
        job = client.batches.create(model=MODEL, src=[types.InlinedRequest(contents="hi")])
        assert job.name is not None
        assert client.batches.get(name=job.name).state == types.JobState.JOB_STATE_RUNNING
        client.batches.cancel(name=job.name)
        assert client.batches.get(name=job.name).state == types.JobState.JOB_STATE_CANCELLED
    finally:
        emu.batch_polls = 0
    assert emu.ledger.totals().requests == 0


def test_faults_apply_to_gemini(emu: ProviderEmulator, client: genai.Client) -> None:
    rule = emu.faults.inject(Fault.rate_limit(retry_after=2.0), count=1, provider="gemini")
    with pytest.raises(errors.ClientError) as info:
        client.models.generate_content(model=MODEL, contents="hi")
    assert info.value.code == 429 and info.value.status == "RESOURCE_EXHAUSTED"
    assert info.value.response.headers["retry-after"] == "2"
    assert rule.fired == 1
    emu.faults.inject(Fault.overloaded(), count=1)
    with pytest.raises(errors.ServerError) as server:
        client.models.generate_content(model=MODEL, contents="hi")
    assert server.value.code == 503  # Google has no 529
    emu.faults.inject(Fault.empty(), count=1)
    assert client.models.generate_content(model=MODEL, contents="hi").text in (None, "")
    assert [e.status for e in emu.ledger.entries()] == [429, 503, 200]


def test_errors_in_googles_json(emu: ProviderEmulator) -> None:
    url = f"{emu.gemini_url}/v1beta/models/{MODEL}:generateContent"
    r = httpx.post(url, json={"contents": _user("hi")})
    assert r.status_code == 403
    assert r.json()["error"]["status"] == "PERMISSION_DENIED"
    headers = {"x-goog-api-key": "k"}
    r = httpx.post(url.replace(MODEL, "gpt-4o"), json={"contents": _user("hi")}, headers=headers)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"code", "message", "status"}
    r = httpx.post(url, json={"contents": []}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    # ?key= works too, and /v1beta at the root is Gemini's
    root = f"{emu.base_url}/v1beta/models/{MODEL}:generateContent?key=k"
    assert httpx.post(root, json={"contents": _user("hi")}).status_code == 200


def test_a_wrong_key_is_answered_as_google_does() -> None:
    with ProviderEmulator(latency=Latency(0), api_keys={"good"}) as emu:
        url = f"{emu.gemini_url}/v1beta/models/{MODEL}:generateContent"
        r = httpx.post(url, json={"contents": _user("hi")}, headers={"x-goog-api-key": "bad"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["details"][0]["reason"] == "API_KEY_INVALID"
