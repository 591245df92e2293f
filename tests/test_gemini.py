"""``backend="gemini"`` through the official ``google-genai`` SDK, against the emulator.

Every test sends real HTTP requests with ``google.genai.Client`` to
:class:`semframe.testing.emulator.ProviderEmulator` on loopback (``emu.gemini_url``),
which applies Gemini's implicit caching, explicit caches with storage billing,
batch pricing and fault injection. No key, no network.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
import polars as pl
import pytest
from google import genai
from google.genai import errors, types

import semframe
import semframe.backends.gemini as gemini_module
from semframe.backends import aio, cost_model, get_backend, reset_backends
from semframe.backends.gemini import GeminiBackend, classify_error
from semframe.core.wire import Usage
from semframe.cost.models import GeminiCost, explicit_cache_pays
from semframe.cost.pricing import price_for
from semframe.errors import (
    ConfigError,
    MissingDependencyError,
    RequestRejected,
    RowErrors,
    RunAborted,
    TransientError,
)
from semframe.testing.emulator import Fault, Latency, ManualClock, ProviderEmulator
from semframe.testing.emulator.gemini import _Failure

KEY = "gk-test-abcdefghijklmnop0123"
LONG = " ".join(f"word{i}" for i in range(2200))  # ~5,000 tokens: above 2,048 and 4,096
RUBRIC = " ".join(f"Rule {i}: weigh the evidence with care." for i in range(400))  # ~3,200
PER = 1_000_000


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server
        reset_backends("gemini")  # deletes explicit caches while the server still answers


def _close(client: genai.Client) -> None:
    """Close a client whose async side ran on semframe's I/O loop."""
    aio.run(client.aio.aclose())
    client.close()


def _reviews(n_movies: int = 4, per_movie: int = 5, *, long: bool = False) -> pd.DataFrame:
    rows = []
    for m in range(n_movies):
        for i in range(per_movie):
            info = f"{LONG} movie {m}" if long else f"plot of movie {m}"
            rows.append({"movie": f"movie {m}", "info": info, "review": f"review {m}.{i}"})
    frame = pd.DataFrame(rows)  # movies interleaved: neighbours in file order share nothing
    order = sorted(range(len(frame)), key=lambda i: (i % per_movie, i // per_movie))
    return frame.iloc[order].set_index(pd.Index([f"id{i}" for i in range(len(frame))]))


def _stats_match_the_bill(emu: ProviderEmulator) -> None:
    stats = semframe.last_run()
    bill = emu.ledger.totals()
    assert stats is not None
    assert (stats.prompt_tokens, stats.cached_tokens, stats.cache_write_tokens) == (
        bill.prompt_tokens,
        bill.cached_tokens,
        bill.cache_write_tokens,
    )
    assert stats.output_tokens == bill.output_tokens
    assert stats.dollars == pytest.approx(bill.dollars, rel=1e-9)


# -- map / filter ------------------------------------------------------------------


def test_map_in_order_with_usage_and_dollars_matching_the_bill(emu: ProviderEmulator) -> None:
    df = _reviews()
    out = df.llm.map("Summarize {review} of {movie}", backend="gemini", base_url=emu.gemini_url)
    assert list(out.index) == list(df.index)
    for review, answer in zip(df["review"], out["llm_output"], strict=True):
        assert answer.startswith("Answer ")
        assert review in answer  # the responder echoes the row's last line
    assert emu.ledger.totals().requests == len(df)
    assert {e.provider for e in emu.ledger.entries()} == {"gemini"}
    _stats_match_the_bill(emu)


def test_filter_on_polars_is_constrained_by_json_schema(emu: ProviderEmulator) -> None:
    df = pl.DataFrame({"review": [f"review {i}" for i in range(12)]})
    kept = df.llm.filter("Is {review} positive?", backend="gemini", base_url=emu.gemini_url)
    assert 0 < kept.height < 12
    assert set(kept["review"]) <= set(df["review"])


def test_user_client_is_used_and_left_open(emu: ProviderEmulator) -> None:
    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=emu.gemini_url))
    df = pd.DataFrame({"t": ["a", "b"]})
    out = df.llm.map("Echo {t}", backend="gemini", client=client)
    assert out["llm_output"].str.startswith("Answer").all()
    reset_backends("gemini")
    r = client.models.generate_content(model="gemini-2.5-flash", contents="still open")
    assert r.text
    _close(client)


# -- implicit caching ------------------------------------------------------------------


def test_ggr_order_gets_implicit_cache_hits(emu: ProviderEmulator) -> None:
    df = _reviews(long=True)
    template = "Summarize {review} given {info}"
    bills = {}
    for method in ("none", "ggr"):
        emu.ledger.reset()
        df.llm.map(
            template, backend="gemini", base_url=emu.gemini_url, reorder=method, max_concurrency=4
        )
        bills[method] = emu.ledger.totals()
        _stats_match_the_bill(emu)
    assert bills["none"].cached_tokens < bills["ggr"].cached_tokens
    assert bills["ggr"].dollars < bills["none"].dollars
    # per movie the leader pays, its 4 followers read ~5,000 tokens each from cache
    assert bills["ggr"].cached_share > 0.6
    assert bills["ggr"].cache_write_tokens == 0  # a 10-token head: no explicit cache


def test_estimate_equals_the_bill(emu: ProviderEmulator) -> None:
    """One request at a time: timing cannot matter, so tokens and dollars agree exactly."""
    df = _reviews(n_movies=3, per_movie=3, long=True)
    settings: dict[str, Any] = {
        "backend": "gemini",
        "max_concurrency": 1,
        "max_tokens": 32,
        "cache": False,
        "truncated": "keep",
    }
    template = "Summarize {review} given {info}"
    est = df.llm.estimate(template, **settings)
    assert not est.exact_tokens  # Gemini counts are approximate (o200k)
    df.llm.map(template, base_url=emu.gemini_url, **settings)
    bill = emu.ledger.totals()
    p = est.planned
    assert p.requests == bill.requests == len(df)
    assert (p.input_tokens, p.cached_tokens, p.cache_write_tokens) == (
        bill.prompt_tokens,
        bill.cached_tokens,
        bill.cache_write_tokens,
    )
    assert p.cached_tokens > 0
    assert p.cost is not None
    assert p.cost.uncached_input == pytest.approx(bill.cost.uncached_input, rel=0, abs=1e-12)
    assert p.cost.cached_input == pytest.approx(bill.cost.cached_input, rel=0, abs=1e-12)
    _stats_match_the_bill(emu)


# -- explicit caches -----------------------------------------------------------------


def _cache_entries(emu: ProviderEmulator) -> list[Any]:
    return [e for e in emu.ledger.entries() if e.kind == "cache"]


def test_explicit_cache_when_it_pays_estimate_equals_bill(emu: ProviderEmulator) -> None:
    """A ~3,200-token rubric read by 8 rows: one cache, created once, read by every row."""
    df = pd.DataFrame({"review": [f"review {i}" for i in range(8)]})
    template = RUBRIC + " Is {review} positive?"
    settings: dict[str, Any] = {"backend": "gemini", "max_concurrency": 4, "cache": False}
    est = df.llm.estimate(template, op="filter", **settings)
    df.llm.filter(template, base_url=emu.gemini_url, **settings)
    caches = _cache_entries(emu)
    assert len(caches) == 1
    cache = caches[0]
    assert cache.cache_write_5m_tokens == cache.prompt_tokens > 2048
    requests = [e for e in emu.ledger.entries() if e.kind == "request"]
    assert len(requests) == 8
    assert all(e.cached_tokens >= cache.prompt_tokens for e in requests)  # guaranteed hits
    # creation at the input price and 5 minutes of storage at $1.00 / M / hour
    price = price_for("gemini-2.5-flash")
    assert cache.cost.cache_writes == pytest.approx(
        cache.prompt_tokens * (0.30 + 1.00 * 5 / 60) / PER, rel=1e-12
    )
    assert price.cache_write_5m == pytest.approx(0.30 + 1.00 / 12)
    bill = emu.ledger.totals()
    p = est.planned
    assert (p.input_tokens, p.cached_tokens, p.cache_write_tokens) == (
        bill.prompt_tokens,
        bill.cached_tokens,
        bill.cache_write_tokens,
    )
    assert p.cost is not None
    assert p.cost.cache_writes == pytest.approx(bill.cost.cache_writes, rel=1e-12)
    _stats_match_the_bill(emu)
    # the cache lives until the backend is closed, then it is deleted
    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=emu.gemini_url))
    assert len(list(client.caches.list())) == 1
    reset_backends("gemini")
    assert list(client.caches.list()) == []
    client.close()


def test_explicit_cache_not_made_where_storage_does_not_pay(emu: ProviderEmulator) -> None:
    """2.5 Pro, 1-hour TTL: creation + an hour of storage ($1.25 + $4.50 per M) needs 6 readers."""
    template = RUBRIC + " Is {review} positive?"
    settings: dict[str, Any] = {
        "backend": "gemini",
        "model": "gemini-2.5-pro",
        "cache_ttl": "1h",
        "cache": False,
    }
    few = pd.DataFrame({"review": [f"review {i}" for i in range(5)]})
    est = few.llm.estimate(template, op="filter", **settings)
    assert est.planned.cache_write_tokens == 0
    few.llm.filter(template, base_url=emu.gemini_url, **settings)
    assert _cache_entries(emu) == []
    assert emu.ledger.totals().cached_tokens > 0  # implicit caching still serves the head

    emu.ledger.reset()
    many = pd.DataFrame({"review": [f"review {i}" for i in range(6)]})
    many.llm.filter(template, base_url=emu.gemini_url, **settings)
    (cache,) = _cache_entries(emu)
    assert cache.cache_write_1h_tokens == cache.prompt_tokens
    assert cache.cost.cache_writes == pytest.approx(cache.prompt_tokens * (1.25 + 4.50) / PER)

    # without the storage charge, 5 readers would have paid: storage decided it
    emu.ledger.reset()
    reset_backends("gemini")
    free = {"gemini-2.5-pro": {"cache_storage_per_hour": 0.0}}
    few.llm.filter(template, base_url=emu.gemini_url, prices=free, **settings)
    assert len(_cache_entries(emu)) == 1


def test_explicit_cache_rule() -> None:
    pro, flash = price_for("gemini-2.5-pro"), price_for("gemini-2.5-flash")
    # n readers pay when n (input - cached) > input + storage x TTL hours
    assert not explicit_cache_pays(5, pro, "1h")  # 5.625 < 5.75
    assert explicit_cache_pays(6, pro, "1h")  # 6.75 > 5.75
    assert not explicit_cache_pays(1, flash, "5m")  # 0.27 < 0.3833
    assert explicit_cache_pays(2, flash, "5m")
    model = cost_model("gemini", model=None, settings={})
    assert isinstance(model, GeminiCost)
    # at most the requests one cache's lifetime serves count as its readers
    assert model.readers(10**6, 256) < 10**6
    assert model.readers(3, 256) == 3


def test_short_instructions_get_no_explicit_cache(emu: ProviderEmulator) -> None:
    df = pd.DataFrame({"review": [f"review {i}" for i in range(20)]})
    df.llm.filter("Is {review} positive?", backend="gemini", base_url=emu.gemini_url)
    assert _cache_entries(emu) == []


# -- batch ---------------------------------------------------------------------------


def test_batch_round_trip_half_price_but_cached_tokens_at_the_cache_price(
    emu: ProviderEmulator, tmp_path: Any
) -> None:
    df = _reviews(n_movies=2, per_movie=3, long=True)
    template = "Summarize {review} given {info}"
    live = df.llm.map(template, backend="gemini", base_url=emu.gemini_url, cache=False)
    emu.ledger.reset()
    batched = df.llm.map(
        template,
        backend="gemini",
        base_url=emu.gemini_url,
        batch=True,
        batch_poll_seconds=0.01,
        cache_dir=str(tmp_path),
        cache=False,
    )
    pd.testing.assert_frame_equal(live, batched)
    stats = semframe.last_run()
    assert stats is not None and stats.batch
    bill = emu.ledger.totals()
    assert all(e.batch for e in emu.ledger.entries())
    assert bill.cached_tokens > 0  # the batch's requests share the implicit cache
    uncached = bill.prompt_tokens - bill.cached_tokens
    assert bill.cost.uncached_input == pytest.approx(uncached * 0.30 * 0.5 / PER)
    assert bill.cost.cached_input == pytest.approx(bill.cached_tokens * 0.03 / PER)  # no 0.5
    assert bill.cost.output == pytest.approx(bill.output_tokens * 2.50 * 0.5 / PER)
    assert stats.dollars == pytest.approx(bill.dollars, rel=1e-9)


def test_batch_takes_no_explicit_cache(emu: ProviderEmulator, tmp_path: Any) -> None:
    df = pd.DataFrame({"review": [f"review {i}" for i in range(8)]})
    template = RUBRIC + " Is {review} positive?"
    est = df.llm.estimate(template, op="filter", backend="gemini", batch=True)
    assert est.planned.cache_write_tokens == 0
    assert any("do not stack" in n for n in est.notes)
    df.llm.filter(
        template,
        backend="gemini",
        base_url=emu.gemini_url,
        batch=True,
        batch_poll_seconds=0.01,
        cache_dir=str(tmp_path),
    )
    assert _cache_entries(emu) == []
    assert emu.ledger.totals().requests == 8


# -- errors --------------------------------------------------------------------------


def test_429s_are_retried_with_googles_delay(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.rate_limit(retry_after=0.01), count=4, provider="gemini")
    df = _reviews()
    # the run's first request goes alone (warm start), so it may meet all 4 in a row
    out = df.llm.map("Summarize {review}", backend="gemini", base_url=emu.gemini_url, max_retries=6)
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None and stats.errors == 0
    assert sum(e.status == 429 for e in emu.ledger.entries()) == 4
    assert stats.retries >= 4


def test_hang_malformed_drop_and_5xx_are_retried(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.hang(3.0), count=1)
    emu.faults.inject(Fault.malformed(), count=1)
    emu.faults.inject(Fault.drop(), count=1)
    emu.faults.inject(Fault.server_error(503), count=2)
    df = pd.DataFrame({"t": [f"row {i}" for i in range(8)]})
    out = df.llm.map(
        "Echo {t}", backend="gemini", base_url=emu.gemini_url, timeout=0.5, warm_start=False
    )
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None and stats.retries == 5 and stats.errors == 0


def test_400_fails_only_its_row(emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    service = emu._gemini
    real = service._generate

    def refuse_row_3(model: str, req: Any, **kw: Any) -> Any:
        if "row 3" in str(req.get("contents")):
            raise _Failure(400, "Request contains an invalid argument.")
        return real(model, req, **kw)

    monkeypatch.setattr(service, "_generate", refuse_row_3)
    df = pd.DataFrame({"t": [f"row {i}" for i in range(6)]})
    with pytest.raises(RowErrors) as info:
        df.llm.map("Echo {t}", backend="gemini", base_url=emu.gemini_url)
    assert [e.row for e in info.value.errors] == [3]
    assert "HTTP 400 INVALID_ARGUMENT" in info.value.errors[0].message
    assert info.value.result["llm_output"].notna().sum() == 5


def test_rejected_key_aborts_without_showing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    df = pd.DataFrame({"t": list("abcdef")})
    with ProviderEmulator(latency=Latency(0), api_keys={"the-right-key-000000"}) as server:
        # Google answers a bad key with 400 INVALID_ARGUMENT, reason API_KEY_INVALID
        with pytest.raises(RunAborted, match="API key") as info:
            df.llm.map("Echo {t}", backend="gemini", base_url=server.gemini_url, max_concurrency=1)
        assert KEY not in str(info.value)
        assert "GEMINI_API_KEY" in str(info.value)
        assert "0 of 6 rows had been answered" in str(info.value)
        reset_backends("gemini")


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (400, RequestRejected),
        (401, RunAborted),
        (403, RunAborted),
        (404, RunAborted),
        (408, TransientError),
        (429, TransientError),
        (500, TransientError),
        (503, TransientError),
    ],
)
def test_sdk_errors_map_to_semframe_errors(code: int, kind: type[Exception]) -> None:
    body = {"error": {"code": code, "message": f"key {KEY} said no", "status": "X"}}
    cls = errors.ClientError if code < 500 else errors.ServerError
    mapped = classify_error(cls(code, body), secrets=[KEY])
    assert type(mapped) is kind
    assert KEY not in str(mapped)


def test_retry_delay_read_from_retry_info() -> None:
    body = {
        "error": {
            "code": 429,
            "message": "quota",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
        }
    }
    mapped = classify_error(errors.ClientError(429, body))
    assert isinstance(mapped, TransientError)
    assert mapped.retry_after == 7.0


# -- keys, dependencies, reprs ---------------------------------------------------------


def test_missing_key_fails_before_any_request(
    emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        df.llm.map("Echo {t}", backend="gemini", base_url=emu.gemini_url)
    assert emu.ledger.totals().requests == 0
    # pricing needs no key
    est = df.llm.estimate("Echo {t}", backend="gemini")
    assert est.dollars is not None and est.dollars > 0


def test_google_api_key_works_too(emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.setenv("GOOGLE_API_KEY", KEY)
    out = pd.DataFrame({"t": ["a"]}).llm.map("Echo {t}", backend="gemini", base_url=emu.gemini_url)
    assert out["llm_output"].notna().all()


def test_missing_sdk_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setitem(sys.modules, "google.genai", None)
    reset_backends("gemini")
    with pytest.raises(MissingDependencyError, match=r"pip install 'semframe\[gemini\]'"):
        get_backend("gemini", model=None, settings={})
    # the estimate prices without the SDK
    model = cost_model("gemini", model=None, settings={})
    assert model.price is not None and model.price.provider == "gemini"


def test_keys_never_in_reprs() -> None:
    client = genai.Client(
        api_key=KEY, http_options=types.HttpOptions(base_url="http://127.0.0.1:9")
    )
    cfg = semframe.config(client=client, backend="gemini")
    assert KEY not in repr(cfg)
    backend = get_backend("gemini", model=None, settings=cfg)
    assert isinstance(backend, GeminiBackend)
    assert KEY not in repr(backend)
    reset_backends("gemini")
    client.close()


def test_wrong_client_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"google\.genai\.Client"):
        GeminiBackend(client=object())


def test_unreachable_base_url_stops_the_run_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    df = pd.DataFrame({"t": ["a", "b"]})
    with pytest.raises(RunAborted, match=r"cannot reach http://127\.0\.0\.1:9"):
        df.llm.map("Echo {t}", backend="gemini", base_url="http://127.0.0.1:9")
    reset_backends("gemini")


def test_bill_counts_writes_beside_reads() -> None:
    model = cost_model("gemini", model="gemini-2.5-flash", settings={})
    # a request that read 3,000 cached tokens, one explicit-cache creation of 3,000 tokens
    usage = Usage(prompt_tokens=3_100 + 3_000, cached_tokens=3_000, cache_write_tokens=3_000)
    dollars = model.bill(usage)
    assert dollars == pytest.approx((100 * 0.30 + 3_000 * 0.03 + 3_000 * (0.30 + 1 / 12)) / PER)
    batch = model.bill(usage, batch=True)  # cache reads and writes are not discounted
    assert batch == pytest.approx((100 * 0.15 + 3_000 * 0.03 + 3_000 * (0.30 + 1 / 12)) / PER)


def test_cache_replaced_before_it_expires(
    emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache is used for its TTL less 30 s, then a new one is made and the old one deleted."""
    now = [1000.0]
    monkeypatch.setattr(gemini_module.time, "monotonic", lambda: now[0])
    df = pd.DataFrame({"review": [f"review {i}" for i in range(4)]})
    template = RUBRIC + " Is {review} positive?"
    settings: dict[str, Any] = {"backend": "gemini", "base_url": emu.gemini_url, "cache": False}
    df.llm.filter(template, **settings)
    assert len(_cache_entries(emu)) == 1
    now[0] += 269.0  # 5 minutes less 31 s: still in use
    df.llm.filter(template, **settings)
    assert len(_cache_entries(emu)) == 1
    now[0] += 2.0
    df.llm.filter(template, **settings)
    assert len(_cache_entries(emu)) == 2
    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=emu.gemini_url))
    assert len(list(client.caches.list())) == 1  # the replaced one was deleted
    client.close()
    _stats_match_the_bill_of_the_last_run(emu, requests=4)


def _stats_match_the_bill_of_the_last_run(emu: ProviderEmulator, *, requests: int) -> None:
    stats = semframe.last_run()
    assert stats is not None and stats.requests == requests and stats.errors == 0
    assert stats.cache_write_tokens == _cache_entries(emu)[-1].cache_write_5m_tokens


def test_cache_gone_on_the_server_is_made_again() -> None:
    clock = ManualClock()
    with (
        pytest.MonkeyPatch.context() as mp,
        ProviderEmulator(latency=Latency(0), clock=clock) as server,
    ):
        mp.setenv("GEMINI_API_KEY", KEY)
        df = pd.DataFrame({"review": [f"review {i}" for i in range(4)]})
        template = RUBRIC + " Is {review} positive?"
        settings: dict[str, Any] = {"backend": "gemini", "base_url": server.gemini_url}
        df.llm.filter(template, cache=False, **settings)
        clock.advance(301)  # the server's copy expires; the backend has not seen 5 minutes
        out = df.llm.filter(template, cache=False, errors="keep", **settings)
        assert out["llm_error"].isna().all()
        stats = semframe.last_run()
        assert stats is not None and stats.retries >= 1
        assert len(_cache_entries(server)) == 2
        reset_backends("gemini")
