"""Sub-agent tasks as tools in the engine: a run schedules tasks, sends them and waits in
``execute_scheduled_tasks`` for the callees' answers; a stop while it waits cancels the
tasks and withdraws them from their targets; a task's timeout is a result the run reads."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.llm.port import Completion, ToolCall
from gateway.llm.reasoner import LLMReasoner
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from gateway.tools.timeline import story
from lanes import AgentConfig, Mode, verify
from lanes.gate.events import GateLimits
from store import MemoryEventStore
from tests.gateway.support import control, log_of, next_event, request
from tests.gateway.test_gate_engine import ScriptedLLM, Step, answer

TOOLS = ("schedule_tasks", "execute_scheduled_tasks", "get_queue_status")


def calling(*calls: ToolCall) -> Completion:
    return Completion(text="", input_tokens=300, output_tokens=20, stop_reason="tool_use",
                      tool_calls=calls)


def schedule(*targets: str, **task: Any) -> ToolCall:
    return ToolCall("t1", "schedule_tasks", {"tasks": [
        {"agentId": target, "payload": {"message": f"look at {target}"}, **task}
        for target in targets]})


EXECUTE = ToolCall("t2", "execute_scheduled_tasks", {})
STATUS = ToolCall("t3", "get_queue_status", {})


async def completed(store: MemoryEventStore, agent: str = "btc") -> None:
    """Wait for a run of ``agent`` to complete."""
    record = await next_event(store, "RunCompleted")
    while record.stream != agent:
        record = await next_event(store, "RunCompleted", record.position)


async def desk(btc: ScriptedLLM, **callees: list[Step]
               ) -> tuple[Engine, MemoryEventStore, FakeClock, dict[str, ScriptedLLM]]:
    clock, store = FakeClock(), MemoryEventStore()
    clients = {"btc": btc, **{name: ScriptedLLM(*steps) for name, steps in callees.items()}}
    reasoners = {name: LLMReasoner(client) for name, client in clients.items()}
    configs = {name: AgentConfig(mode=Mode.FOLLOWUP) for name in callees}
    configs["btc"] = AgentConfig(mode=Mode.FOLLOWUP, tools=TOOLS)
    engine = Engine(store, configs, clock=clock, reasoners=reasoners.__getitem__,
                    gates={"claude": ProviderGate(store, "claude", GateLimits(), clock)},
                    agent_gates={name: "claude" for name in configs})
    await engine.start()
    return engine, store, clock, clients


async def test_a_run_sends_its_scheduled_tasks_and_reads_every_answer_in_one_tool_result(
) -> None:
    btc = ScriptedLLM(calling(schedule("eth", "sol"), STATUS, EXECUTE), answer("no_trade"))
    engine, store, _, _ = await desk(btc, eth=[answer("no_trade", reason="eth calm")],
                                     sol=[answer("no_trade", reason="sol calm")])
    await engine.submit(request("btc"))
    await completed(store)
    scheduled, status, executed = btc.calls[1][2].tool_results
    assert "2 task(s) scheduled" in scheduled.content and not scheduled.is_error
    # (read once the step was decided: the tasks went out with execute_scheduled_tasks)
    assert [t["agentId"] for t in json.loads(status.content)["sent"]] == ["eth", "sol"]
    results = json.loads(executed.content)
    assert [(r["target"], r["status"]) for r in results] == [("eth", "returned"),
                                                             ("sol", "returned")]
    assert not executed.is_error
    types = [r.type for r in await store.read_stream("btc")]
    for name in ("TasksScheduled", "CallBatchOpened", "TasksFinished", "RunCompleted"):
        assert name in types
    assert types.index("TasksFinished") < types.index("RunCompleted")
    assert "CallResultsReady" not in types  # the answers went to the tool, not the queue
    await engine.flush()
    log = await log_of(store)
    assert verify(log) is None
    said = [s.text for g in story(e for e in log if e.stream == "btc") for s in g.decisions]
    assert "btc-r1: 2 task(s) scheduled by t1 (for eth, sol)" in said
    assert "tasks btc-r1-s1 all ended: eth returned, sol returned" in said
    await engine.stop()


async def test_a_stop_while_the_run_waits_for_its_tasks_withdraws_them_at_their_targets(
        caplog: pytest.LogCaptureFixture) -> None:
    never: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    btc = ScriptedLLM(calling(schedule("eth"), EXECUTE))
    engine, store, _, clients = await desk(btc, eth=[never])
    await engine.submit(request("btc"))
    await clients["eth"].call_count(1)  # eth is working on btc's task
    ack = await engine.submit(control("btc", "emergency_stop"))
    assert ack.effect is not None and ack.effect.to_state.value == "HALTED"
    withdrawn = await next_event(store, "CallWithdrawn")
    assert withdrawn.stream == "eth"
    await next_event(store, "RunAborted", withdrawn.position)  # eth's run served it alone
    ended = json.loads((await next_event(store, "CallEnded")).data)
    assert ended["result"]["status"] == "cancelled" and ended["withdraw"]
    returned = [json.loads(r.data)["call_id"] for r in await store.read_stream("btc")
                if r.type == "ToolReturned"]
    assert returned == ["t1"]  # execute_scheduled_tasks was cut off with its run
    await engine.flush()
    log = await log_of(store)
    assert verify(log) is None
    assert any("tool calls cut off: execute_scheduled_tasks (t2)" in said.text
               for group in story(e for e in log if e.stream == "btc")
               for said in group.decisions)
    await engine.stop()
    # (the withdrawal's ack once failed: a CallWithdrawn was no decision an ack knew)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_task_that_times_out_is_a_result_the_run_reads_and_goes_on_from() -> None:
    never: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    btc = ScriptedLLM(calling(schedule("eth", timeoutMs=5_000), EXECUTE), answer("no_trade"))
    engine, store, clock, clients = await desk(btc, eth=[never])
    await engine.submit(request("btc"))
    await clients["eth"].call_count(1)
    await next_event(store, "AgentCallDispatched")
    clock.advance(5_000)
    await completed(store)
    executed = btc.calls[1][2].tool_results[1]
    assert [r["status"] for r in json.loads(executed.content)] == ["timed_out"]
    assert executed.is_error  # no task returned
    await engine.flush()
    assert verify(await log_of(store)) is None
    await engine.stop()
