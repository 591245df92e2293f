"""The Ordering value: arrays inside, the same meaning as a row and a field order per row."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semframe.core.ordering import Ordering
from semframe.errors import SemframeError

FIELDS = ("a", "b", "c")
ORDERS = [("a", "b", "c"), ("b", "a", "c"), ("c", "b", "a")]


@st.composite
def orderings(draw: st.DrawFn) -> tuple[list[int], list[tuple[str, ...]]]:
    """A permutation of ``range(n)`` and a field order (a permutation of FIELDS) per row."""
    n = draw(st.integers(0, 40))
    rows = draw(st.permutations(range(n)))
    fields = draw(st.lists(st.sampled_from(ORDERS), min_size=n, max_size=n))
    return list(rows), fields


@given(orderings())
def test_rows_and_fields_read_back_as_given(case: tuple[list[int], list[tuple[str, ...]]]) -> None:
    rows, fields = case
    o = Ordering(rows, fields)
    assert len(o) == len(rows)
    assert o.rows.tolist() == rows
    assert list(o.fields) == fields
    assert [o.fields[i] for i in range(len(rows))] == fields
    assert o.fields[1:3] == tuple(fields[1:3])
    assert [o.orders[i] for i in o.order_of.tolist()] == fields
    assert len(set(o.orders)) == len(o.orders)  # each distinct order stored once
    o.validate(len(rows), FIELDS)


@given(orderings())
def test_restore_puts_every_value_back_at_its_row(
    case: tuple[list[int], list[tuple[str, ...]]],
) -> None:
    rows, fields = case
    o = Ordering(rows, fields)
    assert o.restore([f"row{r}" for r in rows]) == [f"row{r}" for r in range(len(rows))]
    inverse = o.inverse().tolist()
    assert [rows[i] for i in inverse] == list(range(len(rows)))


@given(orderings(), st.data())
def test_from_arrays_and_subset_agree_with_the_tuples(
    case: tuple[list[int], list[tuple[str, ...]]], data: st.DataObject
) -> None:
    rows, fields = case
    o = Ordering(rows, fields)
    # The same ordering numbered another way (orders listed in reverse, one unused).
    listed = [*reversed(ORDERS), ("b", "c", "a")]
    ids = np.array([listed.index(f) for f in fields], dtype=np.int64)
    same = Ordering.from_arrays(np.array(rows, dtype=np.int64), listed, ids)
    assert same == o and hash(same) == hash(o)
    positions = data.draw(st.lists(st.integers(0, max(len(rows) - 1, 0)), max_size=len(rows)))
    if not rows:
        positions = []
    sub = o.subset(positions)
    assert sub == Ordering(list(range(len(positions))), [fields[i] for i in positions])


@given(orderings())
def test_pickle_and_copy_round_trip(case: tuple[list[int], list[tuple[str, ...]]]) -> None:
    o = Ordering(*case)
    for back in (pickle.loads(pickle.dumps(o)), copy.deepcopy(o), copy.copy(o)):
        assert back == o
        assert not back.rows.flags.writeable


def test_an_ordering_cannot_be_changed() -> None:
    o = Ordering((1, 0), (("a",), ("a",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.rows = np.array([0, 1])  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        o.rows[0] = 0
    with pytest.raises(ValueError, match="read-only"):
        o.order_of[0] = 1
    given_rows = np.array([1, 0])
    Ordering(given_rows, (("a",), ("a",)))
    given_rows[0] = 5  # the constructor copied: the caller's array stays theirs
    assert given_rows.flags.writeable


def test_differences_are_seen_and_mistakes_named() -> None:
    o = Ordering((1, 0), (("a", "b"), ("b", "a")))
    assert o != Ordering((0, 1), (("a", "b"), ("b", "a")))
    assert o != Ordering((1, 0), (("a", "b"), ("a", "b")))
    assert o != "not an ordering"
    with pytest.raises(SemframeError, match="aligned"):
        Ordering((0, 1), (("a",),))
    with pytest.raises(SemframeError, match="integers"):
        Ordering(("x",), (("a",),))
    with pytest.raises(SemframeError, match="number one of the 1 orders"):
        Ordering.from_arrays(np.array([0]), [("a",)], np.array([1]))
    with pytest.raises(SemframeError, match="permutation of range"):
        Ordering((0, 0), (("a",), ("a",))).validate(2, ("a",))
    with pytest.raises(SemframeError, match="not a permutation of"):
        o.validate(2, ("a", "c"))
    # An order no row takes is not checked (an empty identity ordering names its fields).
    Ordering.identity(0, ("x",)).validate(0, ())


def test_repr_is_short_for_large_orderings() -> None:
    assert repr(Ordering.uniform([1, 0], ["x"])) == "Ordering(rows=(1, 0), fields=(('x',), ('x',)))"
    big = Ordering.identity(1_000_000, ("x", "y"))
    assert repr(big) == "Ordering(rows=(0, 1, 2, 3, ...), 1,000,000 rows, 1 distinct field orders)"
    assert big.rows.nbytes + big.order_of.nbytes == 5_000_000  # 4 + 1 bytes a row
