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


def test_replicas_sharing_an_endpoint_are_priced_as_one_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    template = "Is the review {review} positive about {movie}? " + "Rubric. " * 900
    kwargs = {"op": "filter", "backend": "openai", "model": "gpt-4o-mini"}
    one = ROWS.llm.estimate(template, **kwargs)
    four = ROWS.llm.estimate(template, executor="ray", replicas=4, **kwargs)
    assert four.planned == one.planned
    assert "one client" in four.notes[-1]
