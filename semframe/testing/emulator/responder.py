"""Deterministic answers for the provider emulator."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from semframe.core.parse import minimal_instance

__all__ = ["Responder", "default_responder", "minimal_instance"]

#: ``(provider, model, prompt_text, schema_or_None) -> answer text``.
Responder = Callable[[str, str, str, Mapping[str, Any] | None], str]

_YES_NO = re.compile(r"\byes\b.*\bno\b|\bno\b.*\byes\b", re.IGNORECASE | re.DOTALL)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


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
