"""Forwards to an owner that went silent (paused, cut off): bounded by the lease, then sent
to whoever owns the agent then, else answered `unavailable` (no database: the router with
stand-ins for the engine, the replicas and the member, and the peers' HTTP in memory)."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import warnings
from typing import Any, cast

import httpx2
import pytest

from gateway.base.clock import SystemClock
from gateway.cluster.peers import Peers
from gateway.cluster.router import Router
from gateway.errors import GatewayError, NotOwner
from lanes import AgentState
from tests.gateway.support import request

PAUSED = "http://paused:1"
TAKER = "http://taker:2"
LEFT = "http://left:3"
"""An owner the agent left meanwhile: it answers that the agent moved."""
LEASE_MS = 300


class _Engine:
    def holds(self, _agent_id: str) -> bool:
        return False


class _Replicas:
    def state(self, agent_id: str) -> AgentState:
        return AgentState(agent_id=agent_id)


class _Member:
    """The leases as the router reads them: ``now`` first, ``after`` once read again."""

    lease_ms = LEASE_MS
    period_ms = LEASE_MS // 5
    clock = SystemClock()  # (the router waits for a new owner on the member's clock)

    def __init__(self, after: str | None, first: str = PAUSED) -> None:
        self.after = after
        self.first = first
        self.reread = False
        self.adopting: list[str] = []

    def owner_of(self, _stream: str) -> str | None:
        return self.after if self.reread else self.first

    async def locate(self, stream: str) -> str | None:
        return self.owner_of(stream)

    async def relocate(self, stream: str) -> str | None:
        self.reread = True
        return self.owner_of(stream)

    async def serving(self, url: str) -> bool:
        return url != PAUSED  # (its lease expired: it did not renew it)


def _router(member: _Member, asked: list[str], left: frozenset[str] = frozenset({LEFT})
            ) -> Router:
    async def answer(http: httpx2.Request) -> httpx2.Response:
        owner = f"{http.url.scheme}://{http.url.host}:{http.url.port}"
        asked.append(owner)
        if owner == PAUSED:
            await asyncio.Event().wait()  # a paused process: never answers
        body = json.loads(http.content)
        if owner in left:  # as `gateway.edge.internal` answers for an agent that moved
            return httpx2.Response(200, json={"results": [
                {"type": "error", "code": "unavailable", "requestId": r["requestId"],
                 "message": "agent has no gateway process right now", "moved": {"owner": None}}
                for r in body["requests"]]})
        return httpx2.Response(200, json={"results": [
            {"type": "ack", "requestId": r["requestId"], "decision": "accepted", "position": 7}
            for r in body["requests"]]})

    peers = Peers("secret")
    peers._client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    router = Router(peers)
    router.attach(cast(Any, _Engine()), cast(Any, _Replicas()), cast(Any, member))
    return router


async def test_a_forward_to_a_paused_owner_goes_to_the_member_that_took_its_agent() -> None:
    asked: list[str] = []
    router = _router(_Member(after=TAKER), asked)
    started = time.monotonic()
    [answer] = router.take([request("a")], None)
    ack = await asyncio.wait_for(answer, 5 * LEASE_MS / 1000)
    assert ack.decision == "accepted" and asked == [PAUSED, TAKER]
    assert time.monotonic() - started < 3 * LEASE_MS / 1000
    await router.close()
    await router.peers.close()


async def test_a_forward_to_a_slow_owner_that_renews_its_lease_is_waited_for() -> None:
    member = _Member(after=TAKER)
    member.serving = lambda url: _true()  # type: ignore[method-assign]
    router = _router(member, [])
    [answer] = router.take([request("a")], None)
    done, _ = await asyncio.wait([answer], timeout=3 * LEASE_MS / 1000)
    assert not done  # still waiting for the owner, alive though slow
    await router.close()
    assert answer.cancelled()
    await router.peers.close()


async def _true() -> bool:
    return True


async def test_a_forward_to_a_paused_owner_nobody_took_over_is_answered_unavailable() -> None:
    asked: list[str] = []
    router = _router(_Member(after=None), asked)
    [answer] = router.take([request("a")], None)
    with pytest.raises(GatewayError) as raised:
        await asyncio.wait_for(answer, 5 * LEASE_MS / 1000)
    assert raised.value.code == "unavailable" and asked == [PAUSED]
    message = str(raised.value)
    assert PAUSED in message and "within the lease" in message and "requestId" in message
    await router.peers.close()


def test_a_router_closed_with_forwards_under_way_cancels_them_cleanly() -> None:
    # A forward spawned and never run (the loop ends first) must not leave its coroutine
    # unawaited ("coroutine ... was never awaited" at shutdown).
    loop = asyncio.new_event_loop()

    async def main() -> list[asyncio.Future[Any]]:
        router = _router(_Member(after=TAKER), [])
        answers = router.take([request("a")], None)  # (the forward is not started yet)
        await router.close()
        await router.peers.close()
        return list(answers)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answers = loop.run_until_complete(main())
        loop.close()
        gc.collect()
    assert answers[0].cancelled()
    assert not [w for w in caught if "never awaited" in str(w.message)], caught


async def test_a_forward_to_an_owner_the_agent_left_meanwhile_goes_on_to_its_new_owner() -> None:
    # (the asker's view of the leases was read before a member joined and took the agent)
    asked: list[str] = []
    router = _router(_Member(after=TAKER, first=LEFT), asked)
    [answer] = router.take([request("a")], None)
    ack = await asyncio.wait_for(answer, 5 * LEASE_MS / 1000)
    assert ack.decision == "accepted" and asked == [LEFT, TAKER]
    await router.close()
    await router.peers.close()


async def test_an_agent_that_moved_again_meanwhile_is_answered_unavailable_after_one_more_try(
        ) -> None:
    asked: list[str] = []
    router = _router(_Member(after=TAKER, first=LEFT), asked, left=frozenset({LEFT, TAKER}))
    [answer] = router.take([request("a")], None)
    with pytest.raises(NotOwner) as raised:
        await asyncio.wait_for(answer, 5 * LEASE_MS / 1000)
    assert raised.value.code == "unavailable" and asked == [LEFT, TAKER]
    assert "retry with the same requestId" in str(raised.value)
    await router.peers.close()


async def test_an_agent_its_member_is_still_adopting_is_unavailable_there_not_moved() -> None:
    """Issue 23, 1b: a request forwarded to the member that just took the agent over, while
    it was still loading it, was answered "no owner" and marked moved, so the asker waited
    a whole lease for another owner (there was none) before answering: the agent acked
    again seconds after it was loaded. Now it is `unavailable` for a moment (retry), never
    moved."""
    member = _Member(after=None, first=TAKER)
    member.adopting = ["a"]
    router = _router(member, [])
    error = router.missing("a")
    assert not isinstance(error, NotOwner)
    assert error.code == "unavailable" and "retry" in str(error)
    assert isinstance(router.missing("b"), NotOwner)  # (one it is not adopting)
    await router.peers.close()


async def test_what_the_edge_parsed_reaches_this_processs_engine_as_parsed() -> None:
    taken: list[tuple[list[str], bool]] = []

    class Holding:
        def holds(self, _agent_id: str) -> bool:
            return True

        def take(self, requests: list[Any], principal: str | None, batch: Any = None,
                 parsed: bool = False) -> list[asyncio.Future[Any]]:
            taken.append(([r.request_id for r in requests], parsed))
            loop = asyncio.get_running_loop()
            return [loop.create_future() for _ in requests]

    router = Router(Peers("secret"))
    router.attach(cast(Any, Holding()), cast(Any, _Replicas()), cast(Any, _Member(None)))
    first, second = request("a"), request("b")

    router.take([first], "feed", parsed=True)
    router.take([second], "feed")

    assert taken == [([first.request_id], True), ([second.request_id], False)]
    await router.close()
    await router.peers.close()
