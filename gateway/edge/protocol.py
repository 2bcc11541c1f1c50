"""Wire protocol v1: every WebSocket frame, validated by pydantic (unknown fields rejected).

A client frame is one JSON object with a ``type``; any frame may carry an ``id`` of the
client's choosing, echoed in every answer to it. Schemas: ``gateway schema``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import Field, StrictBool, StrictStr, TypeAdapter

from gateway.errors import BadFrame
from gateway.market.events import MarketEvent
from gateway.reads.pnl import PnlView
from gateway.runtime.desk import DeskKilled
from gateway.runtime.effects import ControlEffect
from lanes.requests import MAX_INT, AgentRequest, WireModel
from lanes.tools import tool_schemas

PROTOCOL_VERSION = 1
MAX_BATCH = 1_000
MAX_SUBSCRIBED = 10_000
"""The most agent ids one `Subscribe` may list (fewer than the gateway has agents, too)."""
MAX_JSON_NESTING = 200
"""The deepest nesting of a frame or body (a request's payload allows less: see
`lanes.requests.MAX_JSON_DEPTH`)."""
PNL_EVERY_MS = 1_000
"""How often a subscription with ``pnl`` looks whether its P&L changed."""
EVENTS_PER_FRAME = 500
"""The most events in one `EventsFrame` (fewer when they are big: about 256 KiB at most)."""
ClientId = Annotated[str | None, Field(default=None, max_length=128)]



def load_json(raw: str | bytes, what: str = "frame") -> Any:
    """The JSON value of a frame or body, parsed strictly (`BadFrame` ``malformed_json``
    otherwise): UTF-8 only, no NaN or Infinity, no lone UTF-16 surrogates, at most
    `MAX_JSON_NESTING` levels. (A number too large for a double comes back as infinity,
    which every model and payload refuses.)"""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadFrame("malformed_json", f"{what} is not UTF-8: byte {error.start} is "
                           "invalid") from None
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as error:
        text = str(error)
        if "recursion limit" in text:
            text = f"nested deeper than {MAX_JSON_NESTING} levels"
        elif "surrogate" in text or "hex escape" in text:
            text = f"a lone UTF-16 surrogate escape is not text ({text})"
        elif "expected value" in text and any(w in raw for w in ("NaN", "Infinity")):
            text = f"NaN and Infinity are not JSON ({text})"
        raise BadFrame("malformed_json", f"{what} is not JSON: {text}") from None


# ------------------------------------------------------------------- client -> server


class Auth(WireModel):
    """First frame when no ``Authorization`` header was sent: the bearer token."""

    type: Literal["auth"]
    token: str = Field(min_length=1, max_length=512)
    id: ClientId = None


class Submit(WireModel):
    """Submit one request; answered by an `AckFrame` after its commit."""

    type: Literal["submit"]
    request: AgentRequest
    id: ClientId = None


class SubmitMany(WireModel):
    """Submit up to 1,000 requests in one frame; answered by one `AcksFrame`."""

    type: Literal["submit_many"]
    requests: list[AgentRequest] = Field(min_length=1, max_length=MAX_BATCH)
    id: ClientId = None


class Market(WireModel):
    """Market events (one or a batch); hook rules turn them into ``hook_trigger`` requests."""

    type: Literal["market"]
    events: list[MarketEvent] = Field(min_length=1, max_length=MAX_BATCH)
    id: ClientId = None


class Subscribe(WireModel):
    """Follow agents (all in scope when ``agents`` is absent): a snapshot, then every event
    as it commits. With ``after``, events after that position are replayed first (resume)."""

    type: Literal["subscribe"]
    agents: list[str] | None = Field(default=None, max_length=MAX_SUBSCRIBED)
    """Repeats count once; more ids than the gateway has agents are refused."""
    after: int | None = Field(default=None, ge=0, le=MAX_INT)
    providers: bool = False
    """Also follow every provider gate (its status in the snapshot, its events after);
    needs a token that is not scoped to some agents."""
    batch: bool = False
    """Events come as `EventsFrame`s, each holding the events ready at once (up to
    `EVENTS_PER_FRAME`), instead of one `EventFrame` each: far less work per event for a busy
    follower (a browser's main thread, say)."""
    pnl: bool = False
    """Also `PnlFrame`s: the subscribed agents' P&L (as ``GET /api/pnl``) after the
    snapshot, then whenever it changed (a fill, a price), at most every `PNL_EVERY_MS`."""
    id: ClientId = None


class Unsubscribe(WireModel):
    """Stop following."""

    type: Literal["unsubscribe"]
    id: ClientId = None


class DeskKillBody(WireModel):
    """What a desk kill takes (``POST /api/desk/kill``'s body; every field optional)."""

    reason: StrictStr | None = Field(default=None, max_length=500)
    """Recorded with the kill and with each agent's stop."""
    flatten: StrictBool = False
    """Also close positions: after the stops, each stopped agent's operator ``flatten``
    (one closing market order per symbol it holds)."""


class DeskScope(WireModel):
    """``GET /api/desk/kill``: the agents a desk kill by this token would halt."""

    agents: list[str]
    scoped: bool
    """The token is scoped to these agents (else: every agent of the gateway)."""


class DeskKill(DeskKillBody):
    """Halt every agent in the token's scope and cancel their open orders (control and
    admin tokens): one emergency stop each, all at once (then, with ``flatten``, one
    flatten each), recorded as one ``DeskKilled`` event; answered by a `DeskKillAck` after
    its commit."""

    type: Literal["desk_kill"]
    id: ClientId = None


class Ping(WireModel):
    """Liveness; answered by a `Pong`."""

    type: Literal["ping"]
    id: ClientId = None


ClientFrame = Annotated[
    Auth | Submit | SubmitMany | Market | Subscribe | Unsubscribe | Ping | DeskKill,
    Field(discriminator="type"),
]
CLIENT_FRAME: TypeAdapter[Any] = TypeAdapter(ClientFrame)
CLIENT_TYPES = ("auth", "submit", "submit_many", "market", "subscribe", "unsubscribe", "ping",
                "desk_kill")

# ------------------------------------------------------------------- server -> client


class Hello(WireModel):
    """Sent once authenticated: who the server thinks you are."""

    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    principal: str
    role: str
    agents: list[str] | None
    """The agents this token may touch (None: all)."""
    heartbeat_ms: int | None = None
    """A subscription hears at least this often (a `Heartbeat` when nothing else is sent);
    None: this gateway sends no heartbeats."""


class AckFrame(WireModel):
    """A request's decision, sent only after the commit that holds it."""

    type: Literal["ack"] = "ack"
    id: str | None = None
    request_id: str
    decision: Literal["accepted", "deduped", "dropped", "rejected"]
    position: int
    reason: str | None = None
    repeated: bool = False
    effect: ControlEffect | None = None
    """For an accepted control (not a repeat): what it did."""


class ErrorFrame(WireModel):
    """Something was wrong with a frame or could not be done; nothing was changed by it."""

    type: Literal["error"] = "error"
    id: str | None = None
    code: str
    message: str
    request_id: str | None = None
    field: str | None = None


class BusyFrame(WireModel):
    """The writer is saturated: nothing was taken; send the same frame again later."""

    type: Literal["busy"] = "busy"
    id: str | None = None
    retry_after_ms: int


class AcksFrame(WireModel):
    """One answer per request of a `SubmitMany`, in order (an ack or an error each)."""

    type: Literal["acks"] = "acks"
    id: str | None = None
    results: list[AckFrame | ErrorFrame]


class MarketAck(WireModel):
    """Market events taken; ``triggered`` holds the acks of the requests hooks made of them."""

    type: Literal["market_ack"] = "market_ack"
    id: str | None = None
    events: int
    triggered: list[AckFrame | ErrorFrame]


class Snapshot(WireModel):
    """Each subscribed agent's status as of ``position``; events after it follow."""

    type: Literal["snapshot"] = "snapshot"
    id: str | None = None
    position: int
    agents: list[dict[str, Any]]
    providers: list[dict[str, Any]] = Field(default_factory=list)
    """Each provider gate's status (as ``GET /api/providers``), if subscribed to them."""


class EventFrame(WireModel):
    """One committed event of a subscribed agent (or provider gate: ``provider:<name>``)."""

    type: Literal["event"] = "event"
    position: int
    stream: str
    version: int
    event_type: str
    data: dict[str, Any]
    recorded_at: int


class EventsFrame(WireModel):
    """Events in commit order, for a subscription with ``batch``; each as an `EventFrame`."""

    type: Literal["events"] = "events"
    events: list[EventFrame]


class Pong(WireModel):
    """Answer to `Ping`."""

    type: Literal["pong"] = "pong"
    id: str | None = None
    position: int


class DeskKillAck(WireModel):
    """A desk kill's answer, after the commit of its record: what it did to each agent."""

    type: Literal["desk_kill_ack"] = "desk_kill_ack"
    id: str | None = None
    kill: DeskKilled
    halted: int
    """Agents HALTED now (by this kill or already)."""
    cancels_requested: int
    """Open orders whose cancel it sent."""
    flatten_orders: int = 0
    """Closing orders its flatten sent (0 without ``flatten``)."""


class Heartbeat(WireModel):
    """Sent on a subscription that had nothing else to send for ``heartbeatMs``: the
    connection and the gateway are alive. ``committed`` is the log's last committed position
    (events up to it may still be on their way); ``at`` the gateway's time."""

    type: Literal["heartbeat"] = "heartbeat"
    committed: int
    at: datetime


class PnlFrame(WireModel):
    """The P&L of a subscription's agents and of them together (``pnl``: as ``GET
    /api/pnl`` answers), for a subscription with ``pnl``."""

    type: Literal["pnl"] = "pnl"
    pnl: PnlView


ServerFrame = Annotated[
    Hello | AckFrame | AcksFrame | MarketAck | ErrorFrame | BusyFrame | Snapshot | EventFrame
    | EventsFrame | Pong | Heartbeat | DeskKillAck | PnlFrame,
    Field(discriminator="type"),
]


def json_schemas() -> dict[str, Any]:
    """JSON Schemas of every client and server frame (``gateway schema``), and of the
    frames of ``/ws/worker`` both ways (``worker``, ``gateway``)."""
    from gateway.edge.worker_protocol import worker_schemas  # (it builds on this module)

    return {
        "protocol": PROTOCOL_VERSION,
        "client": TypeAdapter(ClientFrame).json_schema(by_alias=True),
        "server": TypeAdapter(ServerFrame).json_schema(by_alias=True),
        "tools": tool_schemas(),
        **worker_schemas(),
    }
