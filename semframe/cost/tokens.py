"""Offline token counting for the API backends, the estimator and the emulator.

``tiktoken`` downloads its BPE files on first use, which fails without network.
The ``quicktok-v1`` package ships the same vocabularies in a compact binary form
(``quicktok/data/{cl100k,o200k}.vocab``: a little-endian ``u32`` count, then per
entry a ``u16`` length, the token bytes and a ``u32`` rank). This module reads
those ranks and builds a :class:`tiktoken.Encoding` from them directly, with
tiktoken's official split pattern and special tokens. Nothing is downloaded,
no file or environment variable is written, and the first load checks that the
ranks are a byte-exact copy of OpenAI's published file (same SHA-256 as the one
``tiktoken`` itself pins).

Encodings are built lazily, once per process (about half a second each).

Anthropic publishes no tokenizer. For Claude models :func:`count_for_model`
returns ``o200k_base`` counts flagged ``exact=False``; Claude's own counts differ
(typically by 5-20% on English prose). Google publishes no offline Gemini
tokenizer either (its ``countTokens`` needs the network): Gemini counts are
``o200k_base`` counts flagged the same way. The provider emulator uses
``o200k_base`` for every provider, so estimates against the emulator are exact.

Examples
--------
>>> count(["hello world", "Is this review positive?"])
[2, 5]
>>> encoding_name_for_model("gpt-4.1-mini").encoding
'o200k_base'
>>> encoding_name_for_model("gpt-3.5-turbo").encoding
'cl100k_base'
>>> choice = encoding_name_for_model("claude-sonnet-4-5")
>>> choice.exact, choice.encoding
(False, 'o200k_base')
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from semframe.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "ENCODINGS",
    "EncodingChoice",
    "TokenCounts",
    "count",
    "count_for_model",
    "encode",
    "encoding",
    "encoding_for_model",
    "encoding_name_for_model",
]

_INSTALL = "pip install 'semframe[openai]'"

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"

# Split patterns and special tokens copied from tiktoken_ext/openai_public.py.
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True)
class _Spec:
    vocab_file: str
    sha256: str  # of the official .tiktoken file, as pinned by tiktoken
    pat_str: str
    special_tokens: tuple[tuple[str, int], ...]


_SPECS: dict[str, _Spec] = {
    "cl100k_base": _Spec(
        "cl100k.vocab",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        (
            (_ENDOFTEXT, 100257),
            (_FIM_PREFIX, 100258),
            (_FIM_MIDDLE, 100259),
            (_FIM_SUFFIX, 100260),
            (_ENDOFPROMPT, 100276),
        ),
    ),
    "o200k_base": _Spec(
        "o200k.vocab",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        ((_ENDOFTEXT, 199999), (_ENDOFPROMPT, 200018)),
    ),
}

#: Encoding names this module can build offline.
ENCODINGS: tuple[str, ...] = tuple(_SPECS)

_LOCK = threading.Lock()
_CACHE: dict[str, tiktoken.Encoding] = {}


def _quicktok_data_dir() -> Path:
    # find_spec locates the package without importing it (quicktok's import
    # loads a native library and sets global state we do not need).
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        msg = f"offline token counting needs the 'quicktok-v1' package; install it with {_INSTALL}"
        raise MissingDependencyError(msg)
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _read_ranks(path: Path) -> dict[bytes, int]:
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, 0)
    off = 4
    ranks: dict[bytes, int] = {}
    for _ in range(n):
        (length,) = struct.unpack_from("<H", data, off)
        off += 2
        token = data[off : off + length]
        off += length
        (rank,) = struct.unpack_from("<I", data, off)
        off += 4
        ranks[token] = rank
    if off != len(data):
        msg = f"{path} is not a quicktok vocabulary file ({len(data) - off} trailing bytes)"
        raise MissingDependencyError(msg)
    return ranks


def _official_sha256(ranks: dict[bytes, int]) -> str:
    """SHA-256 of the ``.tiktoken`` file these ranks would be written as."""
    ordered = sorted(ranks.items(), key=lambda kv: kv[1])
    text = b"".join(base64.b64encode(tok) + b" %d\n" % rank for tok, rank in ordered)
    return hashlib.sha256(text).hexdigest()


def _build(name: str) -> tiktoken.Encoding:
    try:
        import tiktoken
    except ImportError:
        msg = f"token counting needs the 'tiktoken' package; install it with {_INSTALL}"
        raise MissingDependencyError(msg) from None
    spec = _SPECS[name]
    path = _quicktok_data_dir() / spec.vocab_file
    if not path.is_file():
        msg = f"{path} is missing; reinstall quicktok-v1 with {_INSTALL}"
        raise MissingDependencyError(msg)
    ranks = _read_ranks(path)
    digest = _official_sha256(ranks)
    if digest != spec.sha256:
        msg = (
            f"{path} does not match OpenAI's {name} vocabulary "
            f"(sha256 {digest}, expected {spec.sha256}); reinstall with {_INSTALL}"
        )
        raise MissingDependencyError(msg)
    return tiktoken.Encoding(
        name=name,
        pat_str=spec.pat_str,
        mergeable_ranks=ranks,
        special_tokens=dict(spec.special_tokens),
    )


def encoding(name: str = "o200k_base") -> tiktoken.Encoding:
    """The tiktoken encoding ``name``, built offline and cached per process.

    Parameters
    ----------
    name : str
        ``"o200k_base"`` (GPT-4o, GPT-4.1, GPT-5, o-series) or ``"cl100k_base"``
        (GPT-4, GPT-3.5).

    Returns
    -------
    tiktoken.Encoding
        Byte-exact with ``tiktoken.get_encoding(name)``.

    Raises
    ------
    ConfigError
        For an unknown encoding name.
    MissingDependencyError
        When tiktoken or quicktok-v1 is not installed.

    Examples
    --------
    >>> enc = encoding("cl100k_base")
    >>> enc.encode("hello world")
    [15339, 1917]
    """
    enc = _CACHE.get(name)
    if enc is not None:
        return enc
    if name not in _SPECS:
        msg = f"unknown encoding {name!r}; known encodings: {', '.join(ENCODINGS)}"
        raise ConfigError(msg)
    with _LOCK:
        enc = _CACHE.get(name)
        if enc is None:
            enc = _build(name)
            _CACHE[name] = enc
    return enc


def encode(text: str, name: str = "o200k_base") -> list[int]:
    """Token ids of ``text`` (special-token text is encoded as ordinary text).

    Examples
    --------
    >>> encode("hello world")
    [24912, 2375]
    """
    return encoding(name).encode_ordinary(text)


def count(texts: Sequence[str], name: str = "o200k_base") -> list[int]:
    """Number of tokens of each text under encoding ``name``.

    Examples
    --------
    >>> count(["a b c", ""], "cl100k_base")
    [3, 0]
    """
    enc = encoding(name)
    return [len(enc.encode_ordinary(t)) for t in texts]


@dataclass(frozen=True)
class EncodingChoice:
    """Which encoding counts tokens for a model, and how exactly.

    Attributes
    ----------
    model : str
        The model name asked about.
    encoding : str
        Encoding name (one of :data:`ENCODINGS`).
    exact : bool
        True when the provider tokenizes with exactly this encoding.
    note : str or None
        Why the count is approximate, when it is.
    """

    model: str
    encoding: str
    exact: bool
    note: str | None = None


_CL100K_MODELS = re.compile(r"^(gpt-4(?!o|\.\d|-?o)|gpt-4-turbo|gpt-3\.5|text-embedding-(3|ada))")
_O200K_MODELS = re.compile(r"^(gpt-4o|gpt-4\.\d|gpt-5|chatgpt-4o|o\d|gpt-oss|codex)")


def encoding_name_for_model(model: str) -> EncodingChoice:
    """The encoding a model's prompts are counted with.

    GPT-4o, GPT-4.1, GPT-5 and the o-series use ``o200k_base``; GPT-4 and
    GPT-3.5 use ``cl100k_base``. Claude and Gemini models get ``o200k_base``
    with ``exact=False`` (neither provider publishes an offline tokenizer); any
    other model gets
    ``o200k_base`` with a note saying it was a guess.

    Examples
    --------
    >>> encoding_name_for_model("o4-mini").encoding
    'o200k_base'
    >>> encoding_name_for_model("my-finetune").note
    "unknown model 'my-finetune': counted with o200k_base"
    """
    name = model.lower().rsplit("/", 1)[-1]
    if name.startswith("ft:"):
        name = name[3:]
    if _O200K_MODELS.match(name):
        return EncodingChoice(model, "o200k_base", True)
    if _CL100K_MODELS.match(name):
        return EncodingChoice(model, "cl100k_base", True)
    if name.startswith("claude"):
        note = (
            "Anthropic publishes no tokenizer: Claude token counts are approximated "
            "with o200k_base (Claude's own counts are typically 5-20% higher)"
        )
        return EncodingChoice(model, "o200k_base", False, note)
    if name.startswith("gemini"):
        note = (
            "Google publishes no offline Gemini tokenizer: Gemini token counts are "
            "approximated with o200k_base (Gemini's own counts differ)"
        )
        return EncodingChoice(model, "o200k_base", False, note)
    return EncodingChoice(
        model, "o200k_base", False, f"unknown model {model!r}: counted with o200k_base"
    )


def encoding_for_model(model: str) -> tiktoken.Encoding:
    """The encoding for ``model`` (see :func:`encoding_name_for_model`).

    Examples
    --------
    >>> encoding_for_model("gpt-4o").name
    'o200k_base'
    """
    return encoding(encoding_name_for_model(model).encoding)


@dataclass(frozen=True)
class TokenCounts:
    """Token counts of several texts for one model.

    Attributes
    ----------
    tokens : tuple of int
        One count per text.
    encoding : str
        Encoding used.
    exact : bool
        False for approximate counts (Claude, unknown models).
    note : str or None
        Why the counts are approximate.
    """

    tokens: tuple[int, ...]
    encoding: str
    exact: bool
    note: str | None = None

    @property
    def total(self) -> int:
        """Sum of :attr:`tokens`."""
        return sum(self.tokens)


def count_for_model(texts: Sequence[str], model: str) -> TokenCounts:
    """Token counts for ``model``, flagged approximate where they are.

    Claude counts are **approximate**: ``o200k_base`` counts, since Anthropic has
    no public tokenizer (its ``count_tokens`` endpoint needs the network).

    Examples
    --------
    >>> c = count_for_model(["hello world"], "claude-haiku-4-5")
    >>> c.tokens, c.exact
    ((2,), False)
    """
    choice = encoding_name_for_model(model)
    return TokenCounts(
        tuple(count(texts, choice.encoding)), choice.encoding, choice.exact, choice.note
    )
