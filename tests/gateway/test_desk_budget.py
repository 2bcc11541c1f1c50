"""The desk's budgets in the engine: usage summed over every agent; used up, every agent's
runs are held back (recorded in each stream, replayed exactly) until it frees; a restart
sums the usage kept in the agents' states again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.base.clock import FakeClock
from gateway.llm.reasoner import LLMReasoner
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode, verify
from lanes.config import Budgets
from store import EventStore, MemoryEventStore, SqliteEventStore
from tests.gateway.support import log_of, next_event, request
from tests.gateway.test_gate_engine import ScriptedLLM, answer

DESK = Budgets(max_input_tokens_per_hour=1_000)
COUNTED = AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(desk_counted=True))


def engine(store: EventStore, clock: FakeClock, client: ScriptedLLM) -> Engine:
    reasoner = LLMReasoner(client)
    return Engine(store, {"btc": COUNTED, "eth": COUNTED}, clock=clock,
                  reasoners=lambda _: reasoner, desk_budgets=DESK)


async def completed(store: EventStore, n: int) -> None:
    after = 0
    for _ in range(n):
        after = (await next_event(store, "RunCompleted", after)).position


async def test_a_desk_budget_used_up_holds_every_agents_runs_until_it_frees(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, store = FakeClock(), MemoryEventStore()
    client = ScriptedLLM(*(answer("no_trade") for _ in range(4)))  # 500 input tokens each
    gateway = engine(store, clock, client)
    await gateway.start()
    await gateway.submit(request("btc"))
    await completed(store, 1)
    assert gateway.desk.status(clock.now_ms())["budgets"][0]["fraction"] == 0.5
    await gateway.submit(request("eth"))  # another agent: the desk's use is both's
    await completed(store, 2)
    held = json.loads((await next_event(store, "DeskBudgetApplied")).data)
    assert "desk budget: input tokens 1,000/1,000 this hour" in held["detail"]
    await gateway.flush()
    for agent in ("btc", "eth"):
        types = [r.type for r in await store.read_stream(agent)]
        assert "DeskBudgetSpent" in types and "DeskBudgetApplied" in types
    ack = await gateway.submit(request("btc"))
    assert ack.decision == "accepted"
    suppressed = json.loads((await next_event(store, "RunsSuppressed")).data)
    assert suppressed["reason"] == "desk" and "input tokens" in suppressed["detail"]
    assert len(client.calls) == 2  # no run started
    assert any("desk budget max_input_tokens_per_hour at 100% this hour" in r.getMessage()
               for r in caplog.records)
    clock.advance(3_600_000)  # the first run's usage leaves the hour
    await next_event(store, "RunsResumed")
    await completed(store, 3)
    await gateway.flush()
    assert verify(await log_of(store)) is None
    await gateway.stop()


async def test_a_restart_sums_the_usage_kept_in_the_agents_states(tmp_path: Path) -> None:
    clock, store = FakeClock(), SqliteEventStore(tmp_path / "events.db")
    client = ScriptedLLM(answer("no_trade"))
    first = engine(store, clock, client)
    await first.start()
    await first.submit(request("btc"))
    await completed(store, 1)
    await first.stop()
    again = engine(SqliteEventStore(tmp_path / "events.db"), clock, ScriptedLLM())
    await again.start()
    status = again.desk.status(clock.now_ms())
    assert status["budgets"][0]["used"] == 500 and status["heldUntil"] is None
    await again.stop()
