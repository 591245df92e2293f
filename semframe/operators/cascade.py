"""Model cascades: a small model answers first, only uncertain rows go further.

A cascade is an ordered list of :class:`Stage` (a backend and a model each,
possibly on different backends). Every row goes to the first stage; a stage's
answer is kept when its confidence reaches the stage's threshold, otherwise the
row is escalated to the next stage. The last stage answers every row that
reaches it. Each stage is its own relQuery over the rows that reach it, with
its own reordering; answers come back in the caller's row order and index.

Confidence of an answer:

- from the logprobs of the constrained answer tokens where the backend reports
  them (``filter``: the probability of the chosen yes/no, ``classify``: of the
  chosen label, both renormalised over the top alternatives that spell a valid
  answer, see :func:`semframe.core.parse.label_confidence`; ``extract``: the joint
  probability of the answer's tokens);
- or, for a stage with ``samples=k > 1``, the share of ``k`` samples (at the
  stage's ``temperature``) that agree with the majority answer, for backends
  that give no logprobs.

Thresholds come from calibration on labeled rows (:func:`calibrate`, or the
pure :func:`choose_thresholds` on answers already collected): the loosest
thresholds whose one-sided Clopper-Pearson lower bound on the target metric
(accuracy, or precision/recall for ``filter``) still meets the target at the
stated confidence, then checked on held-out rows.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from semframe.core.frames import Frame, NewColumn, Output
from semframe.core.parse import label_confidence, record_spec
from semframe.core.wire import Outcome, TokenLogprob
from semframe.cost.estimate import Estimate
from semframe.errors import InputError
from semframe.operators.common import LOGPROB_BACKENDS, TOP_LOGPROBS, check_new_columns
from semframe.operators.rowwise import CLASSIFY, EXTRACT, FILTER, RowwiseCall
from semframe.runtime.call import Call, Runner, backend_of, with_logprobs
from semframe.runtime.estimate import estimate_plan
from semframe.runtime.stats import RunStats, last_op

Metric = Literal["accuracy", "precision", "recall"]
CASCADE_OPS = ("filter", "classify", "extract")
"""Operators that take ``cascade=``: those whose answers have a confidence."""
_STAGE_KEYS = ("backend", "model", "samples", "temperature", "settings")
_YES_NO = ("yes", "no")


# -- stages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One model of a cascade.

    Parameters
    ----------
    backend : str
        Backend name (``"local"``, ``"openai"``, ``"anthropic"``, ``"fake"``...).
    model : str, optional
        Model name (the backend's default when omitted).
    samples : int
        ``1``: confidence from token logprobs (the backend must report them).
        ``k > 1``: ask ``k`` times at ``temperature``; the answer is the
        majority and its confidence the share of samples that agree.
    temperature : float
        Sampling temperature when ``samples > 1``.
    settings : mapping
        Further settings for this stage only (``max_concurrency``, ``timeout``...).

    Examples
    --------
    >>> Stage("local", "smollm2-135m").name
    'local/smollm2-135m'
    >>> Stage("anthropic", "claude-haiku-4-5", samples=5).name
    'anthropic/claude-haiku-4-5 (5 samples)'
    """

    backend: str
    model: str | None = None
    samples: int = 1
    temperature: float = 0.8
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``backend/model``, with the sample count when it samples."""
        base = f"{self.backend}/{self.model or 'default'}"
        return base if self.samples == 1 else f"{base} ({self.samples} samples)"


def parse_stage(spec: object, position: int = 0) -> Stage:
    """A :class:`Stage` from a ``Stage``, a mapping, or ``"backend"`` / ``"backend/model"``.

    Examples
    --------
    >>> parse_stage("fake/small")
    Stage(backend='fake', model='small', samples=1, temperature=0.8, settings={})
    >>> parse_stage({"backend": "openai", "model": "gpt-4o-mini"}).name
    'openai/gpt-4o-mini'
    >>> parse_stage({"backend": "fake", "modle": "x"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: cascade stage 0 has unknown key(s) ['modle']; valid keys: ...
    """
    if isinstance(spec, Stage):
        stage = spec
    elif isinstance(spec, str):
        backend, _, model = spec.partition("/")
        stage = Stage(backend.strip(), model.strip() or None)
    elif isinstance(spec, Mapping):
        unknown = sorted(str(k) for k in spec if k not in _STAGE_KEYS)
        if unknown:
            msg = (
                f"cascade stage {position} has unknown key(s) {unknown}; valid keys: "
                f"{', '.join(_STAGE_KEYS)}."
            )
            raise InputError(msg)
        if "backend" not in spec:
            msg = f"cascade stage {position} names no backend: {dict(spec)!r}."
            raise InputError(msg)
        stage = Stage(**{str(k): v for k, v in spec.items()})
    else:
        msg = (
            f"cascade stage {position} must be a Stage, a mapping "
            f"{{'backend': ..., 'model': ...}} or a 'backend/model' string, got {spec!r}."
        )
        raise InputError(msg)
    if not isinstance(stage.backend, str) or not stage.backend:
        msg = f"cascade stage {position} needs a backend name, got {stage.backend!r}."
        raise InputError(msg)
    samples = stage.samples
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        msg = f"cascade stage {position}: samples must be an int >= 1, got {samples!r}."
        raise InputError(msg)
    if samples > 1 and not stage.temperature > 0:
        msg = (
            f"cascade stage {position} samples {samples} answers but temperature is "
            f"{stage.temperature!r}; agreement needs temperature > 0."
        )
        raise InputError(msg)
    return stage


@dataclass(frozen=True)
class Calibration:
    """How a cascade's thresholds were chosen and how they did on held-out rows.

    Attributes
    ----------
    metric : {"accuracy", "precision", "recall"}
        What the target is on.
    target : float
        The metric the cascade must reach.
    level : float
        Confidence of the one-sided Clopper-Pearson lower bound (e.g. 0.95).
    thresholds : tuple of float
        One per stage but the last; ``inf`` escalates every row.
    n_calibration : int
        Labeled rows the thresholds were chosen on.
    calibration_value : float
        The metric on those rows with the chosen thresholds.
    lower_bound : float
        Its lower confidence bound (>= ``target`` when ``feasible``).
    feasible : bool
        Whether some thresholds met the target on the calibration rows; when
        not, every row is escalated to the last stage.
    answered : tuple of float
        Share of calibration rows each stage answered.
    n_heldout : int
        Held-out labeled rows (0: no hold-out).
    heldout_value : float or None
        The metric on the held-out rows.
    heldout_answered : tuple of float
        Share of held-out rows each stage answered.
    labels_from : str
        ``"given"``, or the stage whose answers served as labels.
    method : str
        How the thresholds were searched.
    """

    metric: str
    target: float
    level: float
    thresholds: tuple[float, ...]
    n_calibration: int
    calibration_value: float
    lower_bound: float
    feasible: bool
    answered: tuple[float, ...]
    n_heldout: int = 0
    heldout_value: float | None = None
    heldout_answered: tuple[float, ...] = ()
    labels_from: str = "given"
    method: str = ""

    @property
    def escalated(self) -> float:
        """Share of held-out rows (calibration rows without a hold-out) not answered first."""
        shares = self.heldout_answered or self.answered
        return 1.0 - shares[0] if shares else 0.0

    @property
    def met(self) -> bool | None:
        """Whether the held-out metric reached the target (``None`` without a hold-out)."""
        return None if self.heldout_value is None else self.heldout_value >= self.target

    def __repr__(self) -> str:
        ts = ", ".join("inf" if math.isinf(t) else f"{t:.4g}" for t in self.thresholds)
        held = (
            f"; held-out {self.heldout_value:.3f} on {self.n_heldout} rows "
            f"({'met' if self.met else 'MISSED'}), escalated {self.escalated:.1%}"
            if self.heldout_value is not None
            else ""
        )
        return (
            f"Calibration({self.metric} >= {self.target} at {self.level:.0%}: thresholds "
            f"[{ts}]; calibration {self.calibration_value:.3f} (lower bound "
            f"{self.lower_bound:.3f}) on {self.n_calibration} rows"
            + ("" if self.feasible else ", target not reachable: all rows escalated")
            + held
            + ")"
        )


@dataclass(frozen=True)
class CascadePlan:
    """A cascade with its thresholds: what ``cascade=`` takes, and what calibration returns.

    Examples
    --------
    >>> plan = CascadePlan.of(["fake/small", "fake/large"], thresholds=[0.9])
    >>> plan.stages[1].name, plan.thresholds
    ('fake/large', (0.9,))
    """

    stages: tuple[Stage, ...]
    thresholds: tuple[float, ...]
    calibration: Calibration | None = None

    @classmethod
    def of(cls, stages: Sequence[object], thresholds: Sequence[float] | None = None) -> CascadePlan:
        """Validate stages and thresholds (default: 0.5 for every stage but the last)."""
        if isinstance(stages, str | bytes | Mapping) or not isinstance(stages, Sequence):
            msg = (
                "cascade must be a list of stages (Stage, {'backend': ..., 'model': ...} or "
                f"'backend/model'), at least two, got {stages!r}."
            )
            raise InputError(msg)
        parsed = tuple(parse_stage(s, i) for i, s in enumerate(stages))
        if len(parsed) < 2:
            msg = f"a cascade needs at least two stages, got {len(parsed)}."
            raise InputError(msg)
        if thresholds is None:
            thresholds = [0.5] * (len(parsed) - 1)
        if isinstance(thresholds, int | float) or not isinstance(thresholds, Sequence):
            msg = f"thresholds must be a list of numbers, got {thresholds!r}."
            raise InputError(msg)
        if len(thresholds) != len(parsed) - 1:
            msg = (
                f"thresholds needs one number per stage but the last: {len(parsed) - 1} for "
                f"{len(parsed)} stages, got {len(thresholds)} ({list(thresholds)!r})."
            )
            raise InputError(msg)
        for t in thresholds:
            if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
                msg = (
                    f"thresholds must be numbers >= 0 (a confidence in [0, 1]; above 1 "
                    f"escalates every row), got {t!r}."
                )
                raise InputError(msg)
        return cls(parsed, tuple(float(t) for t in thresholds))

    @property
    def reach(self) -> tuple[float, ...]:
        """Expected share of rows reaching each stage (from calibration; else 1.0 each)."""
        if self.calibration is None:
            return (1.0,) * len(self.stages)
        shares = self.calibration.heldout_answered or self.calibration.answered
        out, left = [], 1.0
        for share in shares:
            out.append(left)
            left -= share
        return tuple(max(x, 0.0) for x in out)


def as_plan(cascade: object, thresholds: Sequence[float] | None = None) -> CascadePlan:
    """``cascade=`` as given (a :class:`CascadePlan` or a list of stages) -> a plan."""
    if isinstance(cascade, CascadePlan):
        if thresholds is None:
            return cascade
        return CascadePlan.of(cascade.stages, thresholds)
    return CascadePlan.of(cast("Sequence[object]", cascade), thresholds)


# -- routing and metrics (pure) ------------------------------------------------------


def route(confidences: Sequence[Sequence[float | None]], thresholds: Sequence[float]) -> list[int]:
    """The stage that answers each row.

    ``confidences[s][i]`` is stage ``s``'s confidence on row ``i`` (``None``: no
    answer, always escalated); a stage keeps a row when its confidence is at
    least its threshold; the last stage keeps every row that reaches it.

    Examples
    --------
    >>> route([[0.9, 0.4, None], [0.8, 0.3, 0.7]], [0.5, 0.5])
    [0, 2, 1]
    """
    n_stages = len(thresholds) + 1
    n = len(confidences[0]) if confidences else 0
    out = []
    for i in range(n):
        answered = n_stages - 1
        for s, t in enumerate(thresholds):
            c = confidences[s][i]
            if c is not None and c >= t:
                answered = s
                break
        out.append(answered)
    return out


def _normal(value: object) -> object:
    if isinstance(value, list | tuple):
        return tuple(_normal(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _normal(v)) for k, v in value.items()))
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
    pairs = [(_normal(p), _normal(y)) for p, y in zip(predictions, labels, strict=True)]
    if metric == "accuracy":
        return sum(p == y for p, y in pairs), len(pairs)
    pos = _normal(positive)
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
    pos = _normal(positive)
    ys = [_normal(y) for y in labels]
    first = [_normal(p) for p in predictions[0]]
    cur = [_normal(p) for p in predictions[1]]
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


def calibrate_profiles(
    profiles: Sequence[StageAnswers],
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


# -- confidence of one answer --------------------------------------------------------


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
    counts = Counter(repr(_normal(o.value)) for o in ok)
    top, votes = counts.most_common(1)[0]
    chosen = next(o for o in ok if repr(_normal(o.value)) == top)
    return chosen, votes / len(outcomes)


# -- running a cascade ---------------------------------------------------------------


@dataclass(frozen=True)
class StageAnswers:
    """One stage's answers on a set of rows: values and confidences, row-aligned.

    ``values[i]`` is ``None`` for a row the stage did not answer (failed).
    """

    stage: str
    values: tuple[object, ...]
    confidences: tuple[float | None, ...]
    runs: tuple[RunStats, ...] = ()


@dataclass(frozen=True)
class StageReport:
    """What one stage of a cascade run did."""

    stage: str
    rows_in: int
    answered: int
    runs: tuple[RunStats, ...]

    @property
    def dollars(self) -> float | None:
        """Billed dollars of the stage (``None`` where the model has no price)."""
        priced = [r.dollars for r in self.runs if r.dollars is not None]
        return sum(priced) if priced else None

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens sent by the stage."""
        return sum(r.prompt_tokens for r in self.runs)

    @property
    def wall_seconds(self) -> float:
        """Wall time of the stage's runs."""
        return sum(r.wall_seconds for r in self.runs)


@dataclass(frozen=True)
class CascadeReport:
    """A cascade run: rows in, rows answered and cost per stage (``last_cascade()``)."""

    op: str
    rows: int
    stages: tuple[StageReport, ...]
    thresholds: tuple[float, ...]

    @property
    def escalated(self) -> float:
        """Share of rows the first stage did not answer."""
        return 1.0 - self.stages[0].answered / self.rows if self.rows else 0.0

    def __repr__(self) -> str:
        lines = [f"CascadeReport({self.op}, {self.rows} rows, escalated {self.escalated:.1%}:"]
        for s in self.stages:
            money = "-" if s.dollars is None else f"${s.dollars:.4f}"
            lines.append(
                f"  {s.stage}: {s.rows_in} in, {s.answered} answered, "
                f"{s.prompt_tokens:,} prompt tok, {money}, {s.wall_seconds:.1f} s"
            )
        return "\n".join(lines) + ")"


def last_cascade() -> CascadeReport | None:
    """The report of the most recent cascade run (``semframe.last_op().detail``)."""
    op = last_op()
    detail = op.detail if op is not None else None
    return detail if isinstance(detail, CascadeReport) else None


@dataclass(frozen=True)
class _Spec:
    """What a cascade needs to know about its operator: compile a stage, read a confidence."""

    op: str
    labels: tuple[str, ...]
    compile: Callable[[Frame, Mapping[str, Any]], RowwiseCall]


def _stage_settings(stage: Stage, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(kwargs)
    merged.update(stage.settings)
    merged["backend"] = stage.backend
    merged["model"] = stage.model
    if stage.samples > 1:
        merged["temperature"] = stage.temperature
    return merged


def _logprobs(compiled: RowwiseCall) -> RowwiseCall:
    return dataclasses.replace(compiled, call=with_logprobs(compiled.call, TOP_LOGPROBS))


def _spec(op: str, template: str, extra: Mapping[str, Any]) -> _Spec:
    if op == "filter":
        return _Spec(op, _YES_NO, lambda f, kw: _logprobs(FILTER.compile(f, template, **kw)))
    if op == "classify":
        labels = extra["labels"]
        if extra.get("multi"):
            msg = (
                "cascade= needs a single label per row (multi=False): the confidence of a "
                "set of labels is not defined here."
            )
            raise InputError(msg)
        if extra.get("confidence"):
            msg = "cascade= and confidence=True do not combine; the cascade reports its stages."
            raise InputError(msg)
        out = extra.get("out", "label")
        return _Spec(
            op,
            tuple(cast("Sequence[str]", labels)),
            lambda f, kw: CLASSIFY.compile(
                f, template, labels=labels, out=out, confidence=True, **kw
            ),
        )
    if op == "extract":
        schema = extra["schema"]
        return _Spec(
            op, (), lambda f, kw: _logprobs(EXTRACT.compile(f, template, schema=schema, **kw))
        )
    msg = f"cascade= works with {', '.join(CASCADE_OPS)}; not with {op!r}."
    raise InputError(msg)


def check_stages(plan: CascadePlan, compiled: Sequence[RowwiseCall]) -> None:
    """Fail before any request unless every stage can say how confident it is.

    Every stage but the last needs a backend reporting logprobs, or
    ``samples > 1``; no stage may use ``batch=True``.
    """
    for i, (stage, call) in enumerate(zip(plan.stages, compiled, strict=True)):
        cfg = call.settings
        if cfg["batch"]:
            msg = f"cascade stage {i} ({stage.name}): batch=True is not supported in a cascade."
            raise InputError(msg)
        backend = backend_of(cfg)
        if i == len(plan.stages) - 1 or stage.samples > 1:
            continue
        if not backend.capabilities.logprobs:
            msg = (
                f"cascade stage {i} ({stage.name}) must report a confidence, but backend "
                f"{backend.name!r} gives no token logprobs. Use a backend that does "
                f"({', '.join(LOGPROB_BACKENDS)}), or sample for agreement: "
                f"{{'backend': {stage.backend!r}, 'model': {stage.model!r}, 'samples': 5}}."
            )
            raise InputError(msg)


def _prepare(
    frame: Frame,
    template: str,
    op: str,
    *,
    plan: CascadePlan,
    kwargs: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> tuple[_Spec, list[RowwiseCall]]:
    spec = _spec(op, template, extra)
    compiled = [spec.compile(frame, _stage_settings(s, kwargs)) for s in plan.stages]
    check_stages(plan, compiled)
    return spec, compiled


def _answer_stage(
    spec: _Spec, stage: Stage, call: Call, runner: Runner
) -> tuple[list[Outcome], list[float | None]]:
    if stage.samples == 1:
        outcomes = runner.run(call)
        return outcomes, [answer_confidence(spec.op, o, spec.labels) for o in outcomes]
    samples = [runner.run(call) for _ in range(stage.samples)]
    picked = [agreement(list(row)) for row in zip(*samples, strict=True)]
    return [o for o, _ in picked], [c for _, c in picked]


def answer_all(
    frame: Any,
    template: str,
    op: str,
    cascade: object,
    extra: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> list[StageAnswers]:
    """Every stage's answers and confidences on every row (for calibration).

    Each stage runs as one relQuery over all rows, with its own reordering.
    """
    plan = as_plan(cascade, None)
    spec, compiled = _prepare(
        Frame.of(frame), template, op, plan=plan, kwargs=kwargs, extra=extra or {}
    )
    out = []
    for stage, compiled_stage in zip(plan.stages, compiled, strict=True):
        runner = Runner(op)
        outcomes, confs = _answer_stage(spec, stage, compiled_stage.call, runner)
        out.append(
            StageAnswers(
                stage.name,
                tuple(o.value if o.error_kind is None else None for o in outcomes),
                tuple(confs),
                tuple(runner.runs),
            )
        )
    return out


@dataclass(frozen=True)
class CascadeCall:
    """A compiled cascade: each stage's compiled call over every row."""

    plan: CascadePlan
    spec: _Spec
    stages: tuple[RowwiseCall, ...]
    stage_column: str | None


class CascadeOperator:
    """``cascade=`` on ``filter``, ``classify`` or ``extract``: the operator run as a cascade.

    Examples
    --------
    >>> import pandas as pd
    >>> from semframe.backends import get_backend
    >>> small = get_backend("fake", model="doc-small", settings={})
    >>> small.set_logprobs(lambda r, text: [  # unsure about "meh"
    ...     TokenLogprob(text, math.log(0.55 if "meh" in r.prompt else 0.99))])
    >>> df = pd.DataFrame({"review": ["a great film", "meh, good enough", "dull"]})
    >>> out = df.llm.filter("Is {review} positive?", cascade=["fake/doc-small", "fake/doc-big"],
    ...                     thresholds=[0.9])
    >>> out
                 review       llm_stage
    0      a great film  fake/doc-small
    1  meh, good enough    fake/doc-big
    >>> [(s.stage, s.rows_in, s.answered) for s in last_cascade().stages]
    [('fake/doc-small', 3, 2), ('fake/doc-big', 1, 1)]
    """

    def __init__(self, base: Any) -> None:
        if base.name not in CASCADE_OPS:
            msg = f"cascade= works with {', '.join(CASCADE_OPS)}; not with {base.name!r}."
            raise InputError(msg)
        self.base = base
        self.name: str = base.name
        self.required: tuple[str, ...] = base.required

    def compile(
        self,
        frame: Frame,
        template: str,
        *,
        cascade: object,
        thresholds: Sequence[float] | None = None,
        stage_column: str | None = "llm_stage",
        **kwargs: Any,
    ) -> CascadeCall:
        """Compile every stage's call over all rows; send nothing."""
        extra: dict[str, Any] = {}
        for name in ("schema", "labels", "out", "multi", "confidence"):
            if name in kwargs:
                extra[name] = kwargs.pop(name)
        for name in ("backend", "model"):
            if kwargs.get(name) is not None:
                msg = f"{name}= and cascade= do not combine: each cascade stage names its {name}."
                raise InputError(msg)
            kwargs.pop(name, None)
        plan = as_plan(cascade, thresholds)
        spec, compiled = _prepare(frame, template, self.name, plan=plan, kwargs=kwargs, extra=extra)
        if stage_column is not None:
            check_new_columns(frame, [stage_column], "stage_column")
        return CascadeCall(plan, spec, tuple(compiled), stage_column)

    def plan(self, compiled: CascadeCall) -> Any:
        """Each stage's plan over every row (later stages see only the rows escalated)."""
        return tuple(c.call.plan for c in compiled.stages)

    def estimate(self, compiled: CascadeCall, *, probe: int) -> Any:
        """The :class:`CascadeEstimate`: each stage priced for the rows expected to reach it."""
        return estimate_cascade(compiled.plan, compiled.stages, self.name)

    def run(self, compiled: CascadeCall, runner: Runner) -> Output:
        """Stage after stage, each over the rows the ones before were unsure of."""
        plan, spec = compiled.plan, compiled.spec
        first = compiled.stages[0]
        n = len(first.call.labels)
        final: list[Outcome | None] = [None] * n
        stage_of: list[int] = [len(plan.stages) - 1] * n
        pending = list(range(n))
        reports = []
        for s, stage in enumerate(plan.stages):
            if not pending:
                reports.append(StageReport(stage.name, 0, 0, ()))
                continue
            call = compiled.stages[s].call
            if len(pending) != n:
                call = call.take(pending)
            before = len(runner.runs)
            outcomes, confs = _answer_stage(spec, stage, call, runner)
            last = s == len(plan.stages) - 1
            still = []
            for pos, outcome, conf in zip(pending, outcomes, confs, strict=True):
                ok = outcome.error_kind is None
                if last or (ok and conf is not None and conf >= plan.thresholds[s]):
                    final[pos] = outcome
                    stage_of[pos] = s
                else:
                    still.append(pos)
            runs = tuple(runner.runs[before:])
            reports.append(StageReport(stage.name, len(pending), len(pending) - len(still), runs))
            pending = still
        outcomes_final = [
            o if o is not None else Outcome(None, None, "backend", "no stage", 0) for o in final
        ]
        report = CascadeReport(self.name, n, tuple(reports), plan.thresholds)
        runner.finish(
            detail=report,
            **{f"stage{i}_answered": r.answered for i, r in enumerate(reports)},
        )
        extra: list[NewColumn] = []
        if compiled.stage_column is not None:
            names = [plan.stages[s].name for s in stage_of]
            extra.append(NewColumn(compiled.stage_column, names))
        return self.base.output(first, outcomes_final, extra)  # type: ignore[no-any-return]


# -- estimating a cascade ------------------------------------------------------------


@dataclass(frozen=True)
class CascadeEstimate:
    """Expected cost of a cascade: each stage's estimate times the share reaching it.

    Attributes
    ----------
    stages : tuple of str
        Stage names.
    estimates : tuple of Estimate
        Each stage's estimate as if it answered every row (times its samples).
    reach : tuple of float
        Expected share of rows reaching each stage (from calibration; 1.0 for
        every stage without one: an upper bound).
    samples : tuple of int
        Samples per row of each stage.
    calibrated : bool
        Whether ``reach`` comes from calibration.
    """

    stages: tuple[str, ...]
    estimates: tuple[Estimate, ...]
    reach: tuple[float, ...]
    samples: tuple[int, ...]
    calibrated: bool

    @property
    def dollars(self) -> float | None:
        """Expected dollars (``None`` when no stage has a price)."""
        parts = [
            (e.dollars or 0.0) * r * k
            for e, r, k in zip(self.estimates, self.reach, self.samples, strict=True)
            if e.dollars is not None
        ]
        return sum(parts) if parts else None

    @property
    def tokens(self) -> float:
        """Expected input plus output tokens."""
        return sum(
            float(e.tokens) * r * k
            for e, r, k in zip(self.estimates, self.reach, self.samples, strict=True)
        )

    @property
    def requests(self) -> float:
        """Expected requests."""
        return sum(
            float(e.requests) * r * k
            for e, r, k in zip(self.estimates, self.reach, self.samples, strict=True)
        )

    def __repr__(self) -> str:
        lines = [
            "CascadeEstimate("
            + (
                "calibrated"
                if self.calibrated
                else "uncalibrated: every stage priced for every row"
            )
        ]
        for name, e, r, k in zip(
            self.stages, self.estimates, self.reach, self.samples, strict=True
        ):
            money = "-" if e.dollars is None else f"${e.dollars * r * k:,.4f}"
            lines.append(f"  {name}: reach {r:.1%} x {k}, {e.tokens * r * k:,.0f} tok, {money}")
        total = "-" if self.dollars is None else f"${self.dollars:,.4f}"
        lines.append(f"  expected: {self.tokens:,.0f} tok, {total})")
        return "\n".join(lines)


def estimate_cascade(
    plan: CascadePlan, compiled: Sequence[RowwiseCall], op: str
) -> CascadeEstimate:
    """Price a cascade from each stage's estimate and the calibrated escalation shares."""
    estimates = tuple(estimate_plan(c.call.plan, c.settings, op=op) for c in compiled)
    return CascadeEstimate(
        tuple(s.name for s in plan.stages),
        estimates,
        plan.reach,
        tuple(s.samples for s in plan.stages),
        plan.calibration is not None,
    )


# -- calibration that runs the models ------------------------------------------------


def calibrate(
    frame: Any,
    template: str,
    *,
    op: str,
    cascade: object,
    labels: Sequence[object] | str | None = None,
    sample: int = 100,
    target_accuracy: float | None = None,
    target_precision: float | None = None,
    target_recall: float | None = None,
    level: float = 0.95,
    holdout: float = 0.5,
    seed: int = 0,
    costs: Sequence[float] | None = None,
    dry_run: bool = False,
    extra: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Run every stage on labeled rows and choose thresholds meeting a target.

    Parameters
    ----------
    frame : DataFrame
        The rows to calibrate on.
    template : str
        The operator's template.
    op : {"filter", "classify", "extract"}
        The operator.
    cascade : list of stages or CascadePlan
        The cascade.
    labels : sequence or str, optional
        The true answer of every row of ``frame`` (a column name, or values
        aligned with the rows: bools for ``filter``, labels for ``classify``,
        mappings for ``extract``). Without labels, a seeded random ``sample`` of
        rows is answered by the last (largest) stage and its answers are the
        labels; the target is then agreement with that model.
    sample : int
        Rows to label with the last stage when ``labels`` is None.
    target_accuracy, target_precision, target_recall : float
        Exactly one; precision and recall are for ``filter`` (positive = yes).
    level : float
        Confidence of the lower bound the target must clear.
    holdout : float
        Share of the labeled rows kept out of calibration to report on.
    seed : int
        Seed of the sample and the split.
    costs : sequence of float, optional
        Relative cost of a row at each stage (default ``1, 10, 100...``).
    dry_run : bool
        Return the :class:`CascadeEstimate` of the calibration run itself
        (every stage on every calibration row) instead of running it.
    extra : mapping, optional
        The operator's own arguments: ``labels``/``out`` for classify,
        ``schema`` for extract.

    Returns
    -------
    CascadePlan
        The stages with the chosen thresholds and the :class:`Calibration`.

    Examples
    --------
    >>> import pandas as pd
    >>> from semframe.backends import get_backend
    >>> from semframe.backends.fake import default_answer
    >>> small = get_backend("fake", model="cal-small", settings={})
    >>> small.responder = lambda r: (  # wrong, and unsure, on the "ok" rows
    ...     '{"answer": "no"}' if "ok" in r.prompt else default_answer(r))
    >>> small.set_logprobs(lambda r, text: [
    ...     TokenLogprob(text, math.log(0.6 if "ok" in r.prompt else 0.99))])
    >>> df = pd.DataFrame({"review": ["great"] * 40 + ["ok, good"] * 20 + ["awful"] * 40})
    >>> truth = [True] * 60 + [False] * 40
    >>> plan = calibrate(df, "Is {review} positive?", op="filter",
    ...                  cascade=["fake/cal-small", "fake/cal-large"], labels=truth,
    ...                  target_accuracy=0.9)
    >>> plan.thresholds, round(plan.calibration.escalated, 2)
    ((0.99,), 0.18)
    """
    targets = {
        "accuracy": target_accuracy,
        "precision": target_precision,
        "recall": target_recall,
    }
    given = {k: v for k, v in targets.items() if v is not None}
    if len(given) != 1:
        msg = "give exactly one of target_accuracy=, target_precision=, target_recall=."
        raise InputError(msg)
    metric, target = next(iter(given.items()))
    if metric != "accuracy" and op != "filter":
        msg = f"target_{metric}= is for filter; use target_accuracy= for {op}."
        raise InputError(msg)
    plan = as_plan(cascade, None)
    edge = Frame.of(frame)
    n = edge.height
    eager = edge.data
    labels_from = "given"
    if labels is None:
        rows = sorted(random.Random(seed).sample(range(n), min(sample, n)))
        eager = edge.adapter.take(eager, rows)
        labels_from = plan.stages[-1].name
    elif isinstance(labels, str):
        if labels not in edge.columns:
            msg = f"labels={labels!r} is not a column; columns: {list(edge.columns)}."
            raise InputError(msg)
        labels = list(eager[labels])  # pandas and Polars columns alike: raw values
    if labels is not None and len(labels) != edge.adapter.height(eager):
        msg = f"labels has {len(labels)} values for {n} rows; give one per row."
        raise InputError(msg)
    if dry_run:
        _, compiled = _prepare(
            Frame.of(eager), template, op, plan=plan, kwargs=kwargs, extra=extra or {}
        )
        return estimate_cascade(CascadePlan(plan.stages, plan.thresholds), compiled, op)
    answers = answer_all(eager, template, op, plan, extra, **kwargs)
    if labels is None:
        labels = list(answers[-1].values)
    if op == "extract":
        labels = [_record(y, extra) for y in labels]
    result = calibrate_profiles(
        answers,
        list(labels),
        target=target,
        metric=cast("Metric", metric),
        level=level,
        holdout=holdout,
        seed=seed,
        costs=costs,
        labels_from=labels_from,
    )
    return CascadePlan(plan.stages, result.thresholds, result)


def _record(label: object, extra: Mapping[str, Any] | None) -> object:
    """An extract label (a mapping) as the tuple of field values extract answers with."""
    if not isinstance(label, Mapping):
        return label
    _, fields = record_spec((extra or {})["schema"])
    return tuple(label.get(f.name) for f in fields)


__all__ = [
    "CASCADE_OPS",
    "Calibration",
    "CascadeCall",
    "CascadeEstimate",
    "CascadeOperator",
    "CascadePlan",
    "CascadeReport",
    "Stage",
    "StageAnswers",
    "StageReport",
    "TokenLogprob",
    "agreement",
    "answer_all",
    "answer_confidence",
    "calibrate",
    "calibrate_profiles",
    "choose_thresholds",
    "clopper_pearson_lower",
    "combine",
    "evaluate",
    "last_cascade",
    "metric_counts",
    "route",
    "split_rows",
]
