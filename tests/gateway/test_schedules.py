"""Scheduled audits live: fire times, catch-up, and the scheduler on a real log and clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.base.clock import FakeClock
from gateway.errors import AgentUnavailable, BadFrame
from gateway.runtime.engine import Engine
from gateway.runtime.schedules import (
    CRON_COUNT_STEPS,
    LATE_MS,
    RETRY_MS,
    SCAN_STEP,
    Scheduler,
    check,
    count_between,
    next_fire,
    plan,
    prev_fire,
)
from lanes import AgentConfig, AgentRequest, AgentState, Mode, decide, replay, verify
from lanes.events import RequestReceived, ScheduleApplied, ScheduleChanged
from lanes.schedules import SCHEDULER, CatchUp, Schedule, firing_of
from store import SqliteEventStore
from tests.gateway.support import ManualReasoner, log_of, until

MINUTE = 60_000
T0 = FakeClock().now_ms()  # 2026-02-17T03:10:00Z, a whole minute


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


# ---------------------------------------------------------------------- fire times


def test_cron_fire_times_follow_the_wall_clock_of_their_time_zone() -> None:
    open_bell = Schedule(id="open", cron="30 9 * * 1-5", timezone="America/New_York")
    # Friday 2026-03-06 14:30 UTC is 09:30 in New York (EST); the next is Monday, and after
    # the switch to daylight saving time (2026-03-08) 09:30 is 13:30 UTC.
    assert next_fire(open_bell, ms("2026-03-06T14:00:00+00:00")) == ms("2026-03-06T14:30:00+00:00")
    assert next_fire(open_bell, ms("2026-03-06T14:30:00+00:00")) == ms("2026-03-09T13:30:00+00:00")
    assert prev_fire(open_bell, ms("2026-03-09T13:30:00+00:00")) == ms("2026-03-09T13:30:00+00:00")
    assert prev_fire(open_bell, ms("2026-03-09T13:29:59.999+00:00")) == \
        ms("2026-03-06T14:30:00+00:00")


def test_interval_fire_times_are_multiples_since_the_epoch() -> None:
    every = Schedule(id="e", every_ms=15 * MINUTE)
    assert next_fire(every, T0) == T0 + 5 * MINUTE  # 03:10 -> 03:15
    assert prev_fire(every, T0) == T0 - 10 * MINUTE
    assert prev_fire(every, T0 + 5 * MINUTE) == T0 + 5 * MINUTE


@pytest.mark.parametrize(("schedule", "field", "words"), [
    (Schedule(id="x", cron="61 * * * *"), "cron", "is not a cron expression"),
    (Schedule(id="x", cron="every minute"), "cron", "five fields"),
    (Schedule(id="x", cron="* * * * * * *"), "cron", "five fields"),
    (Schedule(id="x", every_ms=MINUTE, timezone="Mars/Olympus"), "timezone", "not a known"),
    (Schedule(id="x", every_ms=MINUTE, timezone="Europe"), "timezone", "not a known"),
    (Schedule(id="x", cron="R * * * *"), "cron", "random field"),
    (Schedule(id="x", cron="0 H * * MON-FRI"), "cron", "is not a cron expression"),
])
def test_a_schedule_that_is_not_one_is_refused_naming_the_field(
        schedule: Schedule, field: str, words: str) -> None:
    with pytest.raises(BadFrame, match=words) as caught:
        check(schedule)
    assert (caught.value.code, caught.value.field) == ("invalid", field)


schedules = st.one_of(
    st.builds(lambda n, c: Schedule(id="s", every_ms=n * 1000, catch_up=c),
              st.integers(1, 7_200), st.sampled_from(CatchUp)),
    st.builds(lambda cron, c: Schedule(id="s", cron=cron, catch_up=c),
              st.sampled_from(["*/5 * * * *", "0 9 * * 1-5", "15 3 1 * *", "0 0 * * *"]),
              st.sampled_from(CatchUp)),
)


@given(schedules, st.integers(0, 3 * 86_400_000), st.integers(0, 3 * 86_400_000),
       st.lists(st.integers(0, 6 * 3_600_000), min_size=1, max_size=12))
@settings(max_examples=120, deadline=None)
def test_the_scheduler_never_fires_a_time_twice_nor_one_it_should_skip(
        schedule: Schedule, defined: int, down: int, steps: Sequence[int]) -> None:
    """Driven as `gateway.runtime.schedules.Scheduler` drives it: from a definition, through a
    downtime (the floor: when a process took it up), then ticks. Fire times only grow; none
    is after now; with skip none is before the floor; with once at most one is, the latest
    fire time before the floor."""
    since = T0 + defined
    floor = now = since + down
    through = since
    fired: list[int] = []
    for step in [0, *steps]:
        now += step
        while True:
            decided = plan(schedule, through, floor, now)
            if decided.fire is None:
                assert decided.wake > now
                break
            assert through < decided.fire <= now
            fired.append(decided.fire)
            through = decided.fire
    assert fired == sorted(set(fired))
    missed = [f for f in fired if f < floor]
    if schedule.catch_up is CatchUp.SKIP:
        assert missed == []
    else:
        assert len(missed) <= 1
        first = next_fire(schedule, since)
        if first < floor:
            assert missed == [prev_fire(schedule, floor - 1)]
    if fired:  # and nothing due is left unfired: the last fire time is the latest due
        assert fired[-1] == prev_fire(schedule, now)


# ------------------------------------------------------------------- on a real log


def agents() -> dict[str, AgentConfig]:
    return {"desk": AgentConfig(mode=Mode.QUEUE, cap=1_000)}


def engine_on(db: Path, clock: FakeClock, *found: Schedule) -> Engine:
    return Engine(SqliteEventStore(db), agents(), clock=clock,
                  reasoners=ManualReasoner.per_agent(), schedules={"desk": found})


async def firings(engine: Engine) -> list[int]:
    """The fire times recorded in the log, in log order."""
    await engine.flush()
    times = []
    for entry in await log_of(engine.store):
        if isinstance(entry.event, RequestReceived):
            found = firing_of(entry.event.request, entry.event.principal)
            if found is not None:
                times.append(found[1])
    return times


async def fired(engine: Engine, count: int) -> None:
    async def probe() -> bool:
        return engine.schedules.scheduler.fired >= count

    await until(probe, f"{count} firings")


async def looked(engine: Engine) -> None:
    """The scheduler has looked at every schedule once more."""
    target = engine.schedules.scheduler.passes + 1

    async def probe() -> bool:
        return engine.schedules.scheduler.passes >= target

    await until(probe, "a look at the schedules")


async def test_a_file_schedule_fires_through_the_lanes_and_replays(tmp_path: Path) -> None:
    clock = FakeClock()
    audit = Schedule(id="audit", every_ms=MINUTE, payload={"scope": "positions"})
    engine = engine_on(tmp_path / "log.db", clock, audit)
    await engine.start()
    try:
        await looked(engine)
        entry = engine.state("desk").schedules["audit"]
        assert (entry.since, entry.from_file, entry.last_fire) == (T0, True, None)
        clock.advance(MINUTE)
        await fired(engine, 1)
        clock.advance(MINUTE)
        await fired(engine, 2)
        assert await firings(engine) == [T0 + MINUTE, T0 + 2 * MINUTE]
        log = await log_of(engine.store)
        first = next(e.event for e in log if isinstance(e.event, RequestReceived))
        assert first.principal == SCHEDULER
        assert first.request.kind.value == "scheduled_audit"
        assert first.request.priority.value == "low"
        assert first.request.payload == {"scope": "positions", "schedule": "audit",
                                         "fireAt": "2026-02-17T03:11:00+00:00"}
        assert [type(e.event).__name__ for e in log][-2:] == ["RequestReceived",
                                                             "RequestQueued"]
        assert replay(log)["desk"] == engine.state("desk")
        assert verify(log) is None
    finally:
        await engine.stop()


@pytest.mark.parametrize(("catch_up", "caught_up"), [(CatchUp.SKIP, []), (CatchUp.ONCE, [11])])
async def test_a_restart_never_fires_a_time_twice_and_catches_up_by_policy(
        tmp_path: Path, catch_up: CatchUp, caught_up: list[int]) -> None:
    clock = FakeClock()
    audit = Schedule(id="audit", every_ms=MINUTE, catch_up=catch_up)
    engine = engine_on(tmp_path / "log.db", clock, audit)
    await engine.start()
    await looked(engine)
    clock.advance(MINUTE)
    await fired(engine, 1)
    await engine.stop(graceful=False)  # as if it died
    engine = engine_on(tmp_path / "log.db", clock, audit)  # at once: nothing due, none again
    await engine.start()
    await looked(engine)
    assert engine.schedules.scheduler.fired == 0
    await engine.stop()
    clock.advance(10 * MINUTE + 30_000)  # down through ten fire times, back at 03:21:30
    engine = engine_on(tmp_path / "log.db", clock, audit)
    await engine.start()
    try:
        await looked(engine)  # (a catch-up fires in its first look)
        assert await firings(engine) == [T0 + MINUTE, *(T0 + n * MINUTE for n in caught_up)]
        clock.advance(30_000)  # the next fire time after the restart
        await fired(engine, 1 + len(caught_up))
        assert await firings(engine) == [T0 + MINUTE, *(T0 + n * MINUTE for n in caught_up),
                                         T0 + 12 * MINUTE]
    finally:
        await engine.stop()


async def test_paused_it_fires_nothing_and_resumed_only_what_comes_after(
        tmp_path: Path) -> None:
    clock = FakeClock()
    audit = Schedule(id="audit", every_ms=MINUTE, catch_up=CatchUp.ONCE)
    engine = engine_on(tmp_path / "log.db", clock)
    await engine.start()
    try:
        assert await engine.schedules.set("desk", "audit", audit, "root")
        assert not await engine.schedules.set("desk", "audit", audit, "root")  # no change
        await engine.schedules.set("desk", "audit",
                                  audit.model_copy(update={"paused": True}), "root")
        clock.advance(5 * MINUTE)
        await looked(engine)  # (a look after the advance: none has run since)
        assert await firings(engine) == []
        await engine.schedules.set("desk", "audit", audit, "root")  # resumed at 03:15: what
        clock.advance(MINUTE)  # it missed is not caught up; the next time after it is 03:16
        await fired(engine, 1)
        assert await firings(engine) == [T0 + 6 * MINUTE]
        run = await engine.schedules.run("desk", "audit", "ops")  # by hand
        assert run.decision == "accepted"
        assert engine.state("desk").schedules["audit"].last_fire == T0 + 6 * MINUTE
        await engine.schedules.set("desk", "audit", None, "root")
        assert "audit" not in engine.state("desk").schedules
        with pytest.raises(BadFrame, match="has no schedule 'audit'") as caught:
            await engine.schedules.set("desk", "audit", None, "root")
        assert caught.value.code == "not_found"
        applied = [e.event for e in await log_of(engine.store)
                   if isinstance(e.event, ScheduleApplied)]
        assert [(a.schedule is not None and a.schedule.paused, a.principal)
                for a in applied] == [(False, "root"), (True, "root"), (False, "root"),
                                      (False, "root")]
    finally:
        await engine.stop()


async def test_a_schedule_the_file_no_longer_has_goes_and_a_runtime_pause_stays(
        tmp_path: Path) -> None:
    clock = FakeClock()
    audit = Schedule(id="audit", every_ms=MINUTE)
    close = Schedule(id="close", cron="0 16 * * 1-5", timezone="America/New_York")
    engine = engine_on(tmp_path / "log.db", clock, audit, close)
    await engine.start()
    await looked(engine)
    await engine.schedules.set("desk", "close", close.model_copy(update={"paused": True}),
                              "root")
    await engine.schedules.set("desk", "mine", Schedule(id="mine", every_ms=MINUTE), "root")
    await engine.stop()
    later = close.model_copy(update={"cron": "5 16 * * 1-5"})
    engine = engine_on(tmp_path / "log.db", clock, later)  # no audit; close changed
    await engine.start()
    try:
        await looked(engine)
        kept = engine.state("desk").schedules
        assert sorted(kept) == ["close", "mine"]
        assert kept["close"].schedule.cron == "5 16 * * 1-5"
        assert kept["close"].schedule.paused  # the operator's pause outlives the file's edit
    finally:
        await engine.stop()


async def test_refused_schedules_change_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = engine_on(tmp_path / "log.db", clock)
    await engine.start()
    try:
        before = await engine.store.last_position()
        with pytest.raises(BadFrame, match="not a cron expression"):
            await engine.schedules.set("desk", "x", Schedule(id="x", cron="99 * * * *"), "root")
        with pytest.raises(BadFrame, match="is not 'y'"):
            await engine.schedules.set("desk", "y", Schedule(id="x", every_ms=MINUTE), "root")
        assert await engine.store.last_position() == before
        assert engine.state("desk").schedules == {}
    finally:
        await engine.stop()


async def test_a_pass_fires_nothing_of_a_schedule_removed_while_it_awaited_a_firing() -> None:
    """The scheduler awaits each firing's commit: a schedule removed (or paused) meanwhile
    is not fired from what the pass read before."""
    clock = FakeClock()
    state = AgentState(agent_id="desk")
    for schedule_id in ("a", "b"):
        decide(state, ScheduleChanged(at=T0, schedule_id=schedule_id,
                                      schedule=Schedule(id=schedule_id, every_ms=MINUTE)))
    fired: list[str] = []

    async def fire(request: AgentRequest) -> None:
        fired.append(request.dedupe_key or "")
        decide(state, ScheduleChanged(at=clock.now_ms(), schedule_id="b", schedule=None))

    scheduler = Scheduler(clock, lambda: [state], fire)
    await scheduler.step()  # takes both up
    clock.advance(MINUTE)
    await scheduler.step()
    assert fired == [f"schedule:a:{T0 + MINUTE}"]


async def test_a_firing_the_engine_cannot_take_is_tried_again_not_counted_as_missed() -> None:
    """While the agent cannot be written (its log refuses writes), a firing fails and is
    tried again; once it can, the time that fell due meanwhile fires (late, once), even with
    catch-up ``skip``: the gateway ran all along."""
    clock = FakeClock()
    state = AgentState(agent_id="desk")
    decide(state, ScheduleChanged(at=T0, schedule_id="a",
                                  schedule=Schedule(id="a", every_ms=MINUTE)))
    fired: list[int] = []
    failing = True

    async def fire(request: AgentRequest) -> None:
        if failing:
            raise AgentUnavailable("desk", "the disk is full")
        found = firing_of(request, SCHEDULER)
        assert found is not None
        fired.append(found[1])

    scheduler = Scheduler(clock, lambda: [state], fire)
    await scheduler.step()
    clock.advance(MINUTE)
    assert await scheduler.step() == T0 + MINUTE + RETRY_MS
    clock.advance(3 * MINUTE)
    failing = False
    await scheduler.step()
    assert fired == [T0 + 4 * MINUTE]
    # Counted: one firing, on time; the three times it passed over are missed.
    assert (scheduler.fired, scheduler.late, scheduler.missed) == (1, 0, 3)


def test_fire_times_are_whole_utc_instants() -> None:
    fire = next_fire(Schedule(id="s", cron="0 0 * * *", timezone="Asia/Tokyo"), T0)
    assert datetime.fromtimestamp(fire / 1000, UTC).isoformat() == "2026-02-17T15:00:00+00:00"


async def test_a_pass_over_a_big_desk_takes_turns_of_the_event_loop() -> None:
    """A pass looks at every agent the engine holds, once a second: at 10,000 agents it held
    the loop about 10 ms, in front of whatever came in (a stop). It takes turns now."""
    states = [AgentState(agent_id=f"a{n}") for n in range(4 * SCAN_STEP)]

    async def fire(_request: AgentRequest) -> None:
        raise AssertionError("nothing is scheduled")

    scheduler = Scheduler(FakeClock(), lambda: states, fire)
    passing = asyncio.ensure_future(scheduler.step())
    turns = 0
    while not passing.done():
        await asyncio.sleep(0)
        turns += 1
    await passing
    assert turns >= 4 and scheduler.passes == 1


async def test_a_pass_reads_a_big_desks_states_as_it_goes() -> None:
    """Gathering 10,000 agents' states before the first turn held the loop for 2 ms: the
    pass takes them from its source a step at a time."""
    taken: list[int] = []

    def states() -> Iterator[AgentState]:
        for n in range(4 * SCAN_STEP):
            taken.append(n)
            yield AgentState(agent_id=f"a{n}")

    async def fire(_request: AgentRequest) -> None:
        raise AssertionError("nothing is scheduled")

    scheduler = Scheduler(FakeClock(), states, fire)
    passing = asyncio.ensure_future(scheduler.step())
    await asyncio.sleep(0)  # the pass's first turn
    assert 0 < len(taken) <= SCAN_STEP + 1
    await passing
    assert len(taken) == 4 * SCAN_STEP and scheduler.passes == 1


# ------------------------------------------------------------------- counted for /metrics


def scheduled(*found: Schedule, since: int = T0) -> AgentState:
    """An agent whose ``found`` schedules were defined at ``since`` and never fired."""
    state = AgentState(agent_id="desk")
    for schedule in found:
        decide(state, ScheduleChanged(at=since, schedule_id=schedule.id, schedule=schedule))
    return state


def counting(clock: FakeClock, state: AgentState) -> Scheduler:
    """A scheduler over ``state`` whose firings are folded into it, as the engine's are."""
    async def fire(request: AgentRequest) -> None:
        decide(state, RequestReceived(at=clock.now_ms(), request=request, principal=SCHEDULER))

    return Scheduler(clock, lambda: [state], fire)


def counts(scheduler: Scheduler) -> tuple[int, int, int]:
    return scheduler.fired, scheduler.late, scheduler.missed


async def test_firings_on_time_are_counted_and_none_is_late_or_missed() -> None:
    clock = FakeClock()
    scheduler = counting(clock, scheduled(Schedule(id="a", every_ms=MINUTE)))
    await scheduler.step()
    for n in range(1, 4):
        clock.advance(MINUTE)
        await scheduler.step()
        assert counts(scheduler) == (n, 0, 0)
    clock.advance(MINUTE + LATE_MS)  # a second late is still on time
    await scheduler.step()
    assert counts(scheduler) == (4, 0, 0)


async def test_a_stalled_loop_makes_one_late_firing_and_misses_the_times_passed_over() -> None:
    clock = FakeClock()
    state = scheduled(Schedule(id="a", every_ms=MINUTE))
    scheduler = counting(clock, state)
    await scheduler.step()
    clock.advance(3 * MINUTE + 5_000)  # no step for 3 fire times: the last fires, 5 s late
    await scheduler.step()
    assert counts(scheduler) == (1, 1, 2)
    assert state.schedules["a"].last_fire == T0 + 3 * MINUTE
    clock.advance(55_000)
    await scheduler.step()
    assert counts(scheduler) == (2, 1, 2)


@pytest.mark.parametrize(("catch_up", "expected"), [
    (CatchUp.SKIP, [(0, 0, 10), (1, 0, 10)]),  # the ten times while down: missed at take-up
    (CatchUp.ONCE, [(1, 1, 9), (2, 1, 9)]),  # the latest of them fires (late), nine missed
])
async def test_fire_times_passed_while_nobody_ran_the_schedule_are_missed_by_its_catch_up(
        catch_up: CatchUp, expected: list[tuple[int, int, int]]) -> None:
    clock = FakeClock(T0 + 30_000)  # defined at T0 - 10 min, taken up at T0 + 30 s
    state = scheduled(Schedule(id="a", every_ms=MINUTE, catch_up=catch_up),
                      since=T0 - 10 * MINUTE)
    scheduler = counting(clock, state)
    await scheduler.step()
    assert counts(scheduler) == expected[0]
    await scheduler.step()  # counted once, however often it looks
    assert counts(scheduler) == expected[0]
    clock.advance(30_000)  # T0 + 1 min: on time
    await scheduler.step()
    assert counts(scheduler) == expected[1]


async def test_a_paused_schedule_misses_nothing_while_paused() -> None:
    clock = FakeClock()
    audit = Schedule(id="a", every_ms=MINUTE)
    state = scheduled(audit)
    scheduler = counting(clock, state)
    await scheduler.step()
    decide(state, ScheduleChanged(at=T0, schedule_id="a",
                                  schedule=audit.model_copy(update={"paused": True})))
    clock.advance(5 * MINUTE)
    await scheduler.step()
    decide(state, ScheduleChanged(at=clock.now_ms(), schedule_id="a", schedule=audit))
    await scheduler.step()
    clock.advance(MINUTE)
    await scheduler.step()
    assert counts(scheduler) == (1, 0, 0)


@given(st.integers(1, 7_200), st.integers(0, 10 * 86_400_000), st.integers(0, 86_400_000))
def test_the_fire_times_of_an_interval_between_two_instants_are_counted_exactly(
        seconds: int, start: int, length: int) -> None:
    schedule = Schedule(id="s", every_ms=seconds * 1000)
    after, before = T0 + start, T0 + start + length
    brute, fire = 0, next_fire(schedule, after)
    while fire < before:
        brute, fire = brute + 1, fire + seconds * 1000
    assert count_between(schedule, after, before) == brute


@pytest.mark.parametrize(("cron", "days"), [
    ("*/5 * * * *", 0.05), ("*/5 * * * *", 1), ("0 9 * * 1-5", 20), ("0 9 * * 1-5", 60),
    ("0 0 * * *", 3), ("15 3 1 * *", 100),
])
def test_cron_fire_times_between_two_instants_are_counted_and_estimated_past_a_few(
        cron: str, days: float) -> None:
    schedule = Schedule(id="s", cron=cron, timezone="America/New_York")
    after, before = T0 + 1, T0 + round(days * 86_400_000)
    brute, fire = 0, next_fire(schedule, after)
    while fire < before:
        brute, fire = brute + 1, next_fire(schedule, fire)
    counted = count_between(schedule, after, before)
    if brute <= CRON_COUNT_STEPS:
        assert counted == brute
    else:  # past the few counted one by one, an estimate from their spacing
        assert abs(counted - brute) <= brute * 0.3, (counted, brute)


async def test_an_agent_gone_for_a_pass_is_taken_up_afresh_when_it_is_back() -> None:
    """Handed to another process and back, an agent's file schedules are applied again."""
    a, b = AgentState(agent_id="a"), AgentState(agent_id="b")
    held = [a, b]
    adopted: list[str] = []

    async def adopt(state: AgentState) -> None:
        adopted.append(state.agent_id)

    async def fire(_request: AgentRequest) -> None:
        raise AssertionError("nothing is scheduled")

    scheduler = Scheduler(FakeClock(), lambda: list(held), fire, adopt)
    await scheduler.step()
    held.remove(b)
    await scheduler.step()
    held.append(b)
    await scheduler.step()
    await scheduler.step()
    assert adopted == ["a", "b", "b"]
