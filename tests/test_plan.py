"""Plans: requests carry exactly the named fields' values, in the planned order."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.core.table import render_value
from semframe.operators.common import compile_call

cell = st.one_of(
    st.text(max_size=30),
    st.none(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.tuples(cell, cell, cell), max_size=15),
    reorder=st.sampled_from(["none", "stats", "ggr"]),
    op=st.sampled_from(["map", "filter"]),
)
def test_request_bodies_are_the_rows_fields(
    rows: list[tuple[object, object, object]], reorder: str, op: str
) -> None:
    df = pd.DataFrame(rows, columns=["movie title", "review!", "secret"], dtype=object)
    plan = compile_call(
        df, "Is {review!} about {movie title} good?", op=op, backend="fake", reorder=reorder
    ).plan
    assert sorted(plan.ordering.rows) == list(range(len(df)))
    assert [r.row for r in plan.requests] == list(plan.ordering.rows)
    for request, order in zip(plan.requests, plan.ordering.fields, strict=True):
        assert sorted(order) == ["movie title", "review!"]
        expected = "".join(
            f"{name}: {render_value(df.iloc[request.row][name])}\n" for name in order
        )
        assert request.prompt == plan.instructions + "\n\n" + expected
    # groups tile the requests
    covered = [i for g in plan.groups for i in range(g.start, g.stop)]
    assert covered == list(range(len(plan.requests)))
    assert 0.0 <= plan.expected_hit_rate <= 1.0
