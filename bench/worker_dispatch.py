"""Run dispatch to a worker and back, against the built-in simulated reasoner at the same
model latency.

One gateway (a real server on a loopback port, a SQLite log with ``synchronous=FULL``) with
two agents: ``sim``, a simulated reasoner whose one model call takes ``latency_ms``, and
``work``, a worker agent (``reasoner.kind = "worker"``) whose runs are done by an SDK
`gateway.client.Worker` over ``/ws/worker`` in this process: a slot of the gate, the same
``latency_ms`` of "model", a step, a result. Both take their slot from the same simulated
provider gate. ``runs`` runs one after another on each: from the request's submit to its
``RunCompleted`` committed. The difference is what a worker costs: the run frame out, the
slot and step frames in (the step recorded), the result back.

    uv run python -m bench.worker_dispatch [--runs N] [--latency_ms MS]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, run
from gateway.base.process import run_on
from gateway.client import Worker, WorkerRun
from gateway.config import parse_config
from gateway.edge.server import serving
from gateway.wiring import build_service
from lanes import AgentRequest, parse_request

TOKEN = "bench-worker-token-0001"
CONFIG = """
[server]
host = "127.0.0.1"
port = 0

[store]
synchronous = "FULL"

[[tokens]]
name = "bench-worker"
token = "{token}"
role = "worker"
agents = ["work"]

[[providers]]
name = "sim"
kind = "simulated"

[[agents]]
id = "sim"
mode = "queue"
cap = 10000
[agents.reasoner]
kind = "simulated"
provider = "sim"
latency_ms = [{latency}, {latency}]
turns = 1
steerable = false
trade_probability = 0.0

[[agents]]
id = "work"
mode = "queue"
cap = 10000
[agents.reasoner]
kind = "worker"
provider = "sim"
"""


def _request(agent: str, n: int) -> AgentRequest:
    return parse_request({"requestId": f"{agent}-{n}", "createdAt": "2026-11-28T00:00:00Z",
                          "agentId": agent, "kind": "user_control",
                          "payload": {"message": "look"}})


async def _latencies(db: Path, runs: int, latency_ms: int) -> dict[str, list[float]]:
    """Seconds from submit to RunCompleted of each run, per agent."""
    service = build_service(parse_config(CONFIG.format(token=TOKEN, latency=latency_ms)), db)
    out: dict[str, list[float]] = {"sim": [], "work": []}
    async with serving(service) as running:
        worker = Worker(running.url.replace("http://", "ws://"), TOKEN)

        @worker.agent("work")
        async def work(job: WorkerRun) -> dict[str, Any]:
            await job.slot(input_tokens=400, output_tokens=80)
            await asyncio.sleep(latency_ms / 1_000)  # the model call
            await job.step(text="no trade", input_tokens=400, output_tokens=80)
            return {"outcome": "no_trade", "usage": {"inputTokens": 400, "outputTokens": 80}}

        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 10)
        store = service.engine.store
        completed: dict[str, asyncio.Queue[None]] = {"sim": asyncio.Queue(),
                                                     "work": asyncio.Queue()}

        async def watch() -> None:
            async for record in store.follow(await store.last_position()):
                if record.type == "RunCompleted":
                    completed[record.stream].put_nowait(None)
                elif record.type == "RunFailed":
                    raise RuntimeError(f"a run failed: {record.data}")

        watcher = asyncio.create_task(watch())
        for n in range(runs):
            for agent in ("sim", "work"):  # interleaved: both see the same machine
                start = time.perf_counter()
                await service.engine.submit(_request(agent, n))
                await asyncio.wait_for(completed[agent].get(), 30)
                out[agent].append(time.perf_counter() - start)
        watcher.cancel()
        worker.stop()
        await task
    return out


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def measure(runs: int = 200, latency_ms: int = 20) -> list[Figure]:
    """p50 and p99 of a run on each reasoner, and the worker's cost at the median."""
    with tempfile.TemporaryDirectory() as tmp:
        times = run_on(_latencies(Path(tmp, "events.db"), runs, latency_ms), "auto")
    sim, work = times["sim"], times["work"]
    what = f"submit to RunCompleted, one {latency_ms} ms model call through the gate"
    return [
        Figure(f"simulated reasoner p50 ({what})", _p(sim, 50), "ms"),
        Figure("simulated reasoner p99", _p(sim, 99), "ms"),
        Figure(f"worker over /ws/worker p50 ({what})", _p(work, 50), "ms"),
        Figure("worker over /ws/worker p99", _p(work, 99), "ms"),
        Figure("a worker's cost at the median (worker p50 - simulated p50)",
               _p(work, 50) - _p(sim, 50), "ms per run"),
    ]


if __name__ == "__main__":
    run(measure, runs=200, latency_ms=20)
