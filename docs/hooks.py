"""MkDocs hook: every package README under ``semframe/`` becomes a docs page.

``semframe/core/README.md`` is published as ``packages/core.md``,
``semframe/operators/cascade/README.md`` as ``packages/operators.cascade.md``:
the READMEs stay next to the code they describe and the site shows them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PACKAGE = Path(__file__).resolve().parents[1] / "semframe"


def on_files(files: Files, config: Any) -> Files:
    """Add one generated page per package README."""
    for readme in sorted(PACKAGE.rglob("README.md")):
        name = ".".join(readme.parent.relative_to(PACKAGE).parts)
        text = readme.read_text(encoding="utf-8")
        files.append(File.generated(config, f"packages/{name}.md", content=text))
    return files
