"""df.llm.extract and df.llm.classify: typed columns, strict parsing, order and index."""

from __future__ import annotations

import json
import re
from typing import Literal

import pandas as pd
import polars as pl
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semframe import last_op
from semframe.backends.base import Request
from semframe.backends.fake import FakeBackend
from semframe.errors import InputError, RowErrors
from tests.conftest import prompt_fields

SCHEMA = {"n": int, "x": float, "ok": bool, "tags": list[str], "mood": Literal["up", "down"]}


def record_for(request: Request) -> str:
    """A valid record derived from the row's own key, so misplaced answers are caught."""
    key = prompt_fields(request.prompt)["key"]
    n = int(key[1:])
    return json.dumps({"n": n, "x": n / 2, "ok": n % 2 == 0, "tags": [key] * (n % 3), "mood": "up"})


@pytest.mark.parametrize("reorder", ["none", "stats", "ggr"])
def test_extract_pandas_types_order_and_index(fake: FakeBackend, reorder: str) -> None:
    fake.responder = record_for
    df = pd.DataFrame(
        {"key": ["k3", "k1", "k2", "k4"], "g": ["a", "b", "a", "b"]},
        index=pd.Index(["z", "y", "y", 7], dtype=object),
    )
    out = df.llm.extract("Read {key} in {g}", SCHEMA, backend="fake", reorder=reorder)
    assert list(out.index) == ["z", "y", "y", 7]
    assert out["n"].tolist() == [3, 1, 2, 4]
    assert out["x"].tolist() == [1.5, 0.5, 1.0, 2.0]
    assert out["ok"].tolist() == [False, False, True, True]
    assert out["tags"].tolist() == [[], ["k1"], ["k2", "k2"], ["k4"]]
    assert {c: str(t) for c, t in out.dtypes.items() if c in SCHEMA} == {
        "n": "Int64",
        "x": "Float64",
        "ok": "boolean",
        "tags": "object",
        "mood": "object",
    }
    assert fake.history[0].schema is not None
    assert fake.history[0].schema["required"] == list(SCHEMA)
    assert list(df.columns) == ["key", "g"]


def test_extract_polars_lazy_and_empty(fake: FakeBackend) -> None:
    fake.responder = record_for
    df = pl.DataFrame({"key": ["k2", "k5"]})
    out = df.llm.extract("Read {key}", SCHEMA, backend="fake")
    assert out.schema == {
        "key": pl.String,
        "n": pl.Int64,
        "x": pl.Float64,
        "ok": pl.Boolean,
        "tags": pl.List(pl.String),
        "mood": pl.String,
    }
    assert out["n"].to_list() == [2, 5]
    lazy = df.lazy().llm.extract("Read {key}", SCHEMA, backend="fake")
    assert isinstance(lazy, pl.LazyFrame)
    assert lazy.collect().equals(out)
    empty = df.head(0).llm.extract("Read {key}", SCHEMA, backend="fake")
    assert empty.height == 0
    assert empty.schema["tags"] == pl.List(pl.String)
    pd_empty = pd.DataFrame({"key": pd.Series([], dtype=object)}).llm.extract(
        "Read {key}", {"n": int}, backend="fake"
    )
    assert len(pd_empty) == 0
    assert str(pd_empty["n"].dtype) == "Int64"


def test_invalid_answers_are_retried_then_reported(fake: FakeBackend) -> None:
    answers = {"k1": '{"n": "one"}', "k2": '{"n": 2}', "k3": "sure! n is 3"}
    fake.responder = lambda r: answers[prompt_fields(r.prompt)["key"]]
    df = pd.DataFrame({"key": ["k1", "k2", "k3"]}, index=[10, 20, 30])
    with pytest.raises(RowErrors) as info:
        df.llm.extract("Read {key}", {"n": int}, backend="fake")
    errors = info.value.errors
    assert [(e.row, e.label, e.kind, e.attempts) for e in errors] == [
        (0, 10, "parse", 2),
        (2, 30, "parse", 2),
    ]
    assert "field 'n' is 'one', expected an int value" in errors[0].message
    result = info.value.result
    assert result["n"].isna().tolist() == [True, False, True]
    assert result["n"].tolist()[1] == 2
    kept = df.llm.extract("Read {key}", {"n": int}, backend="fake", errors="keep")
    assert kept["llm_error"].isna().tolist() == [False, True, False]
    assert kept["llm_error"].iloc[0].startswith("parse: field 'n'")


def test_nullable_and_pydantic_models(fake: FakeBackend) -> None:
    class Movie(pydantic.BaseModel):
        year: int = pydantic.Field(ge=1900)
        title: str | None

    fake.responder = lambda r: (
        '{"year": 1979, "title": null}' if "Alien" in r.prompt else '{"year": 1850, "title": "x"}'
    )
    df = pd.DataFrame({"plot": ["Alien", "Old"]})
    out = df.llm.extract("Read {plot}", Movie, backend="fake", errors="keep")
    assert out["year"].tolist()[0] == 1979
    assert pd.isna(out["title"].iloc[0])
    assert pd.isna(out["year"].iloc[1])
    assert "Movie rejected" in out["llm_error"].iloc[1]
    assert fake.history[0].schema is not None
    assert fake.history[0].schema["properties"]["title"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}]
    }


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({}, "schema names no field"),
        ({"n": dict}, "unsupported type"),
        ({"n": Literal["a", 1]}, "all of one type"),
        ("n: int", "mapping of column name to type"),
        ({"key": int}, "schema field='key' would overwrite"),
    ],
)
def test_extract_bad_schema_fails_before_sending(
    fake: FakeBackend, schema: object, fragment: str
) -> None:
    df = pd.DataFrame({"key": ["a"]})
    with pytest.raises(InputError, match=re.escape(fragment)):
        df.llm.extract("Read {key}", schema, backend="fake")  # type: ignore[arg-type]
    assert fake.history == []


def test_classify_labels_order_and_multi(fake: FakeBackend) -> None:
    answers = {"k1": "Horror.", "k2": '{"answer": "comedy"}', "k3": '"DRAMA"'}
    fake.responder = lambda r: answers[prompt_fields(r.prompt)["key"]]
    df = pd.DataFrame({"key": ["k3", "k1", "k2"]}, index=["c", "a", "b"])
    out = df.llm.classify("Genre of {key}", ["horror", "comedy", "drama"], backend="fake")
    assert out["label"].tolist() == ["drama", "horror", "comedy"]
    assert list(out.index) == ["c", "a", "b"]
    schema = fake.history[0].schema
    assert schema is not None
    assert schema["properties"]["answer"]["enum"] == ["horror", "comedy", "drama"]

    multi = {"k1": '{"answer": ["b", "a"]}', "k2": '{"answer": []}', "k3": "b"}
    fake.responder = lambda r: multi[prompt_fields(r.prompt)["key"]]
    pol = pl.DataFrame({"key": ["k1", "k2", "k3"]})
    got = pol.llm.classify("Tags of {key}", ["a", "b"], out="tags", multi=True, backend="fake")
    assert got.schema["tags"] == pl.List(pl.String)
    assert got["tags"].to_list() == [["a", "b"], [], ["b"]]


def test_classify_rejects_unknown_labels_and_bad_input(fake: FakeBackend) -> None:
    fake.responder = lambda r: "western"
    df = pd.DataFrame({"key": ["k1"]})
    kept = df.llm.classify("Genre of {key}", ["horror", "comedy"], backend="fake", errors="keep")
    assert kept["label"].isna().all()
    assert "expected one of ['horror', 'comedy']" in kept["label_error"].iloc[0]
    n_sent = len(fake.history)
    for labels, fragment in [
        (["only"], "at least 2 label(s)"),
        (["a", "A"], "distinct"),
        ("ab", "list of strings"),
        (["a", ""], "non-empty strings"),
    ]:
        with pytest.raises(InputError, match=re.escape(fragment)):
            df.llm.classify("Genre of {key}", labels, backend="fake")
    with pytest.raises(InputError, match="multi must be True or False"):
        df.llm.classify("Genre of {key}", ["a", "b"], multi="yes", backend="fake")  # type: ignore[arg-type]
    assert len(fake.history) == n_sent


def test_plan_for_extract_and_classify_sends_nothing(fake: FakeBackend) -> None:
    df = pd.DataFrame({"key": ["a", "b"]})
    plan = df.llm.plan("Read {key}", op="extract", schema={"n": int})
    assert len(plan.requests) == 2
    assert plan.requests[0].schema["required"] == ["n"]
    plan = df.llm.plan("Genre {key}", op="classify", labels=["x", "y"], backend="fake")
    assert "Choose exactly one label from ['x', 'y']" in plan.instructions
    with pytest.raises(InputError, match="needs the extract argument 'schema'"):
        df.llm.plan("Read {key}", op="extract")
    assert fake.history == []
    assert last_op() is None or last_op().op != "extract"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.lists(st.integers(0, 20), min_size=0, max_size=25),
    groups=st.lists(st.sampled_from("abc"), min_size=25, max_size=25),
    reorder=st.sampled_from(["none", "stats", "ggr"]),
)
def test_extract_values_stay_with_their_rows(
    fake: FakeBackend, keys: list[int], groups: list[str], reorder: str
) -> None:
    fake.responder = record_for
    df = pd.DataFrame({"key": [f"k{k}" for k in keys], "g": groups[: len(keys)]})
    out = df.llm.extract("Read {key} {g}", SCHEMA, backend="fake", reorder=reorder)
    assert out["n"].tolist() == keys
    assert out.index.equals(df.index)
    pol = pl.from_pandas(df).llm.extract("Read {key} {g}", SCHEMA, backend="fake", reorder=reorder)
    assert pol["n"].to_list() == keys


def test_error_column_may_not_overwrite(fake: FakeBackend) -> None:
    df = pd.DataFrame({"key": ["a"], "llm_error": ["mine"], "label_error": ["mine"]})
    for call in (
        lambda: df.llm.extract("Read {key}", {"n": int}, backend="fake", errors="keep"),
        lambda: df.llm.classify("Is {key}", ["x", "y"], backend="fake", errors="keep"),
        lambda: df.llm.topk("Best {key}", 1, backend="fake", errors="keep"),
        lambda: df.llm.join(
            df[["key"]], "Is {left.key} {right.key}", backend="fake", errors="keep"
        ),
    ):
        with pytest.raises(InputError, match="which the frame already has"):
            call()
    assert fake.history == []
    fake.responder = lambda r: '{"n": 1}'
    kept = df.llm.extract("Read {key}", {"n": int}, backend="fake")  # raise mode: no column added
    assert list(kept.columns) == ["key", "llm_error", "label_error", "n"]
