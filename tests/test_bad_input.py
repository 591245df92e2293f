"""Bad input fails before any request is sent, naming the problem and what is valid."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import polars as pl
import pytest

from semframe.backends import BACKENDS
from semframe.backends.fake import FakeBackend
from semframe.backends.providers import PROVIDERS
from semframe.errors import ColumnError, ConfigError, InputError, SemframeError, TemplateError
from semframe.operators.registry import invoke

DF = pd.DataFrame({"movie_title": ["Alien", "Heat"], "review": ["tense", "long"]})


@pytest.mark.parametrize(
    ("call", "error", "fragments"),
    [
        (
            lambda: DF.llm.map("Summarize {reveiw}", backend="fake"),
            ColumnError,
            ["'reveiw'", "Did you mean 'review'?", "Available columns: 'movie_title', 'review'"],
        ),
        (lambda: DF.llm.map("", backend="fake"), TemplateError, ["template is empty"]),
        (
            lambda: DF.llm.filter("Is it positive?", backend="fake"),
            TemplateError,
            ["names no column"],
        ),
        (lambda: DF.llm.map("Sum {review", backend="fake"), TemplateError, ["unbalanced '{'"]),
        (lambda: DF.llm.map("Sum review}", backend="fake"), TemplateError, ["unbalanced '}'"]),
        (
            lambda: DF.llm.map("Sum {review}", backend="opneai"),
            ConfigError,
            [
                "unknown backend 'opneai'",
                "Did you mean 'openai'?",
                "Valid backends: 'local', 'openai', 'anthropic', 'gemini', 'vllm', 'fake'",
            ],
        ),
        (
            lambda: DF.llm.map("Sum {review}", backend="fake", temprature=0.2),
            ConfigError,
            ["unknown setting 'temprature'", "Did you mean 'temperature'?", "Valid settings:"],
        ),
        (
            lambda: DF.llm.map("Sum {review}", backend="fake", errors="ignore"),
            ConfigError,
            ["invalid value for setting 'errors'", "'raise', 'keep'"],
        ),
        (
            lambda: DF.llm.map("Sum {review}", backend="fake", reorder="random"),
            ConfigError,
            ["invalid value for setting 'reorder'", "valid: 'ggr', 'stats', 'none'"],
        ),
        (
            lambda: DF.llm.map("Sum {review}", backend="fake", out="review"),
            InputError,
            ["would overwrite an existing column"],
        ),
        (
            lambda: DF.llm.map("Sum {review}", backend="fake", max_tokens=0),
            InputError,
            ["max_tokens must be a positive int"],
        ),
        (
            lambda: DF.llm.map("Sum {review}", backend="fake", truncate={"movie": 5}),
            InputError,
            ["truncate names column 'movie'", "template columns: ['review']"],
        ),
        (
            lambda: DF.llm.plan("Sum {review}", op="sort"),
            InputError,
            ["unknown op 'sort'", "Valid ops: 'map', 'filter'"],
        ),
        (
            lambda: invoke("map", [{"review": "x"}], "Sum {review}", backend="fake"),
            InputError,
            ["unsupported frame type builtins.list", "pandas.DataFrame, polars.DataFrame"],
        ),
        (
            lambda: DF.llm.filter("Is {review} good?", backend="fake", examples=[{"review": "ok"}]),
            InputError,
            ["each example needs the keys ['review', 'answer']"],
        ),
    ],
)
def test_bad_input_fails_before_sending(
    fake: FakeBackend, call: object, error: type[SemframeError], fragments: list[str]
) -> None:
    with pytest.raises(error) as info:
        call()  # type: ignore[operator]
    for fragment in fragments:
        assert fragment in str(info.value)
    assert fake.history == []


def test_cell_too_long_names_row_and_column(fake: FakeBackend) -> None:
    fake.capabilities = type(fake.capabilities)(
        prefix_cache="per_slot", json_schema=True, max_concurrency=1, context_window=200
    )
    df = pd.DataFrame({"title": ["ok", "fine"], "review": ["short", "x" * 2000]}, index=["a", "b"])
    with pytest.raises(InputError) as info:
        df.llm.map("Summarize {review} of {title}", backend="fake", max_tokens=50)
    message = str(info.value)
    assert "row 1 (label 'b')" in message
    assert "column 'review' (2,000 characters)" in message
    assert "truncate={'review': " in message
    assert fake.history == []
    out = df.llm.map(
        "Summarize {review} of {title}", backend="fake", max_tokens=50, truncate={"review": 100}
    )
    assert len(fake.history) == 2
    assert fake.history[1].prompt.count("x") == 99 and "…" in fake.history[1].prompt
    assert out["llm_output"].notna().all()


def test_polars_bad_column(fake: FakeBackend) -> None:
    with pytest.raises(ColumnError, match="Available columns: 'a', 'b'"):
        pl.DataFrame({"a": [1], "b": [2]}).llm.map("{c}", backend="fake")


def test_duplicate_column_names(fake: FakeBackend) -> None:
    df = pd.DataFrame([[1, 2]], columns=["a", "a"])
    with pytest.raises(InputError, match=r"duplicate column names \['a'\]"):
        df.llm.map("{a}", backend="fake")


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("ollama", ['backend="openai"', 'base_url="http://localhost:11434/v1"', '"Ollama"']),
        ("LM Studio", ['base_url="http://localhost:1234/v1"', '"LM Studio"']),
        ("groq", ['base_url="https://api.groq.com/openai/v1"', '"$GROQ_API_KEY"']),
        ("together.ai", ['base_url="https://api.together.ai/v1"', '"$TOGETHER_API_KEY"']),
        ("openrouter", ['base_url="https://openrouter.ai/api/v1"']),
        ("deepseek", ['base_url="https://api.deepseek.com"', '"$DEEPSEEK_API_KEY"']),
        ("fireworks", ['base_url="https://api.fireworks.ai/inference/v1"']),
        ("mistral", ['base_url="https://api.mistral.ai/v1"', '"$MISTRAL_API_KEY"']),
        ("azure", ["openai.azure.com/openai/v1/", "deployment name"]),
        ("bedrock", ["bedrock-mantle.{region}.api.aws/v1", 'backend="anthropic"']),
        ("vertex", ["/endpoints/openapi", "token"]),
        ("llama.cpp", ["the server's /v1 address", 'backend="local"']),
        ("sglang", ["the server's /v1 address"]),
        ("litellm", ['"Why there is no litellm backend"']),
    ],
)
def test_a_provider_name_gets_its_route_not_a_near_miss(
    fake: FakeBackend, name: str, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        DF.llm.map("Sum {review}", backend=name)
    message = str(info.value)
    assert message.startswith(f"unknown backend {name!r}.")
    assert "Did you mean" not in message
    assert "docs/providers.md" in message
    assert "Valid backends: 'local', 'openai'" in message
    for fragment in fragments:
        assert fragment in message
    assert fake.history == []


def test_provider_routes_agree_with_the_providers_page() -> None:
    """Every route is in docs/providers.md: its section, its URLs; every provider has a route."""
    page = (Path(__file__).parents[1] / "docs" / "providers.md").read_text()
    page = re.sub(r'"\n\s*"', "", page)  # a URL split over two string literals in an example
    headings = set(re.findall(r"^## (.+)$", page, flags=re.MULTILINE))
    for provider in PROVIDERS:
        assert provider.section in headings, provider.section
        for url in re.findall(r"https?://[^\"' )]+", provider.route):
            assert url in page, url
        for variable in re.findall(r"\$([A-Z_]+)", provider.key):
            assert variable in page, variable
    names = {name for p in PROVIDERS for name in p.names} | set(BACKENDS)
    summary = page.split("## Summary", 1)[1].split("\n## ", 1)[0]
    for row in re.findall(r"^\| ([^|]+?) \|", summary, flags=re.MULTILINE)[1:]:
        if set(row) <= set("-"):
            continue
        known = [re.sub(r"[^a-z0-9]", "", part.lower()) in names for part in row.split(" / ")]
        assert all(known), f"summary row {row!r} has no route in semframe/backends/providers.py"


def test_budget_reports_a_missing_key_before_the_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("openai")
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    for budget in ("$0.0000001", "$10", "1 tokens"):  # over and within the budget
        with pytest.raises(ConfigError, match="needs an API key: set the OPENAI_API_KEY"):
            DF.llm.map("Sum {review}", backend="openai", budget=budget, cache=False)
    # The estimate alone needs no key: it prices the model.
    assert DF.llm.estimate("Sum {review}", backend="openai", cache=False).planned.requests == 2
