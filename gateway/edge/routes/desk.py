"""The desk: one kill of every agent in the token's scope."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.desk import kill_answer, kill_desk, kill_scope
from gateway.edge.http import Routes, _json
from gateway.edge.protocol import DeskKillBody, DeskScope


class DeskRoutes(Routes):
    """The desk: one kill of every agent in the token's scope."""

    async def kill_scope(self, request: Request) -> Response:
        """The agents a desk kill by this token would halt (what a confirm names)."""
        principal = self._principal(request)
        principal.check_control()
        return _json(DeskScope(agents=kill_scope(self.service, principal),
                               scoped=principal.agents is not None))

    async def kill(self, request: Request) -> Response:
        """Halt every agent in the token's scope and cancel their open orders: one
        emergency stop each, all at once, and one ``DeskKilled`` event with each agent's
        effect; answered after its commit."""
        principal = self._principal(request)
        principal.check_control()  # (before the body: a viewer learns nothing from it)
        body = await self._kill_body(request)
        return _json(kill_answer(await kill_desk(self.service, principal, body)))

    async def _kill_body(self, request: Request) -> DeskKillBody:
        raw = await request.body()
        if not raw.strip():
            return DeskKillBody()
        body: DeskKillBody = await self._body(request, DeskKillBody)
        return body
