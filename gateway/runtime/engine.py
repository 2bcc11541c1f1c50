"""The runtime: feeds inputs through `lanes.decide`, appends, and acts after the commit.

One input at a time per agent (everything that decides runs synchronously on the loop), so
an agent's events are appended in the order they were decided. A caller is answered only
after the commit that holds its decision. Effects follow one rule: *stop early, start
late* — an aborted run is cancelled as soon as the abort is decided (never wait to stop
trading), while runs start and calls go out only after their decision is committed.

The engine holds only the agents this process decides for. Alone on its log (SQLite) that
is every agent; when several processes share the log, `gateway.cluster` tells it which
(`load`, `unload`, `drop`) and answers for the others (`Elsewhere`). Its rooms: the runs
(`gateway.runtime.runs`), the sub-agent calls on their way (`gateway.runtime.calls`), held
controls (`gateway.runtime.held`), the snapshot policy (`gateway.runtime.snapshotting`), an
stream's phase (`gateway.runtime.phases`) and the one way in for requests
(`gateway.runtime.intake`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from gateway.base.clock import Clock, SystemClock
from gateway.base.metrics import LATENCY_BUCKETS, Histogram
from gateway.base.quarantine import PLAIN, LogReader, log_reader
from gateway.base.tasks import spawn
from gateway.errors import (
    AgentUnavailable,
    NotRunning,
    UnknownAgent,
)
from gateway.llm.reasoner import Reasoner, SimulatedReasoner
from gateway.runtime.acks import Ack
from gateway.runtime.agenda import Agenda
from gateway.runtime.agents import Agent, Hooks
from gateway.runtime.calls import Calls
from gateway.runtime.core import EventIds, Outcome, StreamCore
from gateway.runtime.desk_budget import DeskBudget
from gateway.runtime.elsewhere import Elsewhere
from gateway.runtime.faults import Faults, StorageFault, commit_error
from gateway.runtime.holding import Holding
from gateway.runtime.intake import Batch, Intake
from gateway.runtime.orders import Orders
from gateway.runtime.phases import Phase
from gateway.runtime.recovery import Recovery
from gateway.runtime.runs import Runs
from gateway.runtime.snapshotting import SNAPSHOT_EVERY, SnapshotPolicy
from gateway.runtime.toolbox import Toolbox
from lanes import AgentConfig, AgentRequest, AgentState, AgentStatus, decide, next_due
from lanes import replay as fold
from lanes import status as agent_status
from lanes.codec import AGENT_CODEC
from lanes.config import Budgets
from lanes.events import (
    AgentCallDispatched,
    CallAnswered,
    CallEnded,
    CallUndeliverable,
    ConfigChanged,
    ControlApplied,
    Decision,
    Input,
    OperatorAction,
    OperatorCommand,
    OrderAccepted,
    OrderCancelRequested,
    RunStarted,
    Stopping,
    TimerElapsed,
)
from lanes.replay import LogFold
from lanes.schedules import Schedule
from store.port import (
    EventStore,
    RecordedEvent,
)

if TYPE_CHECKING:
    from gateway.llm.mcp_tools import McpTools
    from gateway.market.book import MarketBook
    from gateway.market.broker import Broker
    from gateway.runtime.gate import ProviderGate, SlotGate
from gateway.runtime.gate import GateMap

log = logging.getLogger("gateway.runtime.engine")

__all__ = ["SNAPSHOT_EVERY", "Ack", "Elsewhere", "Engine", "StorageFault"]

_STARTS_AFTER_COMMIT: Final = frozenset({RunStarted, AgentCallDispatched, CallAnswered,
                                         CallEnded, OrderAccepted, OrderCancelRequested})
"""The decisions `Engine.after_commit` starts something for (exact types: none is
subclassed)."""





class EnginePhase(Enum):
    """The engine's life: it takes inputs only while RUNNING."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class Engine:
    """The lanes of the agents this process decides for, live, over an event store."""

    def __init__(
        self,
        store: EventStore,
        agents: Mapping[str, AgentConfig],
        *,
        clock: Clock | None = None,
        reasoners: Callable[[str], Reasoner] | None = None,
        broker: Broker | None = None,
        gates: Mapping[str, ProviderGate] | None = None,
        agent_gates: Mapping[str, str] | None = None,
        run_gates: Mapping[str, SlotGate] | None = None,
        snapshot_every: int | None = SNAPSHOT_EVERY,
        snapshot_worker: bool = False,
        ids: Callable[[], str] | None = None,
        elsewhere: Elsewhere | None = None,
        schedules: Mapping[str, Sequence[Schedule]] | None = None,
        market: MarketBook | None = None,
        mcp: McpTools | None = None,
        desk_budgets: Budgets | None = None,
    ) -> None:
        """``reasoners`` gives each agent's reasoner (default: one shared simulation);
        orders accepted by the trading gate go to ``broker`` (none: they stay open).
        ``gates``: the provider gates by name (started and stopped with the engine);
        ``agent_gates`` the gate of each agent's LLM calls (none: ungated), ``run_gates``
        how runs reach a gate (default: the gate itself). A snapshot of the fold is stored
        once ``snapshot_every`` agent events were folded or committed since the last, and
        at a graceful stop (None: never); with ``snapshot_worker`` a worker process folds
        the periodic ones. ``ids`` makes event ids (default: `EventIds`). With ``elsewhere``
        (other processes share the log) it starts holding no agent, until `load`.
        ``schedules``: the config's, per agent (`Agenda`). The runs' tools read ``market``
        and call the agents' ``mcp`` servers; ``desk_budgets`` hold every agent's runs back
        when used up (`runtime.desk_budget`)."""
        self.broker = broker
        self.gate_map = GateMap(gates or {}, agent_gates or {}, run_gates or {})
        self.gates = self.gate_map.gates
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.elsewhere = elsewhere
        self.configs = dict(agents)
        """Each agent's config in force (as last applied here)."""
        self.file_configs = dict(agents)
        """The configs the engine was built with (its config file's), never changed."""
        self.schedules = Agenda(self, self.clock, schedules or {}, self._scheduled_states)
        """The agents' schedules: set, removed, fired by hand and on time."""
        if reasoners is None:
            shared = SimulatedReasoner()
            reasoners = lambda _agent_id: shared  # noqa: E731
        self.agents: dict[str, Agent] = {}
        """The agents this process decides for, by id (`Holding` adds and removes them)."""
        self._ids = ids or EventIds()
        self.ids = self._ids if isinstance(self._ids, EventIds) else None
        """The event ids (a cluster member sets their prefix to its own id's)."""
        self.snapshots = SnapshotPolicy(store, self.clock, snapshot_every, snapshot_worker)
        self._reader = PLAIN
        """Decodes the log, with the events an operator set aside replaced."""
        self._in_flight: set[asyncio.Future[list[RecordedEvent]]] = set()
        self._rebuilds: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        """Runs and call deliveries: cancelled and awaited on stop."""
        self.faults = Faults(self.clock)
        self.runs = Runs(clock=self.clock, reasoners=reasoners, gate_of=self.gate_map.for_runs,
                         feed=self.feed, live=self._live, spawn=self.spawn,
                         toolbox=Toolbox(market, self.state, self.clock, mcp))
        self.calls = Calls(clock=self.clock, submit=self._submit_anywhere,
                           undeliverable=self._undeliverable, spawn=self.spawn)
        self.intake = Intake(self)
        self.desk = DeskBudget(self, desk_budgets)
        self.orders = Orders(broker, self.spawn)
        self.recovery = Recovery(self)
        self.holding = Holding(self)
        """Agents coming to this process and leaving it (`load`, `unload`, `drop`)."""
        self.commit_latency = Histogram(LATENCY_BUCKETS)
        """Seconds from an append being decided to its commit."""
        self.control_commit_latency = Histogram(LATENCY_BUCKETS)
        """Of those, the control lane's (stop, pause, resume, cancel), past the queue."""
        self.requests_received = 0
        self._phase = EnginePhase.NEW

    # ------------------------------------------------------------------- life cycle

    async def start(self, *, principal: str = "config") -> None:
        """Open the log and start the gates. Alone on the log: rebuild every agent from it,
        apply the configs, abort runs cut off by a restart (their requests go back to the
        head of the queue), and start timers. Beside other processes: hold nothing yet."""
        await self.store.open()
        try:
            self._reader = await log_reader(self.store)
            for gate in self.gates.values():
                await gate.start(load=self.elsewhere is None)
            log_fold = stale = None
            if self.elsewhere is None:
                log_fold, stale = await self.snapshots.load(self._reader)
        except BaseException:
            for gate in self.gates.values():
                await gate.stop()
            await self.store.close()
            raise
        self._phase = EnginePhase.RUNNING
        if log_fold is not None and stale is not None:
            self.holding.load_all(log_fold, stale, principal)
            await self.flush(rebuilt=False)  # a log that cannot be written: serve anyway
        self.spawn(self.schedules.scheduler.run(), "scheduler")
        self.desk.start()

    def new_agent(self, state: AgentState) -> Agent:
        """An agent of ``state`` on this engine's log and clock (`Holding` adds it)."""
        hooks = Hooks(self)
        agent_id = state.agent_id
        core: StreamCore[AgentState, Input, Decision] = StreamCore(
            agent_id, state, store=self.store, clock=self.clock, codec=AGENT_CODEC,
            decide=decide, rebuild=partial(self.fold_stream, agent_id), listener=hooks,
            ids=self._ids, pending=self._in_flight, rebuilds=self._rebuilds,
            paced=lambda: self.running)
        agent = hooks.agent = Agent(core)
        return agent

    def fold_stream(self, agent_id: str, records: list[RecordedEvent]) -> AgentState:
        """An agent's state folded from its stream (a rebuild)."""
        return fold(self._reader.entries(records)).get(agent_id) or AgentState(agent_id=agent_id)

    def _quiet(self) -> bool:
        """Whether the live states are exactly the fold of the log up to the last commit,
        with no sub-agent call on its way: nothing decided is uncommitted, no agent is being
        rebuilt, no call is being delivered. Never beside other processes: the engine holds
        only some of the agents then, so its states are not the fold of the log."""
        return self.elsewhere is None and not (
            self._in_flight or self._rebuilds or self.calls.deliveries or self.intake.open)

    def _live_fold(self) -> LogFold:
        states = {agent_id: agent.state for agent_id, agent in self.agents.items()}
        return LogFold(states=states, position=self.snapshots.position)

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop taking inputs, abort runs, cancel timers, finish every commit, close the store.
        Gracefully, runs in flight are recorded as aborted (``shutdown``), their requests back
        at the head of the queue, and the fold's snapshot stored; otherwise (as if the
        process died) the next start records them (``restart``)."""
        if graceful and self.running:
            now = self.clock.now_ms()
            for agent in self.agents.values():
                if agent.live:
                    self.feed(agent, Stopping(at=now))
        calls_cut_off = bool(self.calls.deliveries)
        self._phase = EnginePhase.STOPPED
        for agent in self.agents.values():
            agent.core.cancel_timer()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for gate in self.gates.values():  # after the runs: their slots are given back
            await gate.stop()
        await self.flush()
        for agent in self.agents.values():
            if agent.controls:
                log.error("stopping with controls of %s that could not be stored (the event "
                          "log refused them): %s; send them again after the restart",
                          agent.agent_id, ", ".join(agent.controls.held))
        final = graceful and not calls_cut_off and self._quiet()
        await self.snapshots.close(self._live_fold() if final else None)
        await self.store.close()

    async def flush(self, *, rebuilt: bool = True) -> None:
        """Wait until every append decided so far is committed (or has failed), every
        sub-agent call is delivered (or recorded as undeliverable), and (unless ``rebuilt``
        is False) every agent rebuilt after a failed commit is back: while the log cannot
        be written, an agent cut off in a run is rebuilt again and again."""
        self.intake.end_turn()  # (what this turn's takes decided is appended now)
        while self._in_flight or self.calls.deliveries or (rebuilt and self._rebuilds):
            waiting: list[asyncio.Future[Any]] = [
                *self._in_flight, *self.calls.deliveries, *(self._rebuilds if rebuilt else ())
            ]
            await asyncio.wait(waiting)

    # ---------------------------------------------------------------- which agents

    def holds(self, agent_id: str) -> bool:
        """Whether this process decides for ``agent_id`` now."""
        return agent_id in self.agents

    @property
    def configured(self) -> list[str]:
        """The agents of the config file."""
        return sorted(self.file_configs)

    @property
    def loaded(self) -> list[str]:
        """The agents this process decides for."""
        return sorted(self.agents)

    # ---------------------------------------------------------------------- queries

    @property
    def backlog(self) -> int:
        """Appends decided but not yet committed (flow control reads it)."""
        return len(self._in_flight)

    @property
    def reader(self) -> LogReader:
        """Decodes this log's events (with those set aside by an operator replaced)."""
        return self._reader

    @property
    def running(self) -> bool:
        """Whether the engine takes inputs."""
        return self._phase is EnginePhase.RUNNING

    @property
    def agent_ids(self) -> list[str]:
        """Every agent, configured or found in the log (decided here or elsewhere)."""
        if self.elsewhere is None:
            return sorted(self.agents)
        return sorted({*self.agents, *self.elsewhere.agent_ids()})

    def state(self, agent_id: str) -> AgentState:
        """An agent's live state (decided: its latest events may still be committing; the
        one it had decided while rebuilt after a failed commit; elsewhere: the log's)."""
        if not self.running:
            raise NotRunning()
        agent = self.agents.get(agent_id)
        if agent is not None:
            return agent.state
        found = None if self.elsewhere is None else self.elsewhere.state(agent_id)
        if found is None:
            raise UnknownAgent(agent_id)
        return found

    def gate_of(self, agent_id: str) -> ProviderGate | None:
        """The provider gate an agent's LLM calls go through, if any."""
        return self.gate_map.of(agent_id)

    def status(self, agent_id: str) -> AgentStatus:
        """Observability for one agent, now."""
        return agent_status(self.state(agent_id), self.clock.now_ms())

    # ----------------------------------------------------------------------- inputs

    def take(self, requests: Sequence[AgentRequest], principal: str | None = None,
             batch: Batch | None = None, parsed: bool = False) -> list[asyncio.Future[Ack]]:
        """The one way in for requests: each is decided now, in order (a stop's run is
        cancelled there and then), and gets one answer: its ack once its decision is
        committed, or the `GatewayError` it is refused with (`Intake.take`, which says what
        ``parsed`` promises)."""
        return self.intake.take(requests, principal, batch, parsed)

    def finish(self, batch: Batch) -> None:
        """Append what a `batch` of `take` decided."""
        self.intake.finish(batch)

    async def submit(self, request: AgentRequest, principal: str | None = None) -> Ack:
        """`take` of one request, awaited to its ack."""
        return await self.take([request], principal)[0]

    async def _submit_anywhere(self, request: AgentRequest) -> Ack:
        """A request of the gateway's own (a call, an answer), wherever its agent is."""
        if self.elsewhere is not None and request.agent_id not in self.agents:
            return await self.elsewhere.forward(request)
        return await self.submit(request)

    async def operate(
        self, agent_id: str, action: OperatorAction, principal: str, run_id: str | None = None
    ) -> list[Decision]:
        """An operator command (release, abort a run, clear the queue), after its commit."""
        event = OperatorCommand(
            at=self.clock.now_ms(), action=action, principal=principal, run_id=run_id
        )
        return await self.report(agent_id, event)

    async def configure(self, agent_id: str, config: AgentConfig, principal: str) -> bool:
        """Change an agent's config (for requests from now on); False if nothing changed."""
        event = ConfigChanged(at=self.clock.now_ms(), config=config, principal=principal)
        decisions = await self.report(agent_id, event)
        self.configs[agent_id] = config
        return bool(decisions)

    def _scheduled_states(self) -> Iterator[AgentState]:
        return (agent.core.state for agent in list(self.agents.values()))

    async def report(self, agent_id: str, event: Input) -> list[Decision]:
        """Any other input from outside (a broker report, say), after its commit."""
        outcome = self.feed(self.agent(agent_id), event)
        await self.committed(outcome)
        return outcome.decisions

    # --------------------------------------------------------------------- the core

    def agent(self, agent_id: str) -> Agent:
        """An agent that may be given an input now (`NotRunning`, `UnknownAgent`, `NotOwner`
        or `AgentUnavailable` while it is rebuilt)."""
        if not self.running:
            raise NotRunning()
        agent = self.agents.get(agent_id)
        if agent is None:
            raise UnknownAgent(agent_id) if self.elsewhere is None \
                else self.elsewhere.missing(agent_id)
        if agent.phase is Phase.REBUILDING:
            raise AgentUnavailable(agent_id, self.faults.reason(agent.fault))
        return agent

    def present(self, agent_id: str) -> Agent | None:
        """The agent if this process holds it, whatever its phase."""
        return self.agents.get(agent_id)

    def _live(self, agent: Agent) -> bool:
        """Whether ``agent`` decides and acts here now."""
        return self.running and agent.live

    def feed(self, agent: Agent, event: Input) -> Outcome[Decision]:
        """Decide an input and enqueue its events; the commit resolves with them."""
        base = agent.core.version
        decisions, events = self.intake.decide(agent, event)
        return self.append(agent, base, events, decisions)

    def append(self, agent: Agent, base: int, events: list[Any], decisions: list[Decision]
               ) -> Outcome[Decision]:
        """Enqueue decided events (at stream version ``base``); effects follow the commit."""
        # The control lane never waits behind other agents' flood in the commit queue.
        urgent = any(type(d) is ControlApplied for d in decisions)
        return agent.core.append(base, events, decisions, urgent)

    async def committed(self, outcome: Outcome[Decision]) -> list[RecordedEvent]:
        """The records of an outcome once committed (a `GatewayError` if they were not)."""
        if outcome.commit is None:
            return []
        try:
            return await asyncio.shield(outcome.commit)
        except BaseException as error:
            raise self.commit_error(error) from None

    def commit_error(self, error: BaseException) -> BaseException:
        """What a failed commit is said to be to whoever waits for it."""
        agents, faults = self.agents, self.faults
        return commit_error(error, lambda stream: faults.reason(
            None if (agent := agents.get(stream)) is None else agent.fault))

    def after_commit(self, agent: Agent, decisions: list[Decision],
                     records: list[RecordedEvent], took: float, urgent: bool) -> None:
        """An append of ``agent`` committed: what its decisions start follows now."""
        self.faults.committed()
        self.commit_latency.observe(took)
        if urgent:
            self.control_commit_latency.observe(took)
        last = records[-1]
        agent.controls.committed(last.version)  # an agent's appends commit in order
        self.snapshots.seen(last)
        self.snapshots.committed(len(records), self.running, self._quiet, self._live_fold)
        if not self._live(agent):
            return
        agent_id = agent.agent_id
        for decision in decisions:
            if type(decision) not in _STARTS_AFTER_COMMIT:  # (most: a request queued, say)
                continue
            if isinstance(decision, RunStarted):
                self.runs.start(agent, decision)
            elif isinstance(decision, AgentCallDispatched):
                self.calls.call(agent_id, decision)
            elif isinstance(decision, CallAnswered):
                self.calls.answer(agent_id, decision)
            elif isinstance(decision, CallEnded):
                if decision.withdraw:
                    self.calls.withdraw(agent_id, decision)
            else:
                assert isinstance(decision, OrderAccepted | OrderCancelRequested)
                self.orders.send(agent_id, decision)

    async def _undeliverable(self, parent: str, event: CallUndeliverable) -> None:
        """A call of ``parent`` could not be delivered: recorded at the caller, if it is
        still decided here."""
        agent = self.agents.get(parent)
        if agent is not None and self._live(agent):
            await self.committed(self.feed(agent, event))

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of the engine's (a run, a delivery): cancelled and awaited on stop."""
        task = spawn(coro, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------------ timers

    def reschedule(self, agent: Agent) -> None:
        """Set the agent's timer for its next due time (none once it is gone)."""
        if agent.phase is Phase.GONE:
            agent.core.cancel_timer()
            return
        agent.core.schedule(next_due(agent.state, self.clock.now_ms()))

    def tick(self, agent: Agent) -> None:
        """The agent's timer came: time passes in its stream."""
        if self._live(agent):
            self.feed(agent, TimerElapsed(at=self.clock.now_ms()))
            self.reschedule(agent)
