"""Bad input fails before any request is sent, naming the problem and what is valid."""

from __future__ import annotations

import pandas as pd
import polars as pl
import pytest

from semframe.backends.fake import FakeBackend
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
