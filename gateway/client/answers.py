"""What the HTTP API answers about agents, their schedules, runs and log, as the client reads
it (the shapes ``/openapi.json`` names; see docs/protocol.md).

Each model is the client's own, tolerant of fields a newer gateway adds; where an answer
holds free-form JSON (a config, a payload, a call tree), it stays a `JsonObject`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.client.frames import Answer, JsonObject

# ------------------------------------------------------------------------------- agents


class ActiveRun(Answer):
    """The run an agent is doing now."""

    run_id: str
    request_ids: list[str]
    started_at: int
    duration_ms: int
    deadline: int
    steerable: bool
    steers: int


class CallCounts(Answer):
    """An agent's sub-agent calls: queued, out, ended by status, answered."""

    queued: int
    out: int
    ended: dict[str, int]
    answered: int


class Blocked(Answer):
    """One reason an agent does not run, or what it is doing (``kind``: ``halted``,
    ``suppressed``, ``cooldown``, ``gate``, ``running``, ...; its facts are the model's
    extra fields, docs/protocol.md "Why an agent is blocked")."""

    kind: str


class AgentSummary(Answer):
    """An agent's status (``GET /api/agents``)."""

    agent_id: str
    trading: str
    """``ACTIVE``, ``REDUCING`` or ``HALTED``."""
    lane: str
    mode: str
    pending: int
    oldest_pending_age_ms: int | None
    active_run: ActiveRun | None
    runs_last_hour: int
    runs_last_day: int
    cooldown_remaining_ms: int
    suppressed_until: int | None
    held: str | None
    open_orders: int
    pending_approvals: int = 0
    counters: dict[str, int]
    blocked: list[Blocked]
    """Why it does not run, most severe first."""
    attention: Literal["critical", "warning", "info", "none"]
    budgets: dict[str, int | None]
    calls: CallCounts
    served_by: str | None = None


class ScheduleInfo(Answer):
    """A schedule with how far it fired (times ISO 8601)."""

    id: str
    cron: str | None
    every_ms: int | None
    timezone: str
    payload: JsonObject
    priority: str
    paused: bool
    catch_up: str
    since: str
    fired: int
    last_fire_at: str | None
    next_fire_at: str | None
    from_file: bool


class Agent(AgentSummary):
    """One agent (``GET /api/agents/{id}``): its status, config and schedules."""

    config: JsonObject
    schedules: list[ScheduleInfo]


class Queued(Answer):
    """A pending request with its age."""

    request_id: str
    kind: str
    priority: str
    mode: str
    dedupe_key: str | None
    age_ms: int


class QueueRun(Answer):
    """The active run as the queue shows it."""

    run_id: str
    started_at: int
    duration_ms: int
    deadline: int
    steerable: bool
    steers: int
    requests: list[str]


class Queue(Answer):
    """An agent's lane: busy or not, the run, the pending list in order."""

    agent_id: str
    busy: bool
    trading: str
    run: QueueRun | None
    pending: list[Queued]


class Operated(Answer):
    """An operator action's answer (clear, release, abort): the events it recorded."""

    applied: bool
    events: list[str]
    detail: str


class Configured(Answer):
    """A config change's answer (``changed``: false if it was the config in force)."""

    changed: bool
    config: JsonObject


class ScheduleChanged(Answer):
    """A schedule put, paused or resumed."""

    changed: bool
    schedule: ScheduleInfo


class Removed(Answer):
    """A schedule removed."""

    removed: str


class Schedules(Answer):
    """An agent's schedules."""

    schedules: list[ScheduleInfo]


# -------------------------------------------------------------------------- providers


class WaitingAgent(Answer):
    """An agent's requests waiting at a provider gate."""

    agent_id: str
    waiting: int
    oldest_wait_ms: int
    tokens: int


class Provider(Answer):
    """A provider gate: limits, use of the current windows, waiting agents, breaker."""

    name: str
    stream: str
    provider: str
    limits: JsonObject
    window_requests: int
    window_input_tokens: int
    window_output_tokens: int
    in_flight: int
    waiting: int
    waiting_agents: list[WaitingAgent]
    breaker: Literal["closed", "open", "half_open"]
    breaker_until: int | None
    probe_in_flight: bool
    next_retry: int | None
    backoff_attempt: int
    remaining_requests: int | None
    remaining_tokens: int | None
    provider_reset_at: int | None
    counters: dict[str, int]


class Providers(Answer):
    """Every provider gate."""

    providers: list[Provider]


class LimitsChanged(Answer):
    """A provider's new limits."""

    changed: bool
    limits: JsonObject


# -------------------------------------------------------------------------------- log


class Event(Answer):
    """A committed event (``data`` as stored: snake_case keys)."""

    position: int
    stream: str
    version: int
    type: str
    data: JsonObject
    recorded_at: int


class EventsPage(Answer):
    """A page of the log, oldest first; ``next``: the position to read ``after`` next."""

    events: list[Event]
    next: int | None


class EventsFound(Answer):
    """Events a search found, newest first; ``before``: where to search further back from
    (None: the start of the log was reached)."""

    events: list[Event]
    before: int | None
    scanned: int


class EventCause(Answer):
    """An event, the input that caused it and every decision made of that input."""

    event: Event
    input: Event | None
    decisions: list[Event]
    truncated: bool


class TypeNames(Answer):
    """The event types of one kind of stream."""

    inputs: list[str]
    decisions: list[str]


class EventTypes(Answer):
    """Which event types are inputs and which decisions, of agent and gate streams."""

    agent: TypeNames
    provider: TypeNames


class AgentEvents(Answer):
    """A page of one agent's stream, oldest first; ``more``: older events remain."""

    agent_id: str
    events: list[Event]
    more: bool


class CallRun(Answer):
    """The calls one run made: each a tree (``callId``, ``target``, ``status``, its result
    and the ``calls`` made while serving it)."""

    run_id: str
    calls: list[JsonObject]


class CallTrees(Answer):
    """An agent's sub-agent call trees by run, and its calls counted by status."""

    agent_id: str
    runs: list[CallRun]
    counts: dict[str, int]


class Replay(Answer):
    """An agent as it was at a log position, and the events around it."""

    agent_id: str
    position: int
    event_position: int
    version: int
    at: int
    status: AgentSummary
    queue: Queue
    around: list[Event]


class Usage(Answer):
    """Tokens a run used."""

    input_tokens: int
    output_tokens: int


class RunGate(Answer):
    """A run's calls at its provider gate: time waiting against time in the model."""

    wait_ms: int
    model_ms: int
    calls: int
    refused: int
    complete: bool


class Run(Answer):
    """One run, from the log: its requests, outcome, tokens, gate time, orders, steps."""

    run_id: str
    version: int
    position: int
    started_at: int
    ended_at: int | None
    duration_ms: int | None
    outcome: str
    """``trade``, ``no_trade``, ``failed``, ``aborted`` or ``running``."""
    detail: str | None
    by: str | None
    requests: list[str]
    depth: int
    steers: int
    usage: Usage
    gate: RunGate | None
    orders: list[JsonObject]
    calls: int
    answer: str | None
    steps: list[JsonObject] = Field(default_factory=list)
    """A tool loop's steps: each model call with its tool calls (``name``, ``status``)."""


class Runs(Answer):
    """An agent's runs, newest first; ``before``: the version to page back from."""

    agent_id: str
    runs: list[Run]
    before: int | None


class AgentSeries(Answer):
    """One agent's series (runs, tokens, requests, drops, failures), one value a step."""

    agent_id: str
    series: dict[str, list[int]]
    truncated: bool


class Charts(Answer):
    """Per-agent series over ``from_`` .. ``to`` in steps, with stop, pause, resume and
    hold marks."""

    from_: int = Field(alias="from")
    to: int
    step: int
    agents: list[AgentSeries]
    marks: list[JsonObject]


# ------------------------------------------------------------------------------ story


class Said(Answer):
    """One decision of a story group, in words."""

    position: int
    type: str
    text: str
    kinds: list[str]


class StoryGroup(Answer):
    """An input and the decisions it caused, worded as ``gateway timeline`` words them."""

    position: int
    at: int
    type: str
    text: str
    kinds: list[str]
    decisions: list[Said]


class Story(Answer):
    """An agent's log as a story: groups in a position range, or around ``at``."""

    agent_id: str
    groups: list[StoryGroup]
    more: bool
    at: int | None = None
    index: int | None = None
    from_: int | None = Field(default=None, alias="from")
    to: int | None = None


class Found(Answer):
    """The position of the next or previous stop, drop or suppression (None: none)."""

    agent_id: str
    kind: str
    position: int | None


class Moment(Answer):
    """An agent replayed to a log position: trading, why it waits, budgets, pending,
    orders, positions and its provider gate's view then."""

    agent_id: str
    position: int
    event_position: int
    version: int
    at: int
    trading: str
    lane: str
    why: str
    budgets: JsonObject
    suppressed: JsonObject | None
    held: str | None
    run: JsonObject | None
    pending: list[JsonObject]
    orders: list[JsonObject]
    positions: dict[str, float]
    gate: JsonObject | None


class Diff(Answer):
    """What changed in an agent between two log positions."""

    agent_id: str
    from_: JsonObject = Field(alias="from")
    to: JsonObject
    changes: list[JsonObject]
    pending: JsonObject
    orders: list[JsonObject]
    positions: list[JsonObject]


class Readiness(Answer):
    """``GET /readyz``: ready for traffic, or why not (``reasons``)."""

    status: Literal["ready", "unready"]
    reason: str | None = None
    reasons: list[str] = Field(default_factory=list)
