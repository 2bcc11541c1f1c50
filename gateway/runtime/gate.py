"""One provider's gate, live: `lanes.gate` decisions appended to ``provider:<name>``.

A run calls `ProviderGate.acquire` before it calls the LLM and `release` after (or the
slot is cancelled when the run is aborted or crashes: leaving `acquire` or `using` by an
exception frees it). A grant reaches the caller only after the commit that holds it, so a
restart honours what the log says was granted, waiting or backing off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.base.clock import Clock
from gateway.base.metrics import WAIT_BUCKETS, Histogram
from gateway.errors import GatewayError, StorageFailed, Unstorable
from gateway.llm.reasoner import CallGate
from gateway.runtime.core import Commit, EventIds, StreamCore
from gateway.runtime.phases import DECIDING, IllegalPhase, Phase
from lanes.codec import Unrepeatable
from lanes.gate import (
    GATE_CODEC,
    GateState,
    GateStatus,
    decide_gate,
    decode_gate_event,
    fold_gate,
    gate_status,
    next_gate_due,
    unnamed,
)
from lanes.gate.events import (
    CallOutcome,
    GateDecision,
    GateInput,
    GateLimits,
    GateLimitsChanged,
    GateTimer,
    SlotCancelled,
    SlotGranted,
    SlotRefused,
    SlotReleased,
    SlotRequested,
)
from lanes.policy import POLICY, PolicyOffered
from lanes.requests import Priority
from lanes.streams import gate_stream
from store.port import (
    ConcurrencyError,
    EventStore,
    Fence,
    FencedError,
    RecordedEvent,
    WriteFailed,
)

log = logging.getLogger("gateway.runtime.gate")


class GateUnrecorded(StorageFailed):
    """A slot the gate decided could not be recorded (its log refused the write)."""

    def __init__(self, provider: str, reason: str) -> None:
        GatewayError.__init__(self, f"the provider gate {provider!r} could not record the "
                              f"slot: {reason}")
        self.detail, self.held = reason, False


class GateMoved(GatewayError):
    """The gate is another process's now (several share the log): ask its owner."""

    code = "unavailable"

    def __init__(self, provider: str) -> None:
        super().__init__(f"the provider gate {provider!r} moved to another gateway process; "
                         "ask again")
        self.provider = provider


class SlotRefusedError(GatewayError):
    """The gate refused the slot (waited too long, breaker open, retries exhausted...)."""

    code = "provider_refused"

    def __init__(self, refused: SlotRefused) -> None:
        # Said to the refused agent (its run's error lands in its log): other agents unnamed.
        super().__init__(f"{refused.code.value}: {unnamed(refused.reason)}")
        self.refused = refused


@dataclass(frozen=True, slots=True)
class Slot:
    """A granted slot: call the provider, then release it with the outcome."""

    slot_id: str
    lease_deadline: int
    probe: bool


SlotGate = CallGate[Slot]
"""What a run needs of its provider gate: slots, given back with how the provider answered
(`ProviderGate`, or `gateway.cluster.peers.RoutedGate` when another process owns it)."""


class ProviderGate:
    """The gate of one provider shared by every agent's runs."""

    def __init__(self, store: EventStore, provider: str, limits: GateLimits, clock: Clock,
                 ids: EventIds | None = None) -> None:
        self.store = store
        self.provider = provider
        self.stream = gate_stream(provider)
        self.clock = clock
        self._limits = limits
        self._ids = self.ids = ids or EventIds()
        self._waiters: dict[str, asyncio.Future[Slot]] = {}
        self._in_flight: set[Commit] = set()
        self._rebuilds: set[asyncio.Task[None]] = set()
        """The rebuild from the log after a failed append, while it is under way."""
        self._core: StreamCore[GateState, GateInput, GateDecision] = StreamCore(
            self.stream, GateState(provider=self.stream), store=store, clock=clock,
            codec=GATE_CODEC, decide=decide_gate, rebuild=self._fold, listener=self,
            ids=self._ids, pending=self._in_flight, rebuilds=self._rebuilds,
            paced=lambda: self._core.phase is not Phase.GONE, phase=Phase.NEW)
        self._held: list[GateInput] = []
        """Inputs that arrived during a rebuild, decided once it is done."""
        self._fault: str | None = None
        """Why appends fail, while they do (said in the server's log once)."""
        self.on_fenced: Callable[[str], None] = lambda _stream: None
        """Told when an append was fenced (the gate's lease is another process's)."""
        self.waits = Histogram(WAIT_BUCKETS)
        """From a slot's request to its grant, for the slots granted here (``/metrics``)."""

    async def start(self, *, load: bool = True) -> None:
        """Fold the gate from its stream and, with ``load``, decide for it from now on.

        No call of this process is in flight yet, so every slot the log shows granted or
        waiting belonged to a process that stopped or crashed: each is cancelled at once
        (recorded), instead of holding capacity until its lease deadline. A backoff or an
        open breaker in progress is kept.
        """
        records = await self.store.read_stream(self.stream)
        state = self._core.state
        fold_gate(state, (decode_gate_event(r.type, r.data) for r in records))
        self._core.move(Phase.LIVE if load else Phase.IDLE)
        if load:
            self._take_over(lambda _agent_id: False)
            await self.flush(rebuilt=False)  # a log that cannot be written: serve anyway

    def _take_over(self, keep: Callable[[str], bool]) -> None:
        """Free what the log shows waiting, and granted to agents not kept (their runs were
        in a process that stopped), apply the limits in force, set the timer."""
        state = self._core.state
        now = self.clock.now_ms()
        # Waiting ones first: freeing a lease first would grant them to nobody.
        for slot_id in [*state.waiting, *[s for s, lease in state.leases.items()
                                          if not keep(lease.agent_id)]]:
            self._feed(SlotCancelled(at=now, slot_id=slot_id))
        if state.version == 0 or state.limits != self._limits:
            self._feed(GateLimitsChanged(at=now, limits=self._limits))
        self._feed(PolicyOffered(at=now, version=POLICY))  # (decides nothing if known)
        self._schedule()

    # ------------------------------------------------------------- which process decides

    @property
    def phase(self) -> Phase:
        """Where the gate is in its life here (`gateway.runtime.phases`): NEW until started,
        IDLE while another process decides for it, LIVE (or REBUILDING) while this one does,
        GONE once stopped."""
        return self._core.phase

    @property
    def loaded(self) -> bool:
        """Whether this process decides for the gate (`load`). When several processes share
        the log only the one holding its lease does; on the others the gate is a read-only
        view of its stream (`mirror`), and runs ask the owner for slots."""
        return self._core.phase in DECIDING

    def load(self, records: list[RecordedEvent], fence: Fence,
             keep: Callable[[str], bool]) -> None:
        """Decide for the gate from now on (this process holds its lease at ``fence``),
        folded from ``records`` (its stream); slots that were waiting are freed (their runs
        ask the new owner), and granted ones too unless their agent is ``keep``-t (its run
        lives on in a process that is still up, and gives the slot back here). Loaded
        already: only the fence changes."""
        if self.loaded:
            self._core.fence = fence
            return
        self.adopt(self._fold(records), fence, keep)

    def adopt(self, state: GateState, fence: Fence, keep: Callable[[str], bool]) -> None:
        """`load` from the gate's ``state`` folded already (from its whole stream, or a
        replica of it and its tail), once started."""
        if self.loaded:
            self._core.fence = fence
            return
        if self._core.phase is Phase.GONE:
            return  # (stopped meanwhile: nothing is decided here any more)
        if self._core.phase is not Phase.IDLE:
            raise IllegalPhase(f"gate {self.provider} adopted while {self._core.phase.value}")
        self._core.state = state
        self._core.fence = fence
        self._core.move(Phase.LIVE)
        if state.version:  # limits set at runtime (on any member) stay: the log's are in force
            self._limits = self._core.state.limits
        self._take_over(keep)

    async def unload(self) -> None:
        """Stop deciding for the gate gracefully (its lease goes to another process):
        waiters are told to ask again, what was decided is committed."""
        if self.loaded:
            self.drop()
            await self.flush(rebuilt=False)

    def drop(self) -> None:
        """Stop deciding for the gate at once (its lease is another process's already)."""
        if not self.loaded:
            return
        self._core.move(Phase.IDLE)
        self._core.fence = None
        self._core.cancel_timer()
        self._held.clear()
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(GateMoved(self.provider))

    def mirror(self, state: GateState) -> None:
        """The gate as its stream says, while another process decides for it."""
        if not self.loaded:
            self._core.state = state

    def fenced(self, error: FencedError) -> None:
        """An append was refused: the gate is another process's now."""
        if self.loaded:
            log.warning("%s; the gate %s is another process's now", error, self.provider)
            self.drop()
            self.on_fenced(self.stream)

    async def stop(self) -> None:
        """Stop deciding; waiters are refused, timers cancelled, commits finished."""
        if self._core.phase is not Phase.GONE:
            self._core.move(Phase.GONE)
        if self._rebuilds:
            for task in self._rebuilds:
                task.cancel()
            await asyncio.gather(*self._rebuilds, return_exceptions=True)
            self._held.clear()
        self._core.cancel_timer()
        for future in self._waiters.values():
            if not future.done():
                future.cancel()
        await self.flush()

    async def flush(self, *, rebuilt: bool = True) -> None:
        """Wait for every append decided so far (and, unless ``rebuilt`` is False, for a
        rebuild in progress: while the log cannot be written, one follows another)."""
        while self._in_flight or (rebuilt and self._rebuilds):
            waiting: list[asyncio.Future[Any]] = [*self._in_flight,
                                                   *(self._rebuilds if rebuilt else ())]
            await asyncio.wait(waiting)

    def status(self) -> GateStatus:
        """Limits, window usage, waiting agents, breaker and next retry, now."""
        return gate_status(self._core.state, self.clock.now_ms())

    @property
    def limits(self) -> GateLimits:
        """The limits in force (the configured ones, or the last ones set at runtime)."""
        return self._limits

    async def set_limits(self, limits: GateLimits) -> bool:
        """New limits from now on (requests not yet granted get them), after the commit;
        False if they are the limits in force already."""
        if not self.loaded:
            raise GateMoved(self.provider)
        if limits == self._limits and self._core.state.limits == limits:
            return False
        self._limits = limits
        self._feed(GateLimitsChanged(at=self.clock.now_ms(), limits=limits))
        await self.flush()
        return True

    @property
    def state(self) -> GateState:
        """The live state (decided; its last events may still be committing)."""
        return self._core.state

    async def acquire(self, agent_id: str, run_id: str, priority: Priority = Priority.NORMAL,
                      input_tokens: int = 0, output_tokens: int = 0,
                      slot_id: str | None = None, weight: int = 1) -> Slot:
        """Wait for a slot (fairly, within the limits); `SlotRefusedError` if refused,
        `GateMoved` if the gate is (or goes) to another process meanwhile.

        Cancelled while waiting (the run was aborted), the request is withdrawn.
        """
        if not self.loaded:
            raise GateMoved(self.provider)
        slot_id = slot_id or f"{run_id}/{self._ids()}"
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters[slot_id] = future
        asked = self.clock.now_ms()
        self._feed(SlotRequested(at=asked, slot_id=slot_id, agent_id=agent_id,
                                 run_id=run_id, priority=priority, input_tokens=input_tokens,
                                 output_tokens=output_tokens, weight=weight))
        try:
            slot = await future
            self.waits.observe((self.clock.now_ms() - asked) / 1000)
            return slot
        except BaseException:
            self.cancel(slot_id)  # withdrawn (aborted) or failed: never left behind
            raise
        finally:
            self._waiters.pop(slot_id, None)

    def release(self, slot: Slot, outcome: CallOutcome, *, input_tokens: int | None = None,
                output_tokens: int | None = None, retry_after_ms: int | None = None,
                remaining_requests: int | None = None, remaining_tokens: int | None = None,
                reset_at: int | None = None) -> None:
        """Give a slot back with how the provider answered (and its rate-limit headers)."""
        self._feed(SlotReleased(
            at=self.clock.now_ms(), slot_id=slot.slot_id, outcome=outcome,
            input_tokens=_count(input_tokens), output_tokens=_count(output_tokens),
            retry_after_ms=_count(retry_after_ms), remaining_requests=_count(remaining_requests),
            remaining_tokens=_count(remaining_tokens), reset_at=reset_at))

    def cancel(self, slot_id: str) -> None:
        """Free a slot, waiting or granted, without an answer (abort, crash)."""
        self._feed(SlotCancelled(at=self.clock.now_ms(), slot_id=slot_id))

    @contextlib.asynccontextmanager
    async def using(self, agent_id: str, run_id: str, priority: Priority = Priority.NORMAL,
                    input_tokens: int = 0, output_tokens: int = 0, weight: int = 1
                    ) -> AsyncIterator[Slot]:
        """``async with gate.using(...) as slot:`` — a slot that is always given back.

        Release it inside with the outcome; leaving by an exception (an abort, a crash)
        cancels it if it was not released. ``weight``: the agent's gate weight.
        """
        slot = await self.acquire(agent_id, run_id, priority, input_tokens, output_tokens,
                                  weight=weight)
        try:
            yield slot
        finally:
            if slot.slot_id in self._core.state.leases:
                self.cancel(slot.slot_id)

    # ------------------------------------------------------------------------- core

    def _feed(self, event: GateInput) -> None:
        core = self._core
        if core.phase is Phase.REBUILDING:
            self._held.append(event)
            return
        if core.phase is not Phase.LIVE:
            return  # (another process decides, a run asks it through its `RoutedGate`; or
            # not started, or stopped)
        base = core.version
        try:  # before anything changes: an input that would not read back is never taken
            encoded = core.encode(event)
        except Unrepeatable as error:
            raise Unstorable(type(event).__name__, str(error), error.field) from None
        decisions, events = core.decide(event, encoded)
        core.append(base, events, decisions)
        self._schedule()

    def _fold(self, records: list[RecordedEvent]) -> GateState:
        """The gate's state folded from its stream (a rebuild)."""
        return fold_gate(GateState(provider=self.stream),
                         (decode_gate_event(r.type, r.data) for r in records))

    # `gateway.runtime.core.Listener`: what the gate's stream tells it.

    def committed(self, decisions: list[GateDecision], records: list[RecordedEvent],
                  seconds: float, urgent: bool) -> None:
        """Answer the waiters of a committed batch (a grant reaches nobody before)."""
        if self._fault is not None:
            log.warning("gate %s: its log is written again", self.provider)
            self._fault = None
        for decision in decisions:
            if isinstance(decision, SlotGranted):
                waiter = self._waiters.get(decision.slot_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(Slot(decision.slot_id, decision.lease_deadline,
                                           decision.probe))
                elif waiter is None:
                    # Nobody waits for it any more (cancelled meanwhile): give it back.
                    self.cancel(decision.slot_id)
            elif isinstance(decision, SlotRefused):
                waiter = self._waiters.get(decision.slot_id)
                if waiter is not None and not waiter.done():
                    waiter.set_exception(SlotRefusedError(decision))

    def failed(self, decisions: list[GateDecision], error: BaseException | None) -> None:
        """The gate ran ahead of its log: refuse the waiters of this batch (what was not
        recorded never happened); the gate is rebuilt from the log."""
        if isinstance(error, ConcurrencyError) and self._fault is not None:
            reason = self._fault  # decided on top of the append that failed: same cause
        else:
            reason = error.reason if isinstance(error, WriteFailed) else str(error)
        if reason != self._fault:
            log.error("gate %s: its log cannot be written (%s); slots are refused until "
                      "it can be again", self.provider, reason)
            self._fault = reason
        for decision in decisions:
            waiter = self._waiters.get(getattr(decision, "slot_id", ""))
            if waiter is not None and not waiter.done():
                waiter.set_exception(GateUnrecorded(self.provider, reason))

    def lost(self) -> None:
        """Being rebuilt: inputs meanwhile are held (`_feed`)."""

    def rebuilt(self, records: list[RecordedEvent]) -> None:
        """Decide what arrived during the rebuild, the limits in force first if the log
        refused them."""
        held, self._held = self._held, []
        if self._core.state.limits != self._limits:
            # The limits in force were not stored (the log refused them): again, first.
            held.insert(0, GateLimitsChanged(at=self.clock.now_ms(), limits=self._limits))
        for event in held:
            self._feed(event)
        self._schedule()

    def due(self) -> None:
        """A timer of the gate came: time passes in its stream."""
        self._feed(GateTimer(at=self.clock.now_ms()))

    def _schedule(self) -> None:
        self._core.schedule(next_gate_due(self._core.state, self.clock.now_ms()))


def _count(value: int | None) -> int | None:
    """A count from outside (a provider's header): never negative in the log."""
    return None if value is None else max(0, value)


class GateMap:
    """The provider gates by name, and which one each agent's LLM calls go through
    (``agent_gates``; none: ungated), and how its runs reach it (``run_gates``: the way to
    it when another process may own it; default: the gate itself)."""

    def __init__(self, gates: Mapping[str, ProviderGate], agent_gates: Mapping[str, str],
                 run_gates: Mapping[str, SlotGate]) -> None:
        self.gates: dict[str, ProviderGate] = dict(gates)
        self._agent_gates = dict(agent_gates)
        unknown = sorted(set(self._agent_gates.values()) - set(self.gates))
        if unknown:
            raise ValueError(f"agents name provider gates that do not exist: {unknown}")
        self._run_gates: dict[str, SlotGate] = {**self.gates, **run_gates}

    def of(self, agent_id: str) -> ProviderGate | None:
        """The provider gate an agent's LLM calls go through, if any."""
        name = self._agent_gates.get(agent_id)
        return None if name is None else self.gates[name]

    def for_runs(self, agent_id: str) -> SlotGate | None:
        """The gate an agent's runs take their slots from."""
        name = self._agent_gates.get(agent_id)
        return None if name is None else self._run_gates[name]
