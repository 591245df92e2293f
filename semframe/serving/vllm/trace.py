"""Read our scheduler's per-step trace; fit the simulator's cost models to it.

:class:`~semframe.serving.vllm.scheduler.SemframeScheduler` with a ``trace`` option
writes one JSON line per engine step: the prefill chunks as ``[new, cached]``
tokens, each decoding request's context, and ``since_last``, the seconds since
the previous step started. A step's duration is the next line's
``since_last``, so a trace is a sample of (batch shape, seconds) pairs from the
real engine, which :func:`calibrate_from_trace` fits to
:class:`~semframe.serving.sched.cost.InferMaxCost` (the simulator's batch time) and
:class:`~semframe.serving.sched.cost.RelServeCost` (RelServe's predictor).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from semframe.serving.sched.cost import BatchShape, Calibration, Sample, fit_infermax, fit_relserve

MARKER = "marker"
"""Key of a line a benchmark writes into the trace to mark a point (not a step)."""

IDLE_GAP = 5.0
"""A step that took longer than this many seconds is an idle engine, not a batch."""


def read_steps(lines: Iterable[str], *, after: str | None = None) -> list[dict[str, Any]]:
    """The step records of a trace (marker lines dropped).

    ``after`` keeps only the steps after the last marker line with that value.

    Examples
    --------
    >>> lines = ['{"since_last": null, "prefill": [[10, 0]], "decode": []}',
    ...          '{"marker": "go"}', '{"since_last": 0.5, "prefill": [], "decode": [11]}']
    >>> len(read_steps(lines)), len(read_steps(lines, after="go"))
    (2, 1)
    """
    steps: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if MARKER in record:
            if after is not None and record[MARKER] == after:
                steps = []
            continue
        steps.append(record)
    return steps


def samples(steps: list[dict[str, Any]]) -> list[Sample]:
    """(batch shape, seconds) pairs: each step with the next step's ``since_last``.

    Examples
    --------
    >>> steps = [{"since_last": None, "prefill": [[100, 28]], "decode": []},
    ...          {"since_last": 0.25, "prefill": [], "decode": [128, 130]},
    ...          {"since_last": 0.05, "prefill": [], "decode": []}]
    >>> [(len(s.shape.prefill), len(s.shape.decode), s.seconds) for s in samples(steps)]
    [(1, 0, 0.25), (0, 2, 0.05)]
    """
    out = []
    for cur, nxt in itertools.pairwise(steps):
        seconds = nxt.get("since_last")
        if not seconds or not (cur.get("prefill") or cur.get("decode")):
            continue
        if seconds > IDLE_GAP:
            continue
        shape = BatchShape(
            prefill=tuple((int(c), int(m)) for c, m in cur.get("prefill", ())),
            decode=tuple(int(x) for x in cur.get("decode", ())),
        )
        out.append(Sample(shape, float(seconds)))
    return out


def calibrate_from_trace(
    path: str | Path,
    *,
    after: str | None = None,
    source: str = "vllm trace",
    out: str | Path | None = None,
) -> Calibration:
    """Fit both cost models to the engine steps recorded in a trace file.

    Parameters
    ----------
    path : str or Path
        The trace (``additional_config={"semframe": {"trace": ...}}``).
    after : str, optional
        Use only the steps after the last marker with this value (skip warm-up).
    source : str
        Recorded in the calibration (engine, model, machine).
    out : str or Path, optional
        Where to write the calibration as JSON (``semframe serve --cost`` reads it).

    Raises
    ------
    ValueError
        When the trace holds too few steps to fit.
    """
    steps = read_steps(Path(path).read_text(encoding="utf-8").splitlines(), after=after)
    found = samples(steps)
    if len(found) < 4:
        msg = f"{path}: {len(found)} usable engine steps; at least 4 are needed to fit"
        raise ValueError(msg)
    infer = fit_infermax(found)
    rel = fit_relserve(found)
    errs = [abs(infer.batch_time(s.shape) - s.seconds) / s.seconds for s in found]
    cal = Calibration(infer, rel, len(found), float(np.mean(errs)), source)
    if out is not None:
        Path(out).write_text(cal.to_json() + "\n", encoding="utf-8")
    return cal
