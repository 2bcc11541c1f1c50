"""The values events carry: trading states, outcomes, reasons, usage, order and call intents,
call results and summaries (the events themselves are in `lanes.inputs` and `lanes.decisions`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from lanes.config import MAX_MS
from lanes.requests import JsonObject, Priority, WireModel


class TradingState(StrEnum):
    """Whether the agent may run and trade (see `lanes.tables.TRADING_TRANSITIONS`)."""

    ACTIVE = "ACTIVE"
    REDUCING = "REDUCING"
    HALTED = "HALTED"


class Outcome(StrEnum):
    """What a completed run came to."""

    TRADE = "trade"
    NO_TRADE = "no_trade"


class AbortReason(StrEnum):
    """Why a run was aborted; ``restart``, ``shutdown`` and ``worker_lost`` put its
    requests back in the queue."""

    INTERRUPT = "interrupt"
    EMERGENCY_STOP = "emergency_stop"
    TIMEOUT = "timeout"
    RELEASE = "release"
    RESTART = "restart"
    SHUTDOWN = "shutdown"
    OPERATOR = "operator"
    WITHDRAWN = "withdrawn"
    """Its only request was a call its caller gave up on."""
    WORKER_LOST = "worker_lost"
    """The worker doing it disconnected or went silent; its requests went back to the head."""


class OperatorAction(StrEnum):
    """Operator commands on a lane (from the HTTP API), each recorded with its principal."""

    RELEASE = "release"
    ABORT_RUN = "abort_run"
    CLEAR_QUEUE = "clear_queue"


class Usage(WireModel):
    """Token usage of one run."""

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost: float | None = Field(default=None, ge=0, exclude_if=lambda value: value is None)
    """What it cost, reckoned with its provider's prices (None: no prices configured;
    stored only when known)."""


class OrderIntent(WireModel):
    """An order a run wants placed; the trading gate accepts or rejects it."""

    symbol: str = Field(min_length=1, max_length=32, description="The symbol, e.g. BTCUSD.")
    side: Literal["buy", "sell"]
    qty: float = Field(gt=0, description="How much to buy or sell.")
    order_type: Literal["market", "limit"] = "market"
    limit_price: float | None = Field(default=None, gt=0,
                                      description="The limit price (a limit order only).")


class CallIntent(WireModel):
    """A sub-agent call a run wants made."""

    agent_id: str = Field(description="The agent to call.")
    priority: Priority = Priority.NORMAL
    payload: JsonObject = Field(default_factory=dict,
                                description="What the called agent gets (e.g. a message).")
    timeout_ms: int | None = Field(default=None, ge=1, le=MAX_MS)
    """Ends the call ``timed_out`` if no result came this long after it went out (None: the
    agent's ``call_timeout_ms``)."""


STEP_TEXT_LIMIT = 4_000
"""Characters of a model's text, a tool result or a call's malformed arguments kept in the
log; a longer one is cut there, with the whole's size and SHA-256 (docs/agents.md)."""


class ToolCallMade(WireModel):
    """A tool call the model asked for in one step of a run: its id (the provider's), the
    tool's name, and its arguments (or, when they were not a JSON object, what was sent)."""

    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    arguments: JsonObject = Field(default_factory=dict)
    malformed: str | None = Field(default=None, max_length=STEP_TEXT_LIMIT)


class ToolRefusal(WireModel):
    """A tool call the agent's rules refused: the error the model is answered with."""

    call_id: str = Field(min_length=1, max_length=256)
    error: str = Field(max_length=2_000)


class CallStatus(StrEnum):
    """How a sub-agent call ended: every call ends in exactly one of these."""

    RETURNED = "returned"
    """The target ran it and answered."""
    FAILED = "failed"
    """The target's run failed or was aborted."""
    REFUSED = "refused"
    """Never run: a limit, a full queue, an unknown or unreachable target (``code`` says)."""
    CANCELLED = "cancelled"
    """The agent that made it was stopped (or its queue cleared) first."""
    TIMED_OUT = "timed_out"
    """No result within its timeout."""


class CallResult(WireModel):
    """The result of one sub-agent call, as the agent that made it receives it."""

    call_id: str = Field(min_length=1, max_length=256)
    target: str = Field(default="", max_length=64)
    status: CallStatus
    outcome: Outcome | None = None
    answer: str = Field(default="", max_length=20_000)
    usage: Usage = Field(default_factory=Usage)
    error: str | None = Field(default=None, max_length=1_000)
    code: str | None = Field(default=None, max_length=64)
    """Why it did not return, for a program: ``fan_out_limit``, ``depth_limit``,
    ``queue_full``, ``deduped``, ``undeliverable``, ``run_failed``, ``run_aborted``,
    ``halted``, ``cleared``, ``timeout`` (docs/calls.md)."""


def answer_id(call_id: str) -> str:
    """The request id of the answer to a call (the ``call_result`` request that carries it)."""
    return f"{call_id}-a"


def withdrawal_id(call_id: str) -> str:
    """The request id of the ``call_cancel`` request that withdraws a call."""
    return f"{call_id}-w"


class ServedCall(WireModel):
    """A call this agent serves for another (``parent``), answered when its work is done."""

    call_id: str
    parent: str
    target: str = ""
    """The agent serving it (this one)."""


class Summary(WireModel):
    """Requests folded away by a ``summarize`` cap, handed to the next run."""

    count: int
    request_ids: tuple[str, ...]
    """The first `SUMMARY_IDS` ids; ``count`` says how many there were in all."""
    first_at: int
    last_at: int


SUMMARY_IDS = 50
