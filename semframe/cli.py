"""The ``semframe`` command: ``semframe cache info`` and ``semframe cache clear``.

The cache folder is the ``cache_dir`` setting (``SEMFRAME_CACHE_DIR``, a
``semframe.toml``), or ``--cache-dir``. Nothing is created by ``info``.

Examples
--------
>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> main(["cache", "info", "--cache-dir", folder])  # doctest: +ELLIPSIS
no result cache yet at .../results.sqlite
0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from semframe._paths import cache_dir
from semframe.cache import FILENAME, ResultCache


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semframe", description="semframe: LLMs inside DataFrames."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cache = commands.add_parser("cache", help="the persistent result cache")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("info", "where the cache is, its size and entries per model"),
        ("clear", "delete stored answers"),
    ):
        sub = actions.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--cache-dir",
            metavar="DIR",
            help="cache folder (default: the cache_dir setting)",
        )
        if name == "clear":
            sub.add_argument(
                "--older-than",
                type=float,
                metavar="DAYS",
                help="only answers not used for DAYS days",
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``semframe`` command line; returns the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).
    """
    args = _parser().parse_args(argv)
    folder = args.cache_dir
    if folder is None:
        from semframe.config import config

        folder = config()["cache_dir"]
    path = cache_dir(folder) / FILENAME
    return _cache(args.action, path, getattr(args, "older_than", None))


def _cache(action: str, path: Path, older_than: float | None) -> int:
    if not path.exists():
        verb = "nothing to clear" if action == "clear" else "no result cache yet"
        print(f"{verb} at {path}")
        return 0
    with ResultCache(path) as cache:
        if action == "info":
            print(cache.info())
            return 0
        if older_than is not None and older_than < 0:
            print(f"--older-than must be >= 0 days, got {older_than}", file=sys.stderr)
            return 2
        removed = cache.clear(older_than)
    what = f" not used for {older_than:g} days" if older_than is not None else ""
    print(f"removed {removed:,} answers{what} from {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
