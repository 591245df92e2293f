"""Free text left in Arrow (ArrowValues): what Python strings give, without a string per row."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semframe  # noqa: F401  (registers df.llm)
from semframe.backends.fake import FakeBackend
from semframe.cache.keys import plan_keys
from semframe.core import table as table_module
from semframe.core.plan import fingerprint
from semframe.core.requests import Joined
from semframe.core.table import ArrowValues, as_table, char_lengths, factorize, factorize_arrow
from semframe.core.template import parse_template
from semframe.reorder._encode import _sorted_codes, encode

_TEXT = st.text(alphabet="ab\x00\t\u00e9\U0001f600 z", max_size=5)


def _arrow(cells: list[str], large: bool, cut: int) -> pa.Array | pa.ChunkedArray:
    source = pa.array(cells, type=pa.large_string() if large else pa.string())
    if cut:  # two chunks, the first a slice of a larger array
        cut = min(cut, len(cells))
        first = pa.array(["x", *cells[:cut]], type=source.type).slice(1)
        return pa.chunked_array([first, source.slice(cut)], type=source.type)
    return source


@settings(max_examples=80, deadline=None)
@given(
    cells=st.lists(_TEXT, min_size=1, max_size=40),
    large=st.booleans(),
    cut=st.integers(0, 6),
)
def test_factorize_arrow_is_factorize_and_sorts_as_python(
    cells: list[str], large: bool, cut: int
) -> None:
    """Same distinct values (first seen first), codes, sorted order and lengths as Python."""
    values, codes = factorize_arrow(_arrow(cells, large, cut))
    want_values, want_codes = factorize(cells)
    assert isinstance(values, ArrowValues)
    assert list(values) == want_values
    assert codes.tolist() == want_codes.tolist()
    assert codes.dtype == want_codes.dtype
    ordered, ranks = _sorted_codes((values, codes))
    want_ordered, want_ranks = _sorted_codes((tuple(want_values), want_codes))
    assert list(ordered) == list(want_ordered)
    assert ranks.tolist() == want_ranks.tolist()
    assert char_lengths(ordered).tolist() == [len(v) for v in want_ordered]
    assert isinstance(ordered, ArrowValues)
    assert ordered.byte_lengths().tolist() == [len(v.encode()) for v in want_ordered]
    at = np.arange(len(ordered))[::-1]
    assert ordered.take(at) == [want_ordered[i] for i in at.tolist()]
    assert list(ordered.compact(at)) == [want_ordered[i] for i in at.tolist()]
    for k, value in enumerate(want_ordered):
        assert value in ordered
        assert ordered.index(value) == k
        assert ordered[k] == value
    assert "not among them" not in ordered


@pytest.mark.parametrize("chunk", [2, 3, 1 << 16])
def test_values_that_share_a_hash_are_told_apart_by_their_text(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Hashes only find candidates: rows whose hashes collide are compared as text.

    Read ``chunk`` strings at a time, a value's first row is still its first.
    """
    monkeypatch.setattr(table_module, "hash", lambda text: len(text) % 2, raising=False)
    monkeypatch.setattr(table_module, "_TAKE", chunk)
    cells = ["ab", "cd", "ab", "e", "f", "cd", "", "e", "gh"]
    values, codes = factorize_arrow(pa.array(cells))
    want_values, want_codes = factorize(cells)
    assert list(values) == want_values
    assert codes.tolist() == want_codes.tolist()


def test_joined_values_read_a_field_at_once_and_keep_only_what_a_shard_uses() -> None:
    arrow = ArrowValues(pa.array(["r0", "r1", "r2", "r1"]), np.array([0, 1, 2]))
    joined = Joined.of([("Alien", "Heat"), arrow, ("x",)])
    flat = ["Alien", "Heat", "r0", "r1", "r2", "x"]
    assert list(joined) == flat
    assert [joined[i] for i in range(len(joined))] == flat
    codes = np.array([5, 2, 0, 4, 3, 3, 1])
    assert joined.take(codes) == [flat[i] for i in codes.tolist()]
    assert joined.take(np.array([4, 2])) == ["r2", "r0"]
    assert joined.char_lengths().tolist() == [len(v) for v in flat]
    assert joined.byte_lengths().tolist() == [len(v.encode()) for v in flat]
    part = joined.select(np.array([1, 3, 4]))
    assert list(part) == ["Heat", "r1", "r2"]
    assert part.starts.tolist() == [0, 1, 3]
    shipped = part.parts[1]
    assert isinstance(shipped, ArrowValues)
    assert len(shipped.source) == 2  # its own two values, not the column


def _frame(n: int) -> pd.DataFrame:
    """Free text (some of it repeated, some not ASCII) beside two fields that repeat."""
    rng = np.random.default_rng(5)
    words = np.array(["good", "bad", "plot", "cast", "dull", "fine", "\u00e9t\u00e9", "\U0001f600"])
    reviews = [" ".join(w) for w in words[rng.integers(0, len(words), (n, 6))].tolist()]
    for i in range(0, n, 9):
        reviews[i] = reviews[(i * 7) % n]  # repeats, some far apart
    return pd.DataFrame(
        {
            "movie": pd.array(rng.choice([f"movie {i}" for i in range(40)], n), "str"),
            "year": rng.integers(1990, 1995, n),
            "review": pd.array(reviews, "str"),
        }
    )


TEMPLATE = "Summarize the review {review} of {movie} ({year})."


def test_a_plan_of_free_text_in_arrow_is_the_plan_of_python_strings() -> None:
    """Order, prompts, groups, lengths, keys and shards are the same; the text stays in Arrow."""
    arrow = _frame(6000)
    frames = {
        "arrow": arrow,
        "object": arrow.astype({"movie": object, "review": object}),
        "polars": pl.from_pandas(arrow),
        "arrow dtype": arrow.astype({"review": pd.ArrowDtype(pa.large_string())}),
    }
    plans = {name: f.llm.plan(TEMPLATE, op="map", cache=False) for name, f in frames.items()}
    free = plans["arrow"].relquery.table
    assert isinstance(free.coded("review")[0], ArrowValues)
    assert free.arrow("review") is not None  # no Python string made per row
    assert not isinstance(plans["object"].relquery.table.coded("review")[0], ArrowValues)
    want = plans["object"]
    backend = FakeBackend()
    assert plans["arrow dtype"].relquery.table.arrow("review") is not None
    for name in ("arrow", "polars", "arrow dtype"):
        got = plans[name]
        assert np.array_equal(got.ordering.rows, want.ordering.rows), name
        assert got.ordering.fields == want.ordering.fields
        assert got.groups == want.groups
        assert got.shared_chars == want.shared_chars
        assert got.requests.prompts() == want.requests.prompts()
        assert list(got.requests) == list(want.requests)
        assert np.array_equal(got.requests.prompt_bytes(), want.requests.prompt_bytes())
        assert np.array_equal(got.requests.prompt_lengths(), want.requests.prompt_lengths())
        assert list(plan_keys(got, backend)) == list(plan_keys(want, backend))
        assert fingerprint(got.relquery, "ggr") == fingerprint(want.relquery, "ggr")
        ids = np.arange(100, 400)
        shard, other = got.requests.take(ids).shipped(), want.requests.take(ids).shipped()
        assert list(shard) == list(other)
        enc, want_enc = encode(got.relquery.table), encode(want.relquery.table)
        assert [list(v) for v in enc.values] == [list(v) for v in want_enc.values]
        assert [c.tolist() for c in enc.lengths] == [c.tolist() for c in want_enc.lengths]
    assert free.arrow("review") is not None


def test_runs_and_estimates_of_free_text_in_arrow_match_python_strings() -> None:
    arrow = _frame(5000)
    python = arrow.astype({"movie": object, "review": object})
    got = arrow.llm.map(TEMPLATE, backend="fake", cache=False, progress="off")
    want = python.llm.map(TEMPLATE, backend="fake", cache=False, progress="off")
    assert got["llm_output"].tolist() == want["llm_output"].tolist()
    kept = arrow.llm.filter("Is {review} about {movie} kind?", backend="fake", cache=False)
    assert (
        kept.index.tolist()
        == python.llm.filter(
            "Is {review} about {movie} kind?", backend="fake", cache=False
        ).index.tolist()
    )
    for backend in ("fake", "openai"):  # counted in characters; in the model's tokens
        costs = [
            dataclasses.replace(
                frame.llm.estimate(
                    TEMPLATE, op="map", backend=backend, model="gpt-4o-mini", cache=False
                ),
                seconds_to_estimate=0.0,
            )
            for frame in (arrow, python)
        ]
        assert costs[0] == costs[1], backend
    assert as_table(arrow).arrow("review") is not None


def test_pandas_arrow_dtype_strings_render_as_other_strings_do() -> None:
    """``pd.ArrowDtype(pa.string())`` (Ray Data's ``to_pandas``) is read from Arrow too."""
    cells = ["a", None, "two\nlines", "", "caf\u00e9", "a"]
    want = as_table(pd.DataFrame({"c": cells}, dtype=object)).cells["c"]
    for kind in (pa.string(), pa.large_string()):
        table = as_table(pd.DataFrame({"c": pd.Series(cells, dtype=pd.ArrowDtype(kind))}))
        assert table.cells["c"] == want
        plain = as_table(pd.DataFrame({"c": pd.Series(["x", "y"], dtype=pd.ArrowDtype(kind))}))
        assert plain.arrow("c") is not None
        assert list(plain.cells["c"]) == ["x", "y"]


@settings(max_examples=60, deadline=None)
@given(
    movies=st.lists(st.text(alphabet="ab \u00e9\n", max_size=6), min_size=1, max_size=8),
    reviews=st.lists(st.text(alphabet="xy \u00e9\n", max_size=12), min_size=1, max_size=8),
    rows=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), min_size=0, max_size=20),
)
def test_the_restated_question_from_codes_is_the_one_from_each_row(
    movies: list[str], reviews: list[str], rows: list[tuple[int, int]]
) -> None:
    """Short values inline, long ones named; from tuples or Arrow values alike."""
    template = parse_template("Does the review {review} praise {movie}?")
    picked = [(m % len(movies), r % len(reviews)) for m, r in rows]
    want = [
        template.restated({"movie": movies[m], "review": reviews[r]}, inline=5) for m, r in picked
    ]
    movie_codes = np.array([m for m, _ in picked], dtype=np.int64)
    review_codes = np.array([r for _, r in picked], dtype=np.int64)
    for wrap in (tuple, lambda v: ArrowValues(pa.array(v, type=pa.large_string()))):
        coded = {"movie": (wrap(movies), movie_codes), "review": (wrap(reviews), review_codes)}
        assert template.restated_coded(coded, len(picked), inline=5) == want
