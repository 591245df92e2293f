"""A plan's requests held as columns read exactly as the rendered requests they stand for."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.backends.fake import FakeBackend
from semframe.cache.keys import plan_keys, request_key, request_keys
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.requests import (
    Requests,
    bytes_of,
    chars_of,
    prompts_of,
    rows_of,
    subset,
    with_options,
)
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.core.wire import Request

FIELDS = ("movie", "review", "genre")
value = st.sampled_from(["Alien", "Heat", "é", "x" * 40, "", "a\nb", "<missing>", None, "😀"])


def _plan(cells: list[tuple[object, ...]], seed: int, restate: bool) -> tuple[RelQuery, Plan]:
    table = Table.from_columns({f: [row[j] for row in cells] for j, f in enumerate(FIELDS)})
    rq = RelQuery(
        "map",
        parse_template("Say {movie}: is {review} a {genre}?"),
        table,
        TEXT,
        system="be brief",
        restate=restate,
    )
    rng = random.Random(seed)
    rows = list(range(len(cells)))
    rng.shuffle(rows)
    orders = [tuple(rng.sample(FIELDS, 3)) for _ in range(3)]
    fields = [orders[rng.randrange(3)] for _ in rows]
    return rq, make_plan(rq, Ordering(rows, fields), "none")


@settings(max_examples=120, deadline=None)
@given(
    cells=st.lists(st.tuples(value, value, value), min_size=1, max_size=25),
    seed=st.integers(0, 2**16),
    restate=st.booleans(),
)
def test_columns_read_as_the_rendered_requests(
    cells: list[tuple[object, ...]], seed: int, restate: bool
) -> None:
    rq, plan = _plan(cells, seed, restate)
    requests = plan.requests
    assert isinstance(requests, Requests)
    n = len(cells)
    listed = list(requests)  # read a chunk at a time
    assert len(listed) == len(requests) == n
    assert listed == [requests[i] for i in range(n)]  # read one at a time
    assert listed[-1] == requests[-1]
    for i, r in enumerate(listed):
        assert r.id == i
        assert r.row == plan.ordering.rows[i]
        order = plan.ordering.fields[i]
        body = "".join(f"{f}: {rq.table.cells[f][r.row]}\n" for f in order)
        assert r.prompt.startswith(plan.instructions + "\n\n" + body)
        assert r.system == "be brief"
        assert r.prefix[0] == (len(plan.instructions) + 2, n)
    prompts = [r.prompt for r in listed]
    assert prompts_of(requests) == prompts
    assert chars_of(requests).tolist() == [len(p) for p in prompts]
    assert bytes_of(requests).tolist() == [len(p.encode("utf-8")) for p in prompts]
    assert rows_of(requests).tolist() == [r.row for r in listed]
    # A subset keeps ids and reads as the same requests, in the order asked.
    rng = random.Random(seed)
    picked = rng.sample(range(n), rng.randint(0, n))
    part = subset(requests, picked)
    assert list(part) == [listed[i] for i in picked]
    assert list(subset(tuple(listed), picked)) == list(part)
    assert list(requests[1:]) == listed[1:]
    # Shared options change every request and nothing else.
    tagged = with_options(requests, rel="r1", rel_size=n, logprobs=2)
    assert list(tagged) == [r._replace(rel="r1", rel_size=n, logprobs=2) for r in listed]
    assert list(with_options(tuple(listed), logprobs=2)) == [r._replace(logprobs=2) for r in listed]
    # Cache keys hashed from the prompts a chunk at a time are the requests' own keys.
    fake = FakeBackend()
    assert plan_keys(plan, fake) == request_keys(fake, listed)
    # Equality against rendered requests, and a round trip through pickle.
    assert requests == tuple(listed)
    assert tuple(listed) == requests
    assert pickle.loads(pickle.dumps(requests)) == requests
    if n > 1:
        assert requests != tuple(listed[:-1])


def test_an_index_out_of_range_is_an_index_error() -> None:
    _, plan = _plan([("Alien", "tense", "horror")], 0, False)
    for bad in (1, -2):
        with pytest.raises(IndexError, match="out of range for 1 requests"):
            plan.requests[bad]


@settings(max_examples=30, deadline=None)
@given(temperatures=st.lists(st.sampled_from([0.0, 0.7]), max_size=12))
def test_keys_of_requests_made_one_by_one_skip_the_sampled_ones(temperatures: list[float]) -> None:
    """A plan of listed requests: a key for each deterministic one, in its place; None else."""
    listed = [
        Request(i, i, f"prompt {i % 3}", None, 8, t, None, 0) for i, t in enumerate(temperatures)
    ]
    _, planned = _plan([("Alien", "tense", "horror")] * len(listed), 0, False)
    plan = dataclasses.replace(planned, requests=listed)
    fake = FakeBackend()
    keys = plan_keys(plan, fake)
    assert list(keys) == [request_key(fake, r) if r.temperature == 0 else None for r in listed]
    digests, at = keys.present()
    assert at.tolist() == [i for i, t in enumerate(temperatures) if t == 0]
    assert digests == b"".join(bytes.fromhex(request_key(fake, listed[i])) for i in at.tolist())
