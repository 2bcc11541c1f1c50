"""Every event in an agent's stream: inputs (facts from outside) and decisions.

Inputs carry their time (``at``, ms since the epoch); decisions happen at the time of the
input that caused them, which is the state's ``now`` when they are evolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeGuard

from pydantic import Field

from lanes.config import MAX_MS, AgentConfig, CallResults, Mode
from lanes.requests import AgentRequest, ControlAction, JsonObject, Priority, WireModel
from lanes.schedules import Schedule


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
    """Why a run was aborted; ``restart`` and ``shutdown`` put its requests back in the queue."""

    INTERRUPT = "interrupt"
    EMERGENCY_STOP = "emergency_stop"
    TIMEOUT = "timeout"
    RELEASE = "release"
    RESTART = "restart"
    SHUTDOWN = "shutdown"
    OPERATOR = "operator"
    WITHDRAWN = "withdrawn"
    """Its only request was a call its caller gave up on."""


class OperatorAction(StrEnum):
    """Operator commands on a lane (from the HTTP API), each recorded with its principal."""

    RELEASE = "release"
    ABORT_RUN = "abort_run"
    CLEAR_QUEUE = "clear_queue"


class Usage(WireModel):
    """Token usage of one run."""

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class OrderIntent(WireModel):
    """An order a run wants placed; the trading gate accepts or rejects it."""

    symbol: str = Field(min_length=1, max_length=32)
    side: Literal["buy", "sell"]
    qty: float = Field(gt=0)
    order_type: Literal["market", "limit"] = "market"
    limit_price: float | None = Field(default=None, gt=0)


class CallIntent(WireModel):
    """A sub-agent call a run wants made."""

    agent_id: str
    priority: Priority = Priority.NORMAL
    payload: JsonObject = Field(default_factory=dict)
    timeout_ms: int | None = Field(default=None, ge=1, le=MAX_MS)
    """Ends the call ``timed_out`` if no result came this long after it went out (None: the
    agent's ``call_timeout_ms``)."""


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


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReceived:
    """A request arrived for this agent, from ``principal`` (the token's name) if known."""

    at: int
    request: AgentRequest
    principal: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerElapsed:
    """Time reached ``at``: debounce windows, run deadlines and budget windows fall due."""

    at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSteerability:
    """The runner says whether the active run can take a steer now."""

    at: int
    run_id: str
    steerable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinished:
    """A run returned a result."""

    at: int
    run_id: str
    outcome: Outcome
    usage: Usage = field(default_factory=Usage)
    orders: tuple[OrderIntent, ...] = ()
    calls: tuple[CallIntent, ...] = ()
    answer: str = ""
    """What the run answers the agents whose calls it served (written only when set)."""
    call_results: CallResults | None = None
    """How its calls' results come back (None: the agent's ``call_results``; written only
    when set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunErrored:
    """A run raised or its reasoner failed."""

    at: int
    run_id: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorCommand:
    """An operator acts on the lane: release it, abort a run, or clear the queue."""

    at: int
    action: OperatorAction
    principal: str
    run_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigChanged:
    """A new config for this agent (applies to requests arriving from now on)."""

    at: int
    config: AgentConfig
    principal: str = "config"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChanged:
    """A schedule of this agent is defined (added, replaced, paused, resumed: ``schedule``)
    or removed (``schedule`` is None)."""

    at: int
    schedule_id: str
    schedule: Schedule | None
    principal: str = "config"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerReport:
    """The broker reports on an order."""

    at: int
    order_id: str
    status: Literal["filled", "partially_filled", "cancelled", "rejected"]
    filled_qty: float = 0.0
    price: float | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SpendLimitHit:
    """The LLM provider refused a run's call for spend (quota, credit, usage limit): the run
    fails and no run starts until an operator resumes the agent."""

    at: int
    run_id: str
    provider: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallUndeliverable:
    """A sub-agent call this agent dispatched could not be delivered to its target."""

    at: int
    call_id: str
    run_id: str
    target: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Stopping:
    """The gateway is shutting down: runs in flight stop, their requests wait for the next
    start at the head of the queue."""

    at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Restarted:
    """The gateway started again; whatever was running when it stopped did not finish."""

    at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Quarantined:
    """Stands in for an event of the log that was set aside (``gateway quarantine``): one
    that cannot be read, or that an operator chose to skip, with its input's decisions.
    It changes nothing but the stream's version and decides nothing."""

    at: int
    """When it was recorded (not the state's time: nothing is advanced)."""
    original_type: str
    reason: str


Input = (
    RequestReceived
    | TimerElapsed
    | RunSteerability
    | RunFinished
    | RunErrored
    | OperatorCommand
    | ConfigChanged
    | ScheduleChanged
    | BrokerReport
    | SpendLimitHit
    | CallUndeliverable
    | Stopping
    | Restarted
    | Quarantined
)
INPUT_TYPES: tuple[type[Input], ...] = (
    RequestReceived,
    TimerElapsed,
    RunSteerability,
    RunFinished,
    RunErrored,
    OperatorCommand,
    ConfigChanged,
    BrokerReport,
    SpendLimitHit,
    CallUndeliverable,
    Stopping,
    Restarted,
    Quarantined,
    ScheduleChanged,
)
INPUTS: frozenset[type[Any]] = frozenset(INPUT_TYPES)
"""The input classes, for a quick ``type(event) in INPUTS``."""


def is_input(event: object) -> TypeGuard[Input]:
    """Whether an event is an input (what came in) rather than a decision."""
    return type(event) in INPUTS

# ------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestQueued:
    """The received request was accepted into the pending list."""

    request_id: str
    mode: Mode


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDeduped:
    """The received request repeats one accepted earlier (pending or within the window)."""

    request_id: str
    duplicate_of: str
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRepeated:
    """A requestId seen before was submitted again; its first decision stands."""

    request_id: str
    first_decision: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRejected:
    """The received request was refused; ``reason`` says why and what to do.

    A ``transient`` refusal (a full queue) is not remembered: the same requestId may retry.
    """

    request_id: str
    reason: str
    transient: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDropped:
    """A request (the received one, or a pending one) was dropped."""

    request_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSummarized:
    """A request was folded into the summary handed to the next run."""

    request_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackApplied:
    """The request's mode could not do what it asked; it follows up instead."""

    request_id: str
    mode: Mode
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlApplied:
    """A control-lane request took effect (``from_state`` to ``to_state``)."""

    request_id: str
    action: ControlAction
    from_state: TradingState
    to_state: TradingState


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """A reasoning run started with these pending requests (a prefix of the list)."""

    run_id: str
    request_ids: tuple[str, ...]
    depth: int
    deadline: int
    summary: Summary | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSteered:
    """The received request was injected into the active run."""

    run_id: str
    request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SteerabilityChanged:
    """The active run can (or can no longer) take steers."""

    run_id: str
    steerable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted:
    """The active run finished with a result."""

    run_id: str
    outcome: Outcome
    usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed:
    """The active run failed."""

    run_id: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunAborted:
    """The active run was aborted; with ``requeued`` its requests went back to the head."""

    run_id: str
    reason: AbortReason
    requeued: bool = False
    by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResultIgnored:
    """A result or error arrived for a run that is no longer active."""

    run_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsSuppressed:
    """Runs are held back by a budget until ``until``; requests are still accepted."""

    reason: Literal["hourly", "daily", "cooldown"]
    until: int
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsResumed:
    """The budget allows runs again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsHeld:
    """An alert: the agent's LLM provider refused for spend. The agent is paused (ACTIVE
    becomes REDUCING) and no run starts until a ``resume``; requests are still accepted."""

    provider: str
    reason: str
    from_state: TradingState
    to_state: TradingState


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsUnheld:
    """A ``resume`` (request ``by``) lifted a provider hold: runs may start again."""

    by: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderAccepted:
    """The trading gate accepted an order intent of a run."""

    order_id: str
    run_id: str
    intent: OrderIntent


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderRejected:
    """The trading gate rejected an order intent of a run."""

    run_id: str
    intent: OrderIntent
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderCancelRequested:
    """An open order is to be cancelled."""

    order_id: str
    by: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderFilled:
    """Part or all of an order was filled."""

    order_id: str
    qty: float
    price: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderClosed:
    """An order is no longer open."""

    order_id: str
    status: Literal["filled", "cancelled", "rejected"]
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerReportIgnored:
    """A broker report named an order that is not open."""

    order_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCallDispatched:
    """A sub-agent call of a run goes out as an ``agent_call`` request to ``target``."""

    call_id: str
    run_id: str
    target: str
    depth: int
    priority: Priority
    payload: dict[str, Any]
    deadline: int | None = None
    """When it times out, if it does (written only when set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCallRejected:
    """A sub-agent call of a run was refused: it ends ``refused`` before it is queued."""

    run_id: str
    target: str
    reason: str
    call_id: str = ""
    """Its id (written only when set: logs before call results had none)."""
    code: str = ""
    """``fan_out_limit``, ``depth_limit``, ``queue_full`` or ``undeliverable`` (written only
    when set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallBatchOpened:
    """A run made sub-agent calls: their results come back together (``all``) or one by one
    (``each``), and the calls the run served (``serves``) are answered only when the run
    that takes the last result is done."""

    run_id: str
    results: CallResults
    depth: int
    serves: tuple[ServedCall, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCallQueued:
    """A sub-agent call waits in this agent's call queue for one of its parallel slots."""

    call_id: str
    run_id: str
    target: str
    depth: int
    priority: Priority
    payload: dict[str, Any]
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEnded:
    """One of this agent's calls ended (its result arrived as request ``request_id``, it
    timed out, or it was cancelled or found undeliverable)."""

    call_id: str
    result: CallResult
    request_id: str | None = None
    withdraw: bool = False
    """The call was out: its target is told to drop it (a ``call_cancel`` request)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallWithdrawn:
    """A caller gave up on a call this agent serves (request ``request_id``): what is still
    to do for it is dropped (``detail`` says what)."""

    request_id: str
    call_id: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResultsReady:
    """Results of this agent's calls, made into a request for its reasoning lane (decided
    next like any arriving request: queued, or steered into the active run)."""

    run_id: str
    request: AgentRequest
    last: bool
    """Whether it holds the batch's last result (the batch is closed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAnswered:
    """This agent answers a call it served; the answer goes to ``parent`` as a
    ``call_result`` request."""

    parent: str
    result: CallResult


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigApplied:
    """This agent's config from now on."""

    config: AgentConfig
    principal: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleApplied:
    """This agent's schedule ``schedule_id`` from now on (None: removed)."""

    schedule_id: str
    schedule: Schedule | None
    principal: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorApplied:
    """An operator command took effect."""

    action: OperatorAction
    principal: str
    run_id: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorRejected:
    """An operator command was refused."""

    action: OperatorAction
    principal: str
    reason: str
    run_id: str | None = None


Decision = (
    RequestQueued
    | RequestDeduped
    | RequestRepeated
    | RequestRejected
    | RequestDropped
    | RequestSummarized
    | FallbackApplied
    | ControlApplied
    | RunStarted
    | RunSteered
    | SteerabilityChanged
    | RunCompleted
    | RunFailed
    | RunAborted
    | RunResultIgnored
    | RunsSuppressed
    | RunsResumed
    | RunsHeld
    | RunsUnheld
    | OrderAccepted
    | OrderRejected
    | OrderCancelRequested
    | OrderFilled
    | OrderClosed
    | BrokerReportIgnored
    | AgentCallDispatched
    | AgentCallRejected
    | CallBatchOpened
    | AgentCallQueued
    | CallEnded
    | CallResultsReady
    | CallAnswered
    | CallWithdrawn
    | ConfigApplied
    | ScheduleApplied
    | OperatorApplied
    | OperatorRejected
)
DECISION_TYPES: tuple[type[Decision], ...] = (
    RequestQueued,
    RequestDeduped,
    RequestRepeated,
    RequestRejected,
    RequestDropped,
    RequestSummarized,
    FallbackApplied,
    ControlApplied,
    RunStarted,
    RunSteered,
    SteerabilityChanged,
    RunCompleted,
    RunFailed,
    RunAborted,
    RunResultIgnored,
    RunsSuppressed,
    RunsResumed,
    RunsHeld,
    RunsUnheld,
    OrderAccepted,
    OrderRejected,
    OrderCancelRequested,
    OrderFilled,
    OrderClosed,
    BrokerReportIgnored,
    AgentCallDispatched,
    AgentCallRejected,
    CallBatchOpened,
    AgentCallQueued,
    CallEnded,
    CallResultsReady,
    CallAnswered,
    CallWithdrawn,
    ConfigApplied,
    OperatorApplied,
    OperatorRejected,
    ScheduleApplied,
)

Event = Input | Decision

WRITTEN_WHEN_SET: dict[type[Any], tuple[tuple[str, Any], ...]] = {
    RunFinished: (("answer", ""), ("call_results", None)),
    AgentCallDispatched: (("deadline", None),),
    AgentCallRejected: (("call_id", ""), ("code", "")),
}
"""Fields added after logs were written with their type: left out of the stored data while
they hold their default, so an event that does not use them is stored as before."""
