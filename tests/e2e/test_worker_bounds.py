"""Workers' bounds, over a real server and raw frames: a frame for a run given to another
worker is refused ``unknown_run`` and changes nothing; a result's orders and calls are
applied once, and a second result is refused and only recorded as discarded; a worker's
model calls take slots of the agent's provider gate, so the desk's limits hold for it; the
SDK sends ``failed`` for an exception of the agent's function and cancels the function on a
``cancel``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gateway.base.tasks import spawn
from gateway.client import Worker, WorkerRun
from lanes import verify
from lanes.events import OrderAccepted, RunFinished
from tests.e2e.test_workers import (
    TIMEOUT,
    W1,
    W2,
    gateway,
    raw_worker,
    receive,
    send,
    submit,
    types_of,
    ws_url,
)
from tests.gateway.support import log_of, next_event, until

NOT_GIVEN: list[dict[str, Any]] = [  # each frame a worker sends, for desk-r1
    {"type": "slot", "runId": "desk-r1"},
    {"type": "step", "runId": "desk-r1", "step": 1},
    {"type": "failed", "runId": "desk-r1", "error": "not mine"},
    {"type": "result", "runId": "desk-r1", "outcome": "trade",
     "orders": [{"symbol": "BTCUSD", "side": "sell", "qty": 5}]}]


async def test_a_frame_for_a_run_of_another_worker_is_refused_and_a_second_result_too(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http), raw_worker(running, W1) as first, \
            raw_worker(running, W2) as second:
        engine = running.service.engine
        store = engine.store
        await submit(http, "look-1")
        assert (await receive(first, "run"))["runId"] == "desk-r1"  # (the earlier worker)
        await send(first, {"type": "slot", "runId": "desk-r1"})
        await receive(first, "slot_granted")
        before, state = await store.last_position(), engine.state("desk")
        for frame in NOT_GIVEN:  # the other worker, on a run it was not given, at any point
            await send(second, {**frame, "id": "x"})
            refused = await receive(second)
            assert (refused["code"], refused["id"]) == ("unknown_run", "x"), refused
        assert await store.last_position() == before and engine.state("desk") is state

        await send(first, {"type": "step", "runId": "desk-r1", "step": 1, "text": "buy"})
        await receive(first, "tool_results")
        await send(first, {"type": "result", "runId": "desk-r1", "outcome": "trade",
                           "answer": "bought",
                           "orders": [{"symbol": "BTCUSD", "side": "buy", "qty": 1}],
                           "calls": [{"agentId": "plain", "payload": {"message": "hedge?"}}]})
        finished = await next_event(store, "RunCompleted")
        await next_event(store, "CallResultsReady", finished.position)  # (plain answered)
        done = engine.state("desk")
        await send(first, {"type": "result", "runId": "desk-r1", "outcome": "trade",
                           "orders": [{"symbol": "BTCUSD", "side": "buy", "qty": 9}],
                           "id": "again"})
        again = await receive(first, "error")  # (a run of the call's result came first)
        assert (again["code"], again["id"]) == ("run_ended", "again"), again
        ignored = await next_event(store, "RunResultIgnored", finished.position)
        entries = await log_of(store)
        assert engine.state("desk").orders == done.orders
        intents = [(e.position, e.event) for e in entries if isinstance(e.event, RunFinished)
                   and e.event.run_id == "desk-r1"]
        assert [[o.qty for o in event.orders] for _, event in intents] == [[1], [9]]
        assert intents[1][0] < ignored.position  # (the 9: recorded, then discarded)
        placed = [e.event for e in entries if isinstance(e.event, OrderAccepted)]
        assert [(o.run_id, o.intent.qty) for o in placed if o.run_id.startswith("desk")] \
            == [("desk-r1", 1)], placed
        types = types_of(entries)
        assert types.count("AgentCallDispatched") == 1 and types.count("CallEnded") == 1, types
        assert verify(entries) is None


GATE = "\n[providers.limits]\nmax_concurrent = 1\n"


async def test_a_workers_slot_is_one_of_the_providers_gate_and_holds_the_desks_limit(
        tmp_path: Path) -> None:
    async with gateway(tmp_path, limits=GATE, plain_provider="sim") as (running, http), \
            raw_worker(running) as ws:
        store = running.service.engine.store
        await submit(http, "look-1")
        await receive(ws, "run")
        await send(ws, {"type": "slot", "runId": "desk-r1", "inputTokens": 100})
        await receive(ws, "slot_granted")  # the gate's one slot: the worker's
        await submit(http, "plain-1", agent="plain")
        queued = await next_event(store, "SlotQueued")
        while json.loads(queued.data)["agent_id"] != "plain":  # plain's model call waits
            queued = await next_event(store, "SlotQueued", queued.position)
        assert running.service.engine.state("plain").active is not None
        assert not [r for r in await store.read(queued.position)
                    if r.type == "SlotGranted"]
        await send(ws, {"type": "step", "runId": "desk-r1", "step": 1, "text": "x",
                        "usage": {"inputTokens": 90, "outputTokens": 5}})
        released = await next_event(store, "SlotReleased", queued.position)
        granted = await next_event(store, "SlotGranted", released.position)
        assert json.loads(granted.data)["slot_id"] == json.loads(queued.data)["slot_id"]
        await receive(ws, "tool_results")
        await send(ws, {"type": "result", "runId": "desk-r1", "outcome": "no_trade"})
        done: list[Any] = []
        while len(done) < 2:
            done.append(await next_event(store, "RunCompleted",
                                         done[-1].position if done else queued.position))
        assert verify(await log_of(store)) is None


async def test_the_sdk_sends_failed_for_an_exception_and_a_cancel_cancels_the_function(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as (running, http):
        store = running.service.engine.store
        worker = Worker(ws_url(running), W1)
        seen: list[str] = []

        @worker.agent("desk")
        async def desk(run: WorkerRun) -> dict[str, Any]:
            if run.run_id == "desk-r1":
                raise ValueError("the model is down")
            await run.slot(input_tokens=10)
            try:
                await asyncio.Event().wait()  # (a model call that takes its time)
            except asyncio.CancelledError:
                seen.append(f"{run.run_id} cancelled")
                raise
            return {"outcome": "no_trade"}

        task = spawn(worker.run(), "worker")
        try:
            await asyncio.wait_for(worker.ready.wait(), TIMEOUT)
            await submit(http, "look-1")
            failed = await next_event(store, "RunFailed")
            assert json.loads(failed.data)["error"].endswith("ValueError: the model is down")
            await submit(http, "look-2")
            granted = await next_event(store, "SlotGranted", failed.position)
            stopped = await http.post("/api/agents/desk/control",
                                      json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text

            async def cancelled() -> bool:
                return seen == ["desk-r2 cancelled"]
            await until(cancelled, "the run's function cancelled")
        finally:
            worker.stop()
            await task
        aborted = await next_event(store, "RunAborted", granted.position)
        assert json.loads(aborted.data)["run_id"] == "desk-r2"
        assert worker.errors == []  # (nothing of the cancelled run was sent, so none refused)
        assert verify(await log_of(store)) is None
