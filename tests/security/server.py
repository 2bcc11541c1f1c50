"""A live gateway on its own event loop in a thread, so that sync tests (hypothesis) can drive
it with sync clients while it serves; it stops when the context ends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx2

from lanes import AgentConfig, Entry, Mode
from lanes.events import RequestReceived
from store import EventStore, MemoryEventStore
from tests.e2e.live import TIMEOUT, Live, running
from tests.gateway.support import ManualReasoner, log_of

T = TypeVar("T")
AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP, cap=10_000),
    "eth": AgentConfig(mode=Mode.COLLECT, debounce_ms=50, cap=10_000),
}


class Threaded:
    """A gateway (MemoryEventStore, manual reasoner) served from a background thread."""

    def __init__(self, live: Live, loop: asyncio.AbstractEventLoop) -> None:
        self.live = live
        self.loop = loop

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(TIMEOUT)

    def log(self) -> list[Entry]:
        """The agents' log, after every pending commit."""
        async def read() -> list[Entry]:
            await self.live.engine.flush()
            return await log_of(self.live.engine.store)

        return self.call(read())

    def http(self, token: str | None = None) -> httpx2.Client:
        """A sync HTTP client, with that bearer token. One connection per request: with
        keep-alive each answer waits ~40 ms for a delayed ACK (Nagle), 25x slower here."""
        headers = {"Connection": "close"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx2.Client(base_url=self.live.http, timeout=TIMEOUT, headers=headers)

    @property
    def host(self) -> str:
        return self.live.http.removeprefix("http://")


def received_ids(log: list[Entry]) -> list[str]:
    """The request ids of the requests in a log, in order."""
    return [e.event.request.request_id for e in log if isinstance(e.event, RequestReceived)]


@contextlib.contextmanager
def threaded(store: EventStore | None = None, **service: Any) -> Iterator[Threaded]:
    """Start a gateway in a thread (on ``store``, default a new memory store); stop it (and
    the thread) when the block ends."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        box["stop"] = stop
        reasoner = ManualReasoner()
        try:
            async with running(store or MemoryEventStore(), AGENTS, lambda _: reasoner,
                               **service) as live:
                box["live"] = live
                started.set()
                await stop.wait()
        except BaseException as error:
            box["error"] = error
            started.set()
            raise

    def main() -> None:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(serve())
        loop.close()

    thread = threading.Thread(target=main, name="gateway", daemon=True)
    thread.start()
    assert started.wait(TIMEOUT), "the gateway did not start"
    if "error" in box:
        raise box["error"]
    try:
        yield Threaded(box["live"], loop)
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the gateway did not stop"


_n = iter(range(10**9))


def trigger(agent: str = "btc", kind: str = "hook_trigger", **fields: Any) -> dict[str, Any]:
    """A valid request on the wire, with a fresh id."""
    n = next(_n)
    return {"requestId": f"s{n}", "createdAt": datetime.now(UTC).isoformat(), "agentId": agent,
            "kind": kind, "dedupeKey": f"k{n}", **fields}


def raw_http(host: str, target: str, method: str = "GET", headers: dict[str, str] | None = None,
             body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request with the target sent byte for byte (no client normalisation)."""
    address, port = host.split(":")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection((address, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        chunks: list[bytes] = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, answer.partition(b"\r\n\r\n")[2]
