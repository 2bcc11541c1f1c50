"""An agent's state: only ever a fold of its events (see `lanes.evolve`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from lanes.config import DAY_MS, HOUR_MS, AgentConfig, CallResults, Mode
from lanes.events import (
    ApprovalRequested,
    CallIntent,
    CallResult,
    CallStatus,
    OrderIntent,
    ServedCall,
    Summary,
    TradingState,
)
from lanes.requests import AgentRequest, Priority
from lanes.schedules import ScheduleEntry
from lanes.tables import LaneState


@dataclass(slots=True)
class Pending:
    """A request waiting in the reasoning lane, with its arrival time and arrival mode.

    Never changed once made (not frozen only because a frozen dataclass is several times
    slower to build, and one is built for every accepted request)."""

    request: AgentRequest
    at: int
    mode: Mode
    key: str | None = None
    """The dedupe key it holds, as computed under the config it arrived with."""


@dataclass(slots=True)
class ActiveRun:
    """The reasoning run in progress."""

    run_id: str
    requests: list[Pending]
    started_at: int
    deadline: int
    depth: int
    summary: Summary | None = None
    steerable: bool = False
    steers: int = 0
    steps: int = 0
    """Model calls taken as its steps so far (a run with tools: `lanes.decide_steps`)."""
    scheduled: tuple[CallIntent, ...] = ()
    """Sub-agent tasks its ``schedule_tasks`` calls scheduled, not sent yet."""
    sent: int = 0
    """Sub-agent tasks its ``execute_scheduled_tasks`` calls sent (or had refused)."""


@dataclass(frozen=True, slots=True)
class OpenOrder:
    """An order accepted by the gate and not yet closed."""

    order_id: str
    run_id: str
    intent: OrderIntent
    filled_qty: float = 0.0
    cancel_requested: bool = False


PendingApproval = ApprovalRequested
"""An order waiting for a human's approval (`lanes.approvals`): the decision that set it
waiting holds all there is to know of it."""


@dataclass(frozen=True, slots=True)
class TradingChange:
    """The latest control that set the trading state: which, by whom (the principal, or the
    request's source or kind when none is known) and when."""

    action: str
    """A control action (``emergency_stop``, ``pause``, ``resume``) or ``hold`` (a provider
    spend limit)."""
    by: str
    at: int


@dataclass(slots=True)
class Counters:
    """Running totals for observability; all derived from the log."""

    received: int = 0
    accepted: int = 0
    repeats: int = 0
    dedupes: int = 0
    drops: int = 0
    summarized: int = 0
    rejected: int = 0
    fallbacks: int = 0
    controls: int = 0
    runs: int = 0
    completed: int = 0
    failed: int = 0
    aborts: int = 0
    steers: int = 0
    suppressions: int = 0
    """Times runs were held back by a runs budget (per hour, per day)."""
    cooldowns: int = 0
    """Times runs waited for the cooldown after a no-trade run (not a budget: counted apart)."""
    holds: int = 0
    """Times the agent was paused because its LLM provider refused for spend."""
    orders_accepted: int = 0
    orders_rejected: int = 0
    calls_dispatched: int = 0
    calls_rejected: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(slots=True)
class OpenCall:
    """A sub-agent call this agent made that has not ended: queued, or out (``dispatched``)."""

    call_id: str
    run_id: str
    target: str
    depth: int
    priority: Priority
    payload: dict[str, Any]
    timeout_ms: int | None = None
    dispatched: bool = False
    deadline: int | None = None


@dataclass(slots=True)
class CallBatch:
    """The calls one run made, awaited together."""

    run_id: str
    results: CallResults
    depth: int
    serves: list[ServedCall] = field(default_factory=list)
    open: int = 0
    """Calls of the batch not ended yet."""
    out: int = 0
    """Of which dispatched (at most ``max_parallel_calls``)."""
    ended: list[CallResult] = field(default_factory=list)
    """Results not handed to the reasoning lane yet (``all``: every one, at the end)."""
    awaited_by: str | None = None
    """The run waiting for these calls in its ``execute_scheduled_tasks`` (the results go
    to it, not to the reasoning lane; a refused call is a result too)."""


@dataclass(slots=True)
class CallBook:
    """This agent's sub-agent calls: those it made (queue, slots, batches) and the calls it
    serves for others carried by requests it made itself (results)."""

    open: dict[str, OpenCall] = field(default_factory=dict)
    queue: list[str] = field(default_factory=list)
    """Queued call ids in the order they go out: high priority first, FIFO within one."""
    out: int = 0
    """Calls dispatched and not ended (of all batches)."""
    deadlines: dict[str, int] = field(default_factory=dict)
    """Call id -> when it times out, for the calls out that have a timeout."""
    batches: dict[str, CallBatch] = field(default_factory=dict)
    carried: dict[str, list[ServedCall]] = field(default_factory=dict)
    """Request id of a results request -> the calls it carries the answer of."""
    ended: dict[CallStatus, int] = field(default_factory=dict)
    """How many calls ended in each status (made, ended here: every call in exactly one)."""
    answered: int = 0
    """Calls served for others and answered."""


@dataclass(slots=True)
class AgentState:
    """One agent's two lanes. Mutable, but only `lanes.evolve.evolve` changes it."""

    agent_id: str
    config: AgentConfig = field(default_factory=AgentConfig)
    version: int = 0
    """How many events of the stream have been folded in (the stream version)."""
    now: int = 0
    """The time of the latest input."""
    trading: TradingState = TradingState.ACTIVE
    staged: AgentRequest | None = None
    """The request just received and not yet decided (between an input and its decision)."""
    staged_by: str | None = None
    """Who sent ``staged``: its principal, else its source, else its kind."""
    trading_change: TradingChange | None = None
    """The latest control that set ``trading`` (None: never changed since the start)."""
    failure: tuple[str, int, str] | None = None
    """(run id, when, error) of the latest run if it failed or timed out (None once a run
    completes or the agent is resumed)."""
    pending: list[Pending] = field(default_factory=list)
    active: ActiveRun | None = None
    run_seq: int = 0
    collect_first: int | None = None
    collect_due: int | None = None
    summary: Summary | None = None
    run_starts: deque[int] = field(default_factory=deque)
    spend: deque[tuple[int, int, int, float]] = field(default_factory=deque)
    desk_block: tuple[int, str] | None = None
    """Until when the desk's budget holds its runs back, and which budget (`DeskBudgetSpent`)."""
    """The last day's completed runs (at, input tokens, output tokens, cost), kept while a
    token or spend budget is set (`lanes.spending`)."""
    """Start times of runs in the last day, oldest first (budget windows)."""
    cooldown_until: int = 0
    suppressed: tuple[str, int] | None = None
    held: str | None = None
    """Why runs are held until a ``resume`` (the provider refused for spend), if they are."""
    recent_keys: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Dedupe key -> (request id, accepted at), oldest first."""
    pending_keys: dict[str, str] = field(default_factory=dict)
    """Dedupe key -> id of the pending request that holds it."""
    seen: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    """Request id -> (first decision, at, fingerprint), oldest first: resubmissions are
    idempotent, and a different request under a used id is refused."""
    orders: dict[str, OpenOrder] = field(default_factory=dict)
    approvals: dict[str, PendingApproval] = field(default_factory=dict)
    """Orders waiting for a human's approval, by approval id, in the order asked."""
    positions: dict[str, float] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    schedules: dict[str, ScheduleEntry] = field(default_factory=dict)
    """Schedule id -> the schedule in force and how far it fired."""
    calls: CallBook = field(default_factory=CallBook)
    policy: int = 1
    """The policy version this stream decides under (`lanes.policy`; 1: never adopted)."""
    policy_offered: int | None = None
    """A newer version it adopts once it is at rest (`PolicyDeferred`), if any."""

    @property
    def lane(self) -> LaneState:
        """The reasoning lane's state."""
        return LaneState.IDLE if self.active is None else LaneState.RUNNING


@dataclass(frozen=True, slots=True)
class RunView:
    """The active run as an observer sees it."""

    run_id: str
    request_ids: tuple[str, ...]
    started_at: int
    duration_ms: int
    deadline: int
    steerable: bool
    steers: int


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """What an operator wants to know about an agent, at time ``now``."""

    agent_id: str
    trading: TradingState
    lane: LaneState
    mode: Mode
    pending: int
    oldest_pending_age_ms: int | None
    active_run: RunView | None
    runs_last_hour: int
    runs_last_day: int
    cooldown_remaining_ms: int
    suppressed_until: int | None
    held: str | None
    """Runs held until a resume (provider spend limit), and why."""
    open_orders: int
    counters: Counters
    pending_approvals: int = 0
    """Orders waiting for a human's approval."""


def status(state: AgentState, now: int) -> AgentStatus:
    """Observability derived from the state alone (no counters kept elsewhere)."""
    run = state.active
    view = None
    if run is not None:
        view = RunView(
            run_id=run.run_id,
            request_ids=tuple(p.request.request_id for p in run.requests),
            started_at=run.started_at,
            duration_ms=max(0, now - run.started_at),
            deadline=run.deadline,
            steerable=run.steerable,
            steers=run.steers,
        )
    oldest = min((p.at for p in state.pending), default=None)
    return AgentStatus(
        agent_id=state.agent_id,
        trading=state.trading,
        lane=state.lane,
        mode=state.config.mode,
        pending=len(state.pending),
        oldest_pending_age_ms=None if oldest is None else max(0, now - oldest),
        active_run=view,
        runs_last_hour=sum(1 for t in state.run_starts if t > now - HOUR_MS),
        runs_last_day=sum(1 for t in state.run_starts if t > now - DAY_MS),
        cooldown_remaining_ms=max(0, state.cooldown_until - now),
        suppressed_until=None if state.suppressed is None else state.suppressed[1],
        held=state.held,
        open_orders=len(state.orders),
        pending_approvals=len(state.approvals),
        counters=replace(state.counters),
    )
