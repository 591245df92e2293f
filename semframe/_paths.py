"""Where semframe keeps files: one user cache directory (nothing is written at import)."""

from __future__ import annotations

import os
from pathlib import Path


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
