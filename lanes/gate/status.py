"""The provider gate's status as an operator sees it, derived from the state alone."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lanes.gate.events import WINDOW_MS, GateLimits
from lanes.gate.holds import blocking, fair_hold, next_in_line
from lanes.gate.state import GateCounters, GateState, Waiting, window_usage
from lanes.gate.tables import OPEN, Breaker


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
