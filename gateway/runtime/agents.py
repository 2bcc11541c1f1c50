"""One agent as the engine holds it: its stream's core (with its phase), its run, its held
controls.

An agent's life in this process is its stream's `Phase` (`gateway.runtime.phases`): LIVE when
this process takes it, REBUILDING while an append failed, GONE once it left (unloaded or
dropped). Only a LIVE agent decides and acts. A GONE agent is no longer the engine's: a task
still holding it (its run, its rebuild) finds it gone and does nothing more.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.llm.reasoner import RunContext
from gateway.runtime.core import Outcome, StreamCore
from gateway.runtime.faults import Faults
from gateway.runtime.held import HeldControls
from gateway.runtime.phases import Phase
from lanes import AgentState
from lanes.events import Decision, Input

if TYPE_CHECKING:
    from gateway.runtime.holding import Holding
    from gateway.runtime.recovery import Recovery

from store.port import ConcurrencyError, FencedError, NewEvent, RecordedEvent


@dataclass(slots=True, eq=False)
class Agent:
    """An agent this process decides for."""

    core: StreamCore[AgentState, Input, Decision]
    """The agent's stream: its state, phase, appends in flight, rebuilds and timer."""
    run: asyncio.Task[None] | None = None
    context: RunContext | None = None
    run_started: dict[str, float] = field(default_factory=dict)
    controls: HeldControls = field(default_factory=HeldControls)
    open: Group | None = None
    """Decided for the agent and not appended yet (a batch of requests between steps)."""
    fault: str | None = None
    """Why its last append failed: the storage error it is being rebuilt after (said to
    whoever it refuses meanwhile, also once other appends commit again)."""

    @property
    def agent_id(self) -> str:
        """The agent's id (its stream)."""
        return self.core.stream

    @property
    def state(self) -> AgentState:
        """The live state (decided; its latest events may still be committing)."""
        return self.core.state

    @property
    def phase(self) -> Phase:
        """Where it is in its life in this process (its stream's phase)."""
        return self.core.phase

    @property
    def live(self) -> bool:
        """Whether it decides and acts now."""
        return self.core.phase is Phase.LIVE

    def move(self, to: Phase) -> None:
        """Move to phase ``to`` (`gateway.runtime.phases.IllegalPhase` if not allowed)."""
        self.core.move(to)


@dataclass(slots=True, eq=False)
class Group:
    """The requests of one agent in one batch, decided across its steps and appended once:
    when the batch has decided them all, or as soon as anything else is decided for the
    agent (its appends keep the order of its decisions)."""

    agent: Agent
    base: int
    events: list[NewEvent] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    outcome: Outcome[Decision] = field(default_factory=lambda: Outcome([], None))
    closed: bool = False


class Host(Protocol):
    """What an agent's stream tells its engine (`gateway.runtime.engine.Engine`)."""

    faults: Faults

    def after_commit(self, agent: Agent, decisions: list[Decision],
                     records: list[RecordedEvent], took: float, urgent: bool) -> None: ...
    def tick(self, agent: Agent) -> None: ...

    @property
    def recovery(self) -> Recovery: ...

    @property
    def holding(self) -> Holding: ...


class Hooks:
    """What an agent's `StreamCore` tells the engine (`gateway.runtime.core.Listener`)."""

    __slots__ = ("agent", "engine")

    def __init__(self, engine: Host) -> None:
        self.engine = engine
        self.agent: Agent | None = None

    def committed(self, decisions: list[Decision], records: list[RecordedEvent],
                  seconds: float, urgent: bool) -> None:
        assert self.agent is not None
        self.engine.after_commit(self.agent, decisions, records, seconds, urgent)

    def failed(self, decisions: list[Decision], error: BaseException | None) -> None:
        # A conflict follows an earlier failure; a fenced append is no storage fault.
        if error is not None and not isinstance(error, ConcurrencyError | FencedError):
            assert self.agent is not None
            self.agent.fault = self.engine.faults.failed(error)

    def lost(self) -> None:
        assert self.agent is not None
        self.engine.recovery.lost(self.agent)

    def rebuilt(self, records: list[RecordedEvent]) -> None:
        assert self.agent is not None
        self.engine.recovery.rebuilt(self.agent, records)

    def due(self) -> None:
        assert self.agent is not None
        self.engine.tick(self.agent)

    def fenced(self, error: FencedError) -> None:
        assert self.agent is not None
        self.engine.holding.fenced(self.agent, error)
