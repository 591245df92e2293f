"""Small helpers shared by several modules."""

from __future__ import annotations


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b``.

    Binary search over slice comparisons: the comparisons run in C, so this is
    fast for long prompts.

    Examples
    --------
    >>> common_prefix_len("movie: Alien\\nreview: a", "movie: Alien\\nreview: b")
    21
    >>> common_prefix_len("", "x"), common_prefix_len("ab", "ab")
    (0, 2)
    """
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
