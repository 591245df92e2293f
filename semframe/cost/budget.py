"""Spending limits: ``budget=`` as dollars or tokens."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from semframe.errors import InputError

__all__ = ["Budget", "parse_budget"]


@dataclass(frozen=True)
class Budget:
    """A spending limit: dollars or tokens (input + output), never both.

    Examples
    --------
    >>> parse_budget(0.5)
    Budget(dollars=0.5)
    >>> parse_budget("50k tokens")
    Budget(tokens=50000)
    """

    dollars: float | None = None
    tokens: int | None = None

    def __repr__(self) -> str:
        if self.dollars is not None:
            return f"Budget(dollars={self.dollars:g})"
        return f"Budget(tokens={self.tokens})"

    def describe(self) -> str:
        """``"$0.50"`` or ``"50,000 tokens"``."""
        if self.dollars is not None:
            return f"${self.dollars:,.4g}"
        return f"{self.tokens:,} tokens"


_BUDGET_FORMS = (
    "a number of dollars (0.5), '$0.50', '0.50 usd', or a token count such as "
    "'50k tokens', '1.5M tokens', '20000 tokens'"
)
_BUDGET_RE = re.compile(
    r"^\s*(?P<dollar>\$)?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<mult>[kKmM])?\s*"
    r"(?P<unit>tokens?|tok|usd|dollars?)?\s*$"
)


def parse_budget(value: object) -> Budget:
    """Read a ``budget=`` value.

    Parameters
    ----------
    value : float, int, str or Budget
        Dollars as a number; or a string: ``"$0.50"``, ``"0.5 usd"``,
        ``"2 dollars"``, ``"50k tokens"``, ``"1.5M tokens"``, ``"800 tokens"``.

    Raises
    ------
    InputError
        For anything else, naming the accepted forms.

    Examples
    --------
    >>> parse_budget("$2"), parse_budget("1.5M tokens")
    (Budget(dollars=2), Budget(tokens=1500000))
    >>> parse_budget("50k")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: budget='50k' has no unit; ...
    """
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        msg = f"budget must be {_BUDGET_FORMS}; got {value!r} ({type(value).__name__})."
        raise InputError(msg)
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            msg = f"budget must be a positive, finite number of dollars; got {value!r}."
            raise InputError(msg)
        return Budget(dollars=float(value))
    m = _BUDGET_RE.match(value)
    if m is None:
        msg = f"budget={value!r} is not understood; use {_BUDGET_FORMS}."
        raise InputError(msg)
    number = float(m["num"]) * {"k": 1e3, "m": 1e6}.get((m["mult"] or "").lower(), 1.0)
    unit = (m["unit"] or "").lower()
    is_tokens = unit.startswith("tok")
    if m["dollar"] and is_tokens:
        msg = f"budget={value!r} mixes '$' and tokens; use {_BUDGET_FORMS}."
        raise InputError(msg)
    if not m["dollar"] and not unit:
        msg = f"budget={value!r} has no unit; say '${m['num']}' or '{value.strip()} tokens'."
        raise InputError(msg)
    if number <= 0:
        msg = f"budget must be positive; got {value!r}."
        raise InputError(msg)
    if is_tokens:
        return Budget(tokens=int(number))
    return Budget(dollars=number)
