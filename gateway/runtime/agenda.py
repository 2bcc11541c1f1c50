"""An engine's schedules: defined, removed, fired by hand, and fired on time by a `Scheduler`.

The config file's schedules of an agent are applied when the engine first holds it (those it
changed replaced, a pause made at runtime kept, those it no longer has removed); the
`Scheduler` then fires the schedules of every agent the engine holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.base.clock import Clock
from gateway.errors import BadFrame
from gateway.runtime.acks import Ack
from gateway.runtime.schedules import Scheduler, check_count, manual_request
from gateway.runtime.schedules import check as check_schedule
from lanes import AgentRequest, AgentState
from lanes.events import ScheduleChanged
from lanes.schedules import FILE_PRINCIPAL, SCHEDULER, Schedule

if TYPE_CHECKING:
    from gateway.runtime.engine import Engine


class Agenda:
    """The schedules of an engine's agents (``file``: the config file's, per agent)."""

    def __init__(self, engine: Engine, clock: Clock, file: Mapping[str, Sequence[Schedule]],
                 states: Callable[[], Iterable[AgentState]]) -> None:
        self._engine = engine
        self._file = {agent: tuple(found) for agent, found in file.items()}
        for found in self._file.values():
            for schedule in found:
                check_schedule(schedule)
        self.scheduler = Scheduler(clock, states, self._fire, self._apply_file)
        """Fires the schedules of the agents the engine holds."""

    async def set(self, agent_id: str, schedule_id: str, schedule: Schedule | None,
                  principal: str) -> bool:
        """Define (add, replace, pause, resume) or remove (``schedule`` None) one of an
        agent's schedules, after its commit; False if nothing changed. `BadFrame` for a
        schedule that is not one (time zone, cron, too many) or one to remove that is not."""
        engine = self._engine
        agent = engine.agent(agent_id)
        if schedule is None:
            self.get(agent_id, schedule_id)  # (`BadFrame` if there is none to remove)
        else:
            if schedule.id != schedule_id:
                raise BadFrame("invalid", f"the schedule's id {schedule.id!r} is not "
                               f"{schedule_id!r}, the one named in the path", field="id")
            check_schedule(schedule)
            check_count(agent.state, schedule_id)
        decisions = await engine.report(agent_id, ScheduleChanged(
            at=engine.clock.now_ms(), schedule_id=schedule_id, schedule=schedule,
            principal=principal))
        self.scheduler.poke()
        return bool(decisions)

    def get(self, agent_id: str, schedule_id: str) -> Schedule:
        """One of an agent's schedules (`BadFrame` ``not_found`` if it has none by that id)."""
        entry = self._engine.state(agent_id).schedules.get(schedule_id)
        if entry is None:
            raise BadFrame("not_found", f"agent {agent_id!r} has no schedule {schedule_id!r}; "
                           f"list them with GET /api/agents/{agent_id}")
        return entry.schedule

    async def run(self, agent_id: str, schedule_id: str, principal: str) -> Ack:
        """Fire a schedule now, by hand (its next automatic firing stays as it was)."""
        engine = self._engine
        request = manual_request(agent_id, self.get(agent_id, schedule_id),
                                 engine.clock.now_ms())
        return await engine.submit(request, principal)

    async def _fire(self, request: AgentRequest) -> None:
        await self._engine.submit(request, SCHEDULER)

    async def _apply_file(self, state: AgentState) -> None:
        """The config file's schedules of an agent the engine holds now: those it changed
        are applied (a pause made at runtime stays), those it no longer has removed."""
        agent_id = state.agent_id
        wanted = {schedule.id: schedule for schedule in self._file.get(agent_id, ())}
        for schedule_id, entry in list(state.schedules.items()):
            if entry.from_file and schedule_id not in wanted:
                await self.set(agent_id, schedule_id, None, FILE_PRINCIPAL)
        for schedule_id, schedule in wanted.items():
            stored = state.schedules.get(schedule_id)
            if stored is None or stored.schedule.timing() != schedule.timing():
                if stored is not None:
                    schedule = schedule.model_copy(update={"paused": stored.schedule.paused})
                await self.set(agent_id, schedule_id, schedule, FILE_PRINCIPAL)
