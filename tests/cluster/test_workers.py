"""Workers in a cluster (several members on one PostgreSQL log, each a real server in this
process): a worker given one member's URL connects to every member, so the runs of its
agents reach it wherever they are owned; one that joins later is connected to when the
members learn of it; when a member stops, its agents' runs go to the worker at once through
their new owner."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx2

from bench.cluster import read_log
from gateway.base.tasks import spawn
from gateway.client import Worker, WorkerRun
from gateway.cluster.member import assign
from gateway.config import parse_config
from gateway.edge.server import Running, serving
from gateway.wiring import build_service
from tests.cluster.test_members import LEASE_MS, TIMEOUT, owned
from tests.gateway.support import until

OPS = "control-token-secret-1234"
WORKER = "worker-token-secret-0001"
AGENTS = tuple(f"w{n}" for n in range(16))
"""(Enough that each of two members is given some: all 16 to one has odds of 1 in 32,768.)"""
HEAD = f"""
[server]
host = "127.0.0.1"
port = 0

[cluster]
lease_ms = {LEASE_MS}

[[tokens]]
name = "ops"
token = "{OPS}"
role = "control"
"""
"""A member's config before its agents: a short lease, an operator's token (``OPS``)."""
CONFIG = HEAD + f"""
[[tokens]]
name = "desk-worker"
token = "{WORKER}"
role = "worker"
agents = {json.dumps(list(AGENTS))}
""" + "".join(f"""
[[agents]]
id = "{agent}"
mode = "followup"
[agents.reasoner]
kind = "worker"
heartbeat_ms = 200
missed_heartbeats = 50
""" for agent in AGENTS)


@contextlib.asynccontextmanager
async def member(db: str) -> AsyncIterator[Running]:
    async with serving(build_service(parse_config(CONFIG), db), "127.0.0.1", 0) as running:
        yield running


async def settled(members: list[Running], agents: Sequence[str] = AGENTS) -> None:
    """Every one of ``agents`` owned by the member `assign` gives it."""
    async def done() -> bool:
        ids = {m.cluster.member: m for m in members if m.cluster is not None}
        wanted = assign(agents, sorted(ids))
        return all(owned(m) >= {a for a, w in wanted.items() if w == name}
                   for name, m in ids.items())
    await until(done, "every agent owned by its member", TIMEOUT)


async def connected(worker: Worker, members: list[Running]) -> None:
    """The worker connected to each of ``members`` for every agent."""
    async def done() -> bool:
        return worker.ready.is_set() and all(
            m.service.workers.connected(agent) for m in members for agent in AGENTS)
    await until(done, "the worker connected to every member", TIMEOUT)


@contextlib.asynccontextmanager
async def working(at: Running) -> AsyncIterator[tuple[Worker, list[str]]]:
    """A worker given ``at``'s URL, doing every agent's runs; the run ids it did."""
    worker = Worker(at.url.replace("http://", "ws://"), WORKER)
    done: list[str] = []

    async def answer(run: WorkerRun) -> dict[str, Any]:
        done.append(run.run_id)
        return {"outcome": "no_trade", "answer": f"{run.agent_id} by the worker"}
    for agent in AGENTS:
        worker.agent(agent)(answer)
    task = spawn(worker.run(), "worker")
    try:
        yield worker, done
    finally:
        worker.stop()
        await asyncio.wait_for(task, TIMEOUT)


async def ask(via: Running, agents: tuple[str, ...] | list[str], tag: str) -> None:
    """A message to each of ``agents``, sent to the member ``via`` (forwarded to owners)."""
    async with httpx2.AsyncClient(base_url=via.url, timeout=TIMEOUT,
                                 headers={"Authorization": f"Bearer {OPS}"}) as http:
        for agent in agents:
            answer = await http.post(f"/api/agents/{agent}/requests", json={
                "requestId": f"{tag}-{agent}", "createdAt": datetime.now(UTC).isoformat(),
                "agentId": agent, "kind": "user_control", "payload": {"message": "look"}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["decision"] == "accepted", answer.json()


async def completed(db: str, agents: tuple[str, ...] | list[str], count: int) -> None:
    """Each of ``agents`` has ``count`` runs completed, and none failed."""
    async def done() -> bool:
        records = await read_log(db)
        failed = [json.loads(r.data) for r in records if r.type == "RunFailed"]
        assert not failed, failed
        ends = [r.stream for r in records if r.type == "RunCompleted"]
        return all(ends.count(agent) >= count for agent in agents)
    await until(done, f"{count} runs of each agent completed", TIMEOUT)


async def test_a_worker_given_one_member_does_the_runs_of_every_member_and_of_one_that_joins(
        postgres_url: str) -> None:
    async with member(postgres_url) as one, member(postgres_url) as two:
        await settled([one, two])
        assert owned(two) & set(AGENTS) and owned(one) & set(AGENTS)
        async with working(one) as (worker, done):
            await connected(worker, [one, two])
            assert worker.members == [two.url.replace("http://", "ws://") + "/ws/worker"]
            await ask(one, AGENTS, "first")
            await completed(postgres_url, AGENTS, 1)
            assert len(done) == len(AGENTS)
            for _ in range(10):  # (a newcomer's id is random: it may be given no agent)
                async with member(postgres_url) as three:  # told of by the others
                    await settled([one, two, three])
                    await connected(worker, [one, two, three])
                    theirs = sorted(owned(three) & set(AGENTS))
                    if not theirs:
                        continue
                    await ask(two, theirs, "third")  # (two's leases may predate three)
                    await completed(postgres_url, theirs, 2)
                    break
            else:
                raise AssertionError("ten members joined and none was given an agent")

            async def left() -> bool:  # (the members who saw it leave told the worker)
                return worker.members == [two.url.replace("http://", "ws://") + "/ws/worker"]
            await until(left, "the worker to leave the member that left", TIMEOUT)


async def test_when_a_member_stops_its_agents_runs_go_to_the_worker_through_the_new_owner(
        postgres_url: str) -> None:
    async with member(postgres_url) as one, member(postgres_url) as two:
        await settled([one, two])
        moved = sorted(owned(two) & set(AGENTS))
        assert moved
        async with working(two) as (worker, done):  # given the member that stops
            await connected(worker, [one, two])
            await two.stop()
            await settled([one])
            await ask(one, moved, "after")
            await completed(postgres_url, moved, 1)
            assert sorted(run.rpartition("-r")[0] for run in done) == moved
