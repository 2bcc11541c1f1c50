"""A real gateway on an ephemeral loopback port, for end-to-end tests."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import uvicorn
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from gateway.base.clock import Clock
from gateway.base.roles import Role
from gateway.edge.app import create_app
from gateway.edge.auth import Principal, TokenBook
from gateway.edge.http import own_origins
from gateway.edge.service import Service
from gateway.llm.reasoner import Reasoner
from gateway.runtime.engine import Engine
from lanes import AgentConfig
from store import EventStore
from tests.gateway.support import until

TIMEOUT = 10.0
START_TIMEOUT = 60.0
"""A bound on a process's start (`gateway serve`, a worker): a cold start compiles its
imports afresh, and on a loaded 2-core machine took more than `TIMEOUT`."""


def browser_protocols(token: str) -> list[Subprotocol]:
    """The subprotocols the panel offers: the gateway's, and its token in base64url."""
    encoded = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    return [Subprotocol("gateway.v1"), Subprotocol(f"bearer.{encoded}")]

TOKENS = {
    "feed-secret": Principal("feeder", Role.FEED),
    "control-secret": Principal("ops", Role.CONTROL),
    "viewer-secret": Principal("watcher", Role.VIEWER),
    "admin-secret": Principal("root", Role.ADMIN),
    "scoped-secret": Principal("btc-desk", Role.CONTROL, frozenset({"btc"})),
}


@dataclass
class Live:
    """A running gateway: its base URLs and its engine."""

    http: str
    ws: str
    engine: Engine
    service: Service

    def client(self, token: str | None = "control-secret") -> httpx2.AsyncClient:
        """An HTTP client with that bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx2.AsyncClient(base_url=self.http, headers=headers, timeout=TIMEOUT)

    @contextlib.asynccontextmanager
    async def socket(self, endpoint: str = "control", token: str | None = "control-secret",
                     hello: bool = True, **kwargs: Any) -> AsyncIterator[ClientConnection]:
        """A WebSocket, authenticated by header (the hello frame already read)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with connect(f"{self.ws}/ws/{endpoint}", additional_headers=headers,
                           open_timeout=TIMEOUT, **kwargs) as ws:
            if token and hello:
                first = await receive(ws)
                assert first["type"] == "hello", first
            yield ws


async def receive(ws: ClientConnection) -> dict[str, Any]:
    """The next frame, decoded (fails the test if none comes in time)."""
    raw = await asyncio.wait_for(ws.recv(), TIMEOUT)
    frame: dict[str, Any] = json.loads(raw)
    return frame


async def receive_until(ws: ClientConnection, done: Callable[[dict[str, Any]], bool]
                        ) -> list[dict[str, Any]]:
    """Frames until one satisfies ``done`` (included)."""
    frames: list[dict[str, Any]] = []

    async def collect() -> None:
        while True:
            frame = await receive(ws)
            frames.append(frame)
            if done(frame):
                return

    await asyncio.wait_for(collect(), TIMEOUT)
    return frames


@contextlib.asynccontextmanager
async def running(store: EventStore, agents: dict[str, AgentConfig],
                  reasoners: Callable[[str], Reasoner], clock: Clock | None = None, *,
                  engine_options: dict[str, Any] | None = None,
                  ws: Any = "websockets-sansio", tokens: dict[str, Principal] | None = None,
                  **service: Any) -> AsyncIterator[Live]:
    """Start a gateway (engine + uvicorn on 127.0.0.1, ephemeral port); stop it after.
    ``engine_options`` go to the `Engine` (schedules, say); ``ws`` is uvicorn's WebSocket
    protocol (`gateway.edge.server.WebSocketProtocol`: the gateway's own); ``tokens`` are
    known beside `TOKENS`."""
    engine = Engine(store, agents, reasoners=reasoners, clock=clock, **(engine_options or {}))
    book = TokenBook({**TOKENS, **(tokens or {})}.items())
    svc = Service(engine=engine, tokens=book, **service)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = create_app(svc, lifespan=lifespan)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    svc.own_origins = own_origins("127.0.0.1", port)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws=ws,
                            ws_max_size=4 << 20)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def up() -> bool:  # (the lifespan started the engine: a test may read it now)
        if task.done():
            task.result()  # (a server that could not start says why)
        return server.started and engine.running
    try:
        await until(up, "the gateway to start")
        yield Live(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", engine, svc)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT)
        sock.close()
