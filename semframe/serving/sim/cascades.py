"""Choosing a cascade by load (KEN's gear plans), and a queue simulation to check it.

KEN partitions the range of arrival rates into intervals and assigns each one
a cascade; a higher-load interval is never given a more expensive cascade than
a lower-load one, so that at high arrival rates cheap cascades keep the server
from saturating, and at low rates the most accurate cascade is affordable.

Here a cascade is a :class:`CascadeOption`: its accuracy (from calibration on
held-out rows) and its expected work per row (the share of rows reaching each
stage times the stage's service time). :func:`gear_plan` builds the
rate-interval -> cascade map; :func:`simulate_load` replays Poisson arrivals
through a FIFO server pool whose policy picks the cascade from the measured
arrival rate, and reports latency and expected accuracy. Batching effects
(KEN's invocation scheduler) are not modelled: service times are per row.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from semframe.errors import InputError


@dataclass(frozen=True)
class CascadeOption:
    """A cascade as the load policy sees it.

    Attributes
    ----------
    name : str
        Label for reports.
    accuracy : float
        Expected accuracy (held-out, from calibration).
    service_s : tuple of float
        Seconds one row takes at each stage.
    reach : tuple of float
        Share of rows reaching each stage (the first is 1.0).

    Examples
    --------
    >>> CascadeOption("small->large", 0.9, (0.1, 1.0), (1.0, 0.3)).work
    0.4
    """

    name: str
    accuracy: float
    service_s: tuple[float, ...]
    reach: tuple[float, ...]

    @property
    def work(self) -> float:
        """Expected server seconds per row."""
        return round(sum(r * s for r, s in zip(self.reach, self.service_s, strict=True)), 12)


@dataclass(frozen=True)
class GearPlan:
    """Arrival-rate intervals -> cascades: ``options[i]`` serves rates below ``bounds[i]``.

    Rates above the last bound get the last option.
    """

    bounds: tuple[float, ...]
    options: tuple[CascadeOption, ...]

    def pick(self, rate: float) -> CascadeOption:
        """The cascade for an arrival rate (rows per second)."""
        for bound, option in zip(self.bounds, self.options, strict=True):
            if rate < bound:
                return option
        return self.options[-1]


def gear_plan(
    options: Sequence[CascadeOption],
    *,
    max_rate: float,
    ranges: int = 10,
    servers: int = 1,
    utilization: float = 0.8,
) -> GearPlan:
    """KEN's rate -> cascade assignment, by a utilization rule.

    The rates ``[0, max_rate]`` are cut into ``ranges`` equal intervals. Each
    gets the most accurate option whose utilization at the interval's upper
    rate (``rate * work / servers``) stays within ``utilization``, or the
    cheapest option when none does; then, as in KEN, no interval gets a more
    expensive option than a lower-rate one.

    Examples
    --------
    >>> large = CascadeOption("large", 1.0, (1.0,), (1.0,))
    >>> casc = CascadeOption("cascade", 0.9, (0.1, 1.0), (1.0, 0.3))
    >>> small = CascadeOption("small", 0.65, (0.1,), (1.0,))
    >>> plan = gear_plan([large, casc, small], max_rate=4, ranges=8)
    >>> [plan.pick(r).name for r in (0.3, 1.5, 3.0, 9.0)]
    ['large', 'cascade', 'small', 'small']
    """
    if not options:
        msg = "gear_plan needs at least one cascade option."
        raise InputError(msg)
    if max_rate <= 0 or ranges < 1 or servers < 1 or not 0 < utilization <= 1:
        msg = (
            f"need max_rate > 0, ranges >= 1, servers >= 1 and 0 < utilization <= 1; got "
            f"{max_rate}, {ranges}, {servers}, {utilization}."
        )
        raise InputError(msg)
    cheapest = min(options, key=lambda o: o.work)
    by_accuracy = sorted(options, key=lambda o: (-o.accuracy, o.work))
    bounds: list[float] = []
    chosen: list[CascadeOption] = []
    for i in range(1, ranges + 1):
        rate = max_rate * i / ranges
        fits = [o for o in by_accuracy if rate * o.work / servers <= utilization]
        pick = fits[0] if fits else cheapest
        if chosen and pick.work > chosen[-1].work:
            pick = chosen[-1]
        bounds.append(rate)
        chosen.append(pick)
    return GearPlan(tuple(bounds), tuple(chosen))


@dataclass(frozen=True)
class LoadResult:
    """What a simulated load run gave."""

    rows: int
    mean_latency_s: float
    p95_latency_s: float
    accuracy: float
    chosen: dict[str, int]


def simulate_load(
    arrivals: Sequence[float],
    policy: Callable[[float], CascadeOption],
    *,
    servers: int = 1,
    window_s: float = 10.0,
    seed: int = 0,
) -> LoadResult:
    """Replay arrivals through ``servers`` FIFO servers; the policy picks each row's cascade.

    The policy sees the arrival rate over the last ``window_s`` seconds. A
    row's service time is the sum of the service times of the stages it
    reaches (escalation drawn with the option's reach shares); its accuracy
    counts as the option's expected accuracy.

    Examples
    --------
    >>> large = CascadeOption("large", 1.0, (1.0,), (1.0,))
    >>> r = simulate_load([0.0, 0.5, 10.0], lambda rate: large)
    >>> r.mean_latency_s, r.chosen
    (1.1666666666666667, {'large': 3})
    """
    rng = np.random.default_rng(seed)
    free_at = [0.0] * servers
    heapq.heapify(free_at)
    recent: deque[float] = deque()
    latencies, accuracies = [], []
    chosen: dict[str, int] = {}
    for t in sorted(arrivals):
        recent.append(t)
        while recent and recent[0] < t - window_s:
            recent.popleft()
        rate = len(recent) / min(window_s, max(t, 1e-9)) if t > 0 else 0.0
        option = policy(rate)
        chosen[option.name] = chosen.get(option.name, 0) + 1
        service = option.service_s[0]
        for s in range(1, len(option.service_s)):
            p = option.reach[s] / option.reach[s - 1] if option.reach[s - 1] > 0 else 0.0
            if rng.random() >= p:
                break
            service += option.service_s[s]
        start = max(t, heapq.heappop(free_at))
        heapq.heappush(free_at, start + service)
        latencies.append(start + service - t)
        accuracies.append(option.accuracy)
    if not latencies:
        return LoadResult(0, math.nan, math.nan, math.nan, {})
    return LoadResult(
        len(latencies),
        float(np.mean(latencies)),
        float(np.percentile(latencies, 95)),
        float(np.mean(accuracies)),
        chosen,
    )
