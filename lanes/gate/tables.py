"""The provider gate's rules as tables: the circuit breaker's legal transitions, and the
enum members the decisions read all the time."""

from __future__ import annotations

from enum import StrEnum

from lanes.gate.events import UNHEALTHY, CallOutcome, FreedBy


class Breaker(StrEnum):
    """The circuit breaker: closed, open until a time, or half-open with one probe."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# Enum members the decisions read all the time, bound once: on CPython 3.11 reading one off
# its class (``Breaker.OPEN``) goes through `EnumType.__getattr__`'s lookup hook and costs
# about as much as a dict update.
CLOSED, OPEN, HALF_OPEN = Breaker.CLOSED, Breaker.OPEN, Breaker.HALF_OPEN
RELEASED, CANCELLED, LEASE_EXPIRED = FreedBy.RELEASED, FreedBy.CANCELLED, FreedBy.LEASE_EXPIRED
OK, SPEND_LIMIT = CallOutcome.OK, CallOutcome.SPEND_LIMIT


BREAKER_TRANSITIONS: dict[tuple[Breaker, str], Breaker] = {
    (CLOSED, "BreakerOpened"): OPEN,  # `breaker_threshold` unhealthy answers in a row
    (HALF_OPEN, "BreakerOpened"): OPEN,  # the probe's answer was unhealthy
    (OPEN, "BreakerHalfOpened"): HALF_OPEN,  # its cooldown is over: one probe may go
    (HALF_OPEN, "BreakerClosed"): CLOSED,  # the probe's answer was healthy
}
"""(breaker, breaker event type) -> next breaker; any other pair is illegal. Besides, no
breaker event applies while the probe is in flight, nor a half-open before the cooldown's
end."""

OPENS_BREAKER: frozenset[CallOutcome] = UNHEALTHY
"""The answers that count towards opening the breaker while it is closed, and reopen it when
the probe gets one. Any other answer resets the count and closes a half-open breaker."""
