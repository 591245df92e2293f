"""Where semframe keeps files: one user cache directory (nothing is written at import).

The ``cache_dir`` setting chooses it (:mod:`semframe.config`); the result
cache, pending batches, engine calibrations and converted models live under it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(configured: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory, which is not created here.

    ``configured`` when given, else ``$XDG_CACHE_HOME/semframe``, else
    ``~/.cache/semframe``.

    Examples
    --------
    >>> cache_dir("/tmp/sf").as_posix()
    '/tmp/sf'
    """
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "semframe"
