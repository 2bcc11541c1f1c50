"""Drill-down and what-if from here on one long agent stream: what the panel's asks cost, and
how long they hold the event loop (where an emergency stop would wait).

    uv run python -m bench.drill [--events N]

One agent with ``N`` events (`bench.replay_speed.make_log`) in a SQLite file, served by a
gateway in this process. Over HTTP: the newest run in full and one 90% back (read back
through most of the stream), an order that is not there (the longest read: back through the
last 100,000 events), and what-if from the middle (after time travel there) and from the
start of the stream under another config (the simulation in a process of its own); a task
notes the longest the event loop
went without a turn during each.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import httpx2

from bench.common import Figure, run
from bench.replay_speed import _write, make_log
from bench.time_travel import AGENT, TOKEN, _stalls
from gateway.config import validate_config
from gateway.edge.server import serving
from gateway.wiring import build_service
from lanes.codec import encode
from lanes.events import RunStarted


def measure(events: int = 100_000) -> list[Figure]:
    """The figures (see the module)."""
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(_measure(Path(tmp) / "drill.db", events))


async def _measure(db: Path, events: int) -> list[Figure]:
    log = make_log(events, agents=1)
    await _write(db, [(e.position, e.stream, *encode(e.event)) for e in log])
    runs = [e.event.run_id for e in log if isinstance(e.event, RunStarted)]
    last = log[-1].position
    config = validate_config({
        "server": {"host": "127.0.0.1", "port": 0}, "store": {"path": str(db)},
        "tokens": [{"name": "bench", "token": TOKEN, "role": "viewer"}],
        "agents": [{"id": AGENT, "mode": "followup"}]}, "<bench>")
    path = f"/api/agents/{AGENT}"
    asks = [
        ("the newest run in full (the first ask)", "GET", f"{path}/runs/{runs[-1]}", None, 200),
        ("the newest run in full again", "GET", f"{path}/runs/{runs[-1]}", None, 200),
        ("a run 90% back in full (read back through the stream)", "GET",
         f"{path}/runs/{runs[len(runs) // 10]}", None, 200),
        ("an order not in the log (read back 100,000 events)", "GET",
         f"{path}/orders/nope", None, 404),
        ("time travel to the middle first (GET /moment: the stream folded once)", "GET",
         f"{path}/moment?position={last // 2}", None, 200),
        ("what-if from the middle (half the stream re-run)", "POST", f"{path}/whatif",
         {"position": last // 2, "config": {"mode": "queue", "cap": 10}}, 200),
        ("what-if from the start (the whole stream re-run)", "POST", f"{path}/whatif",
         {"position": 1, "config": {"mode": "queue", "cap": 10}}, 200),
    ]
    figures = [Figure("one agent's stream", len(log), "events")]
    async with serving(build_service(config, db)) as running, \
            httpx2.AsyncClient(base_url=running.url, timeout=600,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
            _stalls() as stall:
        # (The gateway's own start-up work first: a snapshot of the long stream it folded.)
        (await http.get(path)).raise_for_status()
        await asyncio.sleep(3)
        stall()
        for name, method, url, body, status in asks:
            stall()
            began = time.perf_counter()
            answer = await http.request(method, url, json=body)
            took = (time.perf_counter() - began) * 1000
            assert answer.status_code == status, answer.text[:300]
            figures += [Figure(name, took, "ms"),
                        Figure("... longest event-loop stall", stall(), "ms", "< 50 ms")]
    return figures


if __name__ == "__main__":
    run(measure, events=100_000)
