"""Several gateway processes on one log: who owns which stream, and keeping it so.

Every process of a cluster is a *member*: it holds a lease of its own in the log's database
(`store.port.Leases`) and renews it every `Cluster.period_ms`. Its member id names the URL
it serves at (``http://10.0.0.5:8000#3f9a...``), so whoever sees one of its leases knows
where to forward to. Each stream (an agent, a provider gate) goes to one live member by
rendezvous hashing (`assign`): every member computes the same answer from the same members,
a new member takes over its share, and a dead member's streams spread over the others. At
each renewal a member hands over (gracefully: `gateway.runtime.engine.Engine.unload`) the
streams assigned elsewhere and releases their leases, acquires those assigned to it that
are free (never held, released, or held by a member whose lease expired) and adopts them
(`Engine.load`: a run cut off by a dead owner recorded aborted and rerun). A lease this
member did not renew in time is lost: it stops the stream at once, and the store fences its
appends from then on (`store.port.FencedError`).

Renewing never waits behind anything else: the lease is renewed by a task of its own, the
streams are rebalanced by another, and adopted by a third, from each agent's replica plus
the tail of its stream, a chunk at a time (`gateway.cluster.adoption`). An agent whose lease
this member holds and that is still being adopted answers ``unavailable`` (retry shortly).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from gateway.base.clock import Clock, Timer, sleep_or
from gateway.base.tasks import cancel, spawn, start
from gateway.cluster.replicas import Replicas
from gateway.cluster.router import Router
from gateway.cluster.takeover import drop, gate_of, next_renewal_ms, take_over, unload
from gateway.runtime.engine import Engine
from store.port import Fence, LeaseLost, LeaseView, StoreError
from store.writer import GroupCommitStore

log = logging.getLogger("gateway.cluster.member")

LEASE_MS: Final = 5_000
"""Default lease of a member: a process that stopped renewing it for this long is dead to
the others, which take its streams over."""


def owner_id(url: str) -> str:
    """A new member's id: the URL it serves at, and a random part (a restarted process, or
    one that lost its lease, is a new member)."""
    return f"{url}#{os.urandom(6).hex()}"


def url_of(owner: str) -> str:
    """The URL a member serves at, from its id."""
    return owner.rsplit("#", 1)[0]


def incarnation(owner: str) -> str:
    """The random part of a member's id: the prefix of every event id it writes."""
    return owner.rsplit("#", 1)[-1]


def _weight(member: str, resource: str) -> bytes:
    return hashlib.blake2b(f"{member}\x00{resource}".encode(), digest_size=8).digest()


def assign(resources: Iterable[str], members: Sequence[str]) -> dict[str, str]:
    """Each resource's member by rendezvous hashing (the member with the highest hash of
    the pair): the same on every member for the same members; when one joins or leaves,
    only the resources it gains or held move. Empty if there are no members."""
    if not members:
        return {}
    return {resource: max(members, key=lambda member: _weight(member, resource))
            for resource in resources}


class Cluster:
    """This process as a member of a cluster: its lease, and its share of the streams.

    ``url`` is where the other members reach this process (its internal API). Start it
    after the engine (clustered, so owning nothing yet); stop it before the engine: the
    streams it owns are handed over and its leases given up, so that the others take them
    over at their next renewal rather than after the lease time.
    """

    def __init__(self, engine: Engine, router: Router, url: str, *, lease_ms: int = LEASE_MS,
                 clock: Clock | None = None) -> None:
        if engine.elsewhere is not router:
            raise ValueError("a cluster member needs an engine built with its router")
        store = engine.store
        if not isinstance(store, GroupCommitStore):
            raise ValueError("a cluster needs a store with leases")
        if lease_ms < 100:
            raise ValueError(f"a member lease of at least 100 ms: {lease_ms}")
        self.engine = engine
        self.router = router
        self.store: GroupCommitStore = store
        self.url = url
        self.lease_ms = lease_ms
        self.period_ms = max(20, lease_ms // 5)
        """How often the lease is renewed (and the streams rebalanced)."""
        self.clock = clock or engine.clock
        self.replicas = Replicas(store, self.clock, engine.configured, engine.gates,
                                 self._holds)
        """The streams other members decide for, followed from the log."""
        self.member = owner_id(url)
        self.view = LeaseView(0, {}, {})
        """The leases as last read."""
        self._fences: dict[str, Fence] = {}
        """The streams this member owns, each with the lease it holds."""
        self._renewed_at = 0
        """When the last renewal that went through was sent: the lease lasts at least
        `lease_ms` from then."""
        self._watchdog: Timer | None = None
        self._located: asyncio.Future[LeaseView] | None = None
        """A read of the leases under way for `locate` (one at a time, shared)."""
        self._adopting: dict[str, tuple[Fence, frozenset[str]]] = {}
        """Streams whose lease this member holds and that it is loading (in order), each
        with its fence and the members alive when it was acquired."""
        self._adopter: asyncio.Task[None] | None = None
        self._balancing = asyncio.Lock()
        """One rebalance at a time (the background's, `tick`'s, the start's)."""
        self._wakeup = asyncio.Event()
        self._due = asyncio.Event()
        """A renewal went through (or failed): rebalance."""
        self._renewer: asyncio.Task[None] | None = None
        self._balancer: asyncio.Task[None] | None = None
        self._stopped = False
        self.on_handed_over: Callable[[str], None] = lambda _url: None
        """Told the URL of a member this one handed streams over to (to wake it)."""
        self.on_members: Callable[[list[str]], None] = lambda _urls: None
        """Told the URLs of the live members (this one's too) when they change."""
        self._members: list[str] = []
        self.takeovers = 0
        """Streams adopted so far (for metrics)."""

    @property
    def owned(self) -> list[str]:
        """The streams this member owns now."""
        return sorted(self._fences)

    @property
    def adopting(self) -> list[str]:
        """The streams whose lease this member holds and that it is still loading."""
        return list(self._adopting)

    def owner_of(self, stream: str) -> str | None:
        """The URL of the member owning ``stream`` now (as last read), if any."""
        if stream in self._fences:
            return self.url
        holder = self.view.holders.get(stream)
        if holder is None or holder.owner == self.member:  # (handed over since it was read)
            return None
        return url_of(holder.owner)

    async def locate(self, stream: str) -> str | None:
        """`owner_of`, after reading the leases again if it is not known (it moved since
        the last renewal, say): one read at a time, shared by every caller."""
        found = self.owner_of(stream)
        if found is None and stream not in self._adopting:  # (being adopted: here, soon)
            if self._located is None:
                self._located = start(self.store.leases(), "cluster: read the leases")
            reading = self._located
            try:
                self.view = await asyncio.shield(reading)
            except StoreError:
                pass
            finally:
                if self._located is reading and reading.done():
                    self._located = None
            found = self.owner_of(stream)
        return found

    async def relocate(self, stream: str) -> str | None:
        """`owner_of` after reading the leases again now (the owner last read went silent:
        a lease whose member expired is free in the new read)."""
        with contextlib.suppress(StoreError):
            self.view = await self.store.leases()
        return self.owner_of(stream)

    async def serving(self, url: str) -> bool:
        """Whether a live member serves at ``url``, as the leases say read again now."""
        with contextlib.suppress(StoreError):
            self.view = await self.store.leases()
        return any(url_of(member) == url for member in self.view.members)

    async def start(self) -> None:
        """Join, take this member's share of the streams, and keep it up in the
        background."""
        await self.replicas.start()
        self.router.attach(self.engine, self.replicas, self)
        for gate in self.engine.gates.values():
            gate.on_fenced = self.fenced
        await self._join()
        self._tell_members()
        self._renewer = spawn(self._renewing(), "cluster lease")
        self._balancer = spawn(self._rebalancing(), "cluster rebalance")
        async with self._balancing:
            await self._rebalance(self.view)
        await self.adopted()

    async def stop(self) -> None:
        """Hand over every stream whose lease this member holds (those it was still loading
        are loaded first: a run their last owner was cut off in is recorded, not left for a
        member that may never come), wake the members they go to, and leave; again:
        nothing. The lease is renewed until then: a hand-over that outlasts the rest of it
        must not end in the watchdog dropping the streams not handed over yet (their runs
        left open in the log)."""
        if self._stopped:
            return
        self._stopped = True
        handed: list[str] = []
        try:  # (a log that does not answer must not hold the stop: the leases expire)
            async with asyncio.timeout(max(2.0, 2 * self.lease_ms / 1000)):
                async with self._balancing:  # a rebalance under way ends; none after it
                    await cancel(self._balancer)
                handed = self.owned
                await self._hand_over(handed)
                await self.adopted()  # (after: what it decides for is not held up by it)
                loaded = self.owned
                await self._hand_over(loaded)
                handed += loaded
                await cancel(self._renewer)
                with contextlib.suppress(StoreError):
                    await self.store.leave(self.member)
        except TimeoutError:
            log.warning("stopping: the log did not take the hand-over within %d ms; the "
                        "others take the streams when the leases expire", 2 * self.lease_ms)
        await cancel(self._balancer, self._renewer, self._adopter)
        self._adopting.clear()  # (their leases go with the member's)
        others = sorted(m for m in self.view.members if m != self.member)
        for member in set(assign(handed, others).values()):
            self.on_handed_over(url_of(member))
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self.router.close()
        await self.replicas.stop()

    def poke(self) -> None:
        """Renew and rebalance now rather than at the next period."""
        self._wakeup.set()

    def fenced(self, stream: str) -> None:
        """An append of ``stream`` was fenced: it is someone else's (the engine or the gate
        dropped it); its replica is read again, and the leases looked at now."""
        self._fences.pop(stream, None)
        self._adopting.pop(stream, None)
        self.replicas.refresh(stream)
        self.poke()

    async def adopted(self) -> None:
        """Wait until every stream acquired so far is adopted (or given up)."""
        while self._adopter is not None and not self._adopter.done():
            await asyncio.shield(self._adopter)

    async def _renewing(self) -> None:
        """Renew the lease every period (or when poked, or when another member's lease runs
        out: its streams are taken at once), whatever else is under way."""
        while True:
            await sleep_or(self.clock, next_renewal_ms(self.view, self.member, self.period_ms),
                           self._wakeup)
            self._wakeup.clear()
            try:
                await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let membership die: the next period tries again
                log.exception("cluster membership: renewing the lease failed")
            self._due.set()

    async def _rebalancing(self) -> None:
        """Rebalance after each renewal (never holding the next one up)."""
        while True:
            await self._due.wait()
            self._due.clear()
            try:
                async with self._balancing:
                    await self._rebalance(self.view)
            except asyncio.CancelledError:
                raise
            except Exception:  # the next renewal's round tries again
                log.exception("cluster membership: rebalancing failed")

    async def tick(self) -> None:
        """Renew this member's lease, rebalance, and wait for the adoptions (what the
        background tasks do every period; tests call it directly on a fake clock)."""
        if await self._renew():
            async with self._balancing:
                await self._rebalance(self.view)
            await self.adopted()

    async def _renew(self) -> bool:
        """Renew the lease (join again under a new id if it was lost); False if the store
        failed (the watchdog stops everything if no renewal goes through in time)."""
        sent = self.clock.now_ms()
        try:
            async with asyncio.timeout(self.lease_ms / 2000):  # a stuck renewal is a failed one
                view = await self.store.renew(self.member, self.lease_ms)
        except LeaseLost as lost:
            log.error("%s: stopping every stream it owned%s", lost,
                      "" if self._stopped else "; joining again")
            self._lose_all()
            if self._stopped:
                return False
            self.member = owner_id(self.url)
            view = await self._join()
        except (StoreError, TimeoutError) as error:
            log.warning("renewing the member lease failed: %s", error or "timed out")
            return False
        else:
            self._renewed(sent)
        self.view = view
        self._tell_members()
        return True

    def _tell_members(self) -> None:
        urls = sorted({self.url, *(url_of(member) for member in self.view.members)})
        if urls != self._members:
            self._members = urls
            self.on_members(urls)

    def _renewed(self, sent: int) -> None:
        """The lease was renewed by a call sent at ``sent``: it holds until at least
        ``sent + lease_ms``. Stop everything a little before that unless renewed again."""
        self._renewed_at = sent
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = self.clock.call_at(sent + self.lease_ms - self.period_ms // 2,
                                            self._expiring)

    def _expiring(self) -> None:
        """No renewal went through in time: the others may take this member's streams any
        moment now; stop them first (their appends would be fenced anyway)."""
        self._watchdog = None
        self._adopting.clear()
        if self._fences:
            log.error("the member lease was not renewed for %d ms: its streams are the "
                      "others' now; stopping them", self.clock.now_ms() - self._renewed_at)
            self._lose_all()

    async def _join(self) -> LeaseView:
        """Join as ``member``: the events this process writes from now on carry its id's
        random part (`incarnation`), so the log tells which member wrote what."""
        prefix = incarnation(self.member)
        if self.engine.ids is not None:
            self.engine.ids.use(prefix)
        for index, gate in enumerate(self.engine.gates.values()):  # each counts on its own
            gate.ids.use(f"{prefix}g{index}")
        sent = self.clock.now_ms()
        self.view = await self.store.join(self.member, self.lease_ms)
        self._renewed(sent)
        return self.view

    async def _rebalance(self, view: LeaseView) -> None:
        me = self.member
        # What the leases say this member lost (taken while it was paused, say): stop now.
        for stream, fence in list(self._fences.items()):
            if view.holders.get(stream) != fence:
                log.warning("the lease of %s is no longer this member's: stopping it", stream)
                self._lose(stream)
        for stream, (fence, _alive) in list(self._adopting.items()):
            if view.holders.get(stream) != fence:
                self._adopting.pop(stream, None)
        wanted = assign(self._streams(), sorted(view.members))
        # Held by this member without owning them (an adoption or a release failed): the
        # leases say it holds them, so nobody else will: take them up again, or give them back.
        stray = [s for s, fence in view.holders.items()
                 if fence.owner == me and s not in self._fences and s not in self._adopting]
        for stream in stray:
            if wanted.get(stream) != me:
                with contextlib.suppress(StoreError):
                    await self.store.release(me, [stream])
        for stream in [s for s in self._adopting if wanted.get(s) != me]:
            self._adopting.pop(stream, None)
            with contextlib.suppress(StoreError):
                await self.store.release(me, [stream])
        handed = [s for s in self._fences if wanted.get(s) != me]
        await self._hand_over(handed)
        for member in {wanted[s] for s in handed if s in wanted}:
            self.on_handed_over(url_of(member))  # it takes them now, not at its next renewal
        free = [s for s, member in wanted.items() if member == me and s not in self._fences
                and s not in self._adopting
                and (s not in view.holders or view.holders[s].owner == me)]
        if not free:
            return
        acquired = await self.store.acquire(me, free)
        alive = frozenset(stream for stream, fence in view.holders.items()
                          if fence.owner in view.members)
        for stream, epoch in acquired.items():
            self._adopting[stream] = (Fence(me, epoch), alive)
        if self._adopter is None or self._adopter.done():
            self._adopter = spawn(self._adopt_all(), "cluster adoption")

    def _holds(self, stream: str) -> bool:
        """Whether this member decides for ``stream``, or is adopting it: then its replica
        is left as it is (the adoption copies it, and reads the rest from the log)."""
        if stream in self._adopting:
            return True
        gate = gate_of(self.engine, stream)
        return gate.loaded if gate is not None else self.engine.holds(stream)

    def _streams(self) -> list[str]:
        return [*self.engine.agent_ids, *(g.stream for g in self.engine.gates.values())]

    async def _adopt_all(self) -> None:
        """Adopt the streams acquired, one at a time, until none is left."""
        while self._adopting:
            stream, (fence, alive) = next(iter(self._adopting.items()))
            try:
                await self._adopt(stream, fence, alive)
            except Exception:  # never let adoption die; the next rebalance tries again
                if self._adopting_at(stream, fence):
                    log.exception("adopting %s failed; giving its lease back", stream)
                    with contextlib.suppress(StoreError):
                        await self.store.release(self.member, [stream])
            finally:
                if self._adopting.get(stream, (None,))[0] is fence:
                    del self._adopting[stream]

    def _adopting_at(self, stream: str, fence: Fence) -> bool:
        """Whether ``stream`` is still to be adopted at ``fence`` (not lost meanwhile)."""
        return self._adopting.get(stream, (None,))[0] is fence

    async def _adopt(self, stream: str, fence: Fence, alive: frozenset[str]) -> None:
        try:  # (granted slots of gates' runs still alive elsewhere are kept)
            if not await take_over(self.engine, self.replicas, stream, fence, alive,
                                   lambda: self._adopting_at(stream, fence)):
                return
        except StoreError as error:  # its stream could not be read: give the lease back
            log.warning("could not take %s over (%s); giving its lease back", stream, error)
            with contextlib.suppress(StoreError):
                await self.store.release(self.member, [stream])
            return
        self._fences[stream] = fence
        self.takeovers += 1

    async def _hand_over(self, streams: list[str]) -> None:
        """`unload` ``streams`` and give their leases up."""
        for stream in streams:
            self._fences.pop(stream, None)
        await unload(self.engine, streams)
        for stream in streams:
            self.replicas.refresh(stream)
        if streams:
            with contextlib.suppress(StoreError):
                await self.store.release(self.member, streams)

    def _lose(self, stream: str) -> None:
        self._fences.pop(stream, None)
        self._adopting.pop(stream, None)
        drop(self.engine, stream)
        self.replicas.refresh(stream)

    def _lose_all(self) -> None:
        self._adopting.clear()
        for stream in list(self._fences):
            self._lose(stream)
