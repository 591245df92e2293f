"""Deterministic answers for the provider emulator."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Responder", "default_responder", "minimal_instance"]

#: ``(provider, model, prompt_text, schema_or_None) -> answer text``.
Responder = Callable[[str, str, str, Mapping[str, Any] | None], str]

_YES_NO = re.compile(r"\byes\b.*\bno\b|\bno\b.*\byes\b", re.IGNORECASE | re.DOTALL)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def minimal_instance(schema: Mapping[str, Any], seed: str, path: str = "") -> Any:
    """A small value valid under ``schema``, chosen deterministically from ``seed``.

    Supports ``enum``/``const``, ``object`` (every listed property), ``array``
    (``minItems`` copies), ``string``, ``integer``, ``number``, ``boolean``,
    ``null``, ``anyOf``/``oneOf`` (first branch) and ``$ref`` into ``$defs``
    (not resolved: an empty object).

    Examples
    --------
    >>> minimal_instance({"type": "object", "properties": {"n": {"type": "integer"}}}, "x")
    {'n': 0}
    """
    h = _digest(seed + "\x00" + path)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = list(schema["enum"])
        return options[h[0] % len(options)] if options else None
    for combo in ("anyOf", "oneOf", "allOf"):
        if schema.get(combo):
            return minimal_instance(schema[combo][0], seed, path)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: minimal_instance(v, seed, f"{path}/{k}") for k, v in props.items()}
    if kind == "array":
        items = schema.get("items", {"type": "string"})
        n = int(schema.get("minItems", 0))
        return [minimal_instance(items, seed, f"{path}/{i}") for i in range(n)]
    if kind == "string":
        return f"v{h.hex()[:6]}"
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0.0))
    if kind == "boolean":
        return bool(h[0] & 1)
    return None


def default_responder(
    provider: str, model: str, prompt: str, schema: Mapping[str, Any] | None
) -> str:
    """Deterministic answer text for a prompt.

    * With a JSON schema: a JSON document valid under it; enum values (such as
      ``{"answer": "yes" | "no"}``) and booleans are picked by a stable hash of
      the prompt.
    * Without one, when the prompt mentions both "yes" and "no": ``"yes"`` or
      ``"no"`` by the same hash.
    * Otherwise: ``"Answer <6 hex digits>: "`` followed by the first words of
      the prompt's last line.

    The provider and model are not used; they are there for custom responders.

    Examples
    --------
    >>> default_responder("openai", "gpt-4o-mini", "Is it good? Answer yes or no.", None)
    'no'
    >>> default_responder("openai", "m", "Summarize: the cat sat", None)
    'Answer 256f8b: Summarize: the cat sat'
    >>> import json
    >>> s = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}}
    >>> json.loads(default_responder("anthropic", "m", "Q", s))
    {'answer': 'yes'}
    """
    import json

    h = _digest(prompt)
    if schema is not None:
        return json.dumps(minimal_instance(schema, prompt))
    if _YES_NO.search(prompt):
        return "yes" if h[0] & 1 else "no"
    lines = [ln for ln in prompt.splitlines() if ln.strip()]
    words = (lines[-1] if lines else "").split()[:8]
    return f"Answer {h.hex()[:6]}: {' '.join(words)}".strip()
