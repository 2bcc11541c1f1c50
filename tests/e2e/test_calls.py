"""Sub-agent calls end to end: a request over the WebSocket fans out to other agents, their
results come back to the caller, on the real engine over SQLite."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.llm.reasoner import RunContext, RunResult, SimulatedCall, SimulatedReasoner
from lanes import AgentConfig, Mode, replay, verify
from lanes.events import (
    CallAnswered,
    CallEnded,
    CallIntent,
    CallStatus,
    Outcome,
    RunCompleted,
    TradingState,
)
from lanes.requests import Kind
from store import SqliteEventStore
from tests.e2e.live import Live, receive, running
from tests.gateway.support import TIMEOUT, log_of, next_event, until

_n = iter(range(1_000_000))


def message(agent: str, text: str = "go") -> dict[str, Any]:
    n = next(_n)
    return {"requestId": f"m{n}", "createdAt": datetime.now(UTC).isoformat(), "agentId": agent,
            "kind": "user_control", "payload": {"message": text}}


def stop(agent: str) -> dict[str, Any]:
    n = next(_n)
    return {"requestId": f"s{n}", "createdAt": datetime.now(UTC).isoformat(), "agentId": agent,
            "kind": "user_control", "priority": "high", "payload": {"action": "emergency_stop"}}


async def submit(live: Live, request: dict[str, Any]) -> dict[str, Any]:
    """Submit over the control WebSocket; the ack."""
    async with live.socket() as ws:
        await ws.send(json.dumps({"type": "submit", "id": "x", "request": request}))
        ack = await receive(ws)
    assert ack["type"] == "ack" and ack["decision"] == "accepted", ack
    return ack


class Desk:
    """Scripted agents: ``desk`` calls the helpers on a message; a helper answers at once,
    unless it is ``slow`` (it never answers: a test stops it or lets the call time out)."""

    def __init__(self, *helpers: str, mid: tuple[str, ...] = ()) -> None:
        self.helpers = helpers
        self.mid = mid
        """Whom ``mid`` calls while serving a call."""
        self.cancelled: list[str] = []
        self.runs: list[RunContext] = []
        self.seen: asyncio.Queue[RunContext] = asyncio.Queue()

    def __call__(self, _agent_id: str) -> Desk:
        return self

    async def run(self, ctx: RunContext) -> RunResult:
        self.runs.append(ctx)
        self.seen.put_nowait(ctx)
        kinds = {r.kind for r in ctx.requests}
        if ctx.agent_id == "desk":
            if kinds == {Kind.CALL_RESULT}:
                return RunResult(outcome=Outcome.NO_TRADE, answer="summed up")
            calls = tuple(CallIntent(agent_id=h, payload={"q": f"view of {h}?"})
                          for h in self.helpers)
            return RunResult(outcome=Outcome.NO_TRADE, calls=calls)
        if ctx.agent_id == "mid" and kinds == {Kind.AGENT_CALL}:
            return RunResult(outcome=Outcome.NO_TRADE,
                             calls=tuple(CallIntent(agent_id=h) for h in self.mid))
        if ctx.agent_id == "slow":
            try:
                await asyncio.Event().wait()  # until cancelled (a stop, a withdrawal)
            except asyncio.CancelledError:
                self.cancelled.append(ctx.run_id)
                raise
        question = ctx.requests[0].payload.get("q")
        return RunResult(outcome=Outcome.NO_TRADE, answer=f"{ctx.agent_id} on {question!r}")

    async def run_of(self, agent: str, kind: Kind) -> RunContext:
        """The next run of ``agent`` whose first request is of ``kind``."""
        while True:
            ctx = await asyncio.wait_for(self.seen.get(), TIMEOUT)
            if ctx.agent_id == agent and ctx.requests[0].kind is kind:
                return ctx


AGENTS = {"desk": AgentConfig(mode=Mode.FOLLOWUP), "alpha": AgentConfig(),
          "beta": AgentConfig(), "slow": AgentConfig(call_timeout_ms=None, mode=Mode.FOLLOWUP),
          "mid": AgentConfig(mode=Mode.FOLLOWUP, max_parallel_calls=1)}


async def test_a_run_fans_out_and_its_follow_up_run_sees_every_result(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    desk = Desk("alpha", "beta", "ghost")
    caplog.set_level(logging.WARNING)
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, desk) as live:
        await submit(live, message("desk"))
        follow_up = await desk.run_of("desk", Kind.CALL_RESULT)
        results = follow_up.requests[0].payload["results"]
        assert [(r["target"], r["status"]) for r in results] == [
            ("alpha", "returned"), ("beta", "returned"), ("ghost", "refused")]
        assert results[0]["answer"] == "alpha on 'view of alpha?'"
        assert results[2]["code"] == "undeliverable" and "ghost" in results[2]["error"]
        assert follow_up.depth == 0
        await live.engine.flush()
        log = await log_of(live.engine.store)
    assert verify(log) is None
    answered = [e.event for e in log if isinstance(e.event, CallAnswered)]
    assert {a.result.call_id for a in answered} == {"desk-r1-c1", "desk-r1-c2"}
    # each answer was taken as a request and acked (no delivery failed, nothing retried)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_an_emergency_stop_of_the_caller_cancels_its_calls(tmp_path: Path) -> None:
    desk = Desk("slow", "slow", "alpha")
    config = {**AGENTS, "desk": AgentConfig(mode=Mode.FOLLOWUP, max_parallel_calls=1)}
    async with running(SqliteEventStore(tmp_path / "events.db"), config, desk) as live:
        await submit(live, message("desk"))
        await desk.run_of("slow", Kind.AGENT_CALL)  # the first call is out, two wait
        await submit(live, stop("desk"))
        assert live.engine.state("desk").trading is TradingState.HALTED
        ended = [e.event for e in await log_of(live.engine.store)
                 if isinstance(e.event, CallEnded)]
        assert [e.result.status for e in ended] == [CallStatus.CANCELLED] * 3
        assert not live.engine.state("desk").calls.open
        await live.engine.flush()
        assert verify(await log_of(live.engine.store)) is None


async def test_a_stop_at_the_root_withdraws_the_calls_below_it_down_the_tree(
    tmp_path: Path,
) -> None:
    desk = Desk("mid", mid=("slow", "slow"))
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, desk) as live:
        await submit(live, message("desk"))
        busy = await desk.run_of("slow", Kind.AGENT_CALL)  # mid's first call; its second waits
        await submit(live, stop("desk"))

        async def withdrawn() -> bool:
            engine = live.engine
            return (busy.run_id in desk.cancelled and not engine.state("mid").calls.open
                    and engine.state("slow").active is None)

        await until(withdrawn, "the calls below the root withdrawn")
        await live.engine.flush()
        log = await log_of(live.engine.store)
    assert verify(log) is None
    mid = [e.event for e in log if e.stream == "mid" and isinstance(e.event, CallEnded)]
    assert [(e.result.status, e.result.code) for e in mid] == [
        (CallStatus.CANCELLED, "withdrawn")] * 2
    slow = replay(log)["slow"]
    assert slow.active is None and not slow.pending  # its run aborted, nothing left to run
    assert not [e for e in log if e.stream == "mid" and isinstance(e.event, CallAnswered)]


async def test_a_call_that_gets_no_result_times_out_on_the_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    desk = Desk("slow", "alpha")
    config = {**AGENTS, "desk": AgentConfig(mode=Mode.FOLLOWUP, call_timeout_ms=30_000)}
    async with running(SqliteEventStore(tmp_path / "events.db"), config, desk,
                       clock=clock) as live:
        await submit(live, message("desk"))
        await desk.run_of("slow", Kind.AGENT_CALL)
        await next_event(live.engine.store, "CallEnded")  # alpha's result
        clock.advance(29_999)
        assert len(live.engine.state("desk").calls.open) == 1
        clock.advance(1)
        follow_up = await desk.run_of("desk", Kind.CALL_RESULT)
        results = follow_up.requests[0].payload["results"]
        assert [r["status"] for r in results] == ["timed_out", "returned"]
        assert results[0]["code"] == "timeout"
        await live.engine.flush()
        assert verify(await log_of(live.engine.store)) is None


def tree_reasoners() -> dict[str, SimulatedReasoner]:
    """root -> m0..m9 -> n0..n9 (each m calls every n) -> leaf0..leaf9 (each n calls every
    leaf): 10 x 10 x 10 = 1,000 leaf calls from one request, at depth 3."""

    def sim(calls: list[SimulatedCall], below: int) -> SimulatedReasoner:
        return SimulatedReasoner(latency_ms=(0, 0), trade_probability=0.0, steerable=False,
                                 turns=1, calls=calls, call_below_depth=below)

    reasoners = {"root": sim([SimulatedCall(f"m{i}") for i in range(10)], 1)}
    for i in range(10):
        reasoners[f"m{i}"] = sim([SimulatedCall(f"n{j}") for j in range(10)], 2)
        reasoners[f"n{i}"] = sim([SimulatedCall(f"leaf{j}") for j in range(10)], 3)
        reasoners[f"leaf{i}"] = sim([], 0)
    return reasoners


async def test_a_10_by_10_by_10_call_tree_completes_and_answers_the_root(
    tmp_path: Path,
) -> None:
    reasoners = tree_reasoners()
    agents = {agent: AgentConfig(mode=Mode.FOLLOWUP) for agent in reasoners}
    async with running(SqliteEventStore(tmp_path / "events.db"), agents,
                       reasoners.__getitem__) as live:
        started = time.perf_counter()
        await submit(live, message("root", "fan out"))
        await next_event(live.engine.store, "AgentCallDispatched")
        async with live.client("viewer-secret") as http:
            # Read while the tree grows: the answer after is folded on from what this read.
            early = (await http.get("/api/agents/root/calls")).json()
        assert early["runs"], early

        async def root_done() -> bool:
            return live.engine.state("root").counters.completed >= 2

        await until(root_done, "the root's follow-up run", within_s=120)
        took = time.perf_counter() - started
        await live.engine.flush()
        log = await log_of(live.engine.store)
        async with live.client("viewer-secret") as http:
            tree = (await http.get("/api/agents/root/calls")).json()
    ended = Counter(e.event.result.status for e in log if isinstance(e.event, CallEnded))
    assert ended == {CallStatus.RETURNED: 1_110}
    leaves = sum(1 for e in log if e.stream.startswith("leaf")
                 and isinstance(e.event, RunCompleted))
    assert leaves == 1_000
    root = replay(log)["root"]
    assert root.calls.ended == {CallStatus.RETURNED: 10} and not root.calls.open
    assert verify(log) is None
    [run] = tree["runs"]
    assert len(run["calls"]) == 10 and tree["counts"] == {"returned": 1_110}
    assert sum(len(n["calls"]) for m in run["calls"] for n in m["calls"]) == 1_000
    print(f"\n1,000-leaf call tree: {took:.1f} s, {len(log)} events")


async def test_no_token_may_send_a_call_result_or_a_withdrawal(tmp_path: Path) -> None:
    desk = Desk("alpha")
    async with running(SqliteEventStore(tmp_path / "events.db"), AGENTS, desk) as live:
        for kind in ("call_result", "call_cancel"):
            forged = {**message("desk"), "kind": kind, "source": "agent:alpha",
                      "payload": {"callId": "desk-r1-c1", "status": "returned"}}
            for token in ("control-secret", "admin-secret"):
                async with live.socket(token=token) as ws:
                    await ws.send(json.dumps({"type": "submit", "request": forged}))
                    refused = await receive(ws)
                assert refused["type"] == "error" and refused["code"] == "forbidden", refused
        assert live.engine.state("desk").counters.received == 0
