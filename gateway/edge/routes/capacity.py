"""Capacity over time: queue depth, provider gate waits and use of limits, run latency, from
the log (`gateway.reads.capacity`)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.http import Routes, _int_param, _json
from gateway.edge.service import MAX_CHART_AGENTS
from gateway.errors import BadFrame, UnknownProvider
from gateway.reads.capacity_view import Window, capacity_answer

PARAMS = frozenset({"from", "to", "step", "agent", "provider", "busiest"})
"""The query parameters ``GET /api/capacity`` knows (any other is refused by name)."""
MAX_STEPS = 1_000
"""Steps in one answer."""
MAX_SPAN_MS = 26 * 3_600_000
"""The longest window (the fold keeps no more: `gateway.reads.capacity.RETAIN_MS`)."""
DEFAULT_SPAN_MS = 3_600_000
DEFAULT_STEPS = 120
MAX_GATES = 20
"""Provider gates in one answer."""
BUSIEST = 5
"""Agents shown by default: the busiest of the window."""


class CapacityRoutes(Routes):
    """Capacity over time."""

    async def capacity(self, request: Request) -> Response:
        """The desk's capacity over [``from``, ``to``) (ms since the epoch, whole seconds;
        default the last hour) in steps of ``step`` ms (whole seconds; default 120 steps,
        at most `MAX_STEPS`): pending requests and run latency (p50, p95) for the desk (the
        agents in the token's scope) and for the ``agent``s named (comma-separated, at most
        20; default the ``busiest`` few), and each ``provider`` gate's waiting requests,
        waits for a slot (p50, p95) and use of its requests-per-minute and token limits
        (default every gate, at most `MAX_GATES`), with the marks in the window (stops,
        pauses, resumes, holds, limit changes, the breaker)."""
        principal = self._principal(request)
        principal.check_read()
        query = request.query_params
        window = self._window(query)
        named = _names(query, "agent", MAX_CHART_AGENTS)
        for agent_id in named or ():
            principal.check_read(agent_id)
            self.engine.state(agent_id)  # UnknownAgent if it does not exist
        busiest = _int_param(query, "busiest", BUSIEST)
        if busiest > MAX_CHART_AGENTS:
            raise BadFrame("invalid", f"busiest is at most {MAX_CHART_AGENTS}", field="busiest")
        gates = self.engine.gates
        providers = _names(query, "provider", MAX_GATES)
        for name in providers or ():
            if name not in gates:
                raise UnknownProvider(name)
        caught = await self.capacity_book.caught_up(self.log, self.engine.reader.replacements)
        limits = {name: (gate.state.limits.requests_per_minute,
                         gate.state.limits.input_tokens_per_minute,
                         gate.state.limits.output_tokens_per_minute)
                  for name, gate in gates.items()}
        answer = capacity_answer(
            caught.fold, window, desk=principal.visible(self.engine.agent_ids),
            agents=named, busiest=busiest, gates=providers or sorted(gates)[:MAX_GATES],
            limits=limits)
        answer["behind"] = caught.behind
        return _json(answer)

    def _window(self, query: Mapping[str, str]) -> Window:
        """The window asked for, checked: whole seconds, ``from`` before ``to``, at most
        `MAX_SPAN_MS` long and `MAX_STEPS` steps."""
        unknown = sorted(set(query) - PARAMS)
        if unknown:
            raise BadFrame("invalid", f"unknown parameter {unknown[0]!r}; the parameters are "
                           f"{', '.join(sorted(PARAMS))}", field=unknown[0])
        now = self.engine.clock.now_ms()
        end = _int_param(query, "to", -(-now // 1000) * 1000)
        start = _int_param(query, "from", max(0, end - DEFAULT_SPAN_MS) // 1000 * 1000)
        if start % 1000:
            raise BadFrame("invalid", f"from must be a whole second (ms, a multiple of 1000), "
                           f"got {start}", field="from")
        if start >= end:
            raise BadFrame("invalid", "from must be before to", field="from")
        if end - start > MAX_SPAN_MS:
            raise BadFrame("invalid", f"from..to is at most {MAX_SPAN_MS // 3_600_000} hours",
                           field="from")
        step = _int_param(query, "step", max(1, -(-(end - start) // DEFAULT_STEPS // 1000))
                          * 1000)
        if step < 1000 or step % 1000:
            raise BadFrame("invalid", f"step must be a whole number of seconds (ms, a multiple "
                           f"of 1000, at least 1000), got {step}", field="step")
        count = -(-(end - start) // step)
        if count > MAX_STEPS:
            raise BadFrame("invalid", f"from..to holds {count} steps, more than {MAX_STEPS}; "
                           "make step larger or the window shorter", field="step")
        return Window(start, step, count)


def _names(query: Mapping[str, str], name: str, most: int) -> list[str] | None:
    """A comma-separated list of names (None: not given), at most ``most``."""
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    names = list(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    if not names:
        raise BadFrame("invalid", f"{name} names nothing", field=name)
    if len(names) > most:
        raise BadFrame("invalid", f"at most {most} names in {name}", field=name)
    return names
