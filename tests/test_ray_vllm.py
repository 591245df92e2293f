"""Two vLLM replicas on a local 2-CPU Ray cluster: each an engine of its own, with our scheduler.

``executor="ray", replicas=2, backend="vllm"``: each replica is a Ray actor
reserving one CPU and running its own in-process vLLM engine (the CPU build,
SmolLM2-135M converted from the pip-installed GGUF file) with semframe's
relQuery-aware scheduler. Each prefix group goes whole to one replica, so each
engine serves its group's long shared info from its own prefix cache; the
cached tokens per replica are the engines' own counts
(``RequestOutput.num_cached_tokens``), not a simulation.

Run by ``make test-vllm`` (its own environment, ``.venv-vllm``, which has Ray);
skipped, with the reason, where vLLM or Ray is not installed. A few minutes on
2 cores: each replica starts an engine.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import semframe
from semframe.backends import reset_backends
from semframe.serving.vllm import installed_version

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

if installed_version() is None:
    pytest.skip(
        "vLLM is not installed here; `make test-vllm` installs its CPU build in .venv-vllm "
        "and runs these tests",
        allow_module_level=True,
    )
ray = pytest.importorskip("ray", reason='executor="ray" needs Ray (pip install "semframe[ray]")')

from semframe.runtime import ray_executor  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "movies_slice.csv"
ENGINE = {"max_model_len": 2048, "max_num_seqs": 2}
SETTINGS: dict[str, Any] = {
    "backend": "vllm",
    "vllm_scheduler": "relserve",
    "vllm_args": ENGINE,
    "executor": "ray",
    "replicas": 2,
    "ray_num_cpus": 1,
    "cache": False,
    "max_tokens": 8,
    "truncated": "keep",  # an eight-token answer may be cut: kept, marked
}


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    # Read by the engines in the replicas' processes, which inherit the driver's
    # environment through Ray's runtime environment.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    for key, value in env.items():
        os.environ.setdefault(key, value)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {k: os.environ[k] for k in env}},
    )
    yield
    ray_executor.shutdown_replicas()
    ray.shutdown()
    reset_backends("vllm")
    gc.collect()


def _two_films(per_film: int) -> pd.DataFrame:
    """``per_film`` reviews of each of two films with a long description, interleaved."""
    df = pd.read_csv(DATA)
    df = df[df.review_content.fillna("").str.strip() != ""]
    df = df[df.movie_info.fillna("").str.len() > 400]  # long shared info: whole cache blocks
    top = df.movie_title.value_counts().index[:2]
    parts = [df[df.movie_title == title].head(per_film) for title in top]
    rows = [part.iloc[i] for i in range(per_film) for part in parts]
    out = pd.DataFrame(rows)[["movie_title", "movie_info", "review_content"]]
    out.index = [f"row{i}" for i in range(len(out))]
    return out


def test_two_vllm_engines_each_cache_their_own_prefix_groups(tmp_path: Path) -> None:
    df = _two_films(3)
    assert len(df) == 6
    template = (
        "Movie: {movie_title}. {movie_info} In five words, what does this review say? "
        "{review_content}"
    )
    trace = tmp_path / "trace.jsonl"  # both engines' schedulers append their steps here
    engine = {**ENGINE, "additional_config": {"semframe": {"trace": str(trace)}}}
    settings: dict[str, Any] = {**SETTINGS, "vllm_args": engine}
    out = df.llm.map(template, **settings)
    pd.testing.assert_frame_equal(out[list(df.columns)], df)  # order and index kept
    assert out["llm_output"].map(lambda s: isinstance(s, str) and s.strip() != "").all()

    stats = semframe.last_run()
    assert stats is not None
    assert stats.errors == 0 and stats.rows == 6 and stats.requests == 6
    replicas = stats.replicas
    assert len(replicas) == 2 and not any(r.died for r in replicas)
    # A film's rows are one prefix group: the partition gives each replica one
    # (groups are kept whole: tests/test_ray_partition.py).
    assert sorted(r.rows for r in replicas) == [3, 3]
    assert sum(r.prompt_tokens for r in replicas) == stats.prompt_tokens
    assert sum(r.cached_tokens for r in replicas) == stats.cached_tokens
    assert sum(r.output_tokens for r in replicas) == stats.output_tokens
    # Each engine served long prefixes from its own cache for the rows after its
    # first, what vLLM itself counted for each request: at least a film's info
    # (~100 tokens) a row.
    actors = ray_executor.live_replicas()
    assert len(actors) == 2
    infos = list(dict.fromkeys(df["movie_info"]))
    sizes = ray.get(
        actors[0].__ray_call__.remote(lambda replica: replica.backend.count_tokens(infos))
    )
    for r in replicas:
        assert r.cached_tokens < r.prompt_tokens, r
        assert r.cached_tokens >= (r.rows - 1) * min(sizes), r

    # Our scheduler admitted every request, in the engine that answered it.
    admitted = [
        entry
        for line in trace.read_text(encoding="utf-8").splitlines()
        for entry in json.loads(line)["admitted"]
    ]
    assert len(admitted) == 6

    names = ray.get(
        [a.__ray_call__.remote(lambda replica: type(replica.backend).__name__) for a in actors]
    )
    assert names == ["VllmBackend", "VllmBackend"]
