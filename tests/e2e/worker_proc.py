"""A worker in a process of its own, for the kill -9 test: it does one step of each run
(a tool call), says so on stdout, then hangs until it is killed.

    python -m tests.e2e.worker_proc URL TOKEN AGENT
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from gateway.client import Worker, WorkerRun


async def main(url: str, token: str, agent: str) -> None:
    worker = Worker(url, token, reconnect=False)

    @worker.agent(agent)
    async def hang(run: WorkerRun) -> dict[str, Any]:
        await run.slot(input_tokens=300, output_tokens=50)
        await run.step(tool_calls=[{"id": "k1", "name": "positions",
                                    "arguments": {}}],
                       input_tokens=300, output_tokens=50, stop_reason="tool_use")
        print(f"stepped {run.run_id}", flush=True)
        await asyncio.Event().wait()  # until killed
        return {"outcome": "no_trade"}

    task = asyncio.create_task(worker.run())
    await worker.ready.wait()
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
