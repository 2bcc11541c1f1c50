"""An agent whose append failed: its state ran ahead of the log, so it is folded from the
log again (`gateway.runtime.core.StreamCore` does the rebuild); what it started stops, and
once it is back its held controls are stored first, then what the failure cut off."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.runtime.agents import Agent
from gateway.runtime.phases import Phase
from lanes.events import ConfigChanged, RequestReceived, Restarted
from store.port import RecordedEvent

if TYPE_CHECKING:
    from gateway.runtime.engine import Engine

log = logging.getLogger("gateway.runtime.engine")


class Recovery:
    """What an engine does when an agent's append fails, and when it is rebuilt."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def lost(self, agent: Agent) -> None:
        """The agent's state ran ahead of the log and is being rebuilt: its run stops (what
        it started was not recorded)."""
        engine = self._engine
        log.debug("an append of %s failed; rebuilding it from the log", agent.agent_id)
        engine.runs.cancel(agent)

    def rebuilt(self, agent: Agent, records: list[RecordedEvent]) -> None:
        """The agent's state is the fold of its stream again: held controls are stored
        first, then what its failure cut off is decided again."""
        engine = self._engine
        agent.fault = None
        if records:  # a commit reported as failed may have reached the log all the same
            engine.snapshots.seen(records[-1])
        held = agent.controls.rebuilt(agent.state.seen)
        if agent.phase is not Phase.LIVE:  # (handed over meanwhile: the new process goes on)
            return
        if engine.running:
            # Held stops first: a run cut off by the failure must not start again before them.
            for received in held:
                engine.feed(agent, RequestReceived(at=engine.clock.now_ms(),
                                                 request=received.request,
                                                 principal=received.principal))
            config = engine.configs.get(agent.agent_id)
            if config is not None and agent.state.config != config:
                # The start's config change was not stored (the log refused it): again.
                engine.feed(agent, ConfigChanged(at=engine.clock.now_ms(), config=config,
                                               principal="config"))
            if agent.state.active is not None:
                engine.feed(agent, Restarted(at=engine.clock.now_ms()))
        engine.reschedule(agent)
