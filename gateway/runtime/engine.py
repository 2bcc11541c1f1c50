"""The runtime: feeds inputs through `lanes.decide`, appends, and acts after the commit.

One input at a time per agent (everything that decides runs synchronously on the loop), so
an agent's events are appended in the order they were decided. A caller is answered only
after the commit that holds its decision. Effects follow one rule: *stop early, start
late* — an aborted run is cancelled as soon as the abort is decided (never wait to stop
trading), while runs start and calls go out only after their decision is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

from gateway.base.clock import Clock, SystemClock
from gateway.base.metrics import DURATION_BUCKETS, LATENCY_BUCKETS, Histogram
from gateway.base.process import gc_paused
from gateway.base.quarantine import PLAIN, LogReader, log_reader
from gateway.base.tasks import spawn
from gateway.errors import (
    AgentUnavailable,
    BadFrame,
    GatewayError,
    NotOwner,
    NotRunning,
    StorageFailed,
    Superseded,
    UnknownAgent,
    Unstorable,
    storage_fault_kind,
)
from gateway.llm.reasoner import Reasoner, RunContext, RunResult, SimulatedReasoner, SpendLimitError
from gateway.runtime.core import EventIds, Outcome, StreamCore
from gateway.runtime.effects import ControlEffect
from gateway.runtime.schedules import Scheduler, check_count, manual_request
from gateway.runtime.schedules import check as check_schedule
from gateway.runtime.snapshots import KEEP, load_latest, seal, snapshot_of_log
from lanes import AgentConfig, AgentRequest, AgentState, AgentStatus, decide, next_due
from lanes import replay as fold
from lanes import status as agent_status
from lanes.codec import AGENT_CODEC, Unrepeatable
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
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRepeated,
    RequestSummarized,
    Restarted,
    RunAborted,
    RunCompleted,
    RunErrored,
    RunFailed,
    RunFinished,
    RunStarted,
    RunSteerability,
    RunSteered,
    RunsUnheld,
    ScheduleChanged,
    SpendLimitHit,
    Stopping,
    TimerElapsed,
    answer_id,
    withdrawal_id,
)
from lanes.evolve import fold as fold_events
from lanes.replay import Answer, LogFold, track_call
from lanes.requests import ControlAction, Kind
from lanes.schedules import FILE_PRINCIPAL, SCHEDULER, Schedule
from lanes.snapshot import dump_fold
from lanes.state import ActiveRun
from lanes.streams import is_agent_stream
from store.port import (
    ConcurrencyError,
    EventStore,
    Fence,
    FencedError,
    NewEvent,
    RecordedEvent,
    StoreError,
    WriteFailed,
)

if TYPE_CHECKING:
    from gateway.base.pacing import Pacer
    from gateway.market.broker import Broker
    from gateway.runtime.gate import ProviderGate, SlotGate

log = logging.getLogger("gateway.runtime.engine")
CALL_ATTEMPTS = 10
"""How often delivering a sub-agent call is tried while the target is unavailable (being
rebuilt, or moving between the processes of a cluster: about 20 s in all)."""
CALL_BACKOFF_MAX_S = 4.0
RETRY_CALL_CODES: Final = frozenset({"unavailable", "storage_failed"})
"""What a call's delivery is tried again after (its target may take it a moment later)."""
SNAPSHOT_EVERY = 100_000
"""Agent events committed between two snapshots of the fold, by default."""
REPLICA_WAIT_S: Final = 2.0
"""How long an adoption waits for the replicas to follow the log (for the calls it holds)."""
NOT_DECIDED: Final = sys.maxsize
MAX_HELD: Final = 100
"""Most controls held for one agent (beyond it, new ones are refused as usual)."""
DECIDE_STEP: Final = 50
"""Requests of a batch decided before other work may run (about 1-2 ms of the loop; the
requests of one agent are still appended once per batch, `_Group`)."""
FAULT_LOG_INTERVAL_S = 60.0
"""A storage fault that comes back with the same reason within this long is not logged again
(a nearly full disk takes small commits and refuses big ones: it would flap)."""


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to a submission, given only after its decision is committed."""

    request_id: str
    decision: str
    """``accepted``, ``deduped``, ``dropped`` or ``rejected``."""
    position: int
    """Log position of the event that holds the decision."""
    reason: str | None = None
    repeated: bool = False
    """True when the requestId was seen before: this is its first decision again."""
    effect: ControlEffect | None = None
    """What an accepted control did (`control_effect`); None for anything else."""


@dataclass(slots=True)
class StorageFault:
    """The event log refuses writes (locked by another process, disk full, I/O error)."""

    reason: str
    """Why, in words (no SQL)."""
    since: int
    """When the first commit failed (ms since the epoch)."""
    failed: int = 1
    """Commits failed since."""


HELD_ACTIONS: Final = frozenset({ControlAction.EMERGENCY_STOP, ControlAction.PAUSE,
                                ControlAction.CANCEL_ALL, ControlAction.CANCEL_ORDER})
"""Control actions that reduce risk: when one cannot be stored (the log refuses writes), the
gateway holds it and stores it itself as soon as the log can be written, before anything else
of its agent (a resume or a release is not held: it would act later than asked)."""


class Forwarder(Protocol):
    """Sends requests for agents another gateway process owns to that process (when several
    share the log: `gateway.runtime.cluster`)."""

    async def submit_many(self, owner: str, requests: Sequence[AgentRequest],
                          principal: str | None) -> list[Ack | GatewayError]:
        """Submit ``requests`` at the process serving at ``owner``: an answer for each."""
        ...


@dataclass(slots=True)
class _Agent:
    core: StreamCore[AgentState, Input, Decision]
    """The agent's stream: its state, appends in flight, rebuilds and timer."""
    owned: bool = True
    """Whether this process decides for the agent. When several processes share the log,
    only the one holding the agent's lease does; the others keep a replica of its state,
    folded from the log as it commits (`Engine.adopt`, `Engine.hand_over`)."""
    run: asyncio.Task[None] | None = None
    context: RunContext | None = None
    run_started: dict[str, float] = field(default_factory=dict)
    held: dict[str, tuple[RequestReceived, int]] = field(default_factory=dict)
    """Risk-reducing controls not known to be stored yet, by request id, with the stream
    version their decision reaches (`NOT_DECIDED` while the agent was being rebuilt)."""
    refused: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_HELD))
    """Other controls (resume, release) refused during a storage fault, by request id."""
    superseded: set[str] = field(default_factory=set)
    """Of those, the ones a held control came after: a retry of one is refused (it would
    undo the later stop)."""
    open: _Group | None = None
    """Decided for the agent and not appended yet (a `Engine.submit_many` between steps)."""
    fault: str | None = None
    """Why its last append failed: the storage error it is being rebuilt after (said to
    whoever it refuses meanwhile, also once other appends commit again)."""

    @property
    def state(self) -> AgentState:
        """The live state (decided; its latest events may still be committing)."""
        return self.core.state

    @property
    def recovering(self) -> bool:
        """Being rebuilt from the log after a failed append."""
        return self.core.recovering


class _Hooks:
    """What an agent's `StreamCore` tells the engine (`gateway.runtime.core.Listener`)."""

    __slots__ = ("agent", "engine")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.agent: _Agent | None = None

    def committed(self, decisions: list[Decision], records: list[RecordedEvent],
                  seconds: float, urgent: bool) -> None:
        assert self.agent is not None
        self.engine._after_commit(self.agent, decisions, records, seconds, urgent)

    def failed(self, decisions: list[Decision], error: BaseException | None) -> None:
        # A conflict follows an earlier failure; a fenced append is no storage fault.
        if error is not None and not isinstance(error, ConcurrencyError | FencedError):
            assert self.agent is not None
            self.agent.fault = self.engine._storage_failed(error)

    def lost(self) -> None:
        assert self.agent is not None
        self.engine._lost(self.agent)

    def rebuilt(self, records: list[RecordedEvent]) -> None:
        assert self.agent is not None
        self.engine._rebuilt(self.agent, records)

    def due(self) -> None:
        assert self.agent is not None
        self.engine._tick(self.agent)

    def fenced(self, error: FencedError) -> None:
        assert self.agent is not None
        self.engine._fenced(self.agent, error)


@dataclass(slots=True, eq=False)
class _Group:
    """The requests of one agent in one `Engine.submit_many` call, decided across its steps
    and appended once (`Engine._close`): when the call has decided them all, or as soon as
    anything else is decided for the agent (its appends keep the order of its decisions)."""

    agent: _Agent
    base: int
    events: list[NewEvent] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    outcome: Outcome[Decision] = field(default_factory=lambda: Outcome([], None))
    closed: bool = False


class Engine:
    """Every agent's lanes, live, over an event store."""

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
        snapshot_every: int | None = SNAPSHOT_EVERY,
        snapshot_worker: bool = False,
        ids: Callable[[], str] | None = None,
        clustered: bool = False,
        schedules: Mapping[str, Sequence[Schedule]] | None = None,
    ) -> None:
        """``reasoners`` gives each agent's reasoner (default: one shared simulation);
        orders accepted by the trading gate go to ``broker`` (none: they stay open).
        ``gates`` are the provider gates by name (started and stopped with the engine);
        ``agent_gates`` names the gate each agent's LLM calls go through (none: ungated).
        A snapshot of the fold is stored once ``snapshot_every`` agent events were folded or
        committed since the last one, and at a graceful stop (None: never). With
        ``snapshot_worker``, and a store another process can open (`EventStore.url`), the
        periodic ones are folded from the log by a worker process, so that serialising a big
        desk never holds the event loop. ``ids`` makes event ids (default: `EventIds`).
        A ``clustered`` engine shares its log with other gateway processes: it owns no agent
        until `adopt` (a `gateway.runtime.cluster.Cluster` decides which), keeps a replica of the
        others, and forwards their requests (`forwarder`) to their owners (`owner_of`).
        ``schedules`` are the config file's schedules per agent (`gateway.runtime.schedules`):
        applied when the engine first owns the agent, then fired by `scheduler`."""
        if snapshot_every is not None and snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1 or None: {snapshot_every}")
        self.broker = broker
        self.gates: dict[str, ProviderGate] = dict(gates or {})
        self._agent_gates = dict(agent_gates or {})
        unknown = sorted(set(self._agent_gates.values()) - set(self.gates))
        if unknown:
            raise ValueError(f"agents name provider gates that do not exist: {unknown}")
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self._configs = dict(agents)
        self._file_configs = dict(agents)
        """The configs the engine was built with (its config file's), never changed."""
        self._file_schedules = {agent: tuple(found) for agent, found in (schedules or {}).items()}
        for found in self._file_schedules.values():
            for schedule in found:
                check_schedule(schedule)
        self.scheduler = Scheduler(self.clock, self._scheduled_states, self._fire_schedule,
                                   self._apply_file_schedules)
        """Fires the schedules of the agents this process owns."""
        self._gates_by_stream = {gate.stream: gate for gate in self.gates.values()}
        if reasoners is None:
            shared = SimulatedReasoner()
            reasoners = lambda _agent_id: shared  # noqa: E731
        self._reasoners = reasoners
        self._agents: dict[str, _Agent] = {}
        self._ids = ids or EventIds()
        self.ids = self._ids if isinstance(self._ids, EventIds) else None
        """The event ids (a cluster member sets their prefix to its own id's)."""
        self._snapshot_every = snapshot_every
        self._snapshot_worker = snapshot_worker and store.url is not None
        self._snapshot_pool: ProcessPoolExecutor | None = None
        self._since_snapshot = 0
        """Agent events folded or committed that the newest snapshot does not hold."""
        self._position = 0
        self._anchor = ""
        """The last committed agent event seen: its position and id."""
        self._reader = PLAIN
        """Decodes the log, with the events an operator set aside replaced."""
        self._snapshotting: asyncio.Task[None] | None = None
        self.snapshot_loaded: int | None = None
        """The position of the snapshot the start continued from, if any."""
        self._in_flight: set[asyncio.Future[list[RecordedEvent]]] = set()
        self._open_groups = 0
        """Groups of `submit_many` decided and not appended yet (`_Group`)."""
        self._rebuilds: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        """Runs and call deliveries: cancelled and awaited on stop."""
        self._deliveries: set[asyncio.Task[None]] = set()
        self.commit_latency = Histogram(LATENCY_BUCKETS)
        """Seconds from an append being decided to its commit."""
        self.control_commit_latency = Histogram(LATENCY_BUCKETS)
        """Of those, the control lane's (an applied stop, pause, resume or cancel): how long
        an operator's control waits for the log, past the commit queue."""
        self.run_durations = Histogram(DURATION_BUCKETS)
        """Seconds from a run's start to its end, however it ended."""
        self.requests_received = 0
        self.storage_fault: StorageFault | None = None
        """Set while commits fail (from the first failure to the next commit)."""
        self._fault_said: tuple[str, float] | None = None
        """The kind of storage fault last logged, and when (monotonic seconds)."""
        self._fault_open = False
        """A logged storage fault whose end is not logged yet."""
        self._running = False
        self.clustered = clustered
        self.forwarder: Forwarder | None = None
        """Where requests for agents owned elsewhere go (clustered; None: refused)."""
        self.owner_of: Callable[[str], str | None] = lambda _stream: None
        """The URL of the process owning a stream now (clustered; set by the cluster)."""
        self.locate: Callable[[str], Awaitable[str | None]] = _nowhere
        """`owner_of`, reading the leases again if need be (clustered)."""
        self.on_fenced: Callable[[str], None] = lambda _stream: None
        """Told of a stream whose lease this process lost (an append was fenced)."""
        self._calls: dict[str, tuple[str, AgentCallDispatched]] = {}
        """Clustered: sub-agent calls dispatched and not received yet, by call id (an
        adopted agent delivers its own)."""
        self._answers: dict[str, Answer] = {}
        """Clustered: answers to sub-agent calls not received by their caller yet, by the id
        of the request that carries them (an adopted agent delivers its own)."""
        self._replicas: asyncio.Task[None] | None = None
        self._followed = asyncio.Event()
        """Set whenever the replicas followed a batch of the log."""
        self.run_gates: dict[str, SlotGate] = {}
        """Clustered: how runs reach each provider gate (`gateway.runtime.peers.RoutedGate`)."""

    # ------------------------------------------------------------------- life cycle

    async def start(self, *, principal: str = "config") -> None:
        """Rebuild every agent from the log, apply the configs, abort runs cut off by a
        restart (their requests go back to the head of the queue), and start timers."""
        await self.store.open()
        try:
            self._reader = await log_reader(self.store)
            for gate in self.gates.values():
                gate.owned = not self.clustered  # clustered: a replica until adopted
                await gate.start()
            log_fold, stale = await self._load()
        except BaseException:
            for gate in self.gates.values():
                await gate.stop()
            await self.store.close()
            raise
        states = log_fold.states
        if self.clustered:  # nothing is owned yet: every agent a replica of the log
            for agent_id in sorted({*states, *self._configs}):
                self._agents[agent_id] = self._new_agent(
                    states.get(agent_id) or AgentState(agent_id=agent_id), owned=False)
            self._calls = dict(log_fold.calls)
            self._answers = dict(log_fold.answers)
            self._running = True
            self._replicas = spawn(self._follow_replicas(log_fold.position), "replicas")
            self._spawn(self.scheduler.run(), "scheduler")
            return
        if self._snapshot_every is not None and log_fold.position and (
            self._since_snapshot >= self._snapshot_every or stale
        ):
            self._snapshot(log_fold, stale)  # before any input: the fold is exactly the log
        # In a fixed order: the Restarted events below land in it, so two starts of one log
        # (with a snapshot or without, in any process) append the very same events.
        for agent_id in sorted({*states, *self._configs}):
            self._agents[agent_id] = self._new_agent(
                states.get(agent_id) or AgentState(agent_id=agent_id))
        self._running = True
        now = self.clock.now_ms()
        for agent_id, config in self._configs.items():
            self._feed(
                self._agents[agent_id], ConfigChanged(at=now, config=config, principal=principal)
            )
        for agent in self._agents.values():
            self._feed(agent, Restarted(at=now))  # decides nothing unless something was cut off
            self._schedule(agent)
        for parent, call in list(log_fold.calls.values()):
            self._deliver_call(parent, call)
        for child, answer in list(log_fold.answers.values()):
            self._deliver_answer(child, answer)
        if self.broker is not None:  # orders still open in the log go to the broker again
            for agent in self._agents.values():
                for order in agent.state.orders.values():
                    self._spawn(self.broker.place(agent.state.agent_id, order.order_id,
                                                  order.intent), f"place {order.order_id}")
        await self.flush(rebuilt=False)  # a log that cannot be written: serve anyway
        self._spawn(self.scheduler.run(), "scheduler")

    def _new_agent(self, state: AgentState, owned: bool = True) -> _Agent:
        hooks = _Hooks(self)
        agent_id = state.agent_id
        core: StreamCore[AgentState, Input, Decision] = StreamCore(
            agent_id, state, store=self.store, clock=self.clock, codec=AGENT_CODEC,
            decide=decide, rebuild=partial(self._fold_stream, agent_id), listener=hooks,
            ids=self._ids, pending=self._in_flight, rebuilds=self._rebuilds,
            paced=lambda: self._running)
        agent = hooks.agent = _Agent(core, owned=owned)
        return agent

    def _fold_stream(self, agent_id: str, records: list[RecordedEvent]) -> AgentState:
        """An agent's state folded from its stream (a rebuild)."""
        return fold(self._reader.entries(records)).get(agent_id) or AgentState(agent_id=agent_id)

    async def _load(self) -> tuple[LogFold, list[int]]:
        """The fold of the whole log: from the newest usable snapshot, plus the events after
        it; and the positions of snapshots ignored (outdated or damaged)."""
        with gc_paused():
            loaded = await load_latest(self.store)
            log_fold = loaded.fold
            records = await self.store.read(after=log_fold.position)
            tail = self._reader.entries(records)
            log_fold.add(tail)
        if loaded.snapshot is not None:
            self.snapshot_loaded = loaded.snapshot.position
        self._since_snapshot = len(tail)
        if records:
            log_fold.position = records[-1].position
            self._anchor = records[-1].event_id
        elif log_fold.position:
            self._anchor = (await self.store.read(log_fold.position - 1, 1))[0].event_id
        self._position = log_fold.position
        return log_fold, list(loaded.ignored)

    def _snapshot(self, log_fold: LogFold, replacing: Sequence[int] = ()) -> None:
        """Store a snapshot of ``log_fold`` in the background (serialised now, while the
        states cannot change; compressed and written off the loop), deleting the unusable
        ones at ``replacing``."""
        if self._snapshotting is not None and not self._snapshotting.done():
            return
        raw = dump_fold(log_fold, self._anchor)
        self._since_snapshot = 0
        self._snapshotting = spawn(self._write_snapshot(log_fold.position, raw, replacing),
                                   "snapshot")

    async def _write_snapshot(self, position: int, raw: bytes, replacing: Sequence[int]) -> None:
        try:
            snapshot = await asyncio.to_thread(seal, position, raw, self.clock.now_ms())
            if replacing:
                await self.store.delete_snapshots(replacing)
            await self.store.save_snapshot(snapshot, KEEP)
        except StoreError as error:  # a cache: the log is intact, the next one will do
            log.warning("snapshot at %d not stored: %s", position, error)

    def _snapshot_from_log(self) -> None:
        """Have a worker process fold the log up to the last commit into a snapshot and store
        it (in the background; one at a time)."""
        if self._snapshotting is not None and not self._snapshotting.done():
            return
        self._since_snapshot = 0
        self._snapshotting = spawn(self._store_snapshot_of_log(self._position), "snapshot")

    async def _store_snapshot_of_log(self, position: int) -> None:
        url = self.store.url
        assert url is not None
        if self._snapshot_pool is None:  # a fresh interpreter: no fork of a threaded process
            self._snapshot_pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice, initargs=(19,))  # the gateway's own work comes first
        try:
            snapshot = await asyncio.get_running_loop().run_in_executor(
                self._snapshot_pool, snapshot_of_log, url, position, self.clock.now_ms())
            if snapshot is not None:
                await self.store.save_snapshot(snapshot, KEEP)
        except (StoreError, BrokenProcessPool, OSError) as error:  # a cache: the next will do
            log.warning("snapshot at %d not stored: %s", position, error)

    def _quiet(self) -> bool:
        """Whether the live states are exactly the fold of the log up to ``_position``, with
        no sub-agent call on its way: nothing decided is uncommitted, no agent is being
        rebuilt, no call is being delivered."""
        # An agent being rebuilt has its rebuild task in ``_rebuilds`` until it is back.
        return not (self._in_flight or self._rebuilds or self._deliveries
                    or self._open_groups)

    def _live_fold(self) -> LogFold:
        states = {agent_id: agent.state for agent_id, agent in self._agents.items()}
        return LogFold(states=states, position=self._position)

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop taking inputs, abort runs, cancel timers, finish every commit, close the store.

        Gracefully, runs in flight are recorded as aborted (reason ``shutdown``) with their
        requests back at the head of the queue, and a snapshot of the fold is stored;
        otherwise (as if the process died) the next start records them (reason
        ``restart``).
        """
        if graceful and self._running:
            now = self.clock.now_ms()
            for agent in self._agents.values():
                if agent.owned and not agent.recovering:
                    self._feed(agent, Stopping(at=now))
        calls_cut_off = bool(self._deliveries)
        self._running = False
        if self._replicas is not None:
            self._replicas.cancel()
            await asyncio.gather(self._replicas, return_exceptions=True)
        for agent in self._agents.values():
            agent.core.cancel_timer()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for gate in self.gates.values():  # after the runs: their slots are given back
            await gate.stop()
        await self.flush()
        for agent in self._agents.values():
            if agent.held:
                log.error("stopping with controls of %s that could not be stored (the event "
                          "log refused them): %s; send them again after the restart",
                          agent.state.agent_id, ", ".join(agent.held))
        if self._snapshotting is not None:
            await self._snapshotting
        if (graceful and self._snapshot_every is not None and self._since_snapshot
                and not calls_cut_off and self._quiet() and not self.clustered):
            self._snapshot(self._live_fold())
        if self._snapshotting is not None:
            await self._snapshotting
        if self._snapshot_pool is not None:
            await asyncio.to_thread(self._snapshot_pool.shutdown)
            self._snapshot_pool = None
        await self.store.close()

    async def flush(self, *, rebuilt: bool = True) -> None:
        """Wait until every append decided so far is committed (or has failed), every
        sub-agent call is delivered (or recorded as undeliverable), and (unless ``rebuilt``
        is False) every agent rebuilt after a failed commit is back: while the log cannot
        be written, an agent cut off in a run is rebuilt again and again."""
        while self._in_flight or self._deliveries or (rebuilt and self._rebuilds):
            waiting: list[asyncio.Future[Any]] = [
                *self._in_flight, *self._deliveries, *(self._rebuilds if rebuilt else ())
            ]
            await asyncio.wait(waiting)

    # ----------------------------------------------------------------------- cluster

    async def adopt(self, agent_id: str, fence: Fence) -> None:
        """Own an agent from now on (this process holds its lease at ``fence``): its state
        is folded from the log again, then it goes on as after a restart: a run its previous
        owner was cut off in is recorded aborted (``restart``) and run again, the config
        file's agent table applied if it changed since it was last applied, timers set, its
        undelivered sub-agent calls and open orders sent again."""
        agent = self._agents.get(agent_id)
        if agent is None:
            agent = self._agents[agent_id] = self._new_agent(AgentState(agent_id=agent_id),
                                                             owned=False)
        if agent.owned:
            agent.core.fence = fence
            return
        records = await self.store.read_stream(agent_id)
        await self._replicas_reach(await self.store.last_position())  # its calls known
        agent.core.state = self._fold_stream(agent_id, records)
        agent.core.fence = fence
        agent.owned = True
        if not self._running:
            return
        now = self.clock.now_ms()
        config = self._file_configs.get(agent_id)
        if config is not None and config != self._last_file_config(records):
            self._configs[agent_id] = config
            self._feed(agent, ConfigChanged(at=now, config=config, principal="config"))
        else:
            self._configs[agent_id] = agent.state.config
        self._feed(agent, Restarted(at=now))  # decides nothing unless a run was cut off
        self._schedule(agent)
        for parent, call in list(self._calls.values()):
            if parent == agent_id:
                self._deliver_call(parent, call)
        for child, answer in list(self._answers.values()):
            if child == agent_id:
                self._deliver_answer(child, answer)
        if self.broker is not None:  # its open orders go to this process's broker
            for order in agent.state.orders.values():
                self._spawn(self.broker.place(agent_id, order.order_id, order.intent),
                            f"place {order.order_id}")

    def _last_file_config(self, records: list[RecordedEvent]) -> AgentConfig | None:
        """The config the config file last gave an agent, from its stream."""
        for record in reversed(records):
            if record.type == ConfigChanged.__name__:
                event = self._reader.decode(record)
                if isinstance(event, ConfigChanged) and event.principal == "config":
                    return event.config
        return None

    async def hand_over(self, agent_id: str) -> None:
        """Stop owning an agent gracefully (its lease goes to another process): a run in
        flight is recorded aborted (``shutdown``), its requests back at the head of the
        queue for the next owner, and everything decided for it is committed."""
        agent = self._agents.get(agent_id)
        if agent is None or not agent.owned:
            return
        if self._running and not agent.recovering:
            self._feed(agent, Stopping(at=self.clock.now_ms()))
        self._disown(agent)
        # Its own appends settled (those of other agents, and rebuilds that go on while the
        # log refuses writes, are not waited for).
        last = agent.core.last_commit
        if last is not None and not last.done():
            await asyncio.wait([last])
        await self._refresh(agent)

    def lose(self, agent_id: str) -> None:
        """Stop owning an agent at once: its lease is another process's already (this one
        did not renew it in time), so nothing more is written for it from here."""
        agent = self._agents.get(agent_id)
        if agent is not None and agent.owned:
            self._disown(agent)
            self._spawn(self._refresh(agent), f"refresh {agent_id}")

    @property
    def owned(self) -> list[str]:
        """The agents this process decides for."""
        return sorted(a for a, agent in self._agents.items() if agent.owned)

    def _disown(self, agent: _Agent) -> None:
        if agent.open is not None:  # decided while it was this process's: appended now
            self._close(agent.open)
        agent.owned = False
        agent.core.fence = None
        agent.core.cancel_timer()
        if agent.run is not None:
            agent.run.cancel()
            agent.run = agent.context = None
        if agent.held:
            log.error("controls of %s held during a storage fault were not stored before "
                      "another process took the agent over: %s; send them again",
                      agent.state.agent_id, ", ".join(agent.held))
        agent.held.clear()
        agent.refused.clear()
        agent.superseded.clear()

    def _fenced(self, agent: _Agent, error: FencedError) -> None:
        """An append of the agent was refused: another process holds its lease now."""
        if not agent.owned:
            return
        log.warning("%s; agent %s is another process's now", error, agent.state.agent_id)
        self.lose(agent.state.agent_id)
        self.on_fenced(agent.state.agent_id)

    async def _refresh(self, agent: _Agent) -> None:
        """Fold a replica from the log again (read again while the log cannot be read)."""
        agent_id = agent.state.agent_id
        while not agent.owned:
            try:
                records = await self.store.read_stream(agent_id)
            except StoreError:
                await self.clock.sleep(500)
                continue
            if not agent.owned:
                agent.core.state = self._fold_stream(agent_id, records)
            return

    async def _replicas_reach(self, position: int) -> None:
        """Wait (up to `REPLICA_WAIT_S`) until the replicas have followed the log up to
        ``position``: the sub-agent calls on their way are known then."""
        deadline = time.monotonic() + REPLICA_WAIT_S  # (waiting on I/O: real time)
        while self._position < position and self._replicas is not None:
            self._followed.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._followed.wait()
            except TimeoutError:
                log.warning("the replicas are behind the log (at %d of %d)", self._position,
                            position)
                return

    async def _follow_replicas(self, after: int) -> None:
        """Keep the replicas of agents (and provider gates) owned elsewhere folded from the
        log as it commits, and the sub-agent calls on their way."""
        follow = self.store.follow_batches(after)
        async with contextlib.aclosing(follow) as batches:
            async for batch in batches:
                for record in batch:
                    if record.position > self._position:
                        self._position, self._anchor = record.position, record.event_id
                    if is_agent_stream(record.stream):
                        self._replicate(record)
                    else:
                        gate = self._gates_by_stream.get(record.stream)
                        if gate is not None:
                            gate.replicate(record)
                self._followed.set()

    def _replicate(self, record: RecordedEvent) -> None:
        event = self._reader.decode(record)
        track_call(self._calls, self._answers, record.stream, event)
        agent = self._agents.get(record.stream)
        if agent is None:
            agent = self._agents[record.stream] = self._new_agent(
                AgentState(agent_id=record.stream), owned=False)
        if agent.owned:
            return
        state = agent.core.state
        if record.version == state.version + 1:
            fold_events(state, [event])
        elif record.version > state.version + 1:  # missed some (a refresh is under way)
            self._spawn(self._refresh(agent), f"refresh {record.stream}")

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
        return self._running

    @property
    def agent_ids(self) -> list[str]:
        """Every agent, configured or found in the log."""
        return sorted(self._agents)

    def state(self, agent_id: str) -> AgentState:
        """The live state of an agent (decided; its latest events may still be committing;
        while it is rebuilt after a failed commit, the state it had decided)."""
        return self._agent(agent_id, writing=False).state

    def gate_of(self, agent_id: str) -> ProviderGate | None:
        """The provider gate an agent's LLM calls go through, if any."""
        name = self._agent_gates.get(agent_id)
        return None if name is None else self.gates[name]

    def run_gate_of(self, agent_id: str) -> SlotGate | None:
        """The gate an agent's runs take their slots from: its provider gate, or (set in
        `run_gates`) the way to it when another process may own it."""
        name = self._agent_gates.get(agent_id)
        if name is None:
            return None
        return self.run_gates.get(name) or self.gates[name]

    def status(self, agent_id: str) -> AgentStatus:
        """Observability for one agent, now."""
        return agent_status(self.state(agent_id), self.clock.now_ms())

    # ----------------------------------------------------------------------- inputs

    async def submit(self, request: AgentRequest, principal: str | None = None,
                     forward: bool = True) -> Ack:
        """Decide a request and answer once the decision is durable (an agent another
        process owns: there, if ``forward``)."""
        return await self.decide_now(request, principal, forward)

    def decide_now(self, request: AgentRequest, principal: str | None = None,
                   forward: bool = True) -> Coroutine[Any, Any, Ack]:
        """`submit` with the decision made at once, when called (its effects too: a stop's
        run is cancelled there and then); what it returns awaits the commit and gives the
        ack. An input that cannot be stored raises `Unstorable` at once."""
        received = RequestReceived(at=self.clock.now_ms(), request=request, principal=principal)
        try:
            agent = self._agent(request.agent_id)
        except AgentUnavailable as error:
            return _raise(self._hold(received, error))
        except NotOwner as error:
            return self._forward_one(error, request, principal, forward)
        if agent.superseded and request.request_id in agent.superseded:
            return _raise(Superseded(request))
        return self._acked(agent, received, self._feed(agent, received))

    async def _acked(self, agent: _Agent, received: RequestReceived,
                     outcome: Outcome[Decision]) -> Ack:
        request = received.request
        try:
            records = await self._committed(outcome)
        except StorageFailed as error:
            raise self._hold(received, error) from None
        if agent.refused and request.request_id in agent.refused:
            agent.refused.remove(request.request_id)  # stored at last: nothing to supersede
        return _ack(request.request_id, outcome.decisions, records)

    async def _forward_one(self, error: NotOwner, request: AgentRequest,
                           principal: str | None, forward: bool) -> Ack:
        owner = error.owner or await self.locate(request.agent_id) if forward else None
        if owner is None or self.forwarder is None:
            raise error
        answer = (await self.forwarder.submit_many(owner, [request], principal))[0]
        if isinstance(answer, GatewayError):
            raise answer
        return answer

    async def submit_many(
        self, requests: Sequence[AgentRequest], principal: str | None = None,
        pacer: Pacer | None = None, forward: bool = True,
    ) -> list[Ack | GatewayError]:
        """Decide several requests in order, each answered after its commit.

        The requests of one agent share one append (one future, one version check), so a
        batch costs far less than as many `submit` calls. A request that cannot be taken
        (unknown agent, say) gets its error in its place; the others go on. Requests are
        decided `DECIDE_STEP` at a time, letting other work (a stop) run in between: a big
        batch never holds the loop for long; with a ``pacer`` (the feed's), each step takes
        its turn. Requests for agents another process owns go there (if ``forward``), one
        call per owner, while this process's own are committed.
        """
        at = self.clock.now_ms()
        placed: list[tuple[str, _Group, int, list[Decision]] | GatewayError] = []
        groups: dict[str, _Group] = {}
        try:
            for start in range(0, len(requests), DECIDE_STEP):
                chunk = requests[start:start + DECIDE_STEP]
                if pacer is not None:
                    async with pacer.turn():
                        placed += self._place(chunk, at, principal, groups)
                    continue
                if start:
                    await asyncio.sleep(0)
                placed += self._place(chunk, at, principal, groups)
        finally:  # every decision appended, whatever happens to the call
            for group in groups.values():
                self._close(group)
        remote = self._forward(requests, placed, principal) if forward else None
        answers: list[Ack | GatewayError] = []
        for item in placed:
            if isinstance(item, GatewayError):
                answers.append(item)
                continue
            request_id, group, offset, decisions = item
            try:
                records = await self._committed(group.outcome)
            except GatewayError as error:
                request = requests[len(answers)]
                answers.append(self._hold(
                    RequestReceived(at=at, request=request, principal=principal), error))
            else:
                if group.agent.refused and request_id in group.agent.refused:
                    group.agent.refused.remove(request_id)  # stored at last
                answers.append(_ack(request_id, decisions, records[offset:]))
        if remote is not None:
            for index, answer in (await remote).items():
                answers[index] = answer
        return answers

    def _forward(self, requests: Sequence[AgentRequest],
                 placed: Sequence[tuple[str, _Group, int, list[Decision]] | GatewayError],
                 principal: str | None) -> asyncio.Future[dict[int, Ack | GatewayError]] | None:
        """Send the requests ``placed`` found owned elsewhere to their owners (one call per
        owner, all at once); the answers by index, when they come."""
        moved = [(index, item) for index, item in enumerate(placed)
                 if isinstance(item, NotOwner)]
        forwarder = self.forwarder
        if not moved or forwarder is None:
            return None

        async def send(owner: str, indexes: list[int]) -> dict[int, Ack | GatewayError]:
            answers = await forwarder.submit_many(owner, [requests[i] for i in indexes],
                                                  principal)
            return dict(zip(indexes, answers, strict=True))

        async def gather() -> dict[int, Ack | GatewayError]:
            owners: dict[str, list[int]] = {}
            for index, error in moved:
                owner = error.owner or await self.locate(error.agent_id)
                if owner is not None:
                    owners.setdefault(owner, []).append(index)
            found: dict[int, Ack | GatewayError] = {}
            for part in await asyncio.gather(*(send(o, i) for o, i in owners.items())):
                found.update(part)
            return found

        return asyncio.ensure_future(gather())

    def _place(self, requests: Sequence[AgentRequest], at: int, principal: str | None,
               groups: dict[str, _Group]
               ) -> list[tuple[str, _Group, int, list[Decision]] | GatewayError]:
        """Decide requests in order into ``groups`` (one per agent, left open for the next
        step of the same call): for each request, its group with its decisions, or the
        error it gets."""
        placed: list[tuple[str, _Group, int, list[Decision]] | GatewayError] = []
        for request in requests:
            received = RequestReceived(at=at, request=request, principal=principal)
            try:
                agent = self._agent(request.agent_id)
            except GatewayError as error:
                placed.append(self._hold(received, error))
                continue
            if agent.superseded and request.request_id in agent.superseded:
                placed.append(Superseded(request))
                continue
            group = groups.get(request.agent_id)
            if group is None or group.closed:  # (closed: something else came in between)
                if agent.open is not None:
                    self._close(agent.open)
                group = groups[request.agent_id] = agent.open = _Group(agent,
                                                                       agent.state.version)
                self._open_groups += 1
            try:
                decisions, events = self._decide(agent, received, group)
            except Unstorable as error:  # refused before anything changed: the rest go on
                placed.append(error)
                continue
            placed.append((request.request_id, group, len(group.events), decisions))
            group.events += events
            group.decisions += decisions
        return placed

    def _close(self, group: _Group) -> None:
        """Append what ``group`` decided (once)."""
        if group.closed:
            return
        group.closed = True
        self._open_groups -= 1
        agent = group.agent
        if agent.open is group:
            agent.open = None
        group.outcome = self._append(agent, group.base, group.events, group.decisions)

    async def operate(
        self, agent_id: str, action: OperatorAction, principal: str, run_id: str | None = None
    ) -> list[Decision]:
        """An operator command (release, abort a run, clear the queue), after its commit."""
        event = OperatorCommand(
            at=self.clock.now_ms(), action=action, principal=principal, run_id=run_id
        )
        outcome = self._feed(self._agent(agent_id), event)
        await self._committed(outcome)
        return outcome.decisions

    async def configure(self, agent_id: str, config: AgentConfig, principal: str) -> bool:
        """Change an agent's config (for requests from now on); False if nothing changed."""
        event = ConfigChanged(at=self.clock.now_ms(), config=config, principal=principal)
        outcome = self._feed(self._agent(agent_id), event)
        await self._committed(outcome)
        self._configs[agent_id] = config
        return bool(outcome.decisions)

    async def set_schedule(self, agent_id: str, schedule_id: str, schedule: Schedule | None,
                           principal: str) -> bool:
        """Define (add, replace, pause, resume) or remove (``schedule`` None) one of an
        agent's schedules, after its commit; False if nothing changed. `BadFrame` for a
        schedule that is not one (time zone, cron, too many) or one to remove that is not."""
        agent = self._agent(agent_id)
        if schedule is None:
            self.schedule(agent_id, schedule_id)  # (`BadFrame` if there is none to remove)
        else:
            if schedule.id != schedule_id:
                raise BadFrame("invalid", f"the schedule's id {schedule.id!r} is not "
                               f"{schedule_id!r}, the one named in the path", field="id")
            check_schedule(schedule)
            check_count(agent.state, schedule_id)
        outcome = self._feed(agent, ScheduleChanged(at=self.clock.now_ms(),
                                                    schedule_id=schedule_id,
                                                    schedule=schedule, principal=principal))
        await self._committed(outcome)
        self.scheduler.poke()
        return bool(outcome.decisions)

    def schedule(self, agent_id: str, schedule_id: str) -> Schedule:
        """One of an agent's schedules (`BadFrame` ``not_found`` if it has none by that id)."""
        entry = self.state(agent_id).schedules.get(schedule_id)
        if entry is None:
            raise BadFrame("not_found", f"agent {agent_id!r} has no schedule {schedule_id!r}; "
                           f"list them with GET /api/agents/{agent_id}")
        return entry.schedule

    async def run_schedule(self, agent_id: str, schedule_id: str, principal: str) -> Ack:
        """Fire a schedule now, by hand (its next automatic firing stays as it was)."""
        request = manual_request(agent_id, self.schedule(agent_id, schedule_id),
                                 self.clock.now_ms())
        return await self.submit(request, principal)

    def _scheduled_states(self) -> list[AgentState]:
        return [agent.state for agent in self._agents.values() if agent.owned]

    async def _fire_schedule(self, request: AgentRequest) -> None:
        await self.submit(request, SCHEDULER, forward=False)

    async def _apply_file_schedules(self, state: AgentState) -> None:
        """The config file's schedules of an agent this process owns now: those it changed
        are applied (a pause made at runtime stays), those it no longer has removed."""
        agent_id = state.agent_id
        wanted = {schedule.id: schedule for schedule in self._file_schedules.get(agent_id, ())}
        for schedule_id, entry in list(state.schedules.items()):
            if entry.from_file and schedule_id not in wanted:
                await self.set_schedule(agent_id, schedule_id, None, FILE_PRINCIPAL)
        for schedule_id, schedule in wanted.items():
            stored = state.schedules.get(schedule_id)
            if stored is None or stored.schedule.timing() != schedule.timing():
                if stored is not None:
                    schedule = schedule.model_copy(update={"paused": stored.schedule.paused})
                await self.set_schedule(agent_id, schedule_id, schedule, FILE_PRINCIPAL)

    async def report(self, agent_id: str, event: Input) -> list[Decision]:
        """Any other input from outside (a broker report, say), after its commit."""
        outcome = self._feed(self._agent(agent_id), event)
        await self._committed(outcome)
        return outcome.decisions

    # --------------------------------------------------------------------- the core

    def _agent(self, agent_id: str, *, writing: bool = True) -> _Agent:
        if not self._running:
            raise NotRunning()
        agent = self._agents.get(agent_id)
        if agent is None:
            raise UnknownAgent(agent_id)
        if writing and not agent.owned:
            raise NotOwner(agent_id, self.owner_of(agent_id))
        if writing and agent.recovering:
            raise AgentUnavailable(agent_id, self._fault_of(agent))
        return agent

    def _feed(self, agent: _Agent, event: Input) -> Outcome[Decision]:
        """Decide an input and enqueue its events; the commit resolves with them."""
        base = agent.core.version
        decisions, events = self._decide(agent, event)
        return self._append(agent, base, events, decisions)

    def _decide(self, agent: _Agent, event: Input, into: _Group | None = None
                ) -> tuple[list[Decision], list[NewEvent]]:
        """Decide an input: the decisions and the events to append (none if none). What
        is open for the agent, unless it is ``into``, is appended first."""
        if agent.open is not None and agent.open is not into:
            self._close(agent.open)
        state = agent.state
        if type(event) is RequestReceived:
            self.requests_received += 1
        try:  # before anything changes: an input that would not read back is never taken
            encoded = agent.core.encode(event)
        except Unrepeatable as error:
            what = f"request {event.request.request_id!r}" if type(event) is RequestReceived \
                else type(event).__name__
            raise Unstorable(what, str(error), error.field) from None
        decisions, events = agent.core.decide(event, encoded)
        if not decisions:
            return decisions, []
        if type(event) is RequestReceived and event.request.action in HELD_ACTIONS:
            agent.held[event.request.request_id] = (event, state.version)
            if agent.refused:  # a stop after a refused resume: that resume must not follow
                agent.superseded.update(agent.refused)
                agent.refused.clear()
        # Stop early: an abort takes effect at once, and a steer reaches the run at once
        # (a failed commit cancels the run, so nothing uncommitted outlives the failure).
        for decision in decisions:
            if isinstance(decision, RunAborted | RunCompleted | RunFailed):
                self._run_ended(agent, decision.run_id)
            if isinstance(decision, RunAborted):
                self._cancel_run(agent, decision.run_id)
            elif isinstance(decision, RunSteered):
                self._deliver_steer(agent, decision)
        self._schedule(agent)
        return decisions, events

    def _append(
        self, agent: _Agent, base: int, events: list[NewEvent], decisions: list[Decision]
    ) -> Outcome[Decision]:
        """Enqueue decided events (at stream version ``base``); effects follow the commit."""
        # The control lane never waits behind other agents' flood in the commit queue.
        urgent = any(type(d) is ControlApplied for d in decisions)
        return agent.core.append(base, events, decisions, urgent)

    async def _committed(self, outcome: Outcome[Decision]) -> list[RecordedEvent]:
        if outcome.commit is None:
            return []
        try:
            return await asyncio.shield(outcome.commit)
        except WriteFailed as error:
            raise StorageFailed(error.reason) from None
        except FencedError as error:  # another process owns the agent now: ask it there
            raise NotOwner(error.stream, None) from None
        except ConcurrencyError as error:
            # Decided on top of an append of its agent that failed: that failure is the cause.
            agent, fault = self._agents.get(error.stream), self.storage_fault
            reason = self._fault_of(agent) if agent is not None \
                else None if fault is None else fault.reason
            raise StorageFailed("an earlier append of this agent was not recorded" + (
                "" if reason is None else f": {reason}")) from None
        except StoreError as error:
            raise StorageFailed(str(error)) from None

    def _after_commit(self, agent: _Agent, decisions: list[Decision],
                      records: list[RecordedEvent], took: float, urgent: bool) -> None:
        if self.storage_fault is not None:
            self._storage_back()
        self.commit_latency.observe(took)
        if urgent:
            self.control_commit_latency.observe(took)
        last = records[-1]
        if agent.held:  # an agent's appends commit in order: all up to here are stored
            agent.held = {rid: held for rid, held in agent.held.items() if held[1] > last.version}
        if last.position > self._position:
            self._position, self._anchor = last.position, last.event_id
        self._since_snapshot += len(records)
        if (self._snapshot_every is not None and self._since_snapshot >= self._snapshot_every
                and self._running):
            if self._snapshot_worker:
                self._snapshot_from_log()
            elif self._quiet():
                self._snapshot(self._live_fold())
        if not self._running or agent.recovering or not agent.owned:
            return
        for decision in decisions:
            if isinstance(decision, RunStarted):
                self._start_run(agent, decision)
            elif isinstance(decision, AgentCallDispatched):
                self._deliver_call(agent.state.agent_id, decision)
            elif isinstance(decision, CallAnswered):
                self._deliver_answer(agent.state.agent_id, decision)
            elif isinstance(decision, CallEnded) and decision.withdraw:
                self._withdraw_call(agent.state.agent_id, decision)
            elif isinstance(decision, OrderAccepted) and self.broker is not None:
                self._spawn(self.broker.place(agent.state.agent_id, decision.order_id,
                                              decision.intent), f"place {decision.order_id}")
            elif isinstance(decision, OrderCancelRequested) and self.broker is not None:
                self._spawn(self.broker.cancel(agent.state.agent_id, decision.order_id),
                            f"cancel {decision.order_id}")

    # -------------------------------------------------------------------------- runs

    def _start_run(self, agent: _Agent, started: RunStarted) -> None:
        run = agent.state.active
        if run is None or run.run_id != started.run_id:
            return  # aborted before its start was even committed
        context = RunContext(
            agent_id=agent.state.agent_id,
            run_id=run.run_id,
            requests=[p.request for p in run.requests],
            summary=started.summary,
            depth=run.depth,
            clock=self.clock,
            report_steerable=partial(self._steerable, agent, run.run_id),
            gate=self.run_gate_of(agent.state.agent_id),
        )
        agent.context = context
        agent.run_started[run.run_id] = time.perf_counter()
        agent.run = self._spawn(self._run(agent, run, context), f"run {run.run_id}")

    async def _run(self, agent: _Agent, run: ActiveRun, context: RunContext) -> None:
        reasoner = self._reasoners(agent.state.agent_id)
        event: Input
        try:
            result: RunResult = await reasoner.run(context)
        except asyncio.CancelledError:
            raise
        except SpendLimitError as error:
            log.warning("run %s: %s; agent %s paused until resume", run.run_id, error,
                        agent.state.agent_id)
            event = SpendLimitHit(at=self.clock.now_ms(), run_id=run.run_id,
                                  provider=error.provider, reason=error.reason[:500])
        except Exception as error:
            log.warning("run %s failed: %r", run.run_id, error)
            event = RunErrored(
                at=self.clock.now_ms(), run_id=run.run_id, error=_describe(error)
            )
        else:
            event = RunFinished(
                at=self.clock.now_ms(),
                run_id=run.run_id,
                outcome=result.outcome,
                usage=result.usage,
                orders=result.orders,
                calls=result.calls,
                answer=result.answer,
                call_results=result.call_results,
            )
        finally:
            if agent.context is context:
                agent.run = agent.context = None
        if self._running and agent.owned and not agent.recovering:
            try:
                self._feed(agent, event)
            except Unstorable as error:  # a result the log could not hold: the run failed
                log.warning("run %s: %s", run.run_id, error)
                self._feed(agent, RunErrored(at=event.at, run_id=run.run_id,
                                             error=_describe(error)))

    def _steerable(self, agent: _Agent, run_id: str, steerable: bool) -> None:
        if self._running and agent.owned and not agent.recovering:
            self._feed(
                agent, RunSteerability(at=self.clock.now_ms(), run_id=run_id, steerable=steerable)
            )

    def _run_ended(self, agent: _Agent, run_id: str) -> None:
        started = agent.run_started.pop(run_id, None)
        if started is not None:
            self.run_durations.observe(time.perf_counter() - started)

    def _deliver_steer(self, agent: _Agent, steered: RunSteered) -> None:
        context = agent.context
        run = agent.state.active
        if context is None or run is None or context.run_id != steered.run_id:
            return  # the run's task has not started yet: it gets its requests from the state
        request = next(
            p.request for p in reversed(run.requests)
            if p.request.request_id == steered.request_id
        )
        context.deliver_steer(request)

    def _cancel_run(self, agent: _Agent, run_id: str) -> None:
        if agent.context is not None and agent.context.run_id == run_id and agent.run:
            agent.run.cancel()
            agent.run = agent.context = None

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = spawn(coro, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _deliver_call(self, parent: str, call: AgentCallDispatched) -> None:
        task = self._spawn(self._dispatch_call(parent, call), f"call {call.call_id}")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _dispatch_call(self, parent: str, call: AgentCallDispatched) -> None:
        """Deliver a committed sub-agent call; if it cannot be, the parent records why.

        The call id is the request id, so delivering twice (after a restart) is harmless.
        """
        request = AgentRequest(
            request_id=call.call_id,
            created_at=_utc(self.clock.now_ms()),
            agent_id=call.target,
            kind=Kind.AGENT_CALL,
            priority=call.priority,
            source=f"agent:{parent}",
            payload={**call.payload, "depth": call.depth, "parentRunId": call.run_id},
        )
        reason = await self._submit_retrying(request)
        if reason is None:
            return
        parent_agent = self._agents.get(parent)
        if (self._running and parent_agent is not None and parent_agent.owned
                and not parent_agent.recovering):
            undeliverable = CallUndeliverable(
                at=self.clock.now_ms(), call_id=call.call_id, run_id=call.run_id,
                target=call.target, reason=f"call {call.call_id} not delivered: {reason}",
            )
            await self._committed(self._feed(parent_agent, undeliverable))

    async def _submit_retrying(self, request: AgentRequest) -> str | None:
        """Submit a request of the gateway's own (a call, an answer) to its agent, wherever
        it is owned, trying again while the agent is unavailable; why it could not be, or
        None once it is decided."""
        reason = ""
        for attempt in range(CALL_ATTEMPTS):
            try:
                await self.submit(request)
                return None
            except GatewayError as error:
                reason = str(error)
                if error.code not in RETRY_CALL_CODES:
                    break
                # (its agent is being rebuilt, or moves to another process: wait for it)
                await asyncio.sleep(min(CALL_BACKOFF_MAX_S, 0.1 * 2**attempt))
        return reason

    def _deliver_answer(self, child: str, answer: CallAnswered) -> None:
        task = self._spawn(self._send_answer(child, answer), f"answer {answer.result.call_id}")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _send_answer(self, child: str, answer: CallAnswered) -> None:
        """Deliver a committed answer to the agent that made the call, as a ``call_result``
        request (forwarded to its owner like any request). Its id is fixed by the call's, so
        delivering twice (after a restart) is harmless."""
        result = answer.result
        request = AgentRequest(
            request_id=answer_id(result.call_id),
            created_at=_utc(self.clock.now_ms()),
            agent_id=answer.parent,
            kind=Kind.CALL_RESULT,
            source=f"agent:{child}",
            payload=result.model_dump(mode="json", by_alias=True, exclude_none=True),
        )
        reason = await self._submit_retrying(request)
        if reason is not None:  # the caller times the call out, if it has a timeout
            log.warning("the answer to call %s (%s) did not reach %s: %s", result.call_id,
                        result.status.value, answer.parent, reason)

    def _withdraw_call(self, caller: str, ended: CallEnded) -> None:
        task = self._spawn(self._send_withdrawal(caller, ended), f"withdraw {ended.call_id}")
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _send_withdrawal(self, caller: str, ended: CallEnded) -> None:
        """Tell the target of a call its caller gave up on (a ``call_cancel`` request), so
        that it drops what is still to do for it. Best effort: not sent again after a
        restart (the target's answer is then refused by the caller, as late)."""
        request = AgentRequest(
            request_id=withdrawal_id(ended.call_id),
            created_at=_utc(self.clock.now_ms()),
            agent_id=ended.result.target,
            kind=Kind.CALL_CANCEL,
            source=f"agent:{caller}",
            payload={"callId": ended.call_id, "status": ended.result.status.value},
        )
        reason = await self._submit_retrying(request)
        if reason is not None:
            log.warning("call %s was not withdrawn from %s: %s", ended.call_id,
                        ended.result.target, reason)

    # ------------------------------------------------------------------------ timers

    def _schedule(self, agent: _Agent) -> None:
        if not agent.owned:
            agent.core.cancel_timer()
            return
        agent.core.schedule(next_due(agent.state, self.clock.now_ms()))

    def _tick(self, agent: _Agent) -> None:
        if self._running and agent.owned:
            self._feed(agent, TimerElapsed(at=self.clock.now_ms()))
            self._schedule(agent)

    # ---------------------------------------------------------------------- recovery

    def _hold(self, received: RequestReceived, error: GatewayError) -> GatewayError:
        """The error to answer a request that could not be stored with; a risk-reducing
        control is held, to be stored by the gateway itself once the log can be written."""
        request = received.request
        agent = self._agents.get(request.agent_id)
        action = request.action
        if (agent is None or action is None
                or not isinstance(error, StorageFailed | AgentUnavailable)):
            return error
        if action not in HELD_ACTIONS:
            agent.refused.append(request.request_id)
            return error
        if isinstance(error, AgentUnavailable) and request.request_id not in agent.held:
            if len(agent.held) >= MAX_HELD:
                return error
            # Not decided (its agent is being rebuilt): the rebuild stores it first.
            agent.held[request.request_id] = (received, NOT_DECIDED)
        elif request.request_id not in agent.held:
            return error  # stored meanwhile after all (a commit reported failed went through)
        if agent.refused:
            agent.superseded.update(agent.refused)
            agent.refused.clear()
        if isinstance(error, StorageFailed):
            return StorageFailed(error.detail, held=True)
        reason = self._fault_of(agent)
        return StorageFailed("the agent is being rebuilt from the log" + (
            "" if reason is None else f": {reason}"), held=True)

    def _fault_of(self, agent: _Agent) -> str | None:
        """Why ``agent`` is being rebuilt: the storage error now, else its own last one."""
        fault = self.storage_fault
        return agent.fault if fault is None else fault.reason

    def _storage_failed(self, error: BaseException) -> str:
        """Note a failed commit; say so in the log once per fault (not once per append).
        The reason in words."""
        reason = error.reason if isinstance(error, WriteFailed) else str(error)
        fault = self.storage_fault
        if fault is not None and fault.reason == reason:
            fault.failed += 1
            return reason
        self.storage_fault = StorageFault(reason, self.clock.now_ms(),
                                          1 if fault is None else fault.failed + 1)
        now = time.monotonic()
        said = self._fault_said
        kind = storage_fault_kind(reason)  # a flapping disk changes the details
        if said is not None and said[0] == kind and now - said[1] < FAULT_LOG_INTERVAL_S:
            log.debug("the event log cannot be written again: %s", reason)
            return reason
        log.error("the event log cannot be written: %s. Requests are refused (clients are "
                  "told to retry) until it can be again; reads go on", reason)
        self._fault_said = (kind, now)
        self._fault_open = True
        return reason

    def _storage_back(self) -> None:
        fault = self.storage_fault
        assert fault is not None
        self.storage_fault = None
        if not self._fault_open:
            return
        self._fault_open = False
        log.warning("the event log is written again, %.1f s after the first failed commit "
                    "(%d failed meanwhile)", (self.clock.now_ms() - fault.since) / 1000,
                    fault.failed)

    def _lost(self, agent: _Agent) -> None:
        """The agent's state ran ahead of the log and is being rebuilt: its run stops (what
        it started was not recorded)."""
        log.debug("an append of %s failed; rebuilding it from the log", agent.state.agent_id)
        if agent.run is not None:
            agent.run.cancel()
            agent.run = agent.context = None

    def _rebuilt(self, agent: _Agent, records: list[RecordedEvent]) -> None:
        """The agent's state is the fold of its stream again."""
        agent_id = agent.state.agent_id
        agent.fault = None
        if records and records[-1].position > self._position:
            # A commit reported as failed reached the log all the same: the fold holds it.
            self._position, self._anchor = records[-1].position, records[-1].event_id
        seen = agent.state.seen
        agent.held = {rid: held for rid, held in agent.held.items() if rid not in seen}
        if self._running and agent.owned:  # (handed over meanwhile: the owner goes on)
            # Held stops first: a run cut off by the failure must not start again before them.
            for received, _ in list(agent.held.values()):
                self._feed(agent, RequestReceived(at=self.clock.now_ms(),
                                                  request=received.request,
                                                  principal=received.principal))
            config = self._configs.get(agent_id)
            if config is not None and agent.state.config != config:
                # The start's config change was not stored (the log refused it): again.
                self._feed(agent, ConfigChanged(at=self.clock.now_ms(), config=config,
                                                principal="config"))
            if agent.state.active is not None:
                self._feed(agent, Restarted(at=self.clock.now_ms()))
        self._schedule(agent)


async def _nowhere(_stream: str) -> str | None:
    return None


async def _raise(error: GatewayError) -> Ack:
    raise error


def _ack(request_id: str, decisions: list[Decision], records: list[RecordedEvent]) -> Ack:
    for index, decision in enumerate(decisions):
        if getattr(decision, "request_id", None) != request_id:
            continue
        position = records[index + 1].position
        if isinstance(decision, ControlApplied):
            effect = control_effect(decision, decisions[index + 1:])
            return Ack(request_id, "accepted", position, effect=effect)
        if isinstance(decision, RequestQueued | RunSteered | CallEnded):
            return Ack(request_id, "accepted", position)  # (a call's result ends its call)
        if isinstance(decision, RequestDeduped):
            reason = f"duplicate of {decision.duplicate_of} ({decision.key})"
            return Ack(request_id, "deduped", position, reason)
        if isinstance(decision, RequestDropped | RequestSummarized):
            return Ack(request_id, "dropped", position, decision.reason)
        if isinstance(decision, RequestRejected):
            return Ack(request_id, "rejected", position, decision.reason)
        if isinstance(decision, RequestRepeated):
            return Ack(request_id, decision.first_decision, position, repeated=True)
    raise AssertionError(f"no decision for request {request_id}")


def control_effect(applied: ControlApplied, after: Sequence[Decision]) -> ControlEffect:
    """What a control did: its state change and the decisions it set off (``after``: the
    decisions that followed it for the same input)."""
    aborted = next((d.run_id for d in after if isinstance(d, RunAborted)), None)
    started = next((d.run_id for d in after if isinstance(d, RunStarted)), None)
    cancels = sum(isinstance(d, OrderCancelRequested) for d in after)
    unheld = any(isinstance(d, RunsUnheld) for d in after)
    calls = sum(isinstance(d, CallEnded) for d in after)
    changed = (applied.from_state is not applied.to_state or aborted is not None
               or started is not None or cancels > 0 or unheld or calls > 0)
    return ControlEffect(from_state=applied.from_state, to_state=applied.to_state,
                         changed=changed, aborted_run=aborted, cancels_requested=cancels,
                         unheld=unheld, started_run=started, calls_cancelled=calls)


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 500 else text[:497] + "..."


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
