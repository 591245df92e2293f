"""Offline token counting (semframe.cost.tokens)."""

from __future__ import annotations

import pytest

from semframe.cost import tokens
from semframe.errors import ConfigError

TEXTS = [
    "hello world",
    "Is this review positive about Alien (1979)? Answer yes or no.",
    "  spaces\tand\nnewlines\r\n  ",
    "naïve café — 東京 🚀 12345678",
    "<|endoftext|> is encoded as text",
    "",
]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_matches_quicktok_byte_for_byte(name: str) -> None:
    quicktok = pytest.importorskip("quicktok")
    ref = quicktok.get_encoding(name)
    for text in TEXTS:
        if "<|" in text:
            continue  # quicktok refuses special-token text, like tiktoken's encode()
        assert tokens.encoding(name).encode_ordinary(text) == list(ref.encode(text))


def test_known_counts_and_round_trip() -> None:
    assert tokens.encode("hello world", "cl100k_base") == [15339, 1917]
    assert tokens.encode("hello world") == [24912, 2375]
    for text in TEXTS:
        assert tokens.encoding().decode(tokens.encode(text)) == text
    assert tokens.count(TEXTS[:2]) == [2, 15]


def test_encoding_is_cached_per_process() -> None:
    assert tokens.encoding("o200k_base") is tokens.encoding("o200k_base")


def test_unknown_encoding_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="cl100k_base, o200k_base"):
        tokens.encoding("p50k_base")


@pytest.mark.parametrize(
    ("model", "enc", "exact"),
    [
        ("gpt-4o", "o200k_base", True),
        ("gpt-4o-mini-2024-07-18", "o200k_base", True),
        ("gpt-4.1-nano", "o200k_base", True),
        ("gpt-5-mini", "o200k_base", True),
        ("o3", "o200k_base", True),
        ("o4-mini", "o200k_base", True),
        ("gpt-4", "cl100k_base", True),
        ("gpt-4-turbo", "cl100k_base", True),
        ("gpt-3.5-turbo", "cl100k_base", True),
        ("openai/gpt-4o", "o200k_base", True),
        ("claude-sonnet-4-5", "o200k_base", False),
        ("mystery-model", "o200k_base", False),
    ],
)
def test_model_to_encoding(model: str, enc: str, exact: bool) -> None:
    choice = tokens.encoding_name_for_model(model)
    assert (choice.encoding, choice.exact) == (enc, exact)
    assert (choice.note is None) == exact
    assert tokens.encoding_for_model(model).name == enc


def test_claude_counts_are_flagged_approximate() -> None:
    c = tokens.count_for_model(["hello world", "abc"], "claude-haiku-4-5")
    assert not c.exact
    assert c.note is not None and "approximat" in c.note
    assert c.tokens == tuple(tokens.count(["hello world", "abc"]))
    assert c.total == sum(c.tokens)


def test_missing_quicktok_gives_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from semframe.errors import MissingDependencyError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'semframe\[openai\]'"):
        tokens._quicktok_data_dir()
