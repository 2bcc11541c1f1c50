"""Drill-down: an order's life, a run in full, and what-if from a moment of time travel."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.http import Routes, _json, _position_param
from gateway.errors import BadFrame
from gateway.reads.drill import OrderLifeJson, RunDetailJson, order_life, run_detail
from gateway.reads.history import first_version
from gateway.reads.story import answer
from gateway.reads.whatif import MAX_WHATIF_EVENTS, WhatIfBody, WhatIfs


class DrillRoutes(Routes):
    """Drill-down: an order's life, a run in full, and what-if from a moment."""

    whatifs = WhatIfs()

    def _readable(self, request: Request) -> tuple[str, int]:
        """The path's agent (readable by the caller) and its stream's version now."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return agent_id, self.engine.state(agent_id).version

    async def order_life(self, request: Request) -> Response:
        """One order's life from the log: placed, waiting for approval, each broker report,
        fills, cancels, how it closed (each with the input that caused it), and its run."""
        agent_id, top = self._readable(request)
        order_id = str(request.path_params["order_id"])
        body = await order_life(self.log, self.engine.reader, agent_id, order_id, top,
                                self.words)
        return _json(answer(OrderLifeJson, body))

    async def run_detail(self, request: Request) -> Response:
        """One run in full from the log: the requests it started with (as the model read
        them), each model call with its text and tool calls, the steers it took, its answer,
        orders and outcome."""
        agent_id, top = self._readable(request)
        run_id = str(request.path_params["run_id"])
        body = await run_detail(self.log, self.engine.reader, agent_id, run_id, top)
        return _json(answer(RunDetailJson, body))

    async def whatif(self, request: Request) -> Response:
        """What-if from a log position: the agent as it was there, then its recorded inputs
        re-run under ``config`` (``gateway whatif``'s model), recorded against what-if."""
        agent_id, top = self._readable(request)
        body: WhatIfBody = await self._body(request, WhatIfBody)
        last = await self.log.last_position()
        position = _position_param({"position": str(body.position)}, "position", last, last)
        after = await first_version(self.log, agent_id, top, lambda r: r.position > position)
        if top - after + 1 > MAX_WHATIF_EVENTS:
            raise BadFrame("invalid", f"more than {MAX_WHATIF_EVENTS:,} events of {agent_id} "
                           "follow this position: pick a later one (or run gateway whatif on "
                           "the log)", field="position")
        return _json(await self.whatifs.run(
            self.log, self.log.url, self.engine.reader, agent_id, position,
            after - 1, top, body.config, self.engine.clock.now_ms(),
            lambda: self._replayed(agent_id, position)))
