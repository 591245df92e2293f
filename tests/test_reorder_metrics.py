"""Prefix hit count, hit rates, upper bound and FD discovery against naive references."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from test_reorder_helpers import (
    ref_hit_rate,
    ref_phc,
    ref_upper_bound,
    tables,
    tables_with_orderings,
)

from semframe.core.ordering import Ordering
from semframe.core.table import Table
from semframe.errors import ConfigError, SemframeError
from semframe.reorder import (
    discover_fds,
    evaluate,
    ggr,
    hit_rate,
    order,
    phc,
    upper_bound,
)


def words(s: str) -> int:
    return len(s.split())


@settings(max_examples=80, deadline=None)
@given(case=tables_with_orderings())
def test_metrics_match_references(case: tuple[Table, Ordering]) -> None:
    t, o = case
    assert phc(t, o) == ref_phc(t, o)
    assert phc(t, o, tokenizer=words) == ref_phc(t, o, words)
    for cache in ("previous", "unbounded"):
        assert hit_rate(t, o, cache=cache) == pytest.approx(ref_hit_rate(t, o, cache))
        got = hit_rate(t, o, cache=cache, tokenizer=words)
        assert got == pytest.approx(ref_hit_rate(t, o, cache, words))
    assert upper_bound(t) == ref_upper_bound(t)
    assert hit_rate(t, o) <= hit_rate(t, o, cache="unbounded") + 1e-12
    s = evaluate(t, o)
    assert s.phc == phc(t, o)
    assert s.upper_bound == upper_bound(t)
    assert s.hit_rate == pytest.approx(hit_rate(t, o))
    assert s.hit_rate_unbounded == pytest.approx(hit_rate(t, o, cache="unbounded"))
    assert 0.0 <= s.phc_ratio <= 1.0


def test_phc_by_hand() -> None:
    t = Table.from_columns({"k": ["ab", "ab", "c"], "v": ["x", "x", "x"]})
    # Row 1 repeats row 0 entirely: 2**2 + 1**2. Row 2 differs on its first cell.
    assert phc(t, Ordering.identity(3, ("k", "v"))) == 5
    # With v first, row 1 hits both cells (5) and row 2 hits v (1).
    assert phc(t, Ordering.identity(3, ("v", "k"))) == 6
    # Cells compare as (column, value): the same text in different fields misses.
    u = Table.from_columns({"a": ["x", "y"], "b": ["y", "x"]})
    assert phc(u, Ordering((0, 1), (("a", "b"), ("b", "a")))) == 0


def test_hit_rate_by_hand() -> None:
    t = Table.from_columns({"movie": ["Alien", "Alien", "Heat"], "review": ["ok", "bad", "ok"]})
    o = Ordering.identity(3, ("movie", "review"))
    # Segments: "movie: Alien\n" (13), "review: ok\n" (11), "review: bad\n" (12),
    # "movie: Heat\n" (12). Total 13 + 11 + 13 + 12 + 12 + 11 = 72; served: 13.
    assert hit_rate(t, o) == pytest.approx(13 / 72)
    assert hit_rate(t, o, cache="unbounded") == pytest.approx(13 / 72)
    # Rows 0, 2, 1 with review first: row 2 hits "review: ok\n" of row 0 (11);
    # row 1 starts with "review: bad\n" and misses.
    o2 = Ordering((0, 2, 1), (("review", "movie"),) * 3)
    assert hit_rate(t, o2) == pytest.approx(11 / 72)
    # Movie first in that row order: nothing hits the previous prompt, but row 1
    # finds "movie: Alien\n" of row 0 in an unbounded cache.
    o3 = Ordering((0, 2, 1), (("movie", "review"),) * 3)
    assert hit_rate(t, o3) == pytest.approx(0.0)
    assert hit_rate(t, o3, cache="unbounded") == pytest.approx(13 / 72)


def test_metrics_edges_and_errors() -> None:
    empty = Table(("a",), {"a": ()}, 0)
    assert phc(empty, Ordering((), ())) == 0
    assert hit_rate(empty, Ordering((), ())) == 0.0
    assert upper_bound(empty) == 0
    no_cols = Table((), {}, 2)
    assert hit_rate(no_cols, Ordering.identity(2, ())) == 0.0
    t = Table.from_columns({"a": ["x", "y"]})
    with pytest.raises(ConfigError, match="'previous', 'unbounded'"):
        hit_rate(t, Ordering.identity(2, ("a",)), cache="lru")  # type: ignore[arg-type]
    with pytest.raises(SemframeError, match="permutation"):
        phc(t, Ordering((0, 0), (("a",), ("a",))))
    with pytest.raises(SemframeError):
        phc(t, Ordering.identity(3, ("a",)))


def test_metrics_accept_frames() -> None:
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    data: dict[str, list[object]] = {
        "movie": ["Alien", "Heat", "Alien"],
        "extra": [1, 2, 3],
        "review": ["a", "b", "c"],
    }
    t = Table.from_columns({"movie": data["movie"], "review": data["review"]})
    o = ggr(t)
    for frame in (pd.DataFrame(data), pl.DataFrame(data), data):
        assert phc(frame, o) == phc(t, o) == 25
        assert hit_rate(frame, o) == hit_rate(t, o)


@settings(max_examples=60, deadline=None)
@given(t=tables(max_rows=8, max_cols=4))
def test_discover_fds_is_exact(t: Table) -> None:
    expected = []
    for a, b in itertools.permutations(t.columns, 2):
        seen: dict[str, str] = {}
        holds = all(seen.setdefault(x, y) == y for x, y in zip(t.cells[a], t.cells[b], strict=True))
        if holds:
            expected.append((a, b))
    assert sorted(discover_fds(t)) == sorted(expected)


def test_discover_fds_on_columns() -> None:
    data = {"title": ["A", "B", "A"], "info": ["x", "y", "x"], "review": ["1", "2", "3"]}
    assert discover_fds(data, ["title", "info"]) == (("title", "info"), ("info", "title"))


def test_stats_order_is_one_field_order_and_sorted_rows() -> None:
    t = Table.from_columns({"id": ["3", "1", "2", "4"], "tag": ["bb", "aa", "bb", "aa"]})
    o = order(t, "stats")
    assert set(o.fields) == {("tag", "id")}
    assert o.rows.tolist() == [1, 3, 2, 0]
