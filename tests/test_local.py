"""The embedded llama.cpp engine with its real model (slow: a few rows only).

Runs when ``semframe[local]`` is installed (as ``make test`` installs it);
skipped, with the reason printed, otherwise.
"""

from __future__ import annotations

import pandas as pd
import polars as pl
import pytest

import semframe
from semframe.backends.local import LocalBackend, resolve_model
from semframe.errors import ConfigError
from tests.conftest import LOCAL_REVIEWS as REVIEWS
from tests.conftest import skip_without_local_engine

pytestmark = pytest.mark.local

skip_without_local_engine()


@pytest.fixture(scope="module")
def settings() -> dict[str, object]:
    return {"backend": "local", "local_parallel": 2, "local_n_ctx": 1024, "progress": "off"}


def test_filter_on_the_real_model(settings: dict[str, object]) -> None:
    liked = REVIEWS.llm.filter("Is the review {review} positive about {movie}?", **settings)
    stats = semframe.last_run()
    assert stats is not None
    assert stats.errors == 0
    assert stats.prompt_tokens > 0
    assert stats.output_tokens > 0
    assert set(liked.index) <= {"x", "y", "z"}
    assert list(liked.index) == sorted(liked.index), "input order kept"
    # Every answer parsed (errors == 0). What the 135M model answers is its own
    # business: its accuracy is measured in benchmarks/local_models.py, not asserted.


def test_map_on_polars_and_prefix_reuse(settings: dict[str, object]) -> None:
    df = pl.from_pandas(REVIEWS.reset_index(drop=True))
    out = df.llm.map("Name the movie {movie} and one word for {review}.", max_tokens=8, **settings)
    assert out.columns == ["movie", "review", "llm_output"]
    assert all(isinstance(v, str) and v for v in out["llm_output"].to_list())
    stats = semframe.last_run()
    assert stats is not None
    assert stats.cached_tokens > 0, "the shared instructions are served from the slot cache"


def test_exact_token_counts_and_context_check(settings: dict[str, object]) -> None:
    backend = LocalBackend(parallel=2, n_ctx=1024)
    counts = backend.count_tokens(["hello world", "hello world " * 50])
    assert 1 <= counts[0] < counts[1] <= 200
    long = pd.DataFrame({"review": ["word " * 3000]})
    with pytest.raises(semframe.InputError, match="truncate=\\{'review': "):
        long.llm.map("Summarize {review}", **settings)


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="Known models: 'smollm2-135m', 'gemma-3-270m'"):
        resolve_model("llama-70b")


def test_api_backends_end_to_end_against_the_embedded_llama_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The llama.cpp server speaks both wire formats and reports cached tokens."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "not-checked-by-llama.cpp")
    local = semframe.backends.get_backend("local", model=None, settings=semframe.config())
    address = local.engine.address  # type: ignore[attr-defined]
    frame = pd.DataFrame({"movie": ["Alien"] * 3, "review": ["tense", "slow", "great"]})
    out = frame.llm.map(
        "In three words, summarize {review} of {movie}.",
        backend="openai",
        base_url=address + "/v1",
        model="smollm2",
        max_tokens=8,
        truncated="keep",  # three words may run past 8 tokens: keep them, marked
    )
    assert out["llm_output"].map(lambda s: isinstance(s, str) and s.strip() != "").all()
    stats = semframe.last_run()
    assert stats is not None and stats.prompt_tokens > 0 and stats.cached_tokens > 0
    kept = frame.llm.map(
        "In three words, summarize {review} of {movie}.",
        backend="anthropic",
        base_url=address,
        model="smollm2",
        max_tokens=8,
        truncated="keep",  # three words may run past 8 tokens: keep them, marked
    )
    assert list(kept.index) == list(frame.index)
    stats = semframe.last_run()
    assert stats is not None and stats.prompt_tokens > 0 and stats.cached_tokens > 0
