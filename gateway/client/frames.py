"""What the gateway sends, as the client reads it: the server frames of ``/ws/control`` and
``/ws/feed`` and those of ``/ws/worker`` (docs/protocol.md, docs/workers.md).

These are the client's own models, not the server's: camelCase on the wire, snake_case in
Python, frozen, and tolerant of fields a newer gateway adds (kept, not refused), so the client
needs nothing of the server's code (``tests/gateway/test_client_models.py`` checks them field
by field against the server's schemas).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Answer(BaseModel):
    """Base of what the client reads: camelCase on the wire, unknown fields kept, frozen."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True,
                              extra="allow", frozen=True)


JsonObject = dict[str, Any]
"""A JSON object the client passes on as it came (free-form payloads, configs)."""

# ----------------------------------------------------------------- /ws/control, /ws/feed


class Hello(Answer):
    """Sent once authenticated: who the gateway thinks you are."""

    type: Literal["hello"] = "hello"
    protocol: int
    principal: str
    role: str
    agents: list[str] | None
    """The agents this token may touch (None: all)."""
    heartbeat_ms: int | None = None
    """A subscription hears at least this often (None: no heartbeats)."""


class FlattenOrder(Answer):
    """A closing market order an operator's flatten sent."""

    order_id: str
    symbol: str
    side: str
    qty: float


class ControlEffect(Answer):
    """What an accepted control did, as committed (``changed``: false if nothing at all)."""

    from_state: str
    to_state: str
    changed: bool
    aborted_run: str | None = None
    cancels_requested: int = 0
    unheld: bool = False
    started_run: str | None = None
    calls_cancelled: int = 0
    flatten_orders: list[FlattenOrder] = Field(default_factory=list)


class AckFrame(Answer):
    """A request's decision, sent only after the commit that holds it (``repeated``: the
    requestId was seen before and this is its first decision again)."""

    type: Literal["ack"] = "ack"
    id: str | None = None
    request_id: str
    decision: Literal["accepted", "deduped", "dropped", "rejected"]
    position: int
    reason: str | None = None
    repeated: bool = False
    effect: ControlEffect | None = None


class ErrorFrame(Answer):
    """Something was wrong or could not be done; nothing was changed by it."""

    type: Literal["error"] = "error"
    id: str | None = None
    code: str
    message: str
    request_id: str | None = None
    field: str | None = None


AckOrError = Annotated[AckFrame | ErrorFrame, Field(discriminator="type")]


class AcksFrame(Answer):
    """One answer per request of a ``submit_many``, in order."""

    type: Literal["acks"] = "acks"
    id: str | None = None
    results: list[AckOrError]


class MarketAck(Answer):
    """Market events taken, and the acks of the requests hook rules made of them."""

    type: Literal["market_ack"] = "market_ack"
    id: str | None = None
    events: int
    triggered: list[AckOrError]


class Snapshot(Answer):
    """Each subscribed agent's status as of ``position`` (as ``GET /api/agents`` gives it);
    events after it follow."""

    type: Literal["snapshot"] = "snapshot"
    id: str | None = None
    position: int
    agents: list[JsonObject]
    providers: list[JsonObject] = Field(default_factory=list)


class EventFrame(Answer):
    """One committed event of a subscribed stream."""

    type: Literal["event"] = "event"
    position: int
    stream: str
    version: int
    event_type: str
    data: JsonObject
    recorded_at: int


class EventsFrame(Answer):
    """Events in commit order (a subscription with ``batch``)."""

    type: Literal["events"] = "events"
    events: list[EventFrame]


class Pong(Answer):
    """Answer to a ping: the log's last committed position."""

    type: Literal["pong"] = "pong"
    id: str | None = None
    position: int


class AgentKilled(Answer):
    """What a desk kill did to one agent: its stop's decision and effect, or its error."""

    agent_id: str
    decision: str | None = None
    position: int | None = None
    effect: ControlEffect | None = None
    error: str | None = None
    message: str | None = None
    flatten_orders: list[FlattenOrder] | None = None
    """With a flatten: the closing orders sent for it."""
    flatten_note: str | None = None
    """With a flatten: why no closing order was sent."""


class DeskKilled(Answer):
    """One desk kill, as recorded (``DeskKilled`` in the stream ``gateway:desk``)."""

    kill_id: str
    at: int
    principal: str
    reason: str | None = None
    scope: list[str] | None = None
    flatten: bool = False
    agents: list[AgentKilled]
    position: int | None = None


class DeskKillAck(Answer):
    """A desk kill's answer, after the commit of its record."""

    type: Literal["desk_kill_ack"] = "desk_kill_ack"
    id: str | None = None
    kill: DeskKilled
    halted: int
    """Agents HALTED now (by this kill or already)."""
    cancels_requested: int
    flatten_orders: int = 0
    """Closing orders its flatten sent."""


# -------------------------------------------------------------------------- /ws/worker


class Request(Answer):
    """A request as a run receives it (an AgentRequest's wire JSON)."""

    request_id: str
    created_at: datetime
    agent_id: str
    kind: str
    priority: str = "normal"
    dedupe_key: str | None = None
    message_id: str | None = None
    source: str | None = None
    payload: JsonObject = Field(default_factory=dict)
    if_busy: str | None = None


class Summary(Answer):
    """Requests folded away by a ``summarize`` cap, handed to the next run."""

    count: int
    request_ids: list[str]
    first_at: int
    last_at: int


class WorkerReady(Answer):
    """Sent after `Hello` on ``/ws/worker``: the worker agents this worker serves."""

    type: Literal["ready"] = "ready"
    agents: list[str]
    heartbeat_ms: int
    member: str | None = None
    """In a cluster: the URL of the member this connection is to (None: no cluster)."""
    members: list[str] = Field(default_factory=list)
    """In a cluster: the URL of every live member, this one included."""


class MembersFrame(Answer):
    """The cluster's live members changed: be connected to each of them (and to no other)."""

    type: Literal["members"] = "members"
    members: list[str]


class WireToolSpec(Answer):
    """A tool the run may call (run by the gateway when a step calls it)."""

    name: str
    description: str
    input_schema: JsonObject


class RunFrame(Answer):
    """A run to do: its requests, the agent's context and the tools it may call."""

    type: Literal["run"] = "run"
    run_id: str
    agent_id: str
    requests: list[Request]
    summary: Summary | None = None
    depth: int
    tools: list[WireToolSpec]
    max_steps: int


class WireToolResult(Answer):
    """The answer to one tool call of a step, in its order."""

    call_id: str
    content: str
    is_error: bool = False


class ToolResultsFrame(Answer):
    """A step's tool results, and requests steered into the run since the last step."""

    type: Literal["tool_results"] = "tool_results"
    run_id: str
    step: int
    results: list[WireToolResult]
    steers: list[Request] = Field(default_factory=list)
