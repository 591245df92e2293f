"""One HTTP answer of the emulator, as every provider's routes build it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JSON", "Reply"]

JSON = "application/json"


@dataclass(frozen=True)
class Reply:
    """Status, body and headers; ``drop`` closes the connection mid-body (a fault)."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False
