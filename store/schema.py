"""The event table (and the snapshot cache beside it), as dialect-neutral SQLAlchemy Core.

The schema is created only by the Alembic migrations in ``migrations/``; this module is what
the adapters query with and what ``alembic revision --autogenerate`` compares against.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()
"""Metadata holding every table of the store."""

STREAM_MAX = 200
"""Longest stream name the schema holds."""
EVENT_ID_MAX = 100
"""Longest event id the schema holds."""
TYPE_MAX = 100
"""Longest event type name the schema holds."""

events = Table(
    "events",
    metadata,
    # On SQLite an INTEGER PRIMARY KEY is the rowid alias: no separate index, fast range reads.
    Column(
        "position",
        BigInteger().with_variant(Integer(), "sqlite"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("stream", String(STREAM_MAX), nullable=False),
    Column("version", Integer(), nullable=False),
    Column("event_id", String(EVENT_ID_MAX), nullable=False),
    Column("type", String(TYPE_MAX), nullable=False),
    Column("data", Text(), nullable=False),
    Column("recorded_at", BigInteger(), nullable=False),
    UniqueConstraint("event_id", name="uq_events_event_id"),
    UniqueConstraint("stream", "version", name="uq_events_stream_version"),
    Index("ix_events_type", "type"),
)
"""The append-only log: one row per recorded event, keyed by its global position."""

FINGERPRINT_MAX = 64
"""Longest snapshot fingerprint or checksum the schema holds."""

snapshots = Table(
    "snapshots",
    metadata,
    Column(
        "position",
        BigInteger().with_variant(Integer(), "sqlite"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("fingerprint", String(FINGERPRINT_MAX), nullable=False),
    Column("checksum", String(FINGERPRINT_MAX), nullable=False),
    Column("created_at", BigInteger(), nullable=False),
    Column("data", LargeBinary(), nullable=False),
)
"""A cache of folds of the log, each covering the events up to its ``position``; never the
truth (the events are): a snapshot can be deleted at any time."""

MEMBER_MAX = 300
"""Longest member id (and lease resource: a stream, or ``member:<id>``) the schema holds."""

leases = Table(
    "leases",
    metadata,
    Column("resource", String(MEMBER_MAX), primary_key=True),
    Column("owner", String(MEMBER_MAX), nullable=True),
    Column("epoch", BigInteger(), nullable=False),
    Column("expires_at", BigInteger(), nullable=False),
)
"""Leases of several gateway processes on one log (`store.port.Leases`): a member's own
(``member:<id>``, its ``expires_at`` renewed while it lives) and the streams' (``owner`` the
member holding it, None when released; ``epoch`` grows at every change of hands)."""
