"""Floods of connections and slow readers against the real gateway process (``gateway serve``):
it never crashes or hangs, a client already connected keeps getting its acks (a submit over
its WebSocket, an emergency stop over HTTP) in bounded time, every connection the flood made
is freed when it goes (or is timed out), a subscriber that never reads is closed as a slow
reader without the server buffering for it, the process's memory stays bounded, and the log
holds every acknowledged request exactly once (``gateway verify`` exits 0)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bench.crash import read_log
from lanes.events import RequestReceived
from tests.e2e.live import browser_protocols
from tests.gateway.support import until as wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

TIMEOUT = 30.0
T = TypeVar("T")
CAP = 500
"""server.max_connections of the gateway under test."""
UNAUTHENTICATED_CAP = 300
"""server.max_unauthenticated of the gateway under test."""
AUTH_TIMEOUT_S = 1.0
SEND_TIMEOUT_S = 0.5
REQUEST_TIMEOUT_S = 1.0
ACK_BOUND_S = 3.0
"""A connected client's ack during a flood (a few ms when idle; generous for a 2-core CI)."""
RSS_BOUND_KB = 150 << 10
"""How much the process may grow over its size before the floods (it starts at ~75 MiB)."""
SLOW_RSS_BOUND_KB = 64 << 10
"""How much it may grow while a subscriber does not read (~5 MB of events go by)."""
LEAK_BOUND_KB = 32 << 10
"""How much more it may hold after all the floods than after the first two."""
LOG_FDS_BOUND = 2 * 5 + 2
"""The log's descriptors in the gateway's process: the events file and its WAL for each
connection the reads' pool keeps (SQLAlchemy's default ``pool_size``, 5), the lock file and
the shared-memory index (one for all). The writer's connection is in a process of its own."""
BATCH = 20
"""Requests of 40 kB per submit_many of the slow-reader test (under max_frame_bytes)."""
CONTROL, VIEWER = "floods-control-secret", "floods-viewer-secret"
LIMITS = {"max_connections": CAP, "max_unauthenticated": UNAUTHENTICATED_CAP,
          "auth_timeout_s": AUTH_TIMEOUT_S, "send_timeout_s": SEND_TIMEOUT_S,
          "request_timeout_s": REQUEST_TIMEOUT_S}
CONFIG = f"""
[server]
host = "127.0.0.1"
port = 0
{{limits}}

[store]
path = "events.db"
synchronous = "NORMAL"

[[tokens]]
name = "ops"
token = "{CONTROL}"
role = "control"

[[tokens]]
name = "watcher"
token = "{VIEWER}"
role = "viewer"

[[agents]]
id = "btc"
mode = "followup"
cap = 50
[agents.reasoner]
latency_ms = [1, 5]

[[agents]]
id = "desk"
mode = "followup"
[agents.reasoner]
latency_ms = [1, 5]
"""


@dataclass
class Gateway:
    """The gateway process under test, and what was acknowledged to the clients."""

    process: subprocess.Popen[bytes]
    url: str
    db: Path
    acked: set[str] = field(default_factory=set)
    rss_kb: list[int] = field(default_factory=list)
    """The process's RSS when it started serving, then as the tests saw it."""

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://")

    def rss(self) -> int:
        """The process's resident set size now, in KiB (VmRSS)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None
        return int(found.group(1))

    def http(self, token: str = CONTROL, **kwargs: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.url, timeout=TIMEOUT,
                                 headers={"Authorization": f"Bearer {token}"}, **kwargs)

    async def metrics(self) -> dict[str, float]:
        """The samples of /metrics by name with labels."""
        async with self.http(VIEWER) as http:
            text = (await http.get("/metrics")).text
        return {name: float(value) for name, value in
                (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}

    async def connections(self) -> int:
        found = await self.metrics()
        return int(sum(v for k, v in found.items() if k.startswith("gateway_websocket_conn")))

    def fds(self) -> tuple[int, int]:
        """File descriptors the process has open: those of the log's files (``events.db*``),
        and all the others (each connection is one)."""
        where = f"/proc/{self.process.pid}/fd"
        listed = os.listdir(where)
        log_files = 0
        for fd in listed:
            with contextlib.suppress(FileNotFoundError):  # closed since it was listed
                log_files += os.readlink(f"{where}/{fd}").startswith(str(self.db))
        return log_files, len(listed) - log_files

    async def settled(self, like: dict[str, float] | None = None) -> dict[str, float]:
        """The metrics (and ``fds``, ``log_fds``) once no WebSocket connection is open and,
        if ``like`` (an earlier answer) is given, the event loop's tasks and the process's
        file descriptors other than the log's are back to its counts, give or take a few
        timers and the connection that asks; fails if they never are.

        The log's own descriptors are only bounded (`LOG_FDS_BOUND`): how many reads ran at
        once decides how many connections the reads' pool keeps open, and subscribers
        catching up at once may leave it more than before (the slow-reader test leaves a
        second one here, 2 more descriptors: ``events.db`` and its WAL; a CI run failed with
        4 more descriptors when the old check counted them)."""
        tasks = "gateway_asyncio_tasks"
        last: dict[str, float] = {}

        async def back() -> dict[str, float] | None:
            found = await self.metrics()
            found["log_fds"], found["fds"] = self.fds()
            last.clear()
            last.update({k: v for k, v in found.items() if k in (tasks, "fds", "log_fds")
                         or k.startswith("gateway_websocket_conn")})
            if sum(v for k, v in found.items() if k.startswith("gateway_websocket_conn")):
                return None
            if found["log_fds"] > LOG_FDS_BOUND:
                return None
            if like is not None and (found[tasks] > like[tasks] + 5
                                     or found["fds"] > like["fds"] + 2):
                return None
            return found

        before = None if like is None else {tasks: like[tasks], "fds": like["fds"]}
        try:
            found: dict[str, float] = await until(back, "everything freed")
        except AssertionError as timed_out:  # (say what stayed: the next failure is a clue)
            raise AssertionError(f"{timed_out}: before {before}, last seen {last}") from None
        return found


async def until(probe: Callable[[], Awaitable[T | None]], what: str) -> T:
    """`tests.gateway.support.until` with this module's `TIMEOUT`."""
    return await wait_until(probe, what, TIMEOUT)


def start(tmp: Path, **limits: float) -> Gateway:
    """``gateway serve`` with LIMITS (updated by ``limits``), once it is serving."""
    config = tmp / "gateway.toml"
    config.write_text(CONFIG.format(limits="\n".join(
        f"{key} = {value}" for key, value in {**LIMITS, **limits}.items())))
    with (tmp / "gateway.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--db",
             str(tmp / "events.db")], cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    assert line.startswith("gateway serving on"), (tmp / "gateway.log").read_text()
    gateway = Gateway(process, line.split()[-1], tmp / "events.db")
    gateway.rss_kb.append(gateway.rss())
    return gateway


@contextlib.contextmanager
def started(tmp: Path, **limits: float) -> Iterator[Gateway]:
    gateway = start(tmp, **limits)
    try:
        yield gateway
    finally:
        if gateway.process.poll() is None:
            gateway.process.kill()
        gateway.process.wait(TIMEOUT)
        assert gateway.process.stdout is not None
        gateway.process.stdout.close()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with started(tmp_path_factory.mktemp("floods")) as gateway:
        yield gateway


_n = iter(range(10**9))


def request(agent: str = "btc", **fields: Any) -> dict[str, Any]:
    """A hook trigger with a fresh id."""
    n = next(_n)
    return {"requestId": f"fl{n}", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": agent, "kind": "hook_trigger", "dedupeKey": f"k{n}", **fields}


async def receive(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
    return frame


async def answer(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a frame and return the answer carrying its id."""
    await ws.send(json.dumps(frame))
    while True:
        got = await receive(ws)
        if got.get("id") == frame["id"]:
            return got


async def closing(ws: ClientConnection) -> ConnectionClosed:
    """Read every frame left until the connection closes; how it closed."""
    try:
        while True:
            await receive(ws)
    except ConnectionClosed as closed:
        return closed


@contextlib.asynccontextmanager
async def operator(gw: Gateway, token: str = CONTROL) -> AsyncIterator[ClientConnection]:
    """A WebSocket authenticated by header, its hello read."""
    async with connect(f"{gw.ws}/ws/control", open_timeout=TIMEOUT,
                       additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        assert (await receive(ws))["type"] == "hello"
        yield ws


async def client_round(gw: Gateway, ws: ClientConnection, http: httpx2.AsyncClient) -> float:
    """What an operator does in a flood: a submit over its open WebSocket and an emergency
    stop over HTTP, both acknowledged; the seconds the slower one took."""
    body = request("desk")
    began = time.monotonic()
    ack = await answer(ws, {"type": "submit", "id": body["requestId"], "request": body})
    while ack["type"] == "busy":  # a request (not a control) may be told to come back
        await asyncio.sleep(ack["retryAfterMs"] / 1000)  # as the protocol says, then again
        ack = await answer(ws, {"type": "submit", "id": body["requestId"], "request": body})
    submitted = time.monotonic() - began
    assert ack["type"] == "ack", ack
    gw.acked.add(ack["requestId"])
    began = time.monotonic()
    response = await http.post("/api/agents/desk/control", json={"action": "emergency_stop"})
    stopped = time.monotonic() - began
    assert response.status_code == 200 and response.json()["type"] == "ack", response.text
    gw.acked.add(response.json()["requestId"])
    return max(submitted, stopped)


async def rounds_during(gw: Gateway, flood: Awaitable[Any]) -> tuple[Any, float, int]:
    """Run ``flood`` while an operator (connected before it) does rounds; the flood's result,
    the slowest round and the number of rounds."""
    async with operator(gw) as ws, gw.http() as http:
        flooding = asyncio.ensure_future(flood)
        slowest, rounds = 0.0, 0
        while not flooding.done() or rounds == 0:
            slowest = max(slowest, await client_round(gw, ws, http))
            rounds += 1
        result = await flooding
        slowest = max(slowest, await client_round(gw, ws, http))  # and after it
    assert slowest < ACK_BOUND_S, f"an ack took {slowest:.2f} s during the flood"
    return result, slowest, rounds + 1


async def gather_limited(jobs: Sequence[Awaitable[Any]], limit: int = 100) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Awaitable[Any]) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


# ------------------------------------------------------------------- connection floods


async def test_connections_that_never_authenticate_are_closed_at_the_auth_timeout(
    gw: Gateway
) -> None:
    before = await gw.settled()
    count = 400
    timeouts = 'gateway_websocket_closed_total{reason="auth_timeout"}'

    async def silent() -> Any:
        try:
            ws = await connect(f"{gw.ws}/ws/control", open_timeout=TIMEOUT)
        except InvalidStatus as refused:  # over max_unauthenticated
            return refused.response.status_code
        async with ws:
            frame = await receive(ws)  # sent at the auth timeout, then the close
            closed = await closing(ws)
            return frame["code"], closed.rcvd.code if closed.rcvd else None

    began = time.monotonic()
    ends, slowest, rounds = await rounds_during(
        gw, gather_limited([silent() for _ in range(count)], count))
    took = time.monotonic() - began
    seen = Counter(ends)
    assert set(seen) <= {("unauthorized", 1008), 503}, seen
    after = await gw.settled(before)
    assert after[timeouts] == before[timeouts] + seen["unauthorized", 1008]
    assert after["gateway_websocket_refused_total"] == \
        before["gateway_websocket_refused_total"] + seen[503]
    gw.rss_kb.append(gw.rss())
    print(f"\n{count} silent connections at once: {seen['unauthorized', 1008]} closed at the "
          f"auth timeout, {seen[503]} refused (503), in {took:.1f} s; slowest ack "
          f"{slowest * 1000:.0f} ms over {rounds} rounds")


async def test_connections_waiting_to_authenticate_cannot_take_the_places_of_tokens(
    tmp_path: Path
) -> None:
    with started(tmp_path, max_unauthenticated=50, auth_timeout_s=60) as gw:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(50):  # anonymous, and they never send an auth frame
                await stack.enter_async_context(connect(f"{gw.ws}/ws/control"))
            with pytest.raises(InvalidStatus) as refused:
                await connect(f"{gw.ws}/ws/control", open_timeout=TIMEOUT)
            body = json.loads(refused.value.response.body or b"{}")
            assert (refused.value.response.status_code, body["code"]) == (503, "busy")
            assert "max_unauthenticated" in body["message"]
            async with operator(gw) as ws, gw.http() as http:  # a token in the header
                assert await client_round(gw, ws, http) < ACK_BOUND_S
            # A browser's panel offers its token as a subprotocol: not counted either.
            async with connect(f"{gw.ws}/ws/control", open_timeout=TIMEOUT,
                               subprotocols=browser_protocols(VIEWER)) as panel:
                assert panel.subprotocol == "gateway.v1"
                assert (await receive(panel))["type"] == "hello"
        await gw.settled()
        async with connect(f"{gw.ws}/ws/control", open_timeout=TIMEOUT) as ws:  # room again
            await ws.send(json.dumps({"type": "auth", "token": VIEWER}))
            assert (await receive(ws))["type"] == "hello"


async def test_connections_over_the_cap_are_refused_with_503_and_all_are_freed_after(
    gw: Gateway
) -> None:
    before = await gw.settled()
    extra = 100
    headers = {"Authorization": f"Bearer {VIEWER}"}

    async def flood(stack: contextlib.AsyncExitStack) -> Counter[Any]:
        async def one() -> Any:
            try:
                ws = await stack.enter_async_context(connect(
                    f"{gw.ws}/ws/control", open_timeout=TIMEOUT, additional_headers=headers))
            except InvalidStatus as refused:
                response = refused.response
                body = json.loads(response.body or b"{}")
                return response.status_code, body.get("code"), response.headers["Retry-After"]
            assert (await receive(ws))["type"] == "hello"
            return "open"

        return Counter(await gather_limited([one() for _ in range(CAP + extra)]))

    async with contextlib.AsyncExitStack() as stack:
        seen, slowest, rounds = await rounds_during(gw, flood(stack))
        held = await gw.connections()
        # The operator of `rounds_during` held one of the CAP while the flood came.
        assert seen == {"open": CAP - 1, (503, "busy", "1"): extra + 1}, seen
        assert held == CAP - 1
        rss = gw.rss()
        gw.rss_kb.append(rss)
        async with operator(gw) as ws, gw.http() as http:  # room again for one more
            assert await client_round(gw, ws, http) < ACK_BOUND_S
    after = await gw.settled(before)
    assert after["gateway_websocket_refused_total"] == \
        before["gateway_websocket_refused_total"] + extra + 1
    print(f"\n{CAP + extra} connections: {held} held, {extra + 1} refused with 503; slowest "
          f"ack {slowest * 1000:.0f} ms over {rounds} rounds; RSS {rss // 1024} MiB held")


def _ws_head(token: str | None = None) -> bytes:
    lines = ["GET /ws/control HTTP/1.1", "Host: 127.0.0.1", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             "Sec-WebSocket-Version: 13"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


HALF_A_FRAME = bytes([0x81, 0x80 | 100]) + b"mask" + b"0123456789"
"""A masked text frame header announcing 100 bytes, then only 10 of them."""
STALLS: dict[str, bytes] = {
    "nothing sent": b"",
    "half an HTTP head": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    "half a WebSocket handshake": _ws_head()[:60],
    "half a body": b"POST /api/agents/btc/requests HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
                   + f"Authorization: Bearer {CONTROL}\r\n\r\n".encode() + b'{"requestId"',
}


async def _stalled(gw: Gateway, data: bytes) -> float:
    """Connect, send ``data``, then wait for the server to drop the connection; seconds."""
    host, port = gw.url.removeprefix("http://").split(":")
    began = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionResetError):
            while await asyncio.wait_for(reader.read(65536), TIMEOUT):
                pass
        return time.monotonic() - began
    finally:
        writer.close()


async def _dropped(gw: Gateway, data: bytes) -> None:
    """Connect, send ``data`` and reset the connection at once."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    if data.startswith(b"GET /ws") and data.endswith(b"\r\n\r\n"):
        assert b" 101 " in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.close()


async def test_connections_stalled_or_dropped_mid_handshake_or_mid_frame_are_freed(
    gw: Gateway
) -> None:
    before = await gw.settled()
    per_kind = 100
    stalled = [_stalled(gw, data) for data in STALLS.values() for _ in range(per_kind)]
    dropped = [_dropped(gw, data) for data in [*STALLS.values(), _ws_head(CONTROL),
                                               _ws_head(CONTROL) + HALF_A_FRAME]
               for _ in range(per_kind)]

    async def flood() -> list[float]:
        waits = asyncio.gather(*stalled)
        await gather_limited(dropped)
        return await waits

    waits, slowest, rounds = await rounds_during(gw, flood())
    # Each stalled connection was dropped by the server once its request timeout passed.
    assert min(waits) >= REQUEST_TIMEOUT_S * 0.9
    assert max(waits) < REQUEST_TIMEOUT_S + 10
    await gw.settled(before)
    gw.rss_kb.append(gw.rss())
    print(f"\n{len(stalled)} stalled connections dropped after {min(waits):.2f}-"
          f"{max(waits):.2f} s, {len(dropped)} dropped by the client; slowest ack "
          f"{slowest * 1000:.0f} ms over {rounds} rounds")


async def _raw_http(gw: Gateway, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request on a connection of its own (``Connection: close``), as a flood makes them
    (and cheaper for this process than an HTTP client library with 1,000 in flight)."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                     f"Authorization: Bearer {CONTROL}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = await asyncio.wait_for(reader.read(), TIMEOUT)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer.partition(b"\r\n\r\n")[2]


async def test_an_http_request_flood_is_answered_and_leaves_room_for_a_client(
    gw: Gateway
) -> None:
    before = await gw.settled()
    count = 2_000

    async def submit() -> int:
        status, body = await _raw_http(gw, "POST", "/api/agents/btc/requests",
                                       json.dumps(request()).encode())
        if status == 200:
            gw.acked.add(json.loads(body)["requestId"])
        return status

    async def read() -> int:
        return (await _raw_http(gw, "GET", "/api/agents/btc/queue"))[0]

    began = time.monotonic()
    statuses, slowest, rounds = await rounds_during(
        gw, gather_limited([submit() if n % 2 else read() for n in range(count)], 200))
    took = time.monotonic() - began
    assert Counter(statuses) == {200: count}, Counter(statuses)
    await gw.settled(before)
    gw.rss_kb.append(gw.rss())
    print(f"\n{count} HTTP requests, 200 at a time, in {took:.1f} s; slowest ack "
          f"{slowest * 1000:.0f} ms over {rounds} rounds")


# ------------------------------------------------------------------------- slow readers


@contextlib.asynccontextmanager
async def slow_subscriber(gw: Gateway) -> AsyncIterator[ClientConnection]:
    """A subscriber with a tiny receive buffer that takes its snapshot, then reads nothing
    (the client library stops reading from the socket once 2 frames wait in its queue;
    without compression, so that every byte of the events is on the wire)."""
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    async with connect(f"{gw.ws}/ws/control", sock=sock, open_timeout=TIMEOUT, max_queue=2,
                       compression=None, ping_interval=None,
                       additional_headers={"Authorization": f"Bearer {VIEWER}"}) as ws:
        assert (await receive(ws))["type"] == "hello"
        assert (await answer(ws, {"type": "subscribe", "id": "s"}))["type"] == "snapshot"
        yield ws


CLOSE_TIMEOUT_S = 10.0
"""How long uvicorn's WebSocket protocol gives a closing handshake."""
TCP_CLOSE = 7
"""``tcpi_state`` of a connection that was reset."""


def masked_close(code: int = 1000) -> bytes:
    """A client's close frame, written straight to the socket (the client library would
    also wait to read the server's)."""
    payload, mask = struct.pack("!H", code), b"abcd"
    return bytes([0x88, 0x80 | len(payload)]) + mask + bytes(
        b ^ mask[i % 4] for i, b in enumerate(payload))


def tcp_state(ws: ClientConnection) -> int:
    """The TCP state of the client's socket, which the kernel keeps up to date even while
    the client reads nothing."""
    sock = ws.transport.get_extra_info("socket")
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0])


async def test_subscribers_that_never_read_are_closed_as_slow_readers_with_bounded_memory(
    gw: Gateway
) -> None:
    before = await gw.settled()
    slow_closes = 'gateway_websocket_closed_total{reason="slow_reader"}'
    rss_before = gw.rss()
    samples = [rss_before]
    positions: list[int] = []

    async def read_everything(ws: ClientConnection) -> None:
        while True:
            frame = await receive(ws)
            if frame["type"] == "event":
                positions.append(frame["position"])

    async def closed_as_slow() -> bool:
        samples.append(gw.rss())
        return (await gw.metrics())[slow_closes] == before[slow_closes] + 3

    async with slow_subscriber(gw) as slow, slow_subscriber(gw) as deaf, \
            slow_subscriber(gw) as closer, operator(gw, VIEWER) as reader, \
            operator(gw) as producer:
        assert (await answer(reader, {"type": "subscribe", "id": "s"}))["type"] == "snapshot"
        reading = asyncio.create_task(read_everything(reader))
        batches = 0
        while not await closed_as_slow():
            # ~4 MB fill the kernel's send buffer on loopback before a send can block.
            assert batches < 100, "the slow reader was never closed"
            bodies = [request(payload={"blob": secrets.token_hex(20_000)})
                      for _ in range(BATCH)]
            acks = await answer(producer, {"type": "submit_many", "id": f"b{batches}",
                                           "requests": bodies})
            assert all(a["type"] == "ack" for a in acks["results"]), acks["results"][0]
            gw.acked.update(a["requestId"] for a in acks["results"])
            batches += 1
        peak = max(samples)
        # Their sessions end (the reader and the producer are left) before the clients have
        # read anything more: the server does not wait for a client that does not read.
        async def slow_ones_gone() -> bool:
            return await gw.connections() == 2

        await until(slow_ones_gone, "the slow readers' sessions to end")
        ended = time.monotonic()
        # The close frame waits behind the frames the client never took: read them.
        closed = await closing(slow)
        assert closed.rcvd is not None, "dropped without a close frame"
        assert (closed.rcvd.code, closed.rcvd.reason) == (1008, "slow reader")
        # One that answers with a close frame of its own but reads nothing is not let off
        # into a graceful close that would wait for it for ever.
        closer.transport.write(masked_close())
        # One that never reads them is reset once the closing handshake has had its time.
        async def deaf_one_reset() -> bool:
            return tcp_state(deaf) == TCP_CLOSE and tcp_state(closer) == TCP_CLOSE

        await until(deaf_one_reset, "the connection of a client that never reads to be reset")
        reset_after = time.monotonic() - ended
        # At the end of the closing handshake's time, not whenever the kernel gives up.
        assert reset_after < CLOSE_TIMEOUT_S + 4
        # The reading subscriber was not held up: every event, in order, no gap.
        last = (await answer(producer, {"type": "ping", "id": "p"}))["position"]

        async def caught_up() -> bool:
            return bool(positions) and positions[-1] >= last

        await until(caught_up, "the reading subscriber to catch up")
        reading.cancel()
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    after = await gw.settled(before)
    assert after[slow_closes] == before[slow_closes] + 3
    rss_after = gw.rss()
    gw.rss_kb += [peak, rss_after]
    assert peak - rss_before < SLOW_RSS_BOUND_KB
    print(f"\nslow readers closed after {batches * BATCH} requests of 40 kB "
          f"({len(positions)} events), the deaf one reset {reset_after:.1f} s later; "
          f"RSS {rss_before // 1024} -> peak {peak // 1024} -> {rss_after // 1024} MiB")


# ------------------------------------------------------------------------------ after all


async def test_after_the_floods_memory_is_bounded_and_the_log_holds_every_ack_once(
    gw: Gateway
) -> None:
    gw.rss_kb.append(gw.rss())
    start_kb, end_kb = gw.rss_kb[0], gw.rss_kb[-1]
    assert max(gw.rss_kb) - start_kb < RSS_BOUND_KB, gw.rss_kb
    # Nor does it keep growing flood after flood (what the first one left is its high water).
    assert end_kb - gw.rss_kb[min(2, len(gw.rss_kb) - 1)] < LEAK_BOUND_KB, gw.rss_kb
    gw.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(gw.process.wait, TIMEOUT) == 0
    log = await read_log(gw.db)
    received = Counter(e.event.request.request_id for e in log
                       if isinstance(e.event, RequestReceived))
    assert gw.acked, "no request was acknowledged"
    assert {i: received[i] for i in gw.acked if received[i] != 1} == {}
    verify = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "verify", str(gw.db), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await asyncio.wait_for(verify.communicate(), 120)
    assert verify.returncode == 0, out.decode()[-2000:]
    print(f"\nRSS (MiB) through the floods: {[kb // 1024 for kb in gw.rss_kb]}; "
          f"{len(gw.acked)} acked requests each in the log once; verify exit 0; "
          f"end {end_kb // 1024} MiB")
