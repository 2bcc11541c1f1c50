"""Feed health: connectors, each symbol's latest data, and pausing the hook rules."""

from __future__ import annotations

import logging

from pydantic import Field, StrictBool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.edge.alerting import merged
from gateway.edge.http import Routes
from gateway.errors import BadFrame, Forbidden
from gateway.reads.alerts import KINDS
from lanes.requests import WireModel

controls = logging.getLogger("gateway.controls")


class HooksBody(WireModel):
    """Body of ``POST /api/feed/hooks``."""

    paused: StrictBool
    reason: str | None = Field(default=None, max_length=500)


class MarketJson(WireModel):
    """``GET /api/market``: each symbol's tick (its smallest price step, ``[market]`` in the
    config), by which a client rounds the prices it shows."""

    tick: float
    """The tick of a symbol not listed."""
    ticks: dict[str, float]
    """The tick of each symbol the config lists or the feed has sent."""


class FeedRoutes(Routes):
    """Feed health and the hook rules' pause."""

    async def market(self, request: Request) -> Response:
        """Each symbol's tick (viewer and up)."""
        self._principal(request).check_read()
        book = self.engine.runs.toolbox.market
        ticks = {symbol: book.tick_of(symbol) for symbol in book.symbols()}
        return JSONResponse(MarketJson(tick=book.tick, ticks={**ticks, **book.ticks})
                            .model_dump(mode="json"))

    async def feed(self, request: Request) -> Response:
        """Each connector's latest status, each symbol's last data and its age (stale past
        ``staleMs``), warnings in words, and whether hook rules are paused (viewer and up)."""
        self._principal(request).check_read()
        return JSONResponse(self.service.feed.view(self.engine.clock.now_ms()))

    async def alerts(self, request: Request) -> Response:
        """The newest alerts (``limit``, 1-500, default 100; ``kind`` keeps one kind), newest
        first: those of the log's last 50,000 events (agents in the token's scope; a
        provider's and the desk's for unscoped tokens) and the feed's since the start."""
        principal = self._principal(request)
        principal.check_read()
        query = request.query_params
        for name in query:
            if name not in ("limit", "kind"):
                raise BadFrame("invalid", f"unknown parameter {name[:40]!r}; this route takes "
                               "limit, kind", field=name)
        raw = query.get("limit") or "100"
        if not raw.isdecimal() or not 1 <= int(raw) <= 500:
            raise BadFrame("invalid", f"limit must be an integer from 1 to 500, got "
                           f"{raw[:40]!r}", field="limit")
        kind = query.get("kind")
        if kind is not None and kind not in KINDS:
            raise BadFrame("invalid", f"kind must be one of {', '.join(KINDS)}", field="kind")
        kinds = KINDS if kind is None else (kind,)
        agents = None if principal.agents is None else principal.visible(
            self.engine.agent_ids)
        limit = int(raw)
        from_log = await self.alerts_read.newest(self.log, limit, kinds, agents)
        alerter = self.service.alerter
        recent = [] if alerter is None or agents is not None else [
            a for a in alerter.recent if a.kind in kinds]
        return JSONResponse({"alerts": [a.json() for a in merged(from_log, recent, limit)],
                             "rules": sorted(alerter.rules) if alerter else list(KINDS)})

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
