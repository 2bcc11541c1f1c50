"""What the gateway needs from an LLM provider: one call, its answer, and how it failed.

A client (`LLMClient`) makes exactly one call and never retries: the provider gate owns
retries. A failure is a `ProviderCallError` whose ``outcome`` says how the gate is to take
it (rate limited, overloaded, spend limit, server error, timeout, rejected), with the
provider's rate-limit headers read into `RateHints`. Keys never reach the event log: only
outcomes, token counts and hints do.

Tools travel in each SDK's native form (Anthropic ``tools`` / ``tool_use`` / ``tool_result``,
OpenAI ``tools`` / ``tool_calls`` / ``tool`` messages): a `ToolSpec` offers one, a
`Completion` carries the `ToolCall`s the model asked for, and the next turn carries their
`ToolResult`s. The clients translate; nothing above them parses tools out of text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

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
class ToolSpec:
    """A tool offered to the model: its name, what it does, and its arguments' JSON Schema
    (an object schema)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for. ``arguments`` is the parsed JSON object; when the
    model sent something that is not a JSON object, ``arguments`` is empty and
    ``malformed`` holds what it sent (the caller answers it with a tool error)."""

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    malformed: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The answer to one `ToolCall` (``call_id`` is its id): text, or an error the model
    can read."""

    call_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of the conversation: text, and for an assistant turn the tool calls it made,
    for a user turn the results of the previous turn's tool calls (sent before the text)."""

    role: Literal["user", "assistant"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


@dataclass(frozen=True, slots=True)
class Completion:
    """A successful call: the text and what it really used."""

    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: str | None = None
    hints: RateHints = field(default_factory=RateHints)
    tool_calls: tuple[ToolCall, ...] = ()
    """The tools the model asked to call, in its order (none: a final answer)."""


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
                       max_tokens: int, tools: Sequence[ToolSpec] = ()) -> Completion:
        """Call the model once, offering ``tools``; a failure raises `ProviderCallError`,
        classified."""
        ...

    async def close(self) -> None:
        """Close the client's connections."""
        ...
