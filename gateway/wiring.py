"""The one place that wires a gateway: a config becomes a `Service` (the engine over its
event log, provider gates and LLM clients, reasoners, hook rules, the paper broker, tokens
and connection limits), and the synthetic feed is plugged into it. `gateway.edge.server`
serves what this builds; `gateway.cli` starts both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from gateway.base.clock import Clock, SystemClock
from gateway.cluster.peers import Peers, RoutedGate
from gateway.cluster.router import Router
from gateway.config import GatewayConfig, build_clients, build_gates, build_reasoner
from gateway.edge.alerting import Alerter
from gateway.edge.auth import Principal, TokenBook
from gateway.edge.service import Service
from gateway.errors import GatewayError, NotOwner
from gateway.llm.mcp_tools import McpTools
from gateway.market.book import MarketBook
from gateway.market.broker import PaperBroker
from gateway.market.events import MarketEvent
from gateway.market.feed import SyntheticFeed
from gateway.market.health import FeedHealth
from gateway.market.hooks import HookEngine
from gateway.runtime.engine import Engine
from gateway.runtime.gate import SlotGate
from gateway.runtime.workers import WorkerHub
from lanes.events import BrokerReport
from store import GroupCommitStore, PostgresEventStore, SqliteEventStore
from store.engine import database_url, is_postgres

log = logging.getLogger("gateway.wiring")


def build_service(config: GatewayConfig, db: Path | str | None = None,
                  clock: Clock | None = None) -> Service:
    """Everything a config describes, wired together (the engine is not started yet)."""
    clock = clock or SystemClock()
    where = db or config.store.where or config.store.path
    clustered = is_postgres(database_url(where))
    store: GroupCommitStore
    if clustered:  # one log for several processes: each agent owned by one at a time
        store = PostgresEventStore(
            os.fspath(where), lock_timeout_ms=config.store.busy_timeout_ms,
            max_batch=config.store.max_batch,
            # A member paused mid-commit holds every commit up no longer than its lease.
            idle_in_transaction_ms=config.cluster.lease_ms)
    else:
        store = SqliteEventStore(where, synchronous=config.store.synchronous,
                                 busy_timeout_ms=config.store.busy_timeout_ms,
                                 max_batch=config.store.max_batch, exclusive=True)
    engine: Engine | None = None

    async def report(agent_id: str, broker_report: BrokerReport) -> None:
        assert engine is not None
        if engine.running:
            try:
                await engine.report(agent_id, broker_report)
            except NotOwner:  # moved to another process, whose broker has its orders now
                log.info("a broker report of %s not recorded here: the agent moved",
                         agent_id)

    broker = PaperBroker(report, clock)
    clients = build_clients(config)
    prices = {p.name: p.prices for p in config.providers if p.prices is not None}
    # (in a cluster a run waits up to a lease for its worker: one connects to each member)
    workers = WorkerHub(wait_ms=config.cluster.lease_ms if clustered else 0, clock=clock)
    reasoners = {entry.id: build_reasoner(entry, clients, prices, workers)
                 for entry in config.agents}
    gates = build_gates(config, store, clock)
    secret = config.cluster.shared_secret(config.tokens) if clustered else None
    peers = router = None
    run_gates: dict[str, SlotGate] = {}
    if secret is not None:  # requests and slots for the other processes go to them
        peers = Peers(secret)
        router = Router(peers)
        run_gates = {name: RoutedGate(gate, peers, router.owner_of)
                     for name, gate in gates.items()}
    market = MarketBook(ticks=config.market.ticks(), tick=config.market.tick)
    servers = {entry.id: [server.spec() for server in entry.mcp]
               for entry in config.agents if entry.mcp}
    engine = Engine(store, config.agent_configs(), clock=clock, market=market,
                    mcp=McpTools(servers) if servers else None,
                    reasoners=reasoners.__getitem__, broker=broker, gates=gates,
                    agent_gates=config.agent_gates(), run_gates=run_gates,
                    snapshot_worker=True, elsewhere=router,
                    schedules=config.agent_schedules(),
                    desk_budgets=None if config.desk.budgets is None
                    else config.desk.budgets.budgets())
    tokens = TokenBook(
        (token.secret, Principal(token.name, token.role,
                                 None if token.agents is None else frozenset(token.agents)))
        for token in config.tokens
    )

    def on_market(event: MarketEvent) -> None:
        market.observe(event)
        broker.observe(event)

    feed = FeedHealth()
    return Service(
        engine=engine,
        tokens=tokens,
        feed=feed,
        alerter=Alerter(store, feed, clock, config.alerts, market.words),
        hooks=HookEngine(config.hooks),
        market_observer=on_market,
        allowed_origins=frozenset(config.server.allowed_origins),
        max_frame_bytes=config.server.max_frame_bytes,
        intake_budget_ms=config.server.intake_budget_ms,
        intake_hold_ms=config.server.intake_hold_ms,
        clients=clients,
        max_connections=config.server.max_connections,
        max_unauthenticated=config.server.max_unauthenticated,
        auth_timeout_s=config.server.auth_timeout_s,
        send_timeout_s=config.server.send_timeout_s,
        heartbeat_s=config.server.heartbeat_s,
        request_timeout_s=config.server.request_timeout_s,
        metrics_max_agents=config.metrics.max_agents,
        cluster_secret=secret,
        peers=peers,
        router=router,
        cluster_lease_ms=config.cluster.lease_ms,
        advertise=config.cluster.advertise,
        workers=workers,
    )


async def feed_market(service: Service, feed: SyntheticFeed, clock: Clock,
                      stop: asyncio.Event | None = None) -> None:
    """Drive the hook rules (and the paper broker's prices) with a synthetic feed."""
    engine = service.engine

    async def sink(events: list[MarketEvent]) -> None:
        requests = await service.triggered(events)
        if requests and engine.running:
            for answer in await service.take(requests, "synthetic-feed", service.pacer):
                with contextlib.suppress(GatewayError):
                    await answer

    await feed.run(clock, sink, stop or asyncio.Event())
