"""Served tokens at a cache's granularity, and GGR's choice made in them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reorder_helpers import prompts, ref_hit_rate, seg, tables, tables_with_orderings

from semframe.backends import cost_model
from semframe.config import config
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import RelQuery
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.cost.models import BlockCost, SlotCost
from semframe.errors import ConfigError
from semframe.reorder import Granularity, Objective, ggr, hit_rate, order, served_tokens
from semframe.reorder._encode import encode
from semframe.reorder.fds import fd_pairs
from semframe.reorder.ggr import DEFAULT_HIGH_CARDINALITY, _layout, objective_units
from semframe.reorder.metrics import (
    TOKEN,
    _execution_codes,
    _segment_units,
    served_by_prompt,
    served_units,
    shared_prefixes,
)
from semframe.reorder.stats import fixed_order, lexsort_rows
from semframe.runtime.call import _objective


def _tok(text: str) -> int:
    """A deterministic stand-in tokenizer: one token per 3 characters, rounded up."""
    return -(-len(text) // 3)


granularities = st.builds(
    Granularity,
    minimum=st.integers(0, 40),
    step=st.integers(1, 16),
)


def _codes(t: Table, o: Ordering) -> tuple[np.ndarray, np.ndarray]:
    enc = encode(t.select(tuple(c for c in t.columns if c in o.fields[0])) if len(o) else t)
    return _execution_codes(enc, o), _segment_units(enc, _tok)


def ref_served(t: Table, o: Ordering, g: Granularity, cache: str, head: int) -> int:
    """Each prompt's shared prefix with the cache, literally, rounded to ``g``."""
    seq = prompts(t, o)
    total = 0
    for p, cells in enumerate(seq):
        if p == 0:
            continue
        earlier = seq[p - 1 : p] if cache == "previous" else seq[:p]
        best = 0
        for q in earlier:
            k = 0
            for a, b in zip(q, cells, strict=False):
                if a != b:
                    break
                k += _tok(seg(a))
            best = max(best, k)
        shared = head + best
        total += 0 if shared < g.minimum else g.minimum + (shared - g.minimum) // g.step * g.step
    return total


@settings(max_examples=80, deadline=None)
@given(
    case=tables_with_orderings(),
    g=granularities,
    cache=st.sampled_from(["previous", "unbounded"]),
    head=st.integers(0, 30),
)
def test_served_tokens_matches_literal_reference(
    case: tuple[Table, Ordering], g: Granularity, cache: str, head: int
) -> None:
    t, o = case
    s, units = _codes(t, o)
    assert served_tokens(s, units, g, cache=cache, head=head) == ref_served(t, o, g, cache, head)  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(case=tables_with_orderings(), cache=st.sampled_from(["previous", "unbounded"]))
def test_step_one_minimum_zero_is_the_token_metric(
    case: tuple[Table, Ordering], cache: str
) -> None:
    t, o = case
    s, units = _codes(t, o)
    got = served_tokens(s, units, Granularity(minimum=0, step=1), cache=cache)  # type: ignore[arg-type]
    if cache == "previous":
        assert got == served_units(s, units)
        per_prompt = served_by_prompt(s, units)
        assert per_prompt.shape == (s.shape[0],) and int(per_prompt.sum()) == got
    rate = hit_rate(t, o, tokenizer=_tok, cache=cache, granularity=TOKEN)  # type: ignore[arg-type]
    assert rate == pytest.approx(hit_rate(t, o, tokenizer=_tok, cache=cache))  # type: ignore[arg-type]
    assert rate == pytest.approx(ref_hit_rate(t, o, cache, _tok))


@settings(max_examples=80, deadline=None)
@given(
    case=tables_with_orderings(),
    g=granularities,
    cache=st.sampled_from(["previous", "unbounded"]),
    head=st.integers(0, 30),
)
def test_rounding_never_increases_served_tokens(
    case: tuple[Table, Ordering], g: Granularity, cache: str, head: int
) -> None:
    t, o = case
    s, units = _codes(t, o)
    shared = shared_prefixes(s, units, cache=cache, head=head)  # type: ignore[arg-type]
    rounded = g.round_all(shared)
    assert (rounded <= shared).all()
    assert rounded.tolist() == [g.round(int(x)) for x in shared]
    at = served_tokens(s, units, g, cache=cache, head=head)  # type: ignore[arg-type]
    assert at <= served_tokens(s, units, TOKEN, cache=cache, head=head)  # type: ignore[arg-type]
    # A coarser step of the same grid serves no more.
    coarser = Granularity(g.minimum, g.step * 2)
    assert served_tokens(s, units, coarser, cache=cache, head=head) <= at  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(t=tables(max_rows=8, max_cols=4), g=granularities, head=st.integers(0, 30))
def test_ggr_at_a_granularity_orders_a_permutation_and_keeps_the_best_candidate(
    t: Table, g: Granularity, head: int
) -> None:
    o = ggr(t, granularity=g, head=head)
    assert sorted(o.rows) == list(range(t.n_rows))
    for f in o.fields:
        assert sorted(f) == sorted(t.columns)
    via_order = order(t, "ggr", objective=Objective(g, _tok, head))
    assert sorted(via_order.rows) == list(range(t.n_rows))
    if not t.n_rows or not t.columns:
        return
    # The choice is the best of the candidates, counted as the cache counts.
    enc = encode(t)
    units = objective_units(enc, Objective(g, _tok, head))

    def at(ordering: Ordering) -> int:
        return served_tokens(_execution_codes(enc, ordering), units, g, head=head)

    # (The planner's path solves in the objective's tokens.) The candidates: the
    # two solves and the rows sorted in the best single field order.
    solves = [ggr(t, weigh=w, tokenizer=_tok) for w in ("value", "segment")]
    assert at(via_order) == max(at(s) for s in [*solves, _fixed_candidate(t)])


def _fixed_candidate(t: Table) -> Ordering:
    """GGR's third candidate in ``_tok``'s tokens, built as ``ggr_encoded`` builds it."""
    enc = encode(t, _tok)
    rec = _layout(enc, DEFAULT_HIGH_CARDINALITY).rec
    fds = fd_pairs(enc, rec) if enc.n_rows > 1 and len(rec) > 1 else []
    columns = fixed_order(enc, fds)
    rows = lexsort_rows(enc, np.arange(enc.n_rows, dtype=np.int64), columns)
    names = tuple(enc.columns[j] for j in columns)
    return Ordering(tuple(rows.tolist()), (names,) * enc.n_rows)


def test_granularity_validates_and_rounds() -> None:
    with pytest.raises(ConfigError, match="step"):
        Granularity(step=0)
    with pytest.raises(ConfigError, match="minimum"):
        Granularity(minimum=-1)
    with pytest.raises(ConfigError, match="breakpoints"):
        Granularity(breakpoints=0)
    assert Granularity(1024, 128).round(1023) == 0
    assert Granularity(1024, 128).round(1300) == 1280
    assert Granularity(step=16).round(15) == 0
    assert TOKEN.per_token and not Granularity(step=16).per_token


def test_cost_models_declare_their_granularity() -> None:
    openai = cost_model("openai", model="gpt-4.1-mini", settings=config(backend="openai"))
    assert openai.granularity == Granularity(1024, 128)
    claude = cost_model(
        "anthropic", model="claude-sonnet-4-5", settings=config(backend="anthropic")
    )
    assert claude.granularity.minimum == claude.minimum  # type: ignore[attr-defined]
    assert claude.granularity.breakpoints is not None
    assert BlockCost("m", lambda ts: [1] * len(ts), 1, "vllm").granularity == Granularity(step=16)
    assert SlotCost("m", lambda ts: [1] * len(ts), 1, "llama.cpp").granularity == TOKEN


def test_the_planner_solves_in_the_backends_tokens_counted_in_one_batch() -> None:
    # Short shared fields under long labels: characters and tokens weigh them differently.
    t = Table.from_columns(
        {
            "review/appearance": ["4.0", "4.0", "3.5", "3.5", "4.0", "3.5"],
            "review/aroma": ["4.0", "4.0", "3.5", "3.5", "4.0", "4.0"],
            "beer": ["Alpha Ale", "Beta", "Alpha Ale", "Gamma", "Beta", "Alpha Ale"],
        }
    )
    calls: list[int] = []

    def count(texts: list[str]) -> list[int]:
        calls.append(len(texts))
        return [_tok(text) for text in texts]

    model = BlockCost("m", count, 1, "vllm")
    template = parse_template("Rate {beer}: {review/appearance}, {review/aroma}")
    rq = RelQuery("map", template, t.select(template.fields), TEXT)
    objective = _objective(model, model.granularity, rq)
    assert objective is not None
    made = len(calls)  # the instructions, counted when the objective is made
    planned = order(rq.table, "ggr", objective=objective)
    # What ggr() does with the same tokenizer: values, labels and segments in its tokens.
    alone = ggr(rq.table, tokenizer=_tok, granularity=model.granularity, head=objective.head)
    assert planned == alone
    assert len(calls) == made + 1  # every value, label and segment in one call


def test_a_granularity_reaching_nothing_leaves_the_choice_to_segment_units() -> None:
    # Prompts far below OpenAI's minimum: both solves serve 0 tokens, and the
    # order is the one chosen without a granularity.
    t = Table.from_columns(
        {
            "review/appearance": ["4.0", "4.0", "3.5", "3.5", "4.0"],
            "review/aroma": ["4.0", "4.0", "3.5", "3.5", "4.0"],
            "beer": ["Alpha", "Beta", "Alpha", "Gamma", "Beta"],
        }
    )
    plain = ggr(t)
    assert ggr(t, granularity=Granularity(1024, 128)) == plain
