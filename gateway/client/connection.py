"""The WebSocket clients of ``/ws/control`` and ``/ws/feed``: one connection each, kept
alive across drops (docs/protocol.md).

Every frame the client sends carries an ``id`` of its own; a background reader hands each
answer to the call waiting for that id and each ``event`` frame to the subscription.

When the connection drops the client reconnects with exponential backoff (with jitter),
authenticates again, resubscribes after the last event position it received (so the
consumer sees neither a gap nor a duplicate) and sends again every frame whose answer it had
not received. Resending a ``submit`` is safe: the gateway answers a ``requestId`` it has seen
with its first decision (``repeated: true``), so a caller of `GatewayClient.submit` just gets
its ack. Market frames are sent again too (hook rules recognise a redelivered event).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gateway.client.errors import RETRYABLE_CODES, ConnectionLost, GatewayClientError
from gateway.client.frames import (
    AckFrame,
    AckOrError,
    AcksFrame,
    DeskKillAck,
    EventFrame,
    EventsFrame,
    Hello,
    MarketAck,
    Pong,
)
from gateway.client.subscription import Subscription
from gateway.client.wire import (
    Endpoint,
    MarketEventLike,
    RequestLike,
    endpoint_url,
    log,
    model_json,
    parse,
    request_json,
    spawn,
)

MAX_BATCH = 1_000
"""The most requests or market events one frame may carry (the client splits bigger lots)."""
FATAL_CLOSE_CODES = frozenset({1008})
"""Close codes after which reconnecting would only repeat the refusal (policy violation)."""


@dataclass(slots=True)
class _Call:
    """A frame sent (or to be sent) and the future its answer resolves."""

    frame: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    retries: int = 0
    waiting: bool = False
    """A retry is scheduled (busy): a reconnect does not send it again meanwhile."""



class GatewayClient:
    """One WebSocket connection to the gateway, kept alive across drops.

    ``url`` is the gateway's base URL (``ws://host:port``; ``http`` is taken as ``ws``) or
    the full endpoint URL. ``retries`` bounds how often one frame is sent again after a
    ``busy`` (waiting ``retryAfterMs``) or a retryable error; ``max_reconnects`` bounds the
    consecutive failed reconnect attempts (None: keep trying until closed).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        endpoint: Endpoint = "control",
        reconnect: bool = True,
        max_backoff_s: float = 5.0,
        min_backoff_s: float = 0.05,
        max_reconnects: int | None = None,
        retries: int = 20,
        open_timeout_s: float = 10.0,
        compression: bool = False,
        max_size: int = 16 << 20,
    ) -> None:
        self.url = endpoint_url(url, endpoint)
        self.endpoint = endpoint
        self._token = token
        self._reconnect = reconnect
        self._max_backoff = max_backoff_s
        self._min_backoff = min_backoff_s
        self._max_reconnects = max_reconnects
        self._retries = retries
        self._open_timeout = open_timeout_s
        self._compression = compression
        self._max_size = max_size
        self.hello: Hello | None = None
        """The gateway's greeting on the current (or last) connection."""
        self.reconnects = 0
        """Successful reconnections so far."""
        self._ws: ClientConnection | None = None
        self._pending: dict[str, _Call] = {}
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._subscription: Subscription | None = None
        self._runner: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._failure: GatewayClientError | None = None

    # ------------------------------------------------------------------- life cycle

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def connect(self) -> Hello:
        """Open the connection and authenticate (raises if the first attempt fails)."""
        if self._runner is not None:
            raise RuntimeError("already connected")
        self._ws, self.hello = await self._open()
        self._runner = spawn(self._run(self._ws), f"client {self.url}")
        self._runner.add_done_callback(self._runner_done)
        return self.hello

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug: nobody waits for ever
            # (spawn logs it)
            self._give_up(ConnectionLost(f"the client's reader failed: {task.exception()!r}"))

    async def close(self) -> None:
        """Close the connection; calls still waiting fail with `ConnectionLost`."""
        self._closing = True
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._subscription is not None:
            self._subscription._end()
            self._subscription = None
        self._fail_all(ConnectionLost("the client was closed"))

    @property
    def connected(self) -> bool:
        """Whether a connection is up now (False while reconnecting)."""
        return self._ws is not None

    # ----------------------------------------------------------------------- calls

    async def submit(self, request: RequestLike) -> AckFrame:
        """Submit one request; its ack after the commit (an error frame raises
        `GatewayClientError`; ``busy`` is retried after ``retryAfterMs``)."""
        answer = await self._call({"type": "submit", "request": request_json(request)})
        return parse(AckFrame, answer)

    async def submit_many(self, requests: Iterable[RequestLike]) -> list[AckOrError]:
        """Submit requests in frames of up to 1,000; one ack or error each, in order."""
        wire = [request_json(r) for r in requests]
        chunks = [wire[n:n + MAX_BATCH] for n in range(0, len(wire), MAX_BATCH)]
        answers = await asyncio.gather(
            *(self._call({"type": "submit_many", "requests": chunk}) for chunk in chunks))
        return [result for answer in answers for result in parse(AcksFrame, answer).results]

    async def market(self, events: Iterable[MarketEventLike]) -> MarketAck:
        """Send market events (frames of up to 1,000); the acks of the requests hooks made."""
        wire = [model_json(e) for e in events]
        chunks = [wire[n:n + MAX_BATCH] for n in range(0, len(wire), MAX_BATCH)]
        answers = [parse(MarketAck, a) for a in await asyncio.gather(
            *(self._call({"type": "market", "events": chunk}) for chunk in chunks))]
        if len(answers) == 1:
            return answers[0]
        return MarketAck(events=sum(a.events for a in answers),
                         triggered=[t for a in answers for t in a.triggered])

    async def desk_kill(self, reason: str | None = None, *,
                        flatten: bool = False) -> DeskKillAck:
        """Halt every agent in the token's scope and cancel their open orders (control and
        admin tokens), then with ``flatten`` close each one's positions; answered after the
        commit of the kill's record."""
        frame: dict[str, Any] = {"type": "desk_kill"}
        if reason is not None:
            frame["reason"] = reason
        if flatten:
            frame["flatten"] = True
        return parse(DeskKillAck, await self._call(frame))

    async def ping(self) -> int:
        """Round trip; the gateway's last committed log position."""
        return parse(Pong, await self._call({"type": "ping"})).position

    def subscribe(self, agents: Sequence[str] | None = None,
                  after: int | None = None) -> Subscription:
        """Follow agents (None: every agent in the token's scope): an async iterator of
        event frames, from ``after`` (None: from now). One subscription at a time."""
        if self._subscription is not None:
            raise RuntimeError("this client already has a subscription; close it first")
        subscription = Subscription(self, agents, after)
        self._subscription = subscription
        return subscription

    # -------------------------------------------------------------------- internals

    async def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a frame and wait for its answer (retries and reconnects included)."""
        if self._failure is not None:
            raise self._failure
        if self._closing or self._runner is None:
            raise ConnectionLost("the client is not connected")
        frame_id = f"{self._prefix}-{next(self._ids)}"
        frame["id"] = frame_id
        call = _Call(frame, asyncio.get_running_loop().create_future())
        self._pending[frame_id] = call
        try:
            await self._transmit(call)
            answer = await call.future
        finally:
            self._pending.pop(frame_id, None)
        if answer.get("type") == "error":
            raise GatewayClientError.from_json(answer)
        return answer

    async def _transmit(self, call: _Call) -> None:
        ws = self._ws
        if ws is None or call.future.done():
            return  # sent on reconnect
        if call.frame["type"] == "subscribe" and self._subscription is not None:
            call.frame = {**self._subscription._frame(), "id": call.frame["id"]}
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps(call.frame, separators=(",", ":")))
        # A drop during the send: the call stays pending and is sent again on reconnect.

    def _dispatch(self, raw: str | bytes) -> None:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("a frame that is not a JSON object")
        kind = data.get("type")
        if kind == "events":
            if self._subscription is not None:
                for event in parse(EventsFrame, data).events:
                    self._subscription._push(event)
            return
        if kind == "event":
            if self._subscription is not None:
                self._subscription._push(parse(EventFrame, data))
            return
        call = self._pending.get(data.get("id") or "")
        if call is None or call.future.done():
            if kind == "error":
                log.warning("gateway error not tied to a call: %s", data.get("message"))
            return
        if kind == "busy" or (kind == "error" and data.get("code") in RETRYABLE_CODES):
            delay = data.get("retryAfterMs", 0) / 1000 if kind == "busy" else \
                min(self._max_backoff, self._min_backoff * 2 ** call.retries)
            self._retry_later(call, data, delay)
            return
        call.future.set_result(data)

    def _retry_later(self, call: _Call, answer: dict[str, Any], delay: float) -> None:
        call.retries += 1
        if call.retries > self._retries:
            if answer.get("type") == "busy":
                answer = {"type": "error", "code": "busy", "id": answer.get("id"),
                          "message": f"the gateway stayed busy over {self._retries} retries"}
            call.future.set_result(answer)
            return
        call.waiting = True

        def fire() -> None:
            call.waiting = False
            if not call.future.done():
                self._spawn(self._transmit(call))

        asyncio.get_running_loop().call_later(max(0.0, delay), fire)

    def _spawn(self, coro: Any) -> None:
        task = spawn(coro, "client send")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget(self, subscription: Subscription) -> None:
        if self._subscription is subscription:
            self._subscription = None

    def _fail_all(self, error: GatewayClientError) -> None:
        for call in list(self._pending.values()):
            if not call.future.done():
                call.future.set_exception(error)
        if self._subscription is not None:
            self._subscription._fail(error)

    async def _open(self) -> tuple[ClientConnection, Hello]:
        ws = await connect(
            self.url,
            additional_headers={"Authorization": f"Bearer {self._token}"},
            open_timeout=self._open_timeout,
            compression="deflate" if self._compression else None,
            max_size=self._max_size,
        )
        try:
            data = json.loads(await asyncio.wait_for(ws.recv(), self._open_timeout))
            if isinstance(data, dict) and data.get("type") == "error":
                raise GatewayClientError.from_json(data)
            hello = parse(Hello, data)
        except BaseException:
            await ws.close()
            raise
        return ws, hello

    async def _run(self, ws: ClientConnection) -> None:
        """Read answers; when the connection drops, reconnect and resume."""
        while True:
            try:
                async for raw in ws:
                    self._dispatch(raw)
            except ConnectionClosed:
                pass
            except Exception as error:  # a frame we cannot read: start afresh
                log.warning("closing after an unreadable frame: %r", error)
                await ws.close()
            close_code = ws.close_code
            self._ws = None
            if self._closing:
                return
            if not self._reconnect or close_code in FATAL_CLOSE_CODES:
                self._give_up(ConnectionLost(
                    f"the connection closed (code {close_code}, {ws.close_reason!r})"))
                return
            reopened = await self._reopen()
            if reopened is None:
                return
            if self._closing:
                await reopened[0].close()
                return
            ws, self.hello = reopened
            self.reconnects += 1
            self._resume(ws)

    async def _reopen(self) -> tuple[ClientConnection, Hello] | None:
        """Connect again with exponential backoff and jitter; None once given up."""
        for attempt in itertools.count():
            if attempt:
                delay = min(self._max_backoff, self._min_backoff * 2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            try:
                return await self._open()
            except GatewayClientError as error:  # refused at authentication: final
                self._give_up(error)
                return None
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed,
                    ValueError) as error:
                log.info("reconnect attempt %d to %s failed: %r", attempt + 1, self.url, error)
                if self._max_reconnects is not None and attempt + 1 >= self._max_reconnects:
                    self._give_up(ConnectionLost(
                        f"could not reconnect after {attempt + 1} attempts: {error!r}"))
                    return None
        raise AssertionError("unreachable")

    def _resume(self, ws: ClientConnection) -> None:
        """On a new connection: resubscribe, then send every unanswered frame again."""
        self._ws = ws
        waiting = [c for c in self._pending.values() if not c.waiting and not c.future.done()]
        subscription = self._subscription
        if subscription is not None and subscription._started and not any(
                c.frame["type"] == "subscribe" for c in waiting):
            self._spawn(subscription._resubscribe())
        for call in waiting:
            self._spawn(self._transmit(call))

    def _give_up(self, error: GatewayClientError) -> None:
        self._failure = error
        self._fail_all(error)


class ControlClient(GatewayClient):
    """A client of ``/ws/control``: submit requests and controls, subscribe to agents."""

    def __init__(self, url: str, token: str, **options: Any) -> None:
        super().__init__(url, token, endpoint="control", **options)


class FeedClient(GatewayClient):
    """A client of ``/ws/feed``: market events and hook triggers."""

    def __init__(self, url: str, token: str, **options: Any) -> None:
        super().__init__(url, token, endpoint="feed", **options)
