"""The shapes of the HTTP API's answers, as pydantic models: `/openapi.json` describes each
answer with them, and the tests validate live answers against them (every field present,
null when none; an unknown field is an error, so the document cannot drift)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from lanes import AgentConfig
from lanes.config import Mode
from lanes.events import TradingState
from lanes.gate.events import GateLimits
from lanes.requests import WireModel


class RunJson(WireModel):
    """The active run."""

    run_id: str
    request_ids: list[str]
    started_at: int
    duration_ms: int
    deadline: int
    steerable: bool
    steers: int


class CallsJson(WireModel):
    """The agent's sub-agent calls: queued, out, ended by status, answered."""

    queued: int
    out: int
    ended: dict[str, int]
    answered: int


class AgentSummary(WireModel):
    """An agent's status (`GET /api/agents`, one per agent in scope)."""

    agent_id: str
    trading: TradingState
    lane: Literal["idle", "running"]
    mode: Mode
    pending: int
    oldest_pending_age_ms: int | None
    active_run: RunJson | None
    runs_last_hour: int
    runs_last_day: int
    cooldown_remaining_ms: int
    suppressed_until: int | None
    held: str | None
    open_orders: int
    pending_approvals: int = 0
    """Orders waiting for a human's approval (`GET /api/approvals`)."""
    counters: dict[str, int]
    blocked: list[dict[str, Any]]
    """Why the agent is not running, most severe first (each with a ``kind``)."""
    attention: Literal["critical", "warning", "info", "none"]
    budgets: dict[str, int | None]
    calls: CallsJson
    served_by: str | None = None
    """In a cluster: the URL of the process that owns the agent (null while it moves)."""


class ScheduleJson(WireModel):
    """A schedule with how far it fired."""

    id: str
    cron: str | None
    every_ms: int | None
    timezone: str
    payload: dict[str, Any]
    priority: Literal["high", "normal", "low"]
    paused: bool
    catch_up: Literal["skip", "once"]
    since: str
    fired: int
    last_fire_at: str | None
    next_fire_at: str | None
    from_file: bool


class AgentJson(AgentSummary):
    """One agent (`GET /api/agents/{id}`): its status, config and schedules."""

    config: AgentConfig
    schedules: list[ScheduleJson]


class SchedulesJson(WireModel):
    """An agent's schedules."""

    schedules: list[ScheduleJson]


class QueuedJson(WireModel):
    """A pending request with its age."""

    request_id: str
    kind: str
    priority: str
    mode: Mode
    dedupe_key: str | None
    age_ms: int


class QueueRunJson(WireModel):
    """The active run as the queue view shows it."""

    run_id: str
    started_at: int
    duration_ms: int
    deadline: int
    steerable: bool
    steers: int
    requests: list[str]


class QueueJson(WireModel):
    """An agent's lane: busy or not, the run, the pending list in order."""

    agent_id: str
    busy: bool
    trading: TradingState
    run: QueueRunJson | None
    pending: list[QueuedJson]


class OperatedJson(WireModel):
    """An operator action's answer: the events it recorded."""

    applied: bool
    events: list[str]
    detail: str


class ConfiguredJson(WireModel):
    """A config change's answer."""

    changed: bool
    config: AgentConfig


class LimitsJson(WireModel):
    """A provider's new limits."""

    changed: bool
    limits: GateLimits


class EventJson(WireModel):
    """A committed event."""

    position: int
    stream: str
    version: int
    type: str
    data: dict[str, Any]
    recorded_at: int


class WaitingAgentJson(WireModel):
    """An agent's requests waiting at a provider gate."""

    agent_id: str
    waiting: int
    oldest_wait_ms: int
    tokens: int


class ProviderJson(WireModel):
    """A provider gate's status."""

    name: str
    stream: str
    provider: str
    limits: GateLimits
    window_requests: int
    window_input_tokens: int
    window_output_tokens: int
    in_flight: int
    waiting: int
    waiting_agents: list[WaitingAgentJson]
    breaker: Literal["closed", "open", "half_open"]
    breaker_until: int | None
    probe_in_flight: bool
    next_retry: int | None
    backoff_attempt: int
    remaining_requests: int | None
    remaining_tokens: int | None
    provider_reset_at: int | None
    counters: dict[str, int]


class ScheduleChangedJson(WireModel):
    """A schedule put, paused or resumed."""

    changed: bool
    schedule: ScheduleJson


class RemovedJson(WireModel):
    """A schedule removed."""

    removed: str


class ApprovalJson(WireModel):
    """An order waiting for a human's approval."""

    agent_id: str
    approval_id: str
    order_id: str
    run_id: str
    order: dict[str, Any]
    notional: float | None
    expires_at: int
    expires_in_ms: int


class ApprovalsJson(WireModel):
    """The orders waiting for approval, the soonest to expire first."""

    approvals: list[ApprovalJson]


class DeskBudgetRowJson(WireModel):
    """One desk budget's use now."""

    budget: str
    window: str
    used: float
    limit: float
    fraction: float


class DeskBudgetJson(WireModel):
    """The desk's token and spend budgets ([desk.budgets]): each one's use, and until when
    every agent's runs are held back (if one is used up)."""

    configured: bool
    budgets: list[DeskBudgetRowJson]
    alert_at: list[float] | None = None
    held_until: int | None = None
    detail: str | None = None


class AlertJson(WireModel):
    """One alert (`gateway.reads.alerts`); webhooks get the same JSON."""

    id: str
    kind: str
    severity: Literal["critical", "warning", "info"]
    at: int
    text: str
    agent_id: str | None = None
    position: int | None = None


class AlertsJson(WireModel):
    """The newest alerts, newest first, and the kinds raised."""

    alerts: list[AlertJson]
    rules: list[str]


class HooksJson(WireModel):
    """Whether the hook rules are paused, by whom, when and why; requests not sent."""

    paused: bool
    by: str | None = None
    at: int | None = None
    reason: str | None = None
    suppressed: int


class FeedJson(WireModel):
    """Feed health: connectors, each symbol's last data and age, warnings, the hooks."""

    at: int
    stale_ms: int
    connectors: list[dict[str, Any]]
    symbols: list[dict[str, Any]]
    warnings: list[str]
    hooks: HooksJson


class HooksChangedJson(WireModel):
    """The answer to a pause or resume of the hook rules."""

    changed: bool
    hooks: HooksJson


class ProvidersJson(WireModel):
    """Every provider gate."""

    providers: list[ProviderJson]


class EventsPage(WireModel):
    """A page of the log, oldest first; ``next``: the position to ask ``after`` next."""

    events: list[EventJson]
    next: int | None


class EventsFound(WireModel):
    """Events a search found, newest first; ``before``: where to search further back from
    (null: the start of the log was reached); ``scanned``: events looked at."""

    events: list[EventJson]
    before: int | None
    scanned: int


class EventCauseJson(WireModel):
    """An event, the input that caused it (itself, for an input) and that input's
    decisions (at most 1,000: ``truncated`` says more were left out)."""

    event: EventJson
    input: EventJson | None
    decisions: list[EventJson]
    truncated: bool


class TypesJson(WireModel):
    """The event types of one kind of stream."""

    inputs: list[str]
    decisions: list[str]


class EventTypesJson(WireModel):
    """Which event types are inputs and which decisions, for agent and gate streams."""

    agent: TypesJson
    provider: TypesJson


class AgentEventsJson(WireModel):
    """A page of one agent's stream, newest last; ``more``: older events remain."""

    agent_id: str
    events: list[EventJson]
    more: bool


class CallRunJson(WireModel):
    """The calls one run made (each a tree: its result and the calls made serving it)."""

    run_id: str
    calls: list[dict[str, Any]]


class CallTreesJson(WireModel):
    """An agent's sub-agent call trees, by run, and its calls counted by status."""

    agent_id: str
    runs: list[CallRunJson]
    counts: dict[str, int]


class ReplayJson(WireModel):
    """An agent as it was at a log position: its status and queue then, and the events
    around the position."""

    agent_id: str
    position: int
    event_position: int
    version: int
    at: int
    status: AgentSummary
    queue: QueueJson
    around: list[EventJson]


class UsageJson(WireModel):
    """Tokens a run used."""

    input_tokens: int
    output_tokens: int


class RunGateJson(WireModel):
    """A run's calls at its provider gate: time waiting against time in the model."""

    wait_ms: int
    model_ms: int
    calls: int
    refused: int
    complete: bool


class RunHistoryJson(WireModel):
    """One run, from the log."""

    run_id: str
    version: int
    position: int
    started_at: int
    ended_at: int | None
    duration_ms: int | None
    outcome: str
    detail: str | None
    by: str | None
    requests: list[str]
    depth: int
    steers: int
    usage: UsageJson
    gate: RunGateJson | None
    orders: list[dict[str, Any]]
    calls: int
    answer: str | None
    steps: list[dict[str, Any]] = Field(default_factory=list)
    """A tool loop's steps: each model call (``step``, ``tokens``, ``steered``) with its
    tool calls (``callId``, ``name``, ``status`` asked / returned / failed / refused,
    ``detail``)."""


class RunsJson(WireModel):
    """An agent's runs, newest first; ``before``: the version to page back from."""

    agent_id: str
    runs: list[RunHistoryJson]
    before: int | None


class AgentSeriesJson(WireModel):
    """One agent's series, one value per step."""

    agent_id: str
    series: dict[str, list[int]]
    truncated: bool


class ChartsJson(WireModel):
    """Per-agent series from the log over ``from``..``to`` in steps, and the stop, pause,
    resume and hold marks (each with its time, agent, position, who and what)."""

    from_: int = Field(alias="from")
    to: int
    step: int
    agents: list[AgentSeriesJson]
    marks: list[dict[str, Any]]


class CapacitySeriesJson(WireModel):
    """The desk's (``agents``: how many) or one agent's (``agentId``) capacity per step:
    pending requests (the most at the end of any second of the step), runs ended and their
    latency, median and 95th percentile (ms; null: none ended)."""

    agent_id: str | None = None
    agents: int | None = None
    depth: list[int]
    runs: list[int]
    p50: list[int | None]
    p95: list[int | None]


class GateCapacityJson(WireModel):
    """A provider gate's capacity per step: requests waiting for a slot (the most at the
    end of any second), waits ended and their median and 95th percentile (ms), requests and
    tokens granted in the 60 s window (the most at the end of any second) and their share of
    the limits in force (null: unlimited); ``limits`` as at the window's end."""

    provider: str
    limits: dict[str, int | None]
    waiting: list[int]
    waits: list[int]
    wait_p50: list[int | None]
    wait_p95: list[int | None]
    requests: list[int]
    input_tokens: list[int]
    output_tokens: list[int]
    request_use: list[float | None]
    token_use: list[float | None]


class CapacityJson(WireModel):
    """Capacity over ``from``..``to`` in steps of ``step`` ms, folded from the log up to
    ``position`` (whole from ``since``; null: from the log's start; ``behind``: events
    still to read): the desk, the agents
    named (or, with ``busiest``, the busiest), each provider gate, and the marks in the
    window (stops, pauses, resumes, holds, limit changes, the breaker)."""

    from_: int = Field(alias="from")
    to: int
    step: int
    position: int
    since: int | None
    behind: int
    """Events of the log not folded yet (a long log's first read goes on: ask again)."""
    busiest: bool
    desk: CapacitySeriesJson
    agents: list[CapacitySeriesJson]
    gates: list[GateCapacityJson]
    marks: list[dict[str, Any]]


ANSWERS: dict[str, type[WireModel]] = {
    "CapacityJson": CapacityJson,
    "EventCauseJson": EventCauseJson, "EventTypesJson": EventTypesJson,
    "AgentEventsJson": AgentEventsJson, "CallTreesJson": CallTreesJson,
    "ReplayJson": ReplayJson, "RunsJson": RunsJson, "ChartsJson": ChartsJson,
    "ScheduleChangedJson": ScheduleChangedJson, "RemovedJson": RemovedJson,
    "ProvidersJson": ProvidersJson, "EventsPage": EventsPage, "EventsFound": EventsFound,
    "AgentSummary": AgentSummary, "AgentJson": AgentJson, "SchedulesJson": SchedulesJson,
    "QueueJson": QueueJson, "OperatedJson": OperatedJson, "ConfiguredJson": ConfiguredJson,
    "LimitsJson": LimitsJson, "EventJson": EventJson, "ProviderJson": ProviderJson,
    "ApprovalsJson": ApprovalsJson, "DeskBudgetJson": DeskBudgetJson, "FeedJson": FeedJson,
    "HooksChangedJson": HooksChangedJson, "AlertsJson": AlertsJson,
}
"""The answer models named in `/openapi.json`."""
