"""Confidence of one answer: from token logprobs, or from agreement between samples."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import cast

from semframe.core.parse import label_confidence
from semframe.core.wire import Outcome
from semframe.operators.cascade.thresholds import same_answer_key

_YES_NO = ("yes", "no")


def answer_confidence(op: str, outcome: Outcome, labels: Sequence[str] = ()) -> float | None:
    """Confidence of one answer from its token logprobs (``None``: none available).

    ``filter`` and ``classify``: the chosen answer's probability among the
    valid answers (:func:`semframe.core.parse.label_confidence`); ``extract``: the
    joint probability of the answer's tokens.

    Examples
    --------
    >>> from semframe.backends.base import TokenLogprob as T
    >>> o = Outcome(True, '{"answer": "yes"}', None, None, 1,
    ...             (T('{"answer": "', 0.0), T('yes', math.log(0.8)), T('"}', 0.0)))
    >>> round(answer_confidence("filter", o), 3)
    0.8
    """
    if outcome.error_kind is not None or outcome.logprobs is None or outcome.raw is None:
        return None
    if op == "extract":
        return math.exp(sum(t.logprob for t in outcome.logprobs))
    names = _YES_NO if op == "filter" else tuple(labels)
    found = label_confidence(outcome.raw, outcome.logprobs, names)
    if op == "filter":
        chosen = "yes" if outcome.value is True else "no"
    else:
        chosen = cast("str", outcome.value)
    return found.get(chosen)


def agreement(outcomes: Sequence[Outcome]) -> tuple[Outcome, float | None]:
    """The majority answer of ``k`` samples and the share that agree with it.

    Examples
    --------
    >>> a, b = Outcome("x", "x", None, None, 1), Outcome("y", "y", None, None, 1)
    >>> best, share = agreement([a, b, a])
    >>> best.value, round(share, 3)
    ('x', 0.667)
    """
    ok = [o for o in outcomes if o.error_kind is None]
    if not ok:
        return outcomes[0], None
    counts = Counter(repr(same_answer_key(o.value)) for o in ok)
    top, votes = counts.most_common(1)[0]
    chosen = next(o for o in ok if repr(same_answer_key(o.value)) == top)
    return chosen, votes / len(outcomes)
