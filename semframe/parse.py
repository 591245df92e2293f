"""Output specifications: what a relQuery's answers look like and how they parse."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from semframe.errors import SemframeError


class ParseError(SemframeError, ValueError):
    """An answer does not have the expected form."""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """How answers of a relQuery are constrained, described and parsed.

    Attributes
    ----------
    kind : str
        ``"text"`` or ``"bool"``.
    schema : mapping or None
        JSON schema sent to backends that can constrain decoding.
    instruction : str
        Output-format sentence appended to the shared instructions.
    parse : callable
        Raw answer text -> value; raises :class:`ParseError`.
    """

    kind: str
    schema: Mapping[str, Any] | None
    instruction: str
    parse: Callable[[str], Any]


def _parse_text(text: str) -> str:
    return text.strip()


TEXT = OutputSpec("text", None, "", _parse_text)

BOOL_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}

_YES = {"yes", "true", "y"}
_NO = {"no", "false", "n"}
_BARE = re.compile(r"^\W*([A-Za-z]+)\W*$")


def parse_bool(text: str) -> bool:
    """Parse a yes/no answer strictly.

    Accepted: the JSON object ``{"answer": "yes"|"no"|true|false}``, a JSON
    boolean or string, or a bare ``yes`` / ``no`` / ``true`` / ``false``
    (any case, surrounding punctuation allowed). Anything else is an error,
    never a silent default.

    Examples
    --------
    >>> parse_bool('{"answer": "yes"}'), parse_bool("No."), parse_bool("true")
    (True, False, True)
    >>> parse_bool("maybe, it depends")
    Traceback (most recent call last):
    ...
    semframe.parse.ParseError: expected a yes/no answer, got 'maybe, it depends'
    """
    stripped = text.strip()
    value: Any = stripped
    if stripped[:1] in '{"' or stripped in {"true", "false"}:
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            value = stripped
    if isinstance(value, dict):
        value = value.get("answer", value)
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        match = _BARE.match(value)
        word = match.group(1).lower() if match else None
        if word in _YES:
            return True
        if word in _NO:
            return False
    shown = stripped if len(stripped) <= 200 else stripped[:197] + "..."
    msg = f"expected a yes/no answer, got {shown!r}"
    raise ParseError(msg)


BOOL = OutputSpec(
    "bool",
    BOOL_SCHEMA,
    'Answer with a JSON object: {"answer": "yes"} or {"answer": "no"}.',
    parse_bool,
)
