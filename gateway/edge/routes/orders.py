"""The blotter: orders, fills, cancels, rejections and positions."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.edge.auth import Principal
from gateway.edge.http import Routes
from gateway.reads.blotter import BlotterQuery, blotter_view, parse_query
from gateway.reads.pnl import pnl_view


class OrderRoutes(Routes):
    """The blotter: orders, fills, cancels, rejections and positions."""

    async def orders(self, request: Request) -> Response:
        """The desk's blotter: open orders, fills, cancels, rejections and positions of every
        agent in the token's scope (or the one ``agent``), from the log; ``symbol`` keeps
        one symbol, ``limit`` (1-1000, default 100) bounds each history list."""
        query = parse_query(request.query_params, ("agent", "symbol", "limit"))
        return await self._blotter(self._in_scope(request, query.agent), query)

    async def agent_orders(self, request: Request) -> Response:
        """One agent's blotter (as `orders` for that agent; ``symbol``, ``limit``)."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return await self._blotter([agent_id], parse_query(request.query_params,
                                                           ("symbol", "limit")))

    async def pnl(self, request: Request) -> Response:
        """P&L of every agent in the token's scope (or the one ``agent``) and of the desk:
        positions from the log marked to the feed's latest prices (docs/protocol.md)."""
        query = parse_query(request.query_params, ("agent",))
        agents = self._in_scope(request, query.agent)
        blotters = await self.blotters.blotters(self.log, self.engine.reader, agents)
        view = pnl_view(blotters, self.engine.runs.toolbox.market, self.engine.clock.now_ms())
        return JSONResponse(view.model_dump(mode="json"))

    async def approvals(self, request: Request) -> Response:
        """The orders waiting for a human's approval, of every agent in the token's scope
        (or the one ``agent``), oldest first; decide one with ``POST
        /api/agents/{id}/control`` ``{"action": "approve" | "reject", "approvalId"}``."""
        principal = self._principal(request)
        return JSONResponse(self.approvals_of(principal, request.query_params.get("agent")))

    def approvals_of(self, principal: Principal, agent: str | None) -> dict[str, Any]:
        """The orders waiting for approval that ``principal`` may see (of ``agent`` only,
        if given), oldest first (HTTP and MCP)."""
        agents = self._scope_of(principal, agent)
        now = self.engine.clock.now_ms()
        waiting = [(agent_id, pending) for agent_id in agents
                   for pending in self.engine.state(agent_id).approvals.values()]
        waiting.sort(key=lambda item: (item[1].expires_at, item[1].approval_id))
        return {"approvals": [
            {"agentId": agent_id, "approvalId": p.approval_id, "orderId": p.order_id,
             "runId": p.run_id, "order": p.intent.model_dump(mode="json", by_alias=True),
             "notional": p.notional, "expiresAt": p.expires_at,
             "expiresInMs": max(0, p.expires_at - now)} for agent_id, p in waiting]}

    def _in_scope(self, request: Request, agent: str | None) -> list[str]:
        """The one ``agent`` (if the token may read it and it exists), else every agent the
        token may see."""
        return self._scope_of(self._principal(request), agent)

    def _scope_of(self, principal: Principal, agent: str | None) -> list[str]:
        principal.check_read()
        if agent is not None:
            principal.check_read(agent)
            self.engine.state(agent)  # UnknownAgent if it does not exist
            return [agent]
        return principal.visible(self.engine.agent_ids)

    async def _blotter(self, agents: list[str], query: BlotterQuery) -> Response:
        blotters = await self.blotters.blotters(self.log, self.engine.reader, agents)
        view = blotter_view(blotters, self.engine.clock.now_ms(), query)
        return JSONResponse(view.model_dump(mode="json"))
