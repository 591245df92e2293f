"""Adaptive rate limits: the provider's headers read, the run paced by them, 429s slow it down.

The providers report an account's rate limits in every response's headers and
refuse with a 429 when a bucket is short. These tests check each part on its
own (header parsing, the pacer's arithmetic on a fake clock, the emulator's
buckets) and then a whole run against the emulator with account limits: it
must slow down before the limit, not after a storm of 429s, and lose no row.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import anthropic
import openai
import pandas as pd
import pytest

import semframe
from semframe.backends._api import rate_limits
from semframe.core.wire import Completion, RateLimits, Usage
from semframe.runtime.pacing import Account, Mirror, Pacer, account_of
from semframe.testing.emulator import AccountLimits, Latency, ManualClock, ProviderEmulator
from semframe.testing.emulator.limits import LimitState, duration

KEY = "sk-test-limits-0123456789abcdef"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# -- reading the headers -------------------------------------------------------------


def test_openai_headers_are_read() -> None:
    seen = rate_limits(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "200000",
            "x-ratelimit-remaining-tokens": "199,000".replace(",", ""),
            "x-ratelimit-reset-tokens": "1m30.5s",
        }
    )
    assert seen == RateLimits(500, 499, 0.12, 200_000, 199_000, 90.5)


def test_anthropic_headers_are_read_against_the_response_date() -> None:
    seen = rate_limits(
        {
            "date": "Mon, 23 Nov 2026 12:00:00 GMT",
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "10",
            "anthropic-ratelimit-requests-reset": "2026-11-23T12:00:48Z",
            # no tokens-* family: the input-tokens one is read instead
            "anthropic-ratelimit-input-tokens-limit": "30000",
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": "2026-11-23T12:01:00.000Z",
        }
    )
    assert seen == RateLimits(50, 10, 48.0, 30_000, 0, 60.0)


def test_unreadable_headers_are_ignored() -> None:
    assert rate_limits(None) is None
    assert rate_limits({"x-ratelimit-remaining-requests": "lots"}) is None
    odd = rate_limits({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "?"})
    assert odd == RateLimits(requests_left=3)


# -- the pacer's arithmetic ----------------------------------------------------------


def _answer(prompt_tokens: int = 40) -> Completion:
    return Completion(0, "ok", Usage(prompt_tokens=prompt_tokens, output_tokens=10))


def test_mirror_refills_at_the_rate_the_reset_implies() -> None:
    pacer = Pacer(8, clock=(clock := FakeClock()), account=Account(clock))

    async def go() -> float:
        first = await pacer.acquire(10, max_tokens=0)
        await pacer.acquire(10, max_tokens=0)  # still in flight when the first answer is back
        seen = RateLimits(requests_limit=100, requests_left=1, requests_reset_s=99.0)
        await pacer.done(first, _answer(10), limits=seen)
        return pacer.account.delay(10)

    # 1 left less 1 in flight = 0; refill (100 - 1) / 99 s = 1 per second
    assert asyncio.run(go()) == pytest.approx(1.0)
    clock.t = 0.5
    assert pacer.account.delay(10) == pytest.approx(0.5)
    clock.t = 1.0
    assert pacer.account.delay(10) == 0.0


def test_token_mirror_counts_reservations_in_flight() -> None:
    pacer = Pacer(8, clock=(clock := FakeClock()), account=Account(clock))

    async def go() -> float:
        first = await pacer.acquire(250, max_tokens=50)
        await pacer.acquire(250, max_tokens=50)
        seen = RateLimits(tokens_limit=6000, tokens_left=500, tokens_reset_s=55.0)
        await pacer.done(first, _answer(250), limits=seen)
        return pacer.account.delay(300)

    # 500 left less the 300 still in flight = 200; 100 more come in 1 s (5500 / 55 s)
    assert asyncio.run(go()) == pytest.approx(1.0)


def test_reservations_learn_the_providers_count() -> None:
    """An estimate half the provider's count is doubled once answers report the count."""
    pacer = Pacer(8, clock=(clock := FakeClock()), account=Account(clock))

    async def go() -> tuple[int, int]:
        before = await pacer.acquire(100, max_tokens=20)
        await pacer.done(before, _answer(prompt_tokens=200))
        after = await pacer.acquire(100, max_tokens=20)
        return before.reserved, after.reserved

    assert asyncio.run(go()) == (120, 220)


def test_a_429_pauses_every_request_and_halves_the_window() -> None:
    pacer = Pacer(8, clock=(clock := FakeClock()), account=Account(clock))

    async def go() -> None:
        ticket = await pacer.acquire(10, max_tokens=0)
        await pacer.done(ticket, None, rate_limited=True, retry_after=2.5)

    asyncio.run(go())
    assert pacer.throttled == 1
    assert pacer.window == 4
    assert pacer.account.delay(10) == pytest.approx(2.5)
    clock.t = 2.5
    assert pacer.account.delay(10) == 0.0


def test_a_429_without_retry_after_backs_off_doubling() -> None:
    pacer = Pacer(8, clock=(clock := FakeClock()), account=Account(clock))

    async def refuse() -> None:
        ticket = await pacer.acquire(10, max_tokens=0)
        await pacer.done(ticket, None, rate_limited=True)

    pauses = []
    for _ in range(3):
        asyncio.run(refuse())
        pauses.append(pacer.account.paused_until - clock.t)
        clock.t = pacer.account.paused_until
    assert pauses == [1.0, 2.0, 4.0]
    assert pacer.window == 1


def test_the_window_grows_back_by_one_per_window_of_answers() -> None:
    pacer = Pacer(4, clock=(clock := FakeClock()), account=Account(clock))

    async def go() -> list[int]:
        for _ in range(2):
            ticket = await pacer.acquire(1, max_tokens=0)
            await pacer.done(ticket, None, rate_limited=True, retry_after=0.0)
        widths = [pacer.window]
        for _ in range(6):
            ticket = await pacer.acquire(1, max_tokens=0)
            await pacer.done(ticket, _answer())
            widths.append(pacer.window)
        return widths

    assert asyncio.run(go()) == [1, 2, 2, 3, 3, 3, 4]


def test_acquire_waits_for_the_window() -> None:
    async def go() -> list[str]:
        pacer = Pacer(1)
        order: list[str] = []

        async def second() -> None:
            await pacer.acquire(1, max_tokens=0)
            order.append("second sent")

        first = await pacer.acquire(1, max_tokens=0)
        task = asyncio.create_task(second())
        await asyncio.sleep(0.05)
        order.append("first answered")
        await pacer.done(first, _answer())
        await task
        return order

    assert asyncio.run(go()) == ["first answered", "second sent"]


def test_two_runs_on_one_backend_share_the_account() -> None:
    """The second run's requests count against what the first one's headers reported."""

    class Api: ...

    backend = Api()
    assert account_of(backend) is account_of(backend)
    clock = FakeClock()
    account = Account(clock)
    one, two = Pacer(4, account=account, clock=clock), Pacer(4, account=account, clock=clock)

    async def go() -> float:
        a = await one.acquire(10, max_tokens=0)
        await two.acquire(10, max_tokens=0)
        seen = RateLimits(requests_limit=60, requests_left=1, requests_reset_s=59.0)
        await one.done(a, _answer(10), limits=seen)
        return account.delay(10)  # 1 left, less run two's request in flight

    assert asyncio.run(go()) == pytest.approx(1.0)


def test_configured_token_reservations_are_settled_to_usage() -> None:
    pacer = Pacer(8, tpm=600, clock=(clock := FakeClock()), account=Account(clock))

    async def go() -> float:  # a 100-token burst, no refill (fake clock)
        ticket = await pacer.acquire(90, max_tokens=10)
        await pacer.done(ticket, _answer(prompt_tokens=40))  # used 40 + 10 of 100
        assert pacer.limiter is not None
        return pacer.limiter.wait_time(50)

    assert asyncio.run(go()) == 0.0


def test_mirror_wait_is_bounded_for_needs_above_the_limit() -> None:
    m = Mirror(limit=10, level=0, rate=1.0, at=0.0)
    assert m.wait(1000, now=0.0) == pytest.approx(10.0)


# -- the emulator's buckets ----------------------------------------------------------


def test_emulator_buckets_refill_continuously() -> None:
    clock = ManualClock()
    state = LimitState(AccountLimits(rpm=60, tpm=600), clock)
    assert state.admit(500) is None
    assert state.admit(200) == pytest.approx(10.0)  # 100 left, 100 more in 10 s
    clock.advance(10.0)
    assert state.admit(200) is None
    assert state.refused == 1
    headers = dict(state.headers("openai"))
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"] == "1m0s"
    assert headers["x-ratelimit-remaining-requests"] == "59"  # refilled to 60, one taken


def test_duration_format() -> None:
    assert [duration(s) for s in (0.0005, 0.25, 2.0, 61.5, 3600)] == [
        "1ms",
        "250ms",
        "2s",
        "1m1.5s",
        "60m0s",
    ]


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with ProviderEmulator(
        rate_limits=AccountLimits(rpm=120, tpm=1_000_000), latency=Latency(0.05)
    ) as emu:
        yield emu


def test_the_sdks_report_the_headers(limited: ProviderEmulator) -> None:
    with openai.OpenAI(base_url=limited.openai_url, api_key=KEY, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    seen = rate_limits(dict(raw.headers))
    assert seen is not None
    assert (seen.requests_limit, seen.requests_left) == (120, 119)
    with anthropic.Anthropic(base_url=limited.base_url, api_key=KEY, max_retries=0) as aclient:
        araw = aclient.messages.with_raw_response.create(
            model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    seen = rate_limits(dict(araw.headers))
    assert seen is not None
    assert (seen.requests_limit, seen.requests_left) == (120, 118)
    assert seen.requests_reset_s is not None and 0 < seen.requests_reset_s <= 2.0


# -- a whole run ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_a_run_slows_down_before_the_limit(limited: ProviderEmulator, backend: str) -> None:
    """130 rows against 120 requests a minute: the last 10 wait for the refill, few 429s."""
    rows = 130
    df = pd.DataFrame({"item": [f"item {i}" for i in range(rows)]}, index=range(100, 100 + rows))
    url = limited.openai_url if backend == "openai" else limited.base_url
    out = df.llm.map(
        "Name {item}.",
        backend=backend,
        base_url=url,
        max_concurrency=16,
        max_tokens=64,
        cache=False,
        progress="off",
    )
    stats = semframe.last_run()
    assert stats is not None
    assert list(out.index) == list(df.index)
    assert out["llm_output"].notna().all()
    assert stats.errors == 0
    refused = [e for e in limited.ledger.entries() if e.status == 429]
    # The first 120 go at once; the rest are paced by the mirrored bucket (2 a second).
    # A request can only meet a 429 before the first answer reported the headers.
    assert len(refused) <= 2, len(refused)
    assert stats.rate_limited == len(refused)
    assert stats.paced_seconds > 0
    assert stats.wall_seconds >= math.floor((rows - 120) / 2) - 1
