"""Time travel: an agent's log as a story, the agent at a position, a diff."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.http import Routes, _int_param, _json, _position_param
from gateway.errors import BadFrame
from gateway.reads.story import (
    JUMP_KINDS,
    DiffJson,
    FoundJson,
    MomentJson,
    StoryJson,
    answer,
    diff_json,
    gate_json,
    group_json,
    moment_json,
)


class StoryRoutes(Routes):
    """Time travel: an agent's log as a story, the agent at a position, a diff."""

    async def _story_read(self, request: Request) -> tuple[str, int]:
        """The path's agent (readable by the caller) and the log's last position."""
        agent_id = self._agent_id(request)
        self._principal(request).check_read(agent_id)
        return agent_id, await self.log.last_position()

    async def story(self, request: Request) -> Response:
        """An agent's stream as groups, each an input and the decisions it caused, worded as
        ``gateway timeline`` words them: those with their input in [``from``, ``to``] (at
        most ``limit``, <= 1000, default 200), or, given ``at``, the group holding that
        position with ``around`` (<= 100, default 3) groups each side."""
        agent_id, last = await self._story_read(request)
        return _json(await self.story_of(agent_id, request.query_params, last))

    async def story_of(self, agent_id: str, query: Mapping[str, str], last: int
                       ) -> dict[str, Any]:
        """`story` of a readable agent with its parameters in ``query``, the log ending at
        ``last`` (HTTP and MCP)."""
        index = await self.stories.index(self.log, self.engine.reader, agent_id)
        if query.get("at"):
            at = _position_param(query, "at", last, last)
            count = min(_int_param(query, "around", 3), 100)
            first, end, current = index.around(at, count)
            groups = await self.stories.groups(self.log, index, agent_id, first, end,
                                               self.words)
            return answer(StoryJson, {
                "agentId": agent_id, "at": at, "index": current, "more": False,
                "groups": [group_json(g) for g in groups]})
        start = _position_param(query, "from", 0, last)
        upto = _position_param(query, "to", last, last)
        limit = min(max(_int_param(query, "limit", 200), 1), 1000)
        first, end, more = index.between(start, upto, limit)
        groups = await self.stories.groups(self.log, index, agent_id, first, end, self.words)
        return answer(StoryJson, {
            "agentId": agent_id, "from": start, "to": upto, "more": more,
            "groups": [group_json(g) for g in groups]})

    async def story_find(self, request: Request) -> Response:
        """The position of the next decision of a ``kind`` (stop, drop or suppression) after
        ``after``, or of the previous one before ``before`` (null: none)."""
        agent_id, last = await self._story_read(request)
        query = request.query_params
        kind = query.get("kind", "")
        if kind not in JUMP_KINDS:
            raise BadFrame("invalid", f"kind must be one of {', '.join(JUMP_KINDS)}, got "
                           f"{kind[:40]!r}", field="kind")
        if ("after" in query) == ("before" in query):
            raise BadFrame("invalid", "give after (the next one) or before (the previous "
                           "one), not both", field="after")
        after = _position_param(query, "after", 0, last) if "after" in query else None
        before = _position_param(query, "before", 0, last + 1) if "before" in query else None
        index = await self.stories.index(self.log, self.engine.reader, agent_id)
        return _json(answer(FoundJson, {
            "agentId": agent_id, "kind": kind, "position": index.jump(kind, after, before)}))

    async def moment(self, request: Request) -> Response:
        """An agent as it was at a log ``position`` (default the last), replayed from the
        log: trading, lane and why it waits, runs in the last hour and day against their
        budgets, cooldown, suppression, hold, pending list, orders, positions, and what its
        provider gate held for it then."""
        agent_id, last = await self._story_read(request)
        position = _position_param(request.query_params, "position", last, last)
        replayed = await self._replayed(agent_id, position)
        state, folded = replayed.state, replayed.event_position
        gate = self.engine.gate_of(agent_id)
        gate_state = None
        if gate is not None and state.active is not None:  # only a run asks for slots
            gate_state = (await self.gate_replays.at(
                self.log, self.engine.reader, gate.stream, position)).state
        view = gate_json(agent_id, None if gate is None else gate.provider, gate_state)
        return _json(answer(MomentJson, moment_json(state, view, position, folded)))

    async def diff(self, request: Request) -> Response:
        """What changed in an agent between two log positions (``from``, ``to``), each state
        replayed from the log: facts that differ, pending requests added and removed, orders
        opened, closed and filled, positions per symbol."""
        agent_id, last = await self._story_read(request)
        query = request.query_params
        for name in ("from", "to"):
            if not query.get(name):
                raise BadFrame("invalid", f"{name} (a log position) is required", field=name)
        start = _position_param(query, "from", 0, last)
        upto = _position_param(query, "to", last, last)
        ends = []
        for position in (start, upto):
            replayed = await self._replayed(agent_id, position)
            state = replayed.state
            ends.append((state, {"position": position, "version": state.version,
                                 "eventPosition": replayed.event_position, "at": state.now}))
        (before, since), (after, until) = ends
        return _json(answer(DiffJson, diff_json(before, after, since, until)))
