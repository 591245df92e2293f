"""The optional LLM steps of the embedding operators: re-rank, verify, label.

``search(rerank=)``, ``dedup(verify=)`` and ``cluster(label=)`` against the
fake backend (scripted answers, every request recorded) and, for a verified
dedup, the provider emulator's bill.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pytest

import semframe
from semframe.backends import embedders, reset_backends
from semframe.backends.fake import FakeBackend
from semframe.core.plan import Plan
from semframe.core.wire import Request
from semframe.errors import (
    BudgetExceeded,
    ColumnError,
    ConfigError,
    InputError,
    RowErrors,
    TransientError,
)
from semframe.operators.similarity import EmbeddingPlan
from semframe.operators.topk import TopkPlan
from semframe.testing.emulator import Latency, ProviderEmulator
from tests.conftest import prompt_fields

KEY = "sk-test-abcdefghijklmnop0123"
LLM: dict[str, Any] = {"backend": "fake", "cache": False}
TFIDF: dict[str, Any] = {**LLM, "embed_model": "tfidf"}

# -- a fixed embedder: each text a unit vector at a given angle, so similarities are known --

ANGLES = {"p0": 0, "p1": 20, "p2": 40, "p3": 90, "p4": 145, "p5": 260}
"""cos 20 deg = 0.94 (linked at 0.9); 40, 50 and 55 deg fall in the band [0.5, 0.9)."""


class Angles:
    """Texts named in :data:`ANGLES` as 2-d unit vectors; counts what it embeds."""

    name, dim, calls = "angles-test", 2, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        Angles.calls += len(texts)
        rad = [math.radians(ANGLES[t]) for t in texts]
        return np.array([[math.cos(a), math.sin(a)] for a in rad], dtype=np.float32)


@pytest.fixture(autouse=True)
def _angles() -> None:
    embedders.register_embedder("angles", Angles)
    Angles.calls = 0


POINTS = pd.DataFrame(
    {"p": ["p0", "p1", "p2", "p3", None, "p4", "p5"], "n": range(7)},
    index=list("abcdefg"),
)
VERIFY: dict[str, Any] = {**LLM, "embed_model": "angles", "threshold": 0.9, "band": 0.4}


def _pairs(history: list[Request], field: str = "p") -> list[tuple[str, str]]:
    out = []
    for r in history:
        fields = prompt_fields(r.prompt)
        out.append((fields[f"A.{field}"], fields[f"B.{field}"]))
    return out


def _confirm(*pairs: tuple[str, str]) -> Callable[[Request], str]:
    """A responder that says yes to ``pairs`` (either way round) and no to other pairs."""
    wanted = {frozenset(p) for p in pairs}

    def answer(request: Request) -> str:
        fields = prompt_fields(request.prompt)
        pair = frozenset(v for k, v in fields.items() if k.startswith(("A.", "B.")))
        return '{"answer": "yes"}' if pair in wanted else '{"answer": "no"}'

    return answer


# -- dedup(verify=) ------------------------------------------------------------------------


def test_verify_asks_only_uncertain_pairs_and_links_confirmed_ones(fake: FakeBackend) -> None:
    fake.responder = _confirm(("p3", "p4"))
    out = POINTS.llm.dedup("p", verify=True, **VERIFY)
    # p0-p1 and p1-p2 link without asking (0.94); p0-p2 (0.77) is in the band but
    # already linked; p2-p3 (0.64) and p3-p4 (0.57) are asked; p1-p3 (0.34) is below it.
    assert sorted(_pairs(fake.history)) == [("p2", "p3"), ("p3", "p4")]
    assert list(out.index) == list("abcdefg")
    assert out["dup_cluster"].tolist() == [0, 0, 0, 1, 2, 1, 3]
    counts = semframe.last_op().counts  # type: ignore[union-attr]
    assert (counts["asked"], counts["confirmed"], counts["refused"]) == (2, 1, 1)


def test_verify_off_sends_nothing_and_refusals_change_nothing(fake: FakeBackend) -> None:
    plain = POINTS.llm.dedup("p", embed_model="angles", threshold=0.9)
    assert not fake.history
    fake.responder = _confirm()
    verified = POINTS.llm.dedup("p", verify=True, **VERIFY)
    assert verified["dup_cluster"].tolist() == plain["dup_cluster"].tolist()
    assert len(fake.history) == 2


def test_verify_template_keep_first_and_polars(fake: FakeBackend) -> None:
    fake.responder = _confirm(("p3", "p4"))
    frame = pl.from_pandas(POINTS.reset_index(drop=True))
    out = frame.llm.dedup("p", verify="Same point? {p}", keep="first", **VERIFY)
    assert isinstance(out, pl.DataFrame)
    assert out["p"].to_list() == ["p0", "p3", None, "p5"]
    assert out["dup_cluster"].to_list() == [0, 1, 2, 3]
    assert all(r.prompt.startswith("Two items, A and B, follow. Same point?") for r in fake.history)


def test_verify_failures_are_reported_or_kept(fake: FakeBackend) -> None:
    def broken(request: Request) -> str:
        return "no idea" if "p2" in request.prompt else _confirm(("p3", "p4"))(request)

    fake.responder = broken
    with pytest.raises(RowErrors) as info:
        POINTS.llm.dedup("p", verify=True, **VERIFY)
    assert [e.label for e in info.value.errors] == ["c"]  # the pair p2-p3, by its first row
    assert "pair with row 'd'" in info.value.errors[0].message
    result = info.value.result
    assert isinstance(result, pd.DataFrame)
    assert result["dup_cluster"].tolist() == [0, 0, 0, 1, 2, 1, 3]  # the failed pair links nothing
    kept = POINTS.llm.dedup("p", verify=True, errors="keep", **VERIFY)
    why = kept["llm_error"].tolist()
    assert why[2] is not None and why[2].startswith("pair with row 'd': parse")
    assert why[3] is not None and why[3].startswith("pair with row 'c': parse")
    assert [w is None for w in why] == [True, True, False, False, True, True, True]


# -- search(rerank=) -----------------------------------------------------------------------

TITLES = pd.DataFrame(
    {
        "title": [
            "The Matrix",
            "Amelie, the long story of a young woman in Montmartre",
            "Heat",
            "Matrix Reloaded",
            "The Matrix Revolutions",
            "Matrix of Leadership",
        ]
    },
    index=[10, 11, 12, 13, 14, 15],
)


def _longer(request: Request) -> str:
    """Prefers the longer item (a comparison prompt ends with items A and B)."""
    a, b = (line.split(": ", 1)[1] for line in request.prompt.splitlines()[-2:])
    return '{"answer": "B"}' if len(b) > len(a) else '{"answer": "A"}'


def test_rerank_returns_the_llms_order_among_the_candidates(fake: FakeBackend) -> None:
    fake.responder = _longer
    plain = TITLES.llm.search("the matrix", column="title", k=4, **TFIDF)
    assert list(plain.index) == [10, 14, 13, 15]  # the embeddings' candidates, best first
    assert not fake.history
    out = TITLES.llm.search("the matrix", column="title", k=2, rerank=True, candidates=4, **TFIDF)
    assert list(out.index) == [14, 15]  # the longest candidates; 11 is longer but no candidate
    assert out["similarity"].tolist() == plain.loc[[14, 15], "similarity"].tolist()
    shown = {t for pair in _pairs(fake.history, "title") for t in pair}
    assert shown <= set(plain["title"])
    assert fake.history[0].prompt.startswith(
        "Criterion: Most relevant to the search query: 'the matrix'."
    )
    counts = semframe.last_op().counts  # type: ignore[union-attr]
    assert counts["candidates"] == 4
    assert counts["comparisons"] == len(fake.history)


def test_rerank_template_on_polars_matches_pandas(fake: FakeBackend) -> None:
    fake.responder = _longer
    kwargs: dict[str, Any] = {"k": 3, "rerank": "The best sequel: {title}", **TFIDF}
    want = TITLES.llm.search("matrix", column="title", **kwargs)
    assert fake.history[0].prompt.startswith("Criterion: The best sequel: [title]")
    out = pl.from_pandas(TITLES).llm.search("matrix", column="title", **kwargs)
    assert out["title"].to_list() == want["title"].tolist()
    assert len(out) == 3


def test_rerank_failures_are_reported_or_kept(fake: FakeBackend) -> None:
    fake.responder = lambda r: "?" if "B.title: Matrix Reloaded" in r.prompt else _longer(r)
    with pytest.raises(RowErrors) as info:
        TITLES.llm.search("the matrix", column="title", k=2, rerank=True, candidates=4, **TFIDF)
    assert [e.label for e in info.value.errors] == [13]
    assert list(info.value.result.index) == [14, 15]
    kept = TITLES.llm.search(
        "the matrix", column="title", k=2, rerank=True, candidates=4, errors="keep", **TFIDF
    )
    assert list(kept.index) == [14, 15, 13]  # the ranked rows, then the failed one
    assert kept["llm_error"].isna().tolist() == [True, True, False]


# -- cluster(label=) -----------------------------------------------------------------------

FRUIT = pd.DataFrame(
    {"t": ["red apple", "fast car", None, "green apple", "red car", "apple pie", "old car"]},
    index=[*"uvwxyz", "q"],
)


def _namer(request: Request) -> str:
    return "Apples" if "apple" in request.prompt else "Cars"


def _items(request: Request) -> list[str]:
    return [
        line.split(": ", 1)[1] for line in request.prompt.splitlines() if line.startswith("  t:")
    ]


def test_label_names_each_cluster_once(fake: FakeBackend) -> None:
    fake.responder = _namer
    out = FRUIT.llm.cluster("t", k=2, label=True, **TFIDF)
    assert list(out.index) == list(FRUIT.index)
    assert out["cluster"].tolist()[:2] == [0, 1]
    assert out["cluster_label"].tolist() == [
        "Apples",
        "Cars",
        None,
        "Apples",
        "Cars",
        "Apples",
        "Cars",
    ]
    assert len(fake.history) == 2  # one request per cluster
    assert sorted(len(_items(r)) for r in fake.history) == [3, 3]
    by_cluster = out.dropna().groupby("cluster")["cluster_label"].nunique()
    assert by_cluster.tolist() == [1, 1]


def test_label_sample_shows_the_members_nearest_the_centroid(fake: FakeBackend) -> None:
    fake.responder = _namer
    out = pl.from_pandas(FRUIT.reset_index(drop=True)).llm.cluster(
        "t", k=2, label="What do they share?", label_out="topic", label_sample=1, **TFIDF
    )
    assert out.columns == ["t", "cluster", "topic"]
    assert out["topic"].to_list() == ["Apples", "Cars", None, "Apples", "Cars", "Apples", "Cars"]
    assert [len(_items(r)) for r in fake.history] == [1, 1]
    assert all(r.prompt.startswith("What do they share?") for r in fake.history)


def test_label_failures_are_reported_or_kept(fake: FakeBackend) -> None:
    fake.responder = _namer
    fake.enqueue(TransientError("boom"))  # the first cluster's request fails, not retried
    with pytest.raises(RowErrors) as info:
        FRUIT.llm.cluster("t", k=2, label=True, max_retries=0, **TFIDF)
    assert [e.label for e in info.value.errors] == ["u"]  # cluster 0, by its first row
    assert info.value.result["cluster_label"].tolist()[:2] == [None, "Cars"]
    fake.enqueue(TransientError("boom"))
    kept = FRUIT.llm.cluster("t", k=2, label=True, max_retries=0, errors="keep", **TFIDF)
    assert kept["cluster_label_error"].notna().tolist() == [
        True,
        False,
        False,
        True,
        False,
        True,
        False,
    ]


# -- plans, estimates, budgets --------------------------------------------------------------


def test_estimate_counts_the_requests_the_run_sends(fake: FakeBackend) -> None:
    fake.responder = _confirm(("p3", "p4"))
    est = POINTS.llm.dedup("p", verify=True, estimate=True, **VERIFY)
    plan = POINTS.llm.plan("p", op="dedup", verify=True, **VERIFY)
    assert not fake.history
    POINTS.llm.dedup("p", verify=True, **VERIFY)
    assert est.requests == len(plan.llm.requests) == len(fake.history) == 2
    assert est.planned.input_tokens > 0
    assert est.backend == "fake"
    assert any("2 uncertain pairs" in n for n in est.notes)

    fake.history.clear()
    fake.responder = _namer
    est = FRUIT.llm.cluster("t", k=2, label=True, estimate=True, **TFIDF)
    FRUIT.llm.cluster("t", k=2, label=True, **TFIDF)
    assert est.requests == len(fake.history) == 2
    run = semframe.last_run()
    assert run is not None
    assert run.requests == 2
    assert est.planned.input_tokens >= run.prompt_tokens  # the longest rows stand in

    fake.history.clear()
    fake.responder = _longer
    est = TITLES.llm.search(
        "the matrix", column="title", k=2, rerank=True, candidates=4, estimate=True, **TFIDF
    )
    plan = TITLES.llm.plan(
        "the matrix", op="search", column="title", k=2, rerank=True, candidates=4, **TFIDF
    )
    assert isinstance(plan.llm, TopkPlan)
    assert plan.llm.rows == 4
    assert est.requests == plan.llm.expected_comparisons  # topk's expectation
    TITLES.llm.search("the matrix", column="title", k=2, rerank=True, candidates=4, **TFIDF)
    assert 0 < len(fake.history) <= est.requests


def test_plans_without_and_with_llm_steps() -> None:
    plain = POINTS.llm.plan("p", op="dedup", embed_model="angles")
    assert plain == EmbeddingPlan("dedup", "angles", 6, 6, None)
    assert Angles.calls == 0  # nothing embedded without verify=
    plan = FRUIT.llm.plan("t", op="cluster", k=2, label=True, **TFIDF)
    assert isinstance(plan.llm, Plan)
    assert len(plan.llm.requests) == 2


def test_no_step_estimates_zero_and_steps_add_up(fake: FakeBackend) -> None:
    base = FRUIT.llm.cluster("t", k=2, estimate=True, **TFIDF)
    assert (base.requests, base.dollars, base.backend) == (0, 0, "embedding")
    openai = {"embed_model": "tfidf", "backend": "openai", "model": "gpt-4.1-mini"}
    est = FRUIT.llm.cluster("t", k=2, label=True, estimate=True, **openai)
    assert est.requests == 2
    assert est.dollars is not None
    assert est.dollars > 0
    assert est.notes[0].startswith("the embeddings send no LLM request")


def test_budget_is_checked_before_anything_is_sent(fake: FakeBackend) -> None:
    with pytest.raises(BudgetExceeded):
        POINTS.llm.dedup("p", verify=True, budget="10 tokens", **VERIFY)
    assert not fake.history
    out = POINTS.llm.dedup("p", verify=True, budget="100k tokens", **VERIFY)
    assert len(out) == 7
    assert len(fake.history) == 2


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: TITLES.llm.search("x", column="title", k=0, rerank=True, **TFIDF), InputError,
         "k must be a positive"),
        (lambda: TITLES.llm.search("x", column="title", k=3, rerank=True, candidates=2, **TFIDF),
         InputError, "candidates=2 must be at least k=3"),
        (lambda: TITLES.llm.search("x", column="title", candidates=5, **TFIDF), InputError,
         "only applies with rerank="),
        (lambda: TITLES.llm.search("x", column="title", rerank="Best {titel}", **TFIDF),
         ColumnError, "titel"),
        (lambda: TITLES.llm.search("x", column="title", rerank=3, **TFIDF), InputError,
         "rerank must be True"),
        (lambda: TITLES.llm.search("x", column="title", rerank=True, embed_model="tfidf",
                                   backend="nope"), ConfigError, "rerank= sends LLM requests"),
        (lambda: TITLES.llm.search("x", column="title", rerank=True, backend="openai",
                                   model="gpt-4.1-mini", embed_model="tfidf"), ConfigError,
         "OPENAI_API_KEY"),
        (lambda: POINTS.llm.dedup("p", verify=True, **{**VERIFY, "band": 0}), InputError,
         r"band must be a similarity width in \(0, threshold=0.9\]"),
        (lambda: POINTS.llm.dedup("p", verify=True, **{**VERIFY, "band": 0.95}), InputError,
         "band must be"),
        (lambda: POINTS.llm.dedup("p", embed_model="angles", band=0.1), InputError,
         "only applies with verify="),
        (lambda: POINTS.llm.dedup("p", verify="Same {q}?", **VERIFY), ColumnError, "'q'"),
        (lambda: POINTS.llm.dedup("p", verify=True, errors="keep", out="llm_error", **VERIFY),
         InputError, "llm_error"),
        (lambda: FRUIT.llm.cluster("t", k=2, label=True, label_out="t", **TFIDF), InputError,
         "overwrite"),
        (lambda: FRUIT.llm.cluster("t", k=2, label=True, label_out="cluster", **TFIDF),
         InputError, "cluster id column"),
        (lambda: FRUIT.llm.cluster("t", k=2, label=True, label_sample=0, **TFIDF), InputError,
         "label_sample must be a positive int"),
        (lambda: FRUIT.llm.cluster("t", k=2, label_out="x", **TFIDF), InputError,
         "only applies with label="),
    ],
)  # fmt: skip
def test_bad_input_fails_before_any_request_or_embedding(
    fake: FakeBackend,
    monkeypatch: pytest.MonkeyPatch,
    call: Callable[[], object],
    error: type[Exception],
    match: str,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(error, match=match):
        call()
    assert not fake.history
    assert Angles.calls == 0


# -- the provider emulator's bill -------------------------------------------------------------


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server
        reset_backends()


def test_a_verified_dedup_costs_what_it_was_estimated(emu: ProviderEmulator) -> None:
    names = pd.DataFrame(
        {"name": ["ACME Corp.", "Globex", "acme corp", "Initech", "ACME Corporation", "Globex Inc"]}
    )
    settings: dict[str, Any] = {
        "threshold": 0.9,
        "band": 0.6,
        "verify": True,
        "embed_model": "tfidf",
        "backend": "openai",
        "model": "gpt-4.1-mini",
        "base_url": emu.openai_url,
        "cache": False,
        "max_concurrency": 1,
    }
    est = names.llm.dedup("name", estimate=True, **settings)
    assert len(emu.ledger) == 0
    names.llm.dedup("name", **settings)
    bill = emu.ledger.totals()
    p = est.planned
    assert p.requests == bill.requests == 4  # the pairs between 0.3 and 0.9 similar
    assert p.input_tokens == bill.prompt_tokens  # same tokenizer, same framing
    assert p.cost is not None
    assert p.cost.total - p.cost.output == pytest.approx(bill.cost.total - bill.cost.output)
    assert p.output_tokens_max >= bill.output_tokens
    run = semframe.last_run()
    assert run is not None
    assert run.dollars == pytest.approx(bill.dollars, rel=1e-9)
