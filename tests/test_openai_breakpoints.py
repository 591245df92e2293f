"""OpenAI's 2026 caching rules through the official SDK, against the emulator.

From GPT-5.6 OpenAI caches by breakpoints and bills cache writes at 1.25x input;
a request without directives gets one implicit breakpoint at the end of its
prompt. Also: ``prompt_cache_retention`` on the older models, and the
``cache_directives`` setting on every API backend (off: what a client unaware
of caching sends). No key, no network.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pandas as pd
import pytest

import semframe
from semframe.backends import reset_backends
from semframe.cost.pricing import price_for
from semframe.errors import ConfigError
from semframe.testing.emulator import Latency, ProviderEmulator

RUBRIC = " ".join(f"Rule {i}: weigh the evidence with care." for i in range(300))  # ~2,700 tokens
PER = 1_000_000


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-abcdefghijklmnop0123")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-abcdefghijklmnop0123")
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server
        reset_backends()


def _rows(n: int = 12) -> pd.DataFrame:
    return pd.DataFrame(
        {"review": [f"review number {i}" for i in range(n)]},
        index=pd.Index([f"r{i}" for i in range(n)]),
    )


def _run(emu: ProviderEmulator, df: pd.DataFrame, **settings: Any) -> Any:
    emu.ledger.reset()
    settings = {"cache": False, "max_tokens": 16, "truncated": "keep", **settings}
    out = df.llm.map(RUBRIC + "\nSummarize {review}.", **settings)
    assert list(out.index) == list(df.index)
    stats = semframe.last_run()
    bill = emu.ledger.totals()
    assert stats is not None
    assert (stats.prompt_tokens, stats.cached_tokens, stats.cache_write_tokens) == (
        bill.prompt_tokens,
        bill.cached_tokens,
        bill.cache_write_tokens,
    )
    assert stats.dollars == pytest.approx(bill.dollars, rel=1e-9)  # everything billed, counted
    return bill


def _client(emu: ProviderEmulator) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url=emu.openai_url, max_retries=0)


def _rubric_message(breakpoint: bool) -> list[dict[str, Any]]:
    head: dict[str, Any] = {"type": "text", "text": RUBRIC}
    if breakpoint:
        head["prompt_cache_breakpoint"] = {"mode": "explicit"}
    return [head, {"type": "text", "text": "\nSummarize this row."}]


# -- the emulator: GPT-5.6's rules ----------------------------------------------------


def test_implicit_mode_writes_every_prompt_and_reads_none_across_rows(
    emu: ProviderEmulator,
) -> None:
    client = _client(emu)
    usages = []
    for i in range(3):
        r = client.chat.completions.create(
            model="gpt-5.6-luna",
            messages=[{"role": "user", "content": f"{RUBRIC}\nrow {i}"}],
            max_completion_tokens=8,
        )
        usages.append(r.usage)
    for u in usages:
        assert u is not None and u.prompt_tokens_details is not None
        assert u.prompt_tokens_details.cached_tokens == 0
        # the implicit breakpoint sits at the end of the message: all of it is written
        assert u.prompt_tokens_details.cache_write_tokens == u.prompt_tokens - 3
    # and each write is billed at 1.25x input
    price = price_for("gpt-5.6-luna")
    entry = emu.ledger.entries()[0]
    assert entry.cost.cache_writes == pytest.approx(entry.cache_write_tokens * 0.25 / PER)
    assert price.cache_write_5m == pytest.approx(1.25 * price.input)


def test_explicit_breakpoint_is_written_once_and_read_by_later_rows(
    emu: ProviderEmulator,
) -> None:
    client = _client(emu)
    details = []
    for _ in range(3):
        r = client.chat.completions.create(
            model="gpt-5.6",
            messages=[{"role": "user", "content": _rubric_message(breakpoint=True)}],  # type: ignore[misc,list-item]
            max_completion_tokens=8,
            prompt_cache_options={"mode": "explicit"},
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        details.append(r.usage.prompt_tokens_details)
    head = details[0].cache_write_tokens
    assert head is not None and head > 1024
    assert details[0].cached_tokens == 0
    for d in details[1:]:
        assert (d.cached_tokens, d.cache_write_tokens) == (head, 0)


def test_explicit_mode_without_breakpoints_caches_nothing(emu: ProviderEmulator) -> None:
    client = _client(emu)
    for _ in range(2):
        r = client.chat.completions.create(
            model="gpt-5.6-terra",
            messages=[{"role": "user", "content": RUBRIC}],
            max_completion_tokens=8,
            prompt_cache_options={"mode": "explicit"},
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert r.usage.prompt_tokens_details.cache_write_tokens == 0


@pytest.mark.parametrize(
    ("model", "extra", "fragment"),
    [
        ("gpt-4o-mini", {"prompt_cache_options": {"mode": "explicit"}}, "gpt-5.6 and later"),
        ("gpt-5.5", {"prompt_cache_retention": "in_memory"}, "supported: '24h'"),
        (
            "gpt-5.6",
            {"prompt_cache_options": {"mode": "explicit"}, "prompt_cache_retention": "24h"},
            "not both",
        ),
        ("gpt-5.6", {"prompt_cache_options": {"mode": "auto"}}, "'implicit' or 'explicit'"),
        ("gpt-5.6", {"prompt_cache_options": {"ttl": "1h"}}, "only '30m'"),
    ],
)
def test_the_emulator_refuses_what_openai_refuses(
    emu: ProviderEmulator, model: str, extra: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=fragment):
        _client(emu).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hello"}],
            max_completion_tokens=8,
            extra_body=extra,
        )


# -- semframe on GPT-5.6 -----------------------------------------------------------


def test_semframe_places_explicit_breakpoints_and_never_bills_more_than_none(
    emu: ProviderEmulator,
) -> None:
    df = _rows()
    common: dict[str, Any] = {"backend": "openai", "model": "gpt-5.6", "base_url": emu.openai_url}
    plain = _run(emu, df, cache_directives=False, **common)
    smart = _run(emu, df, **common)
    # without directives every row writes its whole prompt: 25% over the uncached price
    assert plain.cached_tokens == 0
    assert plain.cache_write_tokens > 0.9 * plain.prompt_tokens
    # with them the rubric is written once and read by the other rows
    assert smart.cache_write_tokens < 0.1 * smart.prompt_tokens
    assert smart.cached_tokens > 0.8 * smart.prompt_tokens
    assert smart.dollars < 0.35 * plain.dollars
    price = price_for("gpt-5.6")
    uncached = (plain.prompt_tokens * price.input + plain.output_tokens * price.output) / PER
    assert smart.dollars < uncached < plain.dollars


def test_the_estimate_is_the_bill_on_gpt_5_6(emu: ProviderEmulator) -> None:
    df = _rows(8)
    settings: dict[str, Any] = {
        "backend": "openai",
        "model": "gpt-5.6-terra",
        "max_concurrency": 1,
        "max_tokens": 16,
        "cache": False,
        "truncated": "keep",
    }
    template = RUBRIC + "\nSummarize {review}."
    for directives in (True, False):
        est = df.llm.estimate(template, cache_directives=directives, **settings)
        emu.ledger.reset()
        df.llm.map(template, base_url=emu.openai_url, cache_directives=directives, **settings)
        bill = emu.ledger.totals()
        p = est.planned
        assert (p.input_tokens, p.cached_tokens, p.cache_write_tokens) == (
            bill.prompt_tokens,
            bill.cached_tokens,
            bill.cache_write_tokens,
        )
        assert p.cost is not None
        assert p.cost.cache_writes == pytest.approx(bill.cost.cache_writes, rel=0, abs=1e-12)
        assert p.cost.cached_input == pytest.approx(bill.cost.cached_input, rel=0, abs=1e-12)


def test_rows_sharing_too_little_get_no_breakpoint(emu: ProviderEmulator) -> None:
    df = _rows(3)
    emu.ledger.reset()
    df.llm.map(
        "Summarize {review}.",  # a short head: below the 1,024-token minimum
        backend="openai",
        model="gpt-5.6",
        base_url=emu.openai_url,
        cache=False,
        max_tokens=8,
        truncated="keep",
    )
    bill = emu.ledger.totals()
    assert bill.cache_write_tokens == bill.cached_tokens == 0


# -- prompt_cache_retention --------------------------------------------------------


def test_retention_is_sent_where_the_model_takes_it(emu: ProviderEmulator) -> None:
    df = _rows(4)
    bill = _run(
        emu,
        df,
        backend="openai",
        model="gpt-5.5",
        base_url=emu.openai_url,
        cache_retention="24h",
    )
    assert bill.requests == 4


@pytest.mark.parametrize(("model", "value"), [("gpt-5.5", "in_memory"), ("gpt-5.6", "24h")])
def test_retention_a_model_does_not_take_fails_before_sending(
    emu: ProviderEmulator, model: str, value: str
) -> None:
    with pytest.raises(ConfigError, match="cache_retention"):
        _rows(2).llm.map(
            "Echo {review}",
            backend="openai",
            model=model,
            base_url=emu.openai_url,
            cache_retention=value,
        )
    assert emu.ledger.totals().requests == 0


def test_retention_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="in_memory"):
        semframe.configure(cache_retention="forever")


# -- cache_directives on the other providers -----------------------------------------


def test_directives_off_sends_no_key_and_no_breakpoints(emu: ProviderEmulator) -> None:
    df = _rows(6)
    _run(emu, df, backend="openai", model="gpt-4.1-mini", base_url=emu.openai_url)
    assert {e.prompt_cache_key for e in emu.ledger.entries()} != {None}
    _run(
        emu,
        df,
        backend="openai",
        model="gpt-4.1-mini",
        base_url=emu.openai_url,
        cache_directives=False,
    )
    assert {e.prompt_cache_key for e in emu.ledger.entries()} == {None}

    common: dict[str, Any] = {"backend": "anthropic", "model": "claude-sonnet-4-6"}
    with_bp = _run(emu, df, base_url=emu.anthropic_url, **common)
    without = _run(emu, df, base_url=emu.anthropic_url, cache_directives=False, **common)
    assert with_bp.cached_tokens > 0
    assert without.cached_tokens == without.cache_write_tokens == 0
    assert with_bp.dollars < without.dollars


def test_anthropic_client_still_works_with_directives_off(emu: ProviderEmulator) -> None:
    # The caller's client: semframe does not close it, the caller does.
    with anthropic.Anthropic(api_key="sk-ant", base_url=emu.anthropic_url, max_retries=0) as client:
        out = _rows(2).llm.map(
            "Echo {review}", backend="anthropic", client=client, cache_directives=False, cache=False
        )
    assert out["llm_output"].str.startswith("Answer").all()
