"""The way in for requests when several processes share the log: split by owner first.

`Router.take` gives the engine only the requests of agents this process decides for; the
others go to their owners (`Peers.submit_many`, one call per owner, all at once). A request
the engine refused because its agent left this process meanwhile (`NotOwner`) is sent on to
the current owner. A forward waits about the lease at most: an owner silent that long
(paused, cut off) is passed over for whoever owns the agent by then, as the leases are read
again, and failing that the request is answered ``unavailable`` (`Unanswered`). The router
is also what the engine is told of the others (its
`gateway.runtime.engine.Elsewhere`): reads of their agents come from the replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.base.tasks import spawn, start
from gateway.cluster.peers import CALL_TIMEOUT_S, Peers, PeerUnreachable, Unanswered
from gateway.cluster.replicas import Replicas
from gateway.errors import GatewayError, NotOwner, TakingOver, UnknownAgent
from gateway.runtime.acks import Ack
from gateway.runtime.intake import Batch
from lanes import AgentRequest, AgentState

if TYPE_CHECKING:
    from gateway.cluster.member import Cluster
    from gateway.runtime.engine import Engine

log = logging.getLogger("gateway.cluster.router")
T = TypeVar("T")


class Router:
    """Requests to their owners; what the engine asks about the agents it does not hold."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        self._engine: Engine | None = None
        self._replicas: Replicas | None = None
        self._member: Cluster | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def attach(self, engine: Engine, replicas: Replicas, member: Cluster) -> None:
        """Route through ``member``'s view of the leases, to ``engine`` for its own."""
        self._engine, self._replicas, self._member = engine, replicas, member

    # ----------------------------------------------------------- the engine's Elsewhere

    def missing(self, agent_id: str) -> GatewayError:
        """`NotOwner` for an agent of the log that another process (or none, a moment)
        decides for; `TakingOver` for one this process is still adopting; `UnknownAgent`
        for one nobody has (not known before joining)."""
        if self._replicas is None:
            return NotOwner(agent_id, None)
        if self._replicas.state(agent_id) is None:
            return UnknownAgent(agent_id)
        if self._member is not None and agent_id in self._member.adopting:
            return TakingOver(agent_id)  # (not `NotOwner`: an asker would look elsewhere)
        return NotOwner(agent_id, self.owner_of(agent_id))

    def fenced(self, stream: str) -> None:
        """An append of ``stream`` was fenced: the member looks at the leases again."""
        if self._member is not None:
            self._member.fenced(stream)

    def state(self, agent_id: str) -> AgentState | None:
        """An agent decided elsewhere, as the log says."""
        return None if self._replicas is None else self._replicas.state(agent_id)

    def agent_ids(self) -> Iterable[str]:
        """Every agent of the log or the config."""
        return () if self._replicas is None else self._replicas.agent_ids()

    async def forward(self, request: AgentRequest, principal: str | None = None) -> Ack:
        """One request of the gateway's own, wherever its agent is decided."""
        return await self.take([request], principal)[0]

    def owner_of(self, stream: str) -> str | None:
        """The URL of the process deciding for ``stream`` now (as last read)."""
        return None if self._member is None else self._member.owner_of(stream)

    # ------------------------------------------------------------------- the way in

    def take(self, requests: Sequence[AgentRequest], principal: str | None,
             batch: Batch | None = None, parsed: bool = False) -> list[asyncio.Future[Ack]]:
        """Every request decided where its agent is: one future each (as `Engine.take`;
        this process's own into ``batch``, if given; ``parsed``, as there)."""
        engine = self._engine
        if engine is None:
            raise RuntimeError("the router is not attached to a member yet")
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[Ack]] = [loop.create_future() for _ in requests]
        here: list[int] = []
        away: list[int] = []
        for index, request in enumerate(requests):
            (here if engine.holds(request.agent_id) else away).append(index)
        if here:
            taken = engine.take([requests[i] for i in here], principal, batch, parsed)
            for index, future in zip(here, taken, strict=True):
                future.add_done_callback(partial(self._taken, requests[index], principal,
                                                 answers[index]))
        if away:
            self._spawn(self._forward([(i, requests[i]) for i in away], principal, answers),
                        [answers[i] for i in away])
        return answers

    def finish(self, batch: Batch) -> None:
        """Append what a batch decided here."""
        if self._engine is not None:
            self._engine.finish(batch)

    def _taken(self, request: AgentRequest, principal: str | None,
               answer: asyncio.Future[Ack], done: asyncio.Future[Ack]) -> None:
        """An answer of this process's engine; a request whose agent left meanwhile goes on
        to the agent's current owner."""
        if done.cancelled():
            answer.cancel()
            return
        error = done.exception()
        if isinstance(error, NotOwner):
            self._spawn(self._forward([(0, request)], principal, [answer]), [answer])
        else:
            _settle(answer, error or done.result())

    async def _forward(self, items: list[tuple[int, AgentRequest]], principal: str | None,
                       answers: list[asyncio.Future[Ack]],
                       silent: frozenset[str] = frozenset(),
                       left: frozenset[str] = frozenset()) -> None:
        """Send requests to their owners (one call per owner, all at once). An owner that
        does not answer within the lease (paused, cut off, gone) is passed over: its
        requests go once to whoever owns their agents then (``silent``: the owners passed
        over), else they are answered `unavailable`. An owner the agent left meanwhile
        (handed over as a member joined, say) answers `NotOwner`: the request goes on
        once to whoever owns the agent then (``left``: the owners it left)."""
        owners: dict[str, list[tuple[int, AgentRequest]]] = {}
        for index, request in items:
            error = self.missing(request.agent_id)
            if not isinstance(error, NotOwner):
                _settle(answers[index], error)
                continue
            owner = await (self._relocate(request.agent_id, silent | left)
                           if silent or left else self._locate(request.agent_id))
            if owner is None:
                _settle(answers[index],
                    Unanswered(request.agent_id, sorted(silent), self.lease_ms) if silent
                    else NotOwner(request.agent_id, None))
                continue
            owners.setdefault(owner, []).append((index, request))

        async def send(owner: str, part: list[tuple[int, AgentRequest]]) -> None:
            results = await self._submit(owner, [r for _, r in part], principal)
            if results is None:  # silent: once more, wherever the agents are now
                if silent:
                    for index, request in part:
                        _settle(answers[index], Unanswered(
                            request.agent_id, sorted(silent | {owner}), self.lease_ms))
                else:
                    await self._forward(part, principal, answers, silent | {owner}, left)
                return
            moved: list[tuple[int, AgentRequest]] = []
            for (index, request), result in zip(part, results, strict=True):
                if isinstance(result, NotOwner) and not left:
                    moved.append((index, request))
                else:
                    _settle(answers[index], result)
            if moved:  # once more, wherever the agents went
                await self._forward(moved, principal, answers, silent, left | {owner})

        await asyncio.gather(*(send(owner, part) for owner, part in owners.items()))

    async def _submit(self, owner: str, requests: list[AgentRequest], principal: str | None
                      ) -> list[Ack | GatewayError] | None:
        """`Peers.submit_many` at ``owner``; None if it could not be reached, or went silent
        (`within_lease`)."""
        results = await self.within_lease(
            owner, self.peers.submit_many(owner, requests, principal))
        if results is not None and results and \
                all(isinstance(r, PeerUnreachable) for r in results):
            log.info("the owner at %s could not be reached; asking where its agents are "
                     "now", owner)
            return None
        return results

    async def within_lease(self, owner: str, call: Coroutine[Any, Any, T]) -> T | None:
        """``call`` to the member at ``owner``, or None (the call cancelled) if it went
        silent: no answer within a lease and its member lease not renewed since (paused,
        cut off). An owner still renewing its lease is only slow: it is waited for."""
        sending = start(call, f"cluster: a call to {owner}")
        try:
            while True:
                done, _ = await asyncio.wait([sending], timeout=self.lease_ms / 1000)
                if done:
                    return sending.result()
                if not await self._alive(owner):
                    log.info("the member at %s did not answer within the lease (%d ms) and "
                             "did not renew its lease", owner, self.lease_ms)
                    return None
        finally:
            sending.cancel()  # (nothing, if it is done)

    async def _alive(self, owner: str) -> bool:
        """Whether the member serving at ``owner`` renewed its lease, as read afresh."""
        member = self._member
        if member is None:
            return True
        return await member.serving(owner)

    async def _relocate(self, agent_id: str, silent: frozenset[str]) -> str | None:
        """The owner of an agent whose owner went ``silent``, as the leases say afresh:
        read every period until another member holds it, for a lease at most."""
        member = self._member
        if member is None:
            return None
        clock = member.clock
        deadline = clock.now_ms() + member.lease_ms
        while True:
            owner = await member.relocate(agent_id)
            if owner is not None and owner not in silent:
                return owner
            left = deadline - clock.now_ms()
            if left <= 0:
                return None
            await clock.sleep(min(left, member.period_ms))

    @property
    def lease_ms(self) -> int:
        """The members' lease: how long a call to a silent member is waited for."""
        return round(CALL_TIMEOUT_S * 1000) if self._member is None else self._member.lease_ms

    async def _locate(self, agent_id: str) -> str | None:
        return None if self._member is None else await self._member.locate(agent_id)

    async def close(self) -> None:
        """Stop the forwards under way (their requests are answered as cancelled)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], answers: list[asyncio.Future[Ack]]
               ) -> None:
        """Forward in the background; the ``answers`` it leaves unanswered (it was cancelled:
        the router closed) are cancelled."""
        task = spawn(coro, "forward")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: [a.cancel() for a in answers if not a.done()])

def _settle(answer: asyncio.Future[Ack], outcome: Ack | BaseException) -> None:
    """Answer a request (unless its asker gave up on it meanwhile)."""
    if answer.done():
        return
    if isinstance(outcome, BaseException):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)
