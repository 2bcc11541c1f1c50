"""The provider gate: one provider's shared, fair rate limiting as ``decide`` and ``evolve``.

Every reasoning run takes a slot from its provider's gate before calling the LLM and gives
it back afterwards. The gate is pure, like the agent core: `decide_gate(state, input)` makes
the decisions and evolves the state through them; `evolve_gate` is the one place the state
changes; an illegal event raises `IllegalTransition` before changing anything; folding a
``provider:<name>`` stream from an empty `GateState` gives back the live state.

The policy, in short:

- **Limits.** Requests, input tokens and output tokens are counted over a sliding 60 s
  window (a grant at ``t`` counts until ``t + 60 s``), each grant charged with its estimate
  until its release reports the actual usage. Nothing is granted that would take a window
  over its limit, nor more calls in flight than ``max_concurrent``. A request that a
  per-minute limit can never hold is refused on arrival.
- **Fairness: the share is tokens, whichever limit binds.** Agents that all want more
  than the gate can give (each calls again as soon as it can) get the same number of
  tokens over time, tokens being the estimates (input + output) of their granted requests:
  under a token limit as under the RPM or the concurrency cap, an agent asking for calls
  four times bigger gets a quarter of the calls. An agent that wants less than that share
  gets all it asks, and the rest is shared the same way among the others (max-min). Within
  one priority class; between classes, priority decides (below). How:

  - *The fair order* is start-time fair queueing weighted by tokens: each request gets a
    start tag, its agent's finish tag, which then moves on by the request's estimated
    tokens; the smallest tag goes first. An agent keeps its place (its credit) while it
    shares the gate: while it waits, holds a slot, or was granted one in the last 60 s.
    One away longer starts again at the virtual time (the largest tag granted): it banks
    no credit.
  - *Room for agents between calls* (`fair_hold`). An agent with one call at a time is
    not waiting while its call runs, and under a sliding window capacity comes back in
    bursts (what was granted 60 s earlier), which whoever waits at that moment would take
    whatever the order. So an agent that holds a slot, or had one released less than
    `FAIR_GRACE_MS` ago, with nothing waiting, keeps its place in the order as if it were
    waiting: a request of its last priority and behind it (a larger start tag than its
    finish tag) is granted only if each per-minute window keeps room for as many calls of
    its last size as it needs to catch up, and, if it holds no slot, a concurrency slot.
    Nothing else is ever held while capacity is free, and the room goes to the others once
    the agent neither holds a slot nor asks again within the grace. (Measured in
    ``bench.gate``: the shares of agents four times apart stay within 5 % of each other
    under each limit, with 99 % and more of the limit used.)
  - *Replay.* `Share` and what the index derives from it are folded from the events every
    gate log already holds (queued, granted, freed): logs recorded before still replay; a
    verify of one re-decides it under this policy, and may differ where it now holds a
    request back.
- **Priority.** High before normal before low, by aging rather than strictly: each class
  counts its requests as having arrived ``rank * priority_aging_ms`` earlier (high 2, normal
  1, low 0), and the class whose oldest request then comes first is served. So a fresh high
  request overtakes normal ones that have waited less than one aging period, but a lower
  class never falls further behind a busy higher one than that; the order between classes
  never changes with time alone. Within a class: the fair order, then arrival (aging never
  reorders one class, so it cannot undo fairness).
- **Head of line.** The chosen request is granted when it fits; nothing overtakes it, so a
  big prompt is never starved by a stream of small ones.
- **Waits are bounded.** A request still waiting at ``max_wait_ms`` is refused with what
  held it; one that certainly cannot be granted in time (the breaker open or a backoff
  running past its bound) is refused at once.
- **The provider's answers.** 429 and 529/503 schedule a provider-wide backoff (exponential,
  full jitter derived from a hash of the slot id and attempt, capped; ``retry-after`` is a
  floor). Overloaded, server-error and timeout outcomes in a row open the breaker; after
  its cooldown one probe call goes through: an answer other than those closes it, a failure
  reopens it. A run whose calls failed ``max_attempts`` times in a row gets no further slot
  (its retry request is refused), so retries are bounded per run. A spend limit emits
  `SpendLimitReached` and the run gets no retry. The rate-limit headers (remaining requests
  and tokens until a reset time) hold grants once what was granted since they were read
  would use them up.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from heapq import heapify, heappop, heappush
from typing import Any, TypeVar

from lanes.codec import Codec
from lanes.evolve import IllegalTransition
from lanes.gate_events import (
    GATE_DECISION_TYPES,
    GATE_INPUT_TYPES,
    RETRYABLE,
    THROTTLED,
    UNHEALTHY,
    WINDOW_MS,
    BackoffScheduled,
    BreakerClosed,
    BreakerHalfOpened,
    BreakerOpened,
    CallOutcome,
    FreedBy,
    GateDecision,
    GateEvent,
    GateInput,
    GateLimits,
    GateLimitsApplied,
    GateLimitsChanged,
    GateTimer,
    ProviderHintsNoted,
    Refusal,
    SlotCancelled,
    SlotFreed,
    SlotGranted,
    SlotQueued,
    SlotRefused,
    SlotReleased,
    SlotReleaseIgnored,
    SlotRequested,
    SpendLimitReached,
)
from lanes.replay import PROVIDER_PREFIX
from lanes.requests import RANK, Priority

RUN_MEMORY_MS = 3_600_000
"""How long the gate remembers a run's failed attempts after its last one."""
FAIR_GRACE_MS = 1_000
"""How long after a release an agent keeps its next call reserved (see `fair_hold`)."""


def gate_stream(provider: str) -> str:
    """The stream that holds a provider gate's events."""
    return PROVIDER_PREFIX + provider


# -------------------------------------------------------------------------------- state


class Breaker(StrEnum):
    """The circuit breaker: closed, open until a time, or half-open with one probe."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class Waiting:
    """A request waiting for a slot."""

    slot_id: str
    agent_id: str
    run_id: str
    priority: Priority
    input_tokens: int
    output_tokens: int
    queued_at: int
    deadline: int
    tag: int
    """Its start tag in the fair order (virtual time, in tokens)."""
    seq: int
    """Arrival order, the last tie-break."""
    left: bool = field(default=False, compare=False, repr=False)
    """It no longer waits (`GateIndex` drops it when it reaches a front)."""

    @property
    def tokens(self) -> int:
        """The estimated tokens, input and output."""
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class Lease:
    """A granted slot, held until released, cancelled or ``deadline``."""

    slot_id: str
    agent_id: str
    run_id: str
    priority: Priority
    input_tokens: int
    output_tokens: int
    granted_at: int
    deadline: int
    ended: bool = field(default=False, compare=False, repr=False)
    """It is no longer held (`GateIndex` drops it when it reaches the front)."""


@dataclass(slots=True)
class Charge:
    """What one grant counts for in the windows: its estimate, then its actual usage."""

    slot_id: str
    at: int
    input_tokens: int
    output_tokens: int


@dataclass(slots=True)
class Share:
    """What the fair order remembers of one agent: where it stands, and its last grant."""

    finish: int = 0
    """The finish tag of its latest request (tokens asked for, in virtual time)."""
    granted_at: int | None = None
    """When it was last granted a slot."""
    released_at: int | None = None
    """When one of its calls was last released."""
    input_tokens: int = 0
    """The estimate of its last granted request: what its next one is reserved."""
    output_tokens: int = 0
    rank: int = 0
    """The priority rank of its last granted request (what its next one is expected to be)."""


@dataclass(slots=True)
class Hint:
    """The provider's remaining requests and tokens as its headers said at ``observed_at``,
    and what was granted since."""

    remaining_requests: int | None
    remaining_tokens: int | None
    reset_at: int
    observed_at: int
    requests_since: int = 0
    tokens_since: int = 0


@dataclass(slots=True)
class RunAttempts:
    """A run's failed calls in a row, and the last outcome."""

    failures: int
    at: int
    last: CallOutcome


@dataclass(slots=True)
class GateCounters:
    """Running totals for observability; all derived from the log."""

    queued: int = 0
    granted: int = 0
    refused: int = 0
    released: int = 0
    cancelled: int = 0
    expired: int = 0
    ignored: int = 0
    backoffs: int = 0
    breaker_opens: int = 0
    spend_limits: int = 0
    input_tokens: int = 0
    """Actual input tokens reported at release."""
    output_tokens: int = 0


RANKS = range(len(RANK))
"""The priority ranks, low (0) to high: `RANK` numbers them from 0."""
WaitingKey = tuple[int, int, Waiting]
"""(key, seq, entry): ``seq`` is unique, so entries themselves are never compared."""


@dataclass(frozen=True, slots=True)
class HotLimits:
    """The limits read on every decision, as plain attributes (reading an attribute of a
    pydantic model costs several times more)."""

    requests_per_minute: int | None
    input_tokens_per_minute: int | None
    output_tokens_per_minute: int | None
    max_concurrent: int | None
    max_wait_ms: int
    lease_ms: int
    priority_aging_ms: int
    max_attempts: int
    breaker_threshold: int

    @classmethod
    def of(cls, limits: GateLimits) -> HotLimits:
        """The hot part of ``limits``."""
        return cls(
            limits.requests_per_minute,
            limits.input_tokens_per_minute,
            limits.output_tokens_per_minute,
            limits.max_concurrent,
            limits.max_wait_ms,
            limits.lease_ms,
            limits.priority_aging_ms,
            limits.max_attempts,
            limits.breaker_threshold,
        )


@dataclass(slots=True)
class GateIndex:
    """What the gate reads on every decision, derived from its state so that no decision
    scans every request: `GateState.waiting` and `GateState.leases` sorted the ways the
    gate reads them, the limits as plain attributes, and the next request in line.

    Each collection holds every live entry and perhaps some that have left (they are
    dropped once they reach the front, or all at once when they outnumber the live ones);
    its front is always live. `evolve_gate` keeps it up to date (and `next_in_line` fills
    in ``head``), so a fold rebuilds one that answers the same; it takes no part in the
    state's equality.
    """

    limits: HotLimits
    arrivals: tuple[deque[Waiting], ...] = field(
        default_factory=lambda: tuple(deque() for _ in RANKS)
    )
    """Per rank (low 0, normal 1, high 2): that class's requests in arrival order."""
    fair: tuple[list[WaitingKey], ...] = field(default_factory=lambda: tuple([] for _ in RANKS))
    """Per rank: a heap of that class's requests by (fair tag, seq)."""
    deadlines: list[WaitingKey] = field(default_factory=list)
    """A heap of every waiting request by (wait deadline, seq)."""
    leases: list[tuple[int, int, Lease]] = field(default_factory=list)
    """A heap of the leases by (lease deadline, seq)."""
    head: Waiting | None = None
    """`next_in_line`, remembered until the waiting requests or the limits change..."""
    head_known: bool = False
    """...which sets this to False."""
    cleared: Waiting | None = None
    """The request `_settle` has just found within every limit and is granting: applying
    that `SlotGranted` need not check the limits again (every other grant is checked)."""
    waiting_of: dict[str, int] = field(default_factory=dict)
    """Agent id -> its requests waiting (only agents with some)."""
    leases_of: dict[str, int] = field(default_factory=dict)
    """Agent id -> its slots granted and not yet freed (only agents with some)."""
    between: dict[str, int] = field(default_factory=dict)
    """Agent id -> finish tag of every agent between calls (`_between_calls`), and perhaps
    of some whose slot or grace has ended since (dropped when they come first, at a grant,
    or when they ask again)..."""
    behind: list[tuple[int, str]] = field(default_factory=list)
    """...and the same as (finish tag, agent id), sorted: the most behind first."""
    graced: deque[tuple[int, str]] = field(default_factory=deque)
    """(end of the release's grace, agent id) per release, in time order; an entry is
    current while it is its agent's latest release (`Share.released_at`)."""

    @classmethod
    def of(cls, state: GateState) -> GateIndex:
        """The index of ``state``."""
        index = cls(HotLimits.of(state.limits))
        for entry in sorted(state.waiting.values(), key=lambda entry: entry.seq):
            _index_waiting(index, entry)
        for n, lease in enumerate(state.leases.values(), 1):  # -n: apart from any seq
            heappush(index.leases, (lease.deadline, -n, lease))
            _count(index.leases_of, lease.agent_id, 1)
        released = [
            (share.released_at + FAIR_GRACE_MS, agent_id)
            for agent_id, share in state.shares.items()
            if share.released_at is not None and share.released_at + FAIR_GRACE_MS >= state.now
        ]
        index.graced.extend(sorted(released))
        for agent_id, share in state.shares.items():
            if _between_calls_of(index, share, state.now, agent_id):
                _join_between(index, agent_id, share.finish)
        return index


@dataclass(slots=True)
class GateState:
    """One provider's gate. Mutable, but only `evolve_gate` changes it."""

    provider: str
    limits: GateLimits = field(default_factory=GateLimits)
    version: int = 0
    now: int = 0
    seq: int = 0
    waiting: dict[str, Waiting] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    window: deque[Charge] = field(default_factory=deque)
    """Grants of the last 60 s (and maybe a few older, pruned at the next grant), oldest
    first; the totals below are over all of them."""
    charges: dict[str, Charge] = field(default_factory=dict)
    used_requests: int = 0
    used_input: int = 0
    used_output: int = 0
    vtime: int = 0
    shares: dict[str, Share] = field(default_factory=dict)
    """Agent id -> where it stands in the fair order (see `Share`)."""
    not_before: int = 0
    attempt: int = 0
    """Throttled answers in a row, provider-wide (the backoff exponent)."""
    breaker: Breaker = Breaker.CLOSED
    breaker_until: int = 0
    failures: int = 0
    """Unhealthy answers in a row while the breaker is closed."""
    probe: str | None = None
    hint: Hint | None = None
    runs: dict[str, RunAttempts] = field(default_factory=dict)
    """Run id -> its failed attempts in a row, oldest first."""
    counters: GateCounters = field(default_factory=GateCounters)
    index: GateIndex = field(init=False, compare=False, repr=False)
    """Derived from the rest (see `GateIndex`)."""

    def __post_init__(self) -> None:
        self.index = GateIndex.of(self)


# Enum members the decisions read all the time, bound once: on CPython 3.11 reading one off
# its class (``Breaker.OPEN``) goes through `EnumType.__getattr__`'s lookup hook and costs
# about as much as a dict update.
_CLOSED, _OPEN, _HALF_OPEN = Breaker.CLOSED, Breaker.OPEN, Breaker.HALF_OPEN
_RELEASED, _CANCELLED, _LEASE_EXPIRED = FreedBy.RELEASED, FreedBy.CANCELLED, FreedBy.LEASE_EXPIRED
_OK, _SPEND_LIMIT = CallOutcome.OK, CallOutcome.SPEND_LIMIT


def window_usage(state: GateState, now: int) -> tuple[int, int, int]:
    """Requests, input tokens and output tokens granted in the 60 s window ending at ``now``."""
    requests, inputs, outputs = state.used_requests, state.used_input, state.used_output
    horizon = now - WINDOW_MS
    for charge in state.window:
        if charge.at > horizon:
            break
        requests -= 1
        inputs -= charge.input_tokens
        outputs -= charge.output_tokens
    return requests, inputs, outputs


def blocker(state: GateState, entry: Waiting) -> str | None:
    """Why ``entry`` cannot be granted right now, or None if it can."""
    now, limits, breaker = state.now, state.index.limits, state.breaker
    if breaker is not _CLOSED:
        if breaker is _OPEN:
            return f"the circuit breaker is open until {state.breaker_until}"
        if state.probe is not None:
            return "the circuit breaker is half-open and its probe call is in flight"
    if now < state.not_before:
        return f"backing off until {state.not_before} (attempt {state.attempt})"
    cap = limits.max_concurrent
    if cap is not None and len(state.leases) >= cap:
        return f"max_concurrent: {cap} calls in flight"
    hint = state.hint
    if hint is not None and now < hint.reset_at:
        if hint.remaining_requests is not None and hint.requests_since >= hint.remaining_requests:
            return f"the provider reports no requests left until {hint.reset_at}"
        if (
            hint.remaining_tokens is not None
            and hint.tokens_since + entry.tokens > hint.remaining_tokens
        ):
            return f"the provider reports too few tokens left until {hint.reset_at}"
    window = state.window
    if window and window[0].at <= now - WINDOW_MS:  # some grants have left the window
        requests, inputs, outputs = window_usage(state, now)
    else:
        requests, inputs, outputs = state.used_requests, state.used_input, state.used_output
    rpm = limits.requests_per_minute
    if rpm is not None and requests + 1 > rpm:
        return f"requests_per_minute: {rpm} granted in the last 60 s"
    itpm = limits.input_tokens_per_minute
    if itpm is not None and inputs + entry.input_tokens > itpm:
        return f"input_tokens_per_minute: {inputs} of {itpm} used in the last 60 s"
    otpm = limits.output_tokens_per_minute
    if otpm is not None and outputs + entry.output_tokens > otpm:
        return f"output_tokens_per_minute: {outputs} of {otpm} used in the last 60 s"
    return None


def _sharing(state: GateState, agent_id: str, share: Share) -> bool:
    """Whether an agent takes part in sharing the gate: it waits, holds a slot, or was
    granted one in the last 60 s (so it keeps its place in the fair order)."""
    index = state.index
    return (
        agent_id in index.waiting_of
        or agent_id in index.leases_of
        or (share.granted_at is not None and share.granted_at > state.now - WINDOW_MS)
    )


def _between_calls(state: GateState, agent_id: str) -> bool:
    """Whether an agent is between calls: nothing of it waits, and it holds a slot or had
    one released less than `FAIR_GRACE_MS` ago (it is expected to ask again)."""
    return _between_calls_of(state.index, state.shares[agent_id], state.now, agent_id)


def _between_calls_of(index: GateIndex, share: Share, now: int, agent_id: str) -> bool:
    """`_between_calls`, from the parts of the state it reads."""
    if agent_id in index.waiting_of:
        return False
    if agent_id in index.leases_of:
        return True
    released = share.released_at
    return released is not None and now < released + FAIR_GRACE_MS


def fair_hold(state: GateState, entry: Waiting) -> str | None:
    """Why ``entry``, within every limit, still waits for agents that have had fewer
    tokens, or None.

    The agents between calls (`_between_calls`) whose next request would come before
    ``entry`` in the fair order of its priority class (their last request was of that
    class, and their finish tag is smaller than its start tag) are kept room in each
    per-minute window for as many calls of their last size as they need to catch up with
    it, and a concurrency slot each if they hold none (one released less than
    `FAIR_GRACE_MS` ago); ``entry`` waits if what is left is too small for it. Under a
    sliding window capacity comes back in bursts, and whoever waits at that moment would
    otherwise take all of it, whatever the order; a slot comes back when a call ends, and
    whoever waits then would otherwise take it before the agent that ended it asks again.
    """
    behind = _held_for(state, entry)
    if behind is None:
        return None
    return (
        f"held for its fair share: {behind} and maybe other agents with fewer tokens granted "
        "are between calls, and the window keeps room for their next calls"
    )


def _held_for(state: GateState, entry: Waiting) -> str | None:
    """One agent `fair_hold` holds ``entry`` for (the first found), or None."""
    index, shares, tag = state.index, state.shares, entry.tag
    behind = index.behind
    if not behind or behind[0][0] >= tag:
        return None  # nobody between calls comes before it
    limits = index.limits
    rpm, itpm, otpm, cap = (
        limits.requests_per_minute,
        limits.input_tokens_per_minute,
        limits.output_tokens_per_minute,
        limits.max_concurrent,
    )
    if rpm is None and itpm is None and otpm is None and cap is None:
        return None
    requests, inputs, outputs = window_usage(state, state.now)
    room_requests = _NEVER if rpm is None else rpm - requests - 1
    room_inputs = _NEVER if itpm is None else itpm - inputs - entry.input_tokens
    room_outputs = _NEVER if otpm is None else otpm - outputs - entry.output_tokens
    room_slots = _NEVER if cap is None else cap - len(state.leases) - 1
    leases_of, graced_from = index.leases_of, state.now - FAIR_GRACE_MS
    rank = RANK[entry.priority]
    for finish, agent_id in behind:
        if finish >= tag:
            break
        share = shares[agent_id]
        if agent_id not in leases_of:
            released = share.released_at
            if released is None or released <= graced_from:
                continue  # no longer between calls
            if share.rank != rank:
                continue  # (between classes, priority decides)
            room_slots -= 1
        elif share.rank != rank:
            continue
        size = share.input_tokens + share.output_tokens
        calls = -(-(tag - finish) // size) if size > 0 else 1  # (rounded up)
        room_requests -= calls
        room_inputs -= calls * share.input_tokens
        room_outputs -= calls * share.output_tokens
        if room_requests < 0 or room_inputs < 0 or room_outputs < 0 or room_slots < 0:
            return agent_id
    return None


def _exhausted(state: GateState) -> bool:
    """Whether a limit that holds every request alike is used up, so that `blocker` holds
    whichever is next in line: a shortcut for a saturated gate, cheaper than finding that
    request and asking `blocker`."""
    limits = state.index.limits
    rpm = limits.requests_per_minute
    if (
        rpm is not None
        and state.used_requests >= rpm
        and state.window[0].at > state.now - WINDOW_MS  # (then the totals are exact)
    ):
        return True
    cap = limits.max_concurrent
    if cap is not None and len(state.leases) >= cap:
        return True
    breaker = state.breaker
    if breaker is not _CLOSED and (breaker is _OPEN or state.probe is not None):
        return True
    return state.now < state.not_before


def next_in_line(state: GateState) -> Waiting | None:
    """The waiting request granted next: the class whose oldest request arrived first, once
    each class's arrivals are moved earlier by ``rank * priority_aging_ms``; then, within
    that class, the smallest fair tag (then arrival)."""
    index = state.index
    if not index.head_known:
        aging = index.limits.priority_aging_ms
        chosen, first = -1, 0
        for rank in RANKS:  # low to high: on a tie the higher class wins
            arrivals = index.arrivals[rank]
            if arrivals:
                aged = arrivals[0].queued_at - rank * aging
                if chosen < 0 or aged <= first:
                    chosen, first = rank, aged
        index.head = index.fair[chosen][0][2] if chosen >= 0 else None
        index.head_known = True
    return index.head


def backoff_ceiling(limits: GateLimits, attempt: int) -> int:
    """The longest backoff of an ``attempt`` (1, 2, ...): base x 2^(attempt-1), capped."""
    return min(limits.backoff_cap_ms, limits.backoff_base_ms << min(attempt - 1, 40))


def full_jitter(slot_id: str, attempt: int, ceiling: int) -> int:
    """A delay in ``[0, ceiling]``, uniform over slot ids and attempts, and deterministic."""
    digest = hashlib.sha256(f"{slot_id}:{attempt}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") * (ceiling + 1)) >> 64


# ------------------------------------------------------------------------------- evolve


E = TypeVar("E")
_HANDLERS: dict[type[Any], Callable[[GateState, Any], None]] = {}


def _on(
    cls: type[E],
) -> Callable[[Callable[[GateState, E], None]], Callable[[GateState, E], None]]:
    def register(fn: Callable[[GateState, E], None]) -> Callable[[GateState, E], None]:
        _HANDLERS[cls] = fn
        return fn

    return register


def evolve_gate(state: GateState, event: GateEvent) -> GateState:
    """Apply one event to ``state`` in place and return it."""
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise IllegalTransition(f"unknown gate event type {type(event).__name__}")
    handler(state, event)
    state.version += 1
    return state


def fold_gate(state: GateState, events: Iterable[GateEvent]) -> GateState:
    """Evolve ``state`` through many events."""
    for event in events:
        evolve_gate(state, event)
    return state


def _input(state: GateState, event: Any) -> None:
    if event.at > state.now:  # the clock never goes back
        state.now = event.at


for _cls in GATE_INPUT_TYPES:
    _HANDLERS[_cls] = _input


@_on(SlotQueued)
def _queued(state: GateState, event: SlotQueued) -> None:
    slot_id = event.slot_id
    if slot_id in state.waiting or slot_id in state.leases:
        raise IllegalTransition(f"slot {slot_id} is already held")
    state.seq += 1
    # (Conditional expressions rather than `max`, and positional arguments rather than
    # keywords, here and in the other hot paths: each costs several times less to run.)
    agent_id, tokens = event.agent_id, event.input_tokens + event.output_tokens
    share = state.shares.get(agent_id)
    if share is None:
        share = state.shares[agent_id] = Share(state.vtime)
    if share.finish < state.vtime and not _sharing(state, agent_id, share):
        share.finish = state.vtime  # an agent away for a window banks no credit
    start = share.finish
    share.finish = start + (tokens if tokens > 1 else 1)
    _leave_between(state.index, agent_id)  # (it waits)
    entry = state.waiting[slot_id] = Waiting(  # the fields in order
        slot_id,
        event.agent_id,
        event.run_id,
        event.priority,
        event.input_tokens,
        event.output_tokens,
        state.now,
        event.wait_deadline,
        start,
        state.seq,
    )
    _index_waiting(state.index, entry)
    state.counters.queued += 1


def _count(counts: dict[str, int], agent_id: str, step: int) -> None:
    """Move an agent's count by ``step``, keeping only agents with some."""
    n = counts.get(agent_id, 0) + step
    if n:
        counts[agent_id] = n
    else:
        del counts[agent_id]


def _join_between(index: GateIndex, agent_id: str, finish: int) -> None:
    _leave_between(index, agent_id)
    index.between[agent_id] = finish
    insort(index.behind, (finish, agent_id))


def _leave_between(index: GateIndex, agent_id: str) -> None:
    finish = index.between.pop(agent_id, None)
    if finish is not None:
        behind = index.behind
        del behind[bisect_left(behind, (finish, agent_id))]


def _index_waiting(index: GateIndex, entry: Waiting) -> None:
    index.head_known = False
    _count(index.waiting_of, entry.agent_id, 1)
    rank = RANK[entry.priority]
    index.arrivals[rank].append(entry)
    heappush(index.fair[rank], (entry.tag, entry.seq, entry))
    heappush(index.deadlines, (entry.deadline, entry.seq, entry))


def _unwait(state: GateState, slot_id: str) -> Waiting:
    """Remove a waiting request; the index drops it once it reaches a front."""
    waiting, index = state.waiting, state.index
    entry = waiting.pop(slot_id)
    entry.left = True
    index.head_known = False
    agent_id = entry.agent_id
    _count(index.waiting_of, agent_id, -1)
    if agent_id not in index.waiting_of:  # it may be between calls from now on
        _join_between(index, agent_id, state.shares[agent_id].finish)
    rank = RANK[entry.priority]
    arrivals, fair, deadlines = index.arrivals[rank], index.fair[rank], index.deadlines
    if len(arrivals) + len(fair) + len(deadlines) > 6 * len(waiting) + 192:
        # Mostly entries that left: index the live ones again, in arrival order.
        for queue in index.arrivals:
            queue.clear()
        for heap in index.fair:
            heap.clear()
        deadlines.clear()
        index.waiting_of.clear()
        for live in waiting.values():
            _index_waiting(index, live)
        return entry
    while arrivals and arrivals[0].left:
        arrivals.popleft()
    while fair and fair[0][2].left:
        heappop(fair)
    while deadlines and deadlines[0][2].left:
        heappop(deadlines)
    return entry


def _unlease(state: GateState, slot_id: str) -> None:
    """Remove a lease; the index drops it once it reaches the front."""
    leases, heap = state.leases, state.index.leases
    lease = leases.pop(slot_id)
    lease.ended = True
    _count(state.index.leases_of, lease.agent_id, -1)
    if len(heap) > 2 * len(leases) + 64:
        heap[:] = [item for item in heap if not item[2].ended]
        heapify(heap)
    while heap and heap[0][2].ended:
        heappop(heap)


def _prune_window(state: GateState) -> None:
    horizon = state.now - WINDOW_MS
    window = state.window
    while window and window[0].at <= horizon:
        charge = window.popleft()
        del state.charges[charge.slot_id]
        state.used_requests -= 1
        state.used_input -= charge.input_tokens
        state.used_output -= charge.output_tokens


@_on(SlotGranted)
def _granted(state: GateState, event: SlotGranted) -> None:
    cleared, state.index.cleared = state.index.cleared, None
    entry = state.waiting.get(event.slot_id)
    if entry is None:
        raise IllegalTransition(f"slot {event.slot_id} granted but it is not waiting")
    if event.probe != (state.breaker is _HALF_OPEN):
        raise IllegalTransition(
            f"slot {event.slot_id} granted with probe={event.probe} while the breaker is "
            f"{state.breaker.value}"
        )
    why = None if entry is cleared else blocker(state, entry)
    if why is not None:
        raise IllegalTransition(f"slot {event.slot_id} granted while {why}")
    _unwait(state, event.slot_id)
    _prune_window(state)
    charge = Charge(event.slot_id, state.now, entry.input_tokens, entry.output_tokens)
    state.window.append(charge)
    state.charges[event.slot_id] = charge
    state.used_requests += 1
    state.used_input += entry.input_tokens
    state.used_output += entry.output_tokens
    lease = state.leases[event.slot_id] = Lease(  # the fields in order
        entry.slot_id,
        entry.agent_id,
        entry.run_id,
        entry.priority,
        entry.input_tokens,
        entry.output_tokens,
        state.now,
        event.lease_deadline,
    )
    heappush(state.index.leases, (lease.deadline, entry.seq, lease))
    _count(state.index.leases_of, entry.agent_id, 1)
    share = state.shares[entry.agent_id]
    share.granted_at = state.now
    share.input_tokens, share.output_tokens = entry.input_tokens, entry.output_tokens
    share.rank = RANK[entry.priority]
    behind = state.index.behind
    while behind and not _between_calls(state, behind[0][1]):  # (time has ended it)
        _leave_between(state.index, behind[0][1])
    if entry.tag > state.vtime:
        state.vtime = entry.tag
    if event.probe:
        state.probe = event.slot_id
    hint = state.hint
    if hint is not None and state.now < hint.reset_at:
        hint.requests_since += 1
        hint.tokens_since += entry.tokens
    state.counters.granted += 1


@_on(SlotRefused)
def _refused(state: GateState, event: SlotRefused) -> None:
    # A request refused on arrival was never waiting: nothing to remove.
    if event.slot_id in state.leases:
        raise IllegalTransition(f"slot {event.slot_id} refused but it is granted")
    if event.slot_id in state.waiting:
        _unwait(state, event.slot_id)
    state.counters.refused += 1


@_on(SlotFreed)
def _freed(state: GateState, event: SlotFreed) -> None:
    slot_id = event.slot_id
    lease = state.leases.get(slot_id)
    if lease is None and (event.by is _LEASE_EXPIRED or slot_id not in state.waiting):
        raise IllegalTransition(f"slot {slot_id} freed ({event.by.value}) but it is not held")
    counters = state.counters
    if event.by is _RELEASED:
        counters.released += 1
    elif event.by is _CANCELLED:
        counters.cancelled += 1
    else:
        counters.expired += 1
    if lease is None:
        _unwait(state, slot_id)
        return
    _unlease(state, slot_id)
    if event.by is _RELEASED:
        state.shares[lease.agent_id].released_at = state.now
        graced = state.index.graced
        while graced and graced[0][0] < state.now:
            graced.popleft()
        graced.append((state.now + FAIR_GRACE_MS, lease.agent_id))
    if state.probe == slot_id:
        state.probe = None
    charge = state.charges.get(slot_id)
    if charge is not None:
        if event.input_tokens is not None:
            state.used_input += event.input_tokens - charge.input_tokens
            charge.input_tokens = event.input_tokens
        if event.output_tokens is not None:
            state.used_output += event.output_tokens - charge.output_tokens
            charge.output_tokens = event.output_tokens
    counters.input_tokens += event.input_tokens or 0
    counters.output_tokens += event.output_tokens or 0
    outcome = event.outcome
    if outcome is None:
        return
    if state.runs or outcome is not _OK:  # (else there is nothing to count or forget)
        _count_attempt(state, lease.run_id, outcome)
    if outcome is _OK:
        state.attempt = 0
    if state.breaker is _CLOSED:
        if outcome is _OK:
            state.failures = 0
        elif outcome in UNHEALTHY:
            state.failures += 1


def _count_attempt(state: GateState, run_id: str, outcome: CallOutcome) -> None:
    runs = state.runs
    previous = runs.pop(run_id, None)  # re-inserted last: the memory stays in time order
    if outcome in RETRYABLE or outcome is _SPEND_LIMIT:
        failures = 1 if previous is None else previous.failures + 1
        runs[run_id] = RunAttempts(failures, state.now, outcome)
    horizon = state.now - RUN_MEMORY_MS
    while runs:
        oldest = next(iter(runs))
        if runs[oldest].at > horizon:
            break
        del runs[oldest]


@_on(SlotReleaseIgnored)
def _release_ignored(state: GateState, event: SlotReleaseIgnored) -> None:
    state.counters.ignored += 1


@_on(BackoffScheduled)
def _backoff(state: GateState, event: BackoffScheduled) -> None:
    state.not_before = max(state.not_before, event.until)
    state.attempt = event.attempt
    state.counters.backoffs += 1


@_on(ProviderHintsNoted)
def _hints(state: GateState, event: ProviderHintsNoted) -> None:
    state.hint = Hint(
        remaining_requests=event.remaining_requests,
        remaining_tokens=event.remaining_tokens,
        reset_at=event.reset_at,
        observed_at=state.now,
    )


@_on(BreakerOpened)
def _opened(state: GateState, event: BreakerOpened) -> None:
    if state.breaker is _OPEN:
        raise IllegalTransition("breaker opened while it is open")
    if state.probe is not None:
        raise IllegalTransition(f"breaker opened while probe {state.probe} is in flight")
    state.breaker = _OPEN
    state.breaker_until = event.until
    state.failures = 0
    state.counters.breaker_opens += 1


@_on(BreakerHalfOpened)
def _half_opened(state: GateState, event: BreakerHalfOpened) -> None:
    if state.breaker is not _OPEN or state.now < state.breaker_until:
        raise IllegalTransition(
            f"breaker half-opened while {state.breaker.value} until {state.breaker_until}"
        )
    state.breaker = _HALF_OPEN


@_on(BreakerClosed)
def _closed(state: GateState, event: BreakerClosed) -> None:
    if state.breaker is not _HALF_OPEN or state.probe is not None:
        raise IllegalTransition(f"breaker closed while {state.breaker.value}")
    state.breaker = _CLOSED
    state.failures = 0


@_on(SpendLimitReached)
def _spend_limit(state: GateState, event: SpendLimitReached) -> None:
    state.counters.spend_limits += 1


@_on(GateLimitsApplied)
def _limits(state: GateState, event: GateLimitsApplied) -> None:
    state.limits = event.limits
    state.index.limits = HotLimits.of(event.limits)
    state.index.head_known = False  # the aging may have changed


# ------------------------------------------------------------------------------- decide


Emit = Callable[[GateDecision], None]
In = TypeVar("In")
_DECIDERS: dict[type[Any], Callable[[GateState, Any, Emit], None]] = {}


def _decides(cls: type[In]) -> Callable[[Callable[[GateState, In, Emit], None]], Any]:
    def register(fn: Callable[[GateState, In, Emit], None]) -> Any:
        _DECIDERS[cls] = fn
        return fn

    return register


def decide_gate(state: GateState, event: GateInput) -> list[GateDecision]:
    """Decide what ``event`` means for the gate, advancing ``state`` through the input and
    each decision as it is made (afterwards ``state`` is the fold of [input, *decisions]).

    Deterministic; an input that decides nothing leaves ``state`` exactly as it was.
    """
    decider = _DECIDERS[type(event)]
    now, version = state.now, state.version
    if event.at > state.now:  # `evolve_gate(state, event)` inlined: see `_input`
        state.now = event.at
    state.version += 1
    decisions: list[GateDecision] = []

    def emit(decision: GateDecision) -> None:
        _HANDLERS[type(decision)](state, decision)  # `evolve_gate`, inlined: a hot path
        state.version += 1
        decisions.append(decision)

    decider(state, event, emit)
    _settle(state, emit)
    if not decisions:
        state.now, state.version = now, version
    return decisions


_NEVER = 1 << 63
"""Later than any time (ms since the epoch)."""


def next_gate_due(state: GateState, after: int) -> int | None:
    """The earliest time later than ``after`` at which a `GateTimer` may decide something:
    a lease or a wait bound ends, the breaker's cooldown ends, or, while requests wait, a
    backoff or provider reset ends, or a window frees space."""
    # The fronts of the index and of the window are their earliest times; only if one is
    # not later than ``after`` (a caller ahead of the state's clock) is the rest looked at.
    index = state.index
    due = index.leases[0][0] if index.leases else _NEVER
    if due <= after:
        due = _earliest_after(state.leases.values(), after)
    if state.breaker is _OPEN and after < state.breaker_until < due:
        due = state.breaker_until
    if not state.waiting:
        return None if due == _NEVER else due
    if after < state.not_before < due:
        due = state.not_before
    hint = state.hint
    if hint is not None and after < hint.reset_at < due:
        due = hint.reset_at
    floor = after if after >= state.now else state.now - 1  # (graces that ended are gone)
    waiting_of, leases_of = index.waiting_of, index.leases_of
    for until, agent_id in index.graced:  # in time order: the first that matters is due
        if until >= due:
            break
        if (
            until > floor
            and state.shares[agent_id].released_at == until - FAIR_GRACE_MS
            and agent_id not in waiting_of  # (else its grace ends
            and agent_id not in leases_of  # without changing anything)
        ):
            due = until
            break
    window = state.window
    if window:
        frees = window[0].at + WINDOW_MS
        if frees <= after:  # the first grant (oldest first) to leave after ``after``
            frees = next((c.at + WINDOW_MS for c in window if c.at + WINDOW_MS > after), _NEVER)
        if frees < due:
            due = frees
    bound = index.deadlines[0][0]
    if bound <= after:
        bound = _earliest_after(state.waiting.values(), after)
    if bound < due:
        due = bound
    return None if due == _NEVER else due


def _earliest_after(entries: Iterable[Waiting | Lease], after: int) -> int:
    """The earliest deadline later than ``after`` among ``entries``, or `_NEVER`."""
    return min([e.deadline for e in entries if e.deadline > after], default=_NEVER)


def _settle(state: GateState, emit: Emit) -> None:
    """What time alone decides, after every input: leases expire, the breaker half-opens,
    overdue requests are refused, and whatever fits is granted in the fair order."""
    now = state.now
    leases = state.index.leases
    if leases and leases[0][0] <= now:  # the front is the earliest deadline
        _expire_leases(state, now, emit)
    if state.breaker is _OPEN and now >= state.breaker_until:
        emit(BreakerHalfOpened())
    deadlines = state.index.deadlines
    if deadlines and deadlines[0][0] < now:  # the front is the earliest wait bound
        _refuse_overdue(state, now, emit)
    _grant(state, now, emit)
    if deadlines and deadlines[0][0] <= now:
        _refuse_overdue(state, now + 1, emit)  # those the grants left at their bound...
        _grant(state, now, emit)  # ...may have held back some that fit


def _grant(state: GateState, now: int, emit: Emit) -> None:
    """Grant whatever fits, in the fair order, until the next in line does not."""
    while state.waiting and not _exhausted(state):
        entry = next_in_line(state)
        assert entry is not None
        if blocker(state, entry) is not None or _held_for(state, entry) is not None:
            break
        state.index.cleared = entry  # nothing changes before `_granted` applies it
        emit(
            SlotGranted(
                slot_id=entry.slot_id,
                lease_deadline=now + state.index.limits.lease_ms,
                probe=state.breaker is _HALF_OPEN,
            )
        )


def _expire_leases(state: GateState, now: int, emit: Emit) -> None:
    """Free the leases that ended at ``now`` or earlier, in the order they were granted."""
    for lease in [lease for lease in state.leases.values() if lease.deadline <= now]:
        emit(
            SlotFreed(
                slot_id=lease.slot_id,
                by=_LEASE_EXPIRED,
                detail=f"lease ended at {lease.deadline} without a release (granted at "
                f"{lease.granted_at} to run {lease.run_id} of {lease.agent_id})",
            )
        )


def _refuse(state: GateState, entry: Waiting, code: Refusal, reason: str, emit: Emit) -> None:
    emit(
        SlotRefused(
            slot_id=entry.slot_id,
            agent_id=entry.agent_id,
            run_id=entry.run_id,
            code=code,
            reason=reason,
        )
    )


def _refuse_overdue(state: GateState, before: int, emit: Emit) -> None:
    """Refuse the requests whose wait bound is earlier than ``before``."""
    overdue = [entry for entry in state.waiting.values() if entry.deadline < before]
    head = next_in_line(state)
    for entry in overdue:
        held = blocker(state, entry)
        if held is None:
            held = fair_hold(state, entry)
        if head is not None and entry is not head:
            ahead = blocker(state, head) or fair_hold(state, head) or held or "no capacity"
            held = f"{ahead}, and requests ahead of it in the fair order"
        _refuse(
            state,
            entry,
            Refusal.WAITED_TOO_LONG,
            f"waited {state.now - entry.queued_at} ms without a slot (max_wait_ms "
            f"{entry.deadline - entry.queued_at}): {held}; retry later",
            emit,
        )


def _hopeless(state: GateState, deadline: int) -> tuple[Refusal, str] | None:
    """Why a request waiting until ``deadline`` certainly cannot be granted in time."""
    if state.breaker is _OPEN and state.breaker_until > deadline:
        return Refusal.BREAKER_OPEN, (
            f"the circuit breaker is open until {state.breaker_until}, past this request's "
            f"wait bound {deadline}: the provider is failing"
        )
    if state.not_before > deadline:
        return Refusal.BACKING_OFF, (
            f"backing off until {state.not_before} (attempt {state.attempt}), past this "
            f"request's wait bound {deadline}"
        )
    return None


def _too_large(
    limits: GateLimits | HotLimits, input_tokens: int, output_tokens: int
) -> str | None:
    itpm, otpm = limits.input_tokens_per_minute, limits.output_tokens_per_minute
    if itpm is not None and input_tokens > itpm:
        return (
            f"asks for {input_tokens} input tokens but input_tokens_per_minute is {itpm}: it "
            "can never be granted; shorten the prompt or raise the limit"
        )
    if otpm is not None and output_tokens > otpm:
        return (
            f"asks for {output_tokens} output tokens but output_tokens_per_minute is {otpm}: "
            "it can never be granted; lower max_tokens or raise the limit"
        )
    return None


def _refuse_hopeless(state: GateState, emit: Emit) -> None:
    deadlines = state.index.deadlines
    if not deadlines or _hopeless(state, deadlines[0][0]) is None:
        return  # if the earliest wait bound can be met, every later one can
    for entry in list(state.waiting.values()):
        hopeless = _hopeless(state, entry.deadline)
        if hopeless is not None:
            _refuse(state, entry, *hopeless, emit)


@_decides(SlotRequested)
def _requested(state: GateState, event: SlotRequested, emit: Emit) -> None:
    slot_id = event.slot_id
    if slot_id in state.waiting or slot_id in state.leases:
        return  # a redelivered request: it already waits or holds its slot
    refused: tuple[Refusal, str] | None = None
    limits = state.index.limits
    deadline = state.now + limits.max_wait_ms
    too_large = _too_large(limits, event.input_tokens, event.output_tokens)
    attempts = state.runs.get(event.run_id)
    if too_large is not None:
        refused = Refusal.TOO_LARGE, too_large
    elif attempts is not None and attempts.last is _SPEND_LIMIT:
        refused = (
            Refusal.SPEND_LIMIT,
            (f"run {event.run_id} hit the provider's spend limit: it is not retried"),
        )
    elif attempts is not None and attempts.failures >= limits.max_attempts:
        refused = (
            Refusal.RETRIES_EXHAUSTED,
            (
                f"run {event.run_id} failed {attempts.failures} calls in a row (last: "
                f"{attempts.last.value}); max_attempts is {limits.max_attempts}: giving up"
            ),
        )
    else:
        refused = _hopeless(state, deadline)
    if refused is not None:
        emit(
            SlotRefused(
                slot_id=slot_id,
                agent_id=event.agent_id,
                run_id=event.run_id,
                code=refused[0],
                reason=refused[1],
            )
        )
        return
    emit(
        SlotQueued(
            slot_id=slot_id,
            agent_id=event.agent_id,
            run_id=event.run_id,
            priority=event.priority,
            input_tokens=event.input_tokens,
            output_tokens=event.output_tokens,
            wait_deadline=deadline,
        )
    )


@_decides(SlotReleased)
def _released(state: GateState, event: SlotReleased, emit: Emit) -> None:
    slot_id = event.slot_id
    lease = state.leases.get(slot_id)
    if lease is None:
        if slot_id in state.waiting:
            emit(SlotFreed(slot_id=slot_id, by=_RELEASED, detail="released while waiting"))
        else:
            emit(
                SlotReleaseIgnored(
                    slot_id=slot_id,
                    reason=f"slot {slot_id} is not held: its lease expired, it was cancelled "
                    "or it was released already",
                )
            )
        return
    now, limits, outcome = state.now, state.limits, event.outcome
    was_probe = state.probe == slot_id
    emit(
        SlotFreed(
            slot_id=slot_id,
            by=_RELEASED,
            detail=f"released after {now - lease.granted_at} ms: {outcome}",  # (its value)
            outcome=outcome,
            input_tokens=event.input_tokens,
            output_tokens=event.output_tokens,
        )
    )
    if event.remaining_requests is not None or event.remaining_tokens is not None:
        reset_at = now + WINDOW_MS if event.reset_at is None else event.reset_at
        if reset_at > now:
            emit(
                ProviderHintsNoted(
                    remaining_requests=event.remaining_requests,
                    remaining_tokens=event.remaining_tokens,
                    reset_at=reset_at,
                )
            )
    if outcome is _SPEND_LIMIT:
        emit(SpendLimitReached(agent_id=lease.agent_id, run_id=lease.run_id))
        for entry in [e for e in state.waiting.values() if e.run_id == lease.run_id]:
            _refuse(state, entry, Refusal.SPEND_LIMIT, "the run hit the spend limit", emit)
    if was_probe:
        if outcome in UNHEALTHY:
            emit(
                BreakerOpened(
                    until=now + limits.breaker_cooldown_ms,
                    reason=f"the half-open probe failed: {outcome.value}",
                )
            )
        else:
            emit(BreakerClosed())
    elif state.breaker is _CLOSED and state.failures >= state.index.limits.breaker_threshold:
        emit(
            BreakerOpened(
                until=now + limits.breaker_cooldown_ms,
                reason=f"{state.failures} unhealthy answers in a row (last: {outcome.value})",
            )
        )
    if outcome in THROTTLED:
        attempt = state.attempt + 1
        ceiling = backoff_ceiling(limits, attempt)
        wait = full_jitter(slot_id, attempt, ceiling)
        reason = f"{outcome.value}: attempt {attempt}, full jitter up to {ceiling} ms"
        retry_after = event.retry_after_ms
        if retry_after is not None:
            wait = max(wait, retry_after)
            reason += f", retry-after {retry_after} ms"
        emit(
            BackoffScheduled(
                until=max(state.not_before, now + wait), attempt=attempt, reason=reason
            )
        )
    _refuse_hopeless(state, emit)


@_decides(SlotCancelled)
def _cancelled(state: GateState, event: SlotCancelled, emit: Emit) -> None:
    slot_id = event.slot_id
    if slot_id in state.waiting:
        detail = "cancelled while waiting"
    elif slot_id in state.leases:
        detail = "cancelled while granted: the run was aborted or crashed"
    else:
        return  # cancelling what is not held is a no-op (a cancel after a release, say)
    emit(SlotFreed(slot_id=slot_id, by=_CANCELLED, detail=detail))


@_decides(GateTimer)
def _timer(state: GateState, event: GateTimer, emit: Emit) -> None:
    """Everything a timer decides is what time alone decides (see `_settle`)."""


@_decides(GateLimitsChanged)
def _limits_changed(state: GateState, event: GateLimitsChanged, emit: Emit) -> None:
    # The first event of a stream is its first limits: record them even if they are default.
    if event.limits == state.limits and state.version != 1:
        return
    emit(GateLimitsApplied(limits=event.limits))
    for entry in list(state.waiting.values()):
        too_large = _too_large(event.limits, entry.input_tokens, entry.output_tokens)
        if too_large is not None:
            _refuse(state, entry, Refusal.TOO_LARGE, too_large, emit)


# ------------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class WaitingAgent:
    """One agent's requests waiting at the gate."""

    agent_id: str
    waiting: int
    oldest_wait_ms: int
    tokens: int


@dataclass(frozen=True, slots=True)
class GateStatus:
    """What an operator wants to know about a provider gate, at time ``now``."""

    provider: str
    limits: GateLimits
    window_requests: int
    window_input_tokens: int
    window_output_tokens: int
    in_flight: int
    waiting: int
    waiting_agents: tuple[WaitingAgent, ...]
    breaker: Breaker
    breaker_until: int | None
    probe_in_flight: bool
    next_retry: int | None
    """When a running backoff ends (None if none runs at ``now``)."""
    backoff_attempt: int
    remaining_requests: int | None
    remaining_tokens: int | None
    provider_reset_at: int | None
    counters: GateCounters


def gate_status(state: GateState, now: int) -> GateStatus:
    """Observability derived from the state alone."""
    requests, inputs, outputs = window_usage(state, now)
    agents: dict[str, list[Waiting]] = {}
    for entry in state.waiting.values():
        agents.setdefault(entry.agent_id, []).append(entry)
    hint = state.hint
    live_hint = hint is not None and now < hint.reset_at
    return GateStatus(
        provider=state.provider,
        limits=state.limits,
        window_requests=requests,
        window_input_tokens=inputs,
        window_output_tokens=outputs,
        in_flight=len(state.leases),
        waiting=len(state.waiting),
        waiting_agents=tuple(
            WaitingAgent(
                agent_id=agent_id,
                waiting=len(entries),
                oldest_wait_ms=max(0, now - min(e.queued_at for e in entries)),
                tokens=sum(e.tokens for e in entries),
            )
            for agent_id, entries in sorted(agents.items())
        ),
        breaker=state.breaker,
        breaker_until=state.breaker_until if state.breaker is Breaker.OPEN else None,
        probe_in_flight=state.probe is not None,
        next_retry=state.not_before if state.not_before > now else None,
        backoff_attempt=state.attempt,
        remaining_requests=(
            None
            if hint is None or not live_hint or hint.remaining_requests is None
            else max(0, hint.remaining_requests - hint.requests_since)
        ),
        remaining_tokens=(
            None
            if hint is None or not live_hint or hint.remaining_tokens is None
            else max(0, hint.remaining_tokens - hint.tokens_since)
        ),
        provider_reset_at=hint.reset_at if hint is not None and live_hint else None,
        counters=replace(state.counters),
    )


# ------------------------------------------------------------------------ codec, verify


GATE_CODEC: Codec[GateEvent] = Codec(GATE_INPUT_TYPES + GATE_DECISION_TYPES)
GATE_EVENT_TYPES = GATE_CODEC.types
encode_gate_event = GATE_CODEC.encode
decode_gate_event = GATE_CODEC.decode


@dataclass(frozen=True, slots=True)
class GateDivergence:
    """The first place where re-deciding a gate's recorded inputs disagrees with its log."""

    index: int
    """Index of the event in the stream (0-based)."""
    input: GateEvent | None
    recorded: GateEvent | None
    redecided: GateDecision | None


def verify_gate(provider: str, events: Iterable[GateEvent]) -> GateDivergence | None:
    """Re-run `decide_gate` over a gate stream's recorded inputs; the first disagreement."""
    state = GateState(provider=provider)
    expected: deque[GateDecision] = deque()
    last_input: GateEvent | None = None
    index = -1
    for index, event in enumerate(events):
        if isinstance(event, GATE_INPUT_TYPES):
            if expected:
                return GateDivergence(index, last_input, event, expected[0])
            last_input = event
            expected.extend(decide_gate(state, event))
            continue
        redecided = expected.popleft() if expected else None
        if redecided != event:
            return GateDivergence(index, last_input, event, redecided)
    if expected:
        return GateDivergence(index + 1, last_input, None, expected[0])
    return None
