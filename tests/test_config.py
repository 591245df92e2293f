from __future__ import annotations

import importlib
import pickle
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


def _line(cfg: object, key: str) -> str:
    """The listing's line for setting ``key``, its runs of spaces made one."""
    line = next(line for line in repr(cfg).splitlines() if line.split(" = ")[0].strip() == key)
    return re.sub(" +", " ", line)


@pytest.mark.parametrize("backend", ["local", "openai", "anthropic", "gemini", "vllm", "fake"])
def test_listing_names_the_model_the_backend_runs(backend: str) -> None:
    default = importlib.import_module(f"semframe.backends.{backend}").DEFAULT_MODEL
    cfg = semframe.config(backend=backend)
    assert cfg["model"] is None and cfg.sources["model"] == "default"  # the setting itself
    assert cfg.effective["model"] == default
    line = _line(cfg, "model")
    assert f"= {default!r}" in line
    assert line.endswith(f"# default: the {backend!r} backend's model")


def test_listing_model_from_each_layer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "semframe.toml").write_text('backend = "openai"\n')
    cfg = semframe.config()
    assert _line(cfg, "backend").endswith(f"# {tmp_path / 'semframe.toml'}")
    assert "'gpt-4.1-mini'" in _line(cfg, "model")
    monkeypatch.setenv("SEMFRAME_MODEL", "gpt-5")
    assert _line(semframe.config(), "model").endswith("= 'gpt-5' # SEMFRAME_MODEL")
    semframe.configure(model="gpt-4o")
    assert _line(semframe.config(), "model").endswith("# semframe.configure()")
    with semframe.using(model="gpt-4.1"):
        cfg = semframe.config()
    assert cfg.effective["model"] == "gpt-4.1"
    assert "'gpt-4.1'" in _line(cfg, "model") and _line(cfg, "model").endswith("# semframe.using()")


def test_listing_where_nothing_names_the_model() -> None:
    # A vLLM server has no default model (model= names what it serves) ...
    cfg = semframe.config(backend="vllm", base_url="http://127.0.0.1:8000/v1")
    assert cfg.effective["model"] is None
    assert _line(cfg, "model").endswith("= None # default: the backend's default")
    # ... an unknown name is shown as given (a call with it fails, naming the valid ones).
    assert semframe.config(backend="nosuch").effective["model"] is None


def test_listing_shows_the_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = semframe.config()  # tests set SEMFRAME_CACHE_DIR
    folder = str(tmp_path / "cache")
    assert cfg.effective["cache_dir"] == folder
    assert _line(cfg, "cache_dir").endswith(f"= {folder!r} # SEMFRAME_CACHE_DIR")
    monkeypatch.delenv("SEMFRAME_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cfg = semframe.config()
    assert cfg["cache_dir"] is None and cfg.effective["cache_dir"] == str(
        tmp_path / "xdg" / "semframe"
    )
    assert _line(cfg, "cache_dir").endswith("# default: $XDG_CACHE_HOME/semframe")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = semframe.config()
    assert cfg.effective["cache_dir"] == str(tmp_path / "home" / ".cache" / "semframe")
    assert _line(cfg, "cache_dir").endswith("# default: ~/.cache/semframe")
    cfg = semframe.config(cache_dir="~/elsewhere")
    assert cfg["cache_dir"] == "~/elsewhere"
    assert cfg.effective["cache_dir"] == str(tmp_path / "home" / "elsewhere")
    assert _line(cfg, "cache_dir").endswith("# call argument")


def test_listing_says_what_a_none_stands_for() -> None:
    cfg = semframe.config()
    assert _line(cfg, "max_concurrency").endswith("# default: the backend's own limit")
    assert _line(cfg, "rpm").endswith("# default: no limit")
    assert _line(cfg, "client").endswith("# default")  # nothing more to say
    assert _line(semframe.config(rpm=60), "rpm").endswith("= 60 # call argument")


def test_resolved_settings_survive_pickling() -> None:
    cfg = semframe.config(backend="openai")
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and dict(back.sources) == dict(cfg.sources)
    assert back.effective == cfg.effective and repr(back) == repr(cfg)
