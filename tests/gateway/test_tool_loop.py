"""The tool loop of a run in the engine, with a scripted LLM client: steers reach the model
at a tool boundary (after the tool results, before the next call) and are recorded there;
the step budget ends a run that never answers; a tool's arguments refused are answered as a
tool error the model reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import cast

from gateway.base.clock import FakeClock
from gateway.base.tasks import spawn
from gateway.llm.port import Completion, ToolCall
from gateway.llm.reasoner import SimulatedReasoner
from gateway.runtime.agents import Agent
from gateway.runtime.core import Outcome
from gateway.runtime.runs import Runs
from gateway.runtime.toolbox import Toolbox
from gateway.tools.timeline import story
from lanes import AgentConfig, AgentState, Mode, verify
from lanes.events import TimerElapsed
from store.port import RecordedEvent
from tests.gateway.support import log_of, next_event, request
from tests.gateway.test_gate_engine import ScriptedLLM, answer, engine_with

TOOLS = ("positions", "open_orders")


def calling(*calls: ToolCall) -> Completion:
    return Completion(text="", input_tokens=300, output_tokens=20, stop_reason="tool_use",
                      tool_calls=calls)


async def test_a_steer_reaches_the_model_after_the_tool_results_and_is_recorded_there() -> None:
    first: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    client = ScriptedLLM(first, answer("no_trade"))
    engine, store, _ = await engine_with(client, config=AgentConfig(mode=Mode.STEER,
                                                                    tools=TOOLS))
    await engine.submit(request("btc", payload={"symbol": "BTCUSD"}))
    await client.call_count(1)
    await next_event(store, "SteerabilityChanged")
    steer = request("btc", "user_control", payload={"message": "CPI hot"})
    assert (await engine.submit(steer)).decision == "accepted"
    await next_event(store, "RunSteered")
    first.set_result(calling(ToolCall("t1", "positions", {})))
    await next_event(store, "RunCompleted")
    second = client.calls[1]
    assert [m.role for m in second] == ["user", "assistant", "user"]
    assert second[1].tool_calls == (ToolCall("t1", "positions", {}),)
    assert [r.call_id for r in second[2].tool_results] == ["t1"]
    assert "CPI hot" in second[2].content  # after the results, in the same turn
    records = await store.read_stream("btc")
    steps = [json.loads(r.data) for r in records if r.type == "ModelCalled"]
    assert [s["steered"] for s in steps] == [[], [steer.request_id]]
    assert verify(await log_of(store)) is None
    await engine.stop()


async def test_a_run_that_never_stops_calling_tools_fails_with_its_step_budget_named() -> None:
    client = ScriptedLLM(*(calling(ToolCall(f"t{n}", "open_orders", {})) for n in range(3)))
    engine, store, _ = await engine_with(client, config=AgentConfig(tools=TOOLS, max_steps=3))
    await engine.submit(request("btc"))
    failed = await next_event(store, "RunFailed")
    assert "step budget (3 model calls)" in json.loads(failed.data)["error"]
    assert len(client.calls) == 3
    assert verify(await log_of(store)) is None
    await engine.stop()


async def test_refused_arguments_come_back_as_a_tool_error_and_the_run_goes_on() -> None:
    client = ScriptedLLM(calling(ToolCall("t1", "positions", {"all": True}),
                                 ToolCall("t2", "open_orders", {}, malformed="{nope")),
                         answer("no_trade"))
    engine, store, _ = await engine_with(client, config=AgentConfig(tools=TOOLS))
    await engine.submit(request("btc"))
    await next_event(store, "RunCompleted")
    results = client.calls[1][2].tool_results
    assert [(r.call_id, r.is_error) for r in results] == [("t1", True), ("t2", True)]
    assert "all" in results[0].content and "not a JSON object" in results[1].content
    log = await log_of(store)
    assert verify(log) is None
    # the timeline says each step in words
    groups = list(story(e for e in log if e.stream == "btc"))
    said = [g.text for g in groups] + [d.text for g in groups for d in g.decisions]
    assert any("step 1: asked for positions (t1), open_orders (t2)" in t for t in said)
    assert any("step 1: 0 tool calls go ahead; t1 refused: positions: " in t for t in said)
    assert any("step 2: answered" in t for t in said)
    await engine.stop()


async def test_a_stop_cancels_a_steps_wait_for_its_commit_never_the_commit_itself() -> None:
    """A stop cancels the run's task while it waits for its step's commit: the commit, which
    the log's other waiters share, must go on (cancelling it made the agent recover from
    the log, and a stop's ack under tool loops waited up to 0.8 s: bench.estop_latency)."""
    loop = asyncio.get_running_loop()
    commit: asyncio.Future[list[RecordedEvent]] = loop.create_future()
    runs = Runs(clock=FakeClock(), reasoners=lambda _: SimulatedReasoner(),
                gate_of=lambda _: None, feed=lambda agent, event: Outcome([], commit),
                live=lambda agent: True, spawn=spawn,
                toolbox=Toolbox(None, lambda _: AgentState(agent_id="a"), FakeClock()))
    agent = cast(Agent, object())
    waiting = asyncio.ensure_future(runs._record(agent, TimerElapsed(at=1)))
    await asyncio.sleep(0)  # (one turn: the wait has begun)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    assert not commit.cancelled()
    commit.set_result([])
