"""Measured speed of a local engine: the fit, and where it is stored.

:func:`semframe.runtime.calibrate.calibrate_local` times short runs through the
executor; this module fits them (:func:`fit`), stores the result as JSON in the
cache directory (one file per machine, model and slot count) and loads it for
the estimator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["LocalCalibration", "fit", "load_calibration", "machine", "store_calibration"]


@dataclass(frozen=True)
class LocalCalibration:
    """Measured speed of a local engine: ``wall = a * uncached_prompt + b * output + c * requests``.

    Attributes
    ----------
    model : str
        Engine model.
    slots : int
        Slots the calibration ran with (the fit holds for this concurrency).
    seconds_per_prompt_token, seconds_per_output_token, seconds_per_request : float
        The fitted coefficients (seconds of wall time with all slots busy).
    machine : str
        Where it was measured.
    measured_at : str
        When (ISO time).
    """

    model: str
    slots: int
    seconds_per_prompt_token: float
    seconds_per_output_token: float
    seconds_per_request: float
    machine: str
    measured_at: str

    def wall(self, uncached_prompt: float, output: float, requests: int) -> float:
        """Expected wall seconds."""
        return (
            self.seconds_per_prompt_token * uncached_prompt
            + self.seconds_per_output_token * output
            + self.seconds_per_request * requests
        )


def machine() -> str:
    """The machine as calibrations name it (host, architecture, cores)."""
    return f"{platform.node()}|{platform.machine()}|{os.cpu_count()}"


def _calibration_path(directory: Path, model: str, slots: int) -> Path:
    key = hashlib.sha256(f"{machine()}|{model}|{slots}".encode()).hexdigest()[:16]
    return directory / "estimator" / f"local-{key}.json"


def load_calibration(directory: Path, model: str, slots: int) -> LocalCalibration | None:
    """The stored calibration for this machine, model and slot count, if any."""
    path = _calibration_path(directory, model, slots)
    try:
        data = json.loads(path.read_text("utf-8"))
        return LocalCalibration(**data)
    except (OSError, ValueError, TypeError):
        return None


def store_calibration(directory: Path, calibration: LocalCalibration) -> Path:
    """Write ``calibration`` where :func:`load_calibration` finds it; returns the path."""
    path = _calibration_path(directory, calibration.model, calibration.slots)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(calibration), indent=1), "utf-8")
    return path


def fit(samples: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """Least squares ``y ~ x1 a + x2 b + x3 c`` with ``a, b, c >= 0`` (tiny active-set search).

    ``samples`` are ``(uncached prompt tokens, output tokens, requests, seconds)``.

    Examples
    --------
    >>> fit([(1, 0, 1, 3), (2, 0, 1, 5), (0, 1, 1, 2), (0, 2, 1, 3)])
    (2.0, 1.0, 1.0)
    """
    x = np.array([s[:3] for s in samples], dtype=float)
    y = np.array([s[3] for s in samples], dtype=float)
    best: tuple[float, tuple[float, float, float]] | None = None
    for k in (3, 2, 1):
        for cols in itertools.combinations(range(3), k):
            sol, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (sol < 0).any():
                continue
            full = [0.0, 0.0, 0.0]
            for c, v in zip(cols, sol, strict=True):
                full[c] = float(v)
            err = float(((x @ np.array(full) - y) ** 2).sum())
            if best is None or err < best[0] - 1e-12:
                best = (err, (round(full[0], 12), round(full[1], 12), round(full[2], 12)))
    return best[1] if best else (0.0, 0.0, 0.0)
