"""The worker hub's part in a cluster (`gateway.runtime.workers.WorkerHub`): a run with no
worker connected waits for one up to the hub's ``wait_ms`` (a member that just joined is
connected to within a renewal) and fails after it; the workers connected are told when the
cluster's members change."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gateway.base.clock import FakeClock, SystemClock
from gateway.llm.port import ToolResult
from gateway.llm.reasoner import RunContext, RunResult
from gateway.runtime.workers import (
    NoWorker,
    ResultGiven,
    WorkerHub,
    WorkerJob,
    WorkerLostError,
    WorkerReasoner,
)
from lanes.events import Outcome
from lanes.requests import AgentRequest
from tests.gateway.support import TIMEOUT, request, turns


class Link:
    """A worker that answers every run at once, and keeps what it was told."""

    def __init__(self, hub: WorkerHub) -> None:
        self.hub = hub
        self.name = "fake"
        self.last_seen = 0
        self.told: list[list[str]] = []

    def serves(self, agent_id: str) -> bool:
        return True

    def dispatch(self, job: WorkerJob) -> None:
        job.offer(ResultGiven(RunResult(outcome=Outcome.NO_TRADE, answer="done")))

    def granted(self, run_id: str) -> None:
        raise AssertionError("no slot is asked")

    def answered(self, run_id: str, step: int, results: Sequence[ToolResult],
                 steers: Sequence[AgentRequest]) -> None:
        raise AssertionError("no step is made")

    def cancel(self, run_id: str, reason: str) -> None:
        raise AssertionError("nothing is cancelled")

    def members(self, urls: Sequence[str]) -> None:
        self.told.append(list(urls))

    def drop(self) -> None:
        raise AssertionError("never silent")


def context(run_id: str = "desk-r1") -> RunContext:
    return RunContext(agent_id="desk", run_id=run_id, requests=[request("desk")],
                      summary=None, depth=0, clock=SystemClock(),
                      report_steerable=lambda _: None)


async def test_a_run_with_no_worker_waits_for_one_up_to_the_hubs_wait() -> None:
    hub = WorkerHub(wait_ms=int(TIMEOUT * 1000))
    reasoner = WorkerReasoner(hub, "desk")
    run = asyncio.ensure_future(reasoner.run(context()))
    await asyncio.sleep(0)  # (it is waiting: no worker yet)
    assert not run.done()
    hub.attach(Link(hub))
    result = await asyncio.wait_for(run, TIMEOUT)
    assert result.answer == "done"


async def test_a_run_with_no_worker_fails_once_the_wait_is_over() -> None:
    for wait_ms in (0, 30):
        reasoner = WorkerReasoner(WorkerHub(wait_ms=wait_ms), "desk")
        with pytest.raises(NoWorker):
            await asyncio.wait_for(reasoner.run(context()), TIMEOUT)


async def test_the_wait_for_a_worker_counts_the_clocks_time() -> None:
    clock = FakeClock()
    reasoner = WorkerReasoner(WorkerHub(wait_ms=600_000, clock=clock), "desk")
    run = asyncio.ensure_future(reasoner.run(context()))
    await turns()
    clock.advance(599_999)
    await turns()
    assert not run.done()  # (real time passes, the clock's does not)
    clock.advance(1)
    with pytest.raises(NoWorker):
        await asyncio.wait_for(run, TIMEOUT)


HEARTBEAT_MS = 600_000
"""Ten minutes: the loop's time never reaches a heartbeat in these tests, the clock's does."""


class Silent(Link):
    """A worker that takes a run and then sends nothing, not even a heartbeat."""

    def __init__(self, hub: WorkerHub) -> None:
        super().__init__(hub)
        self.dropped = False
        self.cancelled = ""

    def dispatch(self, job: WorkerJob) -> None:
        pass

    def cancel(self, run_id: str, reason: str) -> None:
        self.cancelled = reason

    def drop(self) -> None:
        self.dropped = True


async def test_a_silent_worker_is_lost_after_its_missed_heartbeats_of_the_clocks_time() -> None:
    clock = FakeClock()
    hub = WorkerHub(clock=clock)
    reasoner = WorkerReasoner(hub, "desk", heartbeat_ms=HEARTBEAT_MS, missed_heartbeats=3)
    worker = Silent(hub)
    worker.last_seen = clock.monotonic_ms()
    hub.attach(worker)
    run = asyncio.ensure_future(reasoner.run(context()))
    for _ in range(3):
        await turns()
        assert not run.done() and not worker.dropped  # (real time passes, the clock's not)
        clock.advance(HEARTBEAT_MS - 1)
        await turns()
        assert not run.done() and not worker.dropped
        clock.advance(1)  # a heartbeat's time: silent for 1, 2, then 3 of them
    with pytest.raises(WorkerLostError, match="missed its heartbeats"):
        await asyncio.wait_for(run, TIMEOUT)
    assert worker.dropped


async def test_a_worker_heard_from_within_its_heartbeats_is_kept() -> None:
    clock = FakeClock()
    hub = WorkerHub(clock=clock)
    reasoner = WorkerReasoner(hub, "desk", heartbeat_ms=HEARTBEAT_MS, missed_heartbeats=3)
    worker = Silent(hub)
    hub.attach(worker)
    run = asyncio.ensure_future(reasoner.run(context()))
    for _ in range(10):  # ten heartbeats' time, a frame heard at each
        await turns()
        clock.advance(HEARTBEAT_MS)
        worker.last_seen = clock.monotonic_ms()
    await turns()
    assert not run.done() and not worker.dropped
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert worker.cancelled == "aborted"


def test_the_workers_are_told_when_the_members_change_and_only_then() -> None:
    hub = WorkerHub()
    link = Link(hub)
    hub.attach(link)
    hub.cluster("http://a", ["http://b", "http://a"])
    hub.cluster("http://a", ["http://a", "http://b"])
    hub.cluster("http://a", ["http://a"])
    assert link.told == [["http://a", "http://b"], ["http://a"]]
    assert (hub.member, hub.members) == ("http://a", ["http://a"])
