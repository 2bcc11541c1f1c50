"""The replay debugger's common ground: where a log is, points in it, reading it a page
at a time, folding it up to a position, and tables for people."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.base.process import gc_paused
from gateway.base.quarantine import log_reader
from gateway.base.tasks import start
from gateway.runtime.snapshots import load_latest
from gateway.tools.progress import Progress, summary
from lanes.replay import LogFold
from store import (
    GroupCommitStore,
    LogInUse,
    NotAnEventLog,
    PostgresEventStore,
    RecordedEvent,
    SqliteEventStore,
    StoreError,
    check_event_log,
)
from store.engine import database_url, is_postgres

PAGE = 10_000
"""Events per read."""
Out = Callable[[str], None]
Log = Path | str
"""Where an event log is: a SQLite file, or a ``postgresql://`` URL."""


def log_location(text: str) -> Log:
    """A log named on the command line: a ``postgresql://`` URL as it is, else a path."""
    return text if is_postgres(database_url(text)) else Path(text)


def shown(db: Log) -> str:
    """A log's location for people (a URL without its password)."""
    if isinstance(db, str):
        return database_url(db).render_as_string(hide_password=True)
    return str(db)


class DebugError(Exception):
    """Bad input from the person at the terminal; the message says what to do."""




# ----------------------------------------------------------------------- points in the log


def config_table(path: Path) -> dict[str, Any]:
    """A gateway config file's TOML, unvalidated; `DebugError` if it cannot be read."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise DebugError(f"cannot read {path}: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise DebugError(f"{path}: not a TOML config: {error}") from None


@dataclass(frozen=True, slots=True)
class Point:
    """A place in the log as given on the command line: a position, or a time."""

    position: int | None = None
    time_ms: int | None = None


def parse_point(text: str) -> Point:
    """A position (an integer >= 0) or a time (ISO 8601; UTC when no offset is given)."""
    text = text.strip()
    if text.isdigit():
        return Point(position=int(text))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a log position (an integer >= 0) nor a time "
            "(ISO 8601, such as 2026-02-17T03:10:05Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Point(time_ms=int(moment.timestamp() * 1000))


def clock(ms: int) -> str:
    """A time of the log, for people: ``2026-02-17 03:10:05.120``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


async def resolve(store: GroupCommitStore, point: Point, last: int, option: str) -> int:
    """The log position a `Point` names: a position as given (it must exist), a time as the
    last event recorded at or before it (0: before the first). Times are found by bisection:
    recorded times go forward with positions (if the store's clock was ever set back, the
    answer is one of the events recorded around that time)."""
    if point.position is not None:
        if point.position > last:
            raise DebugError(f"{option} {point.position}: the log ends at position {last}")
        return point.position
    assert point.time_ms is not None
    low, high = 0, last  # the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        [record] = await store.read(middle - 1, 1)
        if record.recorded_at <= point.time_ms:
            low = middle
        else:
            high = middle - 1
    return low


# ------------------------------------------------------------------------------- reading


async def open_log(db: Log) -> GroupCommitStore:
    """The store of an existing event log (migrated to this code's schema if older)."""
    store: GroupCommitStore
    if isinstance(db, str):
        store = PostgresEventStore(db)
    else:
        try:
            await check_event_log(db)
        except NotAnEventLog as error:
            raise DebugError(str(error)) from None
        store = SqliteEventStore(db)
    try:
        await store.open()
    except (StoreError, OSError) as error:
        raise DebugError(f"cannot open {shown(db)}: {error}") from None
    return store


async def _writable_log(db: Log) -> GroupCommitStore:
    """The store of a log to change with no gateway serving it (`DebugError` if one does:
    a SQLite file is locked by its gateway, a PostgreSQL log has live members)."""
    if isinstance(db, str):
        store = await open_log(db)
        if (await store.leases()).members:
            await store.close()
            raise DebugError(f"{shown(db)} is served by gateway processes now: stop them "
                             "first")
        return store
    sqlite = SqliteEventStore(db, exclusive=True)  # never under a gateway serving it
    try:
        await sqlite.open()
    except LogInUse as error:
        raise DebugError(str(error)) from None
    return sqlite


async def pages(store: GroupCommitStore, after: int, upto: int) -> AsyncIterator[
        list[RecordedEvent]]:
    """The events in (after, upto], a page at a time; the next page is read (in the
    driver's thread) while the caller works on the last one."""
    cursor = after

    async def read(cursor: int) -> list[RecordedEvent]:
        return await store.read(cursor, min(PAGE, upto - cursor)) if cursor < upto else []

    ahead = start(read(cursor), "read ahead")
    try:
        while True:
            page = await ahead
            if not page:
                return
            cursor = page[-1].position
            ahead = start(read(cursor), "read ahead")
            yield page
    finally:
        ahead.cancel()




@dataclass(frozen=True, slots=True)
class Folded:
    """The fold of the log up to a position, and how it was made."""

    fold: LogFold
    snapshot: int | None
    """The position of the snapshot it started from, if any."""
    events: int
    """Events read after it."""
    seconds: float

    def summary(self, command: str) -> str:
        """``replay: from the snapshot at 990,000, folded 1,234 events in 0.31 s, ...``."""
        start = "" if self.snapshot is None else f"from the snapshot at {self.snapshot:,}, "
        return f"{command}: {start}folded {summary(self.events, 'events', self.seconds)}"


async def fold_until(store: GroupCommitStore, position: int, label: str) -> Folded:
    """The fold of the log up to ``position``: from the newest usable snapshot at or below
    it, then the events after it."""
    reader = await log_reader(store)
    with gc_paused(), Progress(label, None) as bar:
        loaded = await load_latest(store, upto=position)
        log_fold = loaded.fold
        bar.total = position - log_fold.position
        async for page in pages(store, log_fold.position, position):
            log_fold.add(reader.entries(page))
            bar.advance(len(page))
    log_fold.position = position
    snapshot = None if loaded.snapshot is None else loaded.snapshot.position
    return Folded(log_fold, snapshot, bar.done, bar.elapsed)


# -------------------------------------------------------------------------------- tables


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """Rows under headers in columns; ``align`` gives each column ``<`` or ``>`` (default
    ``<``). Cells are shown with `str`, None as ``-``."""
    cells = [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    sides = align.ljust(len(headers), "<")

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if side == ">" else v.ljust(w)
                 for v, w, side in zip(values, widths, sides, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in cells)]


def _ms(value: int | None) -> str | None:
    """A duration for people: ``850ms``, ``12.5s``, ``3h12m``, ``40d``."""
    if value is None:
        return None
    if value < 10_000:
        return f"{value}ms"
    if value < 600_000:
        return f"{value / 1000:.1f}s"
    minutes = value // 60_000
    if minutes < 48 * 60:
        return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"
    return f"{minutes // (24 * 60)}d"


def _limit(used: int, limit: int | None) -> str:
    return f"{used}/{limit}" if limit is not None else f"{used}/-"
