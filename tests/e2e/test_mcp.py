"""The gateway's tools over MCP, end to end: the SDK's own client against a live gateway over
Streamable HTTP (each tool, busy answers, bad arguments, refusals that record nothing, agent
callers' depth and fan-out). Each role calling each tool, over HTTP and through the
``gateway mcp`` stdio bridge, is in test_mcp_roles."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from gateway.base.roles import Role
from gateway.edge import mcp_tools
from gateway.edge.auth import Principal
from gateway.llm.reasoner import RunContext, RunResult
from lanes import AgentConfig, DropPolicy, Mode
from lanes.events import OrderIntent, Outcome
from store import SqliteEventStore
from tests.e2e.live import TIMEOUT, Live, running
from tests.gateway.support import next_event, until

READ_TOOLS = {"list_agents", "agent_status", "list_approvals", "story", "search_log"}
ALL_TOOLS = READ_TOOLS | {"send_message", "call_agent", "emergency_stop", "resume", "approve",
                          "reject"}
AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP, approval="always"),
    "eth": AgentConfig(mode=Mode.FOLLOWUP),
    "sol": AgentConfig(mode=Mode.FOLLOWUP, max_call_depth=0),
    "xrp": AgentConfig(mode=Mode.FOLLOWUP, cap=1, drop_policy=DropPolicy.NEW),
}


class Script:
    """Each agent answers what it heard at once; ``buy`` places an order; the ``held``
    agents hold their runs open while ``hold`` is clear."""

    def __init__(self, held: frozenset[str] = frozenset({"eth", "xrp"})) -> None:
        self.held = held
        self.hold = asyncio.Event()
        self.hold.set()

    def __call__(self, _agent_id: str) -> Script:
        return self

    async def run(self, ctx: RunContext) -> RunResult:
        heard = " ".join(str(r.payload.get("message", "")) for r in ctx.requests)
        if ctx.agent_id in self.held:
            await self.hold.wait()
        orders = (OrderIntent(symbol="BTCUSD", side="buy", qty=1),) if "buy" in heard else ()
        return RunResult(outcome=Outcome.NO_TRADE, orders=orders,
                         answer=f"{ctx.agent_id} heard {heard}")


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, script: Script | None = None) -> AsyncIterator[Live]:
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS,
                       script or Script()) as live:
        yield live


@contextlib.asynccontextmanager
async def mcp(live: Live, token: str) -> AsyncIterator[ClientSession]:
    """An MCP session of the SDK's client on the live gateway's /mcp, with ``token``."""
    async with mcp_at(live.http, token) as session:
        yield session


@contextlib.asynccontextmanager
async def mcp_at(url: str, token: str, http_timeout_s: float = TIMEOUT
                 ) -> AsyncIterator[ClientSession]:
    """An MCP session of the SDK's client on ``url``'s /mcp (a gateway's base URL), with
    ``token`` (each HTTP call given ``http_timeout_s``)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                           timeout=http_timeout_s) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def body(result: CallToolResult) -> dict[str, Any]:
    """A tool's answer (its JSON text), which must not be an error."""
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr, no-any-return]


def error(result: CallToolResult) -> dict[str, Any]:
    """A tool's error frame."""
    assert result.is_error, result.content
    frame: dict[str, Any] = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert frame["type"] == "error"
    return frame


async def test_no_token_or_an_unknown_one_is_answered_401(tmp_path: Path) -> None:
    async with gateway(tmp_path) as live, httpx2.AsyncClient(base_url=live.http) as http:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        bare = await http.post("/mcp", json=hello)
        assert bare.status_code == 401 and bare.json()["code"] == "unauthorized"
        assert bare.headers["www-authenticate"] == "Bearer"
        wrong = await http.post("/mcp", json=hello, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401


async def test_a_viewer_sees_and_calls_the_read_tools_only_and_a_refusal_records_nothing(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as live, mcp(live, "viewer-secret") as session:
        assert {t.name for t in (await session.list_tools()).tools} == READ_TOOLS
        listed = body(await session.call_tool("list_agents", {}))["agents"]
        assert [a["agentId"] for a in listed] == ["btc", "eth", "sol", "xrp"]
        assert all("blocked" in a for a in listed)
        status = body(await session.call_tool("agent_status", {"agentId": "eth"}))
        assert status["trading"] == "ACTIVE" and "queue" in status
        before = await live.engine.store.last_position()
        for tool in ("emergency_stop", "send_message", "call_agent"):
            refused = error(await session.call_tool(
                tool, {"agentId": "eth", "message": "hi"}
                if tool != "emergency_stop" else {"agentId": "eth"}))
            assert refused["code"] == "forbidden", refused
        assert await live.engine.store.last_position() == before
        assert live.engine.state("eth").trading.value == "ACTIVE"


async def test_each_tool_for_a_control_token(tmp_path: Path) -> None:
    async with gateway(tmp_path) as live, mcp(live, "control-secret") as session:
        store = live.engine.store
        assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
        sent = body(await session.call_tool("send_message", {
            "agentId": "eth", "message": "hello", "requestId": "mcp-hello"}))
        assert sent["decision"] == "accepted" and sent["requestId"] == "mcp-hello"
        answered = body(await session.call_tool("call_agent", {
            "agentId": "eth", "message": "how are you", "timeoutSeconds": TIMEOUT}))
        assert answered["status"] == "returned", answered
        assert answered["answer"] == "eth heard how are you"
        assert answered["outcome"] == "no_trade"
        # the target's depth limit holds for calls from MCP as for sub-agent calls
        deep = body(await session.call_tool("call_agent", {"agentId": "sol", "message": "x"}))
        assert deep["status"] == "refused" and "depth" in deep["reason"], deep

        stopped = body(await session.call_tool("emergency_stop", {
            "agentId": "eth", "reason": "test"}))
        assert stopped["decision"] == "accepted" and stopped["effect"]["toState"] == "HALTED"
        agents = body(await session.call_tool("list_agents", {}))["agents"]
        eth = next(a for a in agents if a["agentId"] == "eth")
        assert eth["blocked"][0]["kind"] == "halted" and eth["attention"] == "critical"
        resumed = body(await session.call_tool("resume", {"agentId": "eth"}))
        assert resumed["effect"]["toState"] == "ACTIVE"

        after = 0
        for decide in ("approve", "reject"):
            body(await session.call_tool("send_message", {"agentId": "btc", "message": "buy"}))
            asked = await next_event(store, "ApprovalRequested", after=after)
            after = asked.position
            waiting = body(await session.call_tool("list_approvals", {"agentId": "btc"}))
            [approval] = waiting["approvals"]
            decided = body(await session.call_tool(decide, {
                "agentId": "btc", "approvalId": approval["approvalId"], "reason": "mcp"}))
            assert decided["decision"] == "accepted", decided
            decision = await next_event(store, "ApprovalDecided", after=asked.position)
            assert json.loads(decision.data)["approved"] is (decide == "approve")

        story = body(await session.call_tool("story", {"agentId": "eth", "limit": 100}))
        words = json.dumps(story["groups"])
        assert "mcp-hello" in words and "emergency_stop" in words
        found = body(await session.call_tool("search_log", {"agentId": "eth",
                                                            "text": "mcp-hello"}))
        assert found["events"] and all(e["stream"] == "eth" for e in found["events"])
        at = found["events"][-1]["position"]
        around = body(await session.call_tool("story", {"agentId": "eth", "at": at,
                                                        "around": 1}))
        assert around["at"] == at and around["groups"]


async def test_an_agent_scoped_caller_is_the_source_and_sees_only_its_agents(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with gateway(tmp_path) as live, mcp(live, "scoped-secret") as session:
        listed = body(await session.call_tool("list_agents", {}))["agents"]
        assert [a["agentId"] for a in listed] == ["btc"]
        before = await live.engine.store.last_position()
        elsewhere = error(await session.call_tool("call_agent", {"agentId": "eth",
                                                                 "message": "hi"}))
        assert elsewhere["code"] == "forbidden"
        hidden = error(await session.call_tool("agent_status", {"agentId": "eth"}))
        assert hidden["code"] == "forbidden"
        assert await live.engine.store.last_position() == before
        answered = body(await session.call_tool("call_agent", {"agentId": "btc",
                                                               "message": "status?"}))
        assert answered["status"] == "returned"
        received = await next_event(live.engine.store, "RequestReceived", after=before)
        request = json.loads(received.data)["request"]
        assert request["source"] == "agent:btc-desk" and request["kind"] == "agent_call"
        assert request["payload"]["depth"] == 1
        await live.engine.flush()
        await asyncio.gather(*live.engine.calls.deliveries)
    # (the answer went to the MCP caller only: once it was also sent to "btc-desk", an
    # agent that made no such call, and a warning said it did not reach it)
    assert not [r for r in caplog.records if "did not reach" in r.getMessage()]


async def test_a_busy_agent_answers_busy_with_a_retry_after(tmp_path: Path) -> None:
    script = Script()
    script.hold.clear()
    async with gateway(tmp_path, script) as live, mcp(live, "control-secret") as session:
        body(await session.call_tool("send_message", {"agentId": "eth", "message": "think"}))
        await next_event(live.engine.store, "RunStarted")
        busy = body(await session.call_tool("call_agent", {"agentId": "eth", "message": "now?"}))
        assert busy["status"] == "busy", busy
        assert isinstance(busy["retryAfterSeconds"], int) and busy["retryAfterSeconds"] >= 1
        # queued, and not answered within its timeout: it says so, and the call stays queued
        late = body(await session.call_tool("call_agent", {
            "agentId": "eth", "message": "soon?", "ifBusy": "queue", "timeoutSeconds": 0.2,
            "requestId": "late-1"}))
        assert late["status"] == "timeout" and "stays in the agent's queue" in late["reason"]
        assert [p.request.request_id for p in live.engine.state("eth").pending] == ["late-1"]
        # asked to queue, it waits for its turn and is answered
        queued = asyncio.ensure_future(session.call_tool("call_agent", {
            "agentId": "eth", "message": "later", "ifBusy": "queue"}))
        await next_event(live.engine.store, "RequestQueued",
                         after=await live.engine.store.last_position())
        script.hold.set()
        answered = body(await asyncio.wait_for(queued, TIMEOUT))
        assert answered["status"] == "returned" and answered["answer"] == "eth heard later"


async def test_a_full_queue_answers_busy_and_a_retry_needs_a_new_request_id(
        tmp_path: Path) -> None:
    script = Script()
    script.hold.clear()
    async with gateway(tmp_path, script) as live, mcp(live, "control-secret") as session:
        for text in ("think", "then this"):  # a run, and the one request its cap allows
            body(await session.call_tool("send_message", {"agentId": "xrp", "message": text}))
        full = body(await session.call_tool("call_agent", {
            "agentId": "xrp", "message": "room?", "ifBusy": "queue", "requestId": "c1"}))
        assert full["status"] == "busy" and full["retryAfterSeconds"] >= 1, full
        assert "cap 1 reached" in full["reason"]
        again = body(await session.call_tool("call_agent", {  # (its first decision stands)
            "agentId": "xrp", "message": "room?", "ifBusy": "queue", "requestId": "c1"}))
        assert again["status"] == "refused" and "new requestId" in again["reason"], again
        script.hold.set()


async def test_an_agent_scoped_caller_has_a_fan_out_limit_and_going_over_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_tools, "DEFAULT_FAN_OUT", 1)
    script = Script(held=frozenset({"btc"}))
    script.hold.clear()
    async with gateway(tmp_path, script) as live, mcp(live, "scoped-secret") as session:
        first = asyncio.ensure_future(session.call_tool("call_agent", {
            "agentId": "btc", "message": "one", "ifBusy": "queue"}))
        started = await next_event(live.engine.store, "RunStarted")
        before = await live.engine.store.last_position()
        over = error(await session.call_tool("call_agent", {"agentId": "btc",
                                                            "message": "two"}))
        assert over["code"] == "forbidden" and "fan-out" in over["message"], over
        assert await live.engine.store.last_position() == before
        script.hold.set()
        answered = body(await asyncio.wait_for(first, TIMEOUT))
        assert answered["status"] == "returned" and answered["runId"] == \
            json.loads(started.data)["run_id"]
        again = body(await session.call_tool("call_agent", {"agentId": "btc",
                                                            "message": "three"}))
        assert again["status"] == "returned"


async def test_bad_arguments_are_tool_errors_naming_the_field(tmp_path: Path) -> None:
    async with gateway(tmp_path) as live, mcp(live, "control-secret") as session:
        before = await live.engine.store.last_position()
        cases: list[tuple[str, dict[str, Any], str]] = [  # (each tool at least once)
            ("list_agents", {"agentId": "eth"}, "agentId"),
            ("agent_status", {"agentId": "no such agent"}, "agentId"),
            ("send_message", {"agentId": "eth", "message": "x", "colour": "red"}, "colour"),
            ("send_message", {"message": "x"}, "agentId"),
            ("send_message", {"agentId": "eth", "message": ""}, "message"),
            ("send_message", {"agentId": "eth", "message": "x", "priority": "urgent"},
             "priority"),
            ("call_agent", {"agentId": "eth", "message": "x", "timeoutSeconds": -1},
             "timeoutSeconds"),
            ("call_agent", {"agentId": "eth", "message": "x", "ifBusy": "maybe"}, "ifBusy"),
            ("call_agent", {"agentId": "eth", "message": "x", "requestId": ""}, "requestId"),
            ("emergency_stop", {"agentId": "eth", "reason": "x" * 501}, "reason"),
            ("resume", {}, "agentId"),
            ("list_approvals", {"agentId": 7}, "agentId"),
            ("approve", {"agentId": "eth"}, "approvalId"),
            ("reject", {"agentId": "eth", "approvalId": ""}, "approvalId"),
            ("story", {"agentId": "eth", "at": 10**9}, "at"),
            ("story", {"agentId": "eth", "around": 101}, "around"),
            ("story", {"agentId": "eth", "from": -1}, "from"),
            ("story", {"agentId": "eth", "from": 0, "to": 10**9}, "to"),
            ("search_log", {"agentId": "eth", "text": ""}, "text"),
            ("search_log", {"agentId": "eth", "text": "x", "limit": 201}, "limit"),
            ("search_log", {"agentId": "eth", "text": "x", "before": 0}, "before"),
            ("nothing_here", {}, "name"),
        ]
        assert {tool for tool, _, _ in cases} == ALL_TOOLS | {"nothing_here"}
        for tool, arguments, field in cases:
            frame = error(await session.call_tool(tool, arguments))
            assert (frame["code"], frame.get("field")) == ("invalid", field), (tool, frame)
        unknown = error(await session.call_tool("agent_status", {"agentId": "nobody"}))
        assert unknown["code"] == "unknown_agent"
        assert await live.engine.store.last_position() == before


class Loop:
    """``ping`` and ``pong`` call each other over MCP, each as itself (its own agent-scoped
    token): every run sends one ``call_agent`` to the other and ends once the call is in the
    other's log (it waits in the other's queue, and its run calls back in turn)."""

    def __init__(self, calls: int = 6) -> None:
        self.live: Live | None = None
        self.most = calls
        self.calls: list[asyncio.Task[dict[str, Any]]] = []

    def __call__(self, _agent_id: str) -> Loop:
        return self

    async def run(self, ctx: RunContext) -> RunResult:
        assert self.live is not None
        other = "pong" if ctx.agent_id == "ping" else "ping"
        if len(self.calls) < self.most:  # (bounded, should the depth limit not hold)
            request_id = f"{ctx.run_id}-asks-{other}"
            self.calls.append(asyncio.ensure_future(self._call(ctx.agent_id, other,
                                                               request_id)))
            await _received(self.live, other, request_id)
        return RunResult(outcome=Outcome.NO_TRADE, answer=f"{ctx.agent_id} asked {other}")

    async def _call(self, caller: str, target: str, request_id: str) -> dict[str, Any]:
        assert self.live is not None
        async with mcp(self.live, f"{caller}-secret") as session:
            return body(await session.call_tool("call_agent", {
                "agentId": target, "message": f"{caller} asks", "requestId": request_id,
                "ifBusy": "queue", "timeoutSeconds": TIMEOUT}))


async def _received(live: Live, agent_id: str, request_id: str) -> dict[str, Any]:
    """The request ``request_id`` as ``agent_id``'s log received it (waits for it)."""
    async def find() -> dict[str, Any]:
        async with contextlib.aclosing(live.engine.store.follow()) as events:
            async for record in events:
                if record.stream == agent_id and record.type == "RequestReceived":
                    request: dict[str, Any] = json.loads(record.data)["request"]
                    if request["requestId"] == request_id:
                        return request
        raise AssertionError("the log ended")
    return await asyncio.wait_for(find(), TIMEOUT)


async def test_a_loop_of_agents_calling_each_other_over_mcp_ends_at_the_depth_limit(
        tmp_path: Path) -> None:
    loop = Loop()
    agents = {"ping": AgentConfig(mode=Mode.QUEUE), "pong": AgentConfig(mode=Mode.QUEUE)}
    tokens = {"ping-secret": Principal("ping", Role.CONTROL, frozenset({"pong"})),
              "pong-secret": Principal("pong", Role.CONTROL, frozenset({"ping"}))}
    async with running(SqliteEventStore(tmp_path / "events.db"), agents, loop,
                       tokens=tokens) as live:
        loop.live = live
        async with mcp(live, "control-secret") as session:
            body(await session.call_tool("send_message", {"agentId": "ping",
                                                          "message": "start"}))
        await _received(live, "ping", "pong-r2-asks-ping")  # (the fourth call)
        answers = await asyncio.wait_for(asyncio.gather(*loop.calls), TIMEOUT)
        # ping (a message: depth 0) -> pong (1) -> ping (2) -> pong (3) -> ping (4): refused
        # by ping's maxCallDepth (3), as a sub-agent call of that depth would be
        assert [a["status"] for a in answers] == ["returned"] * 3 + ["refused"], answers
        assert answers[3]["reason"] == "agent_call depth 4 exceeds the limit of 3"
        received = [await _received(live, "pong" if n % 2 == 0 else "ping",
                                    call.result()["requestId"])
                    for n, call in enumerate(loop.calls)]
        assert [r["payload"]["depth"] for r in received] == [1, 2, 3, 4]
        assert [r["source"] for r in received] == ["agent:ping", "agent:pong"] * 2
        # each made by the run its caller was in
        assert [r["payload"]["parentRunId"] for r in received] == [
            "ping-r1", "pong-r1", "ping-r2", "pong-r2"]


async def test_calls_in_flight_wait_on_one_follower_of_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(held=frozenset({"btc", "eth"}))
    script.hold.clear()
    async with gateway(tmp_path, script) as live, mcp(live, "control-secret") as session:
        engine = live.engine
        store = engine.store
        opened: list[int] = []

        def counted(follow: Any) -> Any:
            def following(*args: Any) -> Any:
                opened.append(args[0] if args else 0)
                return follow(*args)
            return following
        for name in ("follow", "follow_batches"):
            monkeypatch.setattr(store, name, counted(getattr(store, name)))
        asked = [("btc", "one"), ("eth", "two"), ("eth", "three")]
        calls = [asyncio.ensure_future(session.call_tool("call_agent", {
            "agentId": agent, "message": message, "ifBusy": "queue",
            "timeoutSeconds": TIMEOUT})) for agent, message in asked]

        async def taken() -> bool:  # each call in its agent's run or queue
            states = [engine.state(agent) for agent in ("btc", "eth")]
            return sum(len(s.pending) + (s.active is not None) for s in states) == 3
        await until(taken, "the three calls taken")
        assert len(opened) <= 1, opened
        script.hold.set()
        answers = [body(await asyncio.wait_for(call, TIMEOUT)) for call in calls]
        assert [(a["status"], a["answer"]) for a in answers] == [
            ("returned", f"{agent} heard {message}") for agent, message in asked]
        assert len(opened) == 1, opened  # (one follower for the three: it was one each)


class Caller:
    """``a``'s run calls ``b`` over MCP as itself, ``calls`` times one after another (each
    answered before the next), and keeps what each call was answered."""

    def __init__(self, calls: int) -> None:
        self.live: Live | None = None
        self.calls = calls
        self.answers: list[dict[str, Any]] = []

    def __call__(self, _agent_id: str) -> Caller:
        return self

    async def run(self, ctx: RunContext) -> RunResult:
        assert self.live is not None
        if ctx.agent_id == "a":
            async with mcp(self.live, "a-secret") as session:
                for n in range(self.calls):
                    result = await session.call_tool("call_agent", {
                        "agentId": "b", "message": f"call {n}", "ifBusy": "queue",
                        "timeoutSeconds": TIMEOUT})
                    self.answers.append(error(result) if result.is_error else body(result))
        return RunResult(outcome=Outcome.NO_TRADE, answer=f"{ctx.agent_id} done")


async def test_an_agent_callers_calls_in_a_run_count_against_its_max_calls_per_run(
        tmp_path: Path) -> None:
    caller = Caller(calls=4)
    agents = {"a": AgentConfig(mode=Mode.FOLLOWUP, max_calls_per_run=2),
              "b": AgentConfig(mode=Mode.FOLLOWUP)}
    tokens = {"a-secret": Principal("a", Role.CONTROL, frozenset({"b"}))}
    async with running(SqliteEventStore(tmp_path / "events.db"), agents, caller,
                       tokens=tokens) as live:
        caller.live = live
        async with mcp(live, "control-secret") as session:
            body(await session.call_tool("send_message", {"agentId": "a", "message": "go"}))
        completed = await next_event(live.engine.store, "RunCompleted")
        while json.loads(completed.data)["run_id"] != "a-r1":
            completed = await next_event(live.engine.store, "RunCompleted", completed.position)
        # one after another, never two out at once: still two calls for the run, as a run's
        # sub-agent calls are (the third and fourth refused, and not recorded)
        assert [a.get("status") or a["code"] for a in caller.answers] == [
            "returned", "returned", "forbidden", "forbidden"], caller.answers
        assert "fan-out limit" in caller.answers[2]["message"], caller.answers[2]
        received = [r for r in await live.engine.store.read_stream("b")
                    if r.type == "RequestReceived"]
        assert len(received) == 2
