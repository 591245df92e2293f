"""The ``semframe`` command: ``cache info|clear``, ``serve`` and ``vllm-model``.

``semframe --version`` prints the version; ``semframe`` alone prints the help.
``semframe serve`` starts a vLLM OpenAI-compatible server with our scheduler
(:mod:`semframe.serving.vllm.serve`); ``semframe vllm-model NAME`` converts a known
model for vLLM ahead of time and prints its directory.

The cache folder is the ``cache_dir`` setting (``SEMFRAME_CACHE_DIR``, a
``semframe.toml``), or ``--cache-dir``. Nothing is created by ``info``, except
the fresh file that replaces a damaged one: on a damaged file both actions
first say where it was moved and how many answers were salvaged from it.
``info`` works on a read-only cache; ``clear`` there (or while another process
holds the write lock) exits with 1 and says why.

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
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from semframe._version import __version__
from semframe.cache.store import FILENAME, ResultCache
from semframe.config import cache_dir, config
from semframe.serving.vllm.convert import model_dir
from semframe.serving.vllm.serve import serve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semframe", description="semframe: LLMs inside DataFrames."
    )
    parser.add_argument(
        "--version", action="version", version=f"semframe {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    serve = commands.add_parser(
        "serve",
        help="a vLLM OpenAI-compatible server with semframe's scheduler",
        description="Start a vLLM OpenAI-compatible server whose scheduler is semframe's "
        "(clients: backend='vllm', base_url='http://HOST:PORT/v1', model=NAME).",
    )
    serve.add_argument("--model", default="smollm2-135m", help="known name or HF directory")
    serve.add_argument("--served-name", help="model name clients send (default: --model)")
    serve.add_argument(
        "--scheduler",
        default="relserve",
        choices=("relserve", "k-lpm", "lpm", "static", "fcfs"),
        help="admission policy (default: relserve)",
    )
    serve.add_argument("--k", type=int, help="k of k-LPM (default 2)")
    serve.add_argument(
        "--cost",
        metavar="JSON",
        help="RelServe's calibrated cost: a calibration or calibrate_vllm's engine model file",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--kv-cache-gib", type=float, help="KV cache size in GiB")
    serve.add_argument("--max-model-len", type=int, help="context length")
    serve.add_argument("--trace", metavar="FILE", help="scheduler trace, one JSON line per step")
    serve.add_argument(
        "--vllm-arg",
        action="append",
        metavar="ARG",
        help="extra vLLM server argument, repeatable (--vllm-arg=--max-num-seqs=64)",
    )
    convert = commands.add_parser(
        "vllm-model",
        help="convert a known model for vLLM once and print its directory",
    )
    convert.add_argument("name", help="known model name (smollm2-135m)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``semframe`` command line; returns the exit status.

    With no command it prints the help and returns 0; ``--version`` (and
    ``--help``) print and exit with 0, as argparse does.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "serve":
        return serve(args)
    if args.command == "vllm-model":
        print(model_dir(args.name))
        return 0
    folder = args.cache_dir
    if folder is None:
        folder = config()["cache_dir"]
    path = cache_dir(folder) / FILENAME
    return _cache(args.action, path, getattr(args, "older_than", None))


def _cache(action: str, path: Path, older_than: float | None) -> int:
    if not path.exists():
        verb = "nothing to clear" if action == "clear" else "no result cache yet"
        print(f"{verb} at {path}")
        return 0
    if older_than is not None and older_than < 0:
        print(f"--older-than must be >= 0 days, got {older_than}", file=sys.stderr)
        return 2
    try:
        cache = ResultCache(path)
    except (OSError, sqlite3.Error) as exc:
        print(f"cannot open the result cache at {path}: {exc}", file=sys.stderr)
        return 1
    with cache:
        try:
            if action == "info":
                info = cache.info()
            else:
                removed = cache.clear(older_than)
        except sqlite3.Error as exc:
            _report(cache)
            print(_cannot(action, cache, exc), file=sys.stderr)
            return 1
    _report(cache)
    if action == "info":
        print(info)
        return 0
    what = f" not used for {older_than:g} days" if older_than is not None else ""
    print(f"removed {removed:,} answers{what} from {path}")
    return 0


def _report(cache: ResultCache) -> None:
    """Say what was done about a damaged file, if anything."""
    if cache.recovered is not None:
        print(f"{cache.recovered}.")


def _cannot(action: str, cache: ResultCache, exc: sqlite3.Error) -> str:
    what = "read" if action == "info" else "clear"
    if cache.read_only:
        return (
            f"cannot {what} {cache.path}: it is read-only; make its folder and file "
            "writable and run this again"
        )
    if "locked" in str(exc):
        return (
            f"cannot {what} {cache.path}: another process holds its write lock ({exc}); "
            "run this again when it has finished"
        )
    return f"cannot {what} {cache.path}: {exc}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
