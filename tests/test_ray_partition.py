"""Prefix-aware partitioning (no Ray needed): every request once, groups whole, loads balanced."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe import reorder
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, groups_of, make_plan
from semframe.core.requests import Requests
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.serving.partition import (
    Unit,
    assign,
    partition,
    plan_units,
    replica_cache,
    request_splitter,
)

pytestmark = pytest.mark.ray


def _plan(genres: list[str], movies: list[str], reviews: list[str]) -> Plan:
    table = Table.from_columns({"genre": genres, "movie": movies, "review": reviews})
    rq = RelQuery("map", parse_template("Rate {review} of {movie} ({genre})"), table, TEXT)
    return make_plan(rq, reorder.order(table, "ggr"), "ggr")


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    n = draw(st.integers(1, 40))
    genre = st.sampled_from(["drama", "horror film with a long genre name", "comedy"])
    movie = st.sampled_from(["Alien", "Heat", "Up", "Jaws, the long-titled version", "Ran"])
    review = st.text(alphabet="abcdefgh ", min_size=0, max_size=30)
    rows = draw(st.lists(st.tuples(genre, movie, review), min_size=n, max_size=n))
    return _plan([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


def _depth_shared(plan: Plan, i: int, j: int) -> int:
    """The deepest prefix level requests ``i`` and ``j`` share (0: the instructions)."""
    a, b = plan.requests[i], plan.requests[j]
    depth = 0
    for d in range(1, min(len(a.prefix), len(b.prefix))):
        end = a.prefix[d][0]
        if end != b.prefix[d][0] or a.prompt[:end] != b.prompt[:end]:
            break
        depth = d
    return depth


@settings(max_examples=150, deadline=None)
@given(plans(), st.integers(1, 6), st.sampled_from([0.0, 50.0]))
def test_every_request_once_groups_whole_loads_balanced(
    plan: Plan, replicas: int, per_request: float
) -> None:
    part = partition(plan.requests, plan.groups, replicas, per_request=per_request)
    assert part.replicas == replicas
    # Every request assigned exactly once.
    flat = sorted(i for shard in part.shards for i in shard)
    assert flat == list(range(len(plan.requests)))
    where = {i: r for r, shard in enumerate(part.shards) for i in shard}
    # A group is cut only at a sub-prefix boundary: when two neighbours of one group
    # land on different replicas, the run of requests sharing their common level has a
    # deeper level (the cut is between its sub-runs), unless rows had to be split.
    for g in plan.groups:
        for i in range(g.start, g.stop - 1):
            if where[i] == where[i + 1]:
                continue
            common = _depth_shared(plan, i, i + 1)
            lo, hi = i, i + 1
            while lo > g.start and _depth_shared(plan, lo - 1, lo) >= common:
                lo -= 1
            while hi < g.stop - 1 and _depth_shared(plan, hi, hi + 1) >= common:
                hi += 1
            deeper = any(_depth_shared(plan, k, k + 1) > common for k in range(lo, hi))
            assert deeper or part.row_splits > 0, (i, common)
    # Units cover the requests in order within each replica.
    for units in part.units:
        assert all(u.start < v.start for u, v in itertools.pairwise(units))
    # Balanced within LPT's bound: the mean plus the largest unit placed.
    largest = max((u.work(per_request) for us in part.units for u in us), default=0.0)
    assert part.makespan <= part.total_work / replicas + largest + 1e-6
    # Balanced as asked unless no unit could be split further.
    if part.balance > 1.05 + 1e-9:
        split = request_splitter(plan.requests)
        heavy = [u for us in part.units for u in us if u.work(per_request) > 0]
        assert all(split(u) is None for u in heavy if u.work(per_request) >= largest)


@settings(max_examples=150, deadline=None)
@given(plans(), st.integers(1, 6), st.sampled_from([0.0, 50.0]), st.data())
def test_columns_partition_as_the_rendered_requests_do(
    plan: Plan, replicas: int, per_request: float, data: st.DataObject
) -> None:
    # A plan's columns are partitioned without rendering a prompt (lengths from the
    # segments, prefixes compared by codes): the same units, splits and shards as its
    # rendered requests, compared as text. Also for a subset in another order, as the
    # Ray executor partitions what is left after a replica dies.
    assert isinstance(plan.requests, Requests)
    n = len(plan.requests)
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    for columns in (plan.requests, plan.requests.take(sorted(picks)), plan.requests.take(picks)):
        rendered = list(columns)
        groups = groups_of(rendered)
        assert plan_units(columns, groups) == plan_units(rendered, groups)
        got = partition(columns, groups, replicas, per_request=per_request)
        assert got == partition(rendered, groups, replicas, per_request=per_request)
        split_columns, split_text = request_splitter(columns), request_splitter(rendered)
        for unit in plan_units(rendered, groups):
            assert split_columns(unit) == split_text(unit)


@settings(max_examples=60, deadline=None)
@given(plans(), st.integers(1, 6))
def test_groups_stay_whole_when_they_balance(plan: Plan, replicas: int) -> None:
    units = plan_units(plan.requests, plan.groups)
    part = partition(plan.requests, plan.groups, replicas)
    spans = {(u.start, u.stop) for us in part.units for u in us}
    if part.splits == 0 and part.row_splits == 0:
        assert spans == {(u.start, u.stop) for u in units}


def test_a_large_group_is_split_at_its_sub_prefix_not_by_rows() -> None:
    # One movie holds most rows; two critics inside it form a deeper level.
    movies = ["Alien"] * 12 + ["Heat", "Heat", "Up", "Up"]
    critics = ["Ann"] * 6 + ["Bob"] * 6 + ["Cy", "Di", "Ed", "Fa"]
    reviews = [f"review number {i}" for i in range(16)]
    table = Table.from_columns({"movie": movies, "critic": critics, "review": reviews})
    rq = RelQuery("map", parse_template("Rate {review} of {movie} by {critic}"), table, TEXT)
    order = reorder.order(table, "ggr")
    plan = make_plan(rq, order, "ggr")
    part = partition(plan.requests, plan.groups, 2)
    assert part.splits >= 1 and part.row_splits == 0
    critic_of = {
        i: plan.relquery.table.cells["critic"][plan.requests[i].row]
        for i in range(len(plan.requests))
    }
    where = {i: r for r, shard in enumerate(part.shards) for i in shard}
    for critic in ("Ann", "Bob"):
        assert len({where[i] for i, c in critic_of.items() if c == critic}) == 1


def test_a_group_without_a_deeper_level_is_cut_into_runs_of_rows() -> None:
    # One movie holds 600 of 640 rows and nothing below it is shared: it must be cut,
    # into a few contiguous runs (each paying its prefix once), not 600 single rows.
    movies = ["Alien"] * 600 + [f"movie {m}" for m in range(20) for _ in range(2)]
    reviews = [f"review {i} " + "x" * (i % 37) for i in range(640)]
    table = Table.from_columns({"movie": movies, "review": reviews})
    rq = RelQuery("map", parse_template("Rate {review} of {movie}"), table, TEXT)
    plan = make_plan(rq, reorder.order(table, "ggr"), "ggr")
    part = partition(plan.requests, plan.groups, 4)
    assert part.row_splits >= 1
    units = [u for us in part.units for u in us]
    assert sorted(i for shard in part.shards for i in shard) == list(range(640))
    assert len(units) < 21 + 4 * 40  # the other groups plus runs of about 5% of a share
    assert all(u.stop > u.start for u in units)
    assert part.balance <= 1.05 + max(u.work() for u in units) / (part.total_work / 4)


def test_replica_cache_pays_a_prefix_once_per_replica() -> None:
    a = Unit(0, 3, ((1, 0, 100),), 30)
    b = Unit(3, 6, ((1, 0, 100), (2, 3, 10)), 30)
    together = replica_cache([[a, b]], head=20)
    apart = replica_cache([[a], [b]], head=20)
    assert sum(together.prompt) == sum(apart.prompt)
    assert sum(together.cached) - sum(apart.cached) == 100 + 20  # the prefix and the head


def test_assign_rejects_zero_replicas() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        assign([Unit(0, 1, (), 5)], 0, lambda u: None)
