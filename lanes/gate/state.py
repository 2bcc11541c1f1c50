"""The provider gate's state and the index derived from it (what holds a request is in
`holds`, the status an operator sees in `status`)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from heapq import heappush

from lanes.gate.events import WINDOW_MS, CallOutcome, GateLimits
from lanes.gate.tables import Breaker
from lanes.requests import RANK, Priority

RUN_MEMORY_MS = 3_600_000
"""How long the gate remembers a run's failed attempts after its last one."""
FAIR_GRACE_MS = 1_000
"""How long after a release an agent keeps its next call reserved (see `fair_hold`)."""
NEVER = 1 << 63
"""Later than any time (ms since the epoch)."""


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
    weight: int = 1
    """Its weight, as its latest request said: each request moves its finish tag by its
    tokens divided by the weight (rounded up), so a heavier agent is served more tokens."""


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
    while ``held_until`` is later than the clock and the calls it counts for the agents up
    to ``held_key`` in `behind` still outnumber the room (so that `fits` need not walk
    `behind` again)."""
    held_until: int = 0
    """The earliest time the hold may end by itself: a grant leaves the window, or the
    grace of an agent it counted ends."""
    held_key: tuple[int, str] = (0, "")
    """The (finish tag, agent id) in `behind` where the hold was found."""
    held_calls: int = 0
    """The calls the hold counts for the agents up to ``held_key``: those the walk found,
    less those of each agent counted that has left `behind` since (`leave_between`)."""
    held_grace: int = 0
    """The earliest end of a grace the hold counts (part of ``held_until``)."""
    held_stale: bool = False
    """``held_calls`` went down since ``held_until`` was found: `_held_rpm` finds again
    when the window frees enough room."""
    held_exact: bool = False
    """No agent has joined `behind` at or before ``held_key`` since the hold was found: while
    no grace it counts has ended (``held_grace``), ``held_calls`` is what a walk up to
    ``held_key`` would count (`_held_rpm` walks on from there)."""

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
            if state.policy >= 2 and _between_calls_of(index, share, state.now, agent_id):
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
    policy: int = 1
    """The policy version the gate decides under (`lanes.policy`; 1: never adopted)."""
    policy_offered: int | None = None
    """A newer version it adopts once at rest (nothing waits, no slot is out), if any."""
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
    if index.held is not None and (finish, agent_id) <= index.held_key:
        index.held_exact = False  # (it may count, and ``held_calls`` leaves it out)
    index.between[agent_id] = finish
    insort(index.behind, (finish, agent_id))


def leave_between(index: GateIndex, agent_id: str, share: Share | None = None,
                  now: int = 0) -> None:
    """Count an agent as no longer between calls (``share``, its share, at ``now``: what
    `GateIndex.held` counted for it is taken off; without it, the hold is dropped)."""
    finish = index.between.pop(agent_id, None)
    if finish is not None:
        behind, key = index.behind, (finish, agent_id)
        del behind[bisect_left(behind, key)]
        held = index.held
        if held is not None and key <= index.held_key:
            if share is None:
                index.held = None  # one it counted left: the hold may end
            elif share.rank == RANK[held.priority] and (
                agent_id in index.leases_of
                or (share.released_at is not None and now < share.released_at + FAIR_GRACE_MS)
            ):  # it counts now, so it did when the hold was found (`_held_rpm`)
                size = share.input_tokens + share.output_tokens
                if share.weight != 1:
                    size = -(-size // share.weight)
                index.held_calls -= -(-(held.tag - finish) // size) if size > 0 else 1
                index.held_stale = True
            # (Else it does not count now, and if it did then, its grace has ended, and
            # with it the hold: ``held_until`` is not later.)


def index_waiting(index: GateIndex, entry: Waiting) -> None:
    """Index a request that now waits."""
    waiting_of, agent_id = index.waiting_of, entry.agent_id
    waiting_of[agent_id] = waiting_of.get(agent_id, 0) + 1  # (`count_in`, inlined)
    rank = RANK[entry.priority]
    arrivals, fair = index.arrivals[rank], index.fair[rank]
    if not arrivals:
        index.head_known = False  # (its class may come first now)
    arrivals.append(entry)
    heappush(fair, (entry.tag, entry.seq, entry))
    heappush(index.deadlines, (entry.deadline, entry.seq, entry))
    head = index.head
    if head is not None and index.head_known and RANK[head.priority] == rank:
        # The class that comes first is the same (its oldest request is): within it, the
        # head is the first in the fair order, which may be this one.
        index.head = fair[0][2]


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

def _between_calls_of(index: GateIndex, share: Share, now: int, agent_id: str) -> bool:
    """`_between_calls`, from the parts of the state it reads."""
    if agent_id in index.waiting_of:
        return False
    if agent_id in index.leases_of:
        return True
    released = share.released_at
    return released is not None and now < released + FAIR_GRACE_MS
