"""Leases (`store.port.Leases`) on the group-commit writer: members join and renew, take
and give up the leases of streams, each change a compare and set in a transaction."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, TypeVar

from .batch import LeaseRow
from .port import MEMBER_PREFIX, Fence, LeaseLost, LeaseView, StoreError, WriteFailed
from .schema import MEMBER_MAX, STREAM_MAX
from .writer_core import WriterCore, WriteTransaction

T = TypeVar("T")

FORGET_MEMBER_MS: Final = 3_600_000
"""A member whose lease expired this long ago and that holds nothing is deleted (by the
next member to join)."""


def _check_member(member: str, ttl_ms: int) -> None:
    if not member or len(member) > MEMBER_MAX - len(MEMBER_PREFIX):
        raise ValueError(f"a member id has 1 to {MEMBER_MAX - len(MEMBER_PREFIX)} "
                         f"characters: {member!r}")
    if ttl_ms < 0:
        raise ValueError(f"a lease lasts at least 0 ms (0: it expires at once): {ttl_ms}")


def _alive(now: int, rows: dict[str, LeaseRow]) -> dict[str, int]:
    """The live members in lease ``rows`` at ``now``, with when their lease expires."""
    return {row.resource[len(MEMBER_PREFIX):]: row.expires_at for row in rows.values()
            if row.resource.startswith(MEMBER_PREFIX) and row.expires_at > now}


def _view(now: int, rows: dict[str, LeaseRow]) -> LeaseView:
    alive = _alive(now, rows)
    holders = {row.resource: Fence(row.owner, row.epoch) for row in rows.values()
               if row.owner is not None and row.owner in alive
               and not row.resource.startswith(MEMBER_PREFIX)}
    return LeaseView(now, alive, holders)



class LeaseWriter(WriterCore):
    """The leases of a `store.writer.GroupCommitStore`."""

    async def join(self, member: str, ttl_ms: int) -> LeaseView:
        """Make ``member`` live for ``ttl_ms``; the leases as they are then
        (`store.port.Leases`)."""
        _check_member(member, ttl_ms)

        async def join(txn: WriteTransaction) -> LeaseView:
            now, rows = await txn.lease_rows(None)
            # Members that died long ago and hold nothing any more: forgotten.
            owners = {row.owner for row in rows.values()
                      if not row.resource.startswith(MEMBER_PREFIX)}
            dead = [r for r, row in rows.items() if r.startswith(MEMBER_PREFIX)
                    and row.expires_at + FORGET_MEMBER_MS < now and row.owner not in owners]
            if dead:
                await txn.delete_leases(dead)
                for resource in dead:
                    del rows[resource]
            old = rows.get(MEMBER_PREFIX + member)
            row = LeaseRow(MEMBER_PREFIX + member, member, 0, now + ttl_ms)
            if not await txn.swap_lease(old, row):
                raise LeaseLost(f"member {member} changed while it joined; join again")
            rows[row.resource] = row
            return _view(now, rows)

        return await self._leasing("joining the cluster", join, own=True)

    async def renew(self, member: str, ttl_ms: int) -> LeaseView:
        """Keep ``member`` live for another ``ttl_ms`` (`LeaseLost` if its lease expired)."""
        _check_member(member, ttl_ms)

        async def renew(txn: WriteTransaction) -> LeaseView:
            now, rows = await txn.lease_rows(None)
            own = rows.get(MEMBER_PREFIX + member)
            row = None if own is None else own._replace(expires_at=now + ttl_ms)
            if own is None or own.expires_at <= now or row is None \
                    or not await txn.swap_lease(own, row):
                raise LeaseLost(f"the lease of member {member} expired: it may hold nothing "
                                "and write nothing; join again under a new id")
            rows[row.resource] = row
            return _view(now, rows)

        return await self._leasing("renewing a lease", renew, own=True)

    async def acquire(self, member: str, resources: Sequence[str]) -> dict[str, int]:
        """Take the free leases of ``resources`` at a new epoch each, keep ``member``'s own;
        every one of them ``member`` holds now, with its epoch (`store.port.Leases`). Each
        one changes hands only if nobody else changed it meanwhile (compare and set: two
        members taking one stream at once get it once)."""
        _check_member(member, 0)
        for resource in resources:
            if not resource or len(resource) > STREAM_MAX or resource.startswith(MEMBER_PREFIX):
                raise ValueError(f"not a stream to lease: {resource!r}")

        async def acquire(txn: WriteTransaction) -> dict[str, int]:
            now, rows = await txn.lease_rows(None)
            alive = _alive(now, rows)
            if member not in alive:
                raise LeaseLost(f"member {member} is not live (its lease expired): it may "
                                "acquire nothing; join again under a new id")
            held: dict[str, int] = {}
            # One order (code points: PostgreSQL's "C" collation, as the commits lock them):
            # no deadlock between two transactions locking the same rows.
            for resource in sorted(set(resources)):
                row = rows.get(resource)
                if row is not None and row.owner == member:
                    held[resource] = row.epoch
                elif row is None or row.owner is None or row.owner not in alive:
                    taken = LeaseRow(resource, member, 1 if row is None else row.epoch + 1, 0)
                    if await txn.swap_lease(row, taken):
                        held[resource] = taken.epoch
            return held

        return await self._leasing("acquiring leases", acquire)

    async def release(self, member: str, resources: Sequence[str]) -> None:
        """Give up the leases of ``resources`` that ``member`` holds."""
        async def release(txn: WriteTransaction) -> None:
            _, rows = await txn.lease_rows(sorted(set(resources)))
            for row in rows.values():
                if row.owner == member:
                    await txn.swap_lease(row, row._replace(owner=None))

        await self._leasing("releasing leases", release)

    async def leave(self, member: str) -> None:
        """Give up every lease of ``member``, its own included."""
        async def leave(txn: WriteTransaction) -> None:
            _, rows = await txn.lease_rows(None)
            for row in sorted(rows.values()):
                if row.owner == member and not row.resource.startswith(MEMBER_PREFIX):
                    await txn.swap_lease(row, row._replace(owner=None))
            await txn.delete_leases([MEMBER_PREFIX + member])

        await self._leasing("leaving the cluster", leave)

    async def leases(self) -> LeaseView:
        """The leases now."""
        async def read(txn: WriteTransaction) -> LeaseView:
            return _view(*await txn.lease_rows(None))

        return await self._leasing("reading the leases", read)

    async def _leasing(self, what: str,
                       work: Callable[[WriteTransaction], Coroutine[Any, Any, T]],
                       own: bool = False) -> T:
        """``work`` in a transaction of its own (`_lease_transaction`; ``own``: a member's
        own lease, never queued behind reads); a database failure is `WriteFailed`."""
        self._check_open()
        try:
            return await self._lease_transaction(work, own)
        except StoreError:
            raise
        except Exception as exc:
            raise WriteFailed(what, self._describe(exc)) from exc

    async def _lease_transaction(
            self, work: Callable[[WriteTransaction], Coroutine[Any, Any, T]],
            own: bool = False) -> T:
        """Run ``work`` in a transaction for leases: here, a write transaction of the
        writer's, between two commits (one process writes this log). An adapter whose log
        several processes write (PostgreSQL) runs it apart from the commits, so that a
        process stuck in a commit never holds up the others' leases, and a member's ``own``
        lease on a connection of its own, so that reads never hold up its renewal."""
        assert self._write_lock is not None
        async with self._write_lock:
            self._check_open()
            async with self._transaction() as txn:
                return await work(txn)
