"""Measuring a local engine's speed, for the estimator's wall times.

:func:`calibrate_local` times short runs through the real executor and fits
seconds per uncached prompt token, per output token and per request
(:func:`semframe.cost.calibration.fit`); the fit is stored for this machine,
model and slot count, where the estimator finds it.

Examples
--------
>>> import tempfile, pathlib
>>> from semframe.backends.fake import FakeBackend
>>> cal = calibrate_local(FakeBackend(), pathlib.Path(tempfile.mkdtemp()), rounds=1)
>>> cal.slots, cal.seconds_per_output_token >= 0
(1, True)
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from semframe.backends.base import Backend
from semframe.core.ordering import Ordering
from semframe.core.parse import TEXT
from semframe.core.plan import Plan, RelQuery, make_plan
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.cost.calibration import LocalCalibration, fit, machine, store_calibration
from semframe.runtime.execute import execute
from semframe.runtime.stats import RunStats

__all__ = ["calibrate_local"]


def calibrate_local(
    backend: Backend, directory: Path, *, slots: int | None = None, rounds: int = 2
) -> LocalCalibration:
    """Time short runs on a local engine, fit its speed, store it as JSON in ``directory``.

    Three kinds of small relQueries are run (long unique prompts with short
    answers, short prompts with long answers, many tiny requests), ``rounds``
    times each with different text, through the real executor at the
    backend's concurrency; a least-squares fit with non-negative coefficients
    gives seconds per uncached prompt token, per output token and per request.
    """
    workers = slots or backend.capabilities.max_concurrency
    rng = random.Random(7)
    words = [
        "river", "castle", "engine", "quiet", "storm", "garden", "silver", "market",
        "winter", "signal", "orange", "pilot", "canvas", "harbor", "violet", "thunder",
    ]  # fmt: skip
    samples: list[tuple[float, float, float, float]] = []  # (uncached, output, requests, secs)
    # (rows, words per row, max_tokens): prompt-heavy, output-heavy, request-heavy
    shapes = [(12, 80, 4), (12, 8, 32), (32, 6, 4)]

    def run(plan: Plan) -> tuple[float, RunStats]:
        start = time.perf_counter()
        _, stats = execute(plan, backend, max_concurrency=workers, progress="off")
        return time.perf_counter() - start, stats

    for rnd in range(-1, rounds):  # round -1 starts the engine and is not timed
        for rows, n_words, max_tokens in shapes if rnd >= 0 else shapes[:1]:
            texts = [
                f"{rnd}-{i}: " + " ".join(rng.choice(words) for _ in range(n_words))
                for i in range(rows)
            ]
            table = Table.from_columns({"text": texts})
            prompt = "Continue this text with a few more words of your own: {text}"
            # answers are meant to run to max_tokens: a cut answer is kept, not asked again
            spec = TEXT.with_truncated("keep")
            rq = RelQuery("map", parse_template(prompt), table, spec, None, (), max_tokens, 0.0)
            plan = make_plan(rq, Ordering.identity(rows, ("text",)), "none")
            secs, stats = run(plan)
            if rnd < 0:
                continue
            samples.append(
                (
                    float(stats.prompt_tokens - stats.cached_tokens),
                    float(stats.output_tokens),
                    float(stats.requests),
                    secs,
                )
            )
    coef = fit(samples)
    cal = LocalCalibration(
        backend.model,
        workers,
        coef[0],
        coef[1],
        coef[2],
        machine(),
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    store_calibration(directory, cal)
    return cal
