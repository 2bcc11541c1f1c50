"""Time travel's story index (`gateway.reads.stories`): the groups around a position or
between two, and the jumps to stops, drops and suppressions, are the ones a plain scan of the
whole stream finds."""

from __future__ import annotations

import random
from bisect import bisect_right

from gateway.base.quarantine import PLAIN
from gateway.reads.stories import Stories
from gateway.reads.story import INPUT_NAMES, told
from gateway.tools.timeline import JUMP_KINDS, kinds_of
from lanes import AgentConfig, AgentState, Budgets, Entry, Mode, decide
from lanes.config import DropPolicy
from lanes.events import ConfigChanged, Input, Outcome, RequestReceived, RunFinished, Usage
from store import MemoryEventStore, RecordedEvent
from tests.gateway.support import control, request
from tests.gateway.test_replays import records_of

T0 = 1_771_297_800_000


def desk_log(inputs: int, seed: int = 2) -> list[Entry]:
    """Two agents with a run budget and a small cap: triggers, stops and resumes, runs
    ending; so the stream holds drops, stops and suppressions."""
    rng = random.Random(seed)
    states = {a: AgentState(agent_id=a) for a in ("alpha", "bravo")}
    log: list[Entry] = []
    now = T0

    def feed(agent: str, event: Input) -> None:
        decisions = decide(states[agent], event)
        if decisions:
            log.extend(Entry(len(log) + 1, agent, e) for e in (event, *decisions))

    for agent in states:
        feed(agent, ConfigChanged(at=now, config=AgentConfig(
            mode=Mode.FOLLOWUP, cap=3, drop_policy=DropPolicy.OLD,
            budgets=Budgets(max_runs_per_hour=4))))
    for _ in range(inputs):
        now += rng.randint(1_000, 120_000)
        agent = rng.choice(list(states))
        state, roll = states[agent], rng.random()
        if roll < 0.25 and state.active is not None:
            feed(agent, RunFinished(at=now, run_id=state.active.run_id, outcome=Outcome.NO_TRADE,
                                    usage=Usage(input_tokens=10)))
        elif roll < 0.3:
            feed(agent, RequestReceived(at=now, request=control(agent, rng.choice(
                ["emergency_stop", "resume", "resume"]))))
        else:
            feed(agent, RequestReceived(at=now, request=request(agent)))
    return log


def plain_groups(records: list[RecordedEvent]) -> list[tuple[int, int]]:
    """Each group's [start, end) in the whole stream, found by a scan."""
    starts = [i for i, r in enumerate(records) if r.type in INPUT_NAMES]
    return list(zip(starts, [*starts[1:], len(records)], strict=True))


def plain_jump(records: list[RecordedEvent], kind: str, after: int | None,
               before: int | None) -> int | None:
    found = [r.position for r in records if r.type not in INPUT_NAMES
             and kind in kinds_of(PLAIN.decode(r))]
    if after is not None:
        return next((p for p in found if p > after), None)
    return next((p for p in reversed(found) if before is not None and p < before), None)


async def test_groups_and_jumps_are_the_ones_a_scan_of_the_whole_stream_finds() -> None:
    log = desk_log(900)
    cut = len(log) * 2 // 3  # the rest is appended after the first asks
    store = MemoryEventStore()
    await store.open()
    versions: dict[str, int] = {}
    await store.restore(records_of(log[:cut], versions))
    stories = Stories()
    rng = random.Random(9)
    for appended in (False, True):
        if appended:
            await store.restore(records_of(log[cut:], versions))
        last = await store.last_position()
        for agent in ("alpha", "bravo"):
            records = await store.read_stream(agent)
            spans = plain_groups(records)
            index = await stories.index(store, PLAIN, agent)
            assert index.version == len(records)
            for kind in JUMP_KINDS:
                assert index.jumps[kind], f"the log has no {kind}: the test would prove little"
            for _ in range(60):
                position, count = rng.randrange(0, last + 2), rng.randrange(0, 4)
                first, end, current = index.around(position, count)
                holding = bisect_right([records[s].position for s, _ in spans], position) - 1
                want_first = max(0, holding - count)
                want = spans[want_first:max(holding, 0) + count + 1]
                assert (first, end) == (want_first, want_first + len(want))
                assert current == (holding - want_first if holding >= 0 else -1)
                assert await stories.groups(store, index, agent, first, end) == told(
                    records, want, PLAIN)

                start = rng.randrange(0, last + 1)
                upto, limit = rng.randrange(start, last + 2), rng.randrange(1, 30)
                inside = [s for s in spans if start <= records[s[0]].position <= upto]
                first, end, more = index.between(start, upto, limit)
                assert more == (len(inside) > limit)
                assert await stories.groups(store, index, agent, first, end) == told(
                    records, inside[:limit], PLAIN)

                kind = rng.choice(JUMP_KINDS)
                assert index.jump(kind, position, None) == plain_jump(records, kind, position,
                                                                      None)
                assert index.jump(kind, None, position) == plain_jump(records, kind, None,
                                                                      position)


def test_a_stop_that_changes_nothing_is_no_stop_mark_or_jump() -> None:
    from lanes.events import ControlApplied, TradingState
    from lanes.requests import ControlAction

    def applied(before: TradingState) -> ControlApplied:
        return ControlApplied(request_id="r", action=ControlAction.EMERGENCY_STOP,
                              from_state=before, to_state=TradingState.HALTED)
    assert kinds_of(applied(TradingState.ACTIVE)) == ("stop",)
    assert kinds_of(applied(TradingState.HALTED)) == ("control",)
