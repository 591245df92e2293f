"""The package's layering, read from its own imports (nothing is run).

The folders are the architecture (``docs/architecture.md``): each package may
import only from the layers below it, never an internal module inside a
function, and no two modules import each other in a cycle. A backend is never
recognised by its name outside ``semframe/backends``, and no production module
imports the test doubles under ``semframe/testing``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "semframe"

LAYERS = [
    "base",  # errors, _version
    "core",
    "reorder",
    "serving",
    "cost",
    "config",
    "backends",
    "cache",
    "runtime",
    "operators",
    "api",  # semframe/__init__, accessor, cli
]
"""Bottom to top: a module may import from its own layer and the ones below."""
TOP_LEVEL = {
    "errors": "base",
    "_version": "base",
    "config": "config",
    "__init__": "api",
    "__main__": "api",  # python -m semframe
    "accessor": "api",
    "cli": "api",
    "ray": "api",  # semframe.ray: the operators over a ray.data.Dataset (one module)
}
TESTING = "testing"  # test doubles: may import anything but the api; nothing imports them


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    if len(parts) == 2 and parts[1] in TOP_LEVEL:
        return TOP_LEVEL[parts[1]]
    return parts[1]


def _owner(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, inside a function, line) for every internal import."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function = {
            id(node)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(fn)
        }
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                # ``from pkg import sub`` imports the submodule; ``from mod import name``, mod
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                    for a in node.names
                ]
            owners = {_owner(t) for t in targets if t.startswith("semframe")} - {None, module}
            for owner in owners:
                if owner is not None and not (is_package and owner.startswith(module + ".")):
                    found.append((module, owner, id(node) in in_function, node.lineno))
    return found


IMPORTS = _imports()


def test_every_module_has_a_layer() -> None:
    unknown = {m for m in MODULES if _layer(m) not in (*LAYERS, TESTING)}
    assert not unknown, f"modules outside the known layers: {sorted(unknown)}"


def test_imports_go_down_the_layers() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for importer, imported, _, line in IMPORTS:
        a, b = _layer(importer), _layer(imported)
        allowed = b != "api" if a == TESTING else b != TESTING and rank[a] >= rank[b]
        if not allowed:
            upward.append(f"{importer}:{line} ({a}) imports {imported} ({b})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_internal_import_inside_a_function() -> None:
    inside = [f"{a}:{line} imports {b}" for a, b, in_fn, line in IMPORTS if in_fn]
    assert not inside, "imports inside functions:\n" + "\n".join(inside)


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for importer, imported, _, _ in IMPORTS:
        if importer != "semframe":  # the package re-exports its public names
            graph[importer].add(imported)
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in seen and (cycle := visit(nxt, [*path, node])) is not None:
                return cycle
        seen[node] = 2
        return None

    for start in sorted(graph):
        if start not in seen and (cycle := visit(start, [])) is not None:
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_at_most_ten_modules_at_the_top_level() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


_NAME_CHECK = re.compile(
    r"""(==|!=|\bin)\s*\(?\s*["'](openai|anthropic|vllm|local|fake|gemini)["']"""
)


def test_no_backend_is_recognised_by_name_outside_backends() -> None:
    found = []
    for module, path in MODULES.items():
        if _layer(module) in ("backends", TESTING) or module == "semframe.config":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _NAME_CHECK.search(line) and "backend" in line:
                found.append(f"{module}:{i}: {line.strip()}")
    assert not found, "backend names compared outside backends/:\n" + "\n".join(found)
