"""A stream's life in this process, agents' and provider gates' alike: one `Phase`, moved
only along `TRANSITIONS` (an illegal move raises and changes nothing, as h11's state machine
does). `gateway.runtime.core.StreamCore` holds it; an agent and a gate read theirs from it.

| from \\ to | IDLE | LIVE | REBUILDING | GONE |
|---|---|---|---|---|
| NEW | a gate started beside its owner | started to decide | | stopped unstarted |
| IDLE | | loaded (adopted) | | stopped |
| LIVE | unloaded, dropped, fenced | | an append failed | stopped or left |
| REBUILDING | unloaded, dropped, fenced | folded from the log again | | stopped or left |
| GONE | | | | |

Only a LIVE stream decides and acts; a REBUILDING one holds or refuses its inputs until it is
the log's fold again. An agent is made LIVE when this process takes it and is GONE when it
leaves (a new one is made if it comes back), so it is never NEW or IDLE. A provider gate is
NEW until its engine starts, IDLE while another process decides for it (a read-only mirror of
its stream, which may be loaded again), GONE once stopped. A task still holding a GONE
stream (its run, its rebuild) finds it gone and does nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final


class Phase(Enum):
    """Where a stream is in its life in this process."""

    NEW = "new"
    """Made, not started (a provider gate before its engine starts)."""
    IDLE = "idle"
    """Folded, not deciding: another process decides for it (a provider gate)."""
    LIVE = "live"
    """Deciding and acting."""
    REBUILDING = "rebuilding"
    """An append failed: its state ran ahead of the log and is folded from the log again."""
    GONE = "gone"
    """Stopped, or left this process: another process decides for it now."""


TRANSITIONS: Final[Mapping[Phase, frozenset[Phase]]] = {
    Phase.NEW: frozenset({Phase.IDLE, Phase.LIVE, Phase.GONE}),
    Phase.IDLE: frozenset({Phase.LIVE, Phase.GONE}),
    Phase.LIVE: frozenset({Phase.IDLE, Phase.REBUILDING, Phase.GONE}),
    Phase.REBUILDING: frozenset({Phase.IDLE, Phase.LIVE, Phase.GONE}),
    Phase.GONE: frozenset(),
}

DECIDING: Final = frozenset({Phase.LIVE, Phase.REBUILDING})
"""The phases of a stream this process decides for (a rebuild included)."""


class IllegalPhase(RuntimeError):
    """A move `TRANSITIONS` does not allow (a bug of the runtime's)."""


def moved(stream: str, now: Phase, to: Phase) -> Phase:
    """``to``, if `TRANSITIONS` allows the move from ``now`` (else `IllegalPhase`)."""
    if to not in TRANSITIONS[now]:
        raise IllegalPhase(f"{stream}: {now.value} -> {to.value}")
    return to
