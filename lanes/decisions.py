"""The decisions of an agent's stream: they happen at the time of the input that caused them,
which is the state's ``now`` when they are evolved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lanes.config import AgentConfig, CallResults, Mode
from lanes.policy import PolicyAdopted, PolicyDeferred
from lanes.requests import AgentRequest, ControlAction, Priority
from lanes.schedules import Schedule
from lanes.vocabulary import (
    AbortReason,
    CallIntent,
    CallResult,
    OperatorAction,
    OrderIntent,
    Outcome,
    ServedCall,
    Summary,
    ToolRefusal,
    TradingState,
    Usage,
)


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
class StepDecided:
    """A model call of the active run was taken as its step ``step``: the tool calls that
    may go ahead (``allowed``, in the model's order), and those refused, with the error
    the model is answered with."""

    run_id: str
    step: int
    allowed: tuple[str, ...] = ()
    refused: tuple[ToolRefusal, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultTaken:
    """A tool call's result (or error) was taken into the active run."""

    run_id: str
    step: int
    call_id: str
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TasksScheduled:
    """A ``schedule_tasks`` call of the active run's step ``step`` was taken: its sub-agent
    tasks wait in the run until ``execute_scheduled_tasks`` sends them."""

    run_id: str
    step: int
    call_id: str
    tasks: tuple[CallIntent, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TasksFinished:
    """Every call of a batch that ``execute_scheduled_tasks`` sent has ended: their results,
    in the order they were scheduled, for the run waiting in that tool (``run_id``), if it
    still waits (the batch is closed either way)."""

    run_id: str
    batch_id: str
    results: tuple[CallResult, ...]


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
class BudgetAlert:
    """A token or spend budget reached a fraction of its limit (``alert_at``) in its window
    (``hour`` or ``day``); at 1, runs are suppressed until the window frees enough."""

    budget: str
    window: Literal["hour", "day"]
    fraction: float
    used: float
    limit: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsSuppressed:
    """Runs are held back by a budget until ``until``; requests are still accepted."""

    reason: Literal["hourly", "daily", "cooldown", "tokens", "spend", "desk"]
    until: int
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeskBudgetApplied:
    """Runs of this agent wait for the desk's budget until ``until`` (0: they no longer do);
    ``detail`` names the budget used up."""

    until: int
    detail: str = ""


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
    """The trading gate accepted an order intent of a run, or (``by`` set, ``run_id``
    empty) the operator's flatten request ``by`` placed a closing order."""

    order_id: str
    run_id: str
    intent: OrderIntent
    by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderRejected:
    """The trading gate rejected an order intent of a run."""

    run_id: str
    intent: OrderIntent
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested:
    """An order passed the trading gate and waits for a human's approval (``approve`` or
    ``reject`` on the control lane) until ``expires_at``; ``notional`` is its quantity x
    price when the price was known."""

    approval_id: str
    run_id: str
    order_id: str
    intent: OrderIntent
    notional: float | None
    expires_at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided:
    """An order waiting for approval was approved or rejected (``by``: the control's
    request id, ``expired``, or the stop or pause that rejected it); ``request`` carries the
    outcome to the agent's reasoning lane."""

    approval_id: str
    approved: bool
    by: str
    reason: str
    request: AgentRequest


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
    awaited_by: str | None = None
    """The run whose ``execute_scheduled_tasks`` sent the calls and waits for them (their
    batch is then ``<run>-s<step>``, and its results go to that run: `TasksFinished`)."""


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
    | StepDecided
    | ToolResultTaken
    | TasksScheduled
    | TasksFinished
    | RunCompleted
    | RunFailed
    | RunAborted
    | RunResultIgnored
    | RunsSuppressed
    | DeskBudgetApplied
    | BudgetAlert
    | RunsResumed
    | RunsHeld
    | RunsUnheld
    | OrderAccepted
    | OrderRejected
    | OrderCancelRequested
    | ApprovalRequested
    | ApprovalDecided
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
    | PolicyAdopted
    | PolicyDeferred
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
    StepDecided,
    ToolResultTaken,
    TasksScheduled,
    TasksFinished,
    RunCompleted,
    RunFailed,
    RunAborted,
    RunResultIgnored,
    RunsSuppressed,
    DeskBudgetApplied,
    BudgetAlert,
    RunsResumed,
    RunsHeld,
    RunsUnheld,
    OrderAccepted,
    OrderRejected,
    OrderCancelRequested,
    ApprovalRequested,
    ApprovalDecided,
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
    PolicyAdopted,
    PolicyDeferred,
)
