"""A risk-reducing control that cannot be stored (the log refuses writes) is held by the
gateway and stored before anything else of its agent once the log can be written: the run it
stopped is not started again meanwhile, and re-sending it is answered as a repeat. Controls
that would act later than asked (resume) are not held."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.engine import Engine
from gateway.errors import StorageFailed
from lanes import AgentConfig, verify
from lanes.events import RequestReceived, RunStarted
from store import Append, MemoryEventStore, RecordedEvent, WriteFailed
from tests.gateway.support import ManualReasoner, control, log_of, next_event, request


class Refusing:
    """A store that refuses every append while ``refusing`` is set, as a locked log does."""

    def __init__(self) -> None:
        self.inner = MemoryEventStore()
        self.refusing = False
        self.refused = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        if not self.refusing:
            return self.inner.append(append)
        self.refused += 1
        future: asyncio.Future[list[RecordedEvent]] = asyncio.get_running_loop().create_future()
        # Failed later, as a real commit fails: never already done when handed back.
        future.get_loop().call_soon(future.set_exception, WriteFailed(
            "the batch", "the event log is locked by another process"))
        return future


@pytest.fixture
async def running() -> tuple[Engine, Refusing, ManualReasoner]:
    store = Refusing()
    reasoner = ManualReasoner()
    engine = Engine(store, {"btc": AgentConfig(), "eth": AgentConfig()},  # type: ignore[arg-type]
                    reasoners=lambda _: reasoner)
    await engine.start()
    return engine, store, reasoner


async def test_an_emergency_stop_that_could_not_be_stored_is_stored_first_once_it_can_be(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    engine, store, reasoner = running
    await engine.submit(request("btc"))
    run = await reasoner.started()
    store.refusing = True
    stop = control("btc", "emergency_stop")
    with pytest.raises(StorageFailed, match="holds it") as refused:
        await engine.submit(stop)
    assert refused.value.held and refused.value.code == "storage_failed"
    assert "locked by another process" in str(refused.value)
    assert reasoner.results[run.run_id].cancelled()  # in force at once: the run is stopped
    # Still refused: an operator sending it again (or another stop) is told the same.
    with pytest.raises(StorageFailed, match="holds it"):
        await engine.submit(stop)
    refused_while_down = store.refused

    store.refusing = False  # the lock is gone: the held stop is stored by the gateway itself
    received = await next_event(store.inner, "RequestReceived")
    after = received.position
    applied = await next_event(store.inner, "ControlApplied", after=after)
    assert json.loads(applied.data)["request_id"] == stop.request_id
    await engine.flush()
    assert store.refused >= refused_while_down
    assert engine.status("btc").trading.value == "HALTED"
    log = await log_of(store.inner)
    stops = [e for e in log if isinstance(e.event, RequestReceived)
             and e.event.request.request_id == stop.request_id]
    assert len(stops) == 1
    # The run it cut off was never started again.
    assert [e for e in log if isinstance(e.event, RunStarted)][1:] == []
    assert len(reasoner.results) == 1
    again = await engine.submit(stop)
    assert again.repeated and again.decision == "accepted"
    assert verify(log) is None
    await engine.stop()


async def test_a_resume_that_could_not_be_stored_is_not_held(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    engine, store, _ = running
    await engine.submit(control("eth", "pause"))
    store.refusing = True
    resume = control("eth", "resume")
    with pytest.raises(StorageFailed, match="retry with the same requestId") as refused:
        await engine.submit(resume)
    assert not refused.value.held
    store.refusing = False
    ack = await engine.submit(request("eth"))  # the agent is back once it is rebuilt...
    assert ack.decision == "accepted"
    await engine.flush()
    log = await log_of(store.inner)
    assert resume.request_id not in {e.event.request.request_id for e in log
                                     if isinstance(e.event, RequestReceived)}
    assert engine.status("eth").trading.value == "REDUCING"  # ... and still paused
    await engine.stop()


async def test_a_held_stop_in_a_batch_is_held_too(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    engine, store, reasoner = running
    await engine.submit(request("btc"))
    await reasoner.started()
    store.refusing = True
    stop, other = control("btc", "emergency_stop"), request("eth")
    answers = await engine.submit_many([other, stop])
    assert isinstance(answers[1], StorageFailed) and answers[1].held
    assert isinstance(answers[0], StorageFailed) and not answers[0].held
    store.refusing = False
    await next_event(store.inner, "ControlApplied")
    await engine.flush()
    assert engine.status("btc").trading.value == "HALTED"
    await engine.stop()
