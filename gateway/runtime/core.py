"""The runtime core of one event stream: decide an input, append, settle after the commit.

An agent (`gateway.runtime.engine`) and a provider gate (`gateway.runtime.gate`) live the same
loop: an input is decided against the stream's state (`lanes` does the deciding), the input and its
decisions are appended at the stream's version, and their effects follow the commit. When an
append fails, the state ran ahead of the log: the stream is rebuilt from the log, after a
backoff that doubles while appends keep failing. `StreamCore` is that loop, once, and
synchronous: `feed` decides and enqueues at once; the only waiting is the rebuild's, on the
`Clock` (a `FakeClock` in tests, so recovery and backoff are tested without real time). What
an owner does with the outcome (start runs, answer waiters, hold controls) it says through a
`Listener`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Generic, Protocol, TypeVar

from gateway.base.clock import Clock, Timer
from gateway.base.tasks import spawn
from gateway.runtime.phases import Phase, moved
from lanes.codec import Codec, Unrepeatable
from store.port import Append, EventStore, Fence, FencedError, NewEvent, RecordedEvent, StoreError

log = logging.getLogger("gateway.runtime.core")

class Versioned(Protocol):
    """A stream's state: it knows the stream's version it is at."""

    version: int


S = TypeVar("S", bound=Versioned)
I = TypeVar("I")  # noqa: E741
D = TypeVar("D")

REBUILD_BACKOFF_MS: Final = 50
"""The wait before a stream whose appends keep failing is rebuilt again, doubled at each
consecutive failure (the first rebuild is at once) up to `REBUILD_BACKOFF_MAX_MS`."""
REBUILD_BACKOFF_MAX_MS: Final = 500
READ_RETRY_MS: Final = 500
"""The wait before a rebuild reads its stream again after the read failed."""

Commit = asyncio.Future[list[RecordedEvent]]


def rebuild_backoff_ms(failures: int) -> int:
    """How long to wait before a rebuild after ``failures`` failed appends in a row: nothing
    after the first; then `REBUILD_BACKOFF_MS` doubling to `REBUILD_BACKOFF_MAX_MS` (appends
    that keep failing, as at a full disk, where they fail at once, must not spin)."""
    if failures <= 1:
        return 0
    return min(REBUILD_BACKOFF_MAX_MS, REBUILD_BACKOFF_MS << min(failures - 2, 16))


class EventIds:
    """Unique event ids without a syscall each: a random prefix per process and a counter
    (a fixed ``prefix`` makes them repeatable, for recordings)."""

    def __init__(self, prefix: str | None = None) -> None:
        self._prefix = os.urandom(6).hex() if prefix is None else prefix
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    @property
    def prefix(self) -> str:
        """What every id made now starts with."""
        return self._prefix

    def use(self, prefix: str) -> None:
        """Make ids with ``prefix`` from now on (a cluster member's own: its events say which
        member wrote them)."""
        self._prefix = prefix


@dataclass(frozen=True, slots=True)
class Outcome(Generic[D]):
    """What an input came to: its decisions, and the commit that holds them (None: nothing
    was decided, so nothing appended)."""

    decisions: list[D]
    commit: Commit | None


class Listener(Protocol[D]):
    """What a stream's owner is told."""

    def committed(self, decisions: list[D], records: list[RecordedEvent], seconds: float,
                  urgent: bool) -> None:
        """An append committed, ``seconds`` after it was decided."""

    def failed(self, decisions: list[D], error: BaseException | None) -> None:
        """An append failed (``error`` None: cancelled); `lost` follows."""

    def lost(self) -> None:
        """The state ran ahead of the log: it is being rebuilt (stop what it started)."""

    def rebuilt(self, records: list[RecordedEvent]) -> None:
        """The state is the fold of the log again (``records``: the stream as read)."""

    def due(self) -> None:
        """The time `StreamCore.schedule` was given came."""

    def fenced(self, error: FencedError) -> None:
        """An append was refused because this process no longer holds the stream's lease
        (`StreamCore.fence`): the stream is someone else's now (stop what runs on it; never
        rebuild it to write again)."""


class StreamCore(Generic[S, I, D]):
    """One stream's decide -> append -> settle loop (see the module docstring).

    ``decide(state, input)`` advances the state and returns the decisions; ``rebuild`` folds
    the stream's records into a fresh state; ``pending`` holds every append in flight of the
    owner (a rebuild reads the log once all of them settled) and ``rebuilds`` every rebuild
    under way; a rebuild waits for its backoff only while ``paced()`` (not while stopping).
    """

    def __init__(self, stream: str, state: S, *, store: EventStore, clock: Clock,
                 codec: Codec[Any], decide: Callable[[S, I], list[D]],
                 rebuild: Callable[[list[RecordedEvent]], S], listener: Listener[D],
                 ids: Callable[[], str], pending: set[Commit],
                 rebuilds: set[asyncio.Task[None]],
                 paced: Callable[[], bool] = lambda: True, phase: Phase = Phase.LIVE) -> None:
        self.stream = stream
        self.state = state
        self.store = store
        self.clock = clock
        self._codec = codec
        self._decide = decide
        self._fold = rebuild
        self._listener = listener
        self._ids = ids
        self._pending = pending
        self._rebuilds = rebuilds
        self._paced = paced
        self.phase = phase
        """Where the stream is in its life here (`gateway.runtime.phases`): REBUILDING from a
        failed append until the state is the log's fold again."""
        self.failures = 0
        """Consecutive failed appends (pace the rebuilds while the log refuses writes)."""
        self._timer: Timer | None = None
        self._timer_due: int | None = None
        self.fence: Fence | None = None
        """The lease this process holds on the stream, when several share the log: every
        append carries it, and lands only while it holds (`store.port.Append.fence`)."""
        self.last_commit: Commit | None = None
        """The stream's latest append: once it settled, so did every earlier one (a
        stream's appends commit in order)."""

    def move(self, to: Phase) -> None:
        """Move to phase ``to`` (`gateway.runtime.phases.IllegalPhase` if not allowed)."""
        self.phase = moved(self.stream, self.phase, to)

    @property
    def version(self) -> int:
        """The stream's version the state is at (decided; may run ahead of the log)."""
        return self.state.version

    # ----------------------------------------------------------------------- inputs

    def encode(self, event: I, known: bool = False) -> tuple[str, str]:
        """The type and JSON text of an input, refused (`lanes.codec.Unrepeatable`) if they
        would not read back as the same input: checked before anything changes (``known``:
        its maker knows it reads back, by construction: only encoded, and refused all the
        same if it cannot be written at all)."""
        if not known:
            return self._codec.encode_checked(event)
        try:
            return self._codec.encode(event)
        except ValueError as error:  # (a promise broken: refused, as the check would)
            raise Unrepeatable(f"it cannot be written as JSON: {error}") from None

    def decide(self, event: I, encoded: tuple[str, str]) -> tuple[list[D], list[NewEvent]]:
        """Decide an input already `encode`d: its decisions and the events to append (none
        if it decided nothing). A decision that raises is a bug: the state may be half
        advanced, so it is rebuilt from the log, and the error raised."""
        try:
            decisions = self._decide(self.state, event)
        except Exception:
            log.exception("deciding %s for %s failed", type(event).__name__, self.stream)
            self.recover(None)
            raise
        if not decisions:
            return decisions, []
        ids = self._ids
        encode = self._codec.encode
        return decisions, [NewEvent(ids(), *encoded),
                           *[NewEvent(ids(), *encode(d)) for d in decisions]]

    def append(self, base: int, events: Sequence[NewEvent], decisions: list[D],
               urgent: bool = False) -> Outcome[D]:
        """Enqueue decided events at stream version ``base``; the listener hears of the
        commit (an ``urgent`` append is committed ahead of other streams' queue)."""
        if not events:
            return Outcome(decisions, None)
        commit = self.store.append(Append(self.stream, events, base, urgent, self.fence))
        self._pending.add(commit)
        self.last_commit = commit
        commit.add_done_callback(partial(self._settled, decisions, time.perf_counter(), urgent))
        return Outcome(decisions, commit)

    def feed(self, event: I, urgent: bool = False) -> Outcome[D]:
        """`encode`, `decide` and `append` one input."""
        base = self.version
        encoded = self.encode(event)
        decisions, events = self.decide(event, encoded)
        return self.append(base, events, decisions, urgent)

    def _settled(self, decisions: list[D], decided: float, urgent: bool, commit: Commit) -> None:
        self._pending.discard(commit)
        error = None if commit.cancelled() else commit.exception()
        if isinstance(error, FencedError):
            self._listener.failed(decisions, error)
            if error.fence == self.fence:  # (a late one of a lease held before: nothing now)
                self._listener.fenced(error)
            return
        if commit.cancelled() or error is not None:
            self._listener.failed(decisions, error)
            self.recover(commit)
            return
        self.failures = 0
        self._listener.committed(decisions, commit.result(), time.perf_counter() - decided,
                                 urgent)

    # ------------------------------------------------------------------------ timers

    def schedule(self, due: int | None) -> None:
        """Tell the listener (`Listener.due`) when the clock reaches ``due`` (None: never);
        replaces the time given before."""
        if due == self._timer_due:
            return
        self.cancel_timer()
        self._timer_due = due
        if due is not None:
            self._timer = self.clock.call_at(due, self._fire)

    def cancel_timer(self) -> None:
        """Forget the time given to `schedule`."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_due = None

    def _fire(self) -> None:
        self._timer = self._timer_due = None
        if self.phase is Phase.LIVE:
            self._listener.due()

    # ---------------------------------------------------------------------- recovery

    def recover(self, commit: Commit | None) -> None:
        """The state ran ahead of the log (``commit`` failed; None: a decision failed):
        rebuild it from the log, after `rebuild_backoff_ms` of the clock. Only a LIVE
        stream is rebuilt: one rebuilding already will read the log after this commit too,
        and one that is not this process's to decide (any more) has nothing to rebuild."""
        if commit is not None:
            self.failures += 1
        if self.phase is not Phase.LIVE:
            return
        self.move(Phase.REBUILDING)
        self.cancel_timer()
        self._listener.lost()
        task = spawn(self._rebuild(rebuild_backoff_ms(self.failures)), f"rebuild {self.stream}")
        self._rebuilds.add(task)
        task.add_done_callback(self._rebuilds.discard)

    async def _rebuild(self, backoff_ms: int) -> None:
        if backoff_ms and self._paced():
            await self.clock.sleep(backoff_ms)
        records = await self._read_settled()
        self.state = self._fold(records)
        if self.phase is Phase.REBUILDING:  # (else it left, or stopped, meanwhile)
            self.move(Phase.LIVE)
        self._listener.rebuilt(records)

    async def _read_settled(self) -> list[RecordedEvent]:
        """The stream as committed, once every append in flight settled; read again (after
        `READ_RETRY_MS` of the clock) while the store cannot be read."""
        while True:
            try:
                while self._pending:
                    await asyncio.wait(list(self._pending))
                return await self.store.read_stream(self.stream)
            except StoreError:
                await self.clock.sleep(READ_RETRY_MS)
