"""Held controls: risk-reducing controls the log refused, stored by the gateway itself later.

When a stop (or a pause, a cancel) cannot be stored, because the log refuses writes or the
agent is being rebuilt after a failed append, the client is told the gateway holds it, and
the gateway stores it, before anything else of its agent, as soon as it can. A resume or a
release is never held (it would act later than asked): it is refused, and a retry of it that
a held control came after is refused for good (it would undo the later stop).

What happens to a control that cannot be stored, by what went wrong:

| the control | storage failed (decided, not committed) | agent being rebuilt (not decided) |
|---|---|---|
| held action, held already | answered "held" | answered "held" |
| held action, not held | stored meanwhile: the error as it is | held (up to `MAX_HELD`) |
| other action | refused, remembered | refused, remembered |

When the agent leaves this process (another one of a cluster takes it over) with controls
still held, they go to its new owner, in the order they came (`gateway.runtime.holding`),
which stores them as any request (a control stored meanwhile is found there by its id).

A control whose client was told it is held is said in the server's log once, when it is
stored at last (``gateway.controls``; a stop at WARNING, as any halt).
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Final

from gateway.errors import AgentUnavailable, GatewayError, StorageFailed
from lanes.events import RequestReceived
from lanes.requests import ControlAction

HELD_ACTIONS: Final = frozenset({ControlAction.EMERGENCY_STOP, ControlAction.PAUSE,
                                ControlAction.CANCEL_ALL, ControlAction.CANCEL_ORDER})
"""Control actions that reduce risk: held when they cannot be stored."""
MAX_HELD: Final = 100
"""Most controls held for one agent (beyond it, new ones are refused as usual)."""
NOT_DECIDED: Final = sys.maxsize
"""The version of a held control that was not decided (its agent was being rebuilt)."""

log = logging.getLogger("gateway.controls")


@dataclass(slots=True)
class HeldControls:
    """One agent's controls held, refused and superseded during a storage fault."""

    held: dict[str, tuple[RequestReceived, int]] = field(default_factory=dict)
    """Risk-reducing controls not known to be stored yet, by request id, with the stream
    version their decision reaches (`NOT_DECIDED` while the agent was being rebuilt)."""
    refused: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_HELD))
    """Other controls (resume, release) refused during a storage fault, by request id."""
    superseded: set[str] = field(default_factory=set)
    """Of those, the ones a held control came after: a retry of one is refused."""
    promised: set[str] = field(default_factory=set)
    """Held controls whose clients were told so (said in the log once stored)."""

    def __bool__(self) -> bool:
        return bool(self.held)

    def supersedes(self, request_id: str) -> bool:
        """Whether a retry of ``request_id`` must be refused (a held control came after)."""
        return bool(self.superseded) and request_id in self.superseded

    def decided(self, received: RequestReceived, version: int) -> None:
        """A request was decided at ``version``: held until its commit if it reduces risk."""
        if received.request.action not in HELD_ACTIONS:
            return
        self.held[received.request.request_id] = (received, version)
        self._supersede()

    def refuse(self, received: RequestReceived, error: GatewayError, fault: str | None
               ) -> GatewayError:
        """The error to answer a request that could not be stored with (see the table in
        the module's docstring); ``fault`` is why its agent is being rebuilt."""
        request = received.request
        action = request.action
        if action is None or not isinstance(error, StorageFailed | AgentUnavailable):
            return error
        if action not in HELD_ACTIONS:
            self.refused.append(request.request_id)
            return error
        if isinstance(error, AgentUnavailable) and request.request_id not in self.held:
            if len(self.held) >= MAX_HELD:
                return error
            self.held[request.request_id] = (received, NOT_DECIDED)
        elif request.request_id not in self.held:
            return error  # stored meanwhile after all (a commit reported failed went through)
        self._supersede()
        self.promised.add(request.request_id)
        if isinstance(error, StorageFailed):
            return StorageFailed(error.detail, held=True)
        return StorageFailed("the agent is being rebuilt from the log" + (
            "" if fault is None else f": {fault}"), held=True)

    def stored(self, request_id: str) -> None:
        """A request was stored at last: nothing for it to supersede."""
        if self.refused and request_id in self.refused:
            self.refused.remove(request_id)

    def committed(self, version: int) -> None:
        """The agent's appends up to ``version`` are committed (they commit in order)."""
        if self.held:
            self._keep({rid: held for rid, held in self.held.items() if held[1] > version})

    def rebuilt(self, seen: Container[str]) -> list[RequestReceived]:
        """The agent was folded from the log again (``seen``: the request ids it holds):
        the controls still to store, in the order they came."""
        self._keep({rid: held for rid, held in self.held.items() if rid not in seen})
        return [received for received, _ in self.held.values()]

    def clear(self) -> list[RequestReceived]:
        """Forget everything (the agent leaves this process); the controls that were still
        held, in the order they came (for the agent's next process to store)."""
        left = [received for received, _ in self.held.values()]
        self.held.clear()
        self.refused.clear()
        self.superseded.clear()
        self.promised.clear()
        return left

    def _keep(self, held: dict[str, tuple[RequestReceived, int]]) -> None:
        """Hold only ``held`` from now on: the others are stored."""
        for request_id in self.promised - held.keys():
            if request_id in self.held:
                _said_stored(self.held[request_id][0])
        self.promised &= held.keys()
        self.held = held

    def _supersede(self) -> None:
        if self.refused:  # a stop after a refused resume: that resume must not follow
            self.superseded.update(self.refused)
            self.refused.clear()


def _said_stored(received: RequestReceived) -> None:
    request = received.request
    action = request.action
    log.log(logging.WARNING if action is ControlAction.EMERGENCY_STOP else logging.INFO,
            "control %s of %s by %s (%s): stored, held while the event log refused writes",
            action.value if action is not None else "?", request.agent_id,
            received.principal or request.source or "?", request.request_id,
            extra={"agent_id": request.agent_id, "request_id": request.request_id,
                   "principal": received.principal})
