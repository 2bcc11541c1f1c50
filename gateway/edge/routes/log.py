"""The event log: pages, search, an event's cause, replay, run history and charts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.auth import Principal
from gateway.edge.http import Routes, _input_types, _int_param, _json
from gateway.edge.service import CAUSE_PAGE, MAX_CAUSE_DECISIONS, MAX_CHART_AGENTS, MAX_SEARCH_TEXT
from gateway.edge.views import agent_summary, event_json, queue_view
from gateway.errors import BadFrame
from gateway.reads.history import (
    MAX_BUCKETS,
    agent_series,
    event_matcher,
    run_history,
    search_back,
)
from lanes.events import DECISION_TYPES, INPUT_TYPES
from lanes.gate.events import GATE_DECISION_TYPES, GATE_INPUT_TYPES
from lanes.requests import MAX_INT
from store.port import RecordedEvent


class LogRoutes(Routes):
    """The event log: pages, search, an event's cause, replay, run history and charts."""

    async def events(self, request: Request) -> Response:
        """The log, paged: ``after`` (position), ``agent``, ``type``, ``limit`` (<= 1000).
        With ``q`` (text) or ``before`` (position): a search back over the whole log,
        newest first (`search_events`)."""
        principal = self._principal(request)
        principal.check_read()
        query = request.query_params
        after = _int_param(query, "after", 0)
        limit = min(max(_int_param(query, "limit", 100), 1), 1000)
        agent, kind = query.get("agent") or None, query.get("type") or None
        if agent is not None:
            principal.check_read(agent)
        if "q" in query or "before" in query:
            if "after" in query:
                raise BadFrame("invalid", "give after (read forward) or before/q (search "
                               "back), not both", field="after")
            return await self.search_events(principal, query, limit, agent, kind)
        found: list[dict[str, Any]] = []
        cursor, scanned = after, 0
        while len(found) < limit and scanned < 20_000:
            page = await self.log.read(after=cursor, limit=1000)
            if not page:
                break
            for record in page:
                cursor = record.position
                if (agent is None or record.stream == agent) and \
                        (kind is None or record.type == kind) and principal.may_see(record.stream):
                    found.append(event_json(record))
                    if len(found) == limit:
                        break
            scanned += len(page)
        return _json({"events": found, "next": cursor})

    async def event_cause(self, request: Request) -> Response:
        """One event, the input that caused it (itself, if it is an input) and every
        decision made of that input: the events of one input are consecutive in its
        stream, so the input is the nearest earlier event of an input type."""
        principal = self._principal(request)
        principal.check_read()
        position = int(request.path_params["position"])
        found = [] if position > MAX_INT else \
            await self.log.read(after=max(0, position - 1), limit=1)
        if not found or found[0].position != position or not principal.may_see(found[0].stream):
            raise BadFrame("not_found", f"no event at position {position} that this token "
                           "may see; list events with GET /api/events")
        record = found[0]
        inputs = _input_types(record.stream)
        cause: RecordedEvent | None = None
        top = record.version
        while cause is None and top > 0:  # walk back a page at a time
            page = await self.log.read_stream(
                record.stream, after_version=max(0, top - CAUSE_PAGE), limit=CAUSE_PAGE)
            for earlier in reversed([r for r in page if r.version <= top]):
                if earlier.type in inputs:
                    cause = earlier
                    break
            top -= CAUSE_PAGE
        decisions: list[RecordedEvent] = []
        if cause is not None:
            after = await self.log.read_stream(
                record.stream, after_version=cause.version, limit=MAX_CAUSE_DECISIONS + 1)
            for later in after:
                if later.type in inputs:
                    break
                decisions.append(later)
        return _json({
            "event": event_json(record),
            "input": None if cause is None else event_json(cause),
            "decisions": [event_json(r) for r in decisions[:MAX_CAUSE_DECISIONS]],
            "truncated": len(decisions) > MAX_CAUSE_DECISIONS,
        })

    async def event_types(self, request: Request) -> Response:
        """Which event types are inputs and which are decisions, for agent streams and
        provider gate streams (a client classifies events without a copy of the list)."""
        self._principal(request).check_read()
        return _json({
            "agent": {"inputs": [t.__name__ for t in INPUT_TYPES],
                      "decisions": [t.__name__ for t in DECISION_TYPES]},
            "provider": {"inputs": [t.__name__ for t in GATE_INPUT_TYPES],
                         "decisions": [t.__name__ for t in GATE_DECISION_TYPES]},
        })

    async def agent_events(self, request: Request) -> Response:
        """One agent's stream, newest last: the ``limit`` (<= 2000, default 500) events with
        a version below ``beforeVersion`` (default: the newest). Page back with the first
        version you got."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        query = request.query_params
        limit = min(max(_int_param(query, "limit", 500), 1), 2000)
        before = _int_param(query, "beforeVersion", 0)
        # The state's version may run ahead of the commit, never behind it.
        top = self.engine.state(agent_id).version if before == 0 else before - 1
        records = [r for r in await self.log.read_stream(
            agent_id, after_version=max(0, top - limit), limit=limit) if r.version <= top]
        return _json({"agentId": agent_id, "events": [event_json(r) for r in records],
                      "more": bool(records) and records[0].version > 1})

    async def replay(self, request: Request) -> Response:
        """An agent's queue exactly as it was at a log position (``agent``, ``position``:
        default the last), rebuilt from the log, with the events around that position
        (``around``, default 10 each side)."""
        principal = self._principal(request)
        query = request.query_params
        agent_id = query.get("agent")
        if not agent_id:
            raise BadFrame("invalid", "agent is required", field="agent")
        principal.check_read(agent_id)
        self.engine.state(agent_id)  # UnknownAgent if it does not exist
        last = await self.log.last_position()
        position = _int_param(query, "position", last)
        around = min(_int_param(query, "around", 10), 200)
        replayed = await self._replayed(agent_id, position)
        state = replayed.state
        first = max(0, state.version - around)  # (its version: the events folded)
        nearby = await self.log.read_stream(
            agent_id, after_version=first, limit=state.version - first + around)
        return _json({
            "agentId": agent_id,
            "position": position,
            "eventPosition": replayed.event_position,
            "version": state.version,
            "at": state.now,
            "status": agent_summary(state, state.now),
            "queue": queue_view(state, state.now),
            "around": [event_json(r) for r in nearby],
        })

    async def search_events(self, principal: Principal, query: Mapping[str, str], limit: int,
                            agent: str | None, kind: str | None) -> Response:
        """The newest ``limit`` events below position ``before`` (default: all) with ``q``
        in their type, stream or data, of ``agent`` and ``type`` if given, in the token's
        scope, newest first; ``before`` in the answer goes on (None: the start of the log
        was reached). Each answer looks at a bounded number of events (``scanned``)."""
        return _json(await self.search_of(principal, query, limit, agent, kind))

    async def search_of(self, principal: Principal, query: Mapping[str, str], limit: int,
                        agent: str | None, kind: str | None) -> dict[str, Any]:
        """`search_events`' answer (HTTP and MCP)."""
        text = query.get("q", "")
        if len(text) > MAX_SEARCH_TEXT:
            raise BadFrame("invalid", f"q is at most {MAX_SEARCH_TEXT} characters", field="q")
        store = self.log
        before = _int_param(query, "before", 0) or await store.last_position() + 1
        matches = event_matcher(text, agent, kind, principal.may_see)
        found, more, scanned = await search_back(
            lambda after, size: store.read(after=after, limit=size), before, limit, matches)
        return {"events": [event_json(r) for r in found], "before": more, "scanned": scanned}

    async def runs(self, request: Request) -> Response:
        """An agent's runs, newest first, from the log: ``limit`` (<= 100, default 20) runs
        started below version ``before``; each with its requests, outcome, tokens, time
        waiting at the provider gate and in the model, orders, calls and answer."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        query = request.query_params
        limit = _int_param(query, "limit", 20)
        if not 1 <= limit <= 100:
            raise BadFrame("invalid", "limit must be between 1 and 100", field="limit")
        before = _int_param(query, "before", 0) or None
        gate = self.engine.gate_of(agent_id)
        return _json(await run_history(
            self.log, agent_id, self.engine.state(agent_id).version, before=before,
            limit=limit, gate=None if gate is None else (gate.stream, gate.state.version)))

    async def charts(self, request: Request) -> Response:
        """Per-agent series from the log (`gateway.reads.history.SERIES`) over [``from``, ``to``)
        (ms since the epoch; default the last hour) in steps of ``step`` ms (default: 120
        points), for the ``agent``s named (comma-separated; default every one in the
        token's scope, at most `MAX_CHART_AGENTS`), with stop, pause, resume and hold
        marks (who and when)."""
        principal = self._principal(request)
        principal.check_read()
        query = request.query_params
        now = self.engine.clock.now_ms()
        end = _int_param(query, "to", now)
        start = _int_param(query, "from", max(0, end - 3_600_000))
        if start >= end:
            raise BadFrame("invalid", "from must be before to", field="from")
        step = _int_param(query, "step", max(1_000, -(-(end - start) // 120)))
        if step < 1_000:
            raise BadFrame("invalid", "step must be at least 1000 ms", field="step")
        if -(-(end - start) // step) > MAX_BUCKETS:
            raise BadFrame("invalid", f"from..to holds more than {MAX_BUCKETS} steps; "
                           "make step larger or the window shorter", field="step")
        named = [a for a in query.get("agent", "").split(",") if a]
        if len(named) > MAX_CHART_AGENTS:
            raise BadFrame("invalid", f"at most {MAX_CHART_AGENTS} agents at once",
                           field="agent")
        for agent_id in named:
            principal.check_read(agent_id)
            self.engine.state(agent_id)  # UnknownAgent if it does not exist
        agents = named or principal.visible(self.engine.agent_ids)[:MAX_CHART_AGENTS]
        found = [await agent_series(self.log, a, self.engine.state(a).version,
                                    start=start, end=end, step=step) for a in agents]
        marks = sorted((m for f in found for m in f.pop("marks")), key=lambda m: m["at"])
        return _json({"from": start, "to": end, "step": step, "agents": found,
                      "marks": marks})
