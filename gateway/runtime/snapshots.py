"""Snapshots of the agents' fold in the store: a cache that makes a restart on a large log fast.

A snapshot is the `LogFold` up to a position (`lanes.snapshot`), compressed, with a checksum
of what is stored and the fingerprint of the code that made it. It is never the truth: one
that is damaged, made by other code (a different fold, event shapes or format), or that does
not match the log (its anchor event is not at its position) is ignored, and the start folds
from an older one or from the beginning, then stores a fresh one.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import logging
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.base.process import gc_paused
from lanes.codec import AGENT_CODEC
from lanes.replay import LogFold
from lanes.snapshot import SNAPSHOT_FORMAT, BadSnapshot, load_fold
from store.port import EventStore, RecordedEvent, Snapshot, SnapshotInfo

if TYPE_CHECKING:
    from gateway.base.quarantine import LogReader

log = logging.getLogger("gateway.runtime.snapshots")

FOLD_MODULES = (
    "lanes.config", "lanes.events", "lanes.requests", "lanes.rules", "lanes.tables",
    "lanes.state", "lanes.evolve", "lanes.replay", "lanes.snapshot", "lanes.codec",
    "lanes.upcast", "lanes.evolve_calls", "lanes.vocabulary", "lanes.inputs",
    "lanes.decisions", "lanes.policy",
)
"""The modules whose code decides what a fold is (and what a snapshot of one holds)."""

KEEP = 2
"""Snapshots kept in the store: the newest, and one to fall back on."""


def fold_fingerprint() -> str:
    """A name for the code that folds: the snapshot format, the event types with their
    versions, and the source of `FOLD_MODULES`. Any change to them, even a comment, makes
    older snapshots outdated (they are rebuilt once: never wrong, at worst one slow start)."""
    digest = hashlib.sha256(f"format {SNAPSHOT_FORMAT}\n".encode())
    for name in sorted(AGENT_CODEC.types):
        digest.update(f"{name} v{AGENT_CODEC.version(name)}\n".encode())
    for module_name in FOLD_MODULES:
        module = importlib.import_module(module_name)
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):  # no source shipped: fall back on the module's name
            source = module_name
        digest.update(source.encode())
    return digest.hexdigest()


FINGERPRINT = fold_fingerprint()


def seal(position: int, raw: bytes, created_at: int) -> Snapshot:
    """A snapshot of a fold serialised by `lanes.snapshot.dump_fold` (which reads the states:
    call it while they cannot change), compressed and checksummed (this may run in a
    thread)."""
    data = zlib.compress(raw, 1)
    return Snapshot(position, FINGERPRINT, hashlib.sha256(data).hexdigest(), created_at, data)


def snapshot_of_log(url: str, position: int, created_at: int) -> Snapshot | None:
    """A snapshot of the log at ``url`` up to ``position``, folded from the log (from its
    newest usable snapshot): run in a worker process, so that a gateway never holds its
    event loop to serialise its agents (the live fold of a big desk takes long to dump).
    None when the newest snapshot is there already."""
    return asyncio.run(_snapshot_of_log(url, position, created_at))


async def _snapshot_of_log(url: str, position: int, created_at: int) -> Snapshot | None:
    from gateway.base.quarantine import log_reader
    from lanes.snapshot import dump_fold
    from store import open_store

    store = await open_store(url)
    try:
        reader = await log_reader(store)
        loaded = await load_latest(store, upto=position)
        log_fold = loaded.fold
        if log_fold.position >= position:
            return None
        records = await store.read(after=log_fold.position, limit=position - log_fold.position)
        if not records or records[-1].position != position:
            return None  # the log does not reach that far (yet): nothing to do
        log_fold.add(reader.entries(records))
        log_fold.position = position
        return seal(position, dump_fold(log_fold, records[-1].event_id), created_at)
    finally:
        await store.close()


@dataclass(slots=True)
class Loaded:
    """What `load_latest` found: the fold to continue from (empty when no snapshot was
    usable), the snapshot it came from, and why newer snapshots were ignored."""

    fold: LogFold
    snapshot: SnapshotInfo | None = None
    ignored: dict[int, str] = field(default_factory=dict)
    """Position -> why that snapshot cannot be used."""


async def fold_log(store: EventStore, reader: LogReader
                   ) -> tuple[LogFold, list[RecordedEvent], Loaded]:
    """The fold of the whole log: from the newest usable snapshot (`load_latest`), plus the
    events after it (returned too, with what was loaded)."""
    with gc_paused():
        loaded = await load_latest(store)
        log_fold = loaded.fold
        records = await store.read(after=log_fold.position)
        log_fold.add(reader.entries(records))
    if records:
        log_fold.position = records[-1].position
    return log_fold, records, loaded


async def load_latest(store: EventStore, upto: int | None = None) -> Loaded:
    """The newest usable snapshot at or below position ``upto`` (default: any)."""
    loaded = Loaded(LogFold())
    last: int | None = None
    for info in await store.snapshots():
        if upto is not None and info.position > upto:
            continue
        if info.fingerprint != FINGERPRINT:
            loaded.ignored[info.position] = "made by other code (outdated)"
            continue
        if last is None:
            last = await store.last_position()
        fold = await _open(store, info, last)
        if isinstance(fold, str):
            loaded.ignored[info.position] = fold
            continue
        loaded.fold, loaded.snapshot = fold, info
        break
    for position, reason in loaded.ignored.items():
        log.warning("snapshot at %d: %s; ignored", position, reason)
    return loaded


async def _open(store: EventStore, info: SnapshotInfo, last: int) -> LogFold | str:
    """The fold in a snapshot, or why it cannot be used."""
    if info.position > last:
        return f"ahead of the log (which ends at {last})"
    snapshot = await store.read_snapshot(info.position)
    if snapshot is None:
        return "deleted meanwhile"
    if hashlib.sha256(snapshot.data).hexdigest() != snapshot.checksum:
        return "checksum mismatch (damaged)"
    try:
        # Decompressing and validating are the slow part: off the event loop.
        fold, anchor = await asyncio.to_thread(_unpack, snapshot.data)
    except (zlib.error, BadSnapshot) as error:
        return f"does not load ({error})"
    if fold.position != info.position:
        return f"holds position {fold.position}, stored at {info.position} (damaged)"
    if fold.position:
        at = await store.read(fold.position - 1, 1)
        if not at or at[0].event_id != anchor:
            return "made from another log (its anchor event is not at its position)"
    return fold


def _unpack(data: bytes) -> tuple[LogFold, str]:
    return load_fold(zlib.decompress(data))
