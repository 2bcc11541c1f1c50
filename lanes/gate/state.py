"""The provider gate's state, what is derived from it (the fair order, what holds the head
of the line) and its status as an operator sees it."""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field, replace
from heapq import heappush

from lanes.gate.events import WINDOW_MS, CallOutcome, GateLimits
from lanes.gate.tables import CLOSED, OPEN, Breaker
from lanes.requests import RANK, Priority

RUN_MEMORY_MS = 3_600_000
"""How long the gate remembers a run's failed attempts after its last one."""
FAIR_GRACE_MS = 1_000
"""How long after a release an agent keeps its next call reserved (see `fair_hold`)."""
NEVER = 1 << 63
"""Later than any time (ms since the epoch)."""
HOLD_MARGIN = 4
"""How far short of room `_held_rpm` counts a fair hold before it stops (if it may): the
hold it keeps lasts until that many grants have left the window."""


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
    held: Waiting | None = None
    """A request the fair hold held under the RPM alone (`_held_rpm`), which stays held
    while ``held_until`` is later than the clock and no agent at or before ``held_key`` in
    `behind` has left it (so that `fits` need not walk `behind` again)."""
    held_until: int = 0
    """The earliest time the hold may end by itself: a grant leaves the window, or the
    grace of an agent it counted ends."""
    held_key: tuple[int, str] = (0, "")
    """The (finish tag, agent id) in `behind` where the hold was found."""

    @classmethod
    def of(cls, state: GateState) -> GateIndex:
        """The index of ``state``."""
        index = cls(HotLimits.of(state.limits))
        for entry in sorted(state.waiting.values(), key=lambda entry: entry.seq):
            index_waiting(index, entry)
        for n, lease in enumerate(state.leases.values(), 1):  # -n: apart from any seq
            heappush(index.leases, (lease.deadline, -n, lease))
            count_in(index.leases_of, lease.agent_id, 1)
        released = [
            (share.released_at + FAIR_GRACE_MS, agent_id)
            for agent_id, share in state.shares.items()
            if share.released_at is not None and share.released_at + FAIR_GRACE_MS >= state.now
        ]
        index.graced.extend(sorted(released))
        for agent_id, share in state.shares.items():
            if _between_calls_of(index, share, state.now, agent_id):
                join_between(index, agent_id, share.finish)
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


def count_in(counts: dict[str, int], agent_id: str, step: int) -> None:
    """Move an agent's count by ``step``, keeping only agents with some."""
    n = counts.get(agent_id, 0) + step
    if n:
        counts[agent_id] = n
    else:
        del counts[agent_id]


def join_between(index: GateIndex, agent_id: str, finish: int) -> None:
    """Count an agent as between calls, behind ``finish`` in the fair order."""
    if agent_id in index.between:
        leave_between(index, agent_id)
    index.between[agent_id] = finish
    insort(index.behind, (finish, agent_id))


def leave_between(index: GateIndex, agent_id: str) -> None:
    """Count an agent as no longer between calls."""
    finish = index.between.pop(agent_id, None)
    if finish is not None:
        behind, key = index.behind, (finish, agent_id)
        del behind[bisect_left(behind, key)]
        if index.held is not None and key <= index.held_key:
            index.held = None  # one it counted left: the hold may end


def index_waiting(index: GateIndex, entry: Waiting) -> None:
    """Index a request that now waits."""
    index.head_known = False
    waiting_of, agent_id = index.waiting_of, entry.agent_id
    waiting_of[agent_id] = waiting_of.get(agent_id, 0) + 1  # (`count_in`, inlined)
    rank = RANK[entry.priority]
    index.arrivals[rank].append(entry)
    heappush(index.fair[rank], (entry.tag, entry.seq, entry))
    heappush(index.deadlines, (entry.deadline, entry.seq, entry))


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
    found = blocking(state, entry)
    return None if found is None else found[1]


def blocking(state: GateState, entry: Waiting) -> tuple[str, str] | None:
    """`blocker` with the limit that holds ``entry``: ``breaker``, ``backoff``,
    ``concurrency``, ``provider`` (its rate-limit headers), ``rpm``, ``itpm`` or ``otpm``."""
    now, limits, breaker = state.now, state.index.limits, state.breaker
    if breaker is not CLOSED:
        if breaker is OPEN:
            return "breaker", f"the circuit breaker is open until {state.breaker_until}"
        if state.probe is not None:
            return "breaker", "the circuit breaker is half-open and its probe call is in flight"
    if now < state.not_before:
        return "backoff", f"backing off until {state.not_before} (attempt {state.attempt})"
    cap = limits.max_concurrent
    if cap is not None and len(state.leases) >= cap:
        return "concurrency", f"max_concurrent: {cap} calls in flight"
    hint = state.hint
    if hint is not None and now < hint.reset_at:
        if hint.remaining_requests is not None and hint.requests_since >= hint.remaining_requests:
            return "provider", f"the provider reports no requests left until {hint.reset_at}"
        if (
            hint.remaining_tokens is not None
            and hint.tokens_since + entry.tokens > hint.remaining_tokens
        ):
            return "provider", f"the provider reports too few tokens left until {hint.reset_at}"
    window = state.window
    if window and window[0].at <= now - WINDOW_MS:  # some grants have left the window
        requests, inputs, outputs = window_usage(state, now)
    else:
        requests, inputs, outputs = state.used_requests, state.used_input, state.used_output
    rpm = limits.requests_per_minute
    if rpm is not None and requests + 1 > rpm:
        return "rpm", f"requests_per_minute: {rpm} granted in the last 60 s"
    itpm = limits.input_tokens_per_minute
    if itpm is not None and inputs + entry.input_tokens > itpm:
        return "itpm", f"input_tokens_per_minute: {inputs} of {itpm} used in the last 60 s"
    otpm = limits.output_tokens_per_minute
    if otpm is not None and outputs + entry.output_tokens > otpm:
        return "otpm", f"output_tokens_per_minute: {outputs} of {otpm} used in the last 60 s"
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


def fair_hold(state: GateState, entry: Waiting, named: bool = False) -> str | None:
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
    if not named:  # (said to whoever may see this agent: other agents go unnamed)
        return (
            "held for its fair share: agents with fewer tokens granted are between calls, "
            "and the window keeps room for their next calls"
        )
    return (
        f"held for its fair share: {behind} and maybe other agents with fewer tokens granted "
        "are between calls, and the window keeps room for their next calls"
    )


_NAMED_HOLD = re.compile(
    r"held for its fair share: [A-Za-z0-9_.\-]+ and maybe other agents with fewer tokens")


def unnamed(reason: str) -> str:
    """A refusal's reason without the agent a fair hold named (`fair_hold` with ``named``):
    as the refused agent is told it, whose log a token scoped to it reads."""
    return _NAMED_HOLD.sub("held for its fair share: agents with fewer tokens", reason)


def _held_for(state: GateState, entry: Waiting) -> str | None:
    """One agent `fair_hold` holds ``entry`` for (the first found), or None."""
    behind = state.index.behind
    if not behind or behind[0][0] >= entry.tag:
        return None  # nobody between calls comes before it
    requests, inputs, outputs = window_usage(state, state.now)
    return _hold(state, entry, requests, inputs, outputs)


def _hold(state: GateState, entry: Waiting, requests: int, inputs: int, outputs: int,
          ) -> str | None:
    """`_held_for`, given the window's usage at ``state.now``."""
    index, shares, tag = state.index, state.shares, entry.tag
    limits = index.limits
    rpm, itpm, otpm, cap = (
        limits.requests_per_minute,
        limits.input_tokens_per_minute,
        limits.output_tokens_per_minute,
        limits.max_concurrent,
    )
    if rpm is None and itpm is None and otpm is None and cap is None:
        return None
    room_requests = NEVER if rpm is None else rpm - requests - 1
    room_inputs = NEVER if itpm is None else itpm - inputs - entry.input_tokens
    room_outputs = NEVER if otpm is None else otpm - outputs - entry.output_tokens
    room_slots = NEVER if cap is None else cap - len(state.leases) - 1
    leases_of, graced_from = index.leases_of, state.now - FAIR_GRACE_MS
    rank = RANK[entry.priority]
    for finish, agent_id in index.behind:
        if finish >= tag:
            break
        share = shares[agent_id]
        if share.rank != rank:
            continue  # (between classes, priority decides)
        if agent_id not in leases_of:
            released = share.released_at
            if released is None or released <= graced_from:
                continue  # no longer between calls
            room_slots -= 1
        size = share.input_tokens + share.output_tokens
        calls = -(-(tag - finish) // size) if size > 0 else 1  # (rounded up)
        room_requests -= calls
        room_inputs -= calls * share.input_tokens
        room_outputs -= calls * share.output_tokens
        if room_requests < 0 or room_inputs < 0 or room_outputs < 0 or room_slots < 0:
            return agent_id
    return None


def _held_rpm(state: GateState, entry: Waiting, rpm: int, requests: int) -> bool:
    """Whether the fair hold holds ``entry`` (`_hold`) on a gate whose only limit is the
    RPM: the same walk, counting requests alone (the other rooms are endless), and what
    it found kept in the index (`GateIndex.held`) for as long as it certainly holds."""
    index, now = state.index, state.now
    if index.held is entry and now < index.held_until:
        return True
    shares, tag, leases_of = state.shares, entry.tag, index.leases_of
    graced_from, rank = now - FAIR_GRACE_MS, RANK[entry.priority]
    room, until, key = rpm - requests - 1, NEVER, None
    for finish, agent_id in index.behind:
        if finish >= tag:
            break
        share = shares[agent_id]
        if share.rank != rank:
            continue
        if agent_id not in leases_of:
            released = share.released_at
            if released is None or released <= graced_from:
                continue
            if released + FAIR_GRACE_MS < until:
                until = released + FAIR_GRACE_MS  # (when its grace ends, it counts no more)
        size = share.input_tokens + share.output_tokens
        room -= -(-(tag - finish) // size) if size > 0 else 1  # calls, rounded up
        if room < 0:
            key = finish, agent_id
            if room <= -HOLD_MARGIN:
                break  # (held: counting on makes the hold last longer, see below)
    if key is None:
        return False
    # Held until as many grants counted now leave the window as the room is short (it
    # grows by one each), a grace counted ends, or an agent counted leaves `behind`
    # (`leave_between`) or its lease (`GateIndex.held` is updated there): nothing else
    # makes the room larger or what the agents up to ``key`` need smaller.
    horizon, short = now - WINDOW_MS, -room
    for charge in state.window:
        if charge.at > horizon:
            short -= 1
            if short == 0:
                if charge.at + WINDOW_MS < until:
                    until = charge.at + WINDOW_MS
                break
    index.held, index.held_until, index.held_key = entry, until, key
    return True


def fits(state: GateState, entry: Waiting) -> bool:
    """Whether ``entry`` can be granted now: neither `blocking` nor `fair_hold` holds it.
    The grant path's one pass over the limits, building no reason."""
    now, limits, breaker = state.now, state.index.limits, state.breaker
    if breaker is not CLOSED and (breaker is OPEN or state.probe is not None):
        return False
    if now < state.not_before:
        return False
    cap = limits.max_concurrent
    if cap is not None and len(state.leases) >= cap:
        return False
    hint = state.hint
    if hint is not None and now < hint.reset_at:
        if hint.remaining_requests is not None and hint.requests_since >= hint.remaining_requests:
            return False
        if (
            hint.remaining_tokens is not None
            and hint.tokens_since + entry.input_tokens + entry.output_tokens
            > hint.remaining_tokens
        ):
            return False
    window = state.window
    if window and window[0].at <= now - WINDOW_MS:  # some grants have left the window
        requests, inputs, outputs = window_usage(state, now)
    else:
        requests, inputs, outputs = state.used_requests, state.used_input, state.used_output
    rpm = limits.requests_per_minute
    if rpm is not None and requests + 1 > rpm:
        return False
    itpm = limits.input_tokens_per_minute
    if itpm is not None and inputs + entry.input_tokens > itpm:
        return False
    otpm = limits.output_tokens_per_minute
    if otpm is not None and outputs + entry.output_tokens > otpm:
        return False
    behind = state.index.behind
    if not behind or behind[0][0] >= entry.tag:
        return True  # nobody between calls comes before it
    if rpm is not None and itpm is None and otpm is None and cap is None:
        return not _held_rpm(state, entry, rpm, requests)
    return _hold(state, entry, requests, inputs, outputs) is None


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
    if breaker is not CLOSED and (breaker is OPEN or state.probe is not None):
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


@dataclass(frozen=True, slots=True)
class GateWait:
    """Why an agent's calls wait at a provider gate, at some time ``now``."""

    agent_id: str
    limit: str
    """What holds them: a limit named by `blocking` (``rpm``, ``itpm``, ``otpm``,
    ``concurrency``, ``breaker``, ``backoff``, ``provider``); ``fair`` (room is kept for
    agents with fewer tokens granted, `fair_hold`); ``queue`` (nothing holds the request
    next in line: it is granted at the gate's next decision)."""
    detail: str
    first: bool
    """Whether one of its requests is next in line (else another agent's goes first)."""
    waiting: int
    since: int
    """When its longest-waiting request arrived."""
    next_slot_at: int | None
    """The earliest time the limit may let a call through, where the gate can know it (not
    for ``concurrency``, a slot coming back when a call ends, nor ``fair``)."""


def gate_waits(state: GateState, now: int) -> dict[str, GateWait]:
    """Agent id -> why its calls wait, for every agent with a request waiting at the gate.
    They all wait behind the request next in line: what holds that one holds them. A
    detail names no other agent (it is shown to whoever may see the waiting agent, whose
    scope may leave the others out)."""
    head = next_in_line(state)
    if head is None:
        return {}
    found = blocking(state, head)
    if found is None:
        held = fair_hold(state, head)
        found = ("queue", "granted at the gate's next decision") if held is None \
            else ("fair", held)
    limit, detail = found
    next_slot = _frees_at(state, limit, head, now)
    oldest: dict[str, int] = {}
    counts: dict[str, int] = {}
    for entry in state.waiting.values():
        agent_id = entry.agent_id
        counts[agent_id] = counts.get(agent_id, 0) + 1
        if agent_id not in oldest or entry.queued_at < oldest[agent_id]:
            oldest[agent_id] = entry.queued_at
    return {
        agent_id: GateWait(
            agent_id=agent_id,
            limit=limit,
            detail=detail if agent_id == head.agent_id
            else f"behind another agent's request: {detail}",
            first=agent_id == head.agent_id,
            waiting=counts[agent_id],
            since=since,
            next_slot_at=next_slot,
        )
        for agent_id, since in oldest.items()
    }


def _frees_at(state: GateState, limit: str, entry: Waiting, now: int) -> int | None:
    """When ``limit`` may let ``entry`` through, if the gate can know (see `GateWait`)."""
    if limit == "breaker":
        return state.breaker_until if state.breaker is OPEN else None
    if limit == "backoff":
        return state.not_before
    if limit == "provider":
        return None if state.hint is None else state.hint.reset_at
    if limit == "queue":
        return now
    if limit not in ("rpm", "itpm", "otpm"):
        return None
    limits = state.index.limits
    requests, inputs, outputs = window_usage(state, now)
    if limit == "rpm":
        cap, used, need, column = limits.requests_per_minute, requests, 1, 0
    elif limit == "itpm":
        cap, used, need, column = limits.input_tokens_per_minute, inputs, entry.input_tokens, 1
    else:
        cap, used, need, column = limits.output_tokens_per_minute, outputs, entry.output_tokens, 2
    if cap is None:
        return None
    excess = used + need - cap  # what must leave the window first
    if excess <= 0:
        return now
    horizon = now - WINDOW_MS
    for charge in state.window:  # oldest first: the first grants to leave
        if charge.at <= horizon:
            continue
        excess -= (1, charge.input_tokens, charge.output_tokens)[column]
        if excess <= 0:
            return charge.at + WINDOW_MS
    return None
