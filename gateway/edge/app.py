"""The Starlette app: every route of the edge in one list, wired to its handler (the HTTP
API in `gateway.edge.routes`, WebSocket sessions in `gateway.edge.sessions`, the cluster's
internal routes, the panel's static files), with one set of exception handlers.

Everything at the edge is translation: wire frames and HTTP bodies in, engine calls, answers
out. Nothing is decided here that `lanes` decides.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from gateway.base.roles import Role
from gateway.edge.internal import internal_routes
from gateway.edge.mcp import Mcp
from gateway.edge.routes import Api
from gateway.edge.service import Service
from gateway.edge.sessions import partial_ws
from gateway.edge.workers import worker_ws


def _web() -> Path:
    """The panel's files: ``web/`` beside the packages in a checkout, or ``gateway/web``
    inside an installed wheel (which carries it there)."""
    checkout = Path(__file__).resolve().parents[2] / "web"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("gateway") / "web"))


WEB = _web()


def _with_mcp(mcp: Mcp, lifespan: Any) -> Any:
    """The app's lifespan: ``lifespan`` (if any) inside the MCP session manager's."""
    @contextlib.asynccontextmanager
    async def both(app: Starlette) -> AsyncIterator[None]:
        async with mcp.running():
            if lifespan is None:
                yield
            else:
                async with lifespan(app):
                    yield
    return both


def create_app(service: Service, lifespan: Any = None) -> Starlette:
    """The ASGI app over a started (or, with ``lifespan``, to-be-started) engine."""
    api = Api(service)
    mcp = Mcp(service, api)
    routes = [
        Route("/healthz", api.healthz),
        Route("/livez", api.livez),
        Route("/readyz", api.readyz),
        Route("/metrics", api.metrics),
        Route("/openapi.json", api.openapi),
        Route("/api/agents", api.agents),
        Route("/api/agents/{agent_id}", api.agent),
        Route("/api/agents/{agent_id}/queue", api.queue),
        Route("/api/agents/{agent_id}/requests", api.submit, methods=["POST"]),
        Route("/api/agents/{agent_id}/control", api.control, methods=["POST"]),
        Route("/api/agents/{agent_id}/queue/clear", api.clear, methods=["POST"]),
        Route("/api/agents/{agent_id}/release", api.release, methods=["POST"]),
        Route("/api/agents/{agent_id}/runs/{run_id}/abort", api.abort, methods=["POST"]),
        Route("/api/agents/{agent_id}/config", api.configure, methods=["POST"]),
        Route("/api/agents/{agent_id}/schedules", api.schedules),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}", api.put_schedule,
              methods=["PUT"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}", api.delete_schedule,
              methods=["DELETE"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}/pause", api.pause_schedule,
              methods=["POST"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}/resume", api.resume_schedule,
              methods=["POST"]),
        Route("/api/agents/{agent_id}/schedules/{schedule_id}/run", api.run_schedule,
              methods=["POST"]),
        Route("/api/desk/kill", api.kill_scope),
        Route("/api/desk/kill", api.kill, methods=["POST"]),
        Route("/api/events", api.events),
        Route("/api/events/{position:int}", api.event_cause),
        Route("/api/event-types", api.event_types),
        Route("/api/agents/{agent_id}/events", api.agent_events),
        Route("/api/agents/{agent_id}/calls", api.calls),
        Route("/api/replay", api.replay),
        # time travel as a story (gateway.story)
        Route("/api/agents/{agent_id}/story", api.story),
        Route("/api/agents/{agent_id}/story/find", api.story_find),
        Route("/api/agents/{agent_id}/moment", api.moment),
        Route("/api/agents/{agent_id}/diff", api.diff),
        Route("/api/providers", api.providers),
        Route("/api/desk/budget", api.desk_budget),
        Route("/api/feed", api.feed),
        Route("/api/alerts", api.alerts),
        Route("/api/feed/hooks", api.feed_hooks, methods=["POST"]),
        Route("/api/providers/{name}", api.provider),
        Route("/api/providers/{name}/limits", api.provider_limits, methods=["POST"]),
        # Histories for people, from the log (gateway.history): runs and chart series.
        Route("/api/agents/{agent_id}/runs", api.runs),
        Route("/api/charts", api.charts),
        Route("/api/capacity", api.capacity),
        Route("/api/orders", api.orders),
        Route("/api/approvals", api.approvals),
        Route("/api/pnl", api.pnl),
        Route("/api/agents/{agent_id}/orders", api.agent_orders),
        # Drill-down (gateway.reads.drill): an order's life, a run in full, what-if from here.
        Route("/api/agents/{agent_id}/orders/{order_id}", api.order_life),
        Route("/api/agents/{agent_id}/runs/{run_id}", api.run_detail),
        Route("/api/agents/{agent_id}/whatif", api.whatif, methods=["POST"]),
        Route("/api/market", api.market),
        Route("/mcp", mcp),  # the same tools over MCP (gateway.edge.mcp)
        WebSocketRoute("/ws/feed", partial_ws(service, "feed")),
        WebSocketRoute("/ws/control", partial_ws(service, "control")),
        WebSocketRoute("/ws/worker", worker_ws(service)),
        *internal_routes(service),
    ]
    if WEB.is_dir():
        routes.append(Mount("/", StaticFiles(directory=WEB, html=True), name="web"))
    # A browser app on one of the allowed origins may call the API (preflights answered).
    cors = Middleware(CORSMiddleware, allow_origins=sorted(service.allowed_origins),
                      allow_methods=["GET", "POST", "PUT", "DELETE"],
                      allow_headers=["Authorization", "Content-Type"], max_age=600)
    return Starlette(routes=routes, lifespan=_with_mcp(mcp, lifespan),
                     exception_handlers=api.exception_handlers(),
                     middleware=[cors] if service.allowed_origins else [])


__all__ = ["Role", "Service", "create_app"]
