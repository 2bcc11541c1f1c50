"""What the edge serves (`Service`: the engine and everything around it, with the
connection limits) and the limits' defaults."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.base.pacing import Pacer
from gateway.cluster.member import Cluster
from gateway.cluster.peers import Peers
from gateway.cluster.router import Router
from gateway.edge.alerting import Alerter
from gateway.edge.auth import Principal, TokenBook
from gateway.edge.frames import VALIDATE_STEP, Turn
from gateway.edge.intake import BUDGET_MS, HOLD_MS, Intake
from gateway.errors import Busy
from gateway.llm.port import LLMClient
from gateway.market.events import MarketEvent
from gateway.market.health import FeedHealth
from gateway.market.hooks import HookEngine
from gateway.reads.blotter import BlotterBook
from gateway.runtime.acks import Ack
from gateway.runtime.engine import Engine
from gateway.runtime.intake import WayIn, in_steps
from gateway.runtime.workers import WorkerHub
from lanes import AgentRequest
from store.port import LogReads

log = logging.getLogger("gateway.edge.service")


POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013
AUTH_TIMEOUT_S = 10.0
"""Default time a connection has to authenticate (`Service.auth_timeout_s`)."""
MAX_CONNECTIONS = 1_000
"""Default WebSocket connections open at once (`Service.max_connections`)."""
SUBPROTOCOL = "gateway.v1"
"""The WebSocket subprotocol a browser offers with `TOKEN_SUBPROTOCOL` (it is answered)."""
TOKEN_SUBPROTOCOL = "bearer."
"""A browser cannot set ``Authorization`` on a WebSocket: it offers the subprotocol
``bearer.<its token in base64url>`` instead, next to `SUBPROTOCOL`, and is authenticated
at the handshake like a client with the header."""
MAX_UNAUTHENTICATED = 100
"""Default connections waiting for their auth frame (`Service.max_unauthenticated`)."""
MAX_BAD_FRAMES = 20
"""Bad frames in a row before a connection is closed as abusive."""
MAX_CLOCK_SKEW_MS = 60_000
"""How far in the future a market event may be dated."""
MAX_IN_FLIGHT = 2_000
"""Frames one connection may have waiting for their commit before reading pauses."""
MAX_IN_FLIGHT_BYTES = 32 << 20
"""Bytes of frames one connection may have waiting before reading pauses."""
SEND_TIMEOUT_S = 10.0
"""Default time a client may leave a frame untaken before it is closed as a slow reader
(`Service.send_timeout_s`)."""
HEARTBEAT_S = 2.0
"""Default longest silence of a subscription before a heartbeat frame (`Service.heartbeat_s`)."""
REQUEST_TIMEOUT_S = 10.0
"""Default time a connection has to send a whole request (`Service.request_timeout_s`)."""
METRICS_MAX_AGENTS = 200
"""Default agents with ``/metrics`` series of their own (`Service.metrics_max_agents`)."""
TEXT_PIECES = "gateway.text_pieces"
"""An ASGI extension of this gateway's WebSocket server (`gateway.edge.server`), named in a
connection's ``scope["extensions"]``: a ``websocket.send`` message may carry, under this key
instead of ``text``, one text message as a list of pieces, which the server sends in
fragments as it encodes them (never joined into one text), emptying the list as it goes."""
SEND_NOW = "gateway.send_now"
"""An ASGI extension of the same server: ``scope["extensions"][SEND_NOW]["send"]`` is a
function that writes one short text message at once, without a coroutine, when nothing holds
it up (the client reads, the connection is open), and says whether it did (False: send it
the ASGI way, which waits for room)."""
ENDPOINTS = ("feed", "control", "worker")
CAUSE_PAGE = 256
"""Events read per step when walking back from an event to the input that caused it."""
MAX_CAUSE_DECISIONS = 1_000
"""Decisions of one input returned with it (a queue clear may make many)."""
MAX_SEARCH_TEXT = 200
"""Characters of a search of the log (``GET /api/events?q=``)."""
MAX_CHART_AGENTS = 20
"""Agents in one answer of ``GET /api/charts``."""


@dataclass
class Connections:
    """The WebSocket connections open now and how many ended for each limit (for /metrics)."""

    open: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENDPOINTS, 0))
    unauthenticated: int = 0
    """Open connections still waiting for their auth frame."""
    refused: int = 0
    """Handshakes answered 503: a connection cap was full."""
    auth_timeouts: int = 0
    slow_readers: int = 0

    @property
    def total(self) -> int:
        """Connections open on every endpoint."""
        return sum(self.open.values())


@dataclass
class Service:
    """What the app serves: the engine and everything around it."""

    engine: Engine
    tokens: TokenBook
    hooks: HookEngine | None = None
    market_observer: Callable[[MarketEvent], None] | None = None
    """Also told of every market event (the paper broker's prices)."""
    feed: FeedHealth = field(default_factory=FeedHealth)
    """Connectors' statuses, each symbol's latest data, hook rules paused or not."""
    alerter: Alerter | None = None
    """The desk's alerts on their way to webhooks (`gateway.edge.alerting`)."""
    allowed_origins: frozenset[str] = frozenset()
    """Browser origins let in besides the gateway's own (`server.allowed_origins`)."""
    own_origins: frozenset[str] = frozenset()
    """The origins the gateway is served at, set when it binds (`own_origins`): never taken
    from a request's ``Host`` header, which a DNS-rebinding page controls."""
    max_frame_bytes: int = 1 << 20
    intake_budget_ms: int = BUDGET_MS
    """Feed work is taken only while what waits for the log commits within this long
    (`gateway.edge.intake`); beyond it feed frames, and reasoning requests from elsewhere, are
    answered ``busy``."""
    intake_hold_ms: int = HOLD_MS
    """A feed frame beyond the budget waits this long for room (its connection unread
    meanwhile) before it is answered ``busy`` (0: at once)."""
    clients: Mapping[str, LLMClient] = field(default_factory=dict)
    """The LLM clients of the providers, closed when serving ends."""
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    max_connections: int = MAX_CONNECTIONS
    """WebSocket connections open at once (both endpoints); past it a handshake is answered
    503 with ``Retry-After``, so a flood of connections cannot grow memory without bound."""
    max_unauthenticated: int = MAX_UNAUTHENTICATED
    """Of those, connections waiting for their auth frame (a token in the header or the
    ``bearer.`` subprotocol is checked at once); past it a handshake without either is
    answered 503."""
    auth_timeout_s: float = AUTH_TIMEOUT_S
    """A connection that has not authenticated in this long is closed (1008)."""
    send_timeout_s: float = SEND_TIMEOUT_S
    """A client that leaves a frame untaken this long is closed as a slow reader (1008)."""
    heartbeat_s: float = HEARTBEAT_S
    """A subscription that had nothing to send for this long is sent a heartbeat frame, so a
    client can tell a quiet gateway from a frozen one (0: no heartbeats)."""
    request_timeout_s: float = REQUEST_TIMEOUT_S
    """A connection must send a whole HTTP request (or WebSocket handshake) within this long
    of connecting or of the request's first bytes (enforced by `gateway.edge.server`)."""
    metrics_max_agents: int = METRICS_MAX_AGENTS
    """Agents with ``/metrics`` series of their own; the others are summed under
    ``agent="_other"`` (`gateway.edge.agent_series`)."""
    connections: Connections = field(default_factory=lambda: Connections())
    cluster_secret: str | None = None
    """Several processes share the log: the secret they call each other's internal API with
    (`gateway.edge.internal`; None: not in a cluster, the internal routes do not exist)."""
    peers: Peers | None = None
    """Clients to the other processes of the cluster (an operator's HTTP call for an agent
    owned elsewhere is passed on to its owner)."""
    cluster_lease_ms: int = 5_000
    """The member lease of this process in its cluster (`gateway.cluster.member.Cluster`)."""
    advertise: str | None = None
    """The URL the other processes reach this one at (default: where it is bound)."""
    router: Router | None = None
    """Several processes share the log: the way in, split by owner (None: the engine)."""
    cluster: Cluster | None = None
    """This process's membership of its log's cluster (several processes on one PostgreSQL
    log), once it joined."""
    workers: WorkerHub = field(default_factory=WorkerHub)
    """The workers connected on ``/ws/worker`` (`gateway.runtime.workers`)."""
    intake: Intake = field(init=False)
    pacer: Pacer = field(default_factory=Pacer)
    """The feed's work takes turns on the event loop, so that a control waits for at most
    one unit of it (`gateway.base.pacing`)."""
    blotters: BlotterBook = field(default_factory=BlotterBook)
    """Every agent's blotter folded from the log, for the blotter and P&L (HTTP and the
    subscriptions' ``pnl`` frames alike)."""

    @property
    def log(self) -> LogReads:
        """The event log, to read (the edge's only way to it)."""
        return self.engine.store

    def __post_init__(self) -> None:
        self.intake = Intake(self.log, self.intake_budget_ms, hold_ms=self.intake_hold_ms,
                             clock=self.engine.clock)

    @property
    def way_in(self) -> WayIn:
        """Where requests from outside are taken: this process's engine, or (several
        processes share the log) the router that sends each where its agent is."""
        return self.engine if self.router is None else self.router

    async def take(self, requests: Sequence[AgentRequest], principal: str | None,
                   pacer: Pacer | None = None, parsed: bool = False
                   ) -> list[asyncio.Future[Ack]]:
        """Requests from outside, decided where their agents are, in steps: one answer
        each (`gateway.runtime.intake.in_steps`; ``parsed``: each was just parsed from a
        frame or body, as `gateway.runtime.intake.Intake.take` says)."""
        return await in_steps(self.way_in, requests, principal, pacer, parsed)

    def decided_here(self, agent_id: str) -> None:
        """Before an operator's command or config change is made in this process's engine:
        if another process decides for ``agent_id``, `NotOwner` (the route passes the call
        on to that process), so the engine is asked only for its own agents. (One that
        leaves meanwhile is refused by the engine with `NotOwner` all the same.)"""
        if self.router is not None and not self.engine.holds(agent_id):
            raise self.router.missing(agent_id)

    async def submit(self, request: AgentRequest, principal: str | None,
                     parsed: bool = False) -> Ack:
        """One request from outside, awaited to its ack (``parsed``: as `take`)."""
        return await self.way_in.take([request], principal, parsed=parsed)[0]

    def said_behind(self, agent_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body``, a read of an agent, with ``behind`` (``{"since": ms, "reason": ...}``)
        if it comes from this member's replica of the log while that is behind (another
        member decides for the agent, and this one's follower of the log failed): the read
        may be stale."""
        if self.cluster is not None:
            behind = self.cluster.replicas.behind_of(agent_id)
            if behind is not None:
                body["behind"] = behind
        return body

    def on_market(self, events: Iterable[MarketEvent]) -> list[AgentRequest]:
        """Market events, from a feed connection or the synthetic feed: each is shown to the
        paper broker (its prices), to the feed health and to the hook rules; the requests
        they trigger (none while an operator has paused the hook rules)."""
        requests: list[AgentRequest] = []
        feed, now = self.feed, self.engine.clock.now_ms()
        for event in events:
            feed.observe(event, now)
            if self.market_observer is not None:
                self.market_observer(event)
            if self.hooks is not None:
                triggered = self.hooks.on_event(event)  # (evaluated while paused: no
                if feed.hooks.paused:                   # crossing seen then fires later)
                    feed.suppressed += len(triggered)
                else:
                    requests += triggered
        return requests

    async def triggered(self, events: Sequence[MarketEvent],
                        turn: Turn | None = None) -> list[AgentRequest]:
        """`on_market` of a feed's events, `VALIDATE_STEP` at a time, each step in a ``turn``
        (by default of the feed's pacer): the requests the hook rules trigger, for `take`."""
        turn = turn or self.pacer.turn
        requests: list[AgentRequest] = []
        for start in range(0, len(events), VALIDATE_STEP):
            async with turn():
                requests += self.on_market(events[start:start + VALIDATE_STEP])
        return requests

    def origin_allowed(self, origin: str | None) -> bool:
        """Whether a browser ``Origin`` may send WebSocket frames and mutating requests (no
        ``Origin``: not a browser, or the same page's GET)."""
        return not origin or origin in self.allowed_origins or origin in self.own_origins

    busy_backlog: int = 40_000
    """Events waiting for the log beyond which reasoning work from outside the feed (an
    operator's message, an HTTP submit) is answered ``busy``: a ceiling on memory, not a
    latency budget (the feed's frames are admitted by the intake, long before this)."""

    def admit(self, principal: Principal, request: AgentRequest, *, by_feed: bool = False
              ) -> None:
        """Whether ``principal`` may send ``request`` now, the one rule for every way in: its
        role and scope (`Forbidden`), then the log's capacity (`check_capacity`), unless a
        feed's intake admitted the frame it came in (``by_feed``)."""
        principal.check_submit(request)
        if not by_feed:
            self.check_capacity(request)

    def check_capacity(self, request: AgentRequest | None = None) -> None:
        """Refuse reasoning work from outside the feed while the log is far behind (flow
        control, never unbounded): `Busy`. The control lane is never refused: a ``request``
        that names a control action passes (None: reasoning work, market events say)."""
        if request is not None and request.action is not None:
            return
        backlog = self.log.backlog
        if backlog > self.busy_backlog:
            rate = self.log.commit_rate or 10_000.0
            raise Busy(retry_after_ms=int(min(5_000, 50 + backlog * 1000 / rate)))
