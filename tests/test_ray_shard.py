"""What the Ray executor ships (no Ray needed): shards and answer batches rebuild exactly."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe import reorder
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.core.wire import Completion, Outcome, TokenLogprob, Usage
from semframe.runtime.shard import Answer, Answers, Shard

pytestmark = pytest.mark.ray


def _plan(rows: list[tuple[str, str, str]], method: str, system: str | None = None) -> Plan:
    table = Table.from_columns(
        {
            "genre": [r[0] for r in rows],
            "movie": [r[1] for r in rows],
            "review": [r[2] for r in rows],
        }
    )
    rq = RelQuery(
        "map", parse_template("Rate {review} of {movie} ({genre})"), table, TEXT, system=system
    )
    return make_plan(rq, reorder.order(table, method), method)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    n = draw(st.integers(1, 40))
    genre = st.sampled_from(["drama", "horror film with a long genre name", "comedy", ""])
    movie = st.sampled_from(["Alien", "Al", "Alien 2", "Heat", "Jaws, the long-titled version"])
    review = st.text(alphabet="abAé \n:", min_size=0, max_size=30)
    rows = draw(st.lists(st.tuples(genre, movie, review), min_size=n, max_size=n))
    method = draw(st.sampled_from(["ggr", "none", "stats"]))
    return _plan(rows, method, system=draw(st.sampled_from([None, "Be brief."])))


@settings(max_examples=200, deadline=None)
@given(plans(), st.data())
def test_a_shard_rebuilds_its_requests_exactly(plan: Plan, data: st.DataObject) -> None:
    """Any subset of a plan's requests, in any order, crosses a pickle unchanged but renumbered."""
    n = len(plan.requests)
    ids = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    if data.draw(st.booleans()):
        ids.sort()
    if data.draw(st.booleans()):  # requests made one by one travel as prompt deltas
        plan = dataclasses.replace(plan, requests=tuple(plan.requests))
    shard = pickle.loads(pickle.dumps(Shard.of(plan, ids)))
    rebuilt = shard.plan()
    assert len(shard) == len(ids) == len(rebuilt.requests)
    for k, (i, request) in enumerate(zip(ids, rebuilt.requests, strict=True)):
        assert request == plan.requests[i]._replace(id=k, row=k)
        assert rebuilt.ordering.fields[k] == plan.ordering.fields[i]
        assert rebuilt.shared_chars[k] == plan.shared_chars[i]
    assert rebuilt.ordering.rows.tolist() == list(range(len(ids)))
    assert rebuilt.relquery.table.n_rows == 0
    assert rebuilt.relquery.template == plan.relquery.template
    # groups: runs of the same group id, covering every request once
    covered = [k for g in rebuilt.groups for k in range(g.start, g.stop)]
    assert covered == list(range(len(ids)))
    for g in rebuilt.groups:
        assert len({rebuilt.requests[k].group for k in range(g.start, g.stop)}) == 1


def test_a_shard_sends_a_shared_head_once_per_run_of_requests() -> None:
    """Reviews of one long-described movie: the description crosses once, not per review."""
    description = "A very long description of the film. " * 40
    rows = [("drama", description, f"review {i}") for i in range(200)]
    plan = _plan(rows, "ggr")
    whole = len(pickle.dumps(tuple(plan.requests)))  # every prompt rendered
    made = dataclasses.replace(plan, requests=tuple(plan.requests))  # requests made one by one
    for source in (plan, made):
        packed = Shard.of(source, range(200))
        assert len(pickle.dumps(packed)) * 10 < whole
        shipped = packed.tails if packed.requests is None else packed.requests.values
        assert sum(len(t) for t in shipped) < len(description) + 200 * 80


def test_requests_whose_fields_differ_keep_them() -> None:
    """A column that is not the same for every request is shipped per request."""
    plan = _plan([("drama", "Alien", "good"), ("drama", "Alien", "bad")], "none")
    tagged = plan.requests[0]._replace(max_tokens=7, temperature=0.5, rel="x", rel_size=2)
    mixed = Plan(
        plan.relquery,
        plan.ordering,
        plan.reorder,
        plan.instructions,
        (tagged, plan.requests[1]),
        plan.groups,
        plan.shared_chars,
    )
    rebuilt = Shard.of(mixed, [0, 1]).plan().requests
    assert rebuilt[0] == tagged
    assert rebuilt[1] == plan.requests[1]


def test_an_empty_shard() -> None:
    plan = _plan([("drama", "Alien", "good")], "none")
    rebuilt = Shard.of(plan, []).plan()
    assert rebuilt.requests == () and rebuilt.groups == ()


outcomes = st.builds(
    Outcome,
    value=st.one_of(st.none(), st.text(max_size=5), st.booleans(), st.integers()),
    raw=st.one_of(st.none(), st.text(max_size=5)),
    error_kind=st.sampled_from([None, "parse", "backend"]),
    error=st.one_of(st.none(), st.text(max_size=5)),
    attempts=st.integers(0, 4),
    logprobs=st.one_of(st.none(), st.just((TokenLogprob("a", -0.1, (("a", -0.1),)),))),
)
usages = st.builds(Usage, *(st.integers(0, 1000) for _ in range(4)))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(outcomes, usages, st.booleans()), max_size=20),
    usages,
    st.integers(0, 1000),
    st.booleans(),
)
def test_a_batch_of_answers_rebuilds_exactly(
    items: list[tuple[Outcome, Usage, bool]], usage: Usage, largest: int, completions: bool
) -> None:
    answers = [
        Answer(k * 3, outcome, Completion(k * 3, f"text {k}", used) if stored else None)
        for k, (outcome, used, stored) in enumerate(items)
    ]
    packed = Answers.of(answers, usage=usage, largest_output=largest, completions=completions)
    batch = pickle.loads(pickle.dumps(packed))
    assert len(batch) == len(answers)
    assert list(batch.ids) == [a.id for a in answers]
    assert batch.outcome_list() == [a.outcome for a in answers]
    assert (batch.usage, batch.largest_output) == (usage, largest)
    if completions:
        assert list(batch.completions or ()) == [a.completion for a in answers]
    else:
        assert batch.completions is None


def test_a_replica_meter_sums_every_attempt_once_per_batch() -> None:
    """Usage goes with the next batch, summed over attempts; the last answer is kept apart."""
    from semframe.backends.fake import FakeBackend
    from semframe.core.wire import Request
    from semframe.runtime.ray_executor import _Meter

    meter = _Meter(FakeBackend(lambda r: "x" * (4 * (r.id + 1))), answers=True)
    first, second = (Request(i, i, f"prompt {i} " * 10, None, 16, 0.0, None, i) for i in (0, 1))
    done = [meter.complete(first), meter.complete(first), meter.complete(second)]  # a retry
    usage, largest = meter.take_usage()
    assert usage == Usage(*map(sum, zip(*(c.usage for c in done), strict=True)))
    assert largest == max(c.usage.output_tokens for c in done) == 2
    assert meter.take_usage() == (Usage(), 0)  # each attempt once
    assert meter.take(0) is done[1] and meter.take(0) is None
    assert _Meter(FakeBackend(), answers=False).take(0) is None
