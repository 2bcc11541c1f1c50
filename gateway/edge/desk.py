"""The desk kill at the edge (``POST /api/desk/kill``, the ``desk_kill`` frame of
``/ws/control``, ``gateway kill``): who may, which agents it reaches, and its body."""

from __future__ import annotations

from gateway.edge.auth import Principal
from gateway.edge.protocol import DeskKillAck, DeskKillBody
from gateway.edge.service import Service
from gateway.runtime.desk import DeskKilled, desk_kill


def kill_scope(service: Service, principal: Principal) -> list[str]:
    """The agents a desk kill by ``principal`` reaches, in id order: every agent, or the
    token's scope (ids the gateway does not know are kept: the kill records them refused)."""
    if principal.agents is None:
        return list(service.engine.agent_ids)
    return sorted(principal.agents)


async def kill_desk(service: Service, principal: Principal, body: DeskKillBody) -> DeskKilled:
    """Halt every agent of the caller's scope (`gateway.runtime.desk.desk_kill`), and
    flatten each with ``body.flatten``, the feed's bulk work waiting meanwhile;
    `Forbidden` for a token that may not, nothing recorded then."""
    principal.check_control()
    agents = kill_scope(service, principal)
    with service.pacer.urgent():
        return await desk_kill(service.engine, service.way_in, agents, principal.name,
                               body.reason, None if principal.agents is None else agents,
                               flatten=body.flatten)


def kill_answer(kill: DeskKilled, id: str | None = None) -> DeskKillAck:
    """A desk kill on the wire: the record, with its totals."""
    return DeskKillAck(id=id, kill=kill, halted=kill.halted,
                       cancels_requested=kill.cancels_requested,
                       flatten_orders=kill.flatten_orders)
