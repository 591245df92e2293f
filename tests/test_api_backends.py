"""The OpenAI and Anthropic backends through the official SDKs, against the emulator.

Every test here sends real HTTP requests with the real ``openai`` / ``anthropic``
clients to :class:`semframe.testing.emulator.ProviderEmulator` on loopback, which applies
each provider's caching and billing rules and injects faults on demand.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import anthropic
import openai
import pandas as pd
import polars as pl
import pytest

import semframe
from semframe.errors import ConfigError, RowErrors, RunAborted
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

KEY = "sk-test-abcdefghijklmnop0123"
LONG = " ".join(f"word{i}" for i in range(2200))  # ~5,000 tokens: above every minimum


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server


def _reviews(n_movies: int = 4, per_movie: int = 5, *, long: bool = False) -> pd.DataFrame:
    rows = []
    for m in range(n_movies):
        for i in range(per_movie):
            info = f"{LONG} movie {m}" if long else f"plot of movie {m}"
            rows.append({"movie": f"movie {m}", "info": info, "review": f"review {m}.{i}"})
    # Interleave movies so that file order shares nothing between neighbours.
    frame = pd.DataFrame(rows)
    order = sorted(range(len(frame)), key=lambda i: (i % per_movie, i // per_movie))
    return frame.iloc[order].set_index(pd.Index([f"id{i}" for i in range(len(frame))]))


# -- OpenAI ------------------------------------------------------------------------


def test_openai_map_in_order_with_usage_and_dollars_matching_the_bill(
    emu: ProviderEmulator,
) -> None:
    df = _reviews()
    out = df.llm.map(
        "Summarize {review} of {movie}",
        backend="openai",
        base_url=emu.openai_url,
        model="gpt-4o-mini",
    )
    assert list(out.index) == list(df.index)
    for review, answer in zip(df["review"], out["llm_output"], strict=True):
        assert answer.startswith("Answer ")
        assert review in answer  # the responder echoes the row's last line
    stats = semframe.last_run()
    bill = emu.ledger.totals()
    assert stats is not None
    assert (stats.prompt_tokens, stats.cached_tokens, stats.output_tokens) == (
        bill.prompt_tokens,
        bill.cached_tokens,
        bill.output_tokens,
    )
    assert stats.dollars == pytest.approx(bill.dollars, rel=1e-9)


def test_openai_prompt_cache_key_follows_prefix_groups(emu: ProviderEmulator) -> None:
    df = _reviews()
    plan = df.llm.plan("Summarize {review} of {movie}", backend="openai")
    df.llm.map("Summarize {review} of {movie}", backend="openai", base_url=emu.openai_url)
    keys = {e.prompt_cache_key for e in emu.ledger.entries()}
    assert len(keys) == len(plan.groups) == 4
    assert all(k and k.startswith("semframe-") for k in keys)


def test_openai_reordering_cuts_the_cached_token_bill(emu: ProviderEmulator) -> None:
    df = _reviews(long=True)
    template = "Summarize {review} given {info}"
    bills = {}
    for method in ("none", "ggr"):
        emu.ledger.reset()
        df.llm.map(
            template, backend="openai", base_url=emu.openai_url, reorder=method, max_concurrency=4
        )
        bills[method] = emu.ledger.totals()
    assert bills["none"].cached_tokens < bills["ggr"].cached_tokens
    assert bills["ggr"].dollars < bills["none"].dollars
    # The group's leader pays, its 4 followers read ~5,000 tokens each from cache.
    assert bills["ggr"].cached_share > 0.6


def test_openai_filter_is_constrained_by_json_schema(emu: ProviderEmulator) -> None:
    df = pl.DataFrame({"review": [f"review {i}" for i in range(12)]})
    kept = df.llm.filter("Is {review} positive?", backend="openai", base_url=emu.openai_url)
    assert 0 < kept.height < 12
    assert set(kept["review"]) <= set(df["review"])


def test_openai_user_client_sync_or_async(emu: ProviderEmulator) -> None:
    df = pd.DataFrame({"t": ["a", "b"]})
    for client in (
        openai.OpenAI(base_url=emu.openai_url, api_key=KEY),
        openai.AsyncOpenAI(base_url=emu.openai_url, api_key=KEY),
    ):
        out = df.llm.map("Echo {t}", backend="openai", client=client)
        assert out["llm_output"].str.startswith("Answer").all()


# -- Anthropic ---------------------------------------------------------------------


def test_anthropic_breakpoints_cache_the_shared_long_field(emu: ProviderEmulator) -> None:
    df = _reviews(long=True)
    out = df.llm.map(
        "Summarize {review} given {info}",
        backend="anthropic",
        base_url=emu.anthropic_url,
    )
    assert list(out.index) == list(df.index)
    bill = emu.ledger.totals()
    stats = semframe.last_run()
    assert stats is not None
    # Per movie: one write of the ~5,000-token prefix, then four reads.
    assert bill.cache_write_tokens > 0 and bill.cached_tokens > 3 * bill.cache_write_tokens
    assert stats.cached_tokens == bill.cached_tokens
    assert stats.cache_write_tokens == bill.cache_write_tokens
    assert stats.dollars == pytest.approx(bill.dollars, rel=1e-9)


def test_anthropic_no_breakpoints_where_nothing_pays(emu: ProviderEmulator) -> None:
    df = _reviews(long=False)  # short prompts: below every model's minimum
    df.llm.map("Summarize {review} of {movie}", backend="anthropic", base_url=emu.anthropic_url)
    bill = emu.ledger.totals()
    assert bill.cache_write_tokens == 0 and bill.cached_tokens == 0


def test_anthropic_one_hour_ttl_writes_at_twice_the_input_price(emu: ProviderEmulator) -> None:
    df = _reviews(long=True, n_movies=2)
    df.llm.map(
        "Summarize {review} given {info}",
        backend="anthropic",
        base_url=emu.anthropic_url,
        cache_ttl="1h",
    )
    entries = emu.ledger.entries()
    assert sum(e.cache_write_1h_tokens for e in entries) > 0
    assert sum(e.cache_write_5m_tokens for e in entries) == 0


# -- keys --------------------------------------------------------------------------


def test_missing_key_fails_before_any_request(
    emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        df.llm.map("Echo {t}", backend="openai")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        df.llm.map("Echo {t}", backend="anthropic", base_url=emu.anthropic_url)
    assert emu.ledger.totals().requests == 0


def test_rejected_key_aborts_without_showing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    df = pd.DataFrame({"t": list("abcdef")})
    with ProviderEmulator(latency=Latency(0), api_keys={"sk-the-right-one-000000"}) as server:
        for backend, url in (("openai", server.openai_url), ("anthropic", server.anthropic_url)):
            with pytest.raises(RunAborted, match="401") as info:
                df.llm.map("Echo {t}", backend=backend, base_url=url, max_concurrency=1)
            assert KEY not in str(info.value)
            assert "0 of 6 rows had been answered" in str(info.value)


def test_keys_never_in_reprs() -> None:
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    cfg = semframe.config(client=client, backend="openai")
    assert KEY not in repr(cfg)
    backend = semframe.backends.get_backend("openai", model=None, settings=cfg)
    assert KEY not in repr(backend)
    aclient = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key=KEY)
    backend = semframe.backends.get_backend(
        "anthropic", model=None, settings=semframe.config(client=aclient)
    )
    assert KEY not in repr(backend)


# -- faults --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_429_storm_every_row_answered_after_retries(emu: ProviderEmulator, backend: str) -> None:
    emu.faults.inject(Fault.rate_limit(retry_after=0.01), count=15)
    df = _reviews()
    url = emu.openai_url if backend == "openai" else emu.anthropic_url
    # the run's first request goes alone (warm start), so it may meet all 15 in a row
    out = df.llm.map("Summarize {review}", backend=backend, base_url=url, max_retries=15)
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None
    assert stats.errors == 0
    assert sum(e.status == 429 for e in emu.ledger.entries()) == 15
    assert stats.retries >= 15  # every 429 retried (a burst may also meet a full backlog)


def test_hang_timeout_malformed_drop_and_5xx_are_retried(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.hang(3.0), count=1)
    emu.faults.inject(Fault.malformed(), count=2)
    emu.faults.inject(Fault.drop(), count=2)
    emu.faults.inject(Fault.server_error(503), count=2)
    df = pd.DataFrame({"t": [f"row {i}" for i in range(10)]})
    out = df.llm.map(  # faults spread over the first wave, not all on a warm start's row
        "Echo {t}", backend="openai", base_url=emu.openai_url, timeout=0.5, warm_start=False
    )
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None and stats.retries == 7 and stats.errors == 0


def test_persistent_failure_is_reported_per_row_and_the_rest_kept(
    emu: ProviderEmulator,
) -> None:
    emu.faults.inject(Fault.server_error(500), when=lambda prompt: "row 3" in prompt)
    df = pd.DataFrame({"t": [f"row {i}" for i in range(6)]})
    with pytest.raises(RowErrors) as info:
        df.llm.map("Echo {t}", backend="openai", base_url=emu.openai_url, max_retries=1)
    assert [e.row for e in info.value.errors] == [3]
    assert "HTTP 500" in info.value.errors[0].message
    kept = info.value.result
    assert kept["llm_output"].notna().sum() == 5
    out = df.llm.map(
        "Echo {t}", backend="openai", base_url=emu.openai_url, max_retries=1, errors="keep"
    )
    assert out["llm_output_error"].notna().tolist() == [i == 3 for i in range(6)]


def test_empty_answers_are_parse_errors_not_defaults(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.empty(), when=lambda prompt: "review 2" in prompt)
    df = pd.DataFrame({"review": [f"review {i}" for i in range(4)]})
    out = df.llm.filter(
        "Is {review} positive?", backend="openai", base_url=emu.openai_url, errors="keep"
    )
    assert "review 2" in set(out["review"])  # kept, with its error, not silently dropped
    errors = dict(zip(out["review"], out["llm_error"], strict=True))
    assert "parse" in errors["review 2"]


def test_concurrent_group_members_are_sent_after_their_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(fixed_s=0.02)) as server:
        df = _reviews(long=True, n_movies=2)
        df.llm.map("Summarize {review} given {info}", backend="openai", base_url=server.openai_url)
        entries = sorted(server.ledger.entries(), key=lambda e: e.arrival)
        by_key: dict[str | None, list[float]] = {}
        for e in entries:
            by_key.setdefault(e.prompt_cache_key, []).append(e.arrival)
        leaders = {k: min(v) for k, v in by_key.items()}
        done = {k: min(e.completion for e in entries if e.prompt_cache_key == k) for k in by_key}
        for key, arrivals in by_key.items():
            assert all(a >= done[key] for a in arrivals if a != leaders[key])
        # Followers read the prefix their leader wrote.
        assert server.ledger.totals().cached_share > 0.6


# -- batch -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_batch_mode_round_trip_at_half_price(
    emu: ProviderEmulator, backend: str, tmp_path: os.PathLike[str]
) -> None:
    df = _reviews()
    url = emu.openai_url if backend == "openai" else emu.anthropic_url
    live = df.llm.map("Summarize {review} of {movie}", backend=backend, base_url=url)
    live_bill = emu.ledger.totals()
    emu.ledger.reset()
    batched = df.llm.map(
        "Summarize {review} of {movie}",
        backend=backend,
        base_url=url,
        batch=True,
        batch_poll_seconds=0.01,
        cache_dir=str(tmp_path),
    )
    pd.testing.assert_frame_equal(live, batched)
    stats = semframe.last_run()
    batch_bill = emu.ledger.totals()
    assert stats is not None and stats.batch
    assert batch_bill.dollars == pytest.approx(live_bill.dollars / 2, rel=1e-6)
    assert stats.dollars == pytest.approx(batch_bill.dollars, rel=1e-9)
