"""Answers paid for and lost on the way back are counted, and a budget holds through them.

The provider emulator bills a request before its answer leaves; a ``drop``
fault then closes the connection half-way through the body, a ``malformed``
one sends a truncated body. No usage reaches the client for either, so
semframe charges the request itself (its prompt tokens, and the longest answer
of the run as output: an estimate on the high side) and says so
(``RunStats.unconfirmed``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pandas as pd
import pytest

import semframe
from semframe.errors import BudgetExceeded
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

TEMPLATE = "Summarize the review {review} in one sentence."


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with ProviderEmulator(latency=Latency(0)) as server:
        yield server


def _reviews(n: int) -> pd.DataFrame:
    words = " ".join(f"word{i}" for i in range(60))
    return pd.DataFrame({"review": [f"review {i}: {words}" for i in range(n)]})


@pytest.mark.parametrize("fault", [Fault.drop(), Fault.malformed()], ids=["drop", "malformed"])
def test_lost_answers_are_charged_and_reported(emu: ProviderEmulator, fault: Fault) -> None:
    emu.faults.inject(fault, probability=0.3, seed=3)
    _reviews(40).llm.map(
        TEMPLATE, backend="openai", base_url=emu.openai_url, max_retries=8, cache=False
    )
    stats = semframe.last_run()
    assert stats is not None
    bill = emu.ledger.totals()
    lost = sum(1 for e in emu.ledger.entries() if e.fault == fault.kind)
    assert lost > 0
    assert stats.unconfirmed == lost  # every lost answer is counted, and said to be
    assert stats.unconfirmed_tokens > 0
    assert stats.unconfirmed_dollars is not None and stats.unconfirmed_dollars > 0
    assert stats.dollars is not None
    # Not less than the provider billed (the charge errs on the high side) ...
    assert stats.dollars >= bill.dollars
    # ... and the reported part is exactly what the answers that arrived reported.
    assert stats.dollars - stats.unconfirmed_dollars < bill.dollars
    assert re.search(r"\d answers? lost after being sent", repr(stats))


def test_a_budget_holds_when_answers_are_lost(emu: ProviderEmulator) -> None:
    df = _reviews(60)
    settings = {"backend": "openai", "base_url": emu.openai_url, "cache": False}
    # max_tokens near the answers' length, so the estimate is close to the bill
    # of a clean run: a budget 10% above it lets the run start, and the dropped
    # answers sent again cost more than that margin. The run must stop, retries
    # included, before the provider's bill passes the budget.
    full = df.llm.estimate(TEMPLATE, max_tokens=40, **settings).dollars
    assert full is not None
    budget = full * 1.1
    emu.faults.inject(Fault.drop(), probability=0.3, seed=5)
    with pytest.raises(BudgetExceeded) as info:
        df.llm.map(TEMPLATE, budget=budget, max_tokens=40, max_retries=8, **settings)
    assert info.value.spent > 0, "it ran, and stopped while running"
    billed = emu.ledger.totals().dollars
    assert billed <= budget
    assert info.value.spent >= billed, "what it says it spent covers the bill"
