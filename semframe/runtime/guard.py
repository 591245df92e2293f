"""Keeping an operator call to its ``budget=`` while it runs.

Before anything is sent, an estimate over the budget stops the call
(:func:`check_estimate`). While it runs, the executor asks the guard's hook
before each request: the spend so far, plus what the requests in flight and
the next one are projected to cost, must stay within the budget. The guard
spans every relQuery of the operator call (``agg`` levels, ``topk`` rounds).
"""

from __future__ import annotations

from typing import Any

from semframe.backends.base import Backend
from semframe.core.wire import Outcome, Usage
from semframe.cost.budget import Budget
from semframe.cost.estimate import Estimate
from semframe.errors import BudgetExceeded, plural
from semframe.runtime.execute import StopWhen
from semframe.runtime.stats import RunStats

__all__ = ["BudgetGuard", "check_estimate"]


def check_estimate(estimate: Estimate, budget: Budget) -> None:
    """Fail before anything is sent when ``estimate`` is over ``budget``.

    Raises
    ------
    BudgetExceeded
        Naming the expected spend and where to look; ``.estimate`` holds it.
    """
    if not estimate.exceeds(budget):
        return
    expected = (
        f"{estimate.tokens:,} tokens"
        if budget.tokens is not None
        else f"${estimate.dollars or 0.0:,.4f}"
    )
    msg = (
        f"the estimate of this {estimate.op} ({expected}, "
        f"{plural(estimate.requests, 'request')} on {estimate.backend}/{estimate.model}) is "
        f"over budget={budget.describe()}; nothing was sent. Raise the budget, or see "
        "`.estimate` (df.llm.estimate(...)) for where the cost comes from."
    )
    raise BudgetExceeded(msg, estimate=estimate, budget=budget, spent=0)


class BudgetGuard:
    """Spend of one operator call under a budget, over all its relQueries.

    Attributes
    ----------
    budget : Budget
        The limit.
    estimate : Estimate
        The call's estimate (its mean cost per request projects what a request
        in flight will cost before any has been answered).
    dollars, tokens : float, int
        Spent by the relQuery runs finished so far.
    stopped : BudgetExceeded or None
        How the run that reached the budget stopped.
    """

    def __init__(self, budget: Budget, estimate: Estimate) -> None:
        self.budget = budget
        self.estimate = estimate
        self.dollars = 0.0
        self.tokens = 0
        self.stopped: BudgetExceeded | None = None
        reqs = max(estimate.requests, 1)
        self.mean_dollars = (estimate.dollars or 0.0) / reqs
        self.mean_tokens = estimate.tokens / reqs

    def unsent(self) -> Outcome:
        """The outcome of a row not sent because the budget was reached."""
        return Outcome(
            None, None, "budget", f"not sent: budget {self.budget.describe()} reached", 0
        )

    def add(self, stats: RunStats) -> None:
        """Count a finished relQuery run (or other requests the call paid for, as a run)."""
        self.dollars += stats.dollars or 0.0
        self.tokens += stats.prompt_tokens + stats.output_tokens

    def hook(self, backend: Backend) -> StopWhen:
        """``stop_when`` for one relQuery: stop before the projected spend passes the budget."""
        budget = self.budget
        bill = backend.cost.bill

        def stop(spent: Usage, answered: int, in_flight: int) -> bool:
            if budget.tokens is not None:
                used = spent.prompt_tokens + spent.output_tokens
                mean = used / answered if answered else self.mean_tokens
                return self.tokens + used + mean * (in_flight + 1) > budget.tokens
            dollars = bill(spent) or 0.0
            mean = dollars / answered if answered else self.mean_dollars
            return self.dollars + dollars + mean * (in_flight + 1) > (budget.dollars or 0.0)

        return stop

    def exceeded(self, result: Any) -> BudgetExceeded:
        """The error that ends the call, carrying the answers paid for in ``result``."""
        spent: float = self.tokens if self.budget.tokens is not None else self.dollars
        shown = f"{spent:,} tokens" if self.budget.tokens is not None else f"${spent:,.4f}"
        stopped = self.stopped
        outcomes = stopped.outcomes if stopped is not None else []
        unsent = sum(1 for o in outcomes if o is None)
        msg = (
            f"budget {self.budget.describe()} reached: stopped after spending {shown}; "
            f"{plural(unsent, 'request')} of the last relQuery {'was' if unsent == 1 else 'were'} "
            "not sent. The answers paid for "
            "are in `.result` of this exception (rows not sent have no value)."
        )
        exc = BudgetExceeded(
            msg, estimate=self.estimate, budget=self.budget, spent=spent, result=result
        )
        if stopped is not None:
            exc.outcomes, exc.stats = stopped.outcomes, stopped.stats
        return exc
