"""Two llama.cpp replicas on a local 2-CPU Ray cluster: cached tokens as the engines report them.

``executor="ray", replicas=2, backend="local"``: each replica is a Ray actor
reserving one CPU and running its own embedded engine with the real model (one
thread: the CPU it reserves). Each prefix group goes whole to one replica, so
each engine serves its group's long shared head from its slot cache; the
cached tokens per replica are the engines' own figures (llama.cpp's
``prompt_tokens_details.cached_tokens``), not a simulation.

Runs where Ray and the local engine are installed (``make test`` installs
both); skipped, with the reason, otherwise. About 15 s on 2 cores.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pandas as pd
import pytest

import semframe
from semframe.backends import reset_backends
from tests.conftest import skip_without_local_engine

ray = pytest.importorskip("ray", reason='executor="ray" needs Ray (pip install "semframe[ray]")')
skip_without_local_engine()

from semframe.runtime import ray_executor  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.local,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

HEADS = {
    "Alien": (
        "Alien (1979), directed by Ridley Scott and written by Dan O'Bannon from a story by "
        "O'Bannon and Ronald Shusett: the seven crew members of the commercial towing "
        "spaceship Nostromo, on their way back to Earth with a refinery and twenty million "
        "tons of mineral ore, are woken early from stasis by a transmission from a desolate "
        "moon. Three of them go down to look, find a derelict ship and a chamber full of "
        "eggs, and bring aboard a creature that kills them one by one. Starring Sigourney "
        "Weaver, Tom Skerritt, Veronica Cartwright, Harry Dean Stanton, John Hurt, Ian Holm "
        "and Yaphet Kotto; music by Jerry Goldsmith; creature designed by H. R. Giger."
    ),
    "Cats": (
        "Cats (2019), directed by Tom Hooper from the stage musical by Andrew Lloyd Webber, "
        "itself based on Old Possum's Book of Practical Cats by T. S. Eliot: a young cat "
        "abandoned in a London alley is taken in by a tribe of cats called the Jellicles on "
        "the night of their yearly ball, when their leader Old Deuteronomy chooses one of "
        "them to ascend to the Heaviside Layer and come back to a new life, while the "
        "criminal Macavity kidnaps the candidates one by one. Starring Francesca Hayward, "
        "Judi Dench, Idris Elba, Jennifer Hudson, Ian McKellen and Taylor Swift."
    ),
}
# Three rows about each film, interleaved, under labels in no order.
REVIEWS = pd.DataFrame(
    {
        "film": [HEADS[m] for m in ["Alien", "Cats", "Alien", "Cats", "Cats", "Alien"]],
        "review": ["tense", "awful", "scary", "a mess", "too long", "great"],
    },
    index=[15, 4, 42, 8, 23, 16],
)
SETTINGS = {
    "backend": "local",
    "executor": "ray",
    "replicas": 2,
    "ray_num_cpus": 1,
    "local_parallel": 1,
    "local_n_ctx": 512,
    "max_tokens": 4,
    "truncated": "keep",  # a four-token answer may be cut: kept, marked
    "cache": False,
}


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray_executor.shutdown_replicas()
    ray.shutdown()
    reset_backends("local")
    gc.collect()


def test_two_engines_each_cache_their_own_prefix_groups() -> None:
    template = "In one word, how does {review} judge {film}?"
    est = REVIEWS.llm.estimate(template, op="map", **SETTINGS)
    out = REVIEWS.llm.map(template, **SETTINGS)
    pd.testing.assert_frame_equal(out[["film", "review"]], REVIEWS)  # order and index kept
    assert out["llm_output"].map(lambda s: isinstance(s, str) and s.strip() != "").all()

    stats = semframe.last_run()
    assert stats is not None
    assert stats.errors == 0 and stats.rows == 6
    replicas = stats.replicas
    assert len(replicas) == 2 and not any(r.died for r in replicas)
    assert [r.rows for r in replicas] == [3, 3]  # one prefix group each, kept whole
    assert sum(r.prompt_tokens for r in replicas) == stats.prompt_tokens
    assert sum(r.cached_tokens for r in replicas) == stats.cached_tokens
    assert sum(r.output_tokens for r in replicas) == stats.output_tokens
    # The estimate, partitioned as the run was and each replica's slot cache simulated
    # on its own (chat template included), against what the two engines reported
    # (1,303 vs 1,309 prompt tokens, 778 vs 782 cached, when this was written).
    assert est.planned.input_tokens == pytest.approx(stats.prompt_tokens, rel=0.02)
    assert est.planned.cached_tokens == pytest.approx(stats.cached_tokens, rel=0.05)

    actors = ray_executor.live_replicas()
    heads = ray.get(
        actors[0].__ray_call__.remote(
            lambda replica: replica.backend.count_tokens(list(HEADS.values()))
        )
    )
    # Each engine served its group's head from its slot cache for every row after
    # its first: what llama.cpp itself reported for each request.
    for r in replicas:
        assert 0 < r.cached_tokens < r.prompt_tokens
        assert r.cached_tokens >= (r.rows - 1) * min(heads), r

    threads = [
        ray.get(a.__ray_call__.remote(lambda replica: replica.backend.key.threads)) for a in actors
    ]
    assert threads == [1, 1], "each engine computes on the one CPU its replica reserves"
