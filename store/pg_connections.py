"""What a PostgreSQL connection's failure means: put in words (`reason`), and whether the
connection may be used again after it (`rolled_back`)."""

from __future__ import annotations

from typing import Any, Final

import asyncpg

CONNECTION_ERRORS: Final = (
    OSError, asyncpg.InterfaceError, asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError)
"""What a lost or broken connection raises (the driver's state errors included: "another
operation is in progress", after an operation was cut off)."""


def reason(exc: BaseException) -> str:
    """What went wrong, in words a person can act on, with the server's message (no SQL)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, asyncpg.LockNotAvailableError):
        return f"the event log is locked by another process (PostgreSQL: {text})"
    if isinstance(exc, asyncpg.DiskFullError):
        return f"the disk holding the event log is full (PostgreSQL: {text})"
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
        return f"the event log is read-only (PostgreSQL: {text})"
    if isinstance(exc, asyncpg.InsufficientResourcesError | asyncpg.PostgresIOError):
        return f"the PostgreSQL server is out of resources (PostgreSQL: {text})"
    if isinstance(exc, CONNECTION_ERRORS):
        return f"the connection to PostgreSQL failed ({text})"
    return text


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a statement (the connection is sound), not the
    connection failing or an operation cut off (cancelled, timed out)."""
    return isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, CONNECTION_ERRORS)


async def rolled_back(conn: Any, exc: BaseException) -> bool:
    """End the transaction on ``conn`` that failed with ``exc``: True if it was rolled back
    and ``conn`` may be used again. False for a connection closed, broken, or cut off
    mid-operation (its driver may be in a state it cannot go on from): never use it again."""
    if conn.is_closed() or not refused(exc):
        return False
    try:
        await conn.execute("ROLLBACK")
    except BaseException:  # (cut off again, or broken meanwhile)
        return False
    return True
