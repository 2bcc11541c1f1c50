"""An agent's scheduled audits."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.answers import ack_frame
from gateway.edge.auth import Principal
from gateway.edge.http import Routes, _json
from gateway.edge.views import schedule_view, schedules_view
from gateway.errors import BadFrame
from lanes import InvalidRequest
from lanes.schedules import Schedule


class ScheduleRoutes(Routes):
    """An agent's scheduled audits."""

    async def schedules(self, request: Request) -> Response:
        """An agent's schedules, with when each fired last and fires next."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return _json({"schedules": schedules_view(self.engine.state(agent_id),
                                                  self.engine.clock.now_ms())})

    async def put_schedule(self, request: Request) -> Response:
        """Add or replace a schedule (admin); recorded as `ScheduleChanged`, lasts until
        removed (one the config file defines goes back to the file's at a start)."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        raw = await self._json_body(request)
        if not isinstance(raw, dict):
            raise BadFrame("invalid", "the body must be a JSON object (a schedule)")
        data = {"id": schedule_id, **raw}
        try:
            schedule = Schedule.model_validate(data)
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None
        changed = await self.engine.schedules.set(agent_id, schedule_id, schedule,
                                                 principal.name)
        return self._schedule_answer(agent_id, schedule_id, changed)

    async def delete_schedule(self, request: Request) -> Response:
        """Remove a schedule (admin)."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        await self.engine.schedules.set(agent_id, schedule_id, None, principal.name)
        return _json({"removed": schedule_id})

    async def pause_schedule(self, request: Request) -> Response:
        """Pause a schedule (admin): it fires no more until resumed, and catches nothing
        up then."""
        return await self._set_paused(request, True)

    async def resume_schedule(self, request: Request) -> Response:
        """Resume a paused schedule (admin): it fires from its next time after now."""
        return await self._set_paused(request, False)

    async def _set_paused(self, request: Request, paused: bool) -> Response:
        agent_id, schedule_id, principal = self._schedule_call(request, admin=True)
        schedule = self.engine.schedules.get(agent_id, schedule_id)
        changed = await self.engine.schedules.set(
            agent_id, schedule_id, schedule.model_copy(update={"paused": paused}),
            principal.name)
        return self._schedule_answer(agent_id, schedule_id, changed)

    async def run_schedule(self, request: Request) -> Response:
        """Fire a schedule now (an operator): a ``scheduled_audit`` request like its
        firings, marked ``manual``; its next automatic firing stays as it was."""
        agent_id, schedule_id, principal = self._schedule_call(request, admin=False)
        return _json(ack_frame(await self.engine.schedules.run(agent_id, schedule_id,
                                                              principal.name)))

    def _schedule_call(self, request: Request, *, admin: bool) -> tuple[str, str, Principal]:
        agent_id = self._agent_id(request)
        principal = self._principal(request)
        if admin:
            principal.check_admin()
        else:
            principal.check_operate(agent_id)
        return agent_id, str(request.path_params["schedule_id"]), principal

    def _schedule_answer(self, agent_id: str, schedule_id: str, changed: bool) -> Response:
        view = schedule_view(self.engine.state(agent_id), schedule_id,
                             self.engine.clock.now_ms())
        return _json({"changed": changed, "schedule": view})
