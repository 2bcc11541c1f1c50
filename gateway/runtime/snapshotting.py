"""When the engine stores a snapshot of its fold, and how (a cache: never the truth).

A snapshot is taken once `SnapshotPolicy.every` agent events were folded or committed since
the last one, and at a graceful stop. It is serialised on the loop while the states cannot
change (only when the engine is quiet: nothing decided is uncommitted), then compressed and
written off the loop; or, with a worker, folded from the log by a process of its own, so
serialising a big desk never holds the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final

from gateway.base.clock import Clock
from gateway.base.quarantine import LogReader
from gateway.base.tasks import spawn
from gateway.runtime.snapshots import KEEP, fold_log, seal, snapshot_of_log
from lanes.replay import LogFold
from lanes.snapshot import dump_fold
from store.port import EventStore, RecordedEvent, StoreError

log = logging.getLogger("gateway.runtime.engine")

SNAPSHOT_EVERY: Final = 100_000
"""Agent events committed between two snapshots of the fold, by default."""


class SnapshotPolicy:
    """Counts what the newest snapshot lacks and stores a new one when it is time.

    ``every`` None: never. With ``worker`` (and a store another process can open), the
    periodic snapshots are folded from the log by a worker process."""

    def __init__(self, store: EventStore, clock: Clock, every: int | None,
                 worker: bool) -> None:
        if every is not None and every < 1:
            raise ValueError(f"snapshot_every must be >= 1 or None: {every}")
        self._store = store
        self._clock = clock
        self.every = every
        self._worker = worker and store.url is not None
        self._pool: ProcessPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self.since = 0
        """Agent events folded or committed that the newest snapshot does not hold."""
        self.loaded_at: int | None = None
        """The position of the snapshot the start continued from, if any."""
        self.position = 0
        self.anchor = ""
        """The last committed agent event seen: its position and id."""

    async def load(self, reader: LogReader) -> tuple[LogFold, list[int]]:
        """The fold of the whole log, from the newest usable snapshot on, and the positions
        of snapshots ignored (outdated or damaged): what the start continues from."""
        log_fold, records, loaded = await fold_log(self._store, reader)
        if loaded.snapshot is not None:
            self.loaded_at = loaded.snapshot.position
        self.since = len(records)
        if records:
            self.seen(records[-1])
        elif log_fold.position:
            self.seen((await self._store.read(log_fold.position - 1, 1))[0])
        return log_fold, list(loaded.ignored)

    def seen(self, record: RecordedEvent) -> None:
        """A committed agent event reached this process (the log's tip moves on)."""
        if record.position > self.position:
            self.position, self.anchor = record.position, record.event_id

    def due_at_start(self, stale: Sequence[int]) -> bool:
        """Whether the start should store one (enough folded since the newest, or some are
        unusable)."""
        return self.every is not None and bool(self.position) and (
            self.since >= self.every or bool(stale))

    def committed(self, count: int, running: bool, quiet: Callable[[], bool],
                  live: Callable[[], LogFold]) -> None:
        """``count`` agent events were committed; store a snapshot if it is time and the
        engine is ``running`` (of the ``live`` fold only when ``quiet``, unless a worker
        folds the log)."""
        self.since += count
        if self.every is None or self.since < self.every or not running:
            return
        if self._worker:
            self._from_log()
        elif quiet():
            self.take(live())

    def take(self, log_fold: LogFold, replacing: Sequence[int] = ()) -> None:
        """Store a snapshot of ``log_fold`` in the background (serialised now, while the
        states cannot change), deleting the unusable ones at ``replacing``."""
        if self._busy():
            return
        raw = dump_fold(log_fold, self.anchor)
        self.since = 0
        self._task = spawn(self._write(log_fold.position, raw, replacing), "snapshot")

    async def close(self, final: LogFold | None) -> None:
        """Finish what is under way; store ``final`` first if given and anything is new;
        stop the worker."""
        if self._task is not None:
            await self._task
        if final is not None and self.every is not None and self.since:
            self.take(final)
        if self._task is not None:
            await self._task
        if self._pool is not None:
            await asyncio.to_thread(self._pool.shutdown)
            self._pool = None

    def _busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _write(self, position: int, raw: bytes, replacing: Sequence[int]) -> None:
        try:
            snapshot = await asyncio.to_thread(seal, position, raw, self._clock.now_ms())
            if replacing:
                await self._store.delete_snapshots(replacing)
            await self._store.save_snapshot(snapshot, KEEP)
        except StoreError as error:  # a cache: the log is intact, the next one will do
            log.warning("snapshot at %d not stored: %s", position, error)

    def _from_log(self) -> None:
        """Have a worker process fold the log up to the last commit into a snapshot and
        store it (in the background; one at a time)."""
        if self._busy():
            return
        self.since = 0
        self._task = spawn(self._fold_in_worker(self.position), "snapshot")

    async def _fold_in_worker(self, position: int) -> None:
        url = self._store.url
        assert url is not None
        if self._pool is None:  # a fresh interpreter: no fork of a threaded process
            self._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice, initargs=(19,))  # the gateway's own work comes first
        try:
            snapshot = await asyncio.get_running_loop().run_in_executor(
                self._pool, snapshot_of_log, url, position, self._clock.now_ms())
            if snapshot is not None:
                await self._store.save_snapshot(snapshot, KEEP)
        except (StoreError, BrokenProcessPool, OSError) as error:  # the next one will do
            log.warning("snapshot at %d not stored: %s", position, error)
