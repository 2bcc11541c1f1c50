"""Every event in a provider gate's stream (``provider:<name>``): inputs and decisions.

Inputs carry their time (``at``, ms since the epoch); decisions happen at the time of the
input that caused them, which is the gate state's ``now`` when they are evolved. A decision
carries what replay needs, so folding the decisions alone rebuilds the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import Field, NonNegativeInt, model_validator

from lanes.config import MAX_COUNT, MAX_GATE_WEIGHT, MAX_MS
from lanes.policy import PolicyAdopted, PolicyDeferred, PolicyOffered
from lanes.requests import Priority, WireModel

WINDOW_MS = 60_000
"""The sliding window every per-minute limit is counted over."""


class GateLimits(WireModel):
    """What the provider allows, and how the gate waits, backs off and trips.

    ``None`` means unlimited. A change applies to requests not yet granted (leases already
    granted keep their deadline).
    """

    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    input_tokens_per_minute: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    output_tokens_per_minute: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_concurrent: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_wait_ms: int = Field(default=120_000, ge=0, le=MAX_MS)
    """A request waiting longer than this is refused."""
    lease_ms: int = Field(default=180_000, ge=1, le=MAX_MS)
    """A granted slot not released by then is freed (default: the agents' default run
    timeout of 120 s plus 60 s, so it never expires under a live run)."""
    priority_aging_ms: int = Field(default=30_000, ge=1, le=MAX_MS)
    """How much earlier each priority class counts its requests as having arrived, per rank
    (low 0, normal 1, high 2): a lower class waits at most this much per rank of difference
    behind a busy higher one, so it is never starved."""
    backoff_base_ms: int = Field(default=1_000, ge=1, le=MAX_MS)
    backoff_cap_ms: int = Field(default=60_000, ge=1, le=MAX_MS)
    max_attempts: int = Field(default=5, ge=1, le=1_000)
    """A run whose calls failed this many times in a row gets no further slot."""
    breaker_threshold: int = Field(default=5, ge=1, le=MAX_COUNT)
    """Consecutive overloaded / server-error / timeout outcomes that open the breaker."""
    breaker_cooldown_ms: int = Field(default=30_000, ge=1, le=MAX_MS)

    @model_validator(mode="after")
    def _cap_at_least_base(self) -> GateLimits:
        if self.backoff_cap_ms < self.backoff_base_ms:
            raise ValueError("backoff_cap_ms must be at least backoff_base_ms")
        return self


def lease_too_short(lease_ms: int, run_timeout_ms: int, agent_id: str, provider: str) -> str | None:
    """Why a gate's slot lease of ``lease_ms`` cannot serve an agent whose runs may last
    ``run_timeout_ms`` (None if it can): a slot must never expire under a live run. The one
    copy of that rule, for the config file, an agent's new config and a gate's new limits."""
    if lease_ms > run_timeout_ms:
        return None
    return (f"provider {provider!r}'s slot lease ({lease_ms} ms) is not longer than the run "
            f"timeout of agent {agent_id!r} ({run_timeout_ms} ms): a slot must never expire "
            "under a live run")


class CallOutcome(StrEnum):
    """How the provider answered the call made under a slot."""

    OK = "ok"
    RATE_LIMITED = "rate_limited"
    """429: slow down (provider-wide backoff), then the run may retry."""
    OVERLOADED = "overloaded"
    """529 / 503: back off, and count towards the circuit breaker."""
    SPEND_LIMIT = "spend_limit"
    """A 429 that must not be retried: the agent is to be paused with an alert."""
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    """The provider refused the request itself (a 4xx other than 429: bad request, bad key):
    not retried, and it says nothing about the provider's health."""


THROTTLED = frozenset({CallOutcome.RATE_LIMITED, CallOutcome.OVERLOADED})
"""Outcomes that schedule a provider-wide backoff."""
UNHEALTHY = frozenset({CallOutcome.OVERLOADED, CallOutcome.SERVER_ERROR, CallOutcome.TIMEOUT})
"""Outcomes that count towards the circuit breaker (and fail a half-open probe)."""
RETRYABLE = THROTTLED | UNHEALTHY
"""Outcomes that count as a failed attempt of the run (bounded by ``max_attempts``)."""


class FreedBy(StrEnum):
    """Why a slot (waiting or granted) was freed."""

    RELEASED = "released"
    CANCELLED = "cancelled"
    LEASE_EXPIRED = "lease_expired"


class Refusal(StrEnum):
    """Why a request for a slot was refused (the event's ``reason`` says it in words)."""

    WAITED_TOO_LONG = "waited_too_long"
    BREAKER_OPEN = "breaker_open"
    BACKING_OFF = "backing_off"
    TOO_LARGE = "too_large"
    RETRIES_EXHAUSTED = "retries_exhausted"
    SPEND_LIMIT = "spend_limit"


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRequested:
    """A run asks for a slot before calling the provider, with its token estimate."""

    at: int
    slot_id: str
    agent_id: str
    run_id: str
    priority: Priority = Priority.NORMAL
    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    weight: Annotated[int, Field(ge=1, le=MAX_GATE_WEIGHT)] = 1
    """The agent's weight (`lanes.config.AgentConfig.gate_weight`): its share of tokens
    under contention is in proportion to it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotReleased:
    """The call under a slot ended: how, what it really used, and the provider's headers."""

    at: int
    slot_id: str
    outcome: CallOutcome
    input_tokens: NonNegativeInt | None = None
    """Actual usage, which replaces the estimate in the windows (None: unknown, the
    estimate stands)."""
    output_tokens: NonNegativeInt | None = None
    retry_after_ms: NonNegativeInt | None = None
    remaining_requests: NonNegativeInt | None = None
    remaining_tokens: NonNegativeInt | None = None
    reset_at: int | None = None
    """When the provider's remaining counts reset (ms since the epoch)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotCancelled:
    """The run was aborted or crashed: free its slot at once, waiting or granted."""

    at: int
    slot_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GateTimer:
    """Time reached ``at``: windows free, backoff and cooldown end, leases and waits expire."""

    at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GateLimitsChanged:
    """New limits for this provider (they apply to requests not yet granted)."""

    at: int
    limits: GateLimits


GateInput = (SlotRequested | SlotReleased | SlotCancelled | GateTimer | GateLimitsChanged
             | PolicyOffered)
GATE_INPUT_TYPES: tuple[type[GateInput], ...] = (
    SlotRequested,
    SlotReleased,
    SlotCancelled,
    GateTimer,
    GateLimitsChanged,
    PolicyOffered,
)

# ------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotQueued:
    """The request waits for a slot; it is refused if still waiting after ``wait_deadline``."""

    slot_id: str
    agent_id: str
    run_id: str
    priority: Priority
    input_tokens: int
    output_tokens: int
    wait_deadline: int
    weight: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotGranted:
    """The waiting request may call the provider; its lease ends at ``lease_deadline``.

    ``probe``: the single call a half-open breaker lets through.
    """

    slot_id: str
    lease_deadline: int
    probe: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotRefused:
    """The request gets no slot (on arrival, or while waiting); ``reason`` says why."""

    slot_id: str
    agent_id: str
    run_id: str
    code: Refusal
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotFreed:
    """A waiting or granted slot is no longer held.

    On release, ``outcome`` and the actual usage (which replaces the estimate in the
    windows) come with it.
    """

    slot_id: str
    by: FreedBy
    detail: str
    outcome: CallOutcome | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotReleaseIgnored:
    """A release named a slot the gate does not hold (late after a lease expiry, or twice)."""

    slot_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackoffScheduled:
    """No slot is granted before ``until`` (exponential with full jitter, or retry-after)."""

    until: int
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderHintsNoted:
    """The provider's rate-limit headers: grants slow down before it would answer 429."""

    remaining_requests: int | None
    remaining_tokens: int | None
    reset_at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerOpened:
    """The provider is failing: nothing is granted before ``until``."""

    until: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerHalfOpened:
    """The cooldown ended: exactly one probe call may go through."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerClosed:
    """The probe came back: grants resume."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpendLimitReached:
    """The provider refused for spend: the agent is to be paused with an alert; the run
    gets no retry."""

    agent_id: str
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GateLimitsApplied:
    """The limits in force from now on."""

    limits: GateLimits


GateDecision = (
    SlotQueued
    | SlotGranted
    | SlotRefused
    | SlotFreed
    | SlotReleaseIgnored
    | BackoffScheduled
    | ProviderHintsNoted
    | BreakerOpened
    | BreakerHalfOpened
    | BreakerClosed
    | SpendLimitReached
    | GateLimitsApplied
    | PolicyAdopted
    | PolicyDeferred
)
GATE_DECISION_TYPES: tuple[type[GateDecision], ...] = (
    SlotQueued,
    SlotGranted,
    SlotRefused,
    SlotFreed,
    SlotReleaseIgnored,
    BackoffScheduled,
    ProviderHintsNoted,
    BreakerOpened,
    BreakerHalfOpened,
    BreakerClosed,
    SpendLimitReached,
    GateLimitsApplied,
    PolicyAdopted,
    PolicyDeferred,
)

GateEvent = GateInput | GateDecision
