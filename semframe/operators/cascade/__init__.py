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

from semframe.core.wire import TokenLogprob
from semframe.operators.cascade.confidence import agreement, answer_confidence
from semframe.operators.cascade.run import (
    CascadeCall,
    CascadeEstimate,
    CascadeOperator,
    CascadeReport,
    StageAnswers,
    StageReport,
    answer_all,
    calibrate,
    last_cascade,
)
from semframe.operators.cascade.stages import (
    CASCADE_OPS,
    Calibration,
    CascadePlan,
    Stage,
    route,
)
from semframe.operators.cascade.thresholds import (
    calibrate_profiles,
    choose_thresholds,
    clopper_pearson_lower,
    combine,
    evaluate,
    metric_counts,
    split_rows,
)

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
