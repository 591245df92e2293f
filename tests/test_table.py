from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.core.table import MISSING, Table, as_table, factorize, render_value
from semframe.errors import InputError


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("text", "text"),
        ("", ""),
        (3, "3"),
        (-0, "0"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (1e20, "1e+20"),
        (float("nan"), MISSING),
        (None, MISSING),
        (True, "true"),
        (False, "false"),
        (decimal.Decimal("1.10"), "1.10"),
        (dt.date(2024, 2, 29), "2024-02-29"),
        (dt.datetime(2024, 2, 29), "2024-02-29"),
        (dt.datetime(2024, 2, 29, 8, 30, 5), "2024-02-29T08:30:05"),
        (dt.datetime(2024, 2, 29, 8, tzinfo=dt.UTC), "2024-02-29T08:00:00+00:00"),
        (dt.time(8, 30), "08:30:00"),
        (b"bytes", "bytes"),
        (b"\xff\x00", "0xff00"),
        ([1, "a", None], '[1, "a", null]'),
        ({"k": [1.5]}, '{"k": [1.5]}'),
        (np.int64(7), "7"),
        (np.float32(0.5), "0.5"),
        (np.bool_(True), "true"),
        (pd.NaT, MISSING),
        (pd.NA, MISSING),
        (pd.Timestamp("2024-01-02 03:04:05"), "2024-01-02T03:04:05"),
        (np.datetime64("NaT"), MISSING),
        (np.array([1, 2]), "[1, 2]"),
        ("ünïcödé ✓", "ünïcödé ✓"),
    ],
)
def test_render_value(value: object, text: str) -> None:
    assert render_value(value) == text


def test_pandas_dtypes() -> None:
    df = pd.DataFrame(
        {
            "i": [1, 2],
            "n": pd.array([1, None], dtype="Int64"),
            "f": [1.0, np.nan],
            "b": [True, False],
            "d": pd.to_datetime(["2024-01-01", None]),
            "s": ["x", None],
            "c": pd.Categorical(["u", "v"]),
        }
    )
    t = as_table(df)
    assert t.cells == {
        "i": ("1", "2"),
        "n": ("1", MISSING),
        "f": ("1.0", MISSING),
        "b": ("true", "false"),
        "d": ("2024-01-01", MISSING),
        "s": ("x", MISSING),
        "c": ("u", "v"),
    }


def test_polars_dtypes() -> None:
    df = pl.DataFrame(
        {
            "i": [1, None],
            "f": [1.5, None],
            "d": [dt.date(2024, 1, 1), None],
            "l": [[1, 2], None],
            "s": ["x", "y"],
        }
    )
    assert as_table(df).cells == {
        "i": ("1", MISSING),
        "f": ("1.5", MISSING),
        "d": ("2024-01-01", MISSING),
        "l": ("[1, 2]", MISSING),
        "s": ("x", "y"),
    }


def test_unsupported_frame() -> None:
    with pytest.raises(InputError, match=r"unsupported frame type builtins\.list"):
        as_table([1, 2])


def test_table_take_select() -> None:
    t = Table.from_columns({"a": ["1", "2", "3"], "b": ["x", "y", "z"]})
    assert t.take([2, 0]).cells == {"a": ("3", "1"), "b": ("z", "x")}
    assert t.select(["b"]).columns == ("b",)
    with pytest.raises(InputError, match="different lengths"):
        Table.from_columns({"a": [1], "b": [1, 2]})


@pytest.mark.parametrize("kind", ["pandas str", "pandas string[pyarrow]", "polars"])
@pytest.mark.parametrize("distinct", [7, 500, 20000])
def test_arrow_strings_render_as_given_one_object_per_repeated_value(
    kind: str, distinct: int
) -> None:
    """Arrow-backed columns: the same text as render_value, repeated values one object each."""
    n = 20000
    values: list[str | None] = [f"label {i % distinct}" for i in range(n)]
    values[11] = None
    values[12] = "two\nlines"
    values[n - 1] = "last\r\nvalue"
    if kind == "polars":
        frame: object = pl.DataFrame({"c": values})
    else:
        frame = pd.DataFrame({"c": pd.array(values, kind.split()[1])})
    cells = as_table(frame).cells["c"]
    assert list(cells) == [render_value(v) for v in values]
    if distinct <= 500:  # the leading values repeat: each distinct value is one object
        assert len({id(c) for c in cells}) <= distinct + 3


def _cells(alphabet: str) -> st.SearchStrategy[list[str | None]]:
    """1 to 30 short cells of ``alphabet``, some missing."""
    return st.lists(
        st.one_of(st.none(), st.text(alphabet=alphabet, max_size=6)), min_size=1, max_size=30
    )


@settings(max_examples=60, deadline=None)
@given(values=_cells("ab\t\n\r\x0b\x1c\x85\u2028\u2029é "))
def test_arrow_strings_fence_every_line_break(values: list[str | None]) -> None:
    """The byte scan that skips the per-value search never hides a break (tabs are no breaks)."""
    for frame in (pd.DataFrame({"c": pd.array(values, "str")}), pl.DataFrame({"c": values})):
        assert list(as_table(frame).cells["c"]) == [render_value(v) for v in values]


@settings(max_examples=60, deadline=None)
@given(values=_cells("ab\t\n\x85\u2028é "), data=st.data())
def test_a_slice_of_a_frame_renders_its_own_rows(
    values: list[str | None], data: st.DataObject
) -> None:
    """A slice shares its parent's buffers: only its rows are scanned, and every break in
    them is still fenced (``df.head(8)`` of a large frame reads 8 rows' text)."""
    lo = data.draw(st.integers(0, len(values) - 1))
    hi = data.draw(st.integers(lo, len(values)))
    want = [render_value(v) for v in values[lo:hi]]
    pandas = pd.DataFrame({"c": pd.array(values, "str")}).iloc[lo:hi]
    polars = pl.DataFrame({"c": values}).slice(lo, hi - lo)
    for frame in (pandas, polars):
        assert list(as_table(frame).cells["c"]) == want


@pytest.mark.parametrize("kind", ["pandas str", "polars"])
@pytest.mark.parametrize(
    ("distinct", "holes", "broken"),
    [(7, True, False), (7, True, True), (20000, True, False), (20000, False, False)],
)
def test_arrow_factorization_is_the_cells_own(
    kind: str, distinct: int, holes: bool, broken: bool
) -> None:
    """Codes that come with Arrow's encoding equal factorize() of the rendered cells."""
    n = 20000
    values: list[str | None] = [f"v {(i * 7919) % distinct}" for i in range(n)]
    if holes:
        values[5] = None
        values[9] = MISSING  # the literal text of a missing value: the same cell
    if broken:
        values[3] = "two\nlines"
    if kind == "polars":
        frame: object = pl.DataFrame({"c": values})
    else:
        frame = pd.DataFrame({"c": pd.array(values, "str")})
    table = as_table(frame)
    cells = table.cells["c"]
    got_values, got_codes = table.coded("c")
    want_values, want_codes = factorize(cells)
    assert list(got_values) == want_values
    assert got_codes.tolist() == want_codes.tolist()
    assert got_codes.dtype == want_codes.dtype


def _utf8(table: Table, column: str) -> tuple[list[int], bytes]:
    lengths, parts = table.utf8(column)
    return lengths.tolist(), b"".join(parts)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.text(alphabet="ab\x00\t\né\u2028\U0001f600 ", max_size=6)),
        min_size=0,
        max_size=30,
    ),
    cut=st.integers(0, 5),
)
def test_utf8_is_the_cells_text_whatever_holds_it(values: list[str | None], cut: int) -> None:
    """Arrow's own buffers (sliced, in chunks) give each cell's UTF-8 as Python strings do.

    Only columns rendered as they are read Arrow's buffers (none missing, nothing
    fenced); the others, and object columns, encode the rendered cells.
    """
    half = len(values) // 2
    cut = min(cut, len(values) - half)
    arrow = pd.concat(  # two chunks, the second sliced
        [
            pd.DataFrame({"c": pd.array(values[:half], "str")}),
            pd.DataFrame({"c": pd.array(values[half:], "str")}).iloc[cut:],
        ],
        ignore_index=True,
    )
    kept = values[:half] + values[half + cut :]
    frames = [arrow, pd.DataFrame({"c": kept}, dtype=object), pl.DataFrame({"c": kept})]
    tables = [as_table(frame) for frame in frames]
    cells = [render_value(v) for v in kept]
    want = ([len(c.encode()) for c in cells], "".join(cells).encode())
    assert [_utf8(t, "c") for t in tables] == [want] * 3
    assert [_utf8(t.select(["c"]), "c") for t in tables] == [want] * 3
    plain = None not in kept and not any("\n" in v or "\u2028" in v for v in kept if v)
    assert [t.arrow("c") is not None for t in tables] == [plain, False, plain and bool(kept)]
    assert [list(t.cells["c"]) for t in tables] == [cells] * 3  # read: Python strings now
    assert [t.arrow("c") for t in tables] == [None] * 3
    assert [_utf8(t, "c") for t in tables] == [want] * 3


def test_fingerprint_is_the_same_for_the_same_text_in_arrow_or_python() -> None:
    """A re-run finds its call whether the column is Arrow strings, objects or Polars."""
    from semframe.core.parse import TEXT
    from semframe.core.plan import RelQuery, fingerprint
    from semframe.core.template import parse_template

    values = ["caf\u00e9", "a", "", "\U0001f600 b", "a"] * 3
    frames = [
        pd.DataFrame({"a": pd.array(values, "str")}),
        pd.DataFrame({"a": values}, dtype=object),
        pl.DataFrame({"a": values}),
    ]
    template = parse_template("Echo {a}")
    keys = {fingerprint(RelQuery("map", template, as_table(f), TEXT), "ggr") for f in frames}
    assert len(keys) == 1
    other = pd.DataFrame({"a": pd.array([*values[:-1], "b"], "str")})
    assert fingerprint(RelQuery("map", template, as_table(other), TEXT), "ggr") not in keys
