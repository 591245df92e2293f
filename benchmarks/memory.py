"""Peak memory of one step of a benchmark process (Linux; glibc for the heap).

A step's peak is the kernel's peak resident size (``VmHWM``) from the step's
start, above the resident size at its start. Before the start, the C heap's
(and Arrow's memory pool's) free memory is given back to the system:
otherwise the step reuses memory that earlier work freed (building the input
table), still counted as resident at the start, and its peak reads low.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import sys


def status_bytes(field: str) -> int:
    """``VmRSS``, ``VmHWM`` (the peak since :func:`start`) or another ``/proc`` field, bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def start() -> bool:
    """Collect, give the heap's free memory back, restart ``VmHWM``; whether it could.

    Arrow's memory pool (pyarrow's own allocator) is asked to give back what it
    keeps too: a step reusing it would not grow either.
    """
    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: the peak may read low
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_mb_since_start(resident_at_start: int) -> float:
    """The peak since :func:`start` above ``resident_at_start`` (bytes), MB; NaN off Linux."""
    peak = status_bytes("VmHWM")
    return (peak - resident_at_start) / 1e6 if peak else math.nan
