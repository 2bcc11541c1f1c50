"""A worker (bring your own agent) that runs a model through the OpenAI SDK, against any
OpenAI-compatible endpoint, with the tools the gateway offers the agent (docs/workers.md).

The gateway's config names the agent a worker agent, with one tool:

    [[agents]]
    id = "agent_btc_5m"
    tools = ["market_snapshot"]
    [agents.reasoner]
    kind = "worker"
    provider = "openai-desk"      # its model calls take slots of this gate

    [[tokens]]
    name = "btc-worker"
    token_env = "BTC_WORKER_TOKEN"
    role = "worker"
    agents = ["agent_btc_5m"]

Then, with the gateway serving:

    GATEWAY_URL=ws://127.0.0.1:8000 GATEWAY_TOKEN=... AGENT_ID=agent_btc_5m \\
    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=... MODEL=llama3.1 \\
        uv run python examples/worker_openai.py

Each model call first takes a slot of the agent's provider gate (`run.slot`), then is
reported as a step (`run.step`): the gateway records it, runs the tools it asked for and
answers their results (and any requests steered into the run), which go back to the model.
The final answer is a JSON decision, as the gateway's own reasoners ask for.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from openai import AsyncOpenAI

from gateway.client import Worker, WorkerRun

SYSTEM = """You are a trading agent. You get requests as JSON lines. Use your tools to look \
at the market when it helps. Answer with one JSON object and nothing else: \
{"decision": "trade" or "no_trade", "orders": [{"symbol": "BTCUSD", "side": "buy", \
"qty": 0.1}], "reason": "one sentence"}"""


def worker(url: str, token: str, agent_id: str, client: AsyncOpenAI, model: str) -> Worker:
    """A `Worker` doing ``agent_id``'s runs with ``model`` behind ``client``."""
    gateway = Worker(url, token)

    @gateway.agent(agent_id)
    async def run(job: WorkerRun) -> dict[str, Any]:
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.input_schema}}
            for t in job.tools]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "\n".join(
                r.model_dump_json(include={"request_id", "kind", "payload"})
                for r in job.requests)}]
        used = [0, 0]
        for _ in range(job.max_steps):
            await job.slot(input_tokens=sum(len(str(m)) for m in messages) // 4,
                           output_tokens=512)
            response = await client.chat.completions.create(
                model=model, messages=messages, tools=tools or None,  # type: ignore[arg-type]
                max_tokens=512)
            message = response.choices[0].message
            usage = response.usage
            input_tokens = usage.prompt_tokens if usage else 0
            output_tokens = usage.completion_tokens if usage else 0
            used[0] += input_tokens
            used[1] += output_tokens
            calls = [{"id": c.id, "name": c.function.name,
                      "arguments": json.loads(c.function.arguments or "{}")}
                     for c in message.tool_calls or () if c.type == "function"]
            answer = await job.step(text=message.content or "", tool_calls=calls,
                                    input_tokens=input_tokens, output_tokens=output_tokens,
                                    stop_reason=response.choices[0].finish_reason)
            if not calls and not answer.steers:
                return decision(message.content or "", used)
            messages.append(message.model_dump(exclude_none=True))
            messages += [{"role": "tool", "tool_call_id": r.call_id, "content": r.content}
                         for r in answer.results]
            if answer.steers:
                messages.append({"role": "user", "content": "\n".join(
                    r.model_dump_json(include={"request_id", "kind", "payload"})
                    for r in answer.steers)})
        raise RuntimeError(f"no final answer in {job.max_steps} model calls")

    return gateway


def decision(text: str, used: list[int]) -> dict[str, Any]:
    """The run's result from the model's final answer (its outermost JSON object)."""
    answer = json.loads(text[text.find("{"):text.rfind("}") + 1])
    trade = answer.get("decision") == "trade"
    return {"outcome": "trade" if trade else "no_trade",
            "orders": answer.get("orders", []) if trade else [],
            "answer": str(answer.get("reason", ""))[:20_000],
            "usage": {"inputTokens": used[0], "outputTokens": used[1]}}


async def main() -> None:
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"],
                         api_key=os.environ.get("OPENAI_API_KEY", "none"))
    await worker(os.environ.get("GATEWAY_URL", "ws://127.0.0.1:8000"),
                 os.environ["GATEWAY_TOKEN"], os.environ["AGENT_ID"], client,
                 os.environ.get("MODEL", "gpt-4o-mini")).run()


if __name__ == "__main__":
    asyncio.run(main())
