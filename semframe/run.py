"""Run a compiled call: resolve its backend, check it fits, execute it.

Operators (``semframe.ops``) compile a call into a :class:`Call`; this module
sends it. Keeping the two apart lets every operator share one way of running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from semframe._paths import cache_dir
from semframe.backends import Backend, get_backend
from semframe.cache import open_cache
from semframe.config import ResolvedConfig
from semframe.errors import InputError
from semframe.execute import Outcome, RunStats, execute
from semframe.frames import FrameAdapter
from semframe.plan import Plan

_CHAT_OVERHEAD_TOKENS = 32  # chat-template tokens around the messages, generously


@dataclass(frozen=True)
class Call:
    """Everything an operator call resolved to, before anything is sent."""

    frame: Any
    adapter: FrameAdapter
    settings: ResolvedConfig
    plan: Plan


def check_context(call: Call, backend: Backend) -> None:
    """Fail before sending if a prompt cannot fit the backend's context window.

    A prompt's UTF-8 byte length bounds its token count from above, so only
    prompts whose byte length might not fit are counted exactly.

    Raises
    ------
    InputError
        Naming the row, its longest column and the ``truncate=`` option.
    """
    window = backend.capabilities.context_window
    if window is None:
        return
    plan = call.plan
    budget = window - plan.relquery.max_tokens - _CHAT_OVERHEAD_TOKENS
    system_bytes = len((plan.relquery.system or "").encode())
    suspects = [r for r in plan.requests if len(r.prompt.encode()) + system_bytes > budget]
    if not suspects:
        return
    counts = backend.count_tokens([r.prompt + (r.system or "") for r in suspects])
    for request, tokens in zip(suspects, counts, strict=True):
        if tokens <= budget:
            continue
        table = plan.relquery.table
        longest = max(table.columns, key=lambda c: len(table.cells[c][request.row]))
        length = len(table.cells[longest][request.row])
        label = call.adapter.labels(call.frame)[request.row]
        suggestion = max(1, length * budget // max(tokens, 1) // 2)
        msg = (
            f"row {request.row} (label {label!r}) needs about {tokens} prompt tokens, but "
            f"{backend.name}/{backend.model} allows {window} per request including "
            f"max_tokens={plan.relquery.max_tokens}. Its longest cell is column {longest!r} "
            f"({length:,} characters). Shorten it, or pass truncate={{{longest!r}: "
            f"{suggestion}}} to cut cells to that many characters."
        )
        raise InputError(msg)


def run_call(call: Call) -> tuple[list[Outcome], RunStats]:
    """Resolve the backend, check the context window, execute; outcomes in input order."""
    cfg = call.settings
    backend = get_backend(cfg["backend"], model=cfg["model"], settings=cfg)
    check_context(call, backend)
    cache = (
        open_cache(cache_dir(cfg["cache_dir"]), max_mib=cfg["cache_max_mib"])
        if cfg["cache"]
        else None
    )
    try:
        if cfg["batch"]:
            from semframe.batch import run_batch

            outcomes, stats = run_batch(
                call.plan,
                backend,
                directory=cache_dir(cfg["cache_dir"]),
                poll_seconds=cfg["batch_poll_seconds"],
                max_retries=cfg["max_retries"],
                progress=cfg["progress"],
                prices=cfg["prices"],
                cache=cache,
            )
        else:
            outcomes, stats = execute(
                call.plan,
                backend,
                max_concurrency=cfg["max_concurrency"],
                max_retries=cfg["max_retries"],
                progress=cfg["progress"],
                rpm=cfg["rpm"],
                tpm=cfg["tpm"],
                # A guard above the SDK's own timeout, for servers that trickle bytes.
                deadline=cfg["timeout"] * 1.5 + 5,
                prices=cfg["prices"],
                cache=cache,
            )
    finally:
        if cache is not None:
            cache.close()
    return call.plan.restore(outcomes), stats
