"""Storage faults: when the event log refuses writes, noted once and said in the log once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gateway.base.clock import Clock
from gateway.errors import NotOwner, StorageFailed, storage_fault_kind
from store.port import ConcurrencyError, FencedError, StoreError, WriteFailed

log = logging.getLogger("gateway.runtime.engine")

FAULT_LOG_INTERVAL_S: Final = 60.0
"""A storage fault that comes back with the same reason within this long is not logged again
(a nearly full disk takes small commits and refuses big ones: it would flap)."""


@dataclass(slots=True)
class StorageFault:
    """The event log refuses writes (locked by another process, disk full, I/O error)."""

    reason: str
    """Why, in words (no SQL)."""
    since: int
    """When the first commit failed (ms since the epoch)."""
    failed: int = 1
    """Commits failed since."""


class Faults:
    """The storage fault in force, if any: from the first failed commit to the next commit."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.current: StorageFault | None = None
        """Set while commits fail."""
        self._said: tuple[str, float] | None = None
        """The kind of fault last logged, and when (monotonic seconds)."""
        self._open = False
        """A logged fault whose end is not logged yet."""

    def failed(self, error: BaseException) -> str:
        """Note a failed commit; say so in the log once per fault (not once per append).
        The reason in words."""
        reason = error.reason if isinstance(error, WriteFailed) else str(error)
        fault = self.current
        if fault is not None and fault.reason == reason:
            fault.failed += 1
            return reason
        self.current = StorageFault(reason, self._clock.now_ms(),
                                    1 if fault is None else fault.failed + 1)
        now = time.monotonic()
        said = self._said
        kind = storage_fault_kind(reason)  # a flapping disk changes the details
        if said is not None and said[0] == kind and now - said[1] < FAULT_LOG_INTERVAL_S:
            log.debug("the event log cannot be written again: %s", reason)
            return reason
        log.error("the event log cannot be written: %s. Requests are refused (clients are "
                  "told to retry) until it can be again; reads go on", reason)
        self._said = (kind, now)
        self._open = True
        return reason

    def reason(self, own: str | None = None) -> str | None:
        """Why a stream is refused while rebuilt: the storage fault now, else ``own`` (why
        its own last append failed)."""
        return own if self.current is None else self.current.reason

    def committed(self) -> None:
        """A commit went through: the fault, if any, is over."""
        fault = self.current
        if fault is None:
            return
        self.current = None
        if not self._open:
            return
        self._open = False
        log.warning("the event log is written again, %.1f s after the first failed commit "
                    "(%d failed meanwhile)", (self._clock.now_ms() - fault.since) / 1000,
                    fault.failed)


def commit_error(error: BaseException, reason_of: Callable[[str], str | None]) -> BaseException:
    """What a failed commit is said to be to whoever waits for it (``reason_of``: why a
    stream's earlier append failed, if known)."""
    if isinstance(error, WriteFailed):
        return StorageFailed(error.reason)
    if isinstance(error, FencedError):  # another process holds the agent now: ask it
        return NotOwner(error.stream, None)
    if isinstance(error, ConcurrencyError):
        # Decided on top of an append of its agent that failed: that failure is the cause.
        reason = reason_of(error.stream)
        return StorageFailed("an earlier append of this agent was not recorded" + (
            "" if reason is None else f": {reason}"))
    if isinstance(error, StoreError):
        return StorageFailed(str(error))
    return error
