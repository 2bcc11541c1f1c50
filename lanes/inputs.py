"""The inputs of an agent's stream: facts from outside, each carrying its time (``at``, ms
since the epoch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from lanes.config import AgentConfig, CallResults
from lanes.policy import PolicyOffered
from lanes.requests import AgentRequest
from lanes.schedules import Schedule
from lanes.vocabulary import (
    CallIntent,
    OperatorAction,
    OrderIntent,
    Outcome,
    ToolCallMade,
    Usage,
)


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
    prices: dict[str, float] = field(default_factory=dict)
    """The latest price of each symbol its orders name, as the gateway had it (what an
    approval rule's notional is reckoned with; written only when set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCalled:
    """One model call of a run that is a loop of steps: step ``step`` (from 1), what it
    used, why it stopped, its text (cut at `STEP_TEXT_LIMIT`) and the tools it asked for
    (none: its final answer follows as `RunFinished`)."""

    at: int
    run_id: str
    step: int
    input_tokens: int = 0
    output_tokens: int = 0
    stop_reason: str | None = None
    text: str = ""
    tool_calls: tuple[ToolCallMade, ...] = ()
    steered: tuple[str, ...] = ()
    """The requests steered into the run that this call was the first to see (delivered
    after the previous step's tool results)."""
    prices: dict[str, float] = field(default_factory=dict)
    """The latest price of each symbol its orders name (as `RunFinished.prices`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolReturned:
    """A tool call of the run's step ``step`` returned (``ok``) or failed: its result or
    error as the model is told it, cut at `STEP_TEXT_LIMIT` (``size`` is the whole's length
    in characters, ``digest`` its SHA-256 when it was cut)."""

    at: int
    run_id: str
    step: int
    call_id: str
    name: str
    ok: bool
    content: str = ""
    size: int = 0
    digest: str | None = None


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
class DeskBudgetSpent:
    """The desk's token or spend budget (``[desk.budgets]``, over every agent this process
    decides for) is used up until ``until``: no run of this agent starts before then (an
    ``until`` not after ``at`` lifts an earlier one). ``detail`` names the budget."""

    at: int
    until: int
    detail: str


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
class WorkerLost:
    """The worker doing a run (``reasoner.kind = "worker"``) disconnected or missed its
    heartbeats: the run is aborted and its requests go back to the head of the queue."""

    at: int
    run_id: str
    worker: str
    """The lost worker's name (its token's)."""
    rerun: bool
    """Whether another worker was connected for the agent: then the rerun starts at once;
    otherwise the requests wait for a worker."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerReady:
    """A worker connected for an idle agent whose requests wait: the next run may start."""

    at: int
    worker: str


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
    | ModelCalled
    | ToolReturned
    | OperatorCommand
    | ConfigChanged
    | ScheduleChanged
    | BrokerReport
    | SpendLimitHit
    | DeskBudgetSpent
    | CallUndeliverable
    | Stopping
    | Restarted
    | WorkerLost
    | WorkerReady
    | Quarantined
    | PolicyOffered
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
    ModelCalled,
    ToolReturned,
    PolicyOffered,
    DeskBudgetSpent,
    WorkerLost,
    WorkerReady,
)
INPUTS: frozenset[type[Any]] = frozenset(INPUT_TYPES)
"""The input classes, for a quick ``type(event) in INPUTS``."""


def is_input(event: object) -> TypeGuard[Input]:
    """Whether an event is an input (what came in) rather than a decision."""
    return type(event) in INPUTS
