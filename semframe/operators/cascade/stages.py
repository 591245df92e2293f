"""What a cascade is: its stages, its thresholds, and which stage answers a row.

:class:`Stage` and :func:`parse_stage` read one stage of ``cascade=``;
:class:`CascadePlan` (built by :func:`as_plan`) holds the stages, the thresholds
and the :class:`Calibration` they came from; :func:`route` applies thresholds to
confidences. No models are called here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from semframe.errors import InputError

Metric = Literal["accuracy", "precision", "recall"]
CASCADE_OPS = ("filter", "classify", "extract")
"""Operators that take ``cascade=``: those whose answers have a confidence."""
_STAGE_KEYS = ("backend", "model", "samples", "temperature", "settings")


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


# -- routing -----------------------------------------------------------------------


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
