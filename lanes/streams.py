"""Stream names: which stream of the log holds what."""

from __future__ import annotations

PROVIDER_PREFIX = "provider:"
"""Streams of the provider gate; they are not agents."""
QUARANTINE_STREAM = "gateway:quarantine"
"""The stream of the events an operator set aside (``gateway quarantine``); not an agent.
No agent id holds a colon, so no other stream is ever taken for an agent's."""
DESK_STREAM = "gateway:desk"
"""The stream of desk-wide operator commands (a desk kill: ``gateway.runtime.desk``), one
event each with what it did to every agent; not an agent, never re-decided."""


def is_agent_stream(stream: str) -> bool:
    """Whether a stream holds an agent's events (an agent's stream is its id)."""
    return ":" not in stream


def gate_stream(provider: str) -> str:
    """The stream that holds a provider gate's events."""
    return PROVIDER_PREFIX + provider

