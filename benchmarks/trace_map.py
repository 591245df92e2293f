"""How a small ``df.llm.map`` travels through the package: module crossings and layer order.

Runs ``df.llm.map`` over 4 rows on the ``fake`` backend (result cache off, then
on, in a fresh cache directory) under a profiler hook, and counts every call
from a function of one semframe module into a function of another (a
*crossing*; a generator resumed counts as a call, as the interpreter reports
it). Each module belongs to a layer (the package it sits in); the layers are
ordered from the caller's edge down to the plain data:

    api > operators > runtime > cache > backends > config > cost > serving > reorder > core > base

(the same order ``tests/test_layers.py`` holds the imports to).

A call *re-enters* a layer when it goes into a layer that an outer frame of
the same call stack has already left for a lower one (operators -> runtime ->
operators, say). Returning is not a call and never counts. Prints a table,
writes JSON to ``benchmarks/results/trace_map.json``; ``--show`` lists every
crossing.

    python benchmarks/trace_map.py
    python benchmarks/trace_map.py --show

Target (issue "One spine"): at most 40 crossings, no re-entry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pandas as pd

import semframe

PACKAGE = Path(semframe.__file__).resolve().parent
LAYERS = [
    "api",
    "operators",
    "runtime",
    "cache",
    "backends",
    "config",
    "cost",
    "serving",
    "reorder",
    "core",
    "base",
]
"""Layers from the caller's edge down; a module's layer is the package it sits in."""
TOP_LEVEL = {
    "__init__": "api",
    "accessor": "api",
    "cli": "api",
    "config": "config",
    "errors": "base",
    "_version": "base",
}
TEMPLATE = "Summarize the review {review} of {movie} in one sentence."


def module_of(frame: FrameType) -> str | None:
    """The frame's module as a path inside the package, or None outside it."""
    path = Path(frame.f_code.co_filename)
    if not path.is_relative_to(PACKAGE):
        return None
    return path.relative_to(PACKAGE).with_suffix("").as_posix()


def layer_of(module: str) -> str:
    """The layer of a module path such as ``runtime/execute`` or ``config``."""
    head = module.split("/", 1)[0]
    if "/" not in module:
        return TOP_LEVEL.get(head, head)
    return head if head in LAYERS else f"?{head}"


def trace(df: pd.DataFrame, **settings: Any) -> dict[str, Any]:
    """Run one map under the hook; crossings and re-entries."""
    crossings: list[tuple[str, str, str, str]] = []
    reentries: list[list[str]] = []

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = module_of(frame)
        caller = module_of(frame.f_back) if frame.f_back is not None else None
        if callee is None or caller is None or callee == caller:
            return
        crossings.append((caller, frame.f_back.f_code.co_name, callee, frame.f_code.co_name))  # type: ignore[union-attr]
        path: list[str] = []
        f: FrameType | None = frame
        while f is not None:
            m = module_of(f)
            if m is not None:
                layer = layer_of(m)
                if not path or path[-1] != layer:
                    path.append(layer)
            f = f.f_back
        path.reverse()  # outermost first; the last entry is the callee's layer
        if path[-1] in path[:-1]:
            reentries.append(path)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        df.llm.map(TEMPLATE, backend="fake", out="summary", progress="off", **settings)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    by_layer: dict[str, int] = {}
    for caller, _, callee, _ in crossings:
        key = f"{layer_of(caller)} -> {layer_of(callee)}"
        by_layer[key] = by_layer.get(key, 0) + 1
    return {
        "crossings": len(crossings),
        "reentries": len(reentries),
        "by_layer": dict(sorted(by_layer.items(), key=lambda kv: -kv[1])),
        "calls": [list(c) for c in crossings],
        "reentry_paths": reentries,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--show", action="store_true", help="list every crossing")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "trace_map.json"
    )
    args = parser.parse_args()
    os.environ["SEMFRAME_CACHE_DIR"] = tempfile.mkdtemp(prefix="semframe-trace-")
    df = pd.DataFrame(
        {
            "movie": ["Up", "Up", "Heat", "Alien"],
            "review": ["fun and moving", "sweet", "long but tense", "scary"],
        },
        index=["a", "b", "c", "d"],
    )
    df.llm.map(TEMPLATE, backend="fake", cache=False, progress="off")  # imports, first calls
    results = {"cache off": trace(df, cache=False), "cache on": trace(df, cache=True)}
    print(f"{'4-row map, fake backend':<26}{'crossings':>10}{'re-entries':>12}")
    for name, r in results.items():
        print(f"{name:<26}{r['crossings']:>10}{r['reentries']:>12}")
    for name, r in results.items():
        print(f"\n{name}: crossings by layer")
        for key, count in r["by_layer"].items():
            print(f"  {key:<28}{count:>4}")
        if args.show:
            for caller, fn, callee, target in r["calls"]:
                print(f"    {caller}:{fn} -> {callee}:{target}")
        for path in r["reentry_paths"][:5]:
            print("  re-entry: " + " > ".join(path))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
