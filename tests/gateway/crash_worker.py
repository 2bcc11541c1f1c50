"""A gateway process for the crash test: submits requests forever, prints each ack.

Usage: python -m tests.gateway.crash_worker DB PREFIX. Each ack is one JSON line, printed
only after the engine answered (that is, after the commit).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from datetime import UTC, datetime

from gateway.llm.reasoner import SimulatedReasoner
from gateway.runtime.engine import Engine
from gateway.runtime.intake import take_all
from lanes import AgentConfig, Mode, parse_request
from store import SqliteEventStore

AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP, cap=20),
    "eth": AgentConfig(mode=Mode.COLLECT, debounce_ms=20, cap=20),
    "sol": AgentConfig(mode=Mode.STEER_BACKLOG, cap=20),
}


async def main(db: str, prefix: str) -> None:
    reasoner = SimulatedReasoner(latency_ms=(5, 40), seed=None)
    engine = Engine(SqliteEventStore(db), AGENTS, reasoners=lambda _: reasoner)
    await engine.start()
    print(json.dumps({"ready": True}), flush=True)
    ids = itertools.count()
    agents = itertools.cycle(AGENTS)
    while True:
        batch = []
        for _ in range(20):
            n = next(ids)
            batch.append(parse_request({
                "requestId": f"{prefix}-{n}", "createdAt": datetime.now(UTC).isoformat(),
                "agentId": next(agents), "kind": "hook_trigger", "dedupeKey": f"k{n % 50}",
            }))
        for request, ack in zip(batch, await take_all(engine, batch), strict=True):
            if isinstance(ack, Exception):
                continue
            line = {"id": request.request_id, "agent": request.agent_id,
                    "decision": ack.decision, "position": ack.position}
            sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
