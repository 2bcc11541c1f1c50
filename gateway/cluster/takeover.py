"""Taking a stream over and letting it go: what a member does to its engine and gates when
a stream's lease comes to it (`take_over`, from the replica and the tail of the stream:
`gateway.cluster.adoption`) or leaves it (`unload`, `drop`), and when it renews next
(`next_renewal_ms`: at once when another member's lease runs out)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from gateway.cluster.adoption import catch_up, catch_up_gate
from gateway.cluster.replicas import Replicas
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from store.port import Fence, LeaseView

EXPIRY_MARGIN_MS = 5
"""How long after another member's lease ran out this one looks (the database's clock
decides; a look a moment early only looks again)."""


def next_renewal_ms(view: LeaseView, member: str, period_ms: int) -> int:
    """How long until ``member`` renews again: a period, or less when the lease of another
    member runs out sooner (it stopped renewing: its streams are free once it does, and
    are taken then rather than up to a period later)."""
    others = [expires for other, expires in view.members.items() if other != member]
    if not others:
        return period_ms
    return max(1, min(period_ms, min(others) - view.now + EXPIRY_MARGIN_MS))


async def take_over(engine: Engine, replicas: Replicas, stream: str, fence: Fence,
                    alive: frozenset[str], current: Callable[[], bool]) -> bool:
    """Load ``stream`` into ``engine`` (its agent, or its provider gate) at ``fence``, from
    its replica and the tail of its stream; False, loading nothing, if ``current()`` says
    the lease was lost meanwhile. A gate keeps the granted slots of runs of agents held by
    the members in ``alive``. A `store.port.StoreError` (the stream could not be read) is
    the caller's."""
    store = engine.store
    gate = gate_of(engine, stream)
    if gate is not None:
        gate_state = await catch_up_gate(store, stream, replicas.gate_state(stream))
        if not current():
            return False
        gate.adopt(gate_state, fence, lambda agent_id: agent_id in alive)
        return True
    await replicas.reach(await store.last_position())  # (the calls on their way known)
    holding = engine.holding
    adopted = await catch_up(store, engine.reader, stream, replicas.state(stream),
                             holding.file_config(stream))
    if not current():
        return False
    holding.adopt(stream, adopted.state, fence, adopted.file_changed,
                  list(replicas.calls.values()), list(replicas.answers.values()))
    return True


def gate_of(engine: Engine, stream: str) -> ProviderGate | None:
    """The provider gate whose stream ``stream`` is (None: an agent's)."""
    for gate in engine.gates.values():
        if gate.stream == stream:
            return gate
    return None


async def unload(engine: Engine, streams: Sequence[str]) -> None:
    """Stop deciding for ``streams`` gracefully, all at once (their runs in flight recorded
    aborted, ``shutdown``, in one commit), the agents before the gates their runs give slots
    back to."""
    gates = [gate for stream in streams if (gate := gate_of(engine, stream)) is not None]
    await asyncio.gather(*(engine.holding.unload(stream) for stream in streams
                           if gate_of(engine, stream) is None))
    await asyncio.gather(*(gate.unload() for gate in gates))


def drop(engine: Engine, stream: str) -> None:
    """Stop deciding for ``stream`` at once (its lease is another member's already)."""
    gate = gate_of(engine, stream)
    if gate is not None:
        gate.drop()
    else:
        engine.holding.drop(stream)

