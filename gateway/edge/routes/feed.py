"""Feed health: connectors, each symbol's latest data, and pausing the hook rules."""

from __future__ import annotations

import logging

from pydantic import Field, StrictBool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.edge.http import Routes
from gateway.errors import Forbidden
from lanes.requests import WireModel

controls = logging.getLogger("gateway.controls")


class HooksBody(WireModel):
    """Body of ``POST /api/feed/hooks``."""

    paused: StrictBool
    reason: str | None = Field(default=None, max_length=500)


class FeedRoutes(Routes):
    """Feed health and the hook rules' pause."""

    async def feed(self, request: Request) -> Response:
        """Each connector's latest status, each symbol's last data and its age (stale past
        ``staleMs``), warnings in words, and whether hook rules are paused (viewer and up)."""
        self._principal(request).check_read()
        return JSONResponse(self.service.feed.view(self.engine.clock.now_ms()))

    async def feed_hooks(self, request: Request) -> Response:
        """Pause or resume the evaluation of hook rules (control or admin, every agent in
        scope: the rules are the desk's). While paused, market events still reach prices,
        the paper broker and feed health; the requests the rules would send are counted,
        not sent. Logged at WARNING (pause) or INFO (resume), with who and why."""
        principal = self._principal(request)
        if principal.role.value not in ("control", "admin"):
            raise Forbidden(f"a {principal.role.value} token cannot pause hook rules")
        if principal.agents is not None:
            raise Forbidden("a token scoped to some agents cannot pause the desk's hook rules")
        body = await self._body(request, HooksBody)
        feed = self.service.feed
        changed = feed.set_hooks(body.paused, principal.name, self.engine.clock.now_ms(),
                                 body.reason)
        if changed:
            controls.log(logging.WARNING if body.paused else logging.INFO,
                         "hook rules %s by %s%s", "paused" if body.paused else "resumed",
                         principal.name, f": {body.reason}" if body.reason else "",
                         extra={"principal": principal.name})
        view = feed.view(self.engine.clock.now_ms())
        return JSONResponse({"changed": changed, "hooks": view["hooks"]})
