"""The pure statistics of a cascade: metrics, bounds, and the choice of thresholds.

Everything here works on answers and confidences already collected
(:func:`metric_counts`, :func:`clopper_pearson_lower`, :func:`evaluate`,
:func:`choose_thresholds`, :func:`calibrate_profiles`); no model is called.
The :class:`~semframe.operators.cascade.stages.Calibration` record it returns is
defined with the plan that carries it, in :mod:`semframe.operators.cascade.stages`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol, cast

from semframe.errors import InputError
from semframe.operators.cascade.stages import Calibration, Metric, route


def same_answer_key(value: object) -> object:
    """An answer as compared: lists as tuples, mappings as sorted pairs (hashable).

    Two answers are the same answer when their keys are equal (for metrics
    and for the agreement of samples alike).

    Examples
    --------
    >>> same_answer_key({"b": [1, 2], "a": "x"})
    (('a', 'x'), ('b', (1, 2)))
    """
    if isinstance(value, list | tuple):
        return tuple(same_answer_key(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), same_answer_key(v)) for k, v in value.items()))
    return value


def metric_counts(
    predictions: Sequence[object],
    labels: Sequence[object],
    metric: Metric = "accuracy",
    positive: object = True,
) -> tuple[int, int]:
    """``(successes, trials)`` of a metric: the binomial the bound is taken on.

    Accuracy: correct answers of all rows. Precision: true positives of the
    rows answered ``positive``. Recall: true positives of the rows labeled
    ``positive``.

    Examples
    --------
    >>> p, y = [True, True, False, False], [True, False, False, True]
    >>> metric_counts(p, y), metric_counts(p, y, "precision"), metric_counts(p, y, "recall")
    ((2, 4), (1, 2), (1, 2))
    """
    pairs = [
        (same_answer_key(p), same_answer_key(y)) for p, y in zip(predictions, labels, strict=True)
    ]
    if metric == "accuracy":
        return sum(p == y for p, y in pairs), len(pairs)
    pos = same_answer_key(positive)
    tp = sum(p == pos and y == pos for p, y in pairs)
    if metric == "precision":
        return tp, sum(p == pos for p, _ in pairs)
    if metric == "recall":
        return tp, sum(y == pos for _, y in pairs)
    msg = f"unknown metric {metric!r}; valid: 'accuracy', 'precision', 'recall'."  # type: ignore[unreachable]
    raise InputError(msg)


def _log_binom_sf(k: int, n: int, p: float) -> float:
    """Log of P(X >= k) for X ~ Binomial(n, p), summed in log space."""
    if k <= 0:
        return 0.0
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return 0.0
    terms = [
        math.lgamma(n + 1)
        - math.lgamma(j + 1)
        - math.lgamma(n - j + 1)
        + j * math.log(p)
        + (n - j) * math.log1p(-p)
        for j in range(k, n + 1)
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


@functools.lru_cache(maxsize=65536)
def clopper_pearson_lower(successes: int, trials: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound on a binomial proportion.

    The ``p`` with ``P(X >= successes | p) = 1 - level``: the true proportion is
    at least this with probability ``level``.

    Examples
    --------
    >>> round(clopper_pearson_lower(95, 100, 0.95), 4)
    0.8977
    >>> clopper_pearson_lower(0, 10), clopper_pearson_lower(5, 0)
    (0.0, 0.0)
    >>> round(clopper_pearson_lower(10, 10, 0.95), 4)
    0.7411
    """
    if trials <= 0 or successes <= 0:
        return 0.0
    alpha = 1.0 - level
    log_alpha = math.log(alpha)
    lo, hi = 0.0, successes / trials
    for _ in range(80):
        mid = (lo + hi) / 2
        if _log_binom_sf(successes, trials, mid) > log_alpha:
            hi = mid
        else:
            lo = mid
    return lo


def combine(predictions: Sequence[Sequence[object]], answered: Sequence[int]) -> list[object]:
    """Each row's answer from the stage that answered it.

    Examples
    --------
    >>> combine([["a", "b"], ["A", "B"]], [0, 1])
    ['a', 'B']
    """
    return [predictions[s][i] for i, s in enumerate(answered)]


def _shares(answered: Sequence[int], n_stages: int) -> tuple[float, ...]:
    n = len(answered)
    counts = Counter(answered)
    return tuple(counts.get(s, 0) / n if n else 0.0 for s in range(n_stages))


def evaluate(
    predictions: Sequence[Sequence[object]],
    confidences: Sequence[Sequence[float | None]],
    labels: Sequence[object],
    thresholds: Sequence[float],
    *,
    metric: Metric = "accuracy",
    positive: object = True,
) -> tuple[float, tuple[float, ...]]:
    """The cascade's metric on labeled rows, and the share each stage answered.

    Examples
    --------
    >>> evaluate([["y", "n"], ["y", "y"]], [[0.9, 0.2], [1.0, 1.0]], ["y", "y"], [0.5])
    (1.0, (0.5, 0.5))
    """
    answered = route(confidences, thresholds)
    k, n = metric_counts(combine(predictions, answered), labels, metric, positive)
    return (k / n if n else 0.0), _shares(answered, len(thresholds) + 1)


def choose_thresholds(
    predictions: Sequence[Sequence[object]],
    confidences: Sequence[Sequence[float | None]],
    labels: Sequence[object],
    *,
    target: float,
    metric: Metric = "accuracy",
    level: float = 0.95,
    costs: Sequence[float] | None = None,
    positive: object = True,
    grid: int = 12,
) -> Calibration:
    """Thresholds that meet ``target`` with confidence ``level`` at the lowest expected cost.

    Pure: works on answers already collected from every stage on the same
    labeled rows. A choice of thresholds passes when the one-sided
    Clopper-Pearson lower bound (:func:`clopper_pearson_lower`) of the
    cascade's metric on these rows is at least ``target``.

    Two stages: candidate thresholds are the first stage's distinct
    confidences, tested from the strictest (escalate everything) to the
    loosest, stopping at the first that fails (fixed-sequence testing, so the
    level needs no correction for the number of thresholds tried); the last
    that passed escalates the fewest rows. More stages: a grid of
    ``grid`` confidence quantiles per stage, every combination tested at
    level ``1 - (1 - level) / m`` (Bonferroni over the ``m`` combinations), the
    cheapest passing one kept, where a row costs the sum of ``costs`` of the
    stages it went through (default ``1, 10, 100, ...``).

    When nothing passes, every row goes to the last stage (``feasible=False``).

    Examples
    --------
    A small model right on its confident rows, unreliable below 0.8:

    >>> conf = [0.95] * 60 + [0.6] * 40
    >>> small = ["a"] * 60 + ["b"] * 40
    >>> large = ["a"] * 100
    >>> cal = choose_thresholds([small, large], [conf, [1.0] * 100], ["a"] * 100, target=0.9)
    >>> cal.thresholds, cal.answered, cal.feasible
    ((0.95,), (0.6, 0.4), True)
    """
    n_stages = len(predictions)
    if n_stages < 2 or len(confidences) != n_stages:
        msg = (
            f"need predictions and confidences of at least two stages, got "
            f"{len(predictions)} and {len(confidences)}."
        )
        raise InputError(msg)
    if not 0.0 < target <= 1.0:
        msg = f"the target {metric} must be in (0, 1], got {target!r}."
        raise InputError(msg)
    if not 0.5 <= level < 1.0:
        msg = f"the confidence level must be in [0.5, 1), got {level!r}."
        raise InputError(msg)
    costs = list(costs) if costs is not None else [10.0**s for s in range(n_stages)]
    if len(costs) != n_stages:
        msg = f"costs needs one number per stage ({n_stages}), got {len(costs)}."
        raise InputError(msg)
    n = len(labels)

    def result(ts: Sequence[float]) -> tuple[float, float, tuple[float, ...], float]:
        answered = route(confidences, ts)
        k, m = metric_counts(combine(predictions, answered), labels, metric, positive)
        shares = _shares(answered, n_stages)
        reach, cost = 1.0, 0.0
        for s in range(n_stages):
            cost += reach * costs[s]
            reach -= shares[s]
        return (k / m if m else 0.0), clopper_pearson_lower(k, m, lvl), shares, cost

    escalate_all = (math.inf,) * (n_stages - 1)
    if n_stages == 2:
        lvl = level
        method = "fixed-sequence test from the strictest threshold"
        best = _fixed_sequence(
            predictions,
            confidences[0],
            labels,
            target=target,
            metric=metric,
            level=lvl,
            positive=positive,
        )
    else:
        candidates = []
        for s in range(n_stages - 1):
            known = sorted(c for c in confidences[s] if c is not None)
            qs = {known[int(q * (len(known) - 1))] for q in _quantiles(grid)} if known else set()
            candidates.append([*sorted(qs), math.inf])
        combos = list(itertools.product(*candidates))
        lvl = 1.0 - (1.0 - level) / len(combos)
        method = f"grid of {len(combos)} threshold combinations, Bonferroni-corrected"
        best, best_cost = None, math.inf
        for combo in combos:
            value, lower, _, cost = result(combo)
            if lower >= target and cost < best_cost:
                best, best_cost = combo, cost
    feasible = best is not None
    chosen = best if best is not None else escalate_all
    value, lower, shares, _ = result(chosen)
    return Calibration(
        metric=metric,
        target=target,
        level=level,
        thresholds=tuple(chosen),
        n_calibration=n,
        calibration_value=value,
        lower_bound=lower,
        feasible=feasible,
        answered=shares,
        method=method,
    )


def _fixed_sequence(
    predictions: Sequence[Sequence[object]],
    confidences: Sequence[float | None],
    labels: Sequence[object],
    *,
    target: float,
    metric: Metric,
    level: float,
    positive: object,
) -> tuple[float, ...] | None:
    """Two stages: the loosest threshold passing a fixed-sequence test, or None.

    Lowering the threshold hands rows from the last stage to the first one in
    order of falling confidence, so the counts are updated row by row.
    """
    pos = same_answer_key(positive)
    ys = [same_answer_key(y) for y in labels]
    first = [same_answer_key(p) for p in predictions[0]]
    cur = [same_answer_key(p) for p in predictions[1]]
    correct = sum(c == y for c, y in zip(cur, ys, strict=True))
    tp = sum(c == pos and y == pos for c, y in zip(cur, ys, strict=True))
    pred_pos = sum(c == pos for c in cur)
    label_pos = sum(y == pos for y in ys)

    def passes() -> bool:
        k, m = {
            "accuracy": (correct, len(ys)),
            "precision": (tp, pred_pos),
            "recall": (tp, label_pos),
        }[metric]
        return clopper_pearson_lower(k, m, level) >= target

    if not passes():
        return None
    best: tuple[float, ...] = (math.inf,)
    order = sorted(
        (i for i, c in enumerate(confidences) if c is not None),
        key=lambda i: -cast("float", confidences[i]),
    )
    at = 0
    while at < len(order):
        t = cast("float", confidences[order[at]])
        while at < len(order) and confidences[order[at]] == t:
            i = order[at]
            old, new, y = cur[i], first[i], ys[i]
            correct += (new == y) - (old == y)
            tp += (new == pos and y == pos) - (old == pos and y == pos)
            pred_pos += (new == pos) - (old == pos)
            cur[i] = new
            at += 1
        if not passes():
            break
        best = (t,)
    return best


def _quantiles(grid: int) -> list[float]:
    return [i / max(grid - 1, 1) for i in range(grid)]


def split_rows(n: int, holdout: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """A seeded random split of ``range(n)`` into (calibration, held-out) positions.

    Examples
    --------
    >>> cal, held = split_rows(10, 0.3)
    >>> len(cal), len(held), sorted(cal + held) == list(range(10))
    (7, 3, True)
    """
    if not 0.0 <= holdout < 1.0:
        msg = f"holdout must be a share in [0, 1), got {holdout!r}."
        raise InputError(msg)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = round(n * holdout)
    return sorted(order[k:]), sorted(order[:k])


class _Profile(Protocol):
    """What :func:`calibrate_profiles` reads of one stage's answers (a ``StageAnswers``)."""

    @property
    def stage(self) -> str: ...

    @property
    def values(self) -> Sequence[object]: ...

    @property
    def confidences(self) -> Sequence[float | None]: ...


def calibrate_profiles(
    profiles: Sequence[_Profile],
    labels: Sequence[object],
    *,
    target: float,
    metric: Metric = "accuracy",
    level: float = 0.95,
    holdout: float = 0.5,
    seed: int = 0,
    costs: Sequence[float] | None = None,
    positive: object = True,
    labels_from: str = "given",
) -> Calibration:
    """Choose thresholds on a calibration split and report them on the held-out rows.

    Examples
    --------
    >>> from semframe.operators.cascade import StageAnswers
    >>> small = StageAnswers("s", tuple(["a"] * 80 + ["b"] * 20), tuple([0.9] * 80 + [0.3] * 20))
    >>> large = StageAnswers("l", tuple(["a"] * 100), tuple([1.0] * 100))
    >>> cal = calibrate_profiles([small, large], ["a"] * 100, target=0.9)
    >>> cal.thresholds, cal.n_calibration, cal.n_heldout, cal.heldout_value
    ((0.9,), 50, 50, 1.0)
    """
    n = len(labels)
    for p in profiles:
        if len(p.values) != n or len(p.confidences) != n:
            msg = f"stage {p.stage!r} has answers for {len(p.values)} rows, labels for {n}."
            raise InputError(msg)
    cal, held = split_rows(n, holdout, seed)

    def pick(
        rows: Sequence[int],
    ) -> tuple[list[list[object]], list[list[float | None]], list[object]]:
        return (
            [[p.values[i] for i in rows] for p in profiles],
            [[p.confidences[i] for i in rows] for p in profiles],
            [labels[i] for i in rows],
        )

    preds, confs, ys = pick(cal)
    result = choose_thresholds(
        preds,
        confs,
        ys,
        target=target,
        metric=metric,
        level=level,
        costs=costs,
        positive=positive,
    )
    if held:
        hp, hc, hy = pick(held)
        value, shares = evaluate(hp, hc, hy, result.thresholds, metric=metric, positive=positive)
        result = dataclasses.replace(
            result, n_heldout=len(held), heldout_value=value, heldout_answered=shares
        )
    return dataclasses.replace(result, labels_from=labels_from)
