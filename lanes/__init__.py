"""The pure domain: two-lane agent queues as ``decide`` and ``evolve`` over events.

No asyncio, no clock reads, no I/O, no database or web framework: time arrives inside each
input, so the same inputs always give the same decisions (and replay is exact).
"""

from lanes.config import AgentConfig, Budgets, DedupeStrategy, DropPolicy, Mode
from lanes.decide import decide, next_due
from lanes.evolve import evolve
from lanes.handlers import IllegalTransition
from lanes.replay import Divergence, Entry, replay, request_outcomes, verify
from lanes.requests import (
    AgentRequest,
    ControlAction,
    FieldError,
    InvalidRequest,
    Kind,
    Priority,
    parse_request,
)
from lanes.state import AgentState, AgentStatus, status

__all__ = [
    "AgentConfig",
    "AgentRequest",
    "AgentState",
    "AgentStatus",
    "Budgets",
    "ControlAction",
    "DedupeStrategy",
    "Divergence",
    "DropPolicy",
    "Entry",
    "FieldError",
    "IllegalTransition",
    "InvalidRequest",
    "Kind",
    "Mode",
    "Priority",
    "decide",
    "evolve",
    "next_due",
    "parse_request",
    "replay",
    "request_outcomes",
    "status",
    "verify",
]
