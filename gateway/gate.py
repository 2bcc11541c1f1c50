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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.clock import Clock, Timer
from gateway.engine import EventIds, pace_rebuild, read_settled
from gateway.errors import GatewayError, StorageFailed, Unstorable
from gateway.tasks import spawn
from lanes.codec import Unrepeatable
from lanes.gate import (
    GATE_CODEC,
    GateState,
    GateStatus,
    decide_gate,
    decode_gate_event,
    encode_gate_event,
    fold_gate,
    gate_status,
    gate_stream,
    next_gate_due,
)
from lanes.gate_events import (
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
from lanes.requests import Priority
from store.port import (
    Append,
    ConcurrencyError,
    EventStore,
    NewEvent,
    RecordedEvent,
    WriteFailed,
)

log = logging.getLogger("gateway.gate")


class GateUnrecorded(StorageFailed):
    """A slot the gate decided could not be recorded (its log refused the write)."""

    def __init__(self, provider: str, reason: str) -> None:
        GatewayError.__init__(self, f"the provider gate {provider!r} could not record the "
                              f"slot: {reason}")
        self.detail, self.held = reason, False


class SlotRefusedError(GatewayError):
    """The gate refused the slot (waited too long, breaker open, retries exhausted...)."""

    code = "provider_refused"

    def __init__(self, refused: SlotRefused) -> None:
        super().__init__(f"{refused.code.value}: {refused.reason}")
        self.refused = refused


@dataclass(frozen=True, slots=True)
class Slot:
    """A granted slot: call the provider, then release it with the outcome."""

    slot_id: str
    lease_deadline: int
    probe: bool


class ProviderGate:
    """The gate of one provider shared by every agent's runs."""

    def __init__(self, store: EventStore, provider: str, limits: GateLimits, clock: Clock,
                 ids: EventIds | None = None) -> None:
        self.store = store
        self.provider = provider
        self.stream = gate_stream(provider)
        self.clock = clock
        self._limits = limits
        self._ids = ids or EventIds()
        self._state = GateState(provider=self.stream)
        self._waiters: dict[str, asyncio.Future[Slot]] = {}
        self._timer: Timer | None = None
        self._timer_due: int | None = None
        self._in_flight: set[asyncio.Future[list[RecordedEvent]]] = set()
        self._running = False
        self._rebuild: asyncio.Task[None] | None = None
        """Set while the gate rebuilds itself from its log after a failed append."""
        self._held: list[GateInput] = []
        """Inputs that arrived during a rebuild, decided once it is done."""
        self._failures = 0
        """Consecutive failed appends (paces rebuilds while the log cannot be written)."""
        self._fault: str | None = None
        """Why appends fail, while they do (said in the server's log once)."""

    async def start(self) -> None:
        """Rebuild the gate from its stream, free what a previous process held, and apply
        the configured limits.

        No call of this process is in flight yet, so every slot the log shows granted or
        waiting belonged to a process that stopped or crashed: each is cancelled at once
        (recorded), instead of holding capacity until its lease deadline. A backoff or an
        open breaker in progress is kept.
        """
        records = await self.store.read_stream(self.stream)
        fold_gate(self._state, (decode_gate_event(r.type, r.data) for r in records))
        self._running = True
        now = self.clock.now_ms()
        # Waiting ones first: freeing a lease first would grant them to nobody.
        for slot_id in [*self._state.waiting, *self._state.leases]:
            self._feed(SlotCancelled(at=now, slot_id=slot_id))
        if self._state.version == 0 or self._state.limits != self._limits:
            self._feed(GateLimitsChanged(at=now, limits=self._limits))
        self._schedule()
        await self.flush(rebuilt=False)  # a log that cannot be written: serve anyway

    async def stop(self) -> None:
        """Stop deciding; waiters are refused, timers cancelled, commits finished."""
        self._running = False
        if self._rebuild is not None:
            self._rebuild.cancel()
            await asyncio.gather(self._rebuild, return_exceptions=True)
            self._rebuild = None
            self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
        for future in self._waiters.values():
            if not future.done():
                future.cancel()
        await self.flush()

    async def flush(self, *, rebuilt: bool = True) -> None:
        """Wait for every append decided so far (and, unless ``rebuilt`` is False, for a
        rebuild in progress: while the log cannot be written, one follows another)."""
        while self._in_flight or (rebuilt and self._rebuild is not None):
            waiting: list[asyncio.Future[Any]] = [*self._in_flight]
            if rebuilt and self._rebuild is not None:
                waiting.append(self._rebuild)
            await asyncio.wait(waiting)

    def status(self) -> GateStatus:
        """Limits, window usage, waiting agents, breaker and next retry, now."""
        return gate_status(self._state, self.clock.now_ms())

    @property
    def limits(self) -> GateLimits:
        """The limits in force (the configured ones, or the last ones set at runtime)."""
        return self._limits

    async def set_limits(self, limits: GateLimits) -> bool:
        """New limits from now on (requests not yet granted get them), after the commit;
        False if they are the limits in force already."""
        if limits == self._limits and self._state.limits == limits:
            return False
        self._limits = limits
        self._feed(GateLimitsChanged(at=self.clock.now_ms(), limits=limits))
        await self.flush()
        return True

    @property
    def state(self) -> GateState:
        """The live state (decided; its last events may still be committing)."""
        return self._state

    async def acquire(self, agent_id: str, run_id: str, priority: Priority = Priority.NORMAL,
                      input_tokens: int = 0, output_tokens: int = 0) -> Slot:
        """Wait for a slot (fairly, within the limits); `SlotRefusedError` if refused.

        Cancelled while waiting (the run was aborted), the request is withdrawn.
        """
        slot_id = f"{run_id}/{self._ids()}"
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters[slot_id] = future
        self._feed(SlotRequested(at=self.clock.now_ms(), slot_id=slot_id, agent_id=agent_id,
                                 run_id=run_id, priority=priority, input_tokens=input_tokens,
                                 output_tokens=output_tokens))
        try:
            return await future
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
        if self._running:
            self._feed(SlotCancelled(at=self.clock.now_ms(), slot_id=slot_id))

    @contextlib.asynccontextmanager
    async def using(self, agent_id: str, run_id: str, priority: Priority = Priority.NORMAL,
                    input_tokens: int = 0, output_tokens: int = 0) -> AsyncIterator[Slot]:
        """``async with gate.using(...) as slot:`` — a slot that is always given back.

        Release it inside with the outcome; leaving by an exception (an abort, a crash)
        cancels it if it was not released.
        """
        slot = await self.acquire(agent_id, run_id, priority, input_tokens, output_tokens)
        try:
            yield slot
        finally:
            if slot.slot_id in self._state.leases:
                self.cancel(slot.slot_id)

    # ------------------------------------------------------------------------- core

    def _feed(self, event: GateInput) -> None:
        if not self._running:
            return
        if self._rebuild is not None:
            self._held.append(event)
            return
        state = self._state
        base = state.version
        try:  # before anything changes: an input that would not read back is never taken
            encoded = GATE_CODEC.encode_checked(event)
        except Unrepeatable as error:
            raise Unstorable(type(event).__name__, str(error), error.field) from None
        decisions = decide_gate(state, event)
        if decisions:
            events = [NewEvent(self._ids(), *encoded),
                      *[NewEvent(self._ids(), *encode_gate_event(e)) for e in decisions]]
            future = self.store.append(Append(self.stream, events, base))
            self._in_flight.add(future)
            future.add_done_callback(partial(self._committed, decisions))
        self._schedule()

    def _committed(self, decisions: list[GateDecision],
                   future: asyncio.Future[list[RecordedEvent]]) -> None:
        self._in_flight.discard(future)
        if future.cancelled() or future.exception() is not None:
            # The gate ran ahead of its log: refuse the waiters of this batch and rebuild
            # the state from the log (what was not recorded never happened).
            error = None if future.cancelled() else future.exception()
            if isinstance(error, ConcurrencyError) and self._fault is not None:
                reason = self._fault  # decided on top of the append that failed: same cause
            else:
                reason = error.reason if isinstance(error, WriteFailed) else str(error)
            self._failures += 1
            if reason != self._fault:
                log.error("gate %s: its log cannot be written (%s); slots are refused until "
                          "it can be again", self.provider, reason)
                self._fault = reason
            for decision in decisions:
                waiter = self._waiters.get(getattr(decision, "slot_id", ""))
                if waiter is not None and not waiter.done():
                    waiter.set_exception(GateUnrecorded(self.provider, reason))
            if self._rebuild is None and self._running:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._timer_due = None
                self._rebuild = spawn(self._rebuilt(), f"rebuild {self.stream}")
            return
        self._failures = 0
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

    async def _rebuilt(self) -> None:
        try:
            await pace_rebuild(self._failures)
            records = await read_settled(self.store, self.stream, self._in_flight)
            self._state = fold_gate(GateState(provider=self.stream),
                                    (decode_gate_event(r.type, r.data) for r in records))
        finally:
            self._rebuild = None  # also when cancelled: `flush` must not wait for it
        held, self._held = self._held, []
        if self._state.limits != self._limits:
            # The limits in force were not stored (the log refused them): again, first.
            held.insert(0, GateLimitsChanged(at=self.clock.now_ms(), limits=self._limits))
        for event in held:
            self._feed(event)
        self._schedule()

    def _schedule(self) -> None:
        due = next_gate_due(self._state, self.clock.now_ms())
        if due == self._timer_due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = None if due is None else self.clock.call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer = self._timer_due = None
        self._feed(GateTimer(at=self.clock.now_ms()))


def _count(value: int | None) -> int | None:
    """A count from outside (a provider's header): never negative in the log."""
    return None if value is None else max(0, value)
