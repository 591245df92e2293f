"""The async dispatch under a bounded shared cache (``Room``): every request once, leaders first."""

from __future__ import annotations

import dataclasses
import random

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.core.capacity import Capacity
from semframe.core.plan import Plan
from semframe.operators.common import compile_call
from semframe.runtime.dispatch import AsyncDispatcher, Room, room_for
from semframe.runtime.execute import execute
from tests.test_api_exec import AsyncBackend


def _plan(sizes: list[int], doc: int = 40) -> Plan:
    movie = [f"movie {g} " + "x" * doc for g, n in enumerate(sizes) for _ in range(n)]
    review = [f"review {g}-{i}" for g, n in enumerate(sizes) for i in range(n)]
    df = pd.DataFrame({"movie": movie, "review": review})
    return compile_call(df, "Summarize {review} of {movie}", op="map", backend="fake").plan


def _drive(
    dispatcher: AsyncDispatcher, workers: int, rng: random.Random
) -> tuple[list[int], list[tuple[str, int]]]:
    """Send everything, finishing a random request in flight whenever nothing can go."""
    sent: list[int] = []
    events: list[tuple[str, int]] = []
    in_flight: list[tuple[int, int]] = []
    room = dispatcher.room
    while True:
        while dispatcher.in_flight < workers:
            taken = dispatcher.next_request()
            if taken is None:
                break
            index, request = taken
            group = dispatcher.groups[index]
            if room is not None and request == group.start and len(in_flight) > 0:
                assert dispatcher.held <= room.limit  # a new group only where it fits
            sent.append(request)
            events.append(("send", request))
            in_flight.append(taken)
        if not in_flight:
            return sent, events
        index, request = in_flight.pop(rng.randrange(len(in_flight)))
        dispatcher.finished(index, request)
        events.append(("done", request))


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    workers=st.integers(1, 6),
    limit=st.integers(0, 60),
    share=st.integers(0, 6),
    own=st.integers(1, 6),
    warm=st.booleans(),
    bounded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_request_goes_once_leaders_first(
    sizes: list[int],
    workers: int,
    limit: int,
    share: int,
    own: int,
    warm: bool,
    bounded: bool,
    seed: int,
) -> None:
    plan = _plan(sizes)
    rng = random.Random(seed)
    room = None
    if bounded:
        shared = tuple(share if len(g) > 1 else 0 for g in plan.groups)
        owns = tuple(rng.randint(1, own) for _ in plan.requests)
        room = Room(limit, shared, owns)
    dispatcher = AsyncDispatcher(plan, warm=warm, room=room, workers=workers)
    sent, events = _drive(dispatcher, workers, rng)
    assert sorted(sent) == list(range(len(plan.requests)))
    for group in plan.groups:
        members = [r for r in sent if group.start <= r < group.stop]
        assert members == list(range(group.start, group.stop))  # leader first, then in order
        if len(group) > 1:
            leader_done = events.index(("done", group.start))
            assert events.index(("send", group.start + 1)) > leader_done
    if room is not None:
        assert dispatcher.held == 0  # every block counted in was counted out
        assert dispatcher.waiting == 0


def test_without_room_the_dispatch_is_todays() -> None:
    plan = _plan([3, 1, 4, 2])
    a = AsyncDispatcher(plan, workers=2)
    b = AsyncDispatcher(plan, room=None, workers=2)
    assert _drive(a, 2, random.Random(1)) == _drive(b, 2, random.Random(1))


def test_a_tight_cache_starts_fewer_groups_ahead() -> None:
    plan = _plan([8] * 6)
    roomy = AsyncDispatcher(plan, workers=8)
    first_wave = [roomy.next_request() for _ in range(8)]
    assert sum(t is not None for t in first_wave) == 6  # today: every group's leader at once
    cap = Capacity(160, block=4, concurrency=8)
    room = room_for(plan, cap, tokens_per_char=0.25, output_tokens=4)
    assert room is not None
    tight = AsyncDispatcher(plan, room=room, workers=8)
    wave = [t for t in (tight.next_request() for _ in range(8)) if t is not None]
    assert 1 <= len(wave) < 6
    assert tight.held <= room.limit


def test_room_for_counts_only_what_a_bounded_shared_cache_must() -> None:
    plan = _plan([5, 1, 3])
    kw = {"tokens_per_char": 0.25, "output_tokens": 8}
    assert room_for(plan, None, **kw) is None  # type: ignore[arg-type]
    assert room_for(plan, Capacity(None, block=16), **kw) is None  # type: ignore[arg-type]
    assert room_for(plan, Capacity(64, slots=True), **kw) is None  # type: ignore[arg-type]
    assert room_for(plan, Capacity(10**6, block=16), **kw) is None  # type: ignore[arg-type]
    room = room_for(plan, Capacity(96, block=4, concurrency=4), **kw)  # type: ignore[arg-type]
    assert room is not None
    assert room.limit == 24
    assert len(room.shared) == len(plan.groups)
    assert len(room.own) == len(plan.requests)
    assert room.shared[1] == 0  # a group of one shares nothing
    assert all(o >= 1 for o in room.own)
    for g, blocks in zip(plan.groups, room.shared, strict=True):
        shortest = min(len(r.prompt) for r in plan.requests[g.start : g.stop])
        assert blocks * 4 <= shortest * 0.25  # whole blocks of what every member holds


def test_the_executor_keeps_to_a_bounded_cache() -> None:
    plan = _plan([6, 6, 1, 6, 1, 6])
    tight = dataclasses.replace(plan, capacity=Capacity(2000, block=4, concurrency=8))
    # The fake counts a token per character; outputs at max_tokens.
    room = room_for(
        tight, tight.capacity, tokens_per_char=1.0, output_tokens=plan.relquery.max_tokens
    )
    assert room is not None
    assert 1 < room.limit // max(room.own) < 8  # fewer requests fit than workers
    for p in (plan, tight):
        backend = AsyncBackend(concurrency=8)
        outcomes, stats = execute(p, backend, max_concurrency=8, progress="off")  # type: ignore[arg-type]
        assert [o.value for o in p.restore(outcomes)] == [f"answer {i}" for i in range(26)]
        assert stats.requests == 26
        for group in p.groups:
            leader_done = backend.events.index(("done", group.start))
            for member in range(group.start + 1, group.stop):
                assert backend.events.index(("send", member)) > leader_done
