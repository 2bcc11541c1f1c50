"""The SQL statements of the PostgreSQL event store (`store.postgres`), compiled for asyncpg
once, at import."""

from __future__ import annotations

from typing import Final

from sqlalchemy import BigInteger, String, any_, bindparam, delete, func, insert, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from .schema import events, snapshots

POSITION_LOCK: Final = 0x6761_7465_7761_7970
"""Advisory lock key every write transaction holds to its commit (``pg_advisory_xact_lock``)."""
CHANNEL: Final = "gateway_events"
"""The LISTEN/NOTIFY channel; a notification's payload is the last position committed."""

DIALECT: Final = URL.create("postgresql+asyncpg").get_dialect()()


def compiled(statement: ClauseElement, *params: str) -> str:
    """``statement`` compiled for asyncpg, its ``$n`` parameters checked to be ``params``."""
    compiled = statement.compile(dialect=DIALECT)
    order = tuple(compiled.positiontup or ()) if isinstance(compiled, SQLCompiler) else ()
    if order != params:
        raise AssertionError(f"parameters {order} where {params} were meant")
    return str(compiled)


COLUMNS: Final = tuple(events.columns)
LOCK: Final = f"BEGIN; SELECT pg_advisory_xact_lock({POSITION_LOCK})"
INSERT: Final = compiled(insert(events), *(c.name for c in COLUMNS))
MAX_POSITION: Final = compiled(select(func.max(events.c.position)))
READ: Final = compiled(
    select(*COLUMNS).where(events.c.position > bindparam("after"))
    .order_by(events.c.position).limit(bindparam("limit")), "after", "limit")
READ_STREAM: Final = compiled(
    select(*COLUMNS).where(events.c.stream == bindparam("stream"),
                            events.c.version > bindparam("after"))
    .order_by(events.c.version).limit(bindparam("limit")), "stream", "after", "limit")
FIND: Final = compiled(
    select(*COLUMNS).where(events.c.event_id == any_(bindparam("ids", type_=ARRAY(String)))),
    "ids")
# The last position (in the row whose stream is NULL) and one index probe per stream (a GROUP
# BY over the streams would read all their entries): one round trip for both.
HEAD: Final = (
    "SELECT NULL, max(position) FROM events UNION ALL "
    "SELECT s.stream, (SELECT max(e.version) FROM events e WHERE e.stream = s.stream) "
    "FROM unnest($1::varchar[]) AS s(stream)")
STREAM_VERSIONS: Final = compiled(
    select(events.c.stream, func.max(events.c.version)).group_by(events.c.stream))
SNAPSHOT_INFO: Final = compiled(select(
    snapshots.c.position, snapshots.c.fingerprint, snapshots.c.checksum,
    snapshots.c.created_at, func.length(snapshots.c.data),
).order_by(snapshots.c.position.desc()))
READ_SNAPSHOT: Final = compiled(select(
    snapshots.c.position, snapshots.c.fingerprint, snapshots.c.checksum,
    snapshots.c.created_at, snapshots.c.data,
).where(snapshots.c.position == bindparam("position")), "position")
DELETE_SNAPSHOT: Final = compiled(
    delete(snapshots).where(snapshots.c.position == bindparam("position")), "position")
INSERT_SNAPSHOT: Final = compiled(insert(snapshots), *(c.name for c in snapshots.columns))
KEEP_SNAPSHOTS: Final = compiled(delete(snapshots).where(snapshots.c.position.not_in(
    select(snapshots.c.position).order_by(snapshots.c.position.desc())
    .limit(bindparam("keep")).scalar_subquery())), "keep")
DELETE_SNAPSHOTS: Final = compiled(delete(snapshots).where(
    snapshots.c.position == any_(bindparam("positions", type_=ARRAY(BigInteger)))),
    "positions")
DELETE_ALL_SNAPSHOTS: Final = compiled(delete(snapshots))
# The database's clock (one for every host) in the row whose resource is NULL, then the
# lease rows asked for (all of them for a NULL array): one round trip.
LEASE_ROWS: Final = (
    "SELECT NULL::varchar, NULL::varchar, NULL::bigint, "
    "(extract(epoch FROM clock_timestamp()) * 1000)::bigint UNION ALL "
    "SELECT resource, owner, epoch, expires_at FROM leases "
    "WHERE $1::varchar[] IS NULL OR resource = ANY($1::varchar[])")
LOCK_LEASES: Final = (
    "WITH locked AS (SELECT resource, owner, epoch, expires_at FROM leases "
    "WHERE resource = ANY($1::varchar[]) ORDER BY resource COLLATE \"C\" FOR SHARE) "
    "SELECT NULL::varchar, NULL::varchar, NULL::bigint, "
    "(extract(epoch FROM clock_timestamp()) * 1000)::bigint UNION ALL "
    "SELECT * FROM locked")
INSERT_LEASE: Final = (
    "INSERT INTO leases (resource, owner, epoch, expires_at) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (resource) DO NOTHING")
SWAP_LEASE: Final = (
    "UPDATE leases SET owner = $2, epoch = $3, expires_at = $4 WHERE resource = $1 AND "
    "owner IS NOT DISTINCT FROM $5 AND epoch = $6 AND expires_at = $7")
DELETE_LEASES: Final = "DELETE FROM leases WHERE resource = ANY($1::varchar[])"


def deleted(status: str) -> int:
    """The row count of a ``DELETE n`` command status."""
    return int(status.rsplit(" ", 1)[-1])
