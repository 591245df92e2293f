"""A local provider emulator: OpenAI, Anthropic and Gemini wire formats on loopback.

Tests and benchmarks point the official SDK clients at it. It applies each
provider's prompt-caching rules (:mod:`semframe.cost.cachesim`) to the tokens it
receives, bills every request with the price table (:mod:`semframe.cost.pricing`),
answers deterministically after each provider's typical latency
(:meth:`Latency.typical`; ``latency=Latency(0)`` answers at once), and injects
faults on demand.

Examples
--------
>>> import openai
>>> with ProviderEmulator() as emu:
...     with openai.OpenAI(base_url=emu.openai_url, api_key="x", max_retries=0) as client:
...         r = client.chat.completions.create(
...             model="gpt-4.1-mini", messages=[{"role": "user", "content": "Say hi"}])
...     totals = emu.ledger.totals()
>>> r.usage.prompt_tokens, totals.requests
(9, 1)
"""

from semframe.cost.framing import (
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    anthropic_blocks,
    openai_prompt_tokens,
    prompt_text,
)
from semframe.testing.emulator.clock import Clock, ManualClock, MonotonicClock
from semframe.testing.emulator.faults import Fault, FaultKind, FaultPlan, FaultRule
from semframe.testing.emulator.ledger import Ledger, LedgerEntry, Totals
from semframe.testing.emulator.limits import AccountLimits
from semframe.testing.emulator.responder import Responder, default_responder, minimal_instance
from semframe.testing.emulator.server import Latency, ProviderEmulator

__all__ = [
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "AccountLimits",
    "Clock",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "FaultRule",
    "Latency",
    "Ledger",
    "LedgerEntry",
    "ManualClock",
    "MonotonicClock",
    "ProviderEmulator",
    "Responder",
    "Totals",
    "anthropic_blocks",
    "default_responder",
    "minimal_instance",
    "openai_prompt_tokens",
    "prompt_text",
]
