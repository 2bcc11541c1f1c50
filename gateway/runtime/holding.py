"""Agents coming to an engine and leaving it: when several processes share the log,
`gateway.cluster` loads into the engine the agents this process is given, unloads those it
hands over and drops those whose lease it lost. An agent loaded goes on as after a restart;
one leaving has what is open appended, its run and timer stopped, and is GONE; controls
held for it during a storage fault go to its next process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from gateway.errors import GatewayError, StorageFailed
from gateway.runtime.agents import Agent
from gateway.runtime.phases import Phase
from lanes import AgentConfig, AgentState
from lanes.events import (
    AgentCallDispatched,
    CallAnswered,
    ConfigChanged,
    RequestReceived,
    Restarted,
    Stopping,
)
from lanes.policy import POLICY, PolicyOffered
from lanes.replay import LogFold
from store.port import Fence, FencedError, RecordedEvent

if TYPE_CHECKING:
    from gateway.runtime.engine import Engine

log = logging.getLogger("gateway.runtime.engine")

PASS_ON_MS: Final = 60_000
"""How long controls held for an agent that left are offered to its next process."""
PASS_ON_RETRY_MS: Final = 200
"""The wait before offering them again while no process has the agent."""


class Holding:
    """Which agents an engine decides for: `load`, `unload`, `drop`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def load_all(self, log_fold: LogFold, stale: list[int], principal: str) -> None:
        """Every agent of the log and the configs, as after a restart (alone on the log)."""
        engine = self._engine
        if engine.snapshots.due_at_start(stale):
            engine.snapshots.take(log_fold, stale)  # before any input: exactly the log
        states = log_fold.states
        # In a fixed order: the Restarted events below land in it, so two starts of one log
        # (with a snapshot or without, in any process) append the very same events.
        for agent_id in sorted({*states, *engine.configs}):
            engine.agents[agent_id] = engine.new_agent(
                states.get(agent_id) or AgentState(agent_id=agent_id))
        now = engine.clock.now_ms()
        for agent_id, config in engine.configs.items():
            engine.feed(engine.agents[agent_id],
                        ConfigChanged(at=now, config=config, principal=principal))
        for agent in engine.agents.values():
            engine.feed(agent, Restarted(at=now))  # decides nothing unless something was cut off
            engine.feed(agent, PolicyOffered(at=now, version=POLICY))  # (the same if known)
            engine.reschedule(agent)
        for parent, call in list(log_fold.calls.values()):
            engine.calls.call(parent, call)
        for child, answer in list(log_fold.answers.values()):
            engine.calls.answer(child, answer)
        for agent in engine.agents.values():  # orders still open in the log: to the broker
            engine.orders.place_open(agent)

    def load(self, agent_id: str, records: list[RecordedEvent], fence: Fence,
             calls: Iterable[tuple[str, AgentCallDispatched]] = (),
             answers: Iterable[tuple[str, CallAnswered]] = ()) -> None:
        """Decide for an agent from now on (this process holds its lease at ``fence``), its
        state folded from ``records`` (its stream): it goes on as after a restart (a run its
        previous process was cut off in is recorded aborted, ``restart``, and run again; the
        config file's entry applied if it changed since it was last applied; timers set; its
        undelivered sub-agent ``calls`` and ``answers`` and its open orders sent again).
        Held already: only the fence changes."""
        engine = self._engine
        agent = engine.agents.get(agent_id)
        if agent is not None:
            agent.core.fence = fence
            return
        config = engine.file_configs.get(agent_id)
        self.adopt(agent_id, engine.fold_stream(agent_id, records), fence,
                   config is not None and config != self._last_file_config(records),
                   calls, answers)

    def adopt(self, agent_id: str, state: AgentState, fence: Fence,
              file_changed: bool = False,
              calls: Iterable[tuple[str, AgentCallDispatched]] = (),
              answers: Iterable[tuple[str, CallAnswered]] = ()) -> None:
        """`load` from the agent's ``state`` folded already (from its whole stream, or a
        replica of it and its tail): ``file_changed`` says whether the config file's entry
        for it changed since the file last gave it one."""
        engine = self._engine
        agent = engine.agents.get(agent_id)
        if agent is not None:
            agent.core.fence = fence
            return
        agent = engine.agents[agent_id] = engine.new_agent(state)
        agent.core.fence = fence
        if not engine.running:
            return
        now = engine.clock.now_ms()
        config = engine.file_configs.get(agent_id)
        if config is not None and file_changed:
            engine.configs[agent_id] = config
            engine.feed(agent, ConfigChanged(at=now, config=config, principal="config"))
        else:
            engine.configs[agent_id] = agent.state.config
        engine.feed(agent, Restarted(at=now))  # decides nothing unless a run was cut off
        engine.feed(agent, PolicyOffered(at=now, version=POLICY))
        engine.reschedule(agent)
        for parent, call in calls:
            if parent == agent_id:
                engine.calls.call(parent, call)
        for child, answer in answers:
            if child == agent_id:
                engine.calls.answer(child, answer)
        engine.orders.place_open(agent)

    def file_config(self, agent_id: str) -> AgentConfig | None:
        """The config file's entry for an agent, if it has one."""
        return self._engine.file_configs.get(agent_id)

    def _last_file_config(self, records: list[RecordedEvent]) -> AgentConfig | None:
        """The config the config file last gave an agent, from its stream."""
        engine = self._engine
        for record in reversed(records):
            if record.type == ConfigChanged.__name__:
                event = engine.reader.decode(record)
                if isinstance(event, ConfigChanged) and event.principal == "config":
                    return event.config
        return None

    async def unload(self, agent_id: str) -> None:
        """Stop deciding for an agent gracefully (its lease goes to another process): a run
        in flight is recorded aborted (``shutdown``), its requests back at the head of the
        queue for the next process, and everything decided for it is committed."""
        engine = self._engine
        agent = engine.agents.get(agent_id)
        if agent is None:
            return
        if engine.running and agent.live:
            engine.feed(agent, Stopping(at=engine.clock.now_ms()))
        self._gone(agent)
        # Its own appends settled (those of other agents, and rebuilds that go on while the
        # log refuses writes, are not waited for).
        last = agent.core.last_commit
        if last is not None and not last.done():
            await asyncio.wait([last])

    def drop(self, agent_id: str) -> None:
        """Stop deciding for an agent at once: its lease is another process's already, so
        nothing more is written for it from here."""
        engine = self._engine
        agent = engine.agents.get(agent_id)
        if agent is not None:
            self._gone(agent)

    def _gone(self, agent: Agent) -> None:
        """The agent leaves this process: what is open is appended, its run and timer stop,
        held controls are said lost."""
        engine = self._engine
        if agent.open is not None:  # decided while it was this process's: appended now
            engine.intake.close(agent.open)
        del engine.agents[agent.agent_id]
        agent.move(Phase.GONE)
        agent.core.fence = None
        agent.core.cancel_timer()
        engine.runs.cancel(agent)
        held = agent.controls.clear()
        if not held:
            return
        ids = ", ".join(received.request.request_id for received in held)
        if engine.elsewhere is None or not engine.running:
            log.error("controls of %s held during a storage fault were not stored before it "
                      "left this process: %s; send them again", agent.agent_id, ids)
            return
        log.warning("controls of %s held during a storage fault go to its next process: %s",
                    agent.agent_id, ids)
        engine.spawn(self._pass_on(agent.agent_id, held), f"held controls of {agent.agent_id}")

    async def _pass_on(self, agent_id: str, held: list[RequestReceived]) -> None:
        """Controls held here for an agent that left, sent to its next process to store, in
        the order they came; while no process has it (a failover), asked again, for
        `PASS_ON_MS` at most."""
        engine = self._engine
        assert engine.elsewhere is not None
        deadline = engine.clock.now_ms() + PASS_ON_MS
        for received in held:
            request = received.request
            while True:
                try:
                    await engine.elsewhere.forward(request, received.principal)
                    break
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is None or task.cancelling():
                        raise
                    log.error("control %s of %s, held during a storage fault, was not passed "
                              "on to its next process (this one is stopping); send it again",
                              request.request_id, agent_id)  # (the forward was cut off)
                    break
                except GatewayError as error:
                    if isinstance(error, StorageFailed) and error.held:
                        break  # held there now: that process stores it
                    if error.code != "unavailable" or engine.clock.now_ms() > deadline:
                        log.error("control %s of %s, held during a storage fault, could not "
                                  "be passed on to its next process (%s); send it again",
                                  request.request_id, agent_id, error)
                        break
                await engine.clock.sleep(PASS_ON_RETRY_MS)

    def fenced(self, agent: Agent, error: FencedError) -> None:
        """An append of the agent was refused: another process holds its lease now."""
        engine = self._engine
        if agent.phase is Phase.GONE:
            return
        log.warning("%s; agent %s is another process's now", error, agent.agent_id)
        self._gone(agent)
        if engine.elsewhere is not None:
            engine.elsewhere.fenced(agent.agent_id)
