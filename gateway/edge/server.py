"""Serving: a config becomes a running gateway under uvicorn, stopped gracefully by signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState

from gateway.base.process import tune_runtime
from gateway.base.tasks import spawn, start
from gateway.cluster.member import Cluster
from gateway.edge.app import create_app
from gateway.edge.http import own_origins
from gateway.edge.service import SEND_NOW, TEXT_PIECES, Service

log = logging.getLogger("gateway.edge.server")


@dataclass
class Running:
    """A gateway being served: where, and how to stop it."""

    service: Service
    url: str
    server: GatewayServer
    task: asyncio.Task[None]
    cluster: Cluster | None = None
    """Its membership of a cluster (several processes on one PostgreSQL log)."""

    async def stop(self) -> None:
        """Stop accepting, finish the commits in flight, record runs as aborted."""
        self.server.should_exit = True
        await self.task


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: an ephemeral one), bound before the server starts.

    Its protocol is named (TCP), so that asyncio turns Nagle's algorithm off on each
    connection it accepts (it does so only for sockets made with ``IPPROTO_TCP``): an HTTP
    answer is written in two pieces, head and body, and with Nagle on the body waited for
    the client's delayed ACK of the head, 40 ms, on every request of a kept-alive
    connection (the panel's files and API calls took 44 ms each)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


FRAGMENT_CHARS = 32 * 1024
"""A text message longer than this, or one given in pieces, goes out in fragments of this
many characters, one per turn of the event loop: encoding (and compressing, with
permessage-deflate) a big desk's snapshot at once held the loop for a few hundred ms, and a
fragment of 64 Ki characters for 2 to 4 ms. A client reassembles the message."""


class TurnWriter:
    """A transport whose writes within one turn of the event loop go out together: the first
    at once (a lone answer, an emergency stop's ack, waits for nothing), the others in one
    write when the turn ends, instead of one ``send`` system call each (under a flood a
    commit answers hundreds of frames in one turn). Anything else asked of the transport
    (close it, pause it, its buffer's size) first writes what is held, so nothing is
    reordered or lost."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._in_turn = False

    def write(self, data: bytes) -> None:
        """Write ``data`` now if it is the turn's first, else with the rest at its end."""
        if not self._in_turn:
            self._in_turn = True
            self._loop.call_soon(self._end_turn)
            self.transport.write(data)
        elif data:
            self._held.append(data)

    def flush(self) -> None:
        """Write what is held, now (dropped if the connection is gone meanwhile)."""
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            if not self.transport.is_closing():
                self.transport.write(data)

    def _end_turn(self) -> None:
        self._in_turn = False
        self.flush()

    def get_write_buffer_size(self) -> int:
        """The transport's buffer, with what is held."""
        self.flush()
        return self.transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        self.flush()
        return getattr(self.transport, name)


def _emptied(pieces: list[str]) -> Iterator[str]:
    """The items of ``pieces``, each taken out of the list as it is given: a big message is
    freed a piece at a time as it goes out (7 MB freed at once held the loop for 2 ms)."""
    pieces.reverse()
    while pieces:
        yield pieces.pop()


def _fragments(pieces: Iterable[str], size: int = FRAGMENT_CHARS) -> Iterator[str]:
    """The text of ``pieces`` in parts of ``size`` characters (the last may be shorter)."""
    held = ""
    for piece in pieces:
        held += piece
        start = 0
        while len(held) - start >= size:
            yield held[start:start + size]
            start += size
        held = held[start:]
    if held:
        yield held


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, except that a close is never held up by a client that
    does not read: uvicorn waits for room in the send buffer before it writes a close frame
    (forever, for such a client) and then closes gracefully (which waits for the buffer to
    drain). Here the close frame is queued behind whatever the client has not taken, and the
    connection is reset if the closing handshake has not finished after ``close_timeout``
    (10 s), so every close frees the connection in bounded time. A handshake refused with an HTTP
    answer (`starlette.websockets.WebSocket.send_denial_response`) is not logged as an
    error. The frames sent in one turn of the loop go out in one write (`TurnWriter`)."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, TurnWriter(self.transport, self.loop))

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # (none for a handshake refused at once)
        if scope is not None:
            scope["extensions"][TEXT_PIECES] = {}
            scope["extensions"][SEND_NOW] = {"send": self.send_now}

    def send_now(self, text: str) -> bool:
        """Write a short text message at once if nothing holds it up (as `send` would
        without waiting: the client reads its frames, the handshake is done, no close was
        sent); False: it was not written, send it the ASGI way."""
        if len(text) > FRAGMENT_CHARS or not self.writable.is_set() or self.disconnected \
                or not self.handshake_complete or self.close_sent \
                or self.initial_response is not None:
            return False
        self.conn.send_text(text.encode())
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    async def send(self, message: Any) -> None:
        if message["type"] == "websocket.send":
            pieces = message.get(TEXT_PIECES)
            text = message.get("text")
            if pieces is None and text is not None and len(text) > FRAGMENT_CHARS:
                pieces = [text]
            if pieces is not None:
                if self.handshake_complete and not self.close_sent \
                        and self.initial_response is None:
                    await self._send_fragmented(_emptied(pieces))
                    return
                message = {"type": "websocket.send", "text": "".join(pieces)}
        if message["type"] != "websocket.close" or not self.handshake_complete \
                or self.close_sent or self.initial_response is not None:
            await super().send(message)
            if message["type"] == "websocket.http.response.body" and self.close_sent:
                # A refusal (503 over the connection cap) is a finished handshake: uvicorn
                # would log an error for each one, a flood's worth of them.
                self.handshake_complete = True
            return
        if self.disconnected:
            raise ClientDisconnected()
        if self.transport.is_closing():
            return
        code = message.get("code", 1000)
        reason = message.get("reason", "") or ""
        try:
            # A message cut short in its fragments stays unfinished: a close may come between
            # them (RFC 6455, 5.4) and the client drops what it had of the message. Ending it
            # with an empty fragment would hand the client a truncated text.
            self.conn.send_close(code, reason)
        except InvalidState:  # the client's own close came first
            raise ClientDisconnected() from None
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused:  # the client's close reply must get through
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(self.close_timeout, self._drop)

    async def _send_fragmented(self, pieces: Iterable[str]) -> None:
        """The text of ``pieces`` as one message in fragments of `FRAGMENT_CHARS`, each
        encoded as it goes out, one per turn of the loop (controls and other connections'
        frames go out in between)."""
        fragments = _fragments(pieces)
        data = next(fragments, "")
        first = True
        while True:
            following = next(fragments, None)
            fin = following is None
            await self.writable.wait()  # (the flow control uvicorn's own send does)
            if self.disconnected:
                raise ClientDisconnected()
            if self.close_sent or self.transport.is_closing():
                return  # closed meanwhile (a slow reader): the close says why
            try:
                if first:
                    self.conn.send_text(data.encode(), fin=fin)
                else:
                    self.conn.send_continuation(data.encode(), fin=fin)
            except InvalidState:
                raise ClientDisconnected() from None
            self.transport.write(b"".join(self.conn.data_to_send()))
            if following is None:
                return
            await asyncio.sleep(0)
            data, first = following, False

    def handle_close(self, event: Any) -> None:
        super().handle_close(event)
        self._drop_if_stuck()

    def shutdown(self) -> None:
        super().shutdown()
        self._drop_if_stuck()

    def _drop_if_stuck(self) -> None:
        """uvicorn closes gracefully at the client's close frame or at shutdown, which waits
        for the send buffer to drain: for a client that sent its close but reads nothing,
        for ever. Reset it after ``close_timeout`` instead, if it has not drained by then."""
        if (self.close_timer is None and not self.disconnected
                and self.transport.get_write_buffer_size() > 0):
            self.close_timer = self.loop.call_later(self.close_timeout, self._drop)

    def _drop(self) -> None:
        """Reset the connection: what the client never took is thrown away, by the kernel
        too (a plain close would leave it there, retrying to a client that does not read)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


def http_protocol(request_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, except that a connection must send a whole request (or a
    whole WebSocket handshake) within ``request_timeout_s`` of connecting or of the request's
    first bytes: uvicorn times out only idle keep-alive connections, so a client that
    connects and sends nothing, or half a request, would hold its connection forever."""

    class HttpProtocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.head_timer is None and self._partial():
                self._arm()  # a request begins on a kept-alive connection
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if not self._partial():
                self._disarm()  # the whole request is in (or the connection is done)

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._disarm()  # from here the WebSocket session has its own auth timeout
            super().handle_websocket_upgrade(event)

        def _arm(self) -> None:
            self._disarm()
            self.head_timer = self.loop.call_later(request_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _partial(self) -> bool:
            """Whether the client still owes the whole or the rest of a request."""
            return self.conn.their_state is h11.IDLE or self.conn.their_state is h11.SEND_BODY

        def _timed_out(self) -> None:
            self.head_timer = None
            if self._partial() and not self.transport.is_closing():
                self.transport.close()  # nothing was answered yet: nothing to wait for

    return HttpProtocol


class GatewayServer(uvicorn.Server):
    """uvicorn's server, with work to do when it begins to stop, before it waits for the
    connections to end: a cluster member hands its agents and gates over there, which
    also answers the other members' requests waiting for a slot of its gates (else the
    server would wait for them until its graceful timeout)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.on_shutdown: list[Callable[[], Awaitable[None]]] = []
        self.exit_after_s: float | None = None
        """A stop that takes longer than this ends the process (`gateway serve` sets it; an
        in-process server in a test never does)."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Run `on_shutdown`, then stop as uvicorn does (within `exit_after_s`, if set)."""
        if self.exit_after_s is not None:
            overdue = threading.Timer(self.exit_after_s, _stop_overdue, (self.exit_after_s,))
            overdue.daemon = True  # (a thread: it fires even if the event loop is stuck)
            overdue.start()
        for work in self.on_shutdown:
            try:
                await work()
            except Exception:
                log.exception("stopping: %s failed", work)
        await super().shutdown(sockets)


def _stop_overdue(seconds: float) -> None:
    log.critical("stopping took longer than %g s (shutdown_timeout_s): exiting now; nothing "
                 "acknowledged is lost, the next start carries on from the log", seconds)
    logging.shutdown()
    os._exit(70)


def uvicorn_config(service: Service, lifespan: Callable[[Any], Any]) -> uvicorn.Config:
    """How uvicorn serves ``service``: the gateway's HTTP and WebSocket protocols (bounded
    requests, closes that never wait for a client that does not read, answers written
    together), graceful stop within 5 s. Its log lines go through the process's handlers
    (``log_config=None``: no text handlers of its own beside a JSON log)."""
    return uvicorn.Config(create_app(service, lifespan=lifespan), lifespan="on",
                          http=http_protocol(service.request_timeout_s), ws=WebSocketProtocol,
                          log_level="warning", log_config=None,
                          ws_max_size=4 * service.max_frame_bytes, timeout_graceful_shutdown=5)


@contextlib.asynccontextmanager
async def serving(service: Service, host: str = "127.0.0.1", port: int = 0,
                  extra: Callable[[Service], Any] | None = None) -> AsyncIterator[Running]:
    """Serve ``service`` until the block ends (uvicorn, graceful stop on exit).

    The engine starts before the block is entered: a log that cannot be served (held by
    another process, say) raises here. ``extra`` is started with the server and cancelled
    before the engine stops (the demo's feed).
    """
    extra_task: list[asyncio.Task[Any]] = []
    cluster: list[Cluster] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        tune_runtime()
        mcp = service.engine.runs.toolbox.mcp
        if mcp is not None:  # the agents' MCP servers, connected in the background
            mcp.start()
        if service.alerter is not None:
            await service.alerter.start()
        if extra is not None:
            extra_task.append(spawn(extra(service), "extra"))
        try:
            yield
        finally:
            for task in extra_task:
                task.cancel()
            await asyncio.gather(*extra_task, return_exceptions=True)
            for member in cluster:  # its agents handed over before the engine stops
                await member.stop()
            await service.engine.stop()
            if service.peers is not None:
                await service.peers.close()
            for client in service.clients.values():
                await client.close()
            if mcp is not None:
                await mcp.stop()
            if service.alerter is not None:
                await service.alerter.stop()

    sock = bind(host, port)  # connections wait in its backlog while the engine starts
    try:
        await service.engine.start()
    except BaseException:
        sock.close()
        raise
    server = GatewayServer(uvicorn_config(service, lifespan))
    bound_host, bound_port = sock.getsockname()[:2]
    service.own_origins = own_origins(bound_host, bound_port)
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{shown}:{bound_port}"
    if service.router is not None:
        try:
            cluster.append(await join_cluster(service, service.advertise or url))
        except BaseException:
            await service.engine.stop()
            sock.close()
            raise
        server.on_shutdown.append(cluster[0].stop)
    task = start(server.serve(sockets=[sock]), "uvicorn")
    running = Running(service, url, server, task, cluster[0] if cluster else None)
    try:
        yield running
    finally:
        if not task.done():
            await running.stop()
        sock.close()


async def join_cluster(service: Service, url: str) -> Cluster:
    """Make the started engine of ``service`` (built with its router: `gateway.wiring`) a
    member of its log's cluster, reached by the others at ``url``: this process takes its
    share of the agents, and requests and slots for the others go to them."""
    router = service.router
    assert router is not None and service.peers is not None
    member = Cluster(service.engine, router, url, lease_ms=service.cluster_lease_ms)
    member.on_handed_over = service.peers.poke
    member.on_members = lambda urls: service.workers.cluster(url, urls)
    await member.start()
    service.cluster = member
    return member


async def serve_forever(service: Service, host: str, port: int,
                        on_ready: Callable[[Running], None] | None = None,
                        extra: Callable[[Service], Any] | None = None,
                        shutdown_timeout_s: float | None = None) -> None:
    """Serve until SIGINT or SIGTERM (uvicorn handles them), then stop gracefully (the
    process ends anyway once ``shutdown_timeout_s`` has passed)."""
    async with serving(service, host, port, extra) as running:
        running.server.exit_after_s = shutdown_timeout_s
        log.info("started: serving %d agents on %s", len(service.engine.agent_ids), running.url)
        if on_ready is not None:
            on_ready(running)
        try:
            await running.task
        finally:  # (uvicorn raises the signal that stopped it again once it has stopped:
            log.info("stopped")  # our SIGTERM handler's SystemExit comes through here)
