"""The depth-first pass: a permutation that gathers shared prefixes and loses no hit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.core.ordering import Ordering
from semframe.core.table import Table
from semframe.reorder import evaluate, ggr
from semframe.reorder.trie import _depth_first_arrays, _depth_first_small, depth_first

small_tables = st.integers(1, 4).flatmap(
    lambda m: st.lists(
        st.tuples(*[st.sampled_from(["a", "bb", "ccc", "d"]) for _ in range(m)]),
        min_size=1,
        max_size=40,
    )
)


def _table(rows: list[tuple[str, ...]]) -> Table:
    m = len(rows[0])
    return Table.from_columns({f"c{j}": [r[j] for r in rows] for j in range(m)})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=3, max_size=3), min_size=0, max_size=60))
def test_depth_first_is_a_permutation_with_contiguous_prefixes(rows: list[list[int]]) -> None:
    s = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
    perm = depth_first(s)
    assert sorted(perm.tolist()) == list(range(len(rows)))
    ordered = [tuple(r) for r in s[perm].tolist()]
    for depth in (1, 2, 3):
        seen: set[tuple[int, ...]] = set()
        last: tuple[int, ...] | None = None
        for r in ordered:
            p = r[:depth]
            if p != last:
                assert p not in seen, f"prefix {p} split in two runs"
                seen.add(p)
            last = p


def _first_seen_order(rows: list[list[int]]) -> list[int]:
    """The definition, in plain Python: sort by where each prefix first appears."""
    first: dict[tuple[int, ...], int] = {}
    keys = []
    for p, row in enumerate(rows):
        keys.append([first.setdefault(tuple(row[: d + 1]), p) for d in range(len(row))])
    return sorted(range(len(rows)), key=keys.__getitem__)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda m: st.lists(
            st.lists(st.integers(0, 4), min_size=m, max_size=m), min_size=0, max_size=80
        )
    ),
    st.sampled_from([np.int32, np.int64]),
)
def test_depth_first_is_the_first_seen_prefix_order(rows: list[list[int]], dtype: type) -> None:
    m = len(rows[0]) if rows else 1
    s = np.array(rows, dtype=dtype).reshape(len(rows), m)
    want = _first_seen_order(rows)
    assert depth_first(s).tolist() == want
    # Both ways of computing it, whichever the size picks: numpy, and plain Python.
    if len(rows) >= 2:
        assert _depth_first_arrays(s).tolist() == want
    assert _depth_first_small(rows) == want


def test_depth_first_keeps_first_seen_siblings_first_and_is_stable() -> None:
    s = np.array([[5, 1], [2, 9], [5, 1], [2, 8], [5, 0]])
    assert depth_first(s).tolist() == [0, 2, 4, 1, 3]


@settings(max_examples=120, deadline=None)
@given(small_tables)
def test_ggr_serves_the_previous_prompt_as_much_as_an_unbounded_cache(
    rows: list[tuple[str, ...]],
) -> None:
    table = _table(rows)
    o = ggr(table)
    o.validate(table.n_rows, table.columns)
    s = evaluate(table, o)
    assert s.hit_rate == s.hit_rate_unbounded


def test_the_pass_gathers_what_file_order_leaves_apart() -> None:
    # Field orders fixed by hand; rows 0 and 2 share "k: x" but are apart.
    table = Table.from_columns({"k": ["x", "y", "x"], "v": ["1", "2", "3"]})
    apart = Ordering((0, 1, 2), (("k", "v"),) * 3)
    before = evaluate(table, apart)
    assert before.hit_rate < before.hit_rate_unbounded
    perm = depth_first(np.array([[0, 3], [1, 4], [0, 5]]))
    gathered = Ordering(tuple(int(i) for i in perm), (("k", "v"),) * 3)
    after = evaluate(table, gathered)
    assert after.hit_rate == after.hit_rate_unbounded == before.hit_rate_unbounded
