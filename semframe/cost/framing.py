"""How a chat request becomes prompt tokens, as the estimator and the provider emulator count it.

OpenAI publishes the rule for chat prompts (3 tokens per message and 3 that
prime the reply); Anthropic publishes no tokenizer, so its requests are counted
the same way, approximately. Both providers are tokenized with ``o200k_base``.
Each message (the system prompt counts as one) is framed by
``MESSAGE_OVERHEAD`` = 3 synthetic tokens (start, role, separator) placed
before its content, and every prompt ends with ``REPLY_PRIMING`` = 3 tokens
that open the assistant's reply. So::

    prompt_tokens = sum(3 + content tokens of each message) + 3

Content given as a list of text parts/blocks is tokenized part by part and
concatenated. The synthetic tokens lie outside the vocabulary, so they never
collide with text. For Anthropic each content block is a cache block; the
message framing belongs to the message's first block and the reply priming is
a final block without breakpoint, so it is always ordinary input.

Examples
--------
>>> toks = openai_prompt_tokens([{"role": "user", "content": "hello world"}])
>>> len(toks)  # 3 + 2 + 3
8
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
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "FramingError",
    "anthropic_blocks",
    "openai_prompt_tokens",
    "prompt_text",
]

MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3
_START, _SEP = 300_000, 300_001
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


def openai_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Prompt tokens of an OpenAI chat request (``messages`` as sent)."""
    tokens: list[int] = []
    for i, m in enumerate(_messages(list(messages))):
        tokens += _header(str(m["role"]))
        for part in _parts(m["content"], f"messages[{i}]"):
            tokens += encode(part["text"])
    return tokens + _header("assistant")


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
