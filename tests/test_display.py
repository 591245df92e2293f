"""What a person reads and looks at: the progress display, reprs, plots, the estimate's text."""

from __future__ import annotations

import functools
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

import semframe
import semframe.runtime.execute
from semframe.backends.fake import FakeBackend
from semframe.cost.estimate import Estimate
from semframe.cost.pricing import Cost
from semframe.errors import MissingDependencyError, RowError, RowErrors, plural
from semframe.operators.common import compile_call
from semframe.runtime import progress as progress_module
from semframe.runtime.execute import execute
from semframe.runtime.progress import Progress, ProgressView, notebook_display
from semframe.runtime.stats import OpStats, RunStats

MOVIES = pd.DataFrame(
    {
        "movie": ["Alien", "Alien", "Heat", "Heat", "<script>alert(1)</script>"],
        "review": ["tense", "slow", "long", "great", "odd"],
    }
)
TEMPLATE = "Is {review} of {movie} positive?"


class FakeDisplay:
    """IPython's ``display`` and its handles, recording what a notebook would show."""

    def __init__(self) -> None:
        self.shown: list[ProgressView] = []  # display() calls
        self.updates: list[ProgressView] = []  # handle.update() calls

    def __call__(self, view: ProgressView, *, display_id: bool = False) -> Any:
        assert display_id, "a progress display must be updatable in place"
        self.shown.append(view)
        return types.SimpleNamespace(update=self.updates.append)

    @property
    def views(self) -> list[ProgressView]:
        return self.shown + self.updates


# -- progress in a notebook ----------------------------------------------------------------


def test_notebook_progress_is_one_display_updated_in_place() -> None:
    sink = FakeDisplay()
    bar = Progress(4, "map on openai", delay=0, notebook=sink, dollars=lambda: 0.25)
    assert bar.enabled, "auto mode draws in a notebook, though stderr is no terminal"
    for done in range(1, 5):
        bar.update(done, prompt_tokens=100 * done, cached_tokens=50 * done)
    bar.close()
    assert len(sink.shown) == 1, "shown once, then updated"
    last = sink.views[-1]
    assert (last.done, last.total) == (4, 4)
    for part in ("4/4 rows", "400 prompt tok", "50% cached", "$0.2500", "elapsed"):
        assert part in last.text
    assert "ETA" in sink.shown[0].text
    html = last._repr_html_()
    assert "<progress value='4' max='4'" in html
    assert repr(last) == last.text


def test_notebook_updates_are_throttled_and_the_final_state_is_drawn() -> None:
    sink = FakeDisplay()
    bar = Progress(1000, "map on local", delay=0, notebook=sink)
    for done in range(1, 1000):  # a burst of answers within a few milliseconds
        bar.update(done)
    assert len(sink.views) <= 2, "at most five draws a second"
    bar.update(1000)
    assert sink.views[-1].done == 1000, "the draw that completes the run is never skipped"
    bar.close()
    assert sink.views[-1].text.startswith("semframe map on local: 1,000/1,000 rows")
    assert "ETA" not in sink.views[-1].text


def test_notebook_progress_escapes_the_label() -> None:
    sink = FakeDisplay()
    bar = Progress(1, "map on <b>mine</b>", delay=0, notebook=sink)
    bar.update(1)
    bar.close()
    html = sink.views[-1]._repr_html_()
    assert "&lt;b&gt;mine&lt;/b&gt;" in html and "<b>" not in html


def test_a_quick_run_shows_nothing_in_a_notebook() -> None:
    sink = FakeDisplay()
    bar = Progress(2, "map", notebook=sink)  # the default one-second delay
    bar.update(2)
    bar.close()
    assert sink.views == []


def test_progress_off_shows_nothing_in_a_notebook() -> None:
    sink = FakeDisplay()
    bar = Progress(1, "map", mode="off", delay=0, notebook=sink)
    bar.update(1)
    bar.close()
    assert not bar.enabled and sink.views == []


def test_a_run_draws_its_progress_in_the_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = FakeDisplay()
    monkeypatch.setattr(
        semframe.runtime.execute, "Progress", functools.partial(Progress, delay=0, notebook=sink)
    )
    call = compile_call(MOVIES, TEMPLATE, op="filter", backend="fake")
    execute(call.plan, FakeBackend(), progress="auto")
    assert sink.views, "the run drew its progress"
    assert sink.views[-1].text.startswith("semframe filter on fake: 5/5 rows")
    assert "$" not in sink.views[-1].text, "no price, no dollars"


def _fake_ipython(monkeypatch: pytest.MonkeyPatch, shell_class: str | None) -> FakeDisplay:
    sink = FakeDisplay()
    shell = None if shell_class is None else type(shell_class, (), {})()
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell  # type: ignore[attr-defined]
    display = types.ModuleType("IPython.display")
    display.display = sink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    return sink


def test_a_jupyter_kernel_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = _fake_ipython(monkeypatch, "ZMQInteractiveShell")
    assert notebook_display() is sink
    bar = Progress(1, "map", delay=0)  # auto, no stream: the notebook's display
    bar.update(1)
    bar.close()
    assert sink.views and sink.views[-1].text.startswith("semframe map: 1/1 row |")


def test_a_kernel_subclass_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = FakeDisplay()
    zmq = type("ZMQInteractiveShell", (), {})
    colab = type("Shell", (zmq,), {})()
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: colab  # type: ignore[attr-defined]
    display = types.ModuleType("IPython.display")
    display.display = sink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    assert notebook_display() is sink


@pytest.mark.parametrize("shell", ["TerminalInteractiveShell", None])
def test_a_terminal_ipython_is_no_notebook(monkeypatch: pytest.MonkeyPatch, shell: str) -> None:
    _fake_ipython(monkeypatch, shell)
    assert notebook_display() is None


def test_ipython_is_not_imported_to_look_for_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    monkeypatch.delitem(sys.modules, "IPython.display", raising=False)
    assert notebook_display() is None
    Progress(1, "map", delay=0).close()
    assert "IPython" not in sys.modules


def test_an_explicit_stream_keeps_the_line_in_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    sink = _fake_ipython(monkeypatch, "ZMQInteractiveShell")
    out = io.StringIO()
    bar = Progress(2, "map", mode="on", delay=0, stream=out)
    bar.update(2, errors=1)
    bar.close()
    assert sink.views == []
    assert "2/2 rows" in out.getvalue() and "| 1 error |" in out.getvalue()


def test_terminal_line_shows_dollars() -> None:
    import io

    out = io.StringIO()
    bar = Progress(1, "map on openai", mode="on", delay=0, stream=out, dollars=lambda: 0.5)
    bar.update(1, prompt_tokens=10)
    bar.close()
    assert "1/1 row |" in out.getvalue() and "$0.5000" in out.getvalue()
    assert progress_module.NOTEBOOK_INTERVAL >= 0.2 > progress_module.TERMINAL_INTERVAL


# -- one of a thing is singular ------------------------------------------------------------


def _stats(**changes: Any) -> RunStats:
    base = RunStats(
        op="map", backend="fake", model="m", reorder="ggr", rows=1, requests=1,
        prompt_tokens=10, cached_tokens=0, cache_write_tokens=0, output_tokens=3, errors=1,
        retries=1, wall_seconds=0.5, workers=1, expected_hit_rate=0.0, dollars=0.01,
    )  # fmt: skip
    return replace(base, **changes)


def test_run_stats_say_one_row_not_one_rows() -> None:
    text = repr(_stats(unconfirmed=1, unconfirmed_tokens=5))
    for part in ("1 row,", "1 request,", "1 error,", "1 retry;", "1 worker", "1 answer lost"):
        assert part in text
    assert "(s)" not in text
    many = repr(_stats(rows=1200, requests=2, errors=0, retries=3, workers=4))
    for part in ("1,200 rows", "2 requests", "0 errors", "3 retries", "4 workers"):
        assert part in many


def test_op_stats_say_one_relquery() -> None:
    text = repr(OpStats("map", (_stats(),)))
    assert "1 relQuery," in text and "1 LLM call," in text and "(s)" not in text
    two = repr(OpStats("agg", (_stats(), _stats())))
    assert "2 relQueries" in two and "2 LLM calls" in two


def test_plan_estimate_and_errors_say_one_row() -> None:
    one = MOVIES.head(1)
    plan = one.llm.plan(TEMPLATE, op="filter", backend="fake")
    assert "over 1 row," in plan.explain()
    est = one.llm.estimate(TEMPLATE, op="filter", backend="fake", probe=1)
    assert ": 1 row)" in repr(est) and "probe of 1 row)" in repr(est)
    err = RowErrors([RowError(0, 0, "parse", "bad", 1)], None, total=2)
    assert str(err).startswith("1 row failed;") and "after 1 attempt:" in str(err)
    assert plural(1, "retry", "retries") == "1 retry"


def test_explain_counts_what_it_leaves_out() -> None:
    frame = pd.DataFrame({"t": [f"row {i}" for i in range(8)]})
    text = frame.llm.plan("Echo {t}", backend="fake").explain(n=3)
    assert "... 5 more groups" in text and "... 5 more requests" in text


# -- the estimate's text -------------------------------------------------------------------


def _labels(text: str) -> list[str]:
    """The row labels of an estimate's table (left column)."""
    lines = text.splitlines()[2:]
    return [re.split(r"\s{2,}", line.strip())[0] for line in lines if re.search(r"\d", line)]


def test_estimate_text_has_no_repeated_rows_and_says_what_is_a_bound() -> None:
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="openai", model="gpt-4.1-mini")
    text = repr(est)
    labels = [label for label in _labels(text) if not label.startswith(("note", "max_tokens"))]
    assert len(labels) == len(set(labels)), text
    assert text.count("$ total") == 1, text
    assert "output tokens (max_tokens bound)" in text
    assert "$ total (max_tokens bound)" in text
    assert "wall time (max_tokens bound)" in text
    assert "upper bound" in text and "probe=5" in text
    values = dict(row[:2] for row in est._rows())
    assert values["output tokens (max_tokens bound)"] == f"{est.planned.output_tokens_max:,}"


def test_a_probed_estimate_shows_the_expectation_and_the_bound() -> None:
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="openai", model="gpt-4.1-mini")
    probed = replace(est, output_source="probe of 5 rows")
    text = repr(probed)
    assert "output tokens (probe of 5 rows)" in text
    assert "output tokens, max_tokens bound" in text
    assert "$ total  " in text and "$ total, max_tokens bound" in text
    assert "wall time (max_tokens bound)" not in text and "upper bound" not in text


def test_the_saving_line_says_which_way_the_cost_went() -> None:
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="openai", model="gpt-4.1-mini")

    def priced(planned: float, original: float) -> Estimate:
        return replace(
            est,
            planned=replace(est.planned, cost=Cost(uncached_input=planned)),
            original=replace(est.original, cost=Cost(uncached_input=original)),
        )

    assert "reordering saves $1.0000 (25.0% of the original order's cost)" in repr(priced(3, 4))
    assert "costs $1.0000 more than the original order (25.0%)" in repr(priced(5, 4))
    assert "reordering does not change the cost here" in repr(priced(4, 4))
    assert "reordering" not in repr(replace(priced(3, 4), reorder="none"))


def test_uncalibrated_time_is_not_called_a_bound() -> None:
    text = repr(MOVIES.llm.estimate(TEMPLATE, op="filter", backend="fake"))
    assert re.search(r"wall time\s+uncalibrated", text), text


@pytest.mark.usefixtures("local_is_fake")
def test_the_calibration_advice_is_a_call_that_works() -> None:
    before = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="local")
    assert before.planned.wall_seconds is None
    advice = next(n for n in before.notes if "uncalibrated" in n)
    found = re.search(r"semframe\.calibrate_local\([^)]*\)", advice)
    assert found is not None, advice
    assert found.group() == "semframe.calibrate_local(model='tiny-local', slots=2)"
    assert "calibrate=True" not in repr(before)
    eval(found.group(), {"semframe": semframe})  # the call, as the note words it
    after = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="local")
    assert after.planned.wall_seconds is not None
    assert any("wall time from the calibration" in n for n in after.notes)
    assert "wall time (max_tokens bound)" in repr(after)


# -- notebook tables -----------------------------------------------------------------------


def test_html_reprs_are_tables_with_escaped_text() -> None:
    plan = MOVIES.llm.plan(TEMPLATE, op="filter", backend="fake", reorder="none")
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="openai", model="gpt-4.1-mini")
    failed = RowErrors([RowError(4, "<i>", "parse", "got '<script>'", 2)], None, total=5)
    stats = _stats(model="<m>", cache_hits=2, cache_saved_dollars=0.5, rate_limited=1)
    for thing in (plan, est, stats, OpStats("map", (stats,), {"levels": 1}), failed):
        html = thing._repr_html_()  # type: ignore[attr-defined]
        assert "<table>" in html, type(thing)
        assert "<script>" not in html and "<i>" not in html and "<m>" not in html, html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in plan._repr_html_()
    assert "max_tokens bound" in est._repr_html_() and "upper bound" in est._repr_html_()
    assert "from the result cache" in stats._repr_html_()
    assert "1 row failed" in failed._repr_html_()


def test_plain_reprs_keep_their_meaning() -> None:
    plan = MOVIES.llm.plan(TEMPLATE, op="filter", backend="fake")
    assert repr(plan).startswith("Plan(op='filter', requests=5, groups=")
    assert repr(_stats()).startswith("RunStats(map on fake/m, reorder=ggr: 1 row, 1 request")
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="fake")
    assert repr(est) == str(est) and repr(est).startswith("Estimate(filter on fake/fake-model")


# -- plots ---------------------------------------------------------------------------------


@pytest.fixture
def plt() -> Iterator[Any]:
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as pyplot

    yield pyplot
    pyplot.close("all")


def test_estimate_plot_compares_the_orders_by_component(plt: Any) -> None:
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="openai", model="gpt-4.1-mini")
    ax = est.plot()
    assert ax.get_xlabel() == "dollars"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["original order", "planned (ggr)"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["uncached input", "cached input", "cache writes", "output (max_tokens bound)"]
    ends = [max(p.get_x() + p.get_width() for p in ax.patches if p.get_y() < 0.5)]
    assert ends[0] == pytest.approx(est.original.dollars)


def test_estimate_plot_without_a_price_shows_tokens(plt: Any) -> None:
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="fake", reorder="none")
    _, ax = plt.subplots()
    assert est.plot(ax=ax) is ax
    assert ax.get_xlabel() == "tokens"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["planned (none)"]
    total = max(p.get_x() + p.get_width() for p in ax.patches)
    assert total == pytest.approx(est.planned.input_tokens + est.planned.output_tokens)


def test_plan_plot_shows_the_prefix_groups(plt: Any) -> None:
    plan = MOVIES.llm.plan(TEMPLATE, op="filter", backend="fake", reorder="none")
    ax = plan.plot()
    assert ax.get_ylabel() == "requests"
    sizes = ax.patches[0].get_data().values  # the stairs of group sizes
    assert list(sizes) == [len(g) for g in plan.groups]
    assert len(ax.figure.axes) == 2, "the shared prefix on a twin axis"


def test_plots_without_matplotlib_give_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    est = MOVIES.llm.estimate(TEMPLATE, op="filter", backend="fake")
    plan = MOVIES.llm.plan(TEMPLATE, op="filter", backend="fake")
    for thing, name in ((est, "Estimate.plot()"), (plan, "Plan.plot()")):
        with pytest.raises(MissingDependencyError, match=re.escape("pip install matplotlib")) as e:
            thing.plot()
        assert str(e.value).startswith(name)
