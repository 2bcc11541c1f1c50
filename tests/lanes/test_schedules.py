"""Schedules in the lanes: defined by events, moved on by their firings, replayed exactly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentState, Entry, decide, replay
from lanes.codec import decode, encode_checked
from lanes.events import Input, RequestReceived, ScheduleApplied, ScheduleChanged
from lanes.replay import LogFold
from lanes.requests import AgentRequest, Kind
from lanes.schedules import (
    FILE_PRINCIPAL,
    MAX_SCHEDULES,
    SCHEDULE_SOURCE,
    SCHEDULER,
    CatchUp,
    Schedule,
    firing_key,
    firing_of,
)
from lanes.snapshot import dump_fold, load_fold
from tests.lanes.harness import Bench

AGENT = "desk"
T0 = 1_771_297_800_000
IDS = ("audit", "close", "open")


def firing(schedule_id: str, fire: int, principal: str = SCHEDULER, n: int = 0) -> RequestReceived:
    """A firing as `gateway.runtime.schedules.firing_request` makes it (``n`` varies the id)."""
    return RequestReceived(at=fire, principal=principal, request=AgentRequest(
        request_id=f"schedule:{schedule_id}:{fire}:{n}",
        created_at=datetime.fromtimestamp(fire / 1000, UTC), agent_id=AGENT,
        kind=Kind.SCHEDULED_AUDIT, dedupe_key=firing_key(schedule_id, fire),
        source=SCHEDULE_SOURCE, payload={"schedule": schedule_id}))


def run(inputs: list[Input]) -> tuple[AgentState, list[Entry]]:
    """Decide every input on one agent (`tests.lanes.harness.Bench`); its state and log."""
    bench = Bench(agent=AGENT)
    for event in inputs:
        bench.feed(event)
    return bench.state, bench.log


def test_a_firing_is_told_only_by_the_scheduler_its_kind_source_and_key() -> None:
    event = firing("audit", T0 + 60_000)
    assert firing_of(event.request, SCHEDULER) == ("audit", T0 + 60_000)
    assert firing_of(event.request, "feeder") is None  # a look-alike from a feed moves nothing
    other = event.request.model_copy(update={"source": "elsewhere"})
    assert firing_of(other, SCHEDULER) is None
    odd = event.request.model_copy(update={"dedupe_key": "schedule:audit:soon"})
    assert firing_of(odd, SCHEDULER) is None


def test_a_schedule_needs_exactly_one_timing() -> None:
    with pytest.raises(ValueError, match="exactly one of 'cron' and 'everyMs'"):
        Schedule(id="x")
    with pytest.raises(ValueError, match="exactly one"):
        Schedule.model_validate({"id": "x", "cron": "* * * * *", "everyMs": 60_000})
    with pytest.raises(ValueError, match="greater than or equal to 1000"):
        Schedule.model_validate({"id": "x", "everyMs": 10})  # under a second


def test_firings_move_last_fire_on_and_a_redelivery_is_deduped() -> None:
    audit = Schedule(id="audit", every_ms=60_000)
    state, log = run([
        ScheduleChanged(at=T0, schedule_id="audit", schedule=audit, principal=FILE_PRINCIPAL),
        firing("audit", T0 + 60_000),
        firing("audit", T0 + 60_000, n=1),  # the same time again (another id): deduped
        firing("audit", T0 + 120_000, principal="feeder"),  # not a firing
    ])
    entry = state.schedules["audit"]
    assert (entry.since, entry.last_fire, entry.fired, entry.from_file) == (
        T0, T0 + 60_000, 2, True)
    assert [type(e.event).__name__ for e in log].count("RequestDeduped") == 1
    assert replay(log)[AGENT] == state


def test_a_redefinition_keeps_what_fired_and_fires_only_after_it() -> None:
    audit = Schedule(id="audit", every_ms=60_000)
    state, _ = run([
        ScheduleChanged(at=T0, schedule_id="audit", schedule=audit),  # from the file
        firing("audit", T0 + 60_000),
        ScheduleChanged(at=T0 + 90_000, schedule_id="audit",
                        schedule=audit.model_copy(update={"paused": True}), principal="root"),
    ])
    entry = state.schedules["audit"]
    assert (entry.since, entry.last_fire, entry.schedule.paused, entry.from_file) == (
        T0 + 90_000, T0 + 60_000, True, True)  # still the file's, paused at runtime
    assert entry.fired_through == T0 + 90_000


def test_nothing_is_decided_for_what_changes_nothing() -> None:
    audit = Schedule(id="audit", every_ms=60_000)
    state = AgentState(agent_id=AGENT)
    assert decide(state, ScheduleChanged(at=T0, schedule_id="audit", schedule=None)) == []
    assert decide(state, ScheduleChanged(at=T0, schedule_id="audit", schedule=audit)) != []
    assert decide(state, ScheduleChanged(at=T0, schedule_id="audit", schedule=audit)) == []
    assert decide(state, ScheduleChanged(at=T0, schedule_id="other", schedule=audit)) == []
    for n in range(MAX_SCHEDULES - 1):
        decide(state, ScheduleChanged(at=T0, schedule_id=f"s{n}",
                                      schedule=audit.model_copy(update={"id": f"s{n}"})))
    over = audit.model_copy(update={"id": "over"})
    assert decide(state, ScheduleChanged(at=T0, schedule_id="over", schedule=over)) == []
    assert len(state.schedules) == MAX_SCHEDULES


def test_schedule_events_read_back_equal() -> None:
    audit = Schedule(id="audit", cron="30 9 * * 1-5", timezone="America/New_York",
                     payload={"scope": ["positions", "orders"]}, catch_up=CatchUp.ONCE)
    for event in (ScheduleChanged(at=T0, schedule_id="audit", schedule=audit, principal="root"),
                  ScheduleApplied(schedule_id="audit", schedule=None, principal="root")):
        name, text = encode_checked(event)
        assert decode(name, text) == event


ops = st.lists(st.one_of(
    st.tuples(st.just("set"), st.sampled_from(IDS), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("remove"), st.sampled_from(IDS), st.just(0), st.just(False)),
    st.tuples(st.just("fire"), st.sampled_from(IDS), st.integers(0, 30), st.booleans()),
), max_size=40)


@given(ops)
@settings(max_examples=150, deadline=None)
def test_schedules_replay_and_snapshot_exactly(steps: list[tuple[str, str, int, bool]]) -> None:
    """Whatever schedules were set, removed or fired, the fold of the log is the state, a
    snapshot loads back equal, and each schedule's last fire is the latest one recorded
    by the scheduler since it was (re)created."""
    inputs: list[Input] = []
    now = T0
    for n, (op, schedule_id, value, flag) in enumerate(steps):
        now += 1_000
        if op == "set":
            schedule = Schedule(id=schedule_id, every_ms=value * 60_000, paused=flag)
            inputs.append(ScheduleChanged(at=now, schedule_id=schedule_id, schedule=schedule))
        elif op == "remove":
            inputs.append(ScheduleChanged(at=now, schedule_id=schedule_id, schedule=None))
        else:
            inputs.append(firing(schedule_id, T0 + value * 60_000,
                                 SCHEDULER if flag else "feeder", n))
    state, log = run(inputs)
    assert replay(log).get(AGENT, AgentState(agent_id=AGENT)) == state
    fold, _ = load_fold(dump_fold(LogFold(states={AGENT: state}, position=len(log)), "x"))
    assert fold.states[AGENT] == state
    expected: dict[str, int | None] = {}
    for event in inputs:
        if isinstance(event, ScheduleChanged):
            if event.schedule is None:
                expected.pop(event.schedule_id, None)
            else:
                expected.setdefault(event.schedule_id, None)
        elif isinstance(event, RequestReceived):
            found = firing_of(event.request, event.principal)
            if found is not None and found[0] in expected:
                last = expected[found[0]]
                expected[found[0]] = found[1] if last is None else max(last, found[1])
    assert {k: e.last_fire for k, e in state.schedules.items()} == expected
