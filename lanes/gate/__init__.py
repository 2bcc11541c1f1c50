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

The files, as on the agent side: `events` (inputs and decisions), `state` (the state and
its index), `holds` (what holds a request: the limits, the fair order, the head of the
line), `status` (what an operator sees), `tables` (the breaker's rules), `decide`,
`evolve`, and `replay` (the codec and `verify_gate`).
"""

from __future__ import annotations

from lanes.gate.decide import backoff_ceiling, decide_gate, full_jitter, next_gate_due
from lanes.gate.evolve import evolve_gate, fold_gate
from lanes.gate.holds import blocker, blocking, fair_hold, next_in_line, unnamed
from lanes.gate.replay import (
    GATE_CODEC,
    GATE_EVENT_TYPES,
    GateDivergence,
    decode_gate_event,
    encode_gate_event,
    verify_gate,
)
from lanes.gate.state import (
    FAIR_GRACE_MS,
    RANKS,
    RUN_MEMORY_MS,
    GateState,
    HotLimits,
    Waiting,
    window_usage,
)
from lanes.gate.status import GateStatus, GateWait, WaitingAgent, gate_status, gate_waits
from lanes.gate.tables import Breaker

__all__ = [
    "FAIR_GRACE_MS", "GATE_CODEC", "GATE_EVENT_TYPES", "RANKS", "RUN_MEMORY_MS", "Breaker",
    "GateDivergence", "GateState", "GateStatus", "GateWait", "HotLimits", "Waiting",
    "WaitingAgent", "backoff_ceiling", "blocker", "blocking", "decide_gate",
    "decode_gate_event", "encode_gate_event", "evolve_gate", "fair_hold", "fold_gate",
    "full_jitter", "gate_status", "gate_waits", "next_gate_due", "next_in_line", "unnamed",
    "verify_gate", "window_usage",
]
