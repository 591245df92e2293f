"""Answers decided from calibrated label probabilities (``filter`` and ``classify``).

A small model's answer text leans to one label: SmolLM2-135M says "yes" to
almost every filter question, whatever the row holds. Its token
probabilities still rank the rows (a positive review gets a higher
probability of "yes" than a negative one), only around a biased centre.
Following "Calibrate Before Use" (Zhao et al., 2021), the same prompt is
asked with content-free inputs (every field ``N/A``, empty, ``[MASK]``); the
mean label distribution over them is the model's bias, and each row's
distribution is divided by it before the most probable label is taken. With
a few labeled rows instead (``calibrate=[{...fields..., "answer": ...}]``),
the bias is the per-label offset that answers most of them right.

The functions here are pure: distributions in, decisions out.
:mod:`semframe.operators.rowwise` sends the extra requests and applies them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

__all__ = [
    "CONTENT_FREE",
    "bias_from_labeled",
    "bias_from_prior",
    "decide",
    "mean_distribution",
]

CONTENT_FREE = ("N/A", "", "[MASK]")
"""The content-free inputs: every field of the template takes each in turn."""

_FLOOR = 1e-6
"""Smallest probability used in logarithms (a label the model never names)."""


def mean_distribution(
    dists: Sequence[Mapping[str, float]], labels: Sequence[str]
) -> dict[str, float]:
    """The mean of ``dists`` over ``labels`` (uniform when there is none).

    Examples
    --------
    >>> mean_distribution([{"yes": 0.8, "no": 0.2}, {"yes": 0.6, "no": 0.4}], ["yes", "no"])
    {'yes': 0.7, 'no': 0.3}
    >>> mean_distribution([], ["yes", "no"])
    {'yes': 0.5, 'no': 0.5}
    """
    if not dists:
        return {x: 1 / len(labels) for x in labels}
    return {x: round(sum(d.get(x, 0.0) for d in dists) / len(dists), 12) for x in labels}


def bias_from_prior(prior: Mapping[str, float]) -> dict[str, float]:
    """Content-free calibration: each label's log prior is subtracted from its log probability.

    Examples
    --------
    >>> b = bias_from_prior({"yes": 0.8, "no": 0.2})
    >>> decide({"yes": 0.7, "no": 0.3}, b), decide({"yes": 0.9, "no": 0.1}, b)
    ('no', 'yes')
    """
    return {x: math.log(max(p, _FLOOR)) for x, p in prior.items()}


def decide(dist: Mapping[str, float], bias: Mapping[str, float]) -> str:
    """The label with the highest ``log p - bias`` (the first listed on a tie).

    Examples
    --------
    >>> decide({"a": 0.5, "b": 0.5}, {"a": 0.0, "b": 0.0})
    'a'
    """
    return max(dist, key=lambda x: math.log(max(dist[x], _FLOOR)) - bias.get(x, 0.0))


def bias_from_labeled(
    dists: Sequence[Mapping[str, float]],
    answers: Sequence[str],
    labels: Sequence[str],
    *,
    start: Mapping[str, float] | None = None,
    rounds: int = 3,
) -> dict[str, float]:
    """Per-label offsets that decide as many of the labeled rows right as can be.

    Coordinate ascent from ``start`` (no offset by default): each label's
    offset in turn is set to the value, among those where some labeled row's
    decision changes, that decides the most rows right; on a tie the value
    nearest the current one wins, so a few labeled rows move the decision
    no further than they must. For two labels this is the best threshold on
    the log-odds.

    Parameters
    ----------
    dists : sequence of mapping
        Each labeled row's label distribution.
    answers : sequence of str
        Each labeled row's right label.
    labels : sequence of str
        All labels.
    start : mapping, optional
        The offsets to start from (e.g. :func:`bias_from_prior`).
    rounds : int
        Passes over the labels.

    Examples
    --------
    >>> rows = [{"yes": 0.9, "no": 0.1}, {"yes": 0.7, "no": 0.3}, {"yes": 0.6, "no": 0.4}]
    >>> b = bias_from_labeled(rows, ["yes", "no", "no"], ["yes", "no"])
    >>> [decide(d, b) for d in rows]
    ['yes', 'no', 'no']
    """
    bias = {x: float((start or {}).get(x, 0.0)) for x in labels}
    logs = [{x: math.log(max(d.get(x, 0.0), _FLOOR)) for x in labels} for d in dists]

    def right(b: Mapping[str, float]) -> int:
        pairs = zip(logs, answers, strict=True)
        return sum(max(labels, key=lambda x: lg[x] - b[x]) == a for lg, a in pairs)

    for _ in range(rounds):
        moved = False
        for x in labels:
            # Offsets of x where a row's decision flips: x's score ties the best other.
            cuts = sorted({lg[x] - max(lg[y] - bias[y] for y in labels if y != x) for lg in logs})
            candidates = [cuts[0] - 1.0, cuts[-1] + 1.0]
            candidates += [(a + b) / 2 for a, b in itertools.pairwise(cuts)]
            best_value, best_score = bias[x], right(bias)
            for value in candidates:
                score = right({**bias, x: value})
                closer = abs(value - bias[x]) < abs(best_value - bias[x])
                if score > best_score or (score == best_score and closer):
                    best_value, best_score = value, score
            if best_value != bias[x]:
                bias[x] = best_value
                moved = True
        if not moved:
            break
    return bias
