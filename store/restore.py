"""Imports (`RestoreWriter.restore`) and snapshot writes on the group-commit writer: each
takes the write lock a batch takes, so none interleaves with one."""

from __future__ import annotations

from collections.abc import Sequence

from .batch import check_record
from .port import DuplicateEventError, RecordedEvent, RestoreError, Snapshot
from .schema import FINGERPRINT_MAX
from .writer_core import KeyConflict, WriterCore


class RestoreWriter(WriterCore):
    """The imports and snapshot writes of a `store.writer.GroupCommitStore`."""

    async def restore(self, records: Sequence[RecordedEvent]) -> None:
        """Write events recorded elsewhere verbatim (an import), in one transaction.

        They must continue this log exactly: positions from the last one + 1 without a gap,
        each stream's versions from its current version + 1, ids not yet used; otherwise
        `RestoreError` (or `DuplicateEventError`) and nothing is written. Followers see them
        as if appended.
        """
        self._check_open()
        rows = list(records)
        if not rows:
            return
        for record in rows:
            check_record(record)
        await self._restore(rows)
        if self._followers:
            self._publish(rows)

    async def _restore(self, rows: list[RecordedEvent]) -> None:
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            try:
                await self._restore_in(rows)
            except KeyConflict as exc:  # (an adapter may insert only at the commit)
                raise DuplicateEventError(
                    f"an imported event id is already recorded: {exc}; nothing was written"
                ) from None

    async def _restore_in(self, rows: list[RecordedEvent]) -> None:
        """`_restore`'s transaction (the write lock held)."""
        async with self._writing("the import") as txn:
            streams = sorted({r.stream for r in rows})
            await self._resync(txn, streams)
            position = self._position
            missing = [s for s in streams if s not in self._versions]
            loaded = await txn.load_versions(missing) if missing else {}
            versions = {s: self._versions.get(s, loaded.get(s, 0)) for s in streams}
            for record in rows:
                if record.position != position + 1:
                    raise RestoreError(
                        f"event {record.event_id!r} is at position {record.position}, but "
                        f"the log continues at {position + 1}; import into an empty log "
                        "(or one that ends just before it)"
                    )
                if record.version != versions[record.stream] + 1:
                    raise RestoreError(
                        f"event {record.event_id!r} is version {record.version} of "
                        f"{record.stream!r}, which is at version {versions[record.stream]}"
                    )
                position += 1
                versions[record.stream] += 1
            await txn.insert(rows)
        self._position = position
        self._versions.update(versions)

    async def save_snapshot(self, snapshot: Snapshot, keep: int = 2) -> None:
        """Store a snapshot (replacing one at the same position), then delete all but the
        ``keep`` newest."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1: {keep}")
        if snapshot.position < 0:
            raise ValueError(f"a snapshot position must be >= 0: {snapshot.position}")
        for name in ("fingerprint", "checksum"):
            value = getattr(snapshot, name)
            if not value or len(value) > FINGERPRINT_MAX:
                raise ValueError(f"snapshot {name} must have 1 to {FINGERPRINT_MAX} characters")
        self._check_open()
        await self._save_snapshot(snapshot, keep)

    async def _save_snapshot(self, snapshot: Snapshot, keep: int) -> None:
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            async with self._writing("the snapshot") as txn:
                await txn.put_snapshot(snapshot, keep)

    async def delete_snapshots(self, positions: Sequence[int] | None = None) -> int:
        """Delete the snapshots at ``positions`` (default: every one); how many there were."""
        self._check_open()
        return await self._delete_snapshots(None if positions is None else list(positions))

    async def _delete_snapshots(self, positions: list[int] | None) -> int:
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            async with self._writing("the deletion of snapshots") as txn:
                return await txn.delete_snapshots(positions)
