"""API embedding models (``embed_model="openai:<model>"`` / ``"gemini:<model>"``), offline.

Every request goes to :class:`semframe.testing.emulator.ProviderEmulator` through
the official SDKs: vectors, batching within the price table's limits, the
checks made before anything is sent, the embedding store, retries, and the
estimate against the emulator's bill.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest

import semframe
from semframe.backends import embedders
from semframe.backends.api_embedders import ApiEmbedder, batches, usage_scope
from semframe.cost.pricing import embedding_price
from semframe.errors import BudgetExceeded, InputError, TransientError
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

OPENAI_KEY = "sk-test-abcdefghijklmnop0123"
GEMINI_KEY = "AIzaSy-test-key-0000000000000000000000"
SMALL = "openai:text-embedding-3-small"
GEMINI = "gemini:gemini-embedding-001"

DOCS = pd.DataFrame(
    {"text": ["red apple pie", "fast red car", None, "green apple", "slow car", "apple tart"]},
    index=["a", "b", "c", "d", "e", "f"],
)


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server


def _small_batches(emu: ProviderEmulator, max_inputs: int) -> ProviderEmulator:
    """The emulator refusing requests of more than ``max_inputs`` texts."""
    emu.embedding_prices = {"text-embedding-3-small": {"max_inputs": max_inputs}}
    return emu


def _embedder(emu: ProviderEmulator, name: str = SMALL, **kwargs: object) -> ApiEmbedder:
    url = emu.openai_url if name.startswith("openai:") else emu.gemini_url
    return ApiEmbedder(name, base_url=url, **kwargs)  # type: ignore[arg-type]


# -- the embedder ---------------------------------------------------------------------


@pytest.mark.parametrize("name", [SMALL, GEMINI])
def test_vectors_are_unit_length_float32_and_deterministic(
    emu: ProviderEmulator, name: str
) -> None:
    texts = ["The Matrix", "the matrix (1999)", "Amelie"]
    first = _embedder(emu, name).embed(texts)
    again = _embedder(emu, name).embed(texts)
    dim = embedding_price(name.split(":", 1)[1]).dimensions
    assert first.dtype == np.float32
    assert first.shape == (3, dim)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(first, again)
    sims = first @ first.T
    assert sims[0, 1] > 0.5 > sims[0, 2]  # the emulator's vectors follow shared spellings
    assert len(emu.ledger.entries()) == 2  # one request per call of 3 texts


def test_the_embedder_name_keeps_models_and_endpoints_apart(emu: ProviderEmulator) -> None:
    assert _embedder(emu).name == f"{SMALL}@{emu.openai_url}"
    assert ApiEmbedder(SMALL).name == SMALL  # the provider's own API
    assert ApiEmbedder(GEMINI).name == GEMINI


def test_requests_hold_at_most_max_inputs_texts(emu: ProviderEmulator) -> None:
    _small_batches(emu, 4)
    price = embedding_price("text-embedding-3-small", emu.embedding_prices)
    embedder = _embedder(emu, price=price)
    texts = [f"review number {i}" for i in range(10)]
    with usage_scope() as usage:
        vectors = embedder.embed(texts)
    entries = emu.ledger.entries()
    assert len(entries) == 3  # 4 + 4 + 2, every one accepted
    assert all(e.status == 200 for e in entries)
    assert (usage.requests, usage.texts) == (3, 10)
    assert usage.tokens == sum(e.prompt_tokens for e in entries)
    assert usage.dollars == pytest.approx(emu.ledger.totals().dollars)
    # the same vectors as one unbatched request (the emulator's own limit again)
    emu.embedding_prices = {}
    np.testing.assert_allclose(vectors, _embedder(emu).embed(texts), atol=1e-6)
    assert len(emu.ledger) == 4


def test_an_unbatched_client_is_refused_by_the_emulator(emu: ProviderEmulator) -> None:
    """The batching test means something: the emulator enforces max_inputs."""
    _small_batches(emu, 4)
    with pytest.raises(semframe.errors.RequestRejected, match="4 dimensions or less"):
        _embedder(emu).embed([f"text {i}" for i in range(5)])


def test_batches_respect_the_token_limit_per_request() -> None:
    assert batches([5, 5, 5], max_inputs=100, max_tokens=10) == [(0, 2), (2, 3)]
    assert batches([12, 1], max_inputs=100, max_tokens=10) == [(0, 1), (1, 2)]
    assert batches([], max_inputs=3, max_tokens=0) == []


@pytest.mark.parametrize("name", [SMALL, GEMINI])
def test_a_too_long_text_fails_before_any_request(emu: ProviderEmulator, name: str) -> None:
    limit = embedding_price(name.split(":", 1)[1]).max_input_tokens
    long = " ".join(f"word{i}" for i in range(limit))  # several tokens per word
    with pytest.raises(InputError, match=f"at most {limit:,} tokens per text") as info:
        _embedder(emu, name).embed(["short", long])
    assert "text 2 of 2" in str(info.value)
    assert "Nothing was sent" in str(info.value)
    assert len(emu.ledger) == 0


def test_an_empty_text_fails_before_any_request(emu: ProviderEmulator) -> None:
    with pytest.raises(InputError, match="empty text"):
        _embedder(emu).embed(["fine", ""])
    assert len(emu.ledger) == 0


@pytest.mark.parametrize("fault", [Fault.server_error(503), Fault.rate_limit(retry_after=0.01)])
@pytest.mark.parametrize("name", [SMALL, GEMINI])
def test_transient_errors_are_retried(emu: ProviderEmulator, name: str, fault: Fault) -> None:
    rule = emu.faults.inject(fault, count=2)
    with usage_scope() as usage:
        vectors = _embedder(emu, name, max_retries=3).embed(["apple", "pear"])
    assert rule.fired == 2
    assert vectors.shape[0] == 2
    statuses = [e.status for e in emu.ledger.entries()]
    assert statuses == [fault.status, fault.status, 200]
    assert (usage.requests, usage.retries) == (3, 2)
    assert usage.rate_limited == (2 if fault.kind == "rate_limit" else 0)
    assert usage.dollars == pytest.approx(emu.ledger.totals().dollars)  # failures are free


def test_retries_run_out(emu: ProviderEmulator) -> None:
    emu.faults.inject(Fault.server_error(500), count=5)
    with pytest.raises(TransientError, match="after 2 attempts"):
        _embedder(emu, max_retries=1).embed(["apple"])
    assert len(emu.ledger) == 2


def test_unknown_models_name_the_known_ones() -> None:
    with pytest.raises(InputError, match="text-embedding-3-large") as info:
        embedders.resolve_embed_model("openai:text-embedding-ada-002")
    assert "gemini:gemini-embedding-001" in str(info.value)
    with pytest.raises(InputError, match="unknown embed_model"):
        embedders.resolve_embed_model("gemini:text-embedding-3-small")  # another provider's
    with pytest.raises(InputError, match="unknown embed_model 'openai:nope'"):
        DOCS.llm.search("apple", column="text", embed_model="openai:nope")


def test_api_names_cannot_be_registered() -> None:
    with pytest.raises(InputError, match="built in"):
        embedders.register_embedder("openai:mine", _never)


def _never() -> embedders.Embedder:
    raise AssertionError


def test_a_missing_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(semframe.errors.ConfigError, match="GEMINI_API_KEY"):
        ApiEmbedder(GEMINI)


def test_a_missing_sdk_gives_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "openai", None)  # import openai -> ImportError
    with pytest.raises(semframe.errors.MissingDependencyError, match=r"semframe\[openai\]"):
        DOCS.llm.search("apple", column="text", embed_model=SMALL)


# -- the operators --------------------------------------------------------------------


def test_search_end_to_end_and_the_estimate_is_the_bill(emu: ProviderEmulator) -> None:
    settings = {"embed_model": SMALL, "base_url": emu.openai_url}
    est = DOCS.llm.search("apple", column="text", k=3, estimate=True, **settings)
    assert len(emu.ledger) == 0  # an estimate sends nothing
    out = DOCS.llm.search("apple", column="text", k=3, **settings)
    assert set(out.index) == {"d", "f", "a"}  # the three apples
    assert out.index[2] == "a"  # the one with most else in it last
    assert out["similarity"].is_monotonic_decreasing
    bill = emu.ledger.totals()
    assert (est.backend, est.model) == ("openai", "text-embedding-3-small")
    assert est.requests == bill.requests == 1
    assert est.planned.input_tokens == bill.prompt_tokens
    assert est.dollars == pytest.approx(bill.dollars)
    assert est.dollars > 0
    op, run = semframe.last_op(), semframe.last_run()
    assert op is not None and run is not None
    assert op.counts["texts_embedded"] == 6  # 5 rows with text and the query
    assert op.counts["embedding_requests"] == 1
    assert op.counts["embedding_tokens"] == bill.prompt_tokens
    assert (run.op, run.backend, run.model) == ("search", "openai", "text-embedding-3-small")
    assert run.dollars == pytest.approx(bill.dollars)


def test_the_store_reuses_vectors_across_calls(emu: ProviderEmulator) -> None:
    settings = {"embed_model": SMALL, "base_url": emu.openai_url}
    first = DOCS.llm.search("apple", column="text", k=3, **settings)
    sent = len(emu.ledger)
    again = DOCS.llm.search("apple", column="text", k=3, **settings)
    assert len(emu.ledger) == sent == 1  # the second call sends nothing
    pd.testing.assert_frame_equal(first, again)
    assert semframe.last_op().counts["vectors_reused"] == 6  # type: ignore[union-attr]
    warm = DOCS.llm.search("apple", column="text", k=3, estimate=True, **settings)
    assert (warm.requests, warm.dollars) == (0, 0.0)
    # one new text: only it is priced and sent
    more = pd.concat([DOCS, pd.DataFrame({"text": ["apple crumble"]}, index=["g"])])
    est = more.llm.search("apple", column="text", k=3, estimate=True, **settings)
    more.llm.search("apple", column="text", k=3, **settings)
    new = emu.ledger.entries()[-1]
    assert est.requests == 1
    assert est.planned.input_tokens == new.prompt_tokens
    assert est.dollars == pytest.approx(new.dollars)


def test_dedup_and_cluster_with_gemini(emu: ProviderEmulator) -> None:
    settings = {"embed_model": GEMINI, "base_url": emu.gemini_url}
    frame = pd.DataFrame({"t": ["Apple pie", "apple pie!", "fast car", "Fast car"]})
    est = frame.llm.dedup(column="t", threshold=0.6, estimate=True, **settings)
    out = frame.llm.dedup(column="t", threshold=0.6, **settings)
    assert out.iloc[:, -1].tolist() == [0, 0, 1, 1]
    bill = emu.ledger.totals()
    assert (est.backend, est.model, est.exact_tokens) == ("gemini", "gemini-embedding-001", False)
    assert est.planned.input_tokens == bill.prompt_tokens
    assert est.dollars == pytest.approx(bill.dollars)
    clusters = frame.llm.cluster(column="t", k=2, **settings)
    assert len(emu.ledger) == 1  # the same texts: read from the store
    assert clusters.iloc[:, -1].tolist()[0] == clusters.iloc[:, -1].tolist()[1]


def test_a_too_long_cell_stops_the_operator_before_any_request(emu: ProviderEmulator) -> None:
    long = " ".join(f"word{i}" for i in range(9000))
    frame = pd.DataFrame({"t": ["apple", long]})
    with pytest.raises(InputError, match="8,192 tokens per text"):
        frame.llm.search("apple", column="t", embed_model=SMALL, base_url=emu.openai_url)
    assert len(emu.ledger) == 0


def test_a_budget_below_the_estimate_sends_nothing(emu: ProviderEmulator) -> None:
    settings = {"embed_model": SMALL, "base_url": emu.openai_url, "backend": "openai"}
    est = DOCS.llm.search("apple", column="text", estimate=True, **settings)
    assert est.dollars is not None and est.dollars > 0
    with pytest.raises(BudgetExceeded, match="nothing was sent"):
        DOCS.llm.search("apple", column="text", budget=f"${est.dollars / 2:.10f}", **settings)
    assert len(emu.ledger) == 0
    out = DOCS.llm.search("apple", column="text", k=2, budget="$1", **settings)
    assert len(out) == 2


def test_an_estimate_needs_no_key(emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    est = DOCS.llm.search("apple", column="text", embed_model=GEMINI, estimate=True)
    assert est.requests == 1 and est.dollars is not None and est.dollars > 0


def test_a_verified_dedup_estimate_embeds_nothing_it_would_bill(emu: ProviderEmulator) -> None:
    """Finding dedup's uncertain pairs needs the vectors: an estimate never buys them."""
    settings = {"embed_model": SMALL, "base_url": emu.openai_url, "backend": "fake"}
    frame = pd.DataFrame({"t": ["Apple pie", "apple pie!", "fast car", "Fast car", "apple"]})
    cold = frame.llm.dedup(column="t", threshold=0.9, verify=True, estimate=True, **settings)
    assert len(emu.ledger) == 0  # nothing embedded, nothing billed
    assert cold.requests == 1  # the embedding request only
    assert any("not counted" in n for n in cold.notes)
    plan = frame.llm.plan("t", op="dedup", threshold=0.9, verify=True, **settings)
    assert plan.llm is None and len(emu.ledger) == 0
    frame.llm.dedup(column="t", threshold=0.9, verify=True, **settings)
    asked = semframe.last_op().counts["asked"]  # type: ignore[union-attr]
    sent = len(emu.ledger)
    # once the vectors are stored, the estimate finds and counts the questions for free
    warm = frame.llm.dedup(column="t", threshold=0.9, verify=True, estimate=True, **settings)
    assert len(emu.ledger) == sent
    assert asked > 0 and any(n.startswith(f"{asked} uncertain pairs") for n in warm.notes)
    assert warm.requests == 0  # their answers, too, are in the result cache now


def test_join_blocking_refuses_an_api_model_before_anything_is_sent(
    emu: ProviderEmulator,
) -> None:
    left = pd.DataFrame({"film": ["matrix, the", "heat (1995)"]})
    right = pd.DataFrame({"title": ["Heat", "The Matrix"]})
    for settings in ({"block_model": SMALL}, {"embed_model": SMALL}):
        with pytest.raises(InputError, match=r"API embedding model .* not supported"):
            left.llm.join(
                right,
                "Is {left.film} the film {right.title}?",
                block="embedding",
                backend="fake",
                base_url=emu.openai_url,
                estimate=True,
                **settings,
            )
    assert len(emu.ledger) == 0


def test_a_budget_counts_what_the_embeddings_cost(emu: ProviderEmulator) -> None:
    """The embedding bill comes out of the call's budget before the LLM questions run."""
    from semframe.backends import get_backend

    settings = {"embed_model": SMALL, "base_url": emu.openai_url, "backend": "fake"}
    common = " ".join(f"word{i}" for i in range(30))
    own = [" ".join(f"own{i}x{j}" for j in range(30)) for i in range(12)]
    frame = pd.DataFrame({"t": [f"{common} {o}" for o in own]})  # 66 pairs in the band
    dedup = {"column": "t", "threshold": 0.9, "verify": True, "band": 0.8}
    est = frame.llm.dedup(**dedup, estimate=True, **settings)
    embedding_tokens = est.planned.input_tokens  # about 2,200; a question is about 270
    fake = get_backend("fake", model=None, settings={})
    before = len(fake.history)  # type: ignore[attr-defined]
    with pytest.raises(BudgetExceeded) as caught:
        frame.llm.dedup(**dedup, budget=f"{embedding_tokens + 300} tokens", **settings)
    assert emu.ledger.totals().prompt_tokens == embedding_tokens
    assert caught.value.spent is not None and caught.value.spent >= embedding_tokens
    # room for at most one question after the embeddings (without counting them: 9)
    assert len(fake.history) - before <= 1  # type: ignore[attr-defined]


def test_stored_vectors_need_no_key_even_to_plan_a_verified_dedup(
    emu: ProviderEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"embed_model": GEMINI, "base_url": emu.gemini_url, "backend": "fake"}
    frame = pd.DataFrame({"t": ["Apple pie", "apple pie!", "fast car", "Fast car"]})
    frame.llm.dedup(column="t", threshold=0.9, **settings)  # the vectors are stored now
    sent = len(emu.ledger)
    monkeypatch.delenv("GEMINI_API_KEY")
    est = frame.llm.dedup(
        column="t", threshold=0.9, verify=True, band=0.5, estimate=True, **settings
    )
    assert any("uncertain pairs" in n for n in est.notes)
    assert len(emu.ledger) == sent


def test_the_estimate_counts_requests_as_the_store_sends_them(emu: ProviderEmulator) -> None:
    """The store computes 1,024 texts at a time: 1,500 texts are two requests, not one."""
    settings = {"embed_model": SMALL, "base_url": emu.openai_url}
    frame = pd.DataFrame({"t": [f"text number {i}" for i in range(1500)]})
    est = frame.llm.search("text", column="t", k=1, estimate=True, **settings)
    frame.llm.search("text", column="t", k=1, **settings)
    assert est.requests == len(emu.ledger) == 2


def test_an_attempt_that_may_have_been_billed_is_counted(emu: ProviderEmulator) -> None:
    embedder = _embedder(emu, max_retries=1)
    answer = [[1.0] + [0.0] * (embedder.dim - 1)]
    calls: list[int] = []

    def send(texts: list[str]) -> tuple[list[list[float]], int | None]:
        calls.append(len(texts))
        if len(calls) == 1:
            raise RuntimeError("connection dropped after the request was sent")
        return answer * len(texts), None

    embedder._send = send  # type: ignore[method-assign]
    embedder._classify = lambda exc: TransientError("dropped", maybe_billed=True)  # type: ignore[method-assign]
    counted = embedder.count(["hello world"])[0]
    with usage_scope() as usage:
        embedder.embed(["hello world"])
    assert (usage.requests, usage.retries) == (2, 1)
    assert usage.tokens == 2 * counted  # the lost attempt's tokens too
