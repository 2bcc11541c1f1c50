"""Call trees: which calls an agent's runs made, and which calls those made while serving
them, folded from the call events of the agents' streams (a projection of the log)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lanes.events import (
    AgentCallDispatched,
    AgentCallQueued,
    AgentCallRejected,
    CallBatchOpened,
    CallEnded,
    CallResult,
    Event,
    RunStarted,
)

CALL_EVENT_TYPES = frozenset(cls.__name__ for cls in (
    AgentCallQueued, AgentCallDispatched, AgentCallRejected, CallBatchOpened, CallEnded,
    RunStarted))
"""The event types a call tree is folded from (the others can be left undecoded)."""


@dataclass(slots=True)
class CallNode:
    """One call: ``queued`` or ``out`` while open, then how it ended."""

    call_id: str
    caller: str
    run_id: str
    target: str
    depth: int
    priority: str
    status: str
    result: CallResult | None = None
    reason: str | None = None


@dataclass(slots=True)
class CallTrees:
    """The calls of some agents' streams, and how they nest."""

    nodes: dict[str, CallNode] = field(default_factory=dict)
    runs: dict[str, list[str]] = field(default_factory=dict)
    """A run (of the agent that made the calls) -> its call ids, in the order made."""
    run_agents: dict[str, str] = field(default_factory=dict)
    serving: dict[str, list[str]] = field(default_factory=dict)
    """A call -> the runs that made calls while serving it."""
    top: dict[str, list[str]] = field(default_factory=dict)
    """An agent -> its runs that made calls, in order (the roots of its trees)."""
    started: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """An agent -> the requests its latest run took (the calls it serves among them): the
    tasks that run sends (`lanes.tools`) are made while serving them."""

    def add(self, stream: str, events: Iterable[Event]) -> None:
        """Fold the call events of one agent's stream (in its order)."""
        for event in events:
            if isinstance(event, RunStarted):
                self.started[stream] = event.request_ids  # (an agent runs one at a time)
            elif isinstance(event, CallBatchOpened):
                self.run_agents[event.run_id] = stream
                self.top.setdefault(stream, []).append(event.run_id)
                for served in event.serves:
                    self.serving.setdefault(served.call_id, []).append(event.run_id)
                if event.awaited_by is not None:  # tasks of a run: under what it serves
                    for request_id in self.started.get(stream, ()):
                        self.serving.setdefault(request_id, []).append(event.run_id)
            elif isinstance(event, AgentCallQueued):
                self._node(stream, event.call_id, event.run_id, event.target, event.depth,
                           event.priority.value, "queued")
            elif isinstance(event, AgentCallDispatched):
                node = self._node(stream, event.call_id, event.run_id, event.target,
                                  event.depth, event.priority.value, "out")
                node.status = "out"
            elif isinstance(event, AgentCallRejected) and event.call_id:
                node = self._node(stream, event.call_id, event.run_id, event.target, 0,
                                  "normal", "refused")
                node.reason = event.reason
            elif isinstance(event, CallEnded):
                ended = self.nodes.get(event.call_id)
                if ended is not None:
                    ended.status = event.result.status.value
                    ended.result = event.result

    def _node(self, caller: str, call_id: str, run_id: str, target: str, depth: int,
              priority: str, status: str) -> CallNode:
        node = self.nodes.get(call_id)
        if node is None:
            node = self.nodes[call_id] = CallNode(call_id, caller, run_id, target, depth,
                                                  priority, status)
            self.runs.setdefault(run_id, []).append(call_id)
            self.run_agents.setdefault(run_id, caller)
        return node

    def targets(self) -> set[str]:
        """Every agent a call was made to."""
        return {node.target for node in self.nodes.values()}

    def children(self, call_id: str) -> list[CallNode]:
        """The calls made while serving ``call_id``, in the order made."""
        return [self.nodes[c] for run in self.serving.get(call_id, ())
                for c in self.runs.get(run, ())]

    def tree(self, agent: str, run_id: str | None = None, limit: int = 20) -> dict[str, Any]:
        """An agent's call trees as JSON: its newest ``limit`` runs that made calls (or the
        one ``run_id``), each with its calls and theirs, and the count of calls per status."""
        runs = self.top.get(agent, [])
        runs = [r for r in runs if r == run_id] if run_id is not None else runs[-limit:]
        counts: dict[str, int] = {}

        def node_json(node: CallNode, seen: frozenset[str]) -> dict[str, Any]:
            counts[node.status] = counts.get(node.status, 0) + 1
            body: dict[str, Any] = {"callId": node.call_id, "caller": node.caller,
                                    "target": node.target, "depth": node.depth,
                                    "priority": node.priority, "status": node.status}
            result = node.result
            if result is not None:
                body.update(result.model_dump(mode="json", by_alias=True, exclude_none=True,
                                              include={"outcome", "answer", "usage", "error",
                                                       "code"}))
            elif node.reason is not None:
                body["error"] = node.reason
            inner = seen | {node.call_id}  # (a log that loops is shown once round)
            body["calls"] = [node_json(child, inner) for child in self.children(node.call_id)
                             if child.call_id not in inner]
            return body

        return {
            "agentId": agent,
            "runs": [{"runId": run, "calls": [node_json(self.nodes[c], frozenset())
                                              for c in self.runs.get(run, ())]}
                     for run in runs],
            "counts": counts,
        }
