"""The runtime over a store: acks after commit, timers as inputs, runs as tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.errors import AgentUnavailable, StorageFailed, UnknownAgent
from gateway.runtime.acks import Ack
from gateway.runtime.engine import Engine
from gateway.runtime.intake import take_all
from lanes import AgentConfig, Budgets, Mode, Priority, replay, request_outcomes, verify
from lanes.codec import encode
from lanes.events import (
    AbortReason,
    AgentCallDispatched,
    CallAnswered,
    CallEnded,
    CallIntent,
    CallResult,
    CallStatus,
    ConfigApplied,
    OperatorAction,
    RequestReceived,
    RunAborted,
    RunStarted,
    TradingState,
)
from store import ConcurrencyError, MemoryEventStore, SqliteEventStore, StoreError
from store.port import Append, EventStore, NewEvent, RecordedEvent
from tests.gateway.support import (
    TIMEOUT,
    ManualReasoner,
    control,
    log_of,
    next_event,
    request,
)

AGENTS = {
    "btc": AgentConfig(mode=Mode.FOLLOWUP),
    "eth": AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000),
    "sol": AgentConfig(mode=Mode.STEER_BACKLOG, run_timeout_ms=30_000),
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reasoner() -> ManualReasoner:
    return ManualReasoner()


@pytest.fixture
async def engine(clock: FakeClock, reasoner: ManualReasoner) -> AsyncIterator[Engine]:
    engine = Engine(MemoryEventStore(clock=clock.now_ms), AGENTS, clock=clock,
                    reasoners=lambda _: reasoner)
    await engine.start()
    yield engine
    await engine.stop()


async def assert_log_is_the_state(engine: Engine) -> None:
    await engine.flush()
    log = await log_of(engine.store)
    states = replay(log)
    for agent_id in engine.agent_ids:
        assert states[agent_id] == engine.state(agent_id)
    assert verify(log) is None


async def test_submit_answers_after_the_commit_with_the_decision_and_position(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    ack = await engine.submit(request("btc", dedupeKey="k1"))
    assert ack.decision == "accepted"
    records = await engine.store.read(after=ack.position - 2, limit=3)
    assert [r.type for r in records] == ["RequestReceived", "RequestQueued", "RunStarted"]
    assert records[1].position == ack.position
    ctx = await reasoner.started()
    assert [r.request_id for r in ctx.requests] == [ack.request_id]
    await assert_log_is_the_state(engine)


async def test_every_decision_kind_reaches_the_client(engine: Engine) -> None:
    first = await engine.submit(request("btc", dedupeKey="same"))
    assert (await engine.submit(request("btc", dedupeKey="same"))).decision == "deduped"
    again = request("btc", dedupeKey="other")
    await engine.submit(again)
    repeated = await engine.submit(again)
    assert repeated.decision == "accepted" and repeated.repeated
    rejected = await engine.submit(control("btc", "cancel_order", orderId="x"))
    assert rejected.decision == "rejected" and "not open" in (rejected.reason or "")
    assert first.position < repeated.position
    with pytest.raises(UnknownAgent, match="unknown agent 'nope'"):
        await engine.submit(request("nope"))


async def test_emergency_stop_aborts_the_active_run_at_once_and_holds_runs_until_resume(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("btc"))
    ctx = await reasoner.started()
    await engine.submit(request("btc"))

    ack = await engine.submit(control("btc", "emergency_stop"))

    assert ack.decision == "accepted"
    assert reasoner.cancelled == [ctx.run_id]
    assert engine.state("btc").trading is TradingState.HALTED
    aborted = [e.event for e in await log_of(engine.store) if isinstance(e.event, RunAborted)]
    assert aborted == [RunAborted(run_id=ctx.run_id, reason=AbortReason.EMERGENCY_STOP,
                                  by=ack.request_id)]
    await engine.submit(request("btc"))
    assert engine.state("btc").active is None

    await engine.submit(control("btc", "resume"))
    assert (await reasoner.started()).run_id != ctx.run_id
    await assert_log_is_the_state(engine)


async def test_collect_window_closes_on_the_clock_and_runs_once(
    engine: Engine, clock: FakeClock, reasoner: ManualReasoner
) -> None:
    ids = [(await engine.submit(request("eth", dedupeKey=f"c{n}"))).request_id for n in range(3)]
    assert engine.state("eth").active is None
    clock.advance(999)
    await engine.flush()
    assert engine.state("eth").active is None
    clock.advance(1)
    ctx = await reasoner.started()
    assert [r.request_id for r in ctx.requests] == ids
    await assert_log_is_the_state(engine)


async def test_a_finished_run_feeds_back_and_the_next_one_starts(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("btc"))
    await engine.submit(request("btc"))
    first = await reasoner.started()
    reasoner.finish(first.run_id, "trade")
    second = await reasoner.started()
    assert second.run_id == "btc-r2"
    await assert_log_is_the_state(engine)
    assert engine.status("btc").counters.completed == 1


async def test_a_run_past_its_deadline_is_aborted_and_cancelled(
    engine: Engine, clock: FakeClock, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("sol"))
    ctx = await reasoner.started()
    clock.advance(30_000)
    await engine.flush()
    assert reasoner.cancelled == [ctx.run_id]
    assert engine.state("sol").active is None
    assert engine.status("sol").counters.aborts == 1


async def test_steers_reach_the_running_reasoner(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("sol"))
    ctx = await reasoner.started()
    ctx.set_steerable(True)
    steer = request("sol", dedupeKey="news")
    ack = await engine.submit(steer)
    assert ack.decision == "accepted"
    assert await asyncio.wait_for(ctx.next_steer(), TIMEOUT) == steer
    await assert_log_is_the_state(engine)


async def test_sub_agent_calls_go_out_as_agent_call_requests(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("btc"))
    parent = await reasoner.started()
    reasoner.finish(parent.run_id, calls=(CallIntent(agent_id="sol", payload={"q": "vol?"}),))
    child = await reasoner.started()
    assert child.agent_id == "sol"
    call = child.requests[0]
    assert call.kind.value == "agent_call" and call.request_id == f"{parent.run_id}-c1"
    assert call.payload == {"q": "vol?", "depth": 1, "parentRunId": parent.run_id}
    log = await log_of(engine.store)
    assert any(isinstance(e.event, AgentCallDispatched) for e in log)


class FailingOnce:
    """A store whose next append fails as a full disk would, then works again."""

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        self.fail_next = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        if self.fail_next:
            self.fail_next = False
            future: asyncio.Future[list[RecordedEvent]] = (
                asyncio.get_running_loop().create_future()
            )
            future.set_exception(StoreError("database or disk is full"))
            return future
        return self.inner.append(append)


async def test_a_failed_commit_is_not_acknowledged_and_the_agent_is_rebuilt_from_the_log(
    clock: FakeClock, reasoner: ManualReasoner
) -> None:
    store = FailingOnce(MemoryEventStore(clock=clock.now_ms))
    engine = Engine(store, AGENTS, clock=clock, reasoners=lambda _: reasoner)  # type: ignore[arg-type]
    await engine.start()
    await engine.submit(request("btc"))
    await reasoner.started()
    store.fail_next = True
    lost = request("btc")
    with pytest.raises(StorageFailed, match="retry with the same requestId"):
        await engine.submit(lost)
    await engine.flush()
    # The state came back from the log: the failed request is not in it; a retry works.
    state = replay(await log_of(store.inner))["btc"]
    assert lost.request_id not in state.seen
    ack = await engine.submit(lost)
    assert ack.decision == "accepted" and not ack.repeated
    await assert_log_is_the_state(engine)
    await engine.stop()


class FailingFor(FailingOnce):
    """A store whose appends to the ``broken`` streams fail as a full disk would."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.broken: set[str] = set()

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        self.fail_next = append.stream in self.broken
        return super().append(append)


async def test_an_agent_still_rebuilding_says_which_storage_error_once_others_commit_again(
    clock: FakeClock, reasoner: ManualReasoner
) -> None:
    """Another agent's commit ends the fault for the log, not for the agent still being
    rebuilt after its own failed append: its refusals go on naming what went wrong."""
    store = FailingFor(MemoryEventStore(clock=clock.now_ms))
    engine = Engine(store, AGENTS, clock=clock, reasoners=lambda _: reasoner)  # type: ignore[arg-type]
    await engine.start()
    store.broken.add("eth")
    for _ in range(2):  # the second failure in a row is rebuilt after a backoff (fake clock)
        with pytest.raises(StorageFailed, match="database or disk is full"):
            await engine.submit(request("eth"))
        await engine.flush(rebuilt=False)
    await engine.submit(request("btc"))  # commits: the log is written again
    await engine.flush(rebuilt=False)
    assert engine.faults.current is None

    with pytest.raises(AgentUnavailable, match=r"recovering from a storage error \(database "
                                               r"or disk is full\); nothing was taken"):
        await engine.submit(request("eth"))
    store.broken.clear()
    clock.advance(60_000)
    await engine.flush()
    assert (await engine.submit(request("eth"))).decision == "accepted"
    await engine.stop()


class HeldAppends(FailingOnce):
    """A store whose appends to ``eth``, once ``holding``, wait until the test settles them,
    in its order."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.holding = False
        self.held: list[asyncio.Future[list[RecordedEvent]]] = []
        self.arrived = asyncio.Event()

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        if append.stream != "eth" or not self.holding:
            return super().append(append)
        future: asyncio.Future[list[RecordedEvent]] = (
            asyncio.get_running_loop().create_future())
        self.held.append(future)
        self.arrived.set()
        return future


async def test_an_append_made_on_top_of_a_failed_one_names_that_failure_once_others_commit(
    clock: FakeClock, reasoner: ManualReasoner
) -> None:
    """The second of two appends of an agent in flight fails as a version conflict because
    the first failed on the disk: its caller is told the disk's error, also once another
    agent's commit has ended the log's fault."""
    store = HeldAppends(MemoryEventStore(clock=clock.now_ms))
    engine = Engine(store, AGENTS, clock=clock, reasoners=lambda _: reasoner)  # type: ignore[arg-type]
    await engine.start()
    await engine.flush()
    store.holding = True
    first = asyncio.create_task(engine.submit(request("eth")))
    while len(store.held) < 1:  # (taken in a later turn than the first: an append of its own)
        store.arrived.clear()
        await asyncio.wait_for(store.arrived.wait(), TIMEOUT)
    second = asyncio.create_task(engine.submit(request("eth")))  # decided on top of the first
    while len(store.held) < 2:
        store.arrived.clear()
        await asyncio.wait_for(store.arrived.wait(), TIMEOUT)
    store.held[0].set_exception(StoreError("database or disk is full"))
    with pytest.raises(StorageFailed, match="database or disk is full"):
        await asyncio.wait_for(first, TIMEOUT)
    await asyncio.wait_for(engine.submit(request("btc")), TIMEOUT)  # the log is written again
    assert engine.faults.current is None

    store.held[1].set_exception(ConcurrencyError("eth", 2, 0))
    with pytest.raises(StorageFailed, match=r"an earlier append of this agent was not "
                                            r"recorded: database or disk is full"):
        await asyncio.wait_for(second, TIMEOUT)
    await engine.stop(graceful=False)


async def test_restart_records_the_cut_off_run_as_aborted_and_reruns_its_requests(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "events.db"
    first = ManualReasoner()
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock, reasoners=lambda _: first)
    await engine.start()
    ack = await engine.submit(request("btc"))
    run = await first.started()
    await engine.stop(graceful=False)  # as if the process died with the run in flight

    second = ManualReasoner()
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock, reasoners=lambda _: second)
    await engine.start()
    rerun = await second.started()
    assert [r.request_id for r in rerun.requests] == [ack.request_id]
    log = await log_of(engine.store)
    assert RunAborted(run_id=run.run_id, reason=AbortReason.RESTART, requeued=True) in [
        e.event for e in log
    ]
    assert request_outcomes(log)[ack.request_id] == "running"
    await assert_log_is_the_state(engine)
    await engine.stop()


async def test_control_lane_commits_have_a_latency_histogram_of_their_own(
    engine: Engine,
) -> None:
    await engine.submit(request("btc"))
    await engine.flush()
    commits, controls = engine.commit_latency.count, engine.control_commit_latency.count
    assert controls == 0
    await engine.submit(control("btc", "emergency_stop"))
    await engine.submit(request("eth"))
    await engine.flush()
    assert engine.control_commit_latency.count == 1
    assert engine.commit_latency.count >= commits + 2


async def test_a_restart_appends_in_the_agents_order_whatever_the_config_or_log_order(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Two starts of one log append the same events: not in a set's order (which varies
    with the hash seed and with the order the agents were found in a snapshot or the log)."""
    path = tmp_path / "events.db"
    names = ["kite", "fig", "echo", "delta", "cobra", "bravo", "alpha", "juno"]
    configs = {name: AgentConfig(mode=Mode.FOLLOWUP) for name in names}
    first = ManualReasoner()
    engine = Engine(SqliteEventStore(path), configs, clock=clock, reasoners=lambda _: first)
    await engine.start()
    for name in reversed(names):
        await engine.submit(request(name))
    await engine.stop(graceful=False)  # every agent has a run cut off

    engine = Engine(SqliteEventStore(path), dict(reversed(configs.items())), clock=clock,
                    reasoners=lambda _: ManualReasoner())
    await engine.start()
    await engine.flush()
    restarted = [r.stream for r in await engine.store.read() if r.type == "Restarted"]
    assert restarted == sorted(names)
    await engine.stop()


async def test_many_concurrent_submitters_share_commits_and_lose_nothing(
    tmp_path: Path, clock: FakeClock, reasoner: ManualReasoner
) -> None:
    engine = Engine(SqliteEventStore(tmp_path / "events.db"), AGENTS, clock=clock,
                    reasoners=lambda _: reasoner)
    await engine.start()
    requests = [request(agent, dedupeKey=f"{agent}{n}") for n in range(200)
                for agent in ("btc", "eth", "sol")]
    acks = await asyncio.gather(*(engine.submit(r) for r in requests))
    assert {a.request_id for a in acks} == {r.request_id for r in requests}
    log = await log_of(engine.store)
    received = [e.event.request.request_id for e in log if isinstance(e.event, RequestReceived)]
    assert sorted(received) == sorted(r.request_id for r in requests)
    assert [e.position for e in log] == list(range(1, len(log) + 1))
    assert sum(isinstance(e.event, RunStarted) for e in log) >= 1
    await assert_log_is_the_state(engine)
    await engine.stop()


class Recorded(FailingOnce):
    """A store that notes each append it is given: stream, request ids, urgent."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.appends: list[tuple[str, list[str], bool]] = []

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        ids = [e.data.split('"requestId":"')[1].split('"')[0] for e in append.events
               if e.type == "RequestReceived"]
        self.appends.append((append.stream, ids, append.urgent))
        return super().append(append)


async def test_the_requests_of_an_agent_taken_one_by_one_in_a_turn_share_one_append(
    clock: FakeClock, reasoner: ManualReasoner
) -> None:
    """Single takes wait for the end of the loop's turn and go out as one append per agent
    (a feed's frames of one request each); a control goes out at once, urgent, right after
    what was decided for its agent before it; the next turn starts a new append."""
    store = Recorded(MemoryEventStore(clock=clock.now_ms))
    engine = Engine(store, AGENTS, clock=clock, reasoners=lambda _: reasoner)  # type: ignore[arg-type]
    await engine.start()
    await engine.flush()
    store.appends.clear()
    first = [request("btc"), request("eth"), request("btc"), request("sol")]
    answers = [engine.take([r])[0] for r in first]
    assert store.appends == []  # nothing yet: the turn has not ended
    stop = control("btc", "pause")
    answers += engine.take([stop])
    assert store.appends == [("btc", [first[0].request_id, first[2].request_id], False),
                             ("btc", [stop.request_id], True)]
    acks = await asyncio.wait_for(asyncio.gather(*answers), TIMEOUT)
    assert [a.decision for a in acks] == ["accepted"] * 5
    assert sorted(store.appends[2:]) == [("eth", [first[1].request_id], False),
                                         ("sol", [first[3].request_id], False)]
    later = request("eth")
    assert (await engine.submit(later)).decision == "accepted"
    assert store.appends[-1] == ("eth", [later.request_id], False)
    await assert_log_is_the_state(engine)
    await engine.stop()


async def test_a_flush_in_the_turn_of_a_take_waits_for_its_commit(engine: Engine) -> None:
    """What a turn's takes decided counts as decided for `Engine.flush` (and so for a stop)
    before the turn ends."""
    answer = engine.take([request("btc")])[0]
    await engine.flush()
    assert answer.done() and answer.result().decision == "accepted"


class Raising(FailingOnce):
    """A store whose appends to ``eth``, once ``raising``, raise (a bug: an append it cannot
    even queue)."""

    raising = False

    def append(self, append: Append) -> asyncio.Future[list[RecordedEvent]]:
        if append.stream == "eth" and self.raising:
            raise ValueError("a malformed append")
        return super().append(append)


async def test_a_bug_appending_at_the_end_of_a_turn_is_told_its_requests_and_the_rest_go_on(
    clock: FakeClock, reasoner: ManualReasoner, caplog: pytest.LogCaptureFixture
) -> None:
    """Nobody called the end of the turn to be raised to: the requests of the append that
    raised are answered with the error (none waits forever), the other agents' go on, the
    agent is rebuilt from the log, and the error is logged."""
    store = Raising(MemoryEventStore(clock=clock.now_ms))
    engine = Engine(store, AGENTS, clock=clock, reasoners=lambda _: reasoner)  # type: ignore[arg-type]
    await engine.start()
    await engine.flush()
    store.raising = True
    answers = [engine.take([request(agent)])[0] for agent in ("eth", "btc")]
    done, _ = await asyncio.wait(answers, timeout=TIMEOUT)
    assert len(done) == 2
    assert isinstance(answers[0].exception(), ValueError)
    assert answers[1].result().decision == "accepted"
    assert "appending what a turn of the loop decided failed" in caplog.text
    store.raising = False
    await engine.flush()  # (the rebuild: the state is the log's again)
    await assert_log_is_the_state(engine)
    await engine.stop(graceful=False)


async def test_submit_many_answers_each_request_in_place(engine: Engine) -> None:
    batch = [request("btc", dedupeKey="a"), request("nobody"), request("eth", dedupeKey="b"),
             request("btc", dedupeKey="a"), request("btc", dedupeKey="c")]
    answers = await take_all(engine, batch)
    assert [getattr(a, "decision", type(a).__name__) for a in answers] == [
        "accepted", "UnknownAgent", "accepted", "deduped", "accepted"
    ]
    log = {e.position: e.event for e in await log_of(engine.store)}
    for sent, answer in zip(batch, answers, strict=True):
        if not isinstance(answer, UnknownAgent):
            assert getattr(log[answer.position], "request_id", None) == sent.request_id  # type: ignore[union-attr]
    await assert_log_is_the_state(engine)


async def test_an_interrupt_cancels_the_running_task(clock: FakeClock) -> None:
    reasoner = ManualReasoner()
    engine = Engine(MemoryEventStore(), {"fx": AgentConfig(mode=Mode.INTERRUPT)}, clock=clock,
                    reasoners=lambda _: reasoner)
    await engine.start()
    await engine.submit(request("fx"))
    first = await reasoner.started()
    await engine.submit(request("fx", priority="high"))
    second = await reasoner.started()
    assert reasoner.cancelled == [first.run_id]
    assert second.run_id != first.run_id
    await engine.stop()


async def test_operator_commands_and_config_changes_are_events_with_their_principal(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("btc"))
    run = await reasoner.started()
    decisions = await engine.operate("btc", OperatorAction.RELEASE, principal="alice")
    assert [type(d).__name__ for d in decisions] == ["OperatorApplied", "RunAborted"]
    assert reasoner.cancelled == [run.run_id]
    assert await engine.configure("btc", AgentConfig(mode=Mode.QUEUE), principal="bob")
    assert not await engine.configure("btc", AgentConfig(mode=Mode.QUEUE), principal="bob")
    applied = [e.event for e in await log_of(engine.store) if isinstance(e.event, ConfigApplied)]
    assert applied[-1].principal == "bob"
    await assert_log_is_the_state(engine)


async def test_a_bug_in_decide_refuses_that_input_and_rebuilds_the_agent(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await engine.submit(request("btc"))

    def broken(state: object, event: object) -> list[object]:
        raise RuntimeError("bug")

    monkeypatch.setattr(engine.agents["btc"].core, "_decide", broken)  # its decide, broken
    with pytest.raises(RuntimeError):
        await engine.submit(request("btc"))
    monkeypatch.undo()
    await engine.flush()
    assert (await engine.submit(request("btc"))).decision == "accepted"
    await assert_log_is_the_state(engine)


async def test_a_call_to_an_unknown_agent_is_recorded_against_its_run(
    engine: Engine, reasoner: ManualReasoner
) -> None:
    await engine.submit(request("btc"))
    parent = await reasoner.started()
    reasoner.finish(parent.run_id, calls=(CallIntent(agent_id="ghost"),))
    record = await next_event(engine.store, "CallEnded")
    assert "unknown agent 'ghost'" in record.data and '"refused"' in record.data
    await assert_log_is_the_state(engine)


async def test_a_call_dispatched_before_a_crash_is_delivered_at_the_next_start(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "events.db"
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock,
                    reasoners=ManualReasoner.per_agent())
    await engine.start()
    await engine.submit(request("btc"))
    call = AgentCallDispatched(call_id="btc-r1-c1", run_id="btc-r1", target="sol", depth=1,
                               priority=Priority.NORMAL, payload={})
    # What a crash between the commit and the delivery leaves: the dispatch, no delivery.
    await engine.store.append(Append("btc", [NewEvent("crash-1", *encode(call))],
                                     engine.state("btc").version))
    await engine.stop(graceful=False)

    reasoner = ManualReasoner()
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock, reasoners=lambda _: reasoner)
    await engine.start()
    received = [e.event.request.request_id for e in await log_of(engine.store)
                if isinstance(e.event, RequestReceived) and e.stream == "sol"]
    assert received == ["btc-r1-c1"]
    await engine.stop()


async def test_timers_do_not_spin_when_a_window_closes_under_a_budget(
    clock: FakeClock, reasoner: ManualReasoner
) -> None:
    config = AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000,
                         budgets=Budgets(max_runs_per_hour=1))
    engine = Engine(MemoryEventStore(), {"c": config}, clock=clock, reasoners=lambda _: reasoner)
    await engine.start()
    await engine.submit(request("c"))
    clock.advance(1_000)
    reasoner.finish((await reasoner.started()).run_id)
    await engine.flush()
    await engine.submit(request("c"))
    clock.advance(1_000)
    await engine.submit(request("c"))
    fired = 0
    original = engine.tick

    def counting(agent: Any) -> None:
        nonlocal fired
        fired += 1
        assert fired < 100, "the timer is spinning"
        original(agent)

    engine.tick = counting  # type: ignore[method-assign]
    clock.advance(2_000)
    await engine.flush()
    assert fired <= 2
    await engine.stop()


async def test_a_graceful_stop_records_runs_in_flight_and_the_next_start_reruns_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "events.db"
    first = ManualReasoner()
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock, reasoners=lambda _: first)
    await engine.start()
    ack = await engine.submit(request("btc"))
    run = await first.started()
    await engine.stop()
    assert first.cancelled == [run.run_id]
    store = SqliteEventStore(path)
    await store.open()
    log = await log_of(store)
    await store.close()
    assert log[-1].event == RunAborted(run_id=run.run_id, reason=AbortReason.SHUTDOWN,
                                       requeued=True)

    second = ManualReasoner()
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock, reasoners=lambda _: second)
    await engine.start()
    rerun = await second.started()
    assert [r.request_id for r in rerun.requests] == [ack.request_id]
    await assert_log_is_the_state(engine)
    await engine.stop()


async def test_a_paced_batch_is_decided_in_shorter_steps_than_an_unpaced_one(
    engine: Engine,
) -> None:
    """A feed's batch (paced) takes a turn of its pacer every `PACED_STEP` requests, so that
    a stop's frame waits for less of it to be read; the acks are the same either way."""
    from gateway.base.pacing import Pacer
    from gateway.runtime.intake import DECIDE_STEP, PACED_STEP

    assert PACED_STEP < DECIDE_STEP
    batch = [request("btc", dedupe_key=f"k{n}") for n in range(DECIDE_STEP + 1)]
    pacer = Pacer(burst_s=0)
    acks = await asyncio.wait_for(take_all(engine, batch, pacer=pacer), TIMEOUT)
    assert pacer.turns == -(-len(batch) // PACED_STEP)
    assert [getattr(a, "decision", a) for a in acks] == ["accepted"] * len(batch)
    await assert_log_is_the_state(engine)


async def test_a_control_between_two_steps_of_a_batch_is_appended_in_decision_order(
    engine: Engine,
) -> None:
    from gateway.base.pacing import Pacer
    from gateway.runtime.intake import PACED_STEP

    agent = next(iter(AGENTS))
    batch = [request(agent, dedupe_key=f"k{n}") for n in range(3 * PACED_STEP)]
    pacer = Pacer(burst_s=0)  # (each step on a turn of its own)
    submitting = asyncio.ensure_future(take_all(engine, batch, pacer=pacer))
    # Run until the batch has decided its first step for the agent, not appended yet...
    for _ in range(100):
        await asyncio.sleep(0)
        if engine.agents[agent].open is not None and pacer.turns >= 1:
            break
    assert engine.agents[agent].open is not None
    # ...then a stop: what the batch decided so far is appended before it, the rest after.
    stop = await asyncio.wait_for(engine.submit(control(agent, "emergency_stop")), 5)
    acks = await asyncio.wait_for(submitting, 5)
    assert stop.decision == "accepted"
    assert all(not isinstance(a, Exception) for a in acks), acks
    positions = [a.position for a in acks if not isinstance(a, Exception)]
    assert min(positions) < stop.position < max(positions)
    await assert_log_is_the_state(engine)


async def test_a_paced_batch_for_many_agents_is_appended_a_part_a_turn(
    clock: FakeClock, reasoner: ManualReasoner
) -> None:
    """A feed's batch for more agents than `PACED_STEP` appends `PACED_STEP` agents a turn
    of its pacer (one append each would otherwise hold the loop for all of them), and a
    stop that comes between two parts is appended right after what its agent had before
    it: every request acked, the log the state."""
    from gateway.base.pacing import Pacer
    from gateway.runtime.intake import PACED_STEP

    agents = {f"a{n:02}": AgentConfig(mode=Mode.FOLLOWUP) for n in range(2 * PACED_STEP + 5)}
    engine = Engine(MemoryEventStore(clock=clock.now_ms), agents, clock=clock,
                    reasoners=lambda _: reasoner)
    await engine.start()
    try:
        batch = [request(agent, dedupe_key=f"k{n}") for n in range(2) for agent in agents]
        pacer = Pacer(burst_s=0)  # (each unit on a turn of its own)
        decided = -(-len(batch) // PACED_STEP)
        submitting = asyncio.ensure_future(take_all(engine, batch, pacer=pacer))
        last = list(agents)[-1]
        for _ in range(1_000):  # until the batch is decided and its first part appended
            await asyncio.sleep(0)
            if pacer.turns > decided:
                break
        assert pacer.turns == decided + 1
        assert engine.agents[last].open is not None  # (its part is not appended yet)
        stop = await asyncio.wait_for(engine.submit(control(last, "emergency_stop")), 5)
        acks = await asyncio.wait_for(submitting, 5)
        assert pacer.turns == decided + -(-len(agents) // PACED_STEP)
        assert [getattr(a, "decision", a) for a in acks] == ["accepted"] * len(batch)
        assert all(isinstance(a, Ack) for a in acks) and isinstance(stop, Ack)
        mine = [a.position for a, r in zip(acks, batch, strict=True)
                if r.agent_id == last and isinstance(a, Ack)]
        assert max(mine) < stop.position
        await assert_log_is_the_state(engine)
    finally:
        await engine.stop()


async def test_an_answer_committed_before_a_crash_is_delivered_to_its_caller_at_the_next_start(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "events.db"
    reasoner = ManualReasoner()
    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock, reasoners=lambda _: reasoner)
    await engine.start()
    await engine.submit(request("btc"))
    parent = await reasoner.started()
    reasoner.finish(parent.run_id, calls=(CallIntent(agent_id="sol"),))
    await reasoner.started()  # sol runs the call
    await engine.flush()
    answer = CallAnswered(parent="btc", result=CallResult(
        call_id="btc-r1-c1", target="sol", status=CallStatus.RETURNED, answer="seen"))
    # What a crash between the commit and the delivery leaves: the answer, no delivery.
    await engine.store.append(Append("sol", [NewEvent("crash-2", *encode(answer))],
                                     engine.state("sol").version))
    await engine.stop(graceful=False)

    engine = Engine(SqliteEventStore(path), AGENTS, clock=clock,
                    reasoners=ManualReasoner.per_agent())
    await engine.start()
    await engine.flush()
    ended = [e.event for e in await log_of(engine.store) if isinstance(e.event, CallEnded)]
    assert [(e.call_id, e.result.answer) for e in ended] == [("btc-r1-c1", "seen")]
    assert not engine.state("btc").calls.open
    await engine.stop()
