"""relQuery-aware scheduling: one :class:`Scheduler` interface, policies, cost models.

The same policy objects drive the discrete-event simulator (:mod:`semframe.serving.sim`)
and, through a subclass of vLLM's V1 scheduler, a real engine: policies see
only :class:`SchedRequest` views, budgets and a prefix-cache view.
"""

from __future__ import annotations

from semframe.serving.sched.base import (
    BatchItem,
    BatchMode,
    BatchRecord,
    Budgets,
    CacheView,
    FifoQueue,
    Phase,
    SchedContext,
    SchedRequest,
    Scheduler,
)
from semframe.serving.sched.cost import (
    A100_13B,
    RELSERVE_A100_13B,
    BatchShape,
    Calibration,
    InferMaxCost,
    RelServeCost,
    Sample,
    calibrate,
    fit_infermax,
    fit_relserve,
    profile_shapes,
)
from semframe.serving.sched.policies import (
    FcfsScheduler,
    InferMaxScheduler,
    LpmScheduler,
    Policy,
    RelServeScheduler,
    SarathiScheduler,
    StaticPriorityScheduler,
    batch_decompose,
    make_scheduler,
    pem,
)

__all__ = [
    "A100_13B",
    "RELSERVE_A100_13B",
    "BatchItem",
    "BatchMode",
    "BatchRecord",
    "BatchShape",
    "Budgets",
    "CacheView",
    "Calibration",
    "FcfsScheduler",
    "FifoQueue",
    "InferMaxCost",
    "InferMaxScheduler",
    "LpmScheduler",
    "Phase",
    "Policy",
    "RelServeCost",
    "RelServeScheduler",
    "Sample",
    "SarathiScheduler",
    "SchedContext",
    "SchedRequest",
    "Scheduler",
    "StaticPriorityScheduler",
    "batch_decompose",
    "calibrate",
    "fit_infermax",
    "fit_relserve",
    "make_scheduler",
    "pem",
    "profile_shapes",
]
