"""A risk-reducing control that cannot be stored (the log refuses writes) is held by the
gateway and stored before anything else of its agent once the log can be written: the run it
stopped is not started again meanwhile, and re-sending it is answered as a repeat. Controls
that would act later than asked (resume) are not held."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from gateway.base.clock import SystemClock
from gateway.errors import StorageFailed, Superseded
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from gateway.runtime.intake import take_all
from lanes import AgentConfig, AgentRequest, verify
from lanes.events import RequestReceived, RunStarted
from lanes.gate.events import GateLimits
from store import Append, MemoryEventStore, RecordedEvent, WriteFailed
from tests.gateway.support import ManualReasoner, control, log_of, next_event, request


class Refusing:
    """A store that refuses every append while ``refusing`` is set, as a locked log does."""

    def __init__(self, seed: Sequence[RecordedEvent] = (), refusing: bool = False) -> None:
        self.inner = MemoryEventStore()
        self.seed = seed
        self.refusing = refusing
        self.refused = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def open(self) -> None:
        """Open, holding the ``seed`` log."""
        await self.inner.open()
        if self.seed:
            await self.inner.restore(self.seed)

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
    before = await store.inner.last_position()

    store.refusing = False  # the lock is gone: the held stop is stored by the gateway itself
    applied = await next_event(store.inner, "ControlApplied", after=before)
    assert json.loads(applied.data)["request_id"] == stop.request_id
    await engine.flush()
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


async def refuse_a_resume(engine: Engine, store: Refusing,
                          agent: str) -> tuple[AgentRequest, StorageFailed]:
    """Pause ``agent``, then make the log refuse writes and send a resume: it is refused,
    and not held (the store stays refusing). The resume, and its refusal."""
    await engine.submit(control(agent, "pause"))
    store.refusing = True
    resume = control(agent, "resume")
    with pytest.raises(StorageFailed) as refused:
        await engine.submit(resume)
    assert not refused.value.held
    return resume, refused.value


async def test_a_stop_decided_while_an_earlier_commit_is_under_way_is_held(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    # The earlier commit lands after the stop was decided: it does not store the stop.
    engine, store, _ = running
    [earlier] = engine.take([request("btc")])
    engine.intake.end_turn()  # (appended now, not at the end of the loop's turn)
    store.refusing = True  # (the earlier append is in the store already)
    stop = control("btc", "emergency_stop")
    with pytest.raises(StorageFailed, match="holds it") as refused:
        await engine.submit(stop)
    assert refused.value.held
    assert (await earlier).decision == "accepted"
    before = await store.inner.last_position()
    store.refusing = False  # held still: stored by the gateway itself now
    applied = await next_event(store.inner, "ControlApplied", after=before)
    assert json.loads(applied.data)["request_id"] == stop.request_id
    await engine.stop()


async def test_a_resume_that_could_not_be_stored_is_not_held(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    engine, store, _ = running
    resume, refused = await refuse_a_resume(engine, store, "eth")
    assert "retry with the same requestId" in str(refused)
    store.refusing = False
    await engine.flush()  # the agent is rebuilt from the log...
    ack = await engine.submit(request("eth"))
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
    answers = await take_all(engine, [other, stop])
    assert isinstance(answers[1], StorageFailed) and answers[1].held
    assert isinstance(answers[0], StorageFailed) and not answers[0].held
    store.refusing = False
    await next_event(store.inner, "ControlApplied")
    await engine.flush()
    assert engine.status("btc").trading.value == "HALTED"
    await engine.stop()


async def test_a_resume_refused_before_a_held_stop_is_not_applied_after_it(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    engine, store, _ = running
    resume, _ = await refuse_a_resume(engine, store, "btc")  # sent first, refused (not held)
    stop = control("btc", "emergency_stop")  # sent second, held
    with pytest.raises(StorageFailed, match="holds it"):
        await engine.submit(stop)
    before = await store.inner.last_position()
    store.refusing = False
    await next_event(store.inner, "ControlApplied", after=before)
    await engine.flush()
    # The client retries the refused resume as it was told to: it would undo the later stop.
    with pytest.raises(Superseded, match="Send a new resume") as refused:
        await engine.submit(resume)
    assert refused.value.code == "conflict"  # not retried by clients
    [answer] = await take_all(engine, [resume])
    assert isinstance(answer, Superseded)
    assert engine.status("btc").trading.value == "HALTED"
    # A new resume, sent after the stop, is an operator's decision: applied.
    assert (await engine.submit(control("btc", "resume"))).decision == "accepted"
    await engine.stop()


async def test_a_refused_resume_stored_on_retry_is_not_superseded_by_a_later_stop(
    running: tuple[Engine, Refusing, ManualReasoner],
) -> None:
    engine, store, _ = running
    resume, _ = await refuse_a_resume(engine, store, "btc")
    store.refusing = False
    await engine.flush()
    assert (await engine.submit(resume)).decision == "accepted"  # the retry goes in
    await engine.submit(control("btc", "emergency_stop"))
    again = await engine.submit(resume)  # a duplicate of a stored request: its first answer
    assert again.repeated
    await engine.stop()


async def test_config_and_limits_refused_at_start_are_applied_once_the_log_can_be_written(
) -> None:
    inner = MemoryEventStore()
    first = Engine(inner, {"btc": AgentConfig(cap=50)}, reasoners=lambda _: ManualReasoner())
    await first.start()
    await first.flush()
    log = await inner.read()
    await first.stop()
    store = Refusing(log, refusing=True)  # the same log, in a store that refuses writes
    gate = ProviderGate(store, "claude", GateLimits(requests_per_minute=60),  # type: ignore[arg-type]
                        clock=SystemClock())
    engine = Engine(store, {"btc": AgentConfig(cap=5)},  # type: ignore[arg-type]
                    reasoners=lambda _: ManualReasoner(), gates={"claude": gate},
                    agent_gates={"btc": "claude"})
    await asyncio.wait_for(engine.start(), 10)  # serves although nothing can be written
    before = await store.inner.last_position()
    store.refusing = False
    await next_event(store.inner, "ConfigChanged", after=before)
    await next_event(store.inner, "GateLimitsChanged", after=before)
    await engine.flush()
    await gate.flush()
    assert engine.state("btc").config.cap == 5
    assert gate.state.limits.requests_per_minute == 60
    await engine.stop()


async def test_a_gate_stopped_while_it_rebuilds_after_failed_appends_stops() -> None:
    store = Refusing()
    await store.inner.open()
    gate = ProviderGate(store, "claude", GateLimits(), clock=SystemClock())  # type: ignore[arg-type]
    await gate.start()
    store.refusing = True
    wants = [asyncio.create_task(gate.acquire("a", f"r{n}")) for n in range(2)]
    done, _ = await asyncio.wait(wants, timeout=10)
    assert len(done) == 2
    for want in wants:
        error = want.exception()
        assert isinstance(error, StorageFailed) and error.code == "storage_failed", error
    await asyncio.wait_for(gate.stop(), 5)
