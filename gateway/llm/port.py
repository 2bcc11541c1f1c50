"""What the gateway needs from an LLM provider: one call, its answer, and how it failed.

A client (`LLMClient`) makes exactly one call and never retries: the provider gate owns
retries. A failure is a `ProviderCallError` whose ``outcome`` says how the gate is to take
it (rate limited, overloaded, spend limit, server error, timeout, rejected), with the
provider's rate-limit headers read into `RateHints`. Keys never reach the event log: only
outcomes, token counts and hints do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from lanes.gate.events import CallOutcome


@dataclass(frozen=True, slots=True)
class RateHints:
    """What the provider's headers said about its limits (None: not said)."""

    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_at: int | None = None
    """When the remaining counts reset, ms since the epoch (the earliest of the resets)."""
    retry_after_ms: int | None = None
    """``retry-after-ms``, or ``retry-after`` in seconds or as an HTTP date, in ms."""


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of the conversation."""

    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class Completion:
    """A successful call: the text and what it really used."""

    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: str | None = None
    hints: RateHints = field(default_factory=RateHints)


class ProviderCallError(Exception):
    """A call that failed, classified for the gate.

    ``outcome`` is never ``ok``; ``status`` is the HTTP status if there was one.
    """

    def __init__(self, outcome: CallOutcome, message: str, *, status: int | None = None,
                 hints: RateHints | None = None) -> None:
        super().__init__(f"{outcome.value}: {message}")
        self.outcome = outcome
        self.status = status
        self.hints = hints or RateHints()


class LLMClient(Protocol):
    """One provider and model; `complete` makes exactly one call, no retries."""

    provider: str
    """The provider's kind (``anthropic``, ``openai``)."""
    model: str

    async def complete(self, *, system: str, messages: Sequence[Message],
                       max_tokens: int) -> Completion:
        """Call the model once; a failure raises `ProviderCallError`, classified."""
        ...

    async def close(self) -> None:
        """Close the client's connections."""
        ...
