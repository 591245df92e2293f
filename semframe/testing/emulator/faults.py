"""Fault injection for the provider emulator: which request fails, and how."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Fault", "FaultKind", "FaultPlan", "FaultRule"]

FaultKind = Literal["rate_limit", "server_error", "hang", "malformed", "empty", "drop"]


@dataclass(frozen=True)
class Fault:
    """One way a request can fail.

    Attributes
    ----------
    kind : str
        ``"rate_limit"`` (429 with ``Retry-After`` and ``retry-after-ms``),
        ``"server_error"`` (``status``: 500, 502, 503 or 529, Anthropic's
        "overloaded"), ``"hang"`` (answer only after ``seconds``, to trigger
        client timeouts), ``"malformed"`` (200 with a body that is not JSON),
        ``"empty"`` (a normal answer with empty text) or ``"drop"`` (the
        connection closes half-way through the response body).
    status : int
        HTTP status for ``rate_limit`` and ``server_error``.
    retry_after : float
        Seconds sent in ``Retry-After`` / ``retry-after-ms`` (``rate_limit``).
    seconds : float
        How long a ``hang`` lasts.

    Examples
    --------
    >>> Fault.overloaded().status
    529
    """

    kind: FaultKind
    status: int = 200
    retry_after: float = 1.0
    seconds: float = 0.0

    @classmethod
    def rate_limit(cls, retry_after: float = 1.0) -> Fault:
        """A 429 with ``Retry-After: retry_after``."""
        return cls("rate_limit", 429, retry_after=retry_after)

    @classmethod
    def server_error(cls, status: int = 500) -> Fault:
        """A 5xx (500, 502, 503 or 529)."""
        if status not in (500, 502, 503, 529):
            msg = f"server_error status must be 500, 502, 503 or 529, got {status}"
            raise ValueError(msg)
        return cls("server_error", status)

    @classmethod
    def overloaded(cls) -> Fault:
        """Anthropic's 529 ``overloaded_error``."""
        return cls("server_error", 529)

    @classmethod
    def hang(cls, seconds: float) -> Fault:
        """Answer normally, but only after ``seconds``."""
        return cls("hang", seconds=seconds)

    @classmethod
    def malformed(cls) -> Fault:
        """200 with a truncated, unparseable JSON body."""
        return cls("malformed")

    @classmethod
    def empty(cls) -> Fault:
        """200 with an empty answer text."""
        return cls("empty")

    @classmethod
    def drop(cls) -> Fault:
        """Close the connection in the middle of the response body."""
        return cls("drop")


@dataclass
class FaultRule:
    """When a fault fires: the first rule that matches a request is used.

    Attributes
    ----------
    fault : Fault
        What happens.
    remaining : int or None
        Requests left to fail (None: no limit).
    probability : float
        Chance that a matching request fails (drawn from ``random.Random(seed)``).
    when : callable or None
        Predicate on the prompt text.
    provider : {"openai", "anthropic", "gemini"} or None
        Restrict to one provider's endpoints.
    fired : int
        How many requests this rule failed so far.
    """

    fault: Fault
    remaining: int | None = None
    probability: float = 1.0
    when: Callable[[str], bool] | None = None
    provider: str | None = None
    seed: int = 0
    fired: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)


class FaultPlan:
    """The emulator's fault rules; thread-safe.

    Examples
    --------
    >>> plan = FaultPlan()
    >>> _ = plan.inject(Fault.rate_limit(2.0), count=1)
    >>> plan.pick("openai", "hi").kind, plan.pick("openai", "hi")
    ('rate_limit', None)
    """

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()

    def inject(
        self,
        fault: Fault,
        *,
        count: int | None = None,
        probability: float = 1.0,
        seed: int = 0,
        when: Callable[[str], bool] | None = None,
        provider: str | None = None,
    ) -> FaultRule:
        """Add a rule; returns it (its ``fired`` counter shows how often it fired).

        Parameters
        ----------
        fault : Fault
            What to do.
        count : int, optional
            Fail only the next ``count`` matching requests.
        probability : float
            Fail each matching request with this probability (seeded).
        seed : int
            Seed of the rule's random draws.
        when : callable, optional
            Only requests whose prompt text satisfies this predicate.
        provider : {"openai", "anthropic", "gemini"}, optional
            Only this provider's endpoints.
        """
        if count is not None and count < 1:
            msg = f"count must be >= 1 (or None for no limit), got {count}"
            raise ValueError(msg)
        if not 0.0 <= probability <= 1.0:
            msg = f"probability must be in [0, 1], got {probability}"
            raise ValueError(msg)
        if provider not in (None, "openai", "anthropic", "gemini"):
            msg = f"provider must be 'openai', 'anthropic', 'gemini' or None, got {provider!r}"
            raise ValueError(msg)
        rule = FaultRule(fault, count, probability, when, provider, seed)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self._rules.clear()

    def pick(self, provider: str, prompt: str) -> Fault | None:
        """The fault for one request, or None; consumes counts and random draws."""
        with self._lock:
            for rule in self._rules:
                if rule.provider is not None and rule.provider != provider:
                    continue
                if rule.remaining is not None and rule.remaining <= 0:
                    continue
                if rule.when is not None and not rule.when(prompt):
                    continue
                if rule.probability < 1.0 and rule._rng.random() >= rule.probability:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                rule.fired += 1
                return rule.fault
        return None
