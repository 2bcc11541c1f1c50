"""The writer task of the group-commit writer (`BatchWriter._run_writer`): it takes batches
off the queue, plans and commits each in one transaction, then settles its futures."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .batch import (
    Outcome,
    Pending,
    Plan,
    fence_failures,
    fences_of,
    lease_resources,
    plan_batch,
    settle_deferred,
    unseen_ids,
)
from .port import FencedError, RecordedEvent, StoreClosedError, StoreError, WriteFailed
from .writer_core import KeyConflict, WriterCore, WriteTransaction, _State


def _fail_left(inflight: Sequence[Pending], queued: Sequence[Pending]) -> None:
    """Fail the appends a stopping writer leaves: those in flight may be recorded or not,
    the queued ones were not written."""
    for pending in inflight:
        if not pending.future.done():
            pending.future.set_exception(StoreError(
                "the writer stopped mid-commit; the append may or may not be recorded"))
    for pending in queued:
        if not pending.future.done():
            pending.future.set_exception(
                StoreClosedError("the writer stopped before this append was written"))



class BatchWriter(WriterCore):
    """The writer task of a `store.writer.GroupCommitStore`."""

    async def _run_writer(self) -> None:
        queue = self._queue
        wakeup = self._wakeup
        assert wakeup is not None and self._write_lock is not None
        busy_since: float | None = None
        try:
            while True:
                if not queue:
                    busy_since = None
                    if self._state is not _State.OPEN:
                        return
                    self._sleeping = True
                    wakeup.clear()
                    batch = None
                else:
                    batch = self._take_batch()
                    self._inflight = batch
                    self._inflight_events = sum(len(p.events) for p in batch)
                if batch is None:
                    await wakeup.wait()
                    continue
                if not batch:
                    continue
                # Kept busy since the last commit ended: the time between counts too (under
                # load that is where the next batch is made).
                started = busy_since if busy_since is not None else time.perf_counter()
                async with self._write_lock:
                    await self._commit(batch)
                ended = time.perf_counter()
                self._measure(self._inflight_events, ended - started)
                busy_since = ended if queue else None
                self._inflight = []
                self._inflight_events = 0
        finally:
            inflight, queued = self._inflight, list(queue)
            queue.clear()
            self._inflight = []
            self._inflight_events = 0
            self._queued_events = 0
            self._urgent = 0
            _fail_left(inflight, queued)

    def _take_urgent(self) -> list[Pending]:
        """The urgent appends, with whatever of their own streams was queued before them;
        everything else stays queued in order."""
        queue = self._queue
        last: dict[str, int] = {}
        for index, pending in enumerate(queue):
            if pending.append.urgent:
                last[pending.append.stream] = index
        batch: list[Pending] = []
        rest: list[Pending] = []
        for index, pending in enumerate(queue):
            if index <= last.get(pending.append.stream, -1):
                batch.append(pending)
            else:
                rest.append(pending)
        queue.clear()
        queue.extend(rest)
        self._queued_events -= sum(len(p.events) for p in batch)
        self._urgent = 0
        return [p for p in batch if not p.future.cancelled()]

    def _take_batch(self) -> list[Pending]:
        if self._urgent:
            return self._take_urgent()
        queue = self._queue
        batch: list[Pending]
        if self._queued_events <= self._max_batch:
            batch = list(queue)
            queue.clear()
            self._queued_events = 0
        else:
            batch = []
            size = 0
            limit = self._max_batch
            while queue:
                count = len(queue[0].events)
                if batch and size + count > limit:
                    break
                batch.append(queue.popleft())
                size += count
            self._queued_events -= size
        return [p for p in batch if not p.future.cancelled()]

    async def _commit(self, batch: list[Pending]) -> None:
        try:
            try:
                plan = await self._attempt(batch, lookup_all=False)
            except KeyConflict:
                # Some id is already stored: plan again knowing every stored id.
                plan = await self._attempt(batch, lookup_all=True)
        except Exception as exc:
            self._stale = True
            failed = WriteFailed("the append", self._describe(exc))
            self._settle(batch, [failed] * len(batch), [])
            return
        # Committed: advance the caches, then tell callers and followers.
        self._position = plan.position
        self._versions.update(plan.versions)
        self._settle(batch, plan.final(), plan.rows)

    def _settle(self, batch: list[Pending], outcomes: Sequence[Outcome],
                rows: list[RecordedEvent]) -> None:
        """Resolve the futures of a batch, then feed the followers."""
        for pending, outcome in zip(batch, outcomes, strict=True):
            future = pending.future
            if future.done():
                continue
            if isinstance(outcome, StoreError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if rows and self._followers:
            self._publish(rows)

    async def _attempt(self, batch: list[Pending], *, lookup_all: bool) -> Plan:
        async with self._transaction() as txn:
            plan = await self._plan(txn, batch, lookup_all=lookup_all)
            if plan.rows:
                await txn.insert(plan.rows)
        return plan

    async def _plan(
        self, txn: WriteTransaction, batch: list[Pending], *, lookup_all: bool
    ) -> Plan:
        """Look up what `plan_batch` needs, plan, then decide the appends set aside."""
        await self._resync(txn, (p.append.stream for p in batch))
        cache = self._versions
        missing = list(
            dict.fromkeys(p.append.stream for p in batch if p.append.stream not in cache)
        )
        if missing:
            loaded = await txn.load_versions(missing)
            for stream in missing:
                cache[stream] = loaded.get(stream, 0)
        # Ids known to be taken: stored ones (slow path only) and those written so far.
        known: dict[str, RecordedEvent] = {}
        if lookup_all:
            known = await txn.find_events([e.event_id for p in batch for e in p.events])
        fenced: dict[int, FencedError] = {}
        fences = fences_of(batch)
        if fences:
            now, rows = await txn.lease_rows(lease_resources(fences), lock=True)
            fenced = fence_failures(fences, now, rows)
        plan = plan_batch(batch, cache, known, fenced, self._clock(), self._position)
        if plan.deferred:
            # Only now look up the ids of appends set aside (rare: conflicts, retries).
            ids = [] if lookup_all else unseen_ids(batch, plan)
            settle_deferred(batch, plan, await txn.find_events(ids) if ids else {})
        return plan
