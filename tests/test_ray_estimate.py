"""The estimate of an ``executor="ray"`` run: partitioned as the run is, priced per replica."""

from __future__ import annotations

import pandas as pd
import pytest

from semframe.backends import get_backend
from semframe.backends.fake import FakeBackend

ROWS = pd.DataFrame(
    {
        "movie": [f"movie {i % 6} " * 20 for i in range(60)],
        "review": [f"review number {i} " * 5 for i in range(60)],
    }
)


def test_engine_replicas_are_priced_each_with_its_own_cache() -> None:
    fake = get_backend("fake", model=None, settings={})
    assert isinstance(fake, FakeBackend)
    sent = len(fake.history)
    one = ROWS.llm.estimate("Rate {review} of {movie}", op="map", backend="fake")
    two = ROWS.llm.estimate(
        "Rate {review} of {movie}", op="map", backend="fake", executor="ray", replicas=2
    )
    assert two.rows == one.rows == 60
    assert two.planned.requests == one.planned.requests == 60
    assert two.planned.input_tokens == one.planned.input_tokens
    # Whole prefix groups go to one replica; the instructions are paid once on each.
    assert one.planned.cached_tokens - 10 <= two.planned.cached_tokens < one.planned.cached_tokens
    assert "2 replicas with work" in two.notes[-1]
    assert len(fake.history) == sent  # nothing sent (and no Ray cluster joined)


def test_replicas_sharing_an_endpoint_are_priced_as_clients_of_one_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each API replica sends its shard as a client of its own; the provider's cache is one."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    template = "Is the review {review} positive about {movie}? " + "Rubric. " * 900
    for backend, model in (("openai", "gpt-4o-mini"), ("anthropic", "claude-sonnet-4-5")):
        kwargs = {"op": "filter", "backend": backend, "model": model}
        one = ROWS.llm.estimate(template, **kwargs)
        two = ROWS.llm.estimate(template, executor="ray", replicas=2, **kwargs)
        assert two.planned.requests == one.planned.requests == 60
        assert two.planned.input_tokens == one.planned.input_tokens
        assert two.planned.cached_tokens <= one.planned.cached_tokens
        assert any("client of its own" in note for note in two.notes)
        assert two.planned.wall_seconds is not None and one.planned.wall_seconds is not None
        if backend == "anthropic":
            # Both replicas start at once: each writes the shared instructions before
            # either can read them (one client writes them once).
            assert two.planned.cache_write_tokens > one.planned.cache_write_tokens


def test_api_replicas_below_the_cache_minimum_are_timed_as_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing cacheable: the counts are one client's, the wall time that of the replicas."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    kwargs = {"op": "filter", "backend": "openai", "model": "gpt-4o-mini"}
    one = ROWS.llm.estimate("Is the review {review} positive about {movie}?", **kwargs)
    two = ROWS.llm.estimate(
        "Is the review {review} positive about {movie}?", executor="ray", replicas=2, **kwargs
    )
    assert two.planned.cached_tokens == one.planned.cached_tokens == 0
    assert two.planned.input_tokens == one.planned.input_tokens
    assert two.planned.cost == one.planned.cost
    assert one.planned.wall_seconds is not None and two.planned.wall_seconds is not None
    # Two clients send and take in answers side by side: the client's own pace halves.
    assert two.planned.wall_seconds < one.planned.wall_seconds
    assert two.original.wall_seconds is not None and one.original.wall_seconds is not None
    assert two.original.wall_seconds < one.original.wall_seconds
