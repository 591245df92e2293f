"""The cost estimator against the provider emulator's bill, budgets, and options."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import polars as pl
import pytest

import semframe
from semframe.backends import BACKENDS, register_backend
from semframe.backends.base import Usage
from semframe.backends.fake import FakeBackend
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.cost.cachesim import OpenAIRules
from semframe.cost.calibration import load_calibration
from semframe.cost.estimate import Estimate
from semframe.cost.models import (
    LatencyModel,
    RunShape,
    SlotCost,
    counting_encoder,
    openai_cost,
)
from semframe.cost.simulate import Pieces
from semframe.errors import BudgetExceeded, ConfigError, InputError
from semframe.operators.common import compile_call
from semframe.runtime.calibrate import calibrate_local
from semframe.runtime.execute import execute
from semframe.testing.emulator import Latency, ProviderEmulator

KEY = "sk-test-abcdefghijklmnop0123"
RUBRIC = " ".join(f"Rule {i}: weigh the evidence with care." for i in range(160))  # ~1,300 tok
TEMPLATE = RUBRIC + " Is the review {review} of {movie} ({info}) positive?"
# A Claude-priced test model that caches from 1,024 tokens (haiku-4-5 needs 4,096).
PRICES = {
    "claude-test": {
        "provider": "anthropic",
        "input": 1.0,
        "cache_write_5m": 1.25,
        "cache_read": 0.1,
        "output": 5.0,
        "min_cacheable_tokens": 1024,
    }
}
LATENCY = 0.25  # seconds per emulated request: timing, hence caching, is deterministic


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with ProviderEmulator(latency=Latency(LATENCY), prices=PRICES) as server:
        yield server


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    backend = FakeBackend(max_concurrency=2)
    previous = BACKENDS["fake"]
    register_backend("fake", lambda model, settings: backend)
    yield backend
    register_backend("fake", previous)


def _reviews(n_movies: int = 4, per_movie: int = 5) -> pd.DataFrame:
    rows = [
        {"movie": f"movie {m}", "info": f"plot of movie {m} " * 20, "review": f"review {m}.{i}"}
        for i in range(per_movie)
        for m in range(n_movies)
    ]
    return pd.DataFrame(rows)  # movies interleaved: the file order shares little


def _url(emu: ProviderEmulator, backend: str) -> str:
    return emu.openai_url if backend == "openai" else emu.anthropic_url


@pytest.mark.parametrize(
    ("backend", "model"), [("openai", "gpt-4.1-mini"), ("anthropic", "claude-test")]
)
@pytest.mark.parametrize("reorder", ["ggr", "none"])
def test_estimate_matches_the_emulator_bill(
    emu: ProviderEmulator, backend: str, model: str, reorder: str
) -> None:
    df = _reviews()
    settings: dict[str, Any] = {
        "backend": backend,
        "model": model,
        "base_url": _url(emu, backend),
        "reorder": reorder,
        "prices": PRICES,
        "progress": "off",
    }
    call = compile_call(df, TEMPLATE, op="filter", **settings)
    from semframe.runtime.estimate import estimate_plan

    est = estimate_plan(call.plan, call.settings, latency=LatencyModel(LATENCY, 0.0))
    emu.reset()
    df.llm.filter(TEMPLATE, **settings)
    bill = emu.ledger.totals()
    p = est.planned
    assert p.requests == bill.requests == len(df)
    assert p.input_tokens == bill.prompt_tokens  # same tokenizer, same framing
    assert p.cached_tokens == pytest.approx(bill.cached_tokens, rel=0.03)
    assert p.cache_write_tokens == pytest.approx(bill.cache_write_tokens, rel=0.03, abs=200)
    assert p.cost is not None
    input_dollars = p.cost.total - p.cost.output
    billed_input = bill.cost.total - bill.cost.output
    assert input_dollars == pytest.approx(billed_input, rel=0.03)
    # max_tokens bounds the output
    assert p.output_tokens_max >= bill.output_tokens
    if reorder == "ggr":
        assert est.original.cached_tokens < p.cached_tokens
        assert est.savings is not None
        assert est.savings > 0


def test_warm_start_writes_the_shared_head_once(emu: ProviderEmulator) -> None:
    """20 rows of 10 movies on Anthropic: the head is written once, not per first-wave request.

    Sent at once, each group's leader writes the ~1,650-token head; sent after
    one request, it is written once and read by every other (the groups' own
    fields are still written once per group). The estimate sees it.
    """
    df = _reviews(n_movies=10, per_movie=2)
    base: dict[str, Any] = {
        "backend": "anthropic",
        "model": "claude-test",
        "base_url": emu.anthropic_url,
        "progress": "off",
        "cache": False,
    }
    no_breakpoints = {"claude-test": {**PRICES["claude-test"], "min_cacheable_tokens": 10**9}}
    bills = {}
    for name, extra in {
        "warm": {"prices": PRICES},
        "at once": {"prices": PRICES, "warm_start": False},
        "no directives": {"prices": no_breakpoints},
    }.items():
        emu.reset()
        est = df.llm.filter(TEMPLATE, estimate=True, **base, **extra)
        df.llm.filter(TEMPLATE, **base, **extra)
        bill = emu.ledger.totals()
        assert est.planned.cost is not None
        billed_input = bill.cost.total - bill.cost.output
        assert est.planned.cost.total - est.planned.cost.output == pytest.approx(
            billed_input, rel=0.03
        )
        writers = [e for e in emu.ledger.entries() if e.cache_write_tokens]
        bills[name] = (billed_input, writers)
    warm, warm_writers = bills["warm"]
    at_once, at_once_writers = bills["at once"]
    assert warm < at_once / 3
    assert warm < bills["no directives"][0] / 5
    head = min(e.cache_write_tokens for e in at_once_writers)  # each first-wave leader's
    assert len(at_once_writers) == 10  # one per group: every leader wrote the head
    assert sum(e.cache_write_tokens >= head for e in warm_writers) == 1
    assert bills["no directives"][1] == []


def test_probe_measures_output_and_is_priced(emu: ProviderEmulator) -> None:
    df = _reviews()
    est = df.llm.estimate(
        TEMPLATE, op="filter", backend="openai", base_url=emu.openai_url, probe=6, progress="off"
    )
    assert isinstance(est, Estimate)
    assert est.output_source == "probe of 6 rows"
    assert emu.ledger.totals().requests == 6
    assert est.probe_cost == pytest.approx(emu.ledger.totals().dollars, rel=1e-9)
    assert est.planned.output_tokens < est.planned.output_tokens_max
    emu.reset()
    df.llm.filter(TEMPLATE, backend="openai", base_url=emu.openai_url, progress="off")
    assert est.planned.output_tokens == pytest.approx(emu.ledger.totals().output_tokens, rel=0.2)


def test_budget_over_the_estimate_sends_nothing(emu: ProviderEmulator) -> None:
    df = _reviews()
    with pytest.raises(BudgetExceeded, match="nothing was sent") as info:
        df.llm.map(TEMPLATE, backend="openai", base_url=emu.openai_url, budget=0.0001)
    assert len(emu.ledger) == 0
    assert isinstance(info.value.estimate, Estimate)
    assert info.value.estimate.dollars is not None
    assert info.value.estimate.dollars > 0.0001
    assert info.value.result is None
    with pytest.raises(BudgetExceeded):
        df.llm.filter(TEMPLATE, backend="anthropic", model="claude-test", prices=PRICES,
                      base_url=emu.anthropic_url, budget="1k tokens")  # fmt: skip
    assert len(emu.ledger) == 0


def test_budget_stops_the_run_and_keeps_what_was_paid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    # The provider's cache forgets at once, so the run costs more than the estimate
    # (which expects cache hits): the budget passes before the run, not during it.
    rules = OpenAIRules(ttl_s=1e-9)
    with ProviderEmulator(latency=Latency(0.05), openai_rules=rules) as emu:
        df = _reviews()
        kwargs: dict[str, Any] = {"backend": "openai", "base_url": emu.openai_url}
        est = df.llm.estimate(TEMPLATE, op="map", max_tokens=16, **kwargs)
        uncached = est.planned.input_tokens * 0.4e-6 + est.planned.output_tokens_max * 1.6e-6
        assert est.dollars is not None
        assert est.dollars < uncached
        budget = (est.dollars + uncached) / 2
        with pytest.raises(BudgetExceeded, match="reached") as info:
            df.llm.map(TEMPLATE, max_tokens=16, budget=budget, max_concurrency=2, **kwargs)
        bill = emu.ledger.totals()
    exc = info.value
    assert 0 < bill.requests < len(df)
    result = exc.result
    assert isinstance(result, pd.DataFrame)
    assert list(result.index) == list(df.index)
    answered = result["llm_output"].notna().sum()
    assert answered == bill.requests  # every paid answer is kept
    assert exc.spent == pytest.approx(bill.dollars, rel=1e-6)
    assert bill.dollars <= budget * 1.1


def test_budget_with_errors_keep_marks_unsent_rows(fake: FakeBackend) -> None:
    df = pd.DataFrame({"t": [f"row {i}" for i in range(12)]})
    # fake prompt tokens: len/4 per request; the estimate is exact enough here
    est = df.llm.estimate("Echo {t}", backend="fake", max_tokens=4)
    assert est.tokens > 0
    tokens_per_row = est.tokens // 12
    limit = f"{tokens_per_row * 5} tokens"
    # the estimate (all 12 rows) is over: nothing is sent
    with pytest.raises(BudgetExceeded, match="nothing was sent"):
        df.llm.map("Echo {t}", backend="fake", max_tokens=4, budget=limit)
    assert fake.history == []


@pytest.mark.parametrize("flag", ["estimate", "dry_run"])
def test_every_operator_accepts_estimate_dry_run_and_budget(fake: FakeBackend, flag: str) -> None:
    df = pd.DataFrame({"movie": ["Up", "Up", "Heat", "Alien"], "review": ["a", "b", "c", "d"]})
    other = pd.DataFrame({"genre": ["drama", "horror"]})
    calls: dict[str, Any] = {
        "map": lambda **kw: df.llm.map("Say {review}", **kw),
        "filter": lambda **kw: df.llm.filter("Is {review} good?", **kw),
        "extract": lambda **kw: df.llm.extract("From {review}", {"year": int}, **kw),
        "classify": lambda **kw: df.llm.classify("Tone of {review}", ["up", "down"], **kw),
        "agg": lambda **kw: df.llm.agg("Summarize {review}", by="movie", **kw),
        "topk": lambda **kw: df.llm.topk("Best {review}", 2, **kw),
        "join": lambda **kw: df.llm.join(other, "Is {movie} a {genre}?", **kw),
    }
    for op, call in calls.items():
        est = call(backend="fake", **{flag: True})
        assert isinstance(est, Estimate), op
        assert est.op == op
        assert est.requests > 0
        with pytest.raises(BudgetExceeded) as info:
            call(backend="fake", budget="1 tokens")
        assert info.value.estimate is not None
    assert fake.history == []  # nothing was ever sent
    # and on Polars
    est = pl.from_pandas(df).llm.filter("Is {review} good?", backend="fake", dry_run=True)
    assert isinstance(est, Estimate)


def test_accessor_estimate_for_every_op(fake: FakeBackend) -> None:
    df = pd.DataFrame({"review": ["a", "b", "c"]})
    extra: dict[str, dict[str, Any]] = {
        "extract": {"schema": {"year": int}},
        "classify": {"labels": ["x", "y"]},
        "topk": {"k": 1},
        "join": {"other": pd.DataFrame({"g": ["x"]})},
    }
    for op in ("map", "filter", "extract", "classify", "agg", "topk", "join"):
        template = "Is {review} a {g}?" if op == "join" else "About {review}"
        est = df.llm.estimate(template, op=op, backend="fake", **extra.get(op, {}))
        assert isinstance(est, Estimate)
        assert est.op == op
    with pytest.raises(InputError, match="Valid ops"):
        df.llm.estimate("About {review}", op="mapp", backend="fake")
    assert fake.history == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("50k", "no unit"),
        ("fifty dollars", "not understood"),
        ("$5 tokens", "mixes"),
        (-1.0, "positive"),
        (0, "positive"),
        (float("nan"), "finite"),
        (True, "got True"),
        ([5], "got \\[5\\]"),
        ("0 tokens", "positive"),
    ],
)
def test_bad_budgets_fail_clearly(fake: FakeBackend, value: object, message: str) -> None:
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(InputError, match=message):
        df.llm.map("Echo {t}", backend="fake", budget=value)
    assert fake.history == []


@pytest.mark.parametrize(
    ("value", "dollars", "tokens"),
    [
        (0.5, 0.5, None),
        ("$0.50", 0.5, None),
        ("2 usd", 2.0, None),
        ("1.5 dollars", 1.5, None),
        ("50k tokens", None, 50_000),
        ("1.5M tokens", None, 1_500_000),
        ("800 tok", None, 800),
    ],
)
def test_budget_forms(value: object, dollars: float | None, tokens: int | None) -> None:
    from semframe.cost.budget import parse_budget

    b = parse_budget(value)
    assert (b.dollars, b.tokens) == (dollars, tokens)


def test_bad_estimate_options_fail_clearly(fake: FakeBackend) -> None:
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(InputError, match="dry_run must be True or False"):
        df.llm.map("Echo {t}", backend="fake", dry_run="yes")
    with pytest.raises(InputError, match="probe must be"):
        df.llm.map("Echo {t}", backend="fake", estimate=True, probe=-2)


def test_unknown_model_names_known_ones_and_how_to_add_a_price() -> None:
    df = pd.DataFrame({"t": ["a"]})
    with pytest.raises(ConfigError, match=r"known models: .*gpt-4\.1-mini.*prices"):
        df.llm.estimate("Echo {t}", backend="openai", model="gpt-nope")
    est = df.llm.estimate(
        "Echo {t}",
        backend="openai",
        model="gpt-nope",
        prices={"gpt-nope": {"provider": "openai", "input": 1.0, "output": 2.0}},
    )
    assert est.price is not None
    assert est.price.model == "gpt-nope"


def test_estimate_is_readable_and_flags_claude_counts() -> None:
    df = _reviews(2, 2)
    est = df.llm.estimate(TEMPLATE, op="filter", backend="anthropic", model="claude-haiku-4-5")
    assert not est.exact_tokens
    text = repr(est)
    assert "planned (ggr)" in text
    assert "original order" in text
    assert "(approx.)" in text
    assert "Anthropic publishes no tokenizer" in text
    html = est._repr_html_()
    assert "<table>" in html
    assert "original order" in html
    gpt = df.llm.estimate(TEMPLATE, op="filter", backend="openai", model="gpt-4.1-mini")
    assert gpt.exact_tokens


def test_batch_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    df = _reviews()
    live = df.llm.estimate(TEMPLATE, op="filter", backend="openai")
    batch = df.llm.estimate(TEMPLATE, op="filter", backend="openai", batch=True)
    assert batch.batch
    assert not live.batch
    assert batch.dollars is not None
    assert live.dollars is not None
    assert batch.dollars < live.dollars
    assert "batch" in repr(batch)


def test_fallback_breakpoints_match_the_backend(emu: ProviderEmulator) -> None:
    """Without an API key the estimator places Anthropic breakpoints as the backend does."""
    from semframe.backends import get_backend
    from semframe.backends.anthropic import cost_model

    df = _reviews()
    call = compile_call(df, TEMPLATE, op="filter", backend="anthropic", model="claude-test",
                        prices=PRICES, base_url=emu.anthropic_url)  # fmt: skip
    backend = get_backend("anthropic", model="claude-test", settings=call.settings)
    # the cost model the estimator builds without a key (no client), as the registry does
    keyless = cost_model("claude-test", call.settings)
    emu_dir = __import__("pathlib").Path(".")
    assert emu_dir.exists()
    cuts = keyless.breakpoints
    placed = [backend.breakpoints(r) for r in call.plan.requests]  # type: ignore[attr-defined]
    assert any(placed)
    assert [cuts(r) for r in call.plan.requests] == placed


def test_openai_estimate_simulates_the_body_the_backend_sends(emu: ProviderEmulator) -> None:
    from semframe.backends import get_backend
    from semframe.backends.openai import OpenAIBackend

    call = compile_call(_reviews(), TEMPLATE, op="filter", backend="openai",
                        base_url=emu.openai_url)  # fmt: skip
    backend = get_backend("openai", model=None, settings=call.settings)
    for r in call.plan.requests:
        body = backend.body(r)  # type: ignore[attr-defined]
        assert body["messages"] == r.messages()
        assert body["prompt_cache_key"] == OpenAIBackend.routing_key(r)


def test_execute_stop_hook_keeps_in_flight_answers(fake: FakeBackend) -> None:
    call = compile_call(pd.DataFrame({"t": [f"r{i}" for i in range(10)]}), "Echo {t}",
                        op="map", backend="fake")  # fmt: skip
    seen: list[tuple[int, int]] = []

    def stop(spent: Usage, answered: int, in_flight: int) -> bool:
        seen.append((answered, in_flight))
        return answered >= 3

    with pytest.raises(BudgetExceeded) as info:
        execute(call.plan, fake, stop_when=stop, progress="off")
    outcomes = info.value.outcomes
    sent = [o for o in outcomes if o is not None]
    assert 3 <= len(sent) < 10
    assert len(sent) == len(fake.history)
    assert all(o.ok for o in sent)
    assert info.value.stats is not None
    assert info.value.stats.requests == len(sent)
    assert seen[0] == (0, 0)


def test_local_calibration_is_stored_and_reused(fake: FakeBackend, tmp_path: Any) -> None:
    cal = calibrate_local(fake, tmp_path, rounds=1)
    assert min(cal.seconds_per_prompt_token, cal.seconds_per_output_token) >= 0
    assert cal.slots == fake.capabilities.max_concurrency
    again = load_calibration(tmp_path, fake.model, cal.slots)
    assert again == cal
    assert load_calibration(tmp_path, "other-model", cal.slots) is None


def test_fake_estimate_counts_slot_prefix_reuse(fake: FakeBackend) -> None:
    df = _reviews()
    est = df.llm.estimate("Is {review} of {movie} ({info}) good?", op="filter", backend="fake")
    assert est.planned.cached_tokens > est.original.cached_tokens
    assert est.planned.wall_seconds is None  # no time model for the fake
    assert est.dollars is None
    assert semframe.Estimate is Estimate


def _restated_plan(restate: bool = True) -> Plan:
    table = Table.from_columns(
        {
            "movie": ["Alien", "Alien", "Alien", "Heat"],
            "review": ["tense and cold", "a classic", "too slow", "long"],
        }
    )
    template = parse_template("Does {review} like {movie}?")
    rq = RelQuery("map", template, table, TEXT, system="Be brief.", restate=restate)
    return make_plan(rq, Ordering.identity(4, ("movie", "review")), "none")


def test_pieces_know_the_restated_question_after_the_fields() -> None:
    """A restated question (``RelQuery.restate``, the local engine's default) is a piece.

    Before, the prompts did not match the planner's layout and each whole
    prompt became one piece: a slot-cache estimate found nothing cached.
    """
    plan = _restated_plan()
    pieces = Pieces(plan, counting_encoder(lambda texts: [len(t) for t in texts]))
    assert pieces.layout
    for i, request in enumerate(plan.requests):
        assert "".join(pieces.parts(i)) == request.prompt
        # one piece with the last field, so "\n" + "\n" is tokenized as the prompt has it
        assert pieces.parts(i)[-1].startswith("review: ")
        assert "\n\nDoes " in pieces.parts(i)[-1] and pieces.parts(i)[-1].endswith("?\n")
    assert pieces.counts() == [len(r.prompt) for r in plan.requests]


def test_restated_prompts_count_as_many_tokens_as_the_whole_prompt() -> None:
    plan = _restated_plan()
    tokenizer = openai_cost("gpt-4.1-mini", None, concurrency=8).tokenizer()
    pieces = Pieces(plan, tokenizer.encode)
    whole = [len(t) for t in tokenizer.encode([r.prompt for r in plan.requests])]
    assert pieces.counts() == whole
    assert [sum(pieces.count(p) for p in pieces.parts(i)) for i in range(4)] == whole


def test_a_slot_reuses_the_template_head_and_the_start_pieces_share() -> None:
    plan = _restated_plan()
    chars = SlotCost("m", lambda texts: [len(t) for t in texts], 1, engine="test")
    framed = SlotCost(
        "m", lambda texts: [len(t) for t in texts], 1, engine="test", framing=lambda s: (20, 5)
    )
    shape = RunShape(workers=1, batch=False, out_mean=1.0, cache_dir=Path("."))
    pieces = Pieces(plan, chars.tokenizer().encode)
    plain = chars.simulate(plan, pieces, shape)
    with_frame = framed.simulate(plan, pieces, shape)
    assert with_frame.input_tokens == plain.input_tokens + 4 * 25
    assert with_frame.cached == plain.cached + 3 * 20  # every prompt after the first
    # Each of the 3 prompts after the first shares the instructions; the two Alien
    # followers also share "movie: Alien\n", and all three a field label's start
    # ("review: ") and the restated question's words up to the review.
    head = len(plan.instructions + "\n\n")
    movie = len("movie: Alien\n")
    assert plain.cached > 3 * head + 2 * movie


@pytest.mark.parametrize("restate", [False, True])
def test_pieces_without_ids_count_as_pieces_with_them(restate: bool) -> None:
    """Counts kept alone (no cache can be reached) are the counts of the ids."""
    plan = _restated_plan(restate)
    tokenizer = openai_cost("gpt-4.1-mini", None, concurrency=8).tokenizer()
    with_ids = Pieces(plan, tokenizer.encode)
    counted = Pieces(plan, tokenizer.encode, ids=False)
    assert counted.counts() == with_ids.counts()
    assert counted.count("Be brief.") == with_ids.count("Be brief.")
    assert counted.cache == {}  # no token ids kept
    with pytest.raises(RuntimeError, match="counts only"):
        counted.tokens("Be brief.")


def test_an_estimate_that_cannot_reach_the_cache_is_the_same_without_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Short prompts (below OpenAI's 1,024 tokens) are priced alike with or without ids."""
    import semframe.cost.estimate as estimate_module

    df = pd.DataFrame({"movie": ["Alien", "Heat"] * 20, "review": [f"r {i}" for i in range(40)]})
    kwargs: dict[str, Any] = {"op": "map", "backend": "openai", "model": "gpt-4.1-mini"}
    seen: list[bool] = []
    never = estimate_module._never_cached

    def spy(*args: Any) -> bool:
        seen.append(never(*args))
        return seen[-1]

    monkeypatch.setattr(estimate_module, "_never_cached", spy)
    fast = df.llm.estimate("Summarize {review} of {movie}", **kwargs)
    assert seen == [True]  # counts only
    monkeypatch.setattr(estimate_module, "_never_cached", lambda *args: False)
    slow = df.llm.estimate("Summarize {review} of {movie}", **kwargs)
    assert (fast.planned, fast.original) == (slow.planned, slow.original)
    assert fast.dollars == slow.dollars


def _reviews_plan(rows: int) -> Plan:
    words = ["a", "great", "slow", "film", "with", "cold", "dark", "plot", "and", "warm"]
    table = Table.from_columns(
        {
            "movie": [f"movie {i % 7}" for i in range(rows)],
            "review": [
                " ".join(words[(i * k) % len(words)] for k in range(3 + i % 17)) + f" #{i}"
                for i in range(rows)
            ],
        }
    )
    rq = RelQuery("map", parse_template("Summarize {review} of {movie}"), table, TEXT)
    return make_plan(rq, Ordering.identity(rows, ("movie", "review")), "none")


def test_sampled_counts_scale_the_unsampled_values_by_their_bytes() -> None:
    """A field with more distinct values than ``sample``: ``sample`` counted, the rest scaled."""
    plan = _reviews_plan(2000)
    tokenizer = openai_cost("gpt-4.1-mini", None, concurrency=8).tokenizer()
    exact = Pieces(plan, tokenizer.encode, ids=False)
    sampled = Pieces(plan, tokenizer.encode, ids=False, sample=300)
    assert exact.sampled == {}
    assert sampled.sampled == {"review": (300, 2000)}  # "movie" has 7 values: all counted
    assert list(sampled.value_counts["movie"]) == list(exact.value_counts["movie"])
    same = sampled.value_counts["review"] == exact.value_counts["review"]
    assert same.sum() >= 300  # the drawn values are counted exactly
    total, approx = sum(exact.counts()), sum(sampled.counts())
    assert abs(approx - total) / total < 0.02
    again = Pieces(plan, tokenizer.encode, ids=False, sample=300)
    assert again.counts() == sampled.counts()  # a fixed draw
    assert Pieces(plan, tokenizer.encode, sample=300).sampled == {}  # with ids: all counted


def test_an_estimate_says_when_it_sampled_token_counts() -> None:
    df = pd.DataFrame({"review": [f"review number {i} of a film" for i in range(400)]})
    kwargs: dict[str, Any] = {"op": "map", "backend": "openai", "model": "gpt-4.1-mini"}
    exact = df.llm.estimate("Summarize {review}", token_sample=0, **kwargs)
    sampled = df.llm.estimate("Summarize {review}", token_sample=100, **kwargs)
    assert exact.exact_tokens and not sampled.exact_tokens
    assert any("100 of its 400 distinct values tokenized" in note for note in sampled.notes)
    assert not any("tokenized, the others" in note for note in exact.notes)
    assert sampled.dollars is not None and exact.dollars is not None
    assert abs(sampled.dollars - exact.dollars) / exact.dollars < 0.03
