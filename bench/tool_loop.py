"""The tool loop's overhead per step: from one model call to the next, with the fake provider
answering at once (0 latency), through the real SDK client, the provider gate, the engine
and a SQLite log with ``synchronous=FULL``.

One agent with tools runs ``runs`` runs one after another; each run makes ``steps`` model
calls that each ask for one ``positions`` call, then a final answer. The same is measured
for runs that answer at once (tools offered, none called: one model call). A step's cost is
the difference of the two run times divided by ``steps``: a model call (the gate's slot, the
SDK's HTTP call to the fake), recording it, running the tool and recording its result; what
every run pays once (its start, its end, their commits) falls out.

    uv run python -m bench.tool_loop [--runs N] [--steps N] [--kind anthropic|openai]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, run
from gateway.base.clock import SystemClock
from gateway.base.process import run_on
from gateway.llm.fake_provider import (
    FakeProviderConfig,
    create_fake_provider,
    scripted,
    serving,
)
from gateway.llm.port import LLMClient
from gateway.llm.providers import AnthropicClient, OpenAIClient
from gateway.llm.reasoner import LLMReasoner
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from lanes import AgentConfig, AgentRequest, parse_request
from lanes.gate.events import GateLimits
from store import SqliteEventStore

FINAL = '{"decision": "no_trade", "reason": "bench"}'


def _request(n: int) -> AgentRequest:
    return parse_request({"requestId": f"b{n}", "createdAt": "2026-11-28T00:00:00Z",
                          "agentId": "desk", "kind": "user_control",
                          "payload": {"message": "look"}})


async def _per_run(db: Path, runs: int, steps: int, kind: str) -> float:
    """Seconds per run over ``runs`` runs of ``steps`` tool steps and a final answer."""
    reply = scripted([[("positions", {})]] * steps, lambda _: FINAL)
    provider = create_fake_provider(FakeProviderConfig(reply=reply))
    async with serving(provider) as url:
        client: LLMClient = (
            AnthropicClient("bench", api_key="bench-key", base_url=url, timeout_s=10)
            if kind == "anthropic" else
            OpenAIClient("bench", api_key="bench-key", base_url=f"{url}/v1", timeout_s=10))
        store = SqliteEventStore(db)
        gate = ProviderGate(store, "llm", GateLimits(), clock=SystemClock())
        config = AgentConfig(tools=("positions",), max_steps=steps + 1)
        reasoner = LLMReasoner(client, max_tokens=256, max_turns=1)
        engine = Engine(store, {"desk": config}, reasoners=lambda _: reasoner,
                        gates={"llm": gate}, agent_gates={"desk": "llm"})
        await engine.start()
        done: asyncio.Queue[Any] = asyncio.Queue()

        async def watch() -> None:
            async for record in store.follow(await store.last_position()):
                if record.type in ("RunCompleted", "RunFailed"):
                    await done.put(record.type)

        watcher = asyncio.create_task(watch())
        start = time.perf_counter()
        for n in range(runs):
            await engine.submit(_request(n))
            assert await asyncio.wait_for(done.get(), 30) == "RunCompleted"
        elapsed = time.perf_counter() - start
        watcher.cancel()
        await engine.stop()
        await client.close()
    return elapsed / runs


def measure(runs: int = 40, steps: int = 4, kind: str = "anthropic") -> list[Figure]:
    """A run of ``steps`` tool steps against a run that answers at once, same path."""
    with tempfile.TemporaryDirectory() as tmp:
        at_once = run_on(_per_run(Path(tmp, "once.db"), runs, 0, kind), "auto")
        looped = run_on(_per_run(Path(tmp, "tools.db"), runs, steps, kind), "auto")
    return [
        Figure(f"a run that answers at once ({kind} SDK, fake provider at 0 latency)",
               at_once * 1000, "ms per run"),
        Figure(f"a run of {steps} tool steps (one positions call each) and an answer",
               looped * 1000, "ms per run"),
        Figure("one step: model call to the next model call (the call, recording it, the "
               "tool, recording its result)", (looped - at_once) / steps * 1000, "ms per step"),
    ]


if __name__ == "__main__":
    run(measure, {"kind": ("anthropic", "openai")}, runs=40, steps=4)
