"""Measuring a local engine's speed, for the estimator's wall times.

:func:`calibrate_local` times short runs through the real executor and fits
seconds per uncached prompt token, per output token and per request
(:func:`semframe.cost.calibration.fit`); the fit is stored for this machine,
model and slot count, where the estimator finds it. ``semframe.calibrate_local()``
calibrates the local backend as the settings configure it, in the configured
cache directory: the call an uncalibrated estimate advises.

Examples
--------
>>> import tempfile, pathlib
>>> from semframe.backends.fake import FakeBackend
>>> cal = calibrate_local(FakeBackend(), pathlib.Path(tempfile.mkdtemp()), rounds=1)
>>> cal.slots, cal.seconds_per_output_token >= 0
(1, True)
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from semframe.backends import get_backend
from semframe.backends.base import Backend
from semframe.config import cache_dir, config
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
    backend: Backend | str = "local",
    directory: str | os.PathLike[str] | None = None,
    *,
    slots: int | None = None,
    rounds: int = 2,
    **settings: Any,
) -> LocalCalibration:
    """Time short runs on a local engine, fit its speed, store it as JSON in ``directory``.

    Three kinds of small relQueries are run (long unique prompts with short
    answers, short prompts with long answers, many tiny requests), ``rounds``
    times each with different text, through the real executor at ``slots``
    requests at once; a least-squares fit with non-negative coefficients
    gives seconds per uncached prompt token, per output token and per request.
    An estimate finds the fit when it runs the same model with as many slots
    (the engine's, or fewer for a call of fewer rows or a lower
    ``max_concurrency``): its note names the call to make when it finds none.

    Parameters
    ----------
    backend : Backend or str
        The engine to time, or the name of a backend to build from the
        settings (default ``"local"``: llama.cpp, as configured).
    directory : path, optional
        Where to store the fit (default: the configured cache directory, where
        estimates look).
    slots : int, optional
        Requests at once (default: the backend's concurrency). A backend built
        here from its name gets at least as many engine slots
        (``local_parallel``).
    rounds : int
        Timed rounds of each kind of relQuery.
    **settings
        Settings for a backend built here (``model=``, ``local_threads=``...),
        as a call argument gives them; the rest come from ``configure()``,
        ``SEMFRAME_*`` and ``semframe.toml``.

    Returns
    -------
    LocalCalibration
        The fit, as stored.

    Examples
    --------
    >>> import semframe, tempfile
    >>> cal = semframe.calibrate_local("fake", rounds=1, cache_dir=tempfile.mkdtemp())
    >>> cal.model, cal.slots
    ('fake-model', 1)
    """
    if isinstance(backend, str):
        cfg = config(backend=backend, **settings)
        if slots is not None and slots > cfg["local_parallel"]:
            cfg = config(**{**settings, "backend": backend, "local_parallel": slots})
        engine = get_backend(cfg["backend"], model=cfg["model"], settings=cfg)
    else:
        cfg = config(**settings)
        engine = backend
    where = cache_dir(cfg["cache_dir"]) if directory is None else Path(directory)
    workers = slots or engine.capabilities.max_concurrency
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
        _, stats = execute(plan, engine, max_concurrency=workers, progress="off")
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
        engine.model,
        workers,
        coef[0],
        coef[1],
        coef[2],
        machine(),
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    store_calibration(where, cal)
    return cal
