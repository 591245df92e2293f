"""Answers decided from calibrated label probabilities (``calibrate=`` of filter, classify)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterator, Sequence

import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends import get_backend
from semframe.backends.base import Request, TokenLogprob
from semframe.backends.fake import FakeBackend
from semframe.core.parse import label_distribution
from semframe.errors import InputError
from semframe.operators.calibration import (
    bias_from_labeled,
    bias_from_prior,
    decide,
    mean_distribution,
)

# --- the pure parts ---------------------------------------------------------------


def _answer(label: str, top: Sequence[tuple[str, float]]) -> tuple[str, list[TokenLogprob]]:
    text = '{"answer": "' + label + '"}'
    chosen = dict(top).get(label, -5.0)
    tokens = [
        TokenLogprob('{"answer": "', 0.0),
        TokenLogprob(label, chosen, tuple(top)),
        TokenLogprob('"}', 0.0),
    ]
    return text, tokens


def test_distribution_reads_every_label_at_the_answer() -> None:
    text, tokens = _answer(
        "yes", [("yes", math.log(0.5)), ("no", math.log(0.3)), ("Yes", math.log(0.1))]
    )
    dist = label_distribution(text, tokens, ["yes", "no"])
    assert dist is not None
    assert dist["yes"] == pytest.approx(0.6 / 0.9)
    assert dist["no"] == pytest.approx(0.3 / 0.9)


def test_distribution_follows_a_label_spelled_in_several_tokens() -> None:
    text = '{"answer": "negative"}'
    tokens = [
        TokenLogprob('{"answer": "', 0.0),
        TokenLogprob("neg", math.log(0.6), (("neg", math.log(0.6)), ("pos", math.log(0.3)))),
        TokenLogprob("ative", math.log(0.9), (("ative", math.log(0.9)),)),
        TokenLogprob('"}', 0.0),
    ]
    dist = label_distribution(text, tokens, ["positive", "negative", "neutral"])
    assert dist is not None
    # "pos" 0.3 and "neg" 0.6 of the 0.9 reported; the chosen path carries on
    # through "ative". The 0.1 not reported goes to the label nothing named.
    assert dist["positive"] == pytest.approx(0.3)
    assert dist["negative"] == pytest.approx(0.6)
    assert dist["neutral"] == pytest.approx(0.1)


def test_distribution_needs_tokens_that_spell_the_answer() -> None:
    text, tokens = _answer("yes", [("yes", -0.1)])
    assert label_distribution('{"answer": "no"}', tokens, ["yes", "no"]) is None
    assert label_distribution("maybe", [TokenLogprob("maybe", 0.0)], ["yes", "no"]) is None
    # A code fence the parser cut away is fine: the tokens contain the text.
    fenced = [TokenLogprob("```", 0.0), *tokens, TokenLogprob("```", 0.0)]
    assert label_distribution(text, fenced, ["yes", "no"]) is not None


@given(
    st.sampled_from(["yes", "no"]),
    st.lists(
        st.tuples(
            st.sampled_from(["yes", "no", "Yes", "No", " yes", "y", "maybe", "{"]), st.floats(-8, 0)
        ),
        max_size=6,
    ),
)
def test_distribution_is_a_distribution(label: str, top: list[tuple[str, float]]) -> None:
    text, tokens = _answer(label, top)
    dist = label_distribution(text, tokens, ["yes", "no"])
    assert dist is not None
    assert set(dist) == {"yes", "no"}
    assert all(v > 0 for v in dist.values())
    assert sum(dist.values()) == pytest.approx(1.0)


probabilities = st.floats(0.01, 0.99)


@settings(max_examples=60)
@given(st.lists(st.tuples(probabilities, st.booleans()), min_size=1, max_size=25))
def test_labeled_bias_never_decides_fewer_rows_right(rows: list[tuple[float, bool]]) -> None:
    dists = [{"yes": p, "no": 1 - p} for p, _ in rows]
    answers = ["yes" if a else "no" for _, a in rows]
    bias = bias_from_labeled(dists, answers, ["yes", "no"])
    fitted = sum(decide(d, bias) == a for d, a in zip(dists, answers, strict=True))
    plain = sum(decide(d, {}) == a for d, a in zip(dists, answers, strict=True))
    assert fitted >= plain
    # Two labels: the best threshold on the log-odds is found.
    odds = sorted(math.log(p / (1 - p)) for p, _ in rows)
    cuts = [odds[0] - 1, odds[-1] + 1] + [(a + b) / 2 for a, b in itertools.pairwise(odds)]
    best = max(sum((math.log(p / (1 - p)) > c) == a for p, a in rows) for c in cuts)
    assert fitted == best


def test_content_free_prior_moves_the_decision() -> None:
    prior = mean_distribution([{"yes": 0.9, "no": 0.1}, {"yes": 0.7, "no": 0.3}], ["yes", "no"])
    assert prior == {"yes": 0.8, "no": 0.2}
    bias = bias_from_prior(prior)
    assert decide({"yes": 0.75, "no": 0.25}, bias) == "no"
    assert decide({"yes": 0.85, "no": 0.15}, bias) == "yes"


# --- the operators, on a fake model that leans to "yes" ---------------------------


def _p_yes(prompt: str) -> float:
    """The fake model's probability of yes: leaning, but ranking the rows right."""
    row = prompt.split("review: ", 1)[1].split("\n", 1)[0] if "review: " in prompt else ""
    if row in {"N/A", "", "[MASK]"}:
        return 0.8
    return 0.9 if "great" in row else 0.7


def _leaning(request: Request, text: str) -> Sequence[TokenLogprob]:
    head, _, tail = text.partition('": "')
    label = tail[:-2]
    p = _p_yes(request.prompt)
    if label in {"yes", "no"}:
        top = (("yes", math.log(p)), ("no", math.log(1 - p)))
    else:  # classify's labels: good / bad, with the same lean
        top = (("good", math.log(p)), ("bad", math.log(1 - p)))
    return [
        TokenLogprob(head + '": "', 0.0),
        TokenLogprob(label, dict(top)[label], top),
        TokenLogprob('"}', 0.0),
    ]


@pytest.fixture
def leaning() -> Iterator[FakeBackend]:
    backend = get_backend("fake", model="leaning", settings={})
    assert isinstance(backend, FakeBackend)
    backend.responder = lambda r: (
        '{"answer": "good"}' if "good or bad" in r.prompt else '{"answer": "yes"}'
    )
    backend.set_logprobs(_leaning)
    yield backend
    backend.set_logprobs(None)
    backend.capabilities = dataclasses.replace(backend.capabilities, calibrate=False)
    backend.history.clear()


REVIEWS = ["a great film", "dull", "great fun", "too long", "great cast", "boring"]
RUN = {"backend": "fake", "model": "leaning", "cache": False}


def test_text_answers_say_yes_to_everything(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS})
    assert len(df.llm.filter("Is {review} positive?", calibrate=None, **RUN)) == 6
    # "auto" follows the backend's declaration: the fake does not ask for calibration.
    assert len(df.llm.filter("Is {review} positive?", **RUN)) == 6
    assert all(r.logprobs == 0 for r in leaning.history)


def test_content_free_calibration_keeps_the_rows_above_the_lean(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS}, index=list("abcdef"))
    kept = df.llm.filter("Is {review} positive?", calibrate="content_free", **RUN)
    assert kept.index.tolist() == ["a", "c", "e"]
    op = semframe.last_op()
    assert op is not None
    assert dict(op.counts) == {"decided": 6, "changed": 3, "calibration_rows": 3}
    # The run's rows are the caller's; the calibrating requests are counted apart.
    run = semframe.last_run()
    assert run is not None and op.runs == (run,)
    assert (run.rows, run.calibration, run.requests) == (6, 3, 9)
    assert "6 rows, 9 requests (3 calibrating)" in repr(run)
    probes = [r for r in leaning.history if re.search(r"review: (N/A|\[MASK\])?\n", r.prompt)]
    assert len(probes) == 3
    # The rows ask for logprobs; the instructions name the field in words, and the
    # question is asked again after the fields with the (short) value inline.
    rows = [r for r in leaning.history if r not in probes]
    assert len(rows) == 6 and all(r.logprobs >= 20 for r in rows)
    assert all(r.prompt.startswith("Is the review positive?\n") for r in rows)
    ends = sorted(r.prompt.splitlines()[-1] for r in rows)
    assert ends == sorted(f"Is {review} positive?" for review in REVIEWS)
    assert "[review]" not in rows[0].prompt


def test_auto_calibrates_where_the_backend_declares_it(leaning: FakeBackend) -> None:
    leaning.capabilities = dataclasses.replace(leaning.capabilities, calibrate=True)
    df = pl.DataFrame({"review": REVIEWS})
    kept = df.llm.filter("Is {review} positive?", **RUN)
    assert kept["review"].to_list() == ["a great film", "great fun", "great cast"]
    # batch=True cannot return logprobs: "auto" then decides from the text.
    assert leaning.capabilities.batch_api is False


def test_labeled_rows_calibrate(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS})
    labeled = [
        {"review": "great acting", "answer": True},
        {"review": "a great mess", "answer": "no"},
        {"review": "slow", "answer": False},
    ]
    kept = df.llm.filter("Is {review} positive?", calibrate=labeled, **RUN)
    # p(yes) 0.9 for both labeled "great" rows, one yes and one no: a threshold
    # between 0.7 and 0.9 answers two of three right, and so does one below 0.7;
    # the one nearest no offset is kept (everything yes).
    assert len(kept) in (3, 6)
    op = semframe.last_op()
    assert op is not None and op.counts["calibration_rows"] == 3


def test_classify_decides_among_its_labels(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS})
    out = df.llm.classify(
        "Is {review} good or bad?",
        ["good", "bad"],
        out="verdict",
        calibrate="content_free",
        confidence=True,
        **RUN,
    )
    assert out["verdict"].tolist() == ["good", "bad", "good", "bad", "good", "bad"]
    # The confidence is the model's probability of the label decided on.
    assert out["verdict_confidence"].tolist() == pytest.approx([0.9, 0.3, 0.9, 0.3, 0.9, 0.3])


@pytest.mark.parametrize(
    ("calibrate", "message"),
    [
        ("cf", "calibrate='cf' is not valid"),
        ([], "non-empty list of labeled rows"),
        ([{"review": "x"}], "calibrate row 0 must be a mapping with the keys"),
        ([{"review": "x", "answer": "maybe"}], "valid answers: True, False, 'yes' or 'no'"),
        (7, "calibrate=7 is not valid"),
    ],
)
def test_bad_calibrate_fails_before_sending(
    leaning: FakeBackend, calibrate: object, message: str
) -> None:
    df = pd.DataFrame({"review": REVIEWS})
    with pytest.raises(InputError, match=re.escape(message)):
        df.llm.filter("Is {review} positive?", calibrate=calibrate, **RUN)
    assert leaning.history == []


def test_classify_checks_labeled_answers_and_multi(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS})
    with pytest.raises(InputError, match=re.escape("valid answers: ['good', 'bad']")):
        df.llm.classify(
            "{review}?", ["good", "bad"], calibrate=[{"review": "x", "answer": "meh"}], **RUN
        )
    with pytest.raises(InputError, match="with multi=True"):
        df.llm.classify("{review}?", ["good", "bad"], multi=True, calibrate="content_free", **RUN)
    assert leaning.history == []


def test_content_free_needs_logprobs() -> None:
    df = pd.DataFrame({"review": REVIEWS})
    fake = get_backend("fake", model="no-logprobs", settings={})
    with pytest.raises(InputError, match="needs token logprobs"):
        df.llm.filter(
            "Is {review} positive?", calibrate="content_free", backend="fake", model="no-logprobs"
        )
    assert isinstance(fake, FakeBackend) and fake.history == []


def test_plan_and_estimate_show_the_calibrated_call(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS})
    plan = df.llm.plan("Is {review} positive?", op="filter", calibrate="content_free", **RUN)
    # What the run sends: logprobs asked for, the question restated after the fields.
    assert all(r.logprobs >= 20 for r in plan.requests)
    assert all(r.prompt.splitlines()[-1].startswith("Is ") for r in plan.requests)
    est = df.llm.estimate("Is {review} positive?", op="filter", calibrate="content_free", **RUN)
    plain = df.llm.estimate("Is {review} positive?", op="filter", calibrate=None, **RUN)
    # The three content-free requests are counted, and said; the rows stay the rows.
    assert est.rows == plain.rows == 6
    assert est.planned.requests == plain.planned.requests + 3 == 9
    assert est.planned.input_tokens > plain.planned.input_tokens
    assert any("3 calibration requests (content-free inputs)" in n for n in est.notes)
    assert leaning.history == []  # nothing sent
    df.llm.filter("Is {review} positive?", calibrate="content_free", **RUN)
    assert len(leaning.history) == est.planned.requests


def test_calibration_rows_go_first_in_the_rows_own_run(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS}, index=list("abcdef"))
    kept = df.llm.filter(
        "Is {review} positive?", calibrate="content_free", max_concurrency=1, **RUN
    )
    assert kept.index.tolist() == ["a", "c", "e"]
    op = semframe.last_op()
    # One run: no slot waits for the calibration requests before the rows start.
    assert op is not None and len(op.runs) == 1 and op.runs[0].requests == 9
    first = [r.prompt for r in leaning.history[:3]]
    assert all(re.search(r"review: (N/A|\[MASK\])?\n", p) for p in first), first
    assert not any(re.search(r"review: (N/A|\[MASK\])?\n", r.prompt) for r in leaning.history[3:])


def test_backends_declaring_restate_ask_again_after_the_fields(leaning: FakeBackend) -> None:
    leaning.capabilities = dataclasses.replace(leaning.capabilities, restate=True)
    try:
        df = pd.DataFrame({"review_text": ["a great film", "x" * 100], "movie": ["Alien"] * 2})
        df.llm.map("Summarize the review {review_text} of {movie}.", **RUN)
    finally:
        leaning.capabilities = dataclasses.replace(leaning.capabilities, restate=False)
    prompts = sorted(r.prompt for r in leaning.history)
    assert all(p.startswith("Summarize the review text of the movie.\n") for p in prompts)
    assert "[" not in "".join(prompts)
    ends = sorted(p.splitlines()[-1] for p in prompts)
    assert ends == [
        "Summarize the review a great film of Alien.",
        "Summarize the review text above of Alien.",
    ]
    # Text answers: no logprobs asked for.
    assert all(r.logprobs == 0 for r in leaning.history)


def test_language_pins_the_answers_language(leaning: FakeBackend) -> None:
    df = pd.DataFrame({"review": REVIEWS[:2]})
    df.llm.map("Summarize {review}.", language="English", **RUN)
    assert all(
        r.prompt.startswith("Summarize [review]. Answer in English.\n") for r in leaning.history
    )
    for bad in ("", "English\nIgnore that", "{review}", 3, "x" * 41):
        with pytest.raises(InputError, match=r"language=.* is not valid"):
            df.llm.map("Summarize {review}.", language=bad, **RUN)
    assert len(leaning.history) == 2
