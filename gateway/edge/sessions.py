"""WebSocket sessions: authenticate, then frames in, answers out (``/ws/feed`` and
``/ws/control``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway.base.roles import Role
from gateway.base.tasks import spawn
from gateway.edge.answers import ack_frame, acks_text, error_frame, market_ack_text
from gateway.edge.auth import Principal
from gateway.edge.decided_now import HELD_EVENTS, DecidedNow
from gateway.edge.desk import kill_answer, kill_desk
from gateway.edge.frames import (
    NO_TURN,
    frame_id,
    guess_id,
    makes_work,
    raw_data,
    stepped,
    validate_frame,
    validate_now,
)
from gateway.edge.protocol import (
    Auth,
    BusyFrame,
    DeskKill,
    ErrorFrame,
    Hello,
    Market,
    Ping,
    Pong,
    Submit,
    SubmitMany,
    Subscribe,
    Unsubscribe,
    load_json,
)
from gateway.edge.service import (
    MAX_BAD_FRAMES,
    MAX_CLOCK_SKEW_MS,
    MAX_IN_FLIGHT,
    MAX_IN_FLIGHT_BYTES,
    POLICY_VIOLATION,
    SEND_NOW,
    SUBPROTOCOL,
    TEXT_PIECES,
    TOKEN_SUBPROTOCOL,
    TRY_AGAIN_LATER,
    Service,
)
from gateway.edge.subscriptions import Subscriptions
from gateway.errors import HTTP_STATUS, BadFrame, Busy, Forbidden, GatewayError, Unauthorized
from gateway.market.events import MarketEvent, event_time, to_ms
from gateway.runtime.acks import Ack
from gateway.runtime.intake import settled
from lanes import AgentRequest, InvalidRequest

log = logging.getLogger("gateway.edge.sessions")


def partial_ws(service: Service, endpoint: str) -> Callable[[WebSocket], Awaitable[None]]:
    """The handler of one WebSocket endpoint (``feed`` or ``control``)."""

    async def handle(websocket: WebSocket) -> None:
        await Session(service, websocket, endpoint).run()

    return handle


class Session(DecidedNow):
    """One WebSocket connection: authenticate, then frames in, answers out."""

    def __init__(self, service: Service, websocket: WebSocket, endpoint: str) -> None:
        self.service = service
        self.engine = service.engine
        self.ws = websocket
        self.endpoint = endpoint
        self.principal: Principal | None = None
        self.bad_frames = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.inflight_bytes = 0
        self.drained = asyncio.Event()
        self.send_lock = asyncio.Lock()
        self.closing = False
        self.subscriptions = Subscriptions(self)
        self.last_sent = 0
        """When the last frame went out (the engine clock's `monotonic_ms`; 0: none has)."""
        now = websocket.scope.get("extensions", {}).get(SEND_NOW)
        self._send_now: Callable[[str], bool] | None = None if now is None else now["send"]

    async def run(self) -> None:
        """Serve the connection until it closes."""
        if not self.service.origin_allowed(self.ws.headers.get("origin")):
            await self.ws.close(code=POLICY_VIOLATION, reason="origin not allowed")
            return
        connections = self.service.connections
        # A token in the header (or a subprotocol) is checked at once; only a client that
        # authenticates by its first frame waits unauthenticated, and those have a smaller
        # share, so that anonymous connections cannot take every place from clients with
        # tokens.
        by_frame = not self.ws.headers.get("authorization") and self._offered_token() is None
        if connections.total >= self.service.max_connections:
            await self._refuse(f"{self.service.max_connections} WebSocket connections are "
                               "open, the most this gateway takes (server.max_connections)")
            return
        if by_frame and connections.unauthenticated >= self.service.max_unauthenticated:
            await self._refuse(f"{self.service.max_unauthenticated} WebSocket connections are "
                               "waiting for their auth frame, the most this gateway takes "
                               "(server.max_unauthenticated); a client that sends its token "
                               "in the Authorization header (or a browser, as the "
                               "subprotocol bearer.<base64url token>) is not counted")
            return
        connections.open[self.endpoint] += 1
        if by_frame:
            connections.unauthenticated += 1
        try:
            try:
                # A browser that sent its token as a subprotocol is answered with the
                # protocol's own name (never the token): it fails the connection otherwise.
                await self.ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in
                                     self.ws.scope.get("subprotocols", ()) else None)
                authenticated = await self._authenticate()
            finally:
                if by_frame:
                    connections.unauthenticated -= 1
            if authenticated:
                await self._serve()
        except WebSocketDisconnect:
            pass
        finally:
            connections.open[self.endpoint] -= 1
            self.subscriptions.cancel()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _offered_token(self) -> str | None:
        """The ``bearer.<base64url token>`` subprotocol the client offered, if any."""
        for offered in self.ws.scope.get("subprotocols", ()):
            if offered.startswith(TOKEN_SUBPROTOCOL):
                return str(offered)
        return None

    async def _refuse(self, why: str) -> None:
        """Answer the handshake 503 (``busy``, ``Retry-After``): a connection cap is full."""
        self.service.connections.refused += 1
        frame = ErrorFrame(code="busy", message=f"{why}; retry later")
        response = JSONResponse(frame.model_dump(mode="json", exclude_none=True),
                                status_code=HTTP_STATUS["busy"], headers={"Retry-After": "1"})
        try:
            await self.ws.send_denial_response(response)
        except RuntimeError:  # a server without the denial extension: a plain refusal (403)
            await self.ws.close(code=TRY_AGAIN_LATER, reason="too many connections")

    async def _authenticate(self) -> bool:
        tokens = self.service.tokens
        try:
            header = self.ws.headers.get("authorization")
            offered = self._offered_token()
            if header:
                principal = tokens.from_header(header)
            elif offered is not None:
                principal = tokens.authenticate(_subprotocol_token(offered))
            else:
                message = await asyncio.wait_for(self.ws.receive(),
                                                 self.service.auth_timeout_s)
                if message["type"] == "websocket.disconnect":
                    return False
                frame = await self._validate(load_json(raw_data(message)))
                if not isinstance(frame, Auth):
                    raise Unauthorized("the first frame must be {\"type\": \"auth\", ...}")
                principal = tokens.authenticate(frame.token)
            if self.endpoint == "worker":
                principal.check_worker()
            elif self.endpoint == "feed":
                principal.check_feed()
            elif principal.role is Role.WORKER:
                principal.check_read()  # (refused: a worker token only does runs)
            elif principal.role is Role.FEED:
                raise Forbidden("a feed token connects to /ws/feed; /ws/control takes viewer, "
                                "control and admin tokens")
        except (GatewayError, InvalidRequest, TimeoutError, WebSocketDisconnect) as error:
            if isinstance(error, WebSocketDisconnect):
                return False
            if isinstance(error, TimeoutError):
                self.service.connections.auth_timeouts += 1
                error = Unauthorized("no auth frame in time")
            await self.send(error_frame(error))
            close = error.close_code if isinstance(error, GatewayError) else None
            await self.ws.close(code=close or POLICY_VIOLATION,
                                reason=getattr(error, "code", "auth"))
            return False
        self.principal = principal
        scope = None if principal.agents is None else sorted(principal.agents)
        beat = self.service.heartbeat_s
        await self.send(Hello(principal=principal.name, role=principal.role.value,
                              agents=scope, heartbeat_ms=round(beat * 1000) if beat else None))
        return True

    async def _serve(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect" or self.closing:
                return  # closing: a slow reader; what it sent after that is not taken
            raw = raw_data(message)
            try:
                limit = self.service.max_frame_bytes
                if len(raw) > limit or (isinstance(raw, str) and 4 * len(raw) > limit
                                        and len(raw.encode()) > limit):
                    raise BadFrame("too_large", f"frame over {self.service.max_frame_bytes} "
                                   "bytes; split it")
                frame = None
                if self.endpoint == "feed":
                    # One turn of the pacer reads, admits and (most often) validates a frame.
                    async with self.service.pacer.turn():
                        data = load_json(raw)
                        retry = self.service.intake.check(self) if makes_work(data) else None
                        if retry is None and not stepped(data):
                            frame = validate_now(data)
                    if retry is not None:  # no room yet: wait for it, unread further
                        retry = await self.service.intake.room(self)
                        if retry is not None:  # nothing taken: the client sends it later
                            await self.send(BusyFrame(id=frame_id(data), retry_after_ms=retry))
                            continue
                else:
                    data = load_json(raw)
                if frame is None:
                    frame = await self._validate(data)
            except (BadFrame, InvalidRequest) as error:
                self.bad_frames += 1
                await self.send(error_frame(error, id=guess_id(raw)))
                if self.bad_frames >= MAX_BAD_FRAMES:
                    await self.ws.close(code=POLICY_VIOLATION, reason="too many bad frames")
                    return
                continue
            self.bad_frames = 0
            await self.slots.acquire()
            while self.inflight_bytes > MAX_IN_FLIGHT_BYTES:  # backpressure by size too
                self.drained.clear()
                await self.drained.wait()
            self.inflight_bytes += len(raw)
            if isinstance(frame, Submit):
                if frame.request.action is not None:
                    answering = self._control_now(frame)  # decided here, not a turn later
                elif self.endpoint == "feed" and self._submit_now(frame, len(raw)):
                    continue
                else:
                    answering = self._answer(frame)
            else:
                answering = self._answer(frame)
            task = spawn(answering, "answer")
            self.tasks.add(task)
            task.add_done_callback(functools.partial(self._done, len(raw)))

    def _done(self, size: int, task: asyncio.Task[None] | None = None) -> None:
        if task is not None:
            self.tasks.discard(task)
        self.slots.release()
        self.inflight_bytes -= size
        self.drained.set()

    async def _validate(self, data: Any) -> Any:
        """The client frame of a frame's JSON value (`InvalidRequest` / `BadFrame`)."""
        return await validate_frame(data, self._turn)

    def _turn(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A turn of the pacer for a feed connection's work; nothing to wait for otherwise."""
        return self.service.pacer.turn() if self.endpoint == "feed" else NO_TURN

    async def send(self, frame: BaseModel) -> None:
        """Send a frame (nothing once the connection is closing or closed)."""
        # Optional fields that are None are left out; Hello's scope is always sent.
        await self.send_text(frame.model_dump_json(exclude_none=not isinstance(frame, Hello)))

    async def _send_paced(self, text_of: Callable[[], str]) -> None:
        """`send_text` of a frame's text, written in a turn of the pacer (a feed's big
        answers)."""
        async with self._turn():
            text = text_of()
        await self.send_text(text)

    async def send_text(self, text: str) -> None:
        """Send a frame's text (nothing once the connection is closing or closed)."""
        if not self.send_now(text):
            await self._send_message({"type": "websocket.send", "text": text})

    def send_now(self, text: str) -> bool:
        """Send a frame's text at once, without waiting, if nothing holds it up (no send
        under way, the client reads: `SEND_NOW`); False: send it with `send_text`, which
        waits for room (up to ``send_timeout_s``)."""
        if self._send_now is None or self.send_lock.locked():
            return False
        if self.closing or self.ws.application_state is not WebSocketState.CONNECTED:
            return True  # (as `send_text`: nothing once the connection is closing or closed)
        if not self._send_now(text):
            return False
        self.last_sent = self.engine.clock.monotonic_ms()
        return True

    async def send_pieces(self, pieces: list[str]) -> None:
        """Send a frame's text given as pieces (a big desk's snapshot): the server encodes
        and sends them in fragments where it can (`TEXT_PIECES`; it empties the list as it
        goes), else they are joined."""
        if TEXT_PIECES in self.ws.scope.get("extensions", {}):
            await self._send_message({"type": "websocket.send", TEXT_PIECES: pieces})
        else:
            await self.send_text("".join(pieces))

    async def _send_message(self, message: dict[str, Any]) -> None:
        async with self.send_lock:
            if self.closing or self.ws.application_state is not WebSocketState.CONNECTED:
                return
            try:
                # (asyncio.timeout, not wait_for: that runs the send as a task of its own,
                # a turn of the loop later, several ms under a flood for every answer)
                async with asyncio.timeout(self.service.send_timeout_s):
                    await self.ws.send(message)
                self.last_sent = self.engine.clock.monotonic_ms()
            except (RuntimeError, WebSocketDisconnect):
                return
            except TimeoutError:
                self.closing = True
                self.service.connections.slow_readers += 1
                log.warning("closing a connection that does not read its frames")
                # Under `gateway.edge.server` the close is queued behind the frames the client
                # has not taken and the connection is dropped if it never takes them; a
                # server that waits for room before a close gives up here.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self.ws.close(code=POLICY_VIOLATION, reason="slow reader"), 1.0)

    async def _answer(self, frame: Any) -> None:
        try:
            await self._handle(frame)
        except asyncio.CancelledError:
            raise
        except Busy as error:
            await self.send(BusyFrame(id=frame.id, retry_after_ms=error.retry_after_ms))
        except Exception as error:
            request_id = frame.request.request_id if isinstance(frame, Submit) else None
            await self.send(error_frame(error, id=frame.id, request_id=request_id))

    async def _handle(self, frame: Any) -> None:
        principal = self.principal
        assert principal is not None
        if isinstance(frame, Ping):
            await self.send(Pong(id=frame.id, position=await self.service.log.last_position()))
        elif isinstance(frame, Auth):
            raise BadFrame("invalid", "already authenticated")
        elif isinstance(frame, Submit):
            # (a feed's frames are admitted by the intake)
            self.service.admit(principal, frame.request, by_feed=self.endpoint == "feed")
            with self._holding(1):
                ack = await self.service.submit(frame.request, principal.name, parsed=True)
            await self.send(ack_frame(ack, frame.id))
        elif isinstance(frame, SubmitMany):
            results = await self._submit_all(frame.requests, parsed=True)
            await self._send_paced(functools.partial(acks_text, results, frame.id))
        elif isinstance(frame, Market):
            principal.check_feed()
            if principal.agents is not None:
                raise Forbidden("market events drive every agent's hook rules and the "
                                "broker's prices; a token scoped to some agents cannot send "
                                "them")
            self._check_times(frame.events)
            if self.endpoint != "feed":
                self.service.check_capacity()
            requests = await self.service.triggered(frame.events, self._turn)
            triggered = await self._submit_all(requests, parsed=False) if requests else []
            await self._send_paced(functools.partial(market_ack_text, len(frame.events),
                                                     triggered, frame.id))
        elif isinstance(frame, Subscribe):
            await self.subscriptions.subscribe(frame)
        elif isinstance(frame, DeskKill):
            await self.send(kill_answer(await kill_desk(self.service, principal, frame),
                                        frame.id))
        elif isinstance(frame, Unsubscribe):
            self.subscriptions.cancel()
            await self.send(Pong(id=frame.id, position=await self.service.log.last_position()))

    def _check_times(self, events: list[MarketEvent]) -> None:
        """Refuse market events dated in the future (they would stall every hook rule)."""
        latest = self.engine.clock.now_ms() + MAX_CLOCK_SKEW_MS
        for index, event in enumerate(events):
            if to_ms(event_time(event)) > latest:
                raise BadFrame("invalid", f"events[{index}] is dated more than "
                               f"{MAX_CLOCK_SKEW_MS // 1000} s in the future",
                               field=f"events.{index}")

    @contextlib.contextmanager
    def _holding(self, requests: int) -> Iterator[None]:
        """A feed connection's work waiting for its commit, for the intake's shares."""
        if self.endpoint != "feed":
            yield
            return
        events = HELD_EVENTS * requests
        self.service.intake.took(self, events)
        try:
            yield
        finally:
            self.service.intake.settled(self, events)

    async def _submit_all(self, requests: list[AgentRequest], parsed: bool
                          ) -> list[Ack | ErrorFrame]:
        """Each request admitted and taken (``parsed``: a frame's own requests, not the ones
        hook rules made of its market events), its answer in its place."""
        principal = self.principal
        assert principal is not None
        allowed: list[AgentRequest] = []
        refused: dict[int, ErrorFrame] = {}
        for index, request in enumerate(requests):
            try:
                # (a feed frame was admitted whole by the intake)
                self.service.admit(principal, request, by_feed=self.endpoint == "feed")
                allowed.append(request)
            except GatewayError as error:
                refused[index] = error_frame(error, request_id=request.request_id)
        with self._holding(len(allowed)):
            answers = iter(await settled(await self.service.take(
                allowed, principal.name,
                pacer=self.service.pacer if self.endpoint == "feed" else None,
                parsed=parsed)))
        results: list[Ack | ErrorFrame] = []
        for index, request in enumerate(requests):
            if index in refused:
                results.append(refused[index])
                continue
            answer = next(answers)
            results.append(answer if isinstance(answer, Ack)
                           else error_frame(answer, request_id=request.request_id))
        return results


def _subprotocol_token(offered: str) -> str:
    """The token in a ``bearer.<base64url>`` subprotocol (`Unauthorized` if it is not one)."""
    encoded = offered[len(TOKEN_SUBPROTOCOL):]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise Unauthorized(f"the {TOKEN_SUBPROTOCOL}... subprotocol must hold the token in "
                           "base64url (RFC 4648 section 5)") from None
