"""What holds a waiting request at the provider gate: the limits (`blocking`), the fair
order (`fair_hold`), and which request is next in line; `fits` is the grant path's one
pass over all of them."""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import islice

from lanes.gate.events import WINDOW_MS
from lanes.gate.state import (
    FAIR_GRACE_MS,
    NEVER,
    RANKS,
    GateState,
    Share,
    Waiting,
    _between_calls_of,
    window_usage,
)
from lanes.gate.tables import CLOSED, OPEN
from lanes.requests import RANK

HOLD_MARGIN = 4
"""How far short of room `_held_rpm` counts a fair hold before it stops (if it may): the
hold it keeps lasts until that many grants have left the window."""


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
        if share.weight != 1:  # (its tag moves by its tokens / its weight a call)
            size = -(-size // share.weight)
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
    index, now, room = state.index, state.now, rpm - requests - 1
    start, calls, until = 0, 0, NEVER
    if index.held is entry:
        if now < index.held_until:
            if not index.held_stale:
                return True
            if index.held_calls > room:  # (as many grants have yet to leave the window)
                index.held_until = _freed_by(state, index.held_calls - room, index.held_grace)
                index.held_stale = False
                if now < index.held_until:
                    return True
        if index.held_exact and now < index.held_grace:
            # What the agents up to ``held_key`` count is what a walk would count now:
            # if it is not over the room, walk on from there.
            calls, until = index.held_calls, index.held_grace
            if calls > room:
                index.held_until, index.held_stale = _freed_by(state, calls - room, until), False
                return True
            start = bisect_right(index.behind, index.held_key)
    shares, tag, leases_of, behind = state.shares, entry.tag, index.leases_of, index.behind
    graced_from, rank = now - FAIR_GRACE_MS, RANK[entry.priority]
    key = None
    for finish, agent_id in islice(behind, start, None) if start else behind:
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
        if share.weight != 1:
            size = -(-size // share.weight)
        calls += -(-(tag - finish) // size) if size > 0 else 1  # rounded up
        if calls > room:
            key = finish, agent_id
            if calls - room >= HOLD_MARGIN:
                break  # (held: counting on makes the hold last longer, see below)
    if key is None:
        return False
    # Held until as many grants counted now leave the window as the room is short (it
    # grows by one each), a grace counted ends, or an agent counted leaves `behind`
    # (`leave_between`, which takes its calls off) or its lease (`GateIndex.held` is
    # updated there): nothing else makes the room larger or what the agents up to ``key``
    # need smaller.
    index.held, index.held_key, index.held_calls = entry, key, calls
    index.held_grace, index.held_stale, index.held_exact = until, False, True
    index.held_until = _freed_by(state, calls - room, until)
    return True


def _freed_by(state: GateState, short: int, until: int) -> int:
    """When the window will have freed ``short`` requests counted now (or ``until``, if
    that is earlier)."""
    horizon = state.now - WINDOW_MS
    for charge in state.window:
        if charge.at > horizon:
            short -= 1
            if short == 0:
                return charge.at + WINDOW_MS if charge.at + WINDOW_MS < until else until
    return until


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
