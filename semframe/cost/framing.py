"""How a chat request becomes prompt tokens, as the estimator and the provider emulator count it.

OpenAI publishes the rule for chat prompts (OpenAI cookbook, "How to count
tokens with tiktoken"): every message costs 3 tokens plus the tokens of each
of its values (its role, its content, and a ``name`` with 1 more), and every
reply is primed with 3. So one user message is its content + 7 tokens, which
is what the API reports. Anthropic publishes no tokenizer, so its requests are
counted more simply, approximately: 3 tokens per message and 3 for the reply.
Both providers are tokenized with ``o200k_base``. Each message (the system
prompt counts as one) is framed by ``MESSAGE_OVERHEAD`` = 3 synthetic tokens
(start, role, separator) placed before its content (on OpenAI followed by the
role's own tokens, ``ROLE_TOKENS`` for every role semframe sends), and every
prompt ends with ``REPLY_PRIMING`` = 3 tokens that open the assistant's reply.
So::

    OpenAI:    prompt_tokens = sum(3 + role tokens + content tokens) + 3
    Anthropic: prompt_tokens = sum(3 + content tokens) + 3

Gemini's text counts show no per-message framing: Google's own example
(https://ai.google.dev/api/tokens) counts "The quick brown fox jumps over the
lazy dog." as 10 tokens with ``countTokens`` and reports ``prompt_token_count``
11 for the same prompt sent to ``generateContent``. So a Gemini request is
counted as the text of its system instruction and of every part, with no
tokens per turn, plus ``GEMINI_TURN`` = 1 token at the end (taken to open the
model's turn, so it is never part of a cached prefix); ``countTokens`` and an
explicit cache's size count the text alone::

    Gemini:    prompt_token_count = system tokens + part tokens + 1

Content given as a list of text parts/blocks is tokenized part by part and
concatenated. The synthetic tokens lie outside the vocabulary, so they never
collide with text. For Anthropic each content block is a cache block; the
message framing belongs to the message's first block and the reply priming is
a final block without breakpoint, so it is always ordinary input.

Examples
--------
>>> toks = openai_prompt_tokens([{"role": "user", "content": "hello world"}])
>>> len(toks)  # 3 + 1 ("user") + 2 + 3
9
>>> blocks = anthropic_blocks(None, [{"role": "user", "content": [
...     {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}},
...     {"type": "text", "text": " world"}]}])
>>> [(len(b.tokens), b.cache_ttl) for b in blocks]
[(4, '5m'), (1, None), (3, None)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semframe.cost.cachesim import TTL, Block
from semframe.cost.tokens import encode

__all__ = [
    "GEMINI_TURN",
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "ROLE_TOKENS",
    "FramingError",
    "anthropic_blocks",
    "anthropic_framing",
    "gemini_content_tokens",
    "gemini_framing",
    "gemini_prompt_tokens",
    "gemini_text",
    "openai_blocks",
    "openai_framing",
    "openai_prompt_tokens",
    "prompt_text",
]

MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3
ROLE_TOKENS = 1
"""Tokens of a role's own text on OpenAI ("system", "user", "assistant": one each)."""
GEMINI_TURN = 1
"""Tokens Gemini adds to a ``generateContent`` prompt (after the text; see the module docs)."""
_START, _SEP, _NAME = 300_000, 300_001, 300_002
_MODEL_TURN = 300_020
_ROLES = {
    "system": 300_010,
    "developer": 300_011,
    "user": 300_012,
    "assistant": 300_013,
    "tool": 300_014,
}


class FramingError(ValueError):
    """The request body does not have the shape the provider's API requires."""


def _header(role: str) -> list[int]:
    if role not in _ROLES:
        msg = f"unsupported role {role!r}; valid roles: {', '.join(_ROLES)}"
        raise FramingError(msg)
    return [_START, _ROLES[role], _SEP]


def _parts(content: Any, where: str) -> list[Mapping[str, Any]]:
    """Content as a list of text parts (a plain string is one part)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        msg = f"{where}: content must be a string or a list of text parts"
        raise FramingError(msg)
    out: list[Mapping[str, Any]] = []
    for i, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            msg = (
                f"{where}.content[{i}]: only text parts are supported by the emulator, got {kind!r}"
            )
            raise FramingError(msg)
        if not isinstance(part.get("text"), str):
            msg = f"{where}.content[{i}].text must be a string"
            raise FramingError(msg)
        out.append(part)
    return out


def _messages(messages: Any) -> list[Mapping[str, Any]]:
    if not isinstance(messages, list) or not messages:
        msg = "messages: must be a non-empty list"
        raise FramingError(msg)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            msg = f"messages[{i}]: each message needs 'role' and 'content'"
            raise FramingError(msg)
    return messages


def _openai_header(role: str, name: Any = None) -> list[int]:
    """A message's framing on OpenAI: 3 tokens, the role's text, and a name's (+1)."""
    tokens = _header(role) + encode(role)
    if isinstance(name, str) and name:
        tokens += [_NAME, *encode(name)]
    return tokens


def openai_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Prompt tokens of an OpenAI chat request (``messages`` as sent).

    Examples
    --------
    >>> len(openai_prompt_tokens([{"role": "system", "content": "Be brief."},
    ...                           {"role": "user", "content": "hi", "name": "ann"}]))
    17
    """
    tokens: list[int] = []
    for i, m in enumerate(_messages(list(messages))):
        tokens += _openai_header(str(m["role"]), m.get("name"))
        for part in _parts(m["content"], f"messages[{i}]"):
            tokens += encode(part["text"])
    return tokens + _header("assistant")


def _openai_breakpoint(part: Mapping[str, Any], where: str, default: TTL) -> TTL | None:
    bp = part.get("prompt_cache_breakpoint")
    if bp is None:
        return None
    if not isinstance(bp, Mapping) or bp.get("mode") != "explicit":
        msg = f"{where}.prompt_cache_breakpoint: must be {{'mode': 'explicit'}}, got {bp!r}"
        raise FramingError(msg)
    ttl = bp.get("ttl", default)
    if ttl not in ("30m", "12h"):
        msg = f"{where}.prompt_cache_breakpoint.ttl: must be '30m' or '12h', got {ttl!r}"
        raise FramingError(msg)
    return "12h" if ttl == "12h" else "30m"


def openai_blocks(
    messages: Sequence[Mapping[str, Any]], *, implicit: bool, ttl: TTL = "30m"
) -> list[Block]:
    """Cache blocks of an OpenAI chat request with breakpoints (GPT-5.6 and later).

    Each content part is a block; a part with ``prompt_cache_breakpoint``
    carries a breakpoint (its own ``ttl``, else ``ttl``, the request's). With
    ``implicit`` (``prompt_cache_options.mode`` "implicit", the default) OpenAI
    adds its own breakpoint at the end of the newest message. The reply
    priming is a last block without breakpoint. The tokens are exactly
    :func:`openai_prompt_tokens`'s.

    Examples
    --------
    >>> msgs = [{"role": "user", "content": [
    ...     {"type": "text", "text": "hello", "prompt_cache_breakpoint": {"mode": "explicit"}},
    ...     {"type": "text", "text": " world"}]}]
    >>> [(len(b.tokens), b.cache_ttl) for b in openai_blocks(msgs, implicit=False)]
    [(5, '30m'), (1, None), (3, None)]
    >>> [b.cache_ttl for b in openai_blocks(msgs, implicit=True)]
    ['30m', '30m', None]
    """
    blocks: list[Block] = []
    for i, m in enumerate(_messages(list(messages))):
        header = _openai_header(str(m["role"]), m.get("name"))
        for j, part in enumerate(_parts(m["content"], f"messages[{i}]")):
            toks = (header if j == 0 else []) + encode(part["text"])
            where = f"messages[{i}].content[{j}]"
            blocks.append(Block(tuple(toks), _openai_breakpoint(part, where, ttl)))
    if implicit and blocks[-1].cache_ttl is None:
        blocks[-1] = Block(blocks[-1].tokens, ttl)
    blocks.append(Block(tuple(_header("assistant"))))
    return blocks


def openai_framing() -> tuple[list[int], list[int], list[int]]:
    """(system header, user header, reply priming) tokens of an OpenAI chat request."""
    return _openai_header("system"), _openai_header("user"), _header("assistant")


def anthropic_framing() -> tuple[list[int], list[int], list[int]]:
    """(system header, user header, reply priming) tokens of an Anthropic request."""
    return _header("system"), _header("user"), _header("assistant")


def _ttl(block: Mapping[str, Any], where: str) -> TTL | None:
    cc = block.get("cache_control")
    if cc is None:
        return None
    if not isinstance(cc, Mapping) or cc.get("type") != "ephemeral":
        msg = f"{where}.cache_control: only {{'type': 'ephemeral'}} is supported"
        raise FramingError(msg)
    ttl = cc.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        msg = f"{where}.cache_control.ttl: must be '5m' or '1h', got {ttl!r}"
        raise FramingError(msg)
    return "1h" if ttl == "1h" else "5m"


def anthropic_blocks(system: Any, messages: Sequence[Mapping[str, Any]]) -> list[Block]:
    """Cache blocks of an Anthropic Messages request (``system``, ``messages`` as sent)."""
    turns: list[tuple[str, list[Mapping[str, Any]], str]] = []
    if system not in (None, "", []):
        turns.append(("system", _parts(system, "system"), "system"))
    for i, m in enumerate(_messages(list(messages))):
        role = str(m["role"])
        if role not in ("user", "assistant"):
            msg = f"messages[{i}].role: must be 'user' or 'assistant', got {role!r}"
            raise FramingError(msg)
        turns.append((role, _parts(m["content"], f"messages[{i}]"), f"messages[{i}]"))
    blocks: list[Block] = []
    for role, parts, where in turns:
        for j, part in enumerate(parts):
            toks = (_header(role) if j == 0 else []) + encode(part["text"])
            blocks.append(Block(tuple(toks), _ttl(part, f"{where}.content[{j}]")))
    blocks.append(Block(tuple(_header("assistant"))))
    return blocks


def prompt_text(system: Any, messages: Sequence[Mapping[str, Any]]) -> str:
    """All text of a request, system first, messages joined by blank lines."""
    texts: list[str] = []
    if system:
        texts.append("".join(p["text"] for p in _parts(system, "system")))
    for i, m in enumerate(messages):
        texts.append("".join(p["text"] for p in _parts(m.get("content", ""), f"messages[{i}]")))
    return "\n\n".join(texts)


# ---------------------------------------------------------------- Gemini


def _gemini_parts(parts: Any, where: str) -> list[str]:
    if not isinstance(parts, list):
        msg = f"{where}.parts: must be a list of parts"
        raise FramingError(msg)
    texts: list[str] = []
    for i, part in enumerate(parts):
        if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
            msg = f"{where}.parts[{i}]: only text parts are supported by the emulator"
            raise FramingError(msg)
        if part.get("thought"):
            msg = f"{where}.parts[{i}]: thought parts cannot be sent"
            raise FramingError(msg)
        texts.append(part["text"])
    return texts


def _gemini_texts(system: Any, contents: Any) -> list[str]:
    texts: list[str] = []
    if system is not None:
        if not isinstance(system, Mapping):
            msg = "systemInstruction: must be a Content object with text parts"
            raise FramingError(msg)
        texts += _gemini_parts(system.get("parts"), "systemInstruction")
    if not isinstance(contents, list):
        msg = "contents: must be a list of Content objects"
        raise FramingError(msg)
    for i, content in enumerate(contents):
        if not isinstance(content, Mapping):
            msg = f"contents[{i}]: must be a Content object"
            raise FramingError(msg)
        role = content.get("role", "user")
        if role not in ("user", "model"):
            msg = f"contents[{i}].role: must be 'user' or 'model', got {role!r}"
            raise FramingError(msg)
        texts += _gemini_parts(content.get("parts"), f"contents[{i}]")
    return texts


def gemini_content_tokens(system: Any, contents: Any) -> list[int]:
    """Tokens of a Gemini system instruction and contents (JSON as sent), text only.

    What ``countTokens`` reports and what an explicit cache holds.

    Examples
    --------
    >>> len(gemini_content_tokens({"parts": [{"text": "Be brief."}]},
    ...                           [{"role": "user", "parts": [{"text": "hello world"}]}]))
    5
    """
    tokens: list[int] = []
    for text in _gemini_texts(system, contents):
        tokens += encode(text)
    return tokens


def gemini_prompt_tokens(system: Any, contents: Any) -> list[int]:
    """Prompt tokens of a Gemini ``generateContent`` request: the text, then 1 turn token.

    Examples
    --------
    >>> len(gemini_prompt_tokens(None, [{"role": "user", "parts": [{"text": "hello world"}]}]))
    3
    """
    return [*gemini_content_tokens(system, contents), _MODEL_TURN]


def gemini_framing() -> tuple[list[int], list[int], list[int]]:
    """(system header, user header, reply priming) tokens of a Gemini request."""
    return [], [], [_MODEL_TURN]


def gemini_text(system: Any, contents: Any) -> str:
    """All text of a Gemini request, system instruction first, turns joined by blank lines."""
    texts: list[str] = []
    if isinstance(system, Mapping):
        texts.append("".join(_gemini_parts(system.get("parts"), "systemInstruction")))
    for i, content in enumerate(contents if isinstance(contents, list) else []):
        if isinstance(content, Mapping):
            texts.append("".join(_gemini_parts(content.get("parts"), f"contents[{i}]")))
    return "\n\n".join(texts)
