"""A test bench for one agent: feed inputs, keep the log as the runtime would."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime
from typing import Any

from lanes import AgentConfig, AgentState, Entry, decide, next_due
from lanes.codec import decode, encode
from lanes.events import (
    ConfigChanged,
    Decision,
    Input,
    Outcome,
    RequestReceived,
    RunErrored,
    RunFinished,
    RunSteerability,
    TimerElapsed,
    Usage,
)
from lanes.policy import POLICY, PolicyOffered
from lanes.requests import AgentRequest

T0 = 1_771_297_800_000  # 2026-02-17T03:10:00Z


class Bench:
    """One agent, a clock that only moves when told, and the log of what it decided."""

    def __init__(self, config: AgentConfig | None = None, agent: str = "agent_btc_5m",
                 policy: int | None = POLICY) -> None:
        """``policy``: the version offered after the first config, as the runtime does (None:
        none, the stream decides under version 1)."""
        self.agent = agent
        self.state = AgentState(agent_id=agent)
        self.log: list[Entry] = []
        self.now = T0
        self._ids = itertools.count(1)
        self.feed(ConfigChanged(at=self.now, config=config or AgentConfig()))
        if policy is not None:
            self.feed(PolicyOffered(at=self.now, version=policy))

    def feed(self, event: Input) -> list[Decision]:
        """Decide one input; record it and its decisions if there are any."""
        decisions = decide(self.state, event)
        if decisions:
            for item in (event, *decisions):
                self.log.append(Entry(len(self.log) + 1, self.agent, item))
        return decisions

    def make(self, kind: str = "hook_trigger", **fields: Any) -> AgentRequest:
        """A valid request for this agent; ``fields`` use wire names or Python names."""
        data: dict[str, Any] = {
            "requestId": f"ar_{next(self._ids)}",
            "createdAt": datetime.fromtimestamp(self.now / 1000, UTC),
            "agentId": self.agent,
            "kind": kind,
        }
        if kind == "user_control" and "payload" not in fields:
            data["payload"] = {"message": "hello"}
        data.update(fields)
        return AgentRequest.model_validate(data)

    def submit(self, request: AgentRequest) -> list[Decision]:
        """The request arrives now."""
        return self.feed(RequestReceived(at=self.now, request=request))

    def send(self, kind: str = "hook_trigger", **fields: Any) -> list[Decision]:
        """Make a request and submit it."""
        return self.submit(self.make(kind, **fields))

    def control(self, action: str, **payload: Any) -> list[Decision]:
        """A user_control request naming a control action."""
        return self.send("user_control", payload={"action": action, **payload})

    def advance(self, ms: int) -> list[Decision]:
        """Move the clock, firing each timer when it falls due, as the runtime does.

        Afterwards a timer at the new time decides nothing (checked on a copy): so the
        tests notice if `next_due` ever misses a time when something was due.
        """
        target = self.now + ms
        decisions: list[Decision] = []
        while (due := next_due(self.state, self.now)) is not None and due <= target:
            self.now = max(self.now, due)
            decisions += self.feed(TimerElapsed(at=self.now))
        self.now = target
        assert decide(copy.deepcopy(self.state), TimerElapsed(at=target)) == [], (
            "something was due that next_due did not announce"
        )
        return decisions

    @property
    def run_id(self) -> str:
        """The active run's id (fails if the lane is idle)."""
        assert self.state.active is not None, "no active run"
        return self.state.active.run_id

    def finish(
        self, outcome: str = "trade", run_id: str | None = None, **result: Any
    ) -> list[Decision]:
        """The active (or named) run returns a result."""
        return self.feed(
            RunFinished(
                at=self.now,
                run_id=run_id or self.run_id,
                outcome=Outcome(outcome),
                usage=result.pop("usage", Usage(input_tokens=100, output_tokens=20)),
                **result,
            )
        )

    def fail(self, error: str = "boom") -> list[Decision]:
        """The active run raises."""
        return self.feed(RunErrored(at=self.now, run_id=self.run_id, error=error))

    def steerable(self, flag: bool = True) -> list[Decision]:
        """The runner reports whether the active run can take a steer."""
        return self.feed(RunSteerability(at=self.now, run_id=self.run_id, steerable=flag))

    def pending_ids(self) -> list[str]:
        """Ids of the pending requests, in order."""
        return [p.request.request_id for p in self.state.pending]

    def round_tripped(self) -> list[Entry]:
        """The log as it comes back from storage (encoded to JSON and decoded)."""
        return [Entry(e.position, e.stream, decode(*encode(e.event))) for e in self.log]


def types(decisions: list[Decision]) -> list[str]:
    """The type names of some decisions, for readable assertions."""
    return [type(d).__name__ for d in decisions]
