"""The gateway's MCP tools in a cluster (two members on one PostgreSQL log, each a real server
in this process): an MCP client of one member uses every tool on an agent the other member
owns, as on one of its own. Reads come from the member's replica, requests and controls are
forwarded to the owner, and a ``call_agent``'s end is read back from the log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.cluster import read_log
from gateway.cluster.member import incarnation
from gateway.config import parse_config
from gateway.edge.server import Running, serving
from gateway.wiring import build_service
from lanes.codec import decode
from lanes.events import RequestReceived
from store import RecordedEvent
from tests.cluster.test_members import TIMEOUT, owned
from tests.cluster.test_workers import HEAD, OPS, settled
from tests.e2e.test_mcp import body, mcp_at
from tests.gateway.support import next_event, until

AGENTS = tuple(f"m{n:02d}" for n in range(16))
"""Agents that answer at once. (Enough that each of two members is given some: all 16 to
one has odds of 1 in 32,768.)"""
SLOW = tuple(f"s{n:02d}" for n in range(16))
"""Agents whose runs take a minute: busy while a test looks at them (one of them owned by
the second member: none has odds of 1 in 65,536)."""


TRADERS = tuple(f"t{n:02d}" for n in range(16))
"""Agents whose every run places an order that waits for a human's approval."""


def agents(ids: tuple[str, ...], latency_ms: int, trades: bool = False) -> str:
    """Config of ``ids``, each with a simulated reasoner whose runs take ``latency_ms``
    (and, ``trades``, place an order each, approved by a human first)."""
    return "".join(f"""
[[agents]]
id = "{agent}"
mode = "followup"
approval = "{'always' if trades else 'never'}"
[agents.reasoner]
latency_ms = [{latency_ms}, {latency_ms}]
trade_probability = {1.0 if trades else 0.0}
""" for agent in ids)


CONFIG = HEAD + agents(AGENTS, 5) + agents(SLOW, 60_000) + agents(TRADERS, 5, trades=True)


@dataclass(frozen=True)
class Pair:
    """Two members: ``a``, whose /mcp the client uses, and ``b``; an agent each owns."""

    a: Running
    b: Running
    theirs: str
    """An agent ``b`` owns (``a`` reads it from its replica and forwards to ``b``)."""
    ours: str
    """An agent ``a`` owns."""
    slow: str
    """One of the `SLOW` agents ``b`` owns."""
    trader: str
    """One of the `TRADERS` ``b`` owns."""


@contextlib.asynccontextmanager
async def member(db: str) -> AsyncIterator[Running]:
    async with serving(build_service(parse_config(CONFIG), db), "127.0.0.1", 0) as running:
        yield running


@contextlib.asynccontextmanager
async def pair(db: str) -> AsyncIterator[Pair]:
    """Two members with every agent owned by the member `assign` gives it."""
    async with member(db) as a, member(db) as b:
        await settled([a, b], AGENTS + SLOW + TRADERS)
        theirs, ours = sorted(owned(b) & {*AGENTS}), sorted(owned(a) & {*AGENTS})
        slow, traders = sorted(owned(b) & {*SLOW}), sorted(owned(b) & {*TRADERS})
        assert theirs and ours and slow and traders, (theirs, ours, slow, traders)

        async def known() -> bool:  # (a member's view of the leases is its last renewal's)
            assert a.cluster is not None and b.cluster is not None
            return all(a.cluster.owner_of(agent) == b.url for agent in owned(b)) and \
                all(b.cluster.owner_of(agent) == a.url for agent in owned(a))
        await until(known, "each member to know the other's agents", TIMEOUT)
        yield Pair(a, b, theirs[0], ours[0], slow[0], traders[0])


@contextlib.asynccontextmanager
async def tools(at: Running) -> AsyncIterator[ClientSession]:
    """The SDK's MCP client on ``at``'s /mcp, with the control token."""
    async with mcp_at(at.url, OPS, TIMEOUT) as session:
        yield session


async def status(at: Running, agent: str) -> dict[str, Any]:
    """``agent_status`` of ``agent`` asked of ``at``."""
    async with tools(at) as session:
        return body(await session.call_tool("agent_status", {"agentId": agent}))


def written_by(record: RecordedEvent, running: Running) -> bool:
    """Whether ``running`` wrote ``record`` (its event id starts with the member's)."""
    assert running.cluster is not None
    return record.event_id.startswith(incarnation(running.cluster.member))


async def started(p: Pair, after: int) -> str:
    """The run of ``p.slow`` that starts after log position ``after`` (its id)."""
    record = await next_event(p.a.service.engine.store, "RunStarted", after)
    assert record.stream == p.slow, record
    run_id: str = json.loads(record.data)["run_id"]
    return run_id


def received(records: list[RecordedEvent], request_id: str) -> list[RecordedEvent]:
    """The ``RequestReceived`` events of ``request_id``."""
    found: list[RecordedEvent] = []
    for record in records:
        if record.type == "RequestReceived":
            event = decode(record.type, record.data)
            assert isinstance(event, RequestReceived)
            if event.request.request_id == request_id:
                found.append(record)
    return found


async def test_agent_status_and_list_agents_of_another_members_agent_answer_as_for_its_own(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session:
        theirs = body(await session.call_tool("agent_status", {"agentId": p.theirs}))
        ours = body(await session.call_tool("agent_status", {"agentId": p.ours}))
        assert theirs.keys() == ours.keys(), (theirs, ours)
        assert theirs["agentId"] == p.theirs and theirs["trading"] == "ACTIVE"
        assert theirs["servedBy"] == p.b.url and ours["servedBy"] == p.a.url
        assert "behind" not in theirs
        assert {**theirs["queue"], "agentId": p.ours} == ours["queue"]  # (both idle)
        assert theirs == await status(p.b, p.theirs)  # as its owner answers
        listed = body(await session.call_tool("list_agents", {}))["agents"]
        assert [a["agentId"] for a in listed] == [*AGENTS, *SLOW, *TRADERS]  # every member's
        by_id = {a["agentId"]: a for a in listed}
        assert by_id[p.theirs]["servedBy"] == p.b.url and by_id[p.theirs]["blocked"] == []
        assert by_id[p.theirs].keys() == by_id[p.ours].keys()
        assert {k: v for k, v in theirs.items() if k != "queue"} == by_id[p.theirs]


async def test_send_message_to_another_members_agent_is_acked_and_in_the_log_once(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session:
        message = {"agentId": p.theirs, "message": "hello", "requestId": "mcp-cluster-1"}
        sent = body(await session.call_tool("send_message", message))
        assert sent["decision"] == "accepted" and sent["requestId"] == "mcp-cluster-1", sent
        records = await read_log(postgres_url)
        [request] = received(records, "mcp-cluster-1")
        assert request.stream == p.theirs and written_by(request, p.b)
        acked = next(r for r in records if r.position == sent["position"])
        assert acked.type == "RequestQueued" and acked.stream == p.theirs
        assert written_by(acked, p.b)
        assert all(written_by(r, p.b) for r in records
                   if r.stream == p.theirs and r.position >= request.position)
        # sent again (a retry): its first decision, recorded as a repeat, not queued again
        again = body(await session.call_tool("send_message", message))
        assert again["decision"] == "accepted" and again["repeated"] is True, again
        records = await read_log(postgres_url)
        queued = [r for r in records if r.type == "RequestQueued"
                  and json.loads(r.data)["request_id"] == "mcp-cluster-1"]
        assert [r.position for r in queued] == [sent["position"]]


async def test_call_agent_to_another_members_agent_returns_the_answer_of_its_run_there(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session:
        answered = body(await session.call_tool("call_agent", {
            "agentId": p.theirs, "message": "how are you", "requestId": "mcp-call-1",
            "timeoutSeconds": TIMEOUT}))
        assert answered["status"] == "returned", answered
        assert answered["answer"] == "simulated: looked at 1 requests", answered
        assert answered["outcome"] == "no_trade" and answered["runId"], answered
        records = await read_log(postgres_url)
        [request] = received(records, "mcp-call-1")
        assert request.stream == p.theirs and written_by(request, p.b)
        ended = next(r for r in records if r.position == answered["position"])
        assert ended.stream == p.theirs and written_by(ended, p.b)  # the run was b's
        assert json.loads(ended.data)["run_id"] == answered["runId"]


async def test_a_busy_agent_of_another_member_answers_call_agent_busy_with_a_retry_after(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session:
        before = await p.a.service.engine.store.last_position()
        body(await session.call_tool("send_message", {"agentId": p.slow, "message": "think"}))
        await started(p, before)
        busy = body(await session.call_tool("call_agent", {
            "agentId": p.slow, "message": "now?", "requestId": "mcp-busy-1"}))
        assert busy["status"] == "busy" and busy["requestId"] == "mcp-busy-1", busy
        assert isinstance(busy["retryAfterSeconds"], int) and busy["retryAfterSeconds"] >= 1
        assert not p.b.service.engine.state(p.slow).pending  # (refused, not queued)


async def test_emergency_stop_of_another_members_agent_halts_it_and_ends_a_call_in_its_run(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session:
        before = await p.a.service.engine.store.last_position()
        call = asyncio.ensure_future(session.call_tool("call_agent", {
            "agentId": p.slow, "message": "take your time", "requestId": "mcp-call-2",
            "timeoutSeconds": TIMEOUT}))
        run = await started(p, before)
        stopped = body(await session.call_tool("emergency_stop", {
            "agentId": p.slow, "reason": "mcp in a cluster"}))
        assert stopped["decision"] == "accepted", stopped
        assert stopped["effect"]["toState"] == "HALTED", stopped
        assert stopped["effect"]["abortedRun"] == run, stopped
        assert (await status(p.b, p.slow))["trading"] == "HALTED"  # (b committed it)
        assert p.b.service.engine.state(p.slow).trading.value == "HALTED"
        # the call's end, recorded by b, read back on a
        answered = body(await asyncio.wait_for(call, TIMEOUT))
        assert (answered["status"], answered["reason"], answered["runId"]) == (
            "aborted", "emergency_stop", run), answered

        async def halted_here() -> dict[str, Any] | None:  # (a's replica follows the log)
            seen = body(await session.call_tool("agent_status", {"agentId": p.slow}))
            return seen if seen["trading"] == "HALTED" and seen["activeRun"] is None \
                else None
        seen = await until(halted_here, "a's replica of the agent halted", TIMEOUT)
        assert seen["blocked"][0]["kind"] == "halted", seen
        records = await read_log(postgres_url)
        [aborted] = [r for r in records if r.type == "RunAborted" and r.stream == p.slow]
        assert written_by(aborted, p.b)
        assert body(await session.call_tool("agent_status", {"agentId": p.ours}))[
            "trading"] == "ACTIVE"  # (only that agent)


async def test_resume_story_and_search_log_of_another_members_agent_answer_as_its_owner(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session, tools(p.b) as owner:
        stop = {"agentId": p.theirs, "reason": "cluster story check"}
        assert body(await session.call_tool("emergency_stop", stop))["decision"] == "accepted"
        resumed = body(await session.call_tool("resume", {"agentId": p.theirs,
                                                          "reason": "all clear"}))
        assert resumed["decision"] == "accepted", resumed
        assert (resumed["effect"]["fromState"], resumed["effect"]["toState"]) == (
            "HALTED", "ACTIVE"), resumed
        assert p.b.service.engine.state(p.theirs).trading.value == "ACTIVE"  # (b's decision)
        records = await read_log(postgres_url)
        resumed_at = next(r for r in records if r.position == resumed["position"])
        assert resumed_at.stream == p.theirs and written_by(resumed_at, p.b)

        asked = {"agentId": p.theirs, "from": 0, "limit": 50}
        story = body(await session.call_tool("story", asked))
        assert story == body(await owner.call_tool("story", asked))  # as its owner tells it
        told = json.dumps(story)
        assert "ACTIVE -> HALTED" in told and "HALTED -> ACTIVE" in told, story
        search = {"agentId": p.theirs, "text": "cluster story check"}
        found = body(await session.call_tool("search_log", search))
        assert found == body(await owner.call_tool("search_log", search))
        assert found["events"], found  # (the stop's request: its reason is in its data)
        assert all("cluster story check" in json.dumps(e) for e in found["events"]), found
        unknown = await session.call_tool("story", {"agentId": "nobody", "from": 0})
        assert unknown.is_error and "unknown_agent" in str(unknown.content), unknown


async def test_an_order_of_another_members_agent_is_listed_and_approved_through_this_one(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p, tools(p.a) as session:
        before = await p.a.service.engine.store.last_position()
        sent = {"agentId": p.trader, "message": "trade"}
        assert body(await session.call_tool("send_message", sent))["decision"] == "accepted"
        asked = await next_event(p.a.service.engine.store, "ApprovalRequested", before)
        assert asked.stream == p.trader and written_by(asked, p.b)

        async def listed() -> list[dict[str, Any]] | None:  # (from a's replica)
            waiting = body(await session.call_tool("list_approvals", {"agentId": p.trader}))
            return waiting["approvals"] or None
        [approval] = await until(listed, "the approval listed on a", TIMEOUT)
        decided = body(await session.call_tool("approve", {
            "agentId": p.trader, "approvalId": approval["approvalId"], "reason": "ok"}))
        assert decided["decision"] == "accepted", decided
        answer = await next_event(p.a.service.engine.store, "ApprovalDecided", asked.position)
        assert answer.stream == p.trader and written_by(answer, p.b)  # (the owner decided)
        assert json.loads(answer.data)["approved"] is True
        again = body(await session.call_tool("approve", {
            "agentId": p.trader, "approvalId": approval["approvalId"]}))
        assert again["decision"] == "rejected", again  # (no longer waiting)


async def test_the_stdio_bridge_to_one_member_controls_an_agent_of_the_other(
        postgres_url: str) -> None:
    async with pair(postgres_url) as p:
        params = StdioServerParameters(  # (the bridge to a's /mcp: the agent is b's)
            command=sys.executable, args=["-m", "gateway", "mcp", "--url", f"{p.a.url}/mcp",
                                          "--token-env", "GW_MCP_TOKEN"],
            env={**os.environ, "GW_MCP_TOKEN": OPS})
        async with stdio_client(params) as (read, write), \
                ClientSession(read, write) as bridged:
            await asyncio.wait_for(bridged.initialize(), 60)
            seen = body(await bridged.call_tool("agent_status", {"agentId": p.theirs}))
            assert seen["servedBy"] == p.b.url and seen["trading"] == "ACTIVE", seen
            stopped = body(await bridged.call_tool("emergency_stop", {
                "agentId": p.theirs, "reason": "over the bridge"}))
            assert stopped["effect"]["toState"] == "HALTED", stopped
            assert p.b.service.engine.state(p.theirs).trading.value == "HALTED"
            records = await read_log(postgres_url)
            halted = next(r for r in records if r.position == stopped["position"])
            assert halted.stream == p.theirs and written_by(halted, p.b)
