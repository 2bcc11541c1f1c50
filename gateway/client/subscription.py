"""A subscription of a WebSocket client: the events of the agents it follows, in commit
order, across reconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.client.errors import ConnectionLost, GatewayClientError
from gateway.client.frames import EventFrame, Snapshot
from gateway.client.wire import parse

if TYPE_CHECKING:
    from gateway.client.connection import GatewayClient

_END = object()


class Subscription:
    """Events of the subscribed agents, in commit order, across reconnects.

    An async iterator of `EventFrame`; also an async context manager that unsubscribes on
    exit. ``snapshot`` is the latest status snapshot the gateway sent; ``position`` is the
    position of the last event yielded (where a new subscription would resume).
    """

    def __init__(self, client: GatewayClient, agents: Sequence[str] | None,
                 after: int | None) -> None:
        self._client = client
        self.agents = None if agents is None else list(agents)
        self.snapshot: Snapshot | None = None
        self._received: int | None = after
        """The last position received (queued); a resubscription starts after it."""
        self._yielded: int | None = after
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._started = False
        self._closed = False

    @property
    def position(self) -> int | None:
        """The position of the last event yielded (or where the subscription started)."""
        return self._yielded

    async def start(self) -> Snapshot:
        """Subscribe (once) and return the snapshot; iterating starts it too."""
        if not self._started:
            self._started = True
            try:
                self._take_snapshot(await self._client._call(self._frame()))
            except BaseException as error:
                self._fail(error if isinstance(error, Exception)
                           else ConnectionLost("subscribing was cancelled"))
                raise
        if self.snapshot is None:
            raise RuntimeError("this subscription failed or was closed; subscribe again")
        return self.snapshot

    def _frame(self) -> dict[str, Any]:
        frame: dict[str, Any] = {"type": "subscribe", "batch": True}
        if self.agents is not None:
            frame["agents"] = self.agents
        if self._received is not None:
            frame["after"] = self._received
        return frame

    def _take_snapshot(self, answer: dict[str, Any]) -> None:
        snapshot = parse(Snapshot, answer)
        self.snapshot = snapshot
        if self._received is None:  # live from here: the gateway follows after this position
            self._received = self._yielded = snapshot.position

    async def _resubscribe(self) -> None:
        try:
            self._take_snapshot(await self._client._call(self._frame()))
        except GatewayClientError as error:
            self._fail(error)

    def _push(self, event: EventFrame) -> None:
        if self._received is not None and event.position <= self._received:
            return  # already delivered before a reconnect
        self._received = event.position
        self._queue.put_nowait(event)

    def _fail(self, error: BaseException) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(error)
            self._client._forget(self)

    def _end(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_END)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> EventFrame:
        if not self._started:
            await self.start()
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)
            raise item
        event: EventFrame = item
        self._yielded = event.position
        return event

    async def aclose(self) -> None:
        """Unsubscribe; iteration ends after the events already received."""
        if self._closed:
            return
        self._end()
        self._client._forget(self)
        if self._started and self._client.connected:
            with contextlib.suppress(GatewayClientError):
                await self._client._call({"type": "unsubscribe"})

    async def __aenter__(self) -> Subscription:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
