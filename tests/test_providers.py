"""The door to other providers: ``backend="openai"`` with their clients, URLs and prices.

What ``docs/providers.md`` promises, checked against the provider emulator with
the real ``openai`` SDK: an Azure OpenAI client (its deployment URL layout and
``api-key`` header) works through ``backend="openai"``; a client that fetches
a short-lived token per request (Vertex AI, Microsoft Entra ID) works; a model
semframe has no price for runs unpriced and cannot be estimated or budgeted;
a ``[prices."model"]`` entry (a call argument or ``semframe.toml``) prices it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pandas as pd
import pytest
from openai.types.chat import ChatCompletion

import semframe
from semframe.backends.openai import OpenAIBackend, _completion, _completion_from_json
from semframe.core.wire import Request
from semframe.errors import ConfigError
from semframe.testing.emulator import Latency, ProviderEmulator

KEY = "sk-test-abcdefghijklmnop0123"
LONG = " ".join(f"word{i}" for i in range(2200))  # ~5,000 tokens: above every minimum
MODEL = "my-model"  # a model the server serves and semframe has no price for
PRICE = {"provider": "openai", "input": 0.20, "cached_input": 0.05, "output": 0.80}


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with ProviderEmulator(latency=Latency(0), prices={MODEL: PRICE}) as server:
        yield server


def _rows(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame({"t": [f"row {i}" for i in range(n)]})


def _reviews(long: bool) -> pd.DataFrame:
    rows = []
    for m in range(3):
        for i in range(4):
            info = f"{LONG} movie {m}" if long else f"plot of movie {m}"
            rows.append({"movie": f"movie {m}", "info": info, "review": f"review {m}.{i}"})
    frame = pd.DataFrame(rows)
    order = sorted(range(len(frame)), key=lambda i: (i % 4, i // 4))  # movies interleaved
    return frame.iloc[order].reset_index(drop=True)


# -- Azure OpenAI --------------------------------------------------------------------


@pytest.mark.parametrize("client_type", [openai.AzureOpenAI, openai.AsyncAzureOpenAI])
def test_azure_openai_client_through_backend_openai(
    emu: ProviderEmulator, client_type: type[openai.AzureOpenAI | openai.AsyncAzureOpenAI]
) -> None:
    # Azure's layout: /openai/deployments/{deployment}/chat/completions?api-version=...,
    # the key in an api-key header; the deployment is named by model=.
    client = client_type(azure_endpoint=emu.base_url, api_key=KEY, api_version="2024-10-21")
    df = _rows()
    out = df.llm.map("Echo {t}", backend="openai", client=client, model="gpt-4o-mini")
    assert list(out["llm_output"].str.contains("row", regex=False)) == [True] * len(df)
    entries = emu.ledger.entries()
    assert len(entries) == len(df)
    assert all(e.prompt_cache_key and e.prompt_cache_key.startswith("semframe-") for e in entries)
    stats = semframe.last_run()
    assert stats is not None
    assert stats.dollars == pytest.approx(emu.ledger.totals().dollars, rel=1e-9)


def test_azure_reordering_cuts_the_cached_token_bill(emu: ProviderEmulator) -> None:
    client = openai.AzureOpenAI(azure_endpoint=emu.base_url, api_key=KEY, api_version="2024-10-21")
    df = _reviews(long=True)
    bills = {}
    for method in ("none", "ggr"):
        emu.ledger.reset()
        df.llm.map(
            "Summarize {review} given {info}",
            backend="openai",
            client=client,
            model="gpt-4o-mini",
            reorder=method,
            max_concurrency=4,
            cache=False,
        )
        bills[method] = emu.ledger.totals()
    assert bills["ggr"].cached_tokens > bills["none"].cached_tokens
    assert bills["ggr"].dollars < bills["none"].dollars


def test_client_with_a_token_provider(emu: ProviderEmulator) -> None:
    # Vertex AI and Microsoft Entra ID hand out short-lived tokens: a client built
    # with a callable api_key asks it for a token on each request.
    calls: list[int] = []

    def token() -> str:
        calls.append(1)
        return KEY

    with openai.OpenAI(base_url=emu.openai_url, api_key=token) as client:
        out = _rows(3).llm.map("Echo {t}", backend="openai", client=client, model="gpt-4o-mini")
    assert len(out) == 3
    assert len(calls) >= 3


# -- a model semframe has no price for ----------------------------------------------


def test_unknown_model_runs_unpriced_and_refuses_estimates(emu: ProviderEmulator) -> None:
    df = _rows()
    out = df.llm.map("Echo {t}", backend="openai", base_url=emu.openai_url, model=MODEL)
    assert out["llm_output"].notna().all()
    stats = semframe.last_run()
    assert stats is not None
    assert stats.dollars is None  # unpriced, but every token is counted
    assert stats.prompt_tokens == emu.ledger.totals().prompt_tokens > 0
    for run_options in ({"estimate": True}, {"budget": 1.0}):
        with pytest.raises(
            ConfigError, match=r'no price for model .my-model.*\[prices\."my-model"\]'
        ):
            df.llm.map(
                "Echo {t}",
                backend="openai",
                base_url=emu.openai_url,
                model=MODEL,
                cache=False,
                **run_options,
            )


def test_prices_entry_prices_the_run_and_the_estimate(emu: ProviderEmulator) -> None:
    df = _reviews(long=True)
    template = "Summarize {review} given {info}"
    settings = {
        "backend": "openai",
        "base_url": emu.openai_url,
        "model": MODEL,
        "prices": {MODEL: PRICE},
        "cache": False,
    }
    estimate = df.llm.map(template, estimate=True, **settings)
    assert estimate.dollars is not None
    assert estimate.dollars > 0
    df.llm.map(template, **settings)
    stats = semframe.last_run()
    assert stats is not None
    bill = emu.ledger.totals()
    assert bill.cached_tokens > 0  # the server's prefix cache, reported in usage
    assert stats.cached_tokens == bill.cached_tokens
    assert stats.dollars == pytest.approx(bill.dollars, rel=1e-9)


def test_semframe_toml_configures_a_compatible_provider(
    emu: ProviderEmulator, tmp_path: Path
) -> None:
    # The snippet docs/providers.md gives for every provider, in the working directory.
    (tmp_path / "semframe.toml").write_text(
        f'backend = "openai"\n'
        f'base_url = "{emu.openai_url}"\n'
        f'model = "{MODEL}"\n'
        f"\n"
        f'[prices."{MODEL}"]\n'
        f'provider = "openai"\n'
        f"input = 0.20\n"
        f"cached_input = 0.05\n"
        f"output = 0.80\n"
        f"min_cacheable_tokens = 1024\n",
        encoding="utf-8",
    )
    df = _rows(4)
    df.llm.map("Echo {t}", cache=False)
    stats = semframe.last_run()
    assert stats is not None
    assert (stats.backend, stats.model) == ("openai", MODEL)
    assert stats.dollars == pytest.approx(emu.ledger.totals().dollars, rel=1e-9)


# -- request and usage dialects ------------------------------------------------------


def test_azure_endpoints_take_max_completion_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure's reasoning deployments refuse max_tokens; other compatible servers need it."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    request = Request(0, 0, "hi", None, 7, 0.0, None, 0)
    azure = OpenAIBackend(
        "gpt-4o-mini",
        client=openai.AzureOpenAI(
            api_key=KEY, azure_endpoint="https://me.openai.azure.com", api_version="2024-10-21"
        ),
    )
    azure_v1 = OpenAIBackend("gpt-4o-mini", base_url="https://me.openai.azure.com/openai/v1/")
    local = OpenAIBackend("gpt-4o-mini", base_url="http://127.0.0.1:8080/v1")
    assert azure.body(request)["max_completion_tokens"] == 7
    assert azure_v1.body(request)["max_completion_tokens"] == 7
    assert local.body(request)["max_tokens"] == 7
    assert "max_tokens" not in azure.body(request)


def test_deepseek_cache_hits_are_read() -> None:
    """DeepSeek reports its cache hits as usage.prompt_cache_hit_tokens."""
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "deepseek-chat",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 3,
            "total_tokens": 1203,
            "prompt_cache_hit_tokens": 1024,
            "prompt_cache_miss_tokens": 176,
        },
    }
    assert _completion(0, ChatCompletion.model_validate(body)).usage.cached_tokens == 1024
    assert _completion_from_json(0, body).usage.cached_tokens == 1024
