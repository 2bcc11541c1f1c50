"""The Python client (`gateway.client`) against a real gateway on a loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import BaseModel

from gateway.client import (
    AckFrame,
    ConnectionLost,
    ControlClient,
    ErrorFrame,
    FeedClient,
    GatewayClient,
    GatewayClientError,
    Subscription,
)
from gateway.edge.app import create_app
from gateway.edge.auth import TokenBook
from gateway.edge.protocol import AckFrame as ServerAck
from gateway.edge.service import Service
from gateway.edge.sessions import Session
from gateway.errors import Busy
from gateway.runtime.engine import Engine
from lanes import AgentConfig, AgentRequest, Mode
from lanes.events import RequestQueued, RequestReceived
from store import MemoryEventStore, SqliteEventStore
from tests.e2e.live import TIMEOUT, TOKENS, Live, running
from tests.gateway.support import ManualReasoner, control, log_of, request

AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP, cap=1_000),
    "eth": AgentConfig(mode=Mode.FOLLOWUP, cap=1_000),
}


def wire(agent: str, **fields: Any) -> dict[str, Any]:
    """A hook trigger as its wire JSON."""
    return {"agentId": agent, "kind": "hook_trigger",
            "createdAt": datetime.now(UTC).isoformat(), **fields}


@pytest.fixture
def reasoner() -> ManualReasoner:
    return ManualReasoner()


@pytest.fixture
async def live(reasoner: ManualReasoner) -> AsyncIterator[Live]:
    async with running(MemoryEventStore(), AGENTS, lambda _: reasoner) as gateway:
        yield gateway


async def positions_of(live: Live, agent: str) -> list[int]:
    """Every committed position of ``agent``'s stream."""
    await live.engine.flush()
    return [r.position for r in await live.engine.store.read() if r.stream == agent]


async def take_until(events: Subscription, last: int, seen: list[int]) -> None:
    """Append the positions of events to ``seen`` until ``last`` is reached (with a timeout)."""

    async def take() -> None:
        async for event in events:
            seen.append(event.position)
            if event.position >= last:
                return

    await asyncio.wait_for(take(), TIMEOUT)


async def test_submit_is_answered_by_its_ack_and_batches_by_one_answer_each(
    live: Live, reasoner: ManualReasoner
) -> None:
    async with ControlClient(live.ws, "control-secret") as client:
        assert client.hello is not None and client.hello.principal == "ops"
        first = request("btc")
        ack = await client.submit(first)
        assert isinstance(ack, AckFrame)
        assert (ack.request_id, ack.decision, ack.repeated) == (first.request_id, "accepted",
                                                                False)
        assert ack.position <= await client.ping() == await live.engine.store.last_position()
        assert (await reasoner.started()).agent_id == "btc"
        again = await client.submit(first)  # idempotent by requestId
        assert again.decision == "accepted" and again.repeated

        as_dict = await client.submit(wire("eth", dedupeKey="d1"))  # ids filled in
        assert as_dict.decision == "accepted" and as_dict.request_id.startswith("ar_")

        results = await client.submit_many([request("btc"), request("nobody"),
                                            wire("eth", dedupeKey="d1")])
        assert [type(r) for r in results] == [AckFrame, ErrorFrame, AckFrame]
        assert isinstance(results[1], ErrorFrame) and results[1].code == "unknown_agent"
        assert isinstance(results[2], AckFrame) and results[2].decision == "deduped"

        many = await client.submit_many(request("eth") for _ in range(2_500))  # 3 frames
        assert len(many) == 2_500
        assert all(isinstance(r, AckFrame) and r.decision == "accepted" for r in many)
    assert live.engine.state("eth").counters.received == 2_502

    async with FeedClient(live.ws, "feed-secret") as feed:
        assert (await feed.submit(request("eth"))).decision == "accepted"
        taken = await feed.market([{"type": "tick", "symbol": "BTCUSD", "price": 100.0,
                                    "at": datetime.now(UTC).isoformat()}])
        assert taken.events == 1 and taken.triggered == []


async def test_error_frames_become_typed_errors_and_the_connection_survives(
    live: Live,
) -> None:
    async with ControlClient(live.ws, "control-secret") as client:
        with pytest.raises(GatewayClientError) as invalid:
            await client.submit(wire("btc", priority="urgent"))
        assert invalid.value.code == "invalid" and invalid.value.field == "request.priority"
        with pytest.raises(GatewayClientError) as unknown:
            await client.submit(request("nobody"))
        assert unknown.value.code == "unknown_agent"
        assert unknown.value.request_id is not None
        with pytest.raises(GatewayClientError) as batch:  # one bad request fails the frame
            await client.submit_many([request("btc"), wire("btc", kind="rumour")])
        assert batch.value.code == "invalid" and batch.value.field == "requests.1.kind"
        assert await client.submit_many([]) == []
        with pytest.raises(GatewayClientError) as nobody:
            await client.subscribe(["nobody"]).start()
        assert nobody.value.code == "unknown_agent"
        async with client.subscribe(["btc"]) as events:  # the failed one is gone
            assert events.snapshot is not None
        assert (await client.submit(request("btc"))).decision == "accepted"
        assert client.reconnects == 0

    async with FeedClient(live.ws, "feed-secret") as feed:
        with pytest.raises(GatewayClientError) as forbidden:
            await feed.submit(control("btc", "pause"))
        assert forbidden.value.code == "forbidden"
        await feed.ping()

    with pytest.raises(GatewayClientError) as refused:
        async with FeedClient(live.ws, "viewer-secret"):
            pass
    assert refused.value.code == "forbidden"


async def test_busy_is_retried_after_retry_after_ms_and_gives_up_when_bounded(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusals = 0

    def saturated(_request: object = None) -> None:
        nonlocal refusals
        if refusals < 3:
            refusals += 1
            raise Busy(retry_after_ms=5)

    monkeypatch.setattr(live.service, "check_capacity", saturated)
    async with ControlClient(live.ws, "control-secret") as client:
        assert (await client.submit(request("btc"))).decision == "accepted"
        assert refusals == 3
    refusals = 0
    async with ControlClient(live.ws, "control-secret", retries=2) as client:
        with pytest.raises(GatewayClientError) as busy:
            await client.submit(request("btc"))
        assert busy.value.code == "busy"
    assert live.engine.state("btc").counters.received == 1


async def test_a_subscription_yields_the_agents_events_in_commit_order(live: Live) -> None:
    async with ControlClient(live.ws, "control-secret") as client:
        await client.submit(request("btc"))
        async with client.subscribe(["btc"], after=0) as events:
            assert events.snapshot is not None
            assert [a["agentId"] for a in events.snapshot.agents] == ["btc"]
            for _ in range(3):
                await client.submit(request("btc"))
                await client.submit(request("eth"))
            expected = await positions_of(live, "btc")
            seen: list[int] = []
            await take_until(events, expected[-1], seen)
            assert seen == expected
            assert events.position == expected[-1]
        client.subscribe()
        with pytest.raises(RuntimeError):  # one subscription at a time
            client.subscribe()


@pytest.fixture
def drop_on_ack(monkeypatch: pytest.MonkeyPatch) -> dict[str, asyncio.Event]:
    """Request ids whose ack the gateway will not send: it closes that connection instead
    (a real server-side drop at the worst moment: the request is committed, unanswered)."""
    victims: dict[str, asyncio.Event] = {}
    send = Session.send

    async def dropping(self: Session, frame: BaseModel) -> None:
        if isinstance(frame, ServerAck) and frame.request_id in victims:
            dropped = victims[frame.request_id]
            if not dropped.is_set():
                dropped.set()
                async with self.send_lock:
                    await self.ws.close(code=1012, reason="test: connection dropped")
                return
        await send(self, frame)

    monkeypatch.setattr(Session, "send", dropping)
    return victims


async def test_reconnect_after_a_server_side_drop_resubmits_and_resumes_without_gaps(
    live: Live, drop_on_ack: dict[str, asyncio.Event]
) -> None:
    batch = [request("btc") for _ in range(120)]
    victim = batch[50].request_id
    drop_on_ack[victim] = asyncio.Event()
    seen: list[int] = []
    acks: dict[str, AckFrame] = {}
    async with ControlClient(live.ws, "control-secret") as client:
        events = client.subscribe(["btc"], after=0)
        await events.start()

        async def worker(mine: list[AgentRequest]) -> None:
            for item in mine:  # keep submitting straight through the drop
                acks[item.request_id] = await client.submit(item)

        await asyncio.wait_for(asyncio.gather(*(worker(batch[k::6]) for k in range(6))),
                               TIMEOUT)
        assert drop_on_ack[victim].is_set()
        assert client.reconnects == 1
        expected = await positions_of(live, "btc")
        await take_until(events, expected[-1], seen)

    assert set(acks) == {r.request_id for r in batch}
    assert all(a.decision == "accepted" for a in acks.values())
    assert acks[victim].repeated  # its first answer was lost with the connection
    log = await log_of(live.engine.store)
    queued = Counter(e.event.request_id for e in log if isinstance(e.event, RequestQueued))
    assert all(queued[r.request_id] == 1 for r in batch)  # taken exactly once
    received = Counter(e.event.request.request_id for e in log
                       if isinstance(e.event, RequestReceived))
    assert received[victim] == 2  # sent again after the reconnect, recorded as repeated
    assert seen == expected  # contiguous for btc: no gap, no duplicate


# ------------------------------------------------------------- restart on the same port


@contextlib.asynccontextmanager
async def serve_at(db: Path, reasoner: ManualReasoner, port: int = 0) -> AsyncIterator[Live]:
    """A gateway over the SQLite file ``db`` on 127.0.0.1:``port`` (0: ephemeral)."""
    engine = Engine(SqliteEventStore(db), AGENTS, reasoners=lambda _: reasoner)
    service = Service(engine=engine, tokens=TokenBook(TOKENS.items()))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(service, lifespan=lifespan),
                                           log_level="warning", ws="websockets-sansio"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:  # the socket listens already: connections wait in its backlog until uvicorn serves
        yield Live(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", engine, service)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT)
        sock.close()


async def test_reconnect_across_a_server_restart_on_the_same_file_and_port(
    tmp_path: Path,
) -> None:
    db = tmp_path / "gateway.db"
    seen: list[int] = []
    clients: list[GatewayClient] = []
    try:
        async with serve_at(db, ManualReasoner()) as first:
            port = int(first.ws.rsplit(":", 1)[1])
            client = ControlClient(first.ws, "control-secret", max_backoff_s=0.2)
            once = GatewayClient(first.ws, "control-secret", reconnect=False)
            clients += [client, once]
            await client.connect()
            await once.connect()
            events = client.subscribe(["btc"], after=0)
            await events.start()
            before = [await client.submit(request("btc")) for _ in range(5)]
        with pytest.raises(ConnectionLost):  # without reconnect, the drop ends the client
            await asyncio.wait_for(once.ping(), TIMEOUT)

        # Submitted while no server is up: sent once the client is back.
        during = [asyncio.create_task(client.submit(request("btc"))) for _ in range(5)]
        async with serve_at(db, ManualReasoner(), port) as second:
            after = await asyncio.wait_for(asyncio.gather(*during), TIMEOUT)
            after.append(await client.submit(request("btc")))
            assert client.reconnects >= 1
            expected = await positions_of(second, "btc")
            await take_until(events, expected[-1], seen)
            log = await log_of(second.engine.store)
            await client.close()
    finally:
        for each in clients:
            await each.close()
    assert all(a.decision == "accepted" for a in before + after)
    queued = Counter(e.event.request_id for e in log if isinstance(e.event, RequestQueued))
    assert all(queued[a.request_id] == 1 for a in before + after)
    assert seen == expected  # including what committed while the client was away
