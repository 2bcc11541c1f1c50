"""Scheduled audits, live: when each schedule fires, and the task that fires them.

A schedule (`lanes.schedules.Schedule`) is a cron expression in a time zone (croniter with
zoneinfo: daylight saving moves the wall time, never the rule) or a fixed interval (fire
times are multiples of ``everyMs`` since the epoch). Each firing is submitted as an ordinary
``scheduled_audit`` request through the lanes (`firing_request`), and folding it moves the
schedule's ``last_fire`` on in the log: a restart never fires a time twice.

Catch-up (`plan`): fire times missed while no process ran the schedule (the gateway was
down, or the agent's owner died) are skipped (``catchUp = "skip"``, the default) or run once,
for the latest missed time (``"once"``). A firing that is merely late while the gateway runs
(a stalled loop) fires once, for the latest time due. The `Scheduler` counts its firings,
the late ones and the fire times missed, for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from gateway.base.clock import Clock, sleep_or
from gateway.errors import BadFrame, GatewayError
from lanes.requests import AgentRequest, Kind
from lanes.schedules import (
    MANUAL_SOURCE,
    MAX_SCHEDULES,
    SCHEDULE_SOURCE,
    CatchUp,
    Schedule,
    firing_key,
)
from lanes.state import AgentState

log = logging.getLogger("gateway.runtime.schedules")
_TOKENS = re.compile(r"[,/#\-]")

RESCAN_MS = 1_000
"""The scheduler looks at the agents the engine holds at least this often (schedules
changed, agents taken over) even when nothing is due."""
SCAN_STEP = 100
"""Agents looked at in one turn of the event loop during a pass (a pass over a big desk
takes turns; 200 held the loop for 1.3-1.5 ms at 10,000 agents)."""
RETRY_MS = 1_000
"""A firing the engine could not take (the log refused it, say) is tried again after this."""
LATE_MS = 1_000
"""A firing that goes out more than this after its fire time counts as late."""
CRON_COUNT_STEPS = 24
"""Fire times of a cron schedule counted one by one in a gap (each costs a croniter step,
tens of microseconds); past them the rest of the gap is counted from their mean spacing."""


def check(schedule: Schedule) -> None:
    """`BadFrame` (``invalid``, naming the field) if the schedule's time zone or cron
    expression is not one. Cron's random fields (``R``, ``H``) are refused: a fire time must
    be the same whenever it is computed."""
    try:
        zone = ZoneInfo(schedule.timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise BadFrame("invalid", f"timezone {schedule.timezone!r} is not a known time zone "
                       "(an IANA name such as 'UTC' or 'America/New_York')",
                       field="timezone") from None
    if schedule.cron is not None:
        fields = schedule.cron.split()
        if len(fields) not in (5, 6) or not croniter.is_valid(schedule.cron):
            raise BadFrame("invalid", f"cron {schedule.cron!r} is not a cron expression "
                           "(five fields: minute hour day-of-month month day-of-week, and "
                           "an optional sixth for seconds)", field="cron")
        tokens = {token.upper() for field in fields for token in _TOKENS.split(field)}
        if any(token in ("R", "H") or token.startswith(("R(", "H(")) for token in tokens):
            raise BadFrame("invalid", f"cron {schedule.cron!r} has a random field (R or H): "
                           "a schedule's fire times must not change from one look to the "
                           "next; name the time", field="cron")
        try:
            start = datetime(2026, 1, 1, tzinfo=zone)
            first = croniter(schedule.cron, start).get_next(float)
        except (ValueError, KeyError, OverflowError) as error:
            raise BadFrame("invalid", f"cron {schedule.cron!r} never fires: {error}",
                           field="cron") from None
        if croniter(schedule.cron, start).get_next(float) != first:
            raise BadFrame("invalid", f"cron {schedule.cron!r} fires at random times",
                           field="cron")


def check_count(state: AgentState, schedule_id: str) -> None:
    """`BadFrame` if a new schedule would take the agent past `MAX_SCHEDULES`."""
    if schedule_id not in state.schedules and len(state.schedules) >= MAX_SCHEDULES:
        raise BadFrame("invalid", f"agent {state.agent_id!r} has {MAX_SCHEDULES} schedules, "
                       "the most it may have; remove one first", field="id")


def _zoned(schedule: Schedule, at_ms: int) -> datetime:
    return datetime.fromtimestamp(at_ms / 1000, ZoneInfo(schedule.timezone))


def next_fire(schedule: Schedule, after_ms: int) -> int:
    """The first fire time strictly after ``after_ms``."""
    if schedule.every_ms is not None:
        return (after_ms // schedule.every_ms + 1) * schedule.every_ms
    assert schedule.cron is not None
    fire = round(croniter(schedule.cron, _zoned(schedule, after_ms)).get_next(float) * 1000)
    return fire if fire > after_ms else next_fire(schedule, after_ms + 1)


def prev_fire(schedule: Schedule, at_ms: int) -> int:
    """The latest fire time at or before ``at_ms``."""
    if schedule.every_ms is not None:
        return at_ms // schedule.every_ms * schedule.every_ms
    assert schedule.cron is not None
    return round(croniter(schedule.cron, _zoned(schedule, at_ms + 1)).get_prev(float) * 1000)


def count_between(schedule: Schedule, after_ms: int, before_ms: int) -> int:
    """How many fire times lie strictly between ``after_ms`` and ``before_ms``: exact for an
    interval; for cron, exact up to `CRON_COUNT_STEPS` and estimated past them."""
    if before_ms - after_ms < 2:
        return 0
    if schedule.every_ms is not None:
        every = schedule.every_ms
        return max(0, (before_ms - 1) // every - after_ms // every)
    assert schedule.cron is not None
    times = croniter(schedule.cron, _zoned(schedule, after_ms))
    first = last = None
    count = 0
    while count < CRON_COUNT_STEPS:
        fire = round(times.get_next(float) * 1000)
        if fire <= after_ms:  # (a start on a whole second may name itself)
            continue
        if fire >= before_ms:
            return count
        first = fire if first is None else first
        last = fire
        count += 1
    assert first is not None and last is not None
    spacing = max(1, (last - first) // (count - 1))
    return count + (before_ms - 1 - last) // spacing


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do about one schedule now: fire it for ``fire`` (or not), then look again at
    ``wake``."""

    fire: int | None
    wake: int


def plan(schedule: Schedule, through: int, floor: int, now: int) -> Plan:
    """The schedule's next step: fire times up to ``through`` are done; those before
    ``floor`` (when this process took the schedule up) were missed while nobody ran it."""
    first = next_fire(schedule, through)
    if first < floor and first <= now:  # missed while nobody ran it
        if schedule.catch_up is CatchUp.ONCE:
            latest = prev_fire(schedule, min(floor - 1, now))
            return Plan(latest, latest)
        first = next_fire(schedule, max(through, floor - 1))
    if first <= now:  # due (perhaps late: then once, for the latest time due)
        latest = prev_fire(schedule, now)
        return Plan(latest, next_fire(schedule, latest))
    return Plan(None, first)


def firing_request(agent_id: str, schedule: Schedule, fire_ms: int) -> AgentRequest:
    """The ``scheduled_audit`` request of the schedule's firing at ``fire_ms``."""
    at = datetime.fromtimestamp(fire_ms / 1000, UTC)
    return AgentRequest(
        request_id=f"schedule:{schedule.id}:{fire_ms}", created_at=at, agent_id=agent_id,
        kind=Kind.SCHEDULED_AUDIT, priority=schedule.priority,
        dedupe_key=firing_key(schedule.id, fire_ms), source=SCHEDULE_SOURCE,
        payload={**schedule.payload, "schedule": schedule.id, "fireAt": at.isoformat()})


def manual_request(agent_id: str, schedule: Schedule, now_ms: int) -> AgentRequest:
    """The request of a "run now" of the schedule (its ``last_fire`` does not move)."""
    at = datetime.fromtimestamp(now_ms / 1000, UTC)
    return AgentRequest(
        request_id=f"schedule:{schedule.id}:manual:{now_ms}", created_at=at,
        agent_id=agent_id, kind=Kind.SCHEDULED_AUDIT, priority=schedule.priority,
        dedupe_key=f"{SCHEDULE_SOURCE}:{schedule.id}:manual:{now_ms}", source=MANUAL_SOURCE,
        payload={**schedule.payload, "schedule": schedule.id, "fireAt": at.isoformat(),
                 "manual": True})


def next_fire_at(state: AgentState, schedule_id: str, now: int) -> int | None:
    """When the schedule fires next as things stand (None: paused), for people to read."""
    entry = state.schedules[schedule_id]
    if entry.schedule.paused:
        return None
    step = plan(entry.schedule, entry.fired_through, entry.since, now)
    return step.wake if step.fire is None else now


class Scheduler:
    """Fires the schedules of the agents the engine holds, on ``clock``.

    ``states`` gives those agents' states (read, never changed here, and taken a step at a
    time across turns of the loop: an iterator over a copy, not a live view; an agent the engine
    cannot write for now is in it too: its firings fail and are tried again, and it keeps
    its place, so nothing it misses meanwhile counts as missed while down); ``fire`` submits
    a firing (through the lanes, committed when it returns); ``adopt`` is called once for
    each agent the first time it is seen (the config file's schedules are applied there).
    """

    def __init__(self, clock: Clock, states: Callable[[], Iterable[AgentState]],
                 fire: Callable[[AgentRequest], Awaitable[object]],
                 adopt: Callable[[AgentState], Awaitable[None]] | None = None) -> None:
        self.clock = clock
        self._states = states
        self._fire = fire
        self._adopt = adopt
        self._floors: dict[tuple[str, str], int] = {}
        """When this process took each schedule up (for catch-up)."""
        self._plans: dict[tuple[str, str], tuple[object, int, int, int]] = {}
        """What each schedule's last plan was for, and when it said to look again: a
        schedule whose plan would not change is not planned again before then."""
        self._seen: set[str] = set()
        self._wake = asyncio.Event()
        self._marks: dict[tuple[str, str], int] = {}
        """Up to when each schedule's fire times are accounted for (fired or missed)."""
        self.fired = 0
        """Firings submitted by this process (a counter, for ``/metrics``)."""
        self.late = 0
        """Of those, firings that went out more than `LATE_MS` after their fire time."""
        self.missed = 0
        """Fire times that never fired and never will: passed while nobody ran the schedule
        (skipped by its catch-up, or all but the latest with ``once``), or passed over by a
        late firing (which fires once, for the latest time due)."""
        self.passes = 0
        """Times it looked at every schedule (for tests that wait for a look)."""

    def poke(self) -> None:
        """Look at the schedules again now (one changed)."""
        self._wake.set()

    async def run(self) -> None:
        """Fire schedules as they fall due, until cancelled."""
        while True:
            self._wake.clear()
            wake = await self.step()
            delay = max(0, min(wake, self.clock.now_ms() + RESCAN_MS) - self.clock.now_ms())
            await sleep_or(self.clock, delay, self._wake)

    async def step(self) -> int:
        """Fire what is due now; the time to look again."""
        now = self.clock.now_ms()
        wake = now + RESCAN_MS
        floors: dict[tuple[str, str], int] = {}
        marks: dict[tuple[str, str], int] = {}
        plans: dict[tuple[str, str], tuple[object, int, int, int]] = {}
        states: list[AgentState] = []
        seen, kept = self._seen, 0  # (kept: the agents of this pass in ``seen``)
        # (``states`` is read as it is looked at: gathering a big desk's states at once held
        # the loop for 2 ms at 10,000 agents)
        for index, state in enumerate(self._states()):
            if index and not index % SCAN_STEP:
                await asyncio.sleep(0)  # a big desk's pass takes turns (a stop comes first)
            states.append(state)
            agent_id = state.agent_id
            if agent_id not in seen:
                seen.add(agent_id)
                if self._adopt is not None:
                    try:
                        await self._adopt(state)
                    except GatewayError as error:
                        seen.discard(agent_id)
                        log.warning("schedules of %s not applied yet: %s", agent_id, error)
                        continue
            kept += 1
        for index, state in enumerate(states):
            if index and not index % SCAN_STEP:
                await asyncio.sleep(0)
            if not state.schedules:
                continue
            for schedule_id, entry in list(state.schedules.items()):
                key = (state.agent_id, schedule_id)
                floor = floors[key] = self._floors.get(key, now)
                if state.schedules.get(schedule_id) is not entry or entry.schedule.paused:
                    continue  # (removed, replaced or paused while this pass awaited a firing)
                through = entry.fired_through
                mark = marks[key] = max(self._marks.get(key, through), through)
                cached = self._plans.get(key)
                if cached is not None and cached[:3] == (entry.schedule, through, floor) \
                        and cached[3] > now:
                    plans[key] = cached
                    wake = min(wake, cached[3])
                    continue
                step = plan(entry.schedule, through, floor, now)
                if step.fire is not None:
                    request = firing_request(state.agent_id, entry.schedule, step.fire)
                    try:
                        await self._fire(request)
                    except GatewayError as error:
                        log.warning("schedule %s of %s did not fire for %s: %s", schedule_id,
                                    state.agent_id, request.created_at.isoformat(), error)
                        wake = min(wake, now + RETRY_MS)
                        continue
                    self.fired += 1
                    if now - step.fire > LATE_MS:
                        self.late += 1
                    self.missed += count_between(entry.schedule, mark, step.fire)
                    mark = marks[key] = max(mark, step.fire)
                    through = max(entry.fired_through, step.fire)
                    step = plan(entry.schedule, through, floor, now)
                if step.fire is None and mark < floor - 1:
                    # Nothing is due: the times up to now that did not fire (before the
                    # floor, all of them) were skipped by the catch-up.
                    self.missed += count_between(entry.schedule, mark, now + 1)
                    marks[key] = now
                plans[key] = (entry.schedule, through, floor, step.wake)
                wake = min(wake, step.wake)
        self._floors = floors  # (an agent handed over and back is taken up afresh)
        self._marks = marks
        self._plans = plans
        if kept != len(seen):  # agents seen before are gone (intersecting 10,000 took 1 ms)
            seen &= {state.agent_id for state in states}
        self.passes += 1
        return wake
