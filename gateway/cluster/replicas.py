"""The streams decided by other processes, as the log says: one follower for them all.

Every process of a cluster serves reads of every agent and gate. The ones it does not decide
for are folded here from the log as it commits (`Replicas`): agents' states, the gates' states
(shown through `ProviderGate.mirror`), and the sub-agent calls and answers on their way (a
process that takes an agent over delivers its own). The follower is supervised: if it fails
it is started again from where it was, and while it is behind (`Replicas.behind`) reads of
the streams it folds say so (`Replicas.behind_of`: a ``behind`` field in the HTTP and
WebSocket answers) and so may a readiness probe (`Replicas.behind_reason`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from gateway.base.clock import Clock
from gateway.base.quarantine import PLAIN, LogReader, log_reader
from gateway.base.tasks import spawn
from gateway.cluster.adoption import catch_up, catch_up_gate
from gateway.runtime.gate import ProviderGate
from gateway.runtime.snapshots import fold_log
from lanes import AgentState
from lanes.evolve import fold as fold_events
from lanes.gate import GateState, decode_gate_event, evolve_gate
from lanes.replay import Answer, Call, track_call
from lanes.streams import is_agent_stream
from store.port import EventStore, RecordedEvent, StoreError

log = logging.getLogger("gateway.cluster.replicas")

REACH_WAIT_S: Final = 2.0
"""How long an adoption waits for the follower to reach the log's end (for the calls)."""
RESTART_MS: Final = 500
"""The wait before a failed follower starts again (and between reads that fail)."""


class Replicas:
    """Agents and gates decided elsewhere, folded from the log as it commits.

    ``holds(stream)`` says whether this process decides for a stream (then it is not
    folded here: the engine or the gate has it)."""

    def __init__(self, store: EventStore, clock: Clock, agents: Iterable[str],
                 gates: Mapping[str, ProviderGate], holds: Callable[[str], bool]) -> None:
        self._store = store
        self._clock = clock
        self._holds = holds
        self._gates = {gate.stream: gate for gate in gates.values()}
        self._gate_states: dict[str, GateState] = {}
        self.states: dict[str, AgentState] = {a: AgentState(agent_id=a) for a in agents}
        self.calls: dict[str, Call] = {}
        """Sub-agent calls dispatched and not received yet, by call id."""
        self.answers: dict[str, Answer] = {}
        """Answers to calls not received by their caller yet, by the answer's request id."""
        self.position = 0
        """The last position followed."""
        self.behind: str | None = None
        """Why the follower is not following the log now (None: it is)."""
        self.behind_since: int | None = None
        """Since when (the clock's ms) it is not (None: it is)."""
        self._reader: LogReader = PLAIN
        self._followed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshing: dict[str, int] = {}
        """Streams being read again (`refresh`), each with the last version of it the
        follower passed over meanwhile (left to the read: it copies the replica)."""

    async def start(self) -> None:
        """Fold the whole log once, then follow it in the background."""
        self._reader = await log_reader(self._store)
        log_fold, _tail, _loaded = await fold_log(self._store, self._reader)
        for agent_id, state in log_fold.states.items():
            self.states[agent_id] = state
        self.calls, self.answers = dict(log_fold.calls), dict(log_fold.answers)
        self.position = log_fold.position
        for stream, gate in self._gates.items():
            gate_state = self._gate_states[stream] = gate.state
            gate.mirror(gate_state)
        self._task = spawn(self._supervise(), "replicas")

    async def stop(self) -> None:
        """Stop following."""
        tasks = [t for t in (self._task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    def behind_reason(self) -> str | None:
        """Why reads of the streams decided elsewhere may be stale now (the follower of the
        log failed and is starting again), or None while they follow the log: for a
        readiness probe (``/readyz``) to report."""
        return self.behind

    def behind_of(self, stream: str) -> dict[str, Any] | None:
        """What a read of ``stream`` says of its staleness: ``{"since": ms, "reason": ...}``
        while the follower is behind and the stream is read from it (decided elsewhere),
        else None (it is exactly as committed, or decided here)."""
        if self.behind is None or self._holds(stream):
            return None
        return {"since": self.behind_since, "reason": self.behind}

    def state(self, agent_id: str) -> AgentState | None:
        """An agent's state as the log says (None: no such agent)."""
        return self.states.get(agent_id)

    def gate_state(self, stream: str) -> GateState | None:
        """A provider gate's state as the log says (None: not followed here)."""
        return self._gate_states.get(stream)

    def agent_ids(self) -> Iterable[str]:
        """Every agent known from the log or the config."""
        return self.states.keys()

    async def reach(self, position: int) -> None:
        """Wait (up to `REACH_WAIT_S`) until the follower has reached ``position``: the
        sub-agent calls on their way are known then."""
        deadline = time.monotonic() + REACH_WAIT_S  # (waiting on I/O: real time)
        while self.position < position and self._task is not None:
            self._followed.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._followed.wait()
            except TimeoutError:
                log.warning("the replicas are behind the log (at %d of %d)", self.position,
                            position)
                return

    def refresh(self, stream: str) -> None:
        """Read what the replica of a stream lacks from the log, in the background (it left
        this process, or the follower missed some of it): from the replica's version on
        (it is a fold of a prefix of the stream), one read at a time per stream, a read
        under way going on to the stream's end."""
        if stream in self._refreshing:
            return
        self._refreshing[stream] = 0
        task = spawn(self._refresh(stream), f"refresh {stream}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self, stream: str) -> None:
        try:
            while not self._holds(stream):
                self._refreshing[stream] = 0
                try:
                    version = await self._read_again(stream)
                except StoreError:
                    await self._clock.sleep(RESTART_MS)
                    continue
                # Done unless the follower passed over an event the read did not reach.
                if version is None or self._refreshing[stream] <= version:
                    return
        finally:
            self._refreshing.pop(stream, None)

    async def _read_again(self, stream: str) -> int | None:
        """The replica of ``stream`` caught up with the log, a chunk at a time (the loop
        given back in between); its version (None: this process decides for it now)."""
        gate = self._gates.get(stream)
        if gate is None:
            agent = (await catch_up(self._store, self._reader, stream,
                                    self.states.get(stream), None)).state
            if self._holds(stream):
                return None
            self.states[stream] = agent
            return agent.version
        state = await catch_up_gate(self._store, stream, self._gate_states.get(stream))
        if self._holds(stream):
            return None
        self._gate_states[stream] = state
        gate.mirror(state)
        return state.version

    async def _supervise(self) -> None:
        """Follow the log; started again from where it was if it fails."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never stop following: say so, and go on
                self._fell_behind(f"following the log failed ({error!r}); starting again")
                await self._clock.sleep(RESTART_MS)

    def _fell_behind(self, reason: str) -> None:
        if self.behind_since is None:
            self.behind_since = self._clock.now_ms()
        self.behind = reason
        log.warning("replicas: %s", reason)

    def _caught_up(self) -> None:
        if self.behind is not None:
            log.info("replicas: following the log again (behind since %s)", self.behind_since)
        self.behind = self.behind_since = None

    async def _follow(self) -> None:
        follow = self._store.follow_batches(self.position)
        if self.behind is not None and self.position >= await self._store.last_position():
            self._caught_up()  # (started again on a quiet log: nothing to read yet)
        async with contextlib.aclosing(follow) as batches:
            async for batch in batches:
                self._caught_up()
                for record in batch:
                    self._replicate(record)
                    self.position = max(self.position, record.position)
                self._followed.set()

    def _replicate(self, record: RecordedEvent) -> None:
        stream = record.stream
        if is_agent_stream(stream):
            event = self._reader.decode(record)
            track_call(self.calls, self.answers, stream, event)
            state = self.states.get(stream)
            if state is None:
                state = self.states[stream] = AgentState(agent_id=stream)
            if self._holds(stream) or self._passed_over(stream, record):
                return
            if record.version == state.version + 1:
                fold_events(state, [event])
            elif record.version > state.version + 1:  # missed some: read it again
                self.refresh(stream)
            return
        gate_state = self._gate_states.get(stream)
        if gate_state is None or self._holds(stream) or self._passed_over(stream, record):
            return
        if record.version == gate_state.version + 1:
            evolve_gate(gate_state, decode_gate_event(record.type, record.data))
        elif record.version > gate_state.version + 1:
            self.refresh(stream)

    def _passed_over(self, stream: str, record: RecordedEvent) -> bool:
        """Whether ``record`` is left to a read of its stream under way (noted for it)."""
        if stream not in self._refreshing:
            return False
        self._refreshing[stream] = max(self._refreshing[stream], record.version)
        return True
