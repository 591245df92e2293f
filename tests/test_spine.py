"""The spine of the restructured package, tested from outside.

Frame subclasses on both libraries, the ``llm`` namespace when another package
owns it, the operator registry (third-party operators, ``budget=`` through the
common driver), the run report and its scopes, the backend registry, the
read-only resolved config, and result order whatever the planner's row order.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semframe
from semframe.backends import (
    BACKENDS,
    get_backend,
    register_backend,
    reset_backends,
)
from semframe.backends.fake import FakeBackend
from semframe.config import SETTINGS
from semframe.core.frames import NewColumn, Output, PandasAdapter, PolarsAdapter, adapter_for
from semframe.core.table import MISSING
from semframe.cost.estimate import Estimate
from semframe.operators.registry import OPERATORS
from semframe.operators.rowwise import MAP
from semframe.runtime.stats import report_scope, reset_report

REPO = Path(__file__).resolve().parents[1]

REVIEWS = ["a great film", "dull", "I loved it", "meh"]
POSITIVE = [0, 2]  # the fake backend says yes to "great" and "loved"


# -------- helpers


class SpineFrame(pd.DataFrame):
    """A pandas subclass, as pandas documents it (``_constructor`` gives the subclass)."""

    _metadata: ClassVar[list[str]] = ["source"]

    @property
    def _constructor(self) -> type[SpineFrame]:
        return SpineFrame


class SpinePolars(pl.DataFrame):
    """A Polars subclass."""


class SpineLazy(pl.LazyFrame):
    """A Polars LazyFrame subclass."""


class Shout:
    """A third-party operator: the text of a column in capitals, no LLM."""

    name = "spine_shout"
    required = ()

    def compile(self, frame: Any, template: str, **kwargs: Any) -> Any:
        return frame.table([template])

    def plan(self, table: Any) -> Any:
        return ("shout-plan", table.columns, table.n_rows)

    def estimate(self, table: Any, *, probe: int) -> Estimate:
        raise NotImplementedError

    def run(self, table: Any, runner: Any) -> Output:
        loud = [v.upper() for v in table.cells[table.columns[0]]]
        return Output(columns=(NewColumn("loud", loud),))


class Echo:
    """A third-party operator built on ``map``'s steps, under its own name."""

    name = "spine_echo"
    required = ()

    def compile(self, frame: Any, template: str, **kwargs: Any) -> Any:
        return MAP.compile(frame, template, out="echo", **kwargs)

    def plan(self, compiled: Any) -> Any:
        return MAP.plan(compiled)

    def estimate(self, compiled: Any, *, probe: int) -> Estimate:
        return MAP.estimate(compiled, probe=probe)

    def run(self, compiled: Any, runner: Any) -> Output:
        return MAP.run(compiled, runner)


@contextmanager
def registered(operator: Any) -> Iterator[Any]:
    """``operator`` in the registry for the block; removed afterwards whatever happens."""
    assert operator.name not in OPERATORS
    try:
        semframe.register_operator(operator)
        yield operator
    finally:
        OPERATORS.pop(operator.name, None)


@contextmanager
def backend_named(name: str, factory: Any, **spec: Any) -> Iterator[None]:
    """Backend ``name`` registered for the block; removed (and its instances closed) after."""
    assert name not in BACKENDS
    try:
        register_backend(name, factory, **spec)
        yield
    finally:
        BACKENDS.pop(name, None)
        reset_backends(name)


class ClosingFake(FakeBackend):
    """A fake backend that counts how often it was closed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def run_python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter using this checkout, offline, cache in cwd."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["SEMFRAME_PROGRESS"] = "off"
    env["SEMFRAME_CACHE_DIR"] = str(Path.cwd() / "sub-cache")
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def last_json(stdout: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


# -------- 1. subclasses


def test_pandas_subclass_map_and_filter_keep_rows_order_index_and_type(fake: FakeBackend) -> None:
    df = SpineFrame({"review": REVIEWS}, index=["r2", "r1", "r2", 10])
    assert isinstance(df.llm, semframe.LLMAccessor)

    out = df.llm.map("Echo {review}", backend="fake")
    assert type(out) is SpineFrame
    assert out.index.equals(df.index)
    assert list(out.columns) == ["review", "llm_output"]
    assert out["review"].tolist() == REVIEWS
    assert out["llm_output"].tolist() == [f"fake: {r}" for r in REVIEWS]
    assert len(fake.history) == len(REVIEWS)

    kept = df.llm.filter("Is {review} positive?", backend="fake")
    pd.testing.assert_frame_equal(kept, df.iloc[POSITIVE])  # checks the type too
    assert type(kept) is SpineFrame
    assert kept.index.tolist() == ["r2", "r2"]

    # semframe.llm() gives the same namespace for the subclass
    again = semframe.llm(df).map("Echo {review}", backend="fake")
    pd.testing.assert_frame_equal(again, out)


def test_polars_subclass_map_and_filter_keep_rows_and_order(fake: FakeBackend) -> None:
    df = SpinePolars({"review": REVIEWS, "n": [4, 3, 2, 1]})
    assert isinstance(df.llm, semframe.LLMAccessor)

    out = df.llm.map("Echo {review}", backend="fake")
    # Polars' with_columns gives a plain DataFrame for a subclass; the rows are what counts
    assert isinstance(out, pl.DataFrame)
    assert out.columns == ["review", "n", "llm_output"]
    assert out["review"].to_list() == REVIEWS
    assert out["n"].to_list() == [4, 3, 2, 1]
    assert out["llm_output"].to_list() == [f"fake: {r}" for r in REVIEWS]

    kept = df.llm.filter("Is {review} positive?", backend="fake")
    assert isinstance(kept, pl.DataFrame)
    assert kept.to_dict(as_series=False) == {
        "review": [REVIEWS[i] for i in POSITIVE],
        "n": [[4, 3, 2, 1][i] for i in POSITIVE],
    }


def test_polars_lazyframe_subclass_gives_a_lazyframe_run_at_collect(fake: FakeBackend) -> None:
    lazy = SpineLazy({"review": REVIEWS})
    out = lazy.llm.filter("Is {review} positive?", backend="fake")
    assert isinstance(out, pl.LazyFrame)
    assert out.collect()["review"].to_list() == [REVIEWS[i] for i in POSITIVE]


def test_adapter_for_accepts_subclasses_and_refuses_other_objects() -> None:
    assert isinstance(adapter_for(SpineFrame({"a": [1]})), PandasAdapter)
    assert isinstance(adapter_for(pd.DataFrame({"a": [1]})), PandasAdapter)
    assert isinstance(adapter_for(SpinePolars({"a": [1]})), PolarsAdapter)
    assert isinstance(adapter_for(pl.DataFrame({"a": [1]})), PolarsAdapter)
    for thing in ([1, 2], {"a": [1]}, pd.Series([1]), object()):
        with pytest.raises(semframe.InputError) as info:
            adapter_for(thing)
        message = str(info.value)
        assert type(thing).__qualname__ in message
        assert "pandas.DataFrame" in message
        assert "polars.DataFrame" in message


def test_namespace_on_a_non_frame_is_an_input_error(fake: FakeBackend) -> None:
    with pytest.raises(semframe.InputError, match=r"pandas\.DataFrame"):
        semframe.llm({"t": ["a"]}).map("Echo {t}", backend="fake")
    assert fake.history == []


# -------- 2. foreign namespace


FOREIGN_PANDAS = """
import json
import pandas as pd

@pd.api.extensions.register_dataframe_accessor("llm")
class Foreign:
    def __init__(self, df):
        self._df = df
    def hello(self):
        return "foreign"

import semframe
import polars as pl

df = pd.DataFrame({"t": ["a", "b"]}, index=["x", "y"])
out = semframe.llm(df).map("Echo {t}", backend="fake")
print(json.dumps({
    "kept": type(df.llm).__qualname__,
    "hello": df.llm.hello(),
    "answers": out["llm_output"].tolist(),
    "index": out.index.tolist(),
    "polars": type(pl.DataFrame({"t": ["a"]}).llm).__qualname__,
    "warning_is_user": issubclass(semframe.SemframeWarning, UserWarning),
}))
"""

FOREIGN_POLARS = """
import json
import polars as pl

@pl.api.register_dataframe_namespace("llm")
class ForeignPL:
    def __init__(self, df):
        self._df = df
    def hello(self):
        return "foreign-pl"

import semframe
import pandas as pd

df = pl.DataFrame({"t": ["a", "b"]})
out = semframe.llm(df).map("Echo {t}", backend="fake")
print(json.dumps({
    "kept": type(df.llm).__qualname__,
    "hello": df.llm.hello(),
    "answers": out["llm_output"].to_list(),
    "lazy": type(pl.LazyFrame({"t": ["a"]}).llm).__qualname__,
    "pandas": type(pd.DataFrame({"t": ["a"]}).llm).__qualname__,
}))
"""


def _semframe_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "SemframeWarning:" in line]


def test_foreign_pandas_namespace_is_kept_with_a_warning() -> None:
    proc = run_python(FOREIGN_PANDAS)
    assert proc.returncode == 0, proc.stderr
    lines = _semframe_warnings(proc.stderr)
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert "pandas.DataFrame.llm already belongs to __main__.Foreign" in line
    assert "semframe.llm(df)" in line
    # attributed to the caller's `import semframe`, not to semframe's own code
    assert line.startswith("<string>:"), line
    result = last_json(proc.stdout)
    assert result["kept"] == "Foreign"
    assert result["hello"] == "foreign"
    assert result["answers"] == ["fake: a", "fake: b"]
    assert result["index"] == ["x", "y"]
    assert result["polars"] == "LLMAccessor"  # the other library is not affected
    assert result["warning_is_user"] is True


def test_foreign_polars_namespace_is_kept_with_a_warning() -> None:
    proc = run_python(FOREIGN_POLARS)
    assert proc.returncode == 0, proc.stderr
    lines = _semframe_warnings(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "DataFrame.llm already belongs to __main__.ForeignPL" in lines[0]
    assert "semframe.llm(df)" in lines[0]
    result = last_json(proc.stdout)
    assert result["kept"] == "ForeignPL"
    assert result["hello"] == "foreign-pl"
    assert result["answers"] == ["fake: a", "fake: b"]
    assert result["lazy"] == "LLMAccessor"  # LazyFrame's namespace was free
    assert result["pandas"] == "LLMAccessor"


CLEAN_IMPORT = """
import importlib, json, warnings
import pandas as pd, polars as pl
import semframe

frames = [pd.DataFrame({"t": ["a"]}), pl.DataFrame({"t": ["a"]}), pl.LazyFrame({"t": ["a"]})]
owners = [type(f.llm).__qualname__ for f in frames]
out = pd.DataFrame({"t": ["a"]}).llm.map("Echo {t}", backend="fake")
importlib.reload(semframe)  # registering again over its own namespace is silent too

# someone else registering `llm` afterwards is not silent either (pandas says so)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    @pd.api.extensions.register_dataframe_accessor("llm")
    class Late:
        def __init__(self, df):
            pass
print(json.dumps({
    "owners": owners,
    "answer": out["llm_output"].tolist(),
    "late": [str(w.message) for w in caught],
}))
"""


def test_plain_import_emits_no_warning() -> None:
    proc = run_python(CLEAN_IMPORT, "-W", "error")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    result = last_json(proc.stdout)
    assert result["owners"] == ["LLMAccessor"] * 3
    assert result["answer"] == ["fake: a"]
    assert any("llm" in message for message in result["late"]), result["late"]


# -------- 3. operator registry


def test_registered_operator_is_a_method_and_an_op_for_plan() -> None:
    df = pd.DataFrame({"t": ["hi", "yo"]}, index=[5, 5])
    with registered(Shout()):
        out = df.llm.spine_shout("t")
        assert out.index.tolist() == [5, 5]
        assert out["loud"].tolist() == ["HI", "YO"]
        assert out["t"].tolist() == ["hi", "yo"]
        assert pl.DataFrame({"t": ["ab"]}).llm.spine_shout("t")["loud"].to_list() == ["AB"]
        assert semframe.llm(df).spine_shout("t")["loud"].tolist() == ["HI", "YO"]
        assert df.llm.plan("t", op="spine_shout") == ("shout-plan", ("t",), 2)
        assert df.llm.spine_shout.__doc__ == Shout.__doc__
        with pytest.raises(AttributeError, match="spine_shout"):
            df.llm.nonexistent  # the listing names the registered operator too
    assert "spine_shout" not in OPERATORS
    with pytest.raises(AttributeError):
        df.llm.spine_shout  # gone with its registration


def test_unknown_operator_attribute_lists_the_operators() -> None:
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(AttributeError) as info:
        df.llm.nonexistent
    message = str(info.value)
    assert "nonexistent" in message
    for name in OPERATORS:
        assert name in message
    assert not hasattr(df.llm, "nonexistent")
    assert not hasattr(pl.DataFrame({"t": ["a"]}).llm, "nonexistent")
    with pytest.raises(AttributeError):
        df.llm._private


@pytest.mark.parametrize("entry", ["plan", "estimate"])
def test_unknown_op_is_an_input_error_listing_valid_ops(entry: str) -> None:
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(semframe.InputError) as info:
        getattr(df.llm, entry)("Echo {t}", op="nosuch", backend="fake")
    message = str(info.value)
    assert "'nosuch'" in message
    assert "Valid ops" in message
    for name in OPERATORS:
        assert repr(name) in message
    with pytest.raises(semframe.InputError, match="Did you mean 'map'"):
        getattr(df.llm, entry)("Echo {t}", op="mapp", backend="fake")


@pytest.mark.parametrize("name", ["plan", "estimate", "_x", "__init__", "two words", "1st", ""])
def test_register_operator_refuses_reserved_and_invalid_names(name: str) -> None:
    before = dict(OPERATORS)
    bad = type("Bad", (Shout,), {"name": name})()
    try:
        with pytest.raises(semframe.InputError, match="must be an identifier"):
            semframe.register_operator(bad)
        assert before == OPERATORS
    finally:
        if OPERATORS.get(name) is bad:
            OPERATORS.pop(name)


# -------- 4. budget= via the driver


def test_budget_and_estimate_work_for_a_registered_operator(fake: FakeBackend) -> None:
    df = pd.DataFrame({"t": ["a", "b", "c", "d"]}, index=list("wxyz"))
    with registered(Echo()):
        est = df.llm.spine_echo("Echo {t}", backend="fake", estimate=True, cache=False)
        assert isinstance(est, Estimate)
        assert est.requests == 4
        assert fake.history == []

        with pytest.raises(semframe.BudgetExceeded, match="nothing was sent") as info:
            df.llm.spine_echo("Echo {t}", backend="fake", budget="1 tokens", cache=False)
        assert info.value.spent == 0
        assert info.value.estimate is not None
        assert info.value.estimate.requests == 4
        assert fake.history == []

        out = df.llm.spine_echo("Echo {t}", backend="fake", budget="1M tokens", cache=False)
        assert out.index.tolist() == list("wxyz")
        assert out["echo"].tolist() == ["fake: a", "fake: b", "fake: c", "fake: d"]
        assert len(fake.history) == 4
        last = semframe.last_op()
        assert last is not None
        assert last.op == "spine_echo"

        # mid-run stop: answers far longer than the estimate's bound
        fake.history.clear()
        fake.enqueue(*["X" * 8000] * 4)
        budget = f"{est.tokens + 10} tokens"
        with pytest.raises(semframe.BudgetExceeded, match="reached") as info:
            df.llm.spine_echo("Echo {t}", backend="fake", budget=budget, cache=False)
        partial = info.value.result
        assert isinstance(partial, pd.DataFrame)  # built by the edge, in the caller's library
        assert partial.index.tolist() == list("wxyz")
        assert partial["t"].tolist() == ["a", "b", "c", "d"]
        answered = partial["echo"].notna()
        assert answered.sum() == len(fake.history) < 4


# -------- 5. run report


def test_last_run_and_last_op_describe_the_last_call(fake: FakeBackend) -> None:
    assert semframe.last_run() is None
    assert semframe.last_op() is None

    pd.DataFrame({"t": ["a", "b", "c"]}).llm.map("Echo {t}", backend="fake")
    run, op = semframe.last_run(), semframe.last_op()
    assert run is not None
    assert op is not None
    assert (run.op, run.backend, run.rows, run.requests) == ("map", "fake", 3, 3)
    assert (op.op, op.relqueries, op.llm_calls) == ("map", 1, 3)
    assert op.runs[-1] is run

    pl.DataFrame({"t": ["good", "bad"]}).llm.filter("Is {t} positive?", backend="fake")
    run2, op2 = semframe.last_run(), semframe.last_op()
    assert run2 is not None
    assert op2 is not None
    assert (run2.op, run2.rows) == ("filter", 2)
    assert op2.op == "filter"
    assert op2.runs == (run2,)

    reset_report()
    assert semframe.last_run() is None
    assert semframe.last_op() is None


def test_report_scope_records_apart_from_the_outer_report(fake: FakeBackend) -> None:
    pd.DataFrame({"t": ["a", "b", "c"]}).llm.map("Echo {t}", backend="fake")
    outer_run, outer_op = semframe.last_run(), semframe.last_op()
    assert outer_run is not None

    with report_scope() as report:
        assert semframe.last_run() is None  # a fresh scope starts empty
        pd.DataFrame({"t": ["good", "bad"]}).llm.filter("Is {t} positive?", backend="fake")
        assert report.run is semframe.last_run()
        assert report.op is semframe.last_op()
        assert report.run is not None
        assert (report.run.op, report.run.rows) == ("filter", 2)
        reset_report()  # clears this scope only
        assert report.run is None
        assert report.op is None
        pd.DataFrame({"t": ["x"]}).llm.map("Echo {t}", backend="fake")

    assert report.run is not None
    assert report.run.rows == 1
    assert semframe.last_run() is outer_run
    assert semframe.last_op() is outer_op


def test_report_scopes_in_threads_keep_their_own_figures(fake: FakeBackend) -> None:
    pd.DataFrame({"t": ["p"]}).llm.map("Echo {t}", backend="fake", cache=False)
    outer = semframe.last_run()
    sizes = [2, 5, 3]
    seen: dict[int, int | None] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(sizes))

    def work(n: int) -> None:
        try:
            with report_scope() as report:
                barrier.wait(timeout=10)
                frame = pd.DataFrame({"t": [f"v{i}" for i in range(n)]})
                frame.llm.map("Echo {t}", backend="fake", cache=False)
                seen[n] = None if report.run is None else report.run.rows
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert seen == {n: n for n in sizes}
    assert semframe.last_run() is outer


# -------- 6. backend registry


def test_get_backend_builds_once_and_reset_closes_and_forgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = get_backend("fake", model="m", settings={})
    assert get_backend("fake", model="m", settings={}) is first
    assert get_backend("fake", model="other", settings={}) is not first

    closed: list[str] = []
    monkeypatch.setattr(first, "close", lambda: closed.append("m"))
    reset_backends("fake")
    assert closed == ["m"]
    second = get_backend("fake", model="m", settings={})
    assert second is not first
    assert get_backend("fake", model="m", settings={}) is second


def test_reset_backends_by_name_leaves_other_backends_alone() -> None:
    made: list[ClosingFake] = []

    def factory(model: str | None, settings: Mapping[str, Any]) -> ClosingFake:
        made.append(ClosingFake())
        return made[-1]

    with backend_named("spine_keep", factory):
        mine = get_backend("spine_keep", model=None, settings={})
        get_backend("fake", model="m", settings={})
        reset_backends("fake")
        assert mine.closed == 0
        assert get_backend("spine_keep", model=None, settings={}) is mine
        assert len(made) == 1
    assert mine.closed == 1  # removed (and closed) by the cleanup


def test_register_backend_replaces_the_instances_of_that_name() -> None:
    old, new = ClosingFake(model="old"), ClosingFake(model="new")
    with backend_named("spine_swap", lambda model, settings: old):
        assert get_backend("spine_swap", model=None, settings={}) is old
        register_backend("spine_swap", lambda model, settings: new)
        assert old.closed == 1
        assert get_backend("spine_swap", model=None, settings={}) is new
        assert new.closed == 0


def test_unknown_backend_is_a_config_error_listing_valid_ones(fake: FakeBackend) -> None:
    with pytest.raises(semframe.ConfigError) as info:
        get_backend("nosuch", model=None, settings={})
    message = str(info.value)
    assert "'nosuch'" in message
    assert "Valid backends" in message
    for name in BACKENDS:
        assert name in message
    with pytest.raises(semframe.ConfigError, match="Did you mean 'openai'"):
        get_backend("opnai", model=None, settings={})
    with pytest.raises(semframe.ConfigError, match="Valid backends"):
        pd.DataFrame({"t": ["a"]}).llm.map("Echo {t}", backend="nosuch")
    assert fake.history == []


def test_backend_factory_gets_every_setting_with_defaults() -> None:
    calls: list[tuple[str | None, dict[str, Any]]] = []

    def factory(model: str | None, settings: Mapping[str, Any]) -> FakeBackend:
        calls.append((model, dict(settings)))
        return FakeBackend(model=model or "rec")

    with backend_named("spine_rec", factory, settings=("timeout",)):
        first = get_backend("spine_rec", model=None, settings={})
        assert len(calls) == 1
        model, got = calls[0]
        assert model is None
        assert got["timeout"] is None  # the backend's own
        assert set(got) == set(SETTINGS)
        assert got == {k: s.default for k, s in SETTINGS.items()}

        # instances differ by the settings the spec declares, and only by those
        assert get_backend("spine_rec", model=None, settings={"timeout": None}) is first
        assert get_backend("spine_rec", model=None, settings={"max_retries": 9}) is first
        other = get_backend("spine_rec", model=None, settings={"timeout": 5.0})
        assert other is not first
        assert calls[-1][1]["timeout"] == 5.0
        assert calls[-1][1]["max_retries"] == SETTINGS["max_retries"].default

        # through an operator: the call's settings, resolved, reach the factory
        out = pd.DataFrame({"t": ["a"]}).llm.map("Echo {t}", backend="spine_rec", timeout=7)
        assert out["llm_output"].tolist() == ["fake: a"]
        assert calls[-1][1]["timeout"] == 7.0
        assert calls[-1][1]["backend"] == "spine_rec"
        assert calls[-1][1]["progress"] == "off"  # from SEMFRAME_PROGRESS (conftest)


def test_backend_instances_differ_by_credential_without_keeping_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from semframe import backends

    with backend_named(
        "spine_sec", lambda model, settings: FakeBackend(), secrets=("SPINE_TEST_API_KEY",)
    ):
        monkeypatch.setenv("SPINE_TEST_API_KEY", "spine-secret-one")
        one = get_backend("spine_sec", model=None, settings={})
        assert get_backend("spine_sec", model=None, settings={}) is one
        monkeypatch.setenv("SPINE_TEST_API_KEY", "spine-secret-two")
        two = get_backend("spine_sec", model=None, settings={})
        assert two is not one
        monkeypatch.setenv("SPINE_TEST_API_KEY", "spine-secret-one")
        assert get_backend("spine_sec", model=None, settings={}) is one
        assert "spine-secret" not in repr(list(backends._instances))


# -------- 7. config


def test_config_is_read_only() -> None:
    cfg = semframe.config()
    before = dict(cfg)
    with pytest.raises(TypeError, match="read-only"):
        cfg["backend"] = "fake"
    with pytest.raises(TypeError, match="read-only"):
        cfg.update({"backend": "fake"})
    with pytest.raises(TypeError, match="read-only"):
        cfg.update(backend="fake")
    with pytest.raises(TypeError):
        del cfg["backend"]
    with pytest.raises(TypeError):
        cfg.pop("backend")
    with pytest.raises(TypeError):
        cfg.popitem()
    with pytest.raises(TypeError):
        cfg.setdefault("new", 1)
    with pytest.raises(TypeError):
        cfg.clear()
    with pytest.raises(TypeError):
        cfg |= {"backend": "fake"}
    with pytest.raises(TypeError):
        cfg.sources["backend"] = "me"  # type: ignore[index]
    assert dict(cfg) == before
    assert isinstance(cfg, Mapping)
    assert dict(cfg) == dict(semframe.config())  # a plain copy is easy


@pytest.mark.parametrize(
    "copier",
    [copy.copy, copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_config_can_be_copied(copier: Any) -> None:
    cfg = semframe.config(backend="fake")
    twin = copier(cfg)
    assert dict(twin) == dict(cfg)
    assert dict(twin.sources) == dict(cfg.sources)
    with pytest.raises(TypeError):
        twin["backend"] = "local"


def test_config_sources_say_where_each_value_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = semframe.config()
    assert set(cfg.sources) == set(SETTINGS) == set(cfg)
    assert cfg.sources["progress"] == "SEMFRAME_PROGRESS"  # set by conftest
    assert cfg.sources["cache_dir"] == "SEMFRAME_CACHE_DIR"
    assert cfg.sources["backend"] == "default"
    assert cfg["backend"] == SETTINGS["backend"].default

    # every layer on one setting, peeled off from the top
    toml = Path.cwd() / "semframe.toml"  # conftest runs each test in its tmp_path
    toml.write_text("max_retries = 1\nreorder = 'stats'\n")
    monkeypatch.setenv("SEMFRAME_MAX_RETRIES", "2")
    semframe.configure(max_retries=3)
    with semframe.using(max_retries=4):
        cfg = semframe.config(max_retries=5)
        assert (cfg["max_retries"], cfg.sources["max_retries"]) == (5, "call argument")
        cfg = semframe.config()
        assert (cfg["max_retries"], cfg.sources["max_retries"]) == (4, "semframe.using()")
    cfg = semframe.config()
    assert (cfg["max_retries"], cfg.sources["max_retries"]) == (3, "semframe.configure()")
    semframe.configure(max_retries=None)
    cfg = semframe.config()
    assert (cfg["max_retries"], cfg.sources["max_retries"]) == (2, "SEMFRAME_MAX_RETRIES")
    monkeypatch.delenv("SEMFRAME_MAX_RETRIES")
    cfg = semframe.config()
    assert (cfg["max_retries"], cfg.sources["max_retries"]) == (1, str(toml))
    assert (cfg["reorder"], cfg.sources["reorder"]) == ("stats", str(toml))
    toml.unlink()
    cfg = semframe.config()
    assert (cfg["max_retries"], cfg.sources["max_retries"]) == (
        SETTINGS["max_retries"].default,
        "default",
    )


# -------- 8. result order


TEXTS = ["x", "y", "p q", "", None]


@st.composite
def small_frames(draw: st.DrawFn) -> tuple[dict[str, list[Any]], list[object]]:
    """1-3 columns of repeated values (so GGR reorders) and duplicated index labels."""
    n = draw(st.integers(1, 8))
    columns: dict[str, list[Any]] = {}
    for name in "abc"[: draw(st.integers(1, 3))]:
        if draw(st.booleans()):
            columns[name] = draw(st.lists(st.sampled_from(TEXTS), min_size=n, max_size=n))
        else:
            columns[name] = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    index = draw(st.lists(st.sampled_from(["k", "m", 0, 1]), min_size=n, max_size=n))
    return columns, index


def _rendered(value: Any) -> str:
    return MISSING if value is None else str(value)


def _check_answers(answers: list[str], columns: dict[str, list[Any]]) -> None:
    for row, answer in enumerate(answers):
        assert answer.startswith("fake:"), answer
        # The fake echoes the row's fields in the plan's field order ("fake: v1 | v2"):
        # compare as multisets. Map answers are stripped, so an empty last value leaves
        # "fake: v1 |": compare the pieces stripped.
        echoed = sorted(piece.strip() for piece in answer.removeprefix("fake:").split("|"))
        own = sorted(_rendered(values[row]) for values in columns.values())
        assert echoed == own, (row, answer, columns)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=small_frames(), reorder=st.sampled_from(["ggr", "stats", "none"]))
def test_result_order_is_the_input_order_whatever_the_plan(
    data: tuple[dict[str, list[Any]], list[object]], reorder: str
) -> None:
    columns, index = data
    template = "Tell me about " + " and ".join(f"{{{c}}}" for c in columns) + "."

    df = pd.DataFrame(columns, index=index)
    out = df.llm.map(template, backend="fake", reorder=reorder, cache=False)
    assert out.index.equals(df.index)
    pd.testing.assert_frame_equal(out[list(columns)], df)
    _check_answers(out["llm_output"].tolist(), columns)

    frame = pl.DataFrame(columns, strict=False)
    result = frame.llm.map(template, backend="fake", reorder=reorder, cache=False)
    assert result.drop("llm_output").equals(frame)
    _check_answers(result["llm_output"].to_list(), columns)
