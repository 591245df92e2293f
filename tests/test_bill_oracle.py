"""Hand-computed bills (``tests/oracle/bills.toml``) against the estimator and the emulator.

The estimator and the provider emulator share semframe's caching rules, chat
framing and price table, so agreeing with each other proves little. The fixture
is an independent oracle: every bill in it is worked out by hand from the
providers' published rules and prices (cited there), on token counts this module
re-checks with tiktoken, OpenAI's own tokenizer. Each scenario is then

- estimated (``df.llm.estimate``, the planned order's figures),
- run against the emulator through the official SDK (``emu.ledger``,
  ``semframe.last_run()``),

and every figure is compared with the fixture: tokens exactly, dollars to 1e-9.
Output tokens depend on the answer, so only input-side dollars are compared.

It found that semframe's OpenAI chat framing was one token short per request
(the role's own token, which OpenAI's cookbook counts); estimator and emulator
now frame as the cookbook does, and the API's own count of the cookbook's
example is reproduced (``test_emulator_counts_the_cookbook_example_as_the_api_did``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import importlib.util
import re
import struct
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pandas as pd
import pytest
import tiktoken

import semframe
from semframe.backends import reset_backends
from semframe.cost.pricing import price_for
from semframe.testing.emulator import Latency, ProviderEmulator

FIXTURE = Path(__file__).parent / "oracle" / "bills.toml"
DATA: dict[str, Any] = tomllib.loads(FIXTURE.read_text("utf-8"))
SCENARIOS: dict[str, dict[str, Any]] = {s["name"]: s for s in DATA["scenario"]}
PRICES: dict[str, dict[str, Any]] = DATA["prices"]
OPENAI_TOKENS: dict[str, Any] = DATA["token_model"]["openai"]
ANTHROPIC_TOKENS: dict[str, Any] = DATA["token_model"]["anthropic"]
GEMINI_TOKENS: dict[str, Any] = DATA["token_model"]["gemini"]
KEY = "test-key"
DOLLARS = 1e-9  # absolute tolerance on dollar figures
PER = 1_000_000

TOTALS = (
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "uncached_input_dollars",
    "cached_input_dollars",
    "cache_write_dollars",
    "input_dollars",
)
PER_REQUEST = {
    "openai": ("prompt_tokens", "cached_tokens", "uncached_input_dollars", "cached_input_dollars"),
    "anthropic": (
        "prompt_tokens",
        "cached_tokens",
        "cache_write_5m_tokens",
        "cache_write_1h_tokens",
        "uncached_input_dollars",
        "cached_input_dollars",
        "cache_write_dollars",
    ),
    "gemini": ("prompt_tokens", "cached_tokens", "uncached_input_dollars", "cached_input_dollars"),
}
LAST_RUN = ("prompt_tokens", "cached_tokens", "cache_write_tokens")


# ---------------------------------------------------------------- the fixture's text


def _text(spec: Any) -> str:
    """A fixture text spec: a string, ``{repeat, times}``, ``{word, times}`` or a list."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, list):
        return "".join(_text(s) for s in spec)
    if "repeat" in spec:
        return str(spec["repeat"]) * int(spec["times"])
    return " ".join([str(spec["word"])] * int(spec["times"]))


def _template(s: Mapping[str, Any]) -> str:
    return _text(s["template"])


def _columns(s: Mapping[str, Any]) -> dict[str, list[str]]:
    return {col: [_text(v) for v in values] for col, values in s["rows"].items()}


def _frame(s: Mapping[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(_columns(s))


def _head(s: Mapping[str, Any]) -> str:
    """The instruction block as the fixture's layout says it is sent."""
    return re.sub(r"\{(\w+)\}", r"[\1]", _template(s)).strip() + "\n\n"


def _prompts(s: Mapping[str, Any]) -> list[str]:
    """Every request's prompt, in execution order, rendered from the fixture's layout."""
    cols = _columns(s)
    head = _head(s)
    return [
        head + "".join(f"{f}: {cols[f][row]}\n" for f in s["field_order"]) for row in s["order"]
    ]


def _blocks(s: Mapping[str, Any], prompt: str) -> list[str]:
    """Anthropic content blocks: split after the instructions when there is a breakpoint."""
    if s["breakpoints"] == ["instructions"]:
        head = _head(s)
        assert prompt.startswith(head)
        return [head, prompt[len(head) :]]
    assert s["breakpoints"] == []
    return [prompt]


def _name(case: Mapping[str, Any]) -> str:
    return str(case["name"])


# ---------------------------------------------------------------- tiktoken, offline

# tiktoken downloads OpenAI's o200k_base.tiktoken on first use. Offline, the file is
# rebuilt byte for byte from the copy of its ranks shipped in quicktok-v1, checked
# against the SHA-256 tiktoken itself pins for that file, and handed to tiktoken
# through its own cache, so the encoder under test is tiktoken's, rules and all.
_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _o200k_file() -> bytes:
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("quicktok-v1 (offline copy of the o200k_base ranks) is not installed")
    data = (Path(next(iter(spec.submodule_search_locations))) / "data" / "o200k.vocab").read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    offset = 4
    ranked: list[tuple[int, bytes]] = []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        offset += 6 + length
        ranked.append((rank, token))
    ranked.sort()
    return b"".join(base64.b64encode(tok) + b" %d\n" % rank for rank, tok in ranked)


@pytest.fixture(scope="session")
def o200k(tmp_path_factory: pytest.TempPathFactory) -> tiktoken.Encoding:
    """tiktoken's own ``o200k_base`` encoding, loaded without network."""
    contents = _o200k_file()
    assert hashlib.sha256(contents).hexdigest() == _O200K_SHA256, "not OpenAI's o200k_base file"
    cache = tmp_path_factory.mktemp("tiktoken")
    (cache / hashlib.sha1(_O200K_URL.encode()).hexdigest()).write_bytes(contents)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        return tiktoken.get_encoding("o200k_base")


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------- the published rules


@dataclass(frozen=True)
class Bill:
    """One request's input-side bill."""

    prompt_tokens: int
    cached_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    uncached_input_dollars: float = 0.0
    cached_input_dollars: float = 0.0
    cache_write_dollars: float = 0.0


def _openai_bills(s: Mapping[str, Any], enc: tiktoken.Encoding) -> list[Bill]:
    """OpenAI's published rules applied to the fixture's requests, one after another.

    ``prompt_tokens`` = content + 3 per message + the role's tokens + 3 reply
    priming (cookbook). A request is served the longest prefix an earlier request
    shares with it, on the 1,024 + 128 k grid, and nothing below 1,024 tokens
    (prompt caching guide); cached tokens are billed at the cached-input price, the
    rest at the input price, and writes are free. Every pair of requests that
    shares 1,024 tokens or more has the same ``prompt_cache_key`` and first 256
    tokens in these scenarios (the fixture says why), so routing cannot split them.
    """
    price = PRICES[s["model"]]
    minimum, step = price["min_cacheable_tokens"], price["cache_step_tokens"]
    role = len(enc.encode("user"))
    assert role == OPENAI_TOKENS["role_user"]
    framing = OPENAI_TOKENS["per_message"] + role + OPENAI_TOKENS["reply_priming"]
    contents = [enc.encode(p) for p in _prompts(s)]
    bills = []
    for i, toks in enumerate(contents):
        prompt = len(toks) + framing
        shared = max((_common(toks, contents[j]) for j in range(i)), default=None)
        cached = 0
        if shared is not None and prompt >= minimum:
            reusable = min(OPENAI_TOKENS["tokens_before_content"] + shared, prompt)
            if reusable >= minimum:
                cached = minimum + (reusable - minimum) // step * step
        bills.append(
            Bill(
                prompt,
                cached,
                uncached_input_dollars=(prompt - cached) * price["input"] / PER,
                cached_input_dollars=cached * price["cached_input"] / PER,
            )
        )
    return bills


def _anthropic_bills(s: Mapping[str, Any], enc: tiktoken.Encoding) -> list[Bill]:
    """Anthropic's published rules applied to the fixture's requests, one after another.

    The prefix up to and including the ``cache_control`` block is cached when it
    reaches the model's minimum; the first request writes it (1.25x input for 5
    minutes, 2x for 1 hour), later requests with the identical prefix read it
    (0.1x); ``input_tokens`` is everything after the breakpoint. Token counts use
    the fixture's stated model: o200k counts, 3 tokens opening the message, 3
    priming the reply.
    """
    price = PRICES[s["model"]]
    ttl = s.get("cache_ttl", "5m")
    stored: set[str] = set()
    bills = []
    for prompt in _prompts(s):
        blocks = _blocks(s, prompt)
        sizes = [len(enc.encode(b)) for b in blocks]
        sizes[0] += ANTHROPIC_TOKENS["message_open"]
        total = sum(sizes) + ANTHROPIC_TOKENS["reply_priming"]
        read = write = 0
        if s["breakpoints"] and sizes[0] >= price["min_cacheable_tokens"]:
            if blocks[0] in stored:
                read = sizes[0]
            else:
                write = sizes[0]
                stored.add(blocks[0])
        w5, w1 = (write, 0) if ttl == "5m" else (0, write)
        bills.append(
            Bill(
                total,
                read,
                w5,
                w1,
                uncached_input_dollars=(total - read - write) * price["input"] / PER,
                cached_input_dollars=read * price["cache_read"] / PER,
                cache_write_dollars=(w5 * price["cache_write_5m"] + w1 * price["cache_write_1h"])
                / PER,
            )
        )
    return bills


def _gemini_bills(s: Mapping[str, Any], enc: tiktoken.Encoding) -> list[Bill]:
    """Gemini's published rules applied to the fixture's requests, one after another.

    ``prompt_token_count`` = the text's tokens + 1 (Google's own count example).
    With an explicit cache of the instructions every request gets the cache's
    tokens as ``cached_content_token_count`` (it names the cache); without,
    implicit caching serves a prefix an earlier answered request shares, from
    the model's minimum, on the fixture's stated grid (not published). Cached
    tokens cost the cached-input price, the rest the input price.
    """
    price = PRICES[s["model"]]
    minimum, step = price["min_cacheable_tokens"], GEMINI_TOKENS["implicit_grid_step"]
    contents = [enc.encode(p) for p in _prompts(s)]
    explicit = len(enc.encode(_head(s))) if s["explicit_cache"] == "instructions" else 0
    bills = []
    for i, toks in enumerate(contents):
        prompt = len(toks) + GEMINI_TOKENS["turn"]
        shared = max((_common(toks, contents[j]) for j in range(i)), default=0)
        implicit = minimum + (shared - minimum) // step * step if shared >= minimum else 0
        cached = max(explicit, implicit)
        bills.append(
            Bill(
                prompt,
                cached,
                uncached_input_dollars=(prompt - cached) * price["input"] / PER,
                cached_input_dollars=cached * price["cached_input"] / PER,
            )
        )
    return bills


def _gemini_caches(s: Mapping[str, Any], enc: tiktoken.Encoding) -> list[Bill]:
    """The explicit caches made: their tokens at the input price, stored for the TTL.

    A cache is created once (``max_concurrency`` 1, a run shorter than its TTL);
    semframe counts its tokens as input, all of them written.
    """
    if s["explicit_cache"] != "instructions":
        return []
    price = PRICES[s["model"]]
    tokens = len(enc.encode(_head(s)))
    hours = {"5m": 5 / 60, "1h": 1.0}[s["cache_ttl"]]
    per_token = price["input"] + price["cache_storage_per_hour"] * hours
    w5, w1 = (tokens, 0) if s["cache_ttl"] == "5m" else (0, tokens)
    return [Bill(tokens, 0, w5, w1, cache_write_dollars=tokens * per_token / PER)]


_EXTRA: dict[str, Callable[[Mapping[str, Any], tiktoken.Encoding], list[Bill]]] = {
    "gemini": _gemini_caches
}
"""Billed beside the requests: Gemini's explicit cache creations (``[[scenario.caches]]``)."""


def _totals(bills: Sequence[Bill]) -> dict[str, float]:
    out: dict[str, float] = {
        "prompt_tokens": sum(b.prompt_tokens for b in bills),
        "cached_tokens": sum(b.cached_tokens for b in bills),
        "cache_write_tokens": sum(b.cache_write_5m_tokens + b.cache_write_1h_tokens for b in bills),
        "uncached_input_dollars": sum(b.uncached_input_dollars for b in bills),
        "cached_input_dollars": sum(b.cached_input_dollars for b in bills),
        "cache_write_dollars": sum(b.cache_write_dollars for b in bills),
    }
    out["input_dollars"] = (
        out["uncached_input_dollars"] + out["cached_input_dollars"] + out["cache_write_dollars"]
    )
    return out


def _check(figure: str, got: Any, expected: Any) -> None:
    if figure.endswith("_dollars"):
        if isinstance(expected, list):
            assert len(got) == len(expected), (got, expected)
            for g, e in zip(got, expected, strict=True):
                assert g == pytest.approx(e, rel=0, abs=DOLLARS), (got, expected)
        else:
            assert got == pytest.approx(expected, rel=0, abs=DOLLARS)
    else:
        assert got == expected


# ---------------------------------------------------------------- the fixture itself


@pytest.mark.parametrize("scenario", DATA["scenario"], ids=_name)
def test_fixture_token_counts_are_tiktokens(
    scenario: dict[str, Any], o200k: tiktoken.Encoding
) -> None:
    """The token counts written in the fixture are what tiktoken counts."""
    prompts = _prompts(scenario)
    assert len(o200k.encode(_head(scenario))) == scenario["instruction_tokens"]
    contents = [o200k.encode(p) for p in prompts]
    assert [len(c) for c in contents] == [scenario["content_tokens"]] * len(prompts)
    # Pieces tokenize as the whole: the instruction block never merges with a field.
    for p, toks in zip(prompts, contents, strict=True):
        rest = p[len(_head(scenario)) :]
        assert len(toks) == scenario["instruction_tokens"] + len(o200k.encode(rest))
    if scenario["provider"] in ("openai", "gemini"):
        shared = [
            max(_common(contents[i], contents[j]) for j in range(i))
            for i in range(1, len(contents))
        ]
        # the shared length the arithmetic uses is the one most requests see
        assert max(shared) == scenario["shared_content_tokens"]
    else:
        for p in prompts:
            sizes = [len(o200k.encode(b)) for b in _blocks(scenario, p)]
            sizes[0] += ANTHROPIC_TOKENS["message_open"]
            assert sizes == scenario["blocks"]


@pytest.mark.parametrize("scenario", DATA["scenario"], ids=_name)
def test_fixture_arithmetic_follows_the_published_rules(
    scenario: dict[str, Any], o200k: tiktoken.Encoding
) -> None:
    """Recomputing each bill from the published rules gives the hand-written figures."""
    provider = scenario["provider"]
    rules = {"openai": _openai_bills, "anthropic": _anthropic_bills, "gemini": _gemini_bills}
    bills = rules[provider](scenario, o200k)
    extra = _EXTRA[provider](scenario, o200k) if provider in _EXTRA else []
    requests = scenario["requests"]
    caches = scenario.get("caches", [])
    assert [r["row"] for r in requests] == scenario["order"]
    for bill, written in zip(bills, requests, strict=True):
        for figure in PER_REQUEST[provider]:
            _check(figure, getattr(bill, figure), written[figure])
    for bill, written in zip(extra, caches, strict=True):
        for figure, value in written.items():
            _check(figure, getattr(bill, figure), value)
    for figure, value in _totals([*bills, *extra]).items():
        _check(figure, value, scenario["totals"][figure])
    # the totals are the sums of the requests (and of the caches made beside them)
    for figure in PER_REQUEST[provider]:
        if figure in scenario["totals"]:
            summed = sum(r[figure] for r in requests) + sum(c.get(figure, 0) for c in caches)
            _check(figure, summed, scenario["totals"][figure])


def test_published_chat_framing_reproduces_the_cookbook_count(o200k: tiktoken.Encoding) -> None:
    """The cookbook's formula, with tiktoken, gives the 124 tokens the API reported."""
    example = DATA["cookbook_example"]
    n = 0
    for message in example["messages"]:
        n += OPENAI_TOKENS["per_message"]
        for key, value in message.items():
            n += len(o200k.encode(value))
            if key == "name":
                n += 1  # tokens_per_name
    n += OPENAI_TOKENS["reply_priming"]
    assert n == example["api_prompt_tokens"] == 124


def test_published_anthropic_prices_follow_the_published_multipliers() -> None:
    for model, price in PRICES.items():
        if price["provider"] != "anthropic":
            continue
        assert price["cache_write_5m"] == pytest.approx(1.25 * price["input"]), model
        assert price["cache_write_1h"] == pytest.approx(2.0 * price["input"]), model
        assert price["cache_read"] == pytest.approx(0.1 * price["input"]), model


# ---------------------------------------------------------------- semframe's price table


def _shipped_prices() -> tuple[dict[str, Any], dict[str, Any]]:
    text = importlib.resources.files("semframe").joinpath("data/prices.toml").read_text("utf-8")
    doc = tomllib.loads(text)
    return doc.get("defaults", {}), doc["prices"]


_PRICE_FIELDS = {
    "openai": ("input", "cached_input", "output", "min_cacheable_tokens", "cache_step_tokens"),
    "anthropic": (
        "input",
        "cache_write_5m",
        "cache_write_1h",
        "cache_read",
        "output",
        "min_cacheable_tokens",
    ),
    "gemini": ("input", "cached_input", "output", "cache_storage_per_hour", "min_cacheable_tokens"),
}
_PRICE_CASES = [
    pytest.param(model, field, id=f"{model}-{field}")
    for model, price in PRICES.items()
    for field in _PRICE_FIELDS[price["provider"]]
]


@pytest.mark.parametrize(("model", "field"), _PRICE_CASES)
def test_price_table_matches_the_published_price(model: str, field: str) -> None:
    """``semframe/data/prices.toml`` holds the published figure (defaults included)."""
    defaults, table = _shipped_prices()
    assert model in table
    shipped = {**defaults.get(table[model]["provider"], {}), **table[model]}
    assert shipped["provider"] == PRICES[model]["provider"]
    assert shipped[field] == PRICES[model][field]


# ---------------------------------------------------------------- semframe's side


@dataclass(frozen=True)
class Outcome:
    """What semframe said (estimate) and billed (emulator) for one scenario."""

    estimate: Any
    entries: list[Any]
    ledger: Any
    last_run: Any


_OUTCOMES: dict[str, Outcome] = {}


def _settings(s: Mapping[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "backend": s["provider"],
        "model": s["model"],
        "reorder": s["reorder"],
        "max_concurrency": s["max_concurrency"],
        "max_tokens": s["max_tokens"],
        "cache": False,
        # the hand-computed bill has one request per prompt: an emulated answer that
        # runs to max_tokens is kept (and marked), not asked again
        "truncated": "keep",
    }
    if "cache_ttl" in s:
        settings["cache_ttl"] = s["cache_ttl"]
    return settings


def _outcome(name: str, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """Estimate and run scenario ``name`` once per test session (results are reused)."""
    found = _OUTCOMES.get(name)
    if found is not None:
        return found
    s = SCENARIOS[name]
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    df, template, settings = _frame(s), _template(s), _settings(s)
    estimate = df.llm.estimate(template, op=s["op"], **settings)
    with ProviderEmulator(latency=Latency(0)) as emu:
        urls = {"openai": emu.openai_url, "anthropic": emu.anthropic_url, "gemini": emu.gemini_url}
        getattr(df.llm, s["op"])(template, base_url=urls[s["provider"]], **settings)
        requests = [e for e in emu.ledger.entries() if e.kind == "request"]
        outcome = Outcome(estimate, requests, emu.ledger.totals(), semframe.last_run())
        reset_backends(s["provider"])  # a Gemini backend deletes its explicit caches
    _OUTCOMES[name] = outcome
    return outcome


def _estimated(figures: Any, figure: str) -> Any:
    cost = figures.cost
    return {
        "prompt_tokens": figures.input_tokens,
        "cached_tokens": figures.cached_tokens,
        "cache_write_tokens": figures.cache_write_tokens,
        "uncached_input_dollars": cost.uncached_input,
        "cached_input_dollars": cost.cached_input,
        "cache_write_dollars": cost.cache_writes,
        "input_dollars": cost.uncached_input + cost.cached_input + cost.cache_writes,
    }[figure]


def _billed_total(o: Outcome, figure: str) -> Any:
    t = o.ledger
    return {
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "cache_write_tokens": t.cache_write_tokens,
        "uncached_input_dollars": t.cost.uncached_input,
        "cached_input_dollars": t.cost.cached_input,
        "cache_write_dollars": t.cost.cache_writes,
        "input_dollars": t.cost.uncached_input + t.cost.cached_input + t.cost.cache_writes,
    }[figure]


_PER_ENTRY: dict[str, Callable[[Any], Any]] = {
    "prompt_tokens": lambda e: e.prompt_tokens,
    "cached_tokens": lambda e: e.cached_tokens,
    "cache_write_5m_tokens": lambda e: e.cache_write_5m_tokens,
    "cache_write_1h_tokens": lambda e: e.cache_write_1h_tokens,
    "uncached_input_dollars": lambda e: e.cost.uncached_input,
    "cached_input_dollars": lambda e: e.cost.cached_input,
    "cache_write_dollars": lambda e: e.cost.cache_writes,
}


def _cases(figures: Callable[[Mapping[str, Any]], Sequence[str]]) -> list[Any]:
    return [
        pytest.param(s["name"], figure, id=f"{s['name']}-{figure}")
        for s in DATA["scenario"]
        for figure in figures(s)
    ]


_ESTIMATE_CASES = _cases(lambda s: TOTALS)
_ORIGINAL_CASES = [
    pytest.param(s["name"], figure, id=f"{s['name']}-original-{figure}")
    for s in DATA["scenario"]
    if "original" in s
    for figure in TOTALS
]
_BILL_CASES = _cases(lambda s: TOTALS)
_REQUEST_CASES = _cases(lambda s: PER_REQUEST[s["provider"]])
_LAST_RUN_CASES = _cases(lambda s: LAST_RUN)


# ---------------------------------------------------------------- layout, then figures


@pytest.mark.parametrize("scenario", DATA["scenario"], ids=_name)
def test_fixture_prompts_are_what_semframe_sends(scenario: dict[str, Any]) -> None:
    """The fixture's rendered prompts, order and field order are semframe's plan."""
    df = _frame(scenario)
    plan = df.llm.plan(
        _template(scenario),
        op=scenario["op"],
        backend=scenario["provider"],
        model=scenario["model"],
        reorder=scenario["reorder"],
    )
    assert [r.row for r in plan.requests] == scenario["order"]
    assert [r.prompt for r in plan.requests] == _prompts(scenario)
    assert all(r.system is None for r in plan.requests)


@pytest.mark.parametrize(("name", "figure"), _ESTIMATE_CASES)
def test_estimator_reproduces_the_hand_computed_bill(
    name: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    est = _outcome(name, monkeypatch).estimate
    assert est.requests == len(SCENARIOS[name]["order"])
    _check(figure, _estimated(est.planned, figure), SCENARIOS[name]["totals"][figure])


@pytest.mark.parametrize("scenario", DATA["scenario"], ids=_name)
def test_estimate_flags_the_approximate_claude_counts(
    scenario: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI counts are exact (o200k is its tokenizer); Claude and Gemini counts are not."""
    est = _outcome(scenario["name"], monkeypatch).estimate
    assert est.exact_tokens is (scenario["provider"] == "openai")


@pytest.mark.parametrize(("name", "figure"), _ORIGINAL_CASES)
def test_estimate_of_the_original_order_reproduces_its_bill(
    name: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``est.original`` of a reordered call is the bill of the unreordered scenario."""
    est = _outcome(name, monkeypatch).estimate
    original = SCENARIOS[SCENARIOS[name]["original"]]
    _check(figure, _estimated(est.original, figure), original["totals"][figure])


@pytest.mark.parametrize(("name", "figure"), _BILL_CASES)
def test_emulator_bill_reproduces_the_hand_computed_bill(
    name: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    o = _outcome(name, monkeypatch)
    assert o.ledger.requests == len(SCENARIOS[name]["order"])
    assert o.ledger.failed == 0
    _check(figure, _billed_total(o, figure), SCENARIOS[name]["totals"][figure])


@pytest.mark.parametrize(("name", "figure"), _REQUEST_CASES)
def test_emulator_bills_each_request_as_computed_by_hand(
    name: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    o = _outcome(name, monkeypatch)
    expected = [r[figure] for r in SCENARIOS[name]["requests"]]
    _check(figure, [_PER_ENTRY[figure](e) for e in o.entries], expected)


@pytest.mark.parametrize(("name", "figure"), _LAST_RUN_CASES)
def test_last_run_reports_the_hand_computed_tokens(
    name: str, figure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _outcome(name, monkeypatch).last_run
    assert run is not None
    assert run.requests == len(SCENARIOS[name]["order"])
    assert run.errors == 0
    _check(figure, getattr(run, figure), SCENARIOS[name]["totals"][figure])


def test_emulator_counts_the_cookbook_example_as_the_api_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = DATA["cookbook_example"]
    with (
        ProviderEmulator(latency=Latency(0)) as emu,
        openai.OpenAI(base_url=emu.openai_url, api_key=KEY, max_retries=0) as client,
    ):
        r = client.chat.completions.create(
            model=example["model"], messages=example["messages"], max_tokens=1, temperature=0
        )
    assert r.usage is not None
    assert r.usage.prompt_tokens == example["api_prompt_tokens"]


# ---------------------------------------------------------------- GPT-5.6: breakpoints

# From GPT-5.6 OpenAI caches only at breakpoints, reads a prefix back only where a
# breakpoint of the new request ends exactly on it, and bills every cache write at
# 1.25x input (OpenAI's prompt-caching guide, quoted in semframe/data/prices.toml).
# semframe marks a breakpoint at each shared prefix of 1,024 tokens or more that at
# least 2 rows share (1.25 + 0.1 x (n - 1) < n from n = 2).
#
# The relQuery: 6 rows, one ~1,500-token rubric shared by all, and two prefix
# groups of 3 rows by movie (GGR puts the movie first and each group together).
# Every piece below is a text part of its own in the request (the parts are cut at
# the breakpoints), so each is tokenized alone; the counts are o200k_base's, checked
# with tiktoken by test_gpt56_pieces_are_the_stated_tiktokens:
#
#   H  = the instruction block "Rubric: apple x 1480\nJudge [review] of [movie].\n\n"  1,492
#   GA = "movie: Alien. space x 200\n"                                                   205
#   GB = "movie: Heat. crime x 100\n"                                                    105
#   R  = "review: <word>\n" (tense, slow, dark, long, loud, cold)                       4 each
#
# Framing (OpenAI's cookbook): 3 tokens per message + 1 for the role "user" + 3
# priming the reply = 7. Where the 4 message tokens sit is not published; semframe
# (estimator and emulator alike) puts all 4 before the content. (Were <|end|> after
# the content instead, every breakpoint prefix would be 1 token shorter: each read
# and the first write 1 token less, 5 tokens more uncached, $0.0000264 less in all.)
#
#   prompt_tokens: group A 4 + 1,492 + 205 + 4 + 3 = 1,708; group B 4 + 1,492 + 105 + 4 + 3 = 1,608
#   breakpoint 1 (end of H):  4 + 1,492 = 1,496 tokens
#   breakpoint 2 (end of G):  A 1,496 + 205 = 1,701;  B 1,496 + 105 = 1,601
#
# max_concurrency 1: each request is sent once the one before it is answered.
#
#   req  row group  writes                    reads                   uncached         output
#   1    A   lead   1,701 (nothing stored)    0                       1,708-1,701 = 7  1
#   2    A          0                         1,701 (bp 2 stored)     7                1
#   3    A          0                         1,701                   7                1
#   4    B   lead   1,601-1,496 = 105         1,496 (bp 1 only)       7                1
#   5    B          0                         1,601                   7                1
#   6    B          0                         1,601                   7                1
#   sum             1,806                     8,100                   42               6
#   prompt_tokens = 3 x 1,708 + 3 x 1,608 = 9,948 = 1,806 + 8,100 + 42
#
# (Which group goes first does not change the sums: B first writes 1,601 + 205 and
# reads 2 x 1,601 + 1,496 + 2 x 1,701, the same 1,806 and 8,100.)
#
# Dollars at gpt-5.6's prices (input 4.00, cache write 5.00, cached input 0.40,
# output 20.00 per million; max_tokens 1, so every answer is 1 token):
#
#   uncached  42 x 4.00 / 1e6    = 0.000168
#   reads     8,100 x 0.40 / 1e6 = 0.003240
#   writes    1,806 x 5.00 / 1e6 = 0.009030
#   output    6 x 20.00 / 1e6    = 0.000120
#   total                        = 0.012558   (no caching: 9,948 x 4 / 1e6 + 0.00012 = 0.039912)
#
# service_tier="flex" (the batch price, 0.5x every component): 0.000084 + 0.001620 +
# 0.004515 + 0.000060 = 0.006279.

GPT56_TEMPLATE = "Rubric:" + " apple" * 1480 + "\nJudge {review} of {movie}."
GPT56_MOVIES = {"A": "Alien." + " space" * 200, "B": "Heat." + " crime" * 100}
GPT56_FRAME = pd.DataFrame(
    {
        "movie": [GPT56_MOVIES[g] for g in "ABABAB"],
        "review": ["tense", "slow", "dark", "long", "loud", "cold"],
    }
)
GPT56_PIECES = {"H": 1492, "A": 205, "B": 105, "R": 4}
GPT56_PROMPT = {"A": 1708, "B": 1608}
# (prompt, cached, written, output) per request, by the request's group and place in it
GPT56_REQUESTS = {
    ("A", "lead"): (1708, 0, 1701, 1),
    ("B", "lead"): (1608, 0, 1601, 1),
    ("A", "second lead"): (1708, 1496, 205, 1),
    ("B", "second lead"): (1608, 1496, 105, 1),
    ("A", "follower"): (1708, 1701, 0, 1),
    ("B", "follower"): (1608, 1601, 0, 1),
}
GPT56_TOTALS = {"prompt": 9948, "cached": 8100, "written": 1806, "uncached": 42, "output": 6}
GPT56_DOLLARS = {
    None: {"uncached": 0.000168, "cached": 0.00324, "writes": 0.00903, "output": 0.00012},
    "flex": {"uncached": 0.000084, "cached": 0.00162, "writes": 0.004515, "output": 0.00006},
}
GPT56_TOTAL = {None: 0.012558, "flex": 0.006279}


def _gpt56_group(prompt: str) -> str:
    return "A" if f"movie: {GPT56_MOVIES['A']}\n" in prompt else "B"


def test_gpt56_pieces_are_the_stated_tiktokens(o200k: tiktoken.Encoding) -> None:
    """The plan sends the pieces the arithmetic counts, and tiktoken counts them so."""
    plan = GPT56_FRAME.llm.plan(GPT56_TEMPLATE, op="map", backend="openai", model="gpt-5.6")
    head = re.sub(r"\{(\w+)\}", r"[\1]", GPT56_TEMPLATE).strip() + "\n\n"
    assert len(o200k.encode(head)) == GPT56_PIECES["H"]
    groups = [_gpt56_group(r.prompt) for r in plan.requests]
    assert groups in (list("AAABBB"), list("BBBAAA"))  # two prefix groups, each together
    for r, group in zip(plan.requests, groups, strict=True):
        movie = f"movie: {GPT56_MOVIES[group]}\n"
        review = f"review: {GPT56_FRAME['review'][r.row]}\n"
        assert r.prompt == head + movie + review
        assert len(o200k.encode(movie)) == GPT56_PIECES[group]
        assert len(o200k.encode(review)) == GPT56_PIECES["R"]
        # the breakpoints semframe marks: after the rubric and after the movie
        assert r.prefix == ((len(head), 6), (len(head) + len(movie), 3))
        assert 4 + sum(GPT56_PIECES[p] for p in ("H", group, "R")) + 3 == GPT56_PROMPT[group]


def test_gpt56_hand_arithmetic_adds_up() -> None:
    # the prices the arithmetic uses are the table's (genai-prices 0.2.3, cited there)
    p = price_for("gpt-5.6")
    assert (p.input, p.cache_write_5m, p.cache_read, p.output) == (4.0, 5.0, 0.4, 20.0)
    assert p.caching == "breakpoints" and dict(p.service_tiers)["flex"] == 0.5
    t = GPT56_TOTALS
    assert 3 * GPT56_PROMPT["A"] + 3 * GPT56_PROMPT["B"] == t["prompt"]
    assert t["cached"] + t["written"] + t["uncached"] == t["prompt"]
    for tier, factor in ((None, 1.0), ("flex", 0.5)):
        d = GPT56_DOLLARS[tier]
        assert d["uncached"] == pytest.approx(t["uncached"] * 4.00 * factor / PER, abs=DOLLARS)
        assert d["cached"] == pytest.approx(t["cached"] * 0.40 * factor / PER, abs=DOLLARS)
        assert d["writes"] == pytest.approx(t["written"] * 5.00 * factor / PER, abs=DOLLARS)
        assert d["output"] == pytest.approx(t["output"] * 20.00 * factor / PER, abs=DOLLARS)
        assert sum(d.values()) == pytest.approx(GPT56_TOTAL[tier], abs=DOLLARS)


@pytest.mark.parametrize("tier", [None, "flex"], ids=["default", "flex"])
def test_gpt56_bill_estimate_and_last_run_are_the_hand_computed_bill(
    tier: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    settings: dict[str, Any] = {
        "backend": "openai",
        "model": "gpt-5.6",
        "max_concurrency": 1,
        "max_tokens": 1,
        "truncated": "keep",
        "cache": False,
        "service_tier": tier,
    }
    est = GPT56_FRAME.llm.estimate(GPT56_TEMPLATE, op="map", **settings)
    with ProviderEmulator(latency=Latency(0.02)) as emu:
        try:
            GPT56_FRAME.llm.map(GPT56_TEMPLATE, base_url=emu.openai_url, **settings)
        finally:
            reset_backends("openai")
        entries = [e for e in emu.ledger.entries() if e.kind == "request"]
        billed = emu.ledger.totals()
    run = semframe.last_run()
    dollars, total = GPT56_DOLLARS[tier], GPT56_TOTAL[tier]

    # the emulator, request by request
    plan = GPT56_FRAME.llm.plan(GPT56_TEMPLATE, op="map", backend="openai", model="gpt-5.6")
    groups = [_gpt56_group(r.prompt) for r in plan.requests]
    places = ["lead", "follower", "follower", "second lead", "follower", "follower"]
    expected = [GPT56_REQUESTS[g, p] for g, p in zip(groups, places, strict=True)]
    assert [
        (e.prompt_tokens, e.cached_tokens, e.cache_write_5m_tokens, e.output_tokens)
        for e in entries
    ] == expected
    # the emulator's bill
    assert billed.requests == 6 and billed.failed == 0
    assert (billed.prompt_tokens, billed.cached_tokens, billed.cache_write_tokens) == (
        GPT56_TOTALS["prompt"],
        GPT56_TOTALS["cached"],
        GPT56_TOTALS["written"],
    )
    assert billed.output_tokens == GPT56_TOTALS["output"]
    for got, want in (
        (billed.cost.uncached_input, dollars["uncached"]),
        (billed.cost.cached_input, dollars["cached"]),
        (billed.cost.cache_writes, dollars["writes"]),
        (billed.cost.output, dollars["output"]),
        (billed.dollars, total),
    ):
        assert got == pytest.approx(want, rel=0, abs=DOLLARS)
    # semframe.last_run()
    assert run is not None and run.requests == 6 and run.errors == 0
    assert (run.prompt_tokens, run.cached_tokens, run.cache_write_tokens, run.output_tokens) == (
        GPT56_TOTALS["prompt"],
        GPT56_TOTALS["cached"],
        GPT56_TOTALS["written"],
        GPT56_TOTALS["output"],
    )
    assert run.dollars == pytest.approx(total, rel=0, abs=DOLLARS)
    # the estimate, at its point figure (the range holds it)
    p = est.planned
    assert (p.input_tokens, p.cached_tokens, p.cache_write_tokens, p.output_tokens) == (
        GPT56_TOTALS["prompt"],
        GPT56_TOTALS["cached"],
        GPT56_TOTALS["written"],
        GPT56_TOTALS["output"],
    )
    for got, want in (
        (p.cost.uncached_input, dollars["uncached"]),
        (p.cost.cached_input, dollars["cached"]),
        (p.cost.cache_writes, dollars["writes"]),
        (p.cost.output, dollars["output"]),
        (est.dollars, total),
    ):
        assert got == pytest.approx(want, rel=0, abs=DOLLARS)
    assert p.span is not None and p.span.dollars is not None
    lo, hi = p.span.dollars
    assert lo - DOLLARS <= total <= hi + DOLLARS
