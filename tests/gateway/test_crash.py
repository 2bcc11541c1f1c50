"""A real gateway process killed with SIGKILL loses nothing it acknowledged."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.runtime.engine import Engine
from lanes import replay, request_outcomes, verify
from lanes.events import (
    AbortReason,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestSummarized,
    RunAborted,
    RunSteered,
)
from store import SqliteEventStore
from tests.gateway.crash_worker import AGENTS
from tests.gateway.support import TIMEOUT, ManualReasoner, log_of

ROOT = Path(__file__).resolve().parents[2]
DECISION_OF = {
    RequestQueued: "accepted", RunSteered: "accepted", RequestDeduped: "deduped",
    RequestDropped: "dropped", RequestSummarized: "dropped",
}


async def run_and_kill(db: Path, prefix: str, acks_before_kill: int) -> list[dict[str, Any]]:
    """Start the worker, let it acknowledge some requests, then SIGKILL it mid-flight."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.gateway.crash_worker", str(db), prefix,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    acks: list[dict[str, Any]] = []
    try:
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), TIMEOUT * 3))
        assert ready == {"ready": True}
        while len(acks) < acks_before_kill:
            line = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
            assert line, "the worker exited early"
            acks.append(json.loads(line))
    finally:
        process.send_signal(signal.SIGKILL)
        rest, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
    # Lines already written before the kill are acknowledgements too.
    acks += [json.loads(line) for line in rest.decode().splitlines() if line.endswith("}")]
    assert process.returncode == -signal.SIGKILL
    return acks


@pytest.mark.slow
async def test_sigkill_loses_no_acknowledged_decision_and_restart_recovers(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    ledger: list[dict[str, Any]] = []
    for round_ in range(3):
        ledger += await run_and_kill(db, f"round{round_}", acks_before_kill=150 + 100 * round_)

        store = SqliteEventStore(db)
        await store.open()
        log = await log_of(store)
        await store.close()
        assert [e.position for e in log] == list(range(1, len(log) + 1))
        assert verify(log) is None
        by_position = {e.position: e for e in log}
        received = {e.event.request.request_id for e in log
                    if isinstance(e.event, RequestReceived)}
        for ack in ledger:
            assert ack["id"] in received, f"acknowledged {ack['id']} is not in the log"
            entry = by_position[ack["position"]]
            assert entry.stream == ack["agent"]
            assert getattr(entry.event, "request_id", None) == ack["id"]
            assert DECISION_OF[type(entry.event)] == ack["decision"]
        cut_off = [a for a, s in replay(log).items() if s.active is not None]

        # Restart: cut-off runs are recorded as aborted and their requests run again.
        engine = Engine(SqliteEventStore(db), AGENTS, clock=FakeClock(),
                        reasoners=ManualReasoner.per_agent())
        await engine.start()
        after = await log_of(engine.store)
        restarts = [e for e in after[len(log):] if isinstance(e.event, RunAborted)]
        assert sorted(e.stream for e in restarts) == sorted(cut_off)
        assert all(e.event.reason is AbortReason.RESTART and e.event.requeued  # type: ignore[union-attr]
                   for e in restarts)
        outcomes = request_outcomes(after)
        accepted = [a["id"] for a in ledger if a["decision"] == "accepted"]
        assert all(outcomes[i] != "aborted" for i in accepted if i in outcomes)
        states = replay(after)
        assert all(states[a] == engine.state(a) for a in engine.agent_ids)
        assert verify(after) is None
        await engine.stop()
