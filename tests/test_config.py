from __future__ import annotations

import re
from pathlib import Path

import pytest

import semframe
from semframe.errors import ConfigError


def test_default_is_local() -> None:
    cfg = semframe.config()
    assert cfg["backend"] == "local"
    assert cfg.sources["backend"] == "default"


def test_precedence_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.semframe]\nbackend = "fake"\nmodel = "from-file"\nmax_retries = 7\n'
        'temperature = 0.1\nreorder = "none"\n'
    )
    cfg = semframe.config()
    assert cfg["max_retries"] == 7
    assert cfg.sources["max_retries"].endswith("pyproject.toml")
    monkeypatch.setenv("SEMFRAME_MODEL", "from-env")
    monkeypatch.setenv("SEMFRAME_MAX_RETRIES", "5")
    semframe.configure(model="from-configure", temperature=0.3)
    with semframe.using(model="from-using"):
        with semframe.using(reorder="stats"):
            cfg = semframe.config(backend="fake")
            assert cfg["model"] == "from-using"
            assert cfg["reorder"] == "stats"
        cfg = semframe.config(model="from-call")
    assert cfg["model"] == "from-call" and cfg.sources["model"] == "call argument"
    assert cfg["temperature"] == 0.3 and cfg.sources["temperature"] == "semframe.configure()"
    assert cfg["max_retries"] == 5 and cfg.sources["max_retries"] == "SEMFRAME_MAX_RETRIES"
    assert cfg["reorder"] == "none"
    assert cfg["backend"] == "fake"
    assert "from-call" in repr(cfg) and "# call argument" in repr(cfg)


def test_semframe_toml_in_parent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "semframe.toml").write_text('backend = "fake"\n')
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert semframe.config().sources["backend"] == str(tmp_path / "semframe.toml")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"bakend": "x"}, "unknown setting 'bakend' in using(). Did you mean 'backend'?"),
        ({"max_retries": -1}, "invalid value for setting 'max_retries'"),
        ({"max_concurrency": 0}, "expected a positive integer"),
        ({"progress": "sometimes"}, "valid: 'auto', 'on', 'off'"),
    ],
)
def test_bad_settings(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)), semframe.using(**kwargs):
        pass


def test_bad_env_and_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SEMFRAME_MAX_RETRIES", "many")
    with pytest.raises(ConfigError, match="environment variable SEMFRAME_MAX_RETRIES"):
        semframe.config()
    monkeypatch.delenv("SEMFRAME_MAX_RETRIES")
    (tmp_path / "semframe.toml").write_text("colour = 'blue'\n")
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        semframe.config()
    (tmp_path / "semframe.toml").write_text("not toml [")
    with pytest.raises(ConfigError, match="cannot read"):
        semframe.config()


def test_every_setting_is_in_the_configuration_page() -> None:
    """docs/configuration.md has a row for each setting (and none for a setting that is gone)."""
    from semframe.config import SETTINGS

    page = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    table = page.split("## Settings", 1)[1]
    rows = {
        name
        for cell in re.findall(r"^\| (`[^|]+`) \|", table, flags=re.MULTILINE)
        for name in re.findall(r"`([a-z_]+)`", cell)
    }
    assert set(SETTINGS) - rows == set(), "settings missing from docs/configuration.md"
    assert rows - set(SETTINGS) == set(), "docs/configuration.md lists unknown settings"
