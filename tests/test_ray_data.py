"""semframe.ray: the row-by-row operators over a ray.data.Dataset, on a local 2-CPU Ray cluster.

One Ray cluster serves the whole module; the replicas (two, half a CPU each)
are reused between tests whose settings match, which leaves a CPU for Ray
Data's own tasks. Each result is compared with the DataFrame operator on the
same rows (``ds.to_pandas()``): same answers, same order. Backends and
helpers defined here travel to the replicas and to Ray Data's workers by
value (the workers cannot import this module).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends import BACKENDS, register_backend, reset_backends
from semframe.backends.fake import DEFAULT_MODEL, FakeBackend, default_answer
from semframe.core.wire import Request
from semframe.errors import (
    ColumnError,
    ConfigError,
    InputError,
    MissingDependencyError,
    RowErrors,
)

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from semframe.runtime import ray_executor  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

RAY: dict[str, Any] = {"replicas": 2, "ray_num_cpus": 0.5, "cache": False, "max_retries": 0}
"""The settings of most calls here; with one ``cache_dir`` (below), one pool of replicas."""
TEMPLATE = "Summarize {review} of {movie}"
DRIVER = os.getpid()


def _answer(request: Request) -> str:
    """The fake model's answer, but none (a row error) for a row that mentions 'broken'."""
    return "" if "broken" in request.prompt else default_answer(request)


def _fake(model: str | None, settings: object) -> FakeBackend:
    return FakeBackend(_answer, model=model or DEFAULT_MODEL)


@pytest.fixture(scope="module", autouse=True)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # The replicas are kept while the settings stay the same, the backend's spec and
    # cache_dir included (each test gets its own by default): one fake backend and one
    # cache_dir for the whole module keep one pool of replicas.
    RAY["cache_dir"] = str(tmp_path_factory.mktemp("cache"))
    previous = BACKENDS["fake"]
    register_backend("fake", _fake)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    progress = context.enable_progress_bars
    context.enable_progress_bars = False
    yield
    context.enable_progress_bars = progress
    ray_executor.shutdown_replicas()
    ray.shutdown()
    register_backend("fake", previous)
    reset_backends()
    gc.collect()


def _movies(n: int, movies: int = 5) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "movie": [f"movie number {i % movies} with a longer title" for i in range(n)],
            "review": [f"review {i}: a {'great' if i % 3 else 'dull'} film" for i in range(n)],
            "year": [1970 + i for i in range(n)],
            "score": [i / 4 for i in range(n)],
        }
    )


def _dataset(df: pd.DataFrame, blocks: int = 3) -> Any:
    """``df`` as a Dataset of ``blocks`` blocks (at most one per row)."""
    size = -(-len(df) // max(1, min(blocks, len(df))))
    return ray.data.from_pandas([df.iloc[i : i + size] for i in range(0, len(df), size)])


def _rows(ds: Any) -> pd.DataFrame:
    """A result Dataset on the driver, as the DataFrame operator would give it.

    Ray Data gives a Dataset without rows as a frame without columns: its
    schema names them.
    """
    frame: pd.DataFrame = ds.to_pandas().reset_index(drop=True)
    if frame.empty and not len(frame.columns):
        return pd.DataFrame({c: [] for c in ds.schema().names})
    return frame


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    want = want.reset_index(drop=True)
    assert list(got.columns) == list(want.columns)
    for column in want.columns:
        left = [None if v is pd.NA or v != v else v for v in want[column].tolist()]
        right = [None if v is None or v != v else v for v in got[column].tolist()]
        assert right == left, column


def test_every_operator_matches_the_dataframe_path() -> None:
    df = _movies(24)
    ds = _dataset(df)
    got = semframe.ray.map(ds, TEMPLATE, out="summary", backend="fake", **RAY)
    stats = semframe.last_run()
    assert stats is not None and len(stats.replicas) == 2
    assert sum(r.rows for r in stats.replicas) == 24
    assert "on 2 Ray replicas" in repr(stats)
    assert isinstance(got, ray.data.Dataset)
    _same(_rows(got), semframe.llm(df).map(TEMPLATE, out="summary", backend="fake", cache=False))

    question = "Is {review} of {movie} good?"
    kept = semframe.ray.filter(ds, question, backend="fake", **RAY)
    want = semframe.llm(df).filter(question, backend="fake", cache=False)
    assert 0 < len(want) < len(df)
    _same(_rows(kept), want)

    schema = {"released": int, "scary": bool}
    extracted = semframe.ray.extract(ds, "Read {review}.", schema, backend="fake", **RAY)
    _same(
        _rows(extracted),
        semframe.llm(df).extract("Read {review}.", schema, backend="fake", cache=False),
    )
    types = dict(zip(extracted.schema().names, map(str, extracted.schema().types), strict=True))
    assert (types["released"], types["scary"]) == ("int64", "bool")

    labels = ["fine", "dull"]
    got = _rows(semframe.ray.classify(ds, "Rate {review}.", labels, backend="fake", **RAY))
    _same(got, semframe.llm(df).classify("Rate {review}.", labels, backend="fake", cache=False))


frames = st.lists(
    st.tuples(
        st.sampled_from(["Alien", "Heat", "Up"]), st.sampled_from(["great", "dull", "", "fun"])
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames, st.integers(1, 4), st.booleans())
def test_order_is_restored_for_a_dataset(
    rows: list[tuple[str, str]], blocks: int, keep: bool
) -> None:
    df = pd.DataFrame(
        {
            "movie": [m for m, _ in rows],
            "review": [r for _, r in rows],
            "row": list(range(len(rows))),
        }
    )
    ds = _dataset(df, blocks)
    if keep:
        got = _rows(semframe.ray.filter(ds, "Is {review} of {movie} good?", backend="fake", **RAY))
        want = semframe.llm(df).filter("Is {review} of {movie} good?", backend="fake", cache=False)
    else:
        got = _rows(semframe.ray.map(ds, TEMPLATE, backend="fake", **RAY))
        want = semframe.llm(df).map(TEMPLATE, backend="fake", cache=False)
    _same(got, want)
    assert got["row"].tolist() == sorted(got["row"].tolist())


def test_a_lazy_dataset_keeps_the_order_of_its_source() -> None:
    """A read and a map_batches over 6 blocks, the default context (preserve_order off)."""
    assert not ray.data.DataContext.get_current().execution_options.preserve_order
    ds = ray.data.range(30, override_num_blocks=6).map_batches(
        lambda b: {"movie": [f"m{i % 4}" for i in b["id"]], "review": b["id"].astype(str)}
    )
    got = _rows(semframe.ray.map(ds, TEMPLATE, backend="fake", **RAY))
    df = pd.DataFrame(
        {"movie": [f"m{i % 4}" for i in range(30)], "review": [str(i) for i in range(30)]}
    )
    _same(got, semframe.llm(df).map(TEMPLATE, backend="fake", cache=False))
    assert not ds.context.execution_options.preserve_order  # the caller's context is restored


class Secret:
    """A cell the driver must never read: unpickling it in the test's process fails."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _unpickle_secret, (self.text,)


def _unpickle_secret(text: str) -> Secret:
    if os.getpid() == DRIVER:
        msg = "a column the template does not name was brought to the driver"
        raise AssertionError(msg)
    return Secret(text)


def test_other_columns_never_reach_the_driver() -> None:
    df = _movies(12)
    df["secret"] = pd.Series([Secret(f"s{i}") for i in range(12)], dtype=object)
    ds = _dataset(df, 3)
    got = semframe.ray.map(ds, TEMPLATE, backend="fake", **RAY)
    seen = got.map(lambda row: {"secret": row["secret"].text, "answer": row["llm_output"]})
    rows = _rows(seen)
    want = semframe.llm(df.drop(columns=["secret"])).map(TEMPLATE, backend="fake", cache=False)
    assert rows["secret"].tolist() == [f"s{i}" for i in range(12)]
    assert rows["answer"].tolist() == want["llm_output"].tolist()


def test_estimate_returns_the_estimate() -> None:
    ds = _dataset(_movies(6))
    est = semframe.ray.map(ds, TEMPLATE, backend="fake", estimate=True, **RAY)
    assert isinstance(est, semframe.Estimate)
    assert est.planned.requests == 6


def test_bad_input_fails_before_anything_is_read_or_sent() -> None:
    df = _movies(4)
    ds = _dataset(df)
    with pytest.raises(InputError, match=r"takes a ray.data.Dataset, got DataFrame.*df.llm.map"):
        semframe.ray.map(df, TEMPLATE, backend="fake")  # type: ignore[arg-type]
    with pytest.raises(ColumnError, match=r"'plot'.*'movie', 'review', 'year', 'score'"):
        semframe.ray.map(ds, "Summarize {plot}", backend="fake", **RAY)
    with pytest.raises(ConfigError, match="replicas"):
        semframe.ray.map(ds, TEMPLATE, backend="fake", replicas=0)
    with pytest.raises(ConfigError, match="executor='ray'; got executor='local'"):
        semframe.ray.filter(ds, TEMPLATE, backend="fake", executor="local")
    with pytest.raises(InputError, match="out='movie' would overwrite an existing column"):
        semframe.ray.map(ds, TEMPLATE, out="movie", backend="fake", **RAY)
    with pytest.raises(ConfigError, match=r"replicas=8 x ray_num_cpus=1 needs 8 CPU"):
        semframe.ray.classify(ds, "{review}", ["a", "b"], backend="fake", replicas=8)
    with pytest.raises(ConfigError, match=r"hold 2 of the Ray cluster's 2 CPU.*Ray Data's tasks"):
        semframe.ray.map(ds, TEMPLATE, backend="fake", replicas=2, ray_num_cpus=1)
    renamed = ds.rename_columns({"year": semframe.ray.ROW_ID})
    with pytest.raises(InputError, match="__semframe_row__"):
        semframe.ray.map(renamed, TEMPLATE, backend="fake", **RAY)
    assert semframe.last_run() is None  # nothing ran


def test_ray_is_imported_on_first_use_only(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "import sys, semframe; semframe.ray.map; assert 'ray' not in sys.modules, 'ray'"
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "semframe\[ray\]"'):
        semframe.ray.map(_movies(2), TEMPLATE, backend="fake")  # type: ignore[arg-type]


def test_the_docs_example_runs_as_written() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "ray.md").read_text()
    section = page.split("## Ray Data", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), semframe.using(**RAY):  # the module's replicas
        exec(compile(code.group(1), "docs/ray.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0] == "['movie', 'review', 'poster', 'summary']"
    assert (
        lines[1]
        == "['fake: Alien | a great ride', 'fake: Alien | dull', 'fake: Heat | I loved it']"
    )
    assert lines[2] == "2"


def test_row_errors_carry_a_dataset_and_errors_keep_adds_the_column() -> None:
    """Last in the module: errors="keep" is a setting of its own, hence a pool of its own."""
    df = _movies(9)
    df["review"] = [f"{r} (broken)" if i % 3 == 0 else r for i, r in enumerate(df["review"])]
    ds = _dataset(df)
    with pytest.raises(RowErrors) as caught:
        semframe.ray.map(ds, TEMPLATE, backend="fake", **RAY)
    assert len(caught.value.errors) == 3  # rows 0, 3, 6 get no answer
    partial = _rows(caught.value.result)
    assert partial.columns.tolist() == [*df.columns, "llm_output"]
    assert partial["llm_output"].isna().tolist() == [i % 3 == 0 for i in range(9)]
    kept = _rows(semframe.ray.map(ds, TEMPLATE, backend="fake", errors="keep", **RAY))
    assert kept["llm_output_error"].notna().tolist() == [i % 3 == 0 for i in range(9)]
    assert kept["year"].tolist() == df["year"].tolist()
