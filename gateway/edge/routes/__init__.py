"""The HTTP API: each group of routes in a module of its own, `Api` all of them together
(`gateway.edge.app` lists the routes)."""

from __future__ import annotations

from gateway.edge.routes.agents import AgentRoutes
from gateway.edge.routes.capacity import CapacityRoutes
from gateway.edge.routes.desk import DeskRoutes
from gateway.edge.routes.drill import DrillRoutes
from gateway.edge.routes.feed import FeedRoutes
from gateway.edge.routes.log import LogRoutes
from gateway.edge.routes.observe import ObserveRoutes
from gateway.edge.routes.orders import OrderRoutes
from gateway.edge.routes.providers import ProviderRoutes
from gateway.edge.routes.schedules import ScheduleRoutes
from gateway.edge.routes.story import StoryRoutes


class Api(AgentRoutes, DeskRoutes, ScheduleRoutes, LogRoutes, StoryRoutes, OrderRoutes,
          ProviderRoutes, ObserveRoutes, FeedRoutes, CapacityRoutes, DrillRoutes):
    """Every route of the HTTP API: one method each."""


__all__ = ["Api"]
