"""A process of its own appending to, or following, one PostgreSQL log (for the tests of
several processes on one log, and the benchmark).

    python -m tests.store.pg_worker writer URL TAG APPENDS TASKS INCREMENTS
    python -m tests.store.pg_worker follower URL TOTAL

Each prints ``ready`` once its store is open (a follower: once its followers are waiting),
waits for a line on stdin, works, and prints one JSON object:

- a writer: ``{"acked": [[position, stream, version, event_id], ...], "conflicts": n}``:
  ``APPENDS`` appends from ``TASKS`` tasks, alternating between a stream of the task's own
  (expected versions) and three streams shared by every writer (no expected version), then
  ``INCREMENTS`` increments of the shared ``counter`` stream, each an optimistic append
  (read its version, append expecting it, again on a `ConcurrencyError`);
- a follower: ``{"followers": [[[position, event_id], ...], ...]}``: what each of three
  followers (`follow`, `follow_batches`, and `follow` of a second store whose followers
  buffer 16 events) got, once each got ``TOTAL`` events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncGenerator

from store import Append, ConcurrencyError, NewEvent, PostgresEventStore, RecordedEvent

TIMEOUT_S = 60.0
Followed = AsyncGenerator[list[RecordedEvent], None]


async def _go() -> None:
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def writer(url: str, tag: str, appends: int, tasks: int, increments: int) -> None:
    """Append from ``tasks`` tasks at once; print what was acknowledged."""
    async with PostgresEventStore(url) as store:
        await _go()
        acked: list[RecordedEvent] = []
        conflicts = 0

        async def task(number: int) -> None:
            own, version = f"{tag}-own{number}", 0
            for n, i in enumerate(range(number, appends, tasks)):
                if n % 2:
                    events = [NewEvent(f"{tag}-{i}-{k}", "Shared", "{}") for k in range(1 + i % 3)]
                    acked.extend(await store.append(Append(f"shared{i % 3}", events, None)))
                else:
                    event = NewEvent(f"{tag}-{i}", "Own", json.dumps({"n": i}))
                    acked.extend(await store.append(Append(own, [event], version)))
                    version += 1

        async def increment(n: int) -> None:
            nonlocal conflicts
            while True:
                version = len(await store.read_stream("counter"))
                event = NewEvent(f"{tag}-counter-{n}", "Counted", "{}")
                try:
                    acked.extend(await store.append(Append("counter", [event], version)))
                    return
                except ConcurrencyError:
                    conflicts += 1

        await asyncio.wait_for(asyncio.gather(*(task(n) for n in range(tasks))), TIMEOUT_S)
        for n in range(increments):
            await asyncio.wait_for(increment(n), TIMEOUT_S)
    print(json.dumps({"acked": [[r.position, r.stream, r.version, r.event_id] for r in acked],
                      "conflicts": conflicts}), flush=True)


async def follower(url: str, total: int) -> None:
    """Follow the log three ways until each follower got ``total`` events; print them."""
    async with (PostgresEventStore(url) as store,
                PostgresEventStore(url, follower_buffer=16) as tiny):

        async def one_by_one(store: PostgresEventStore) -> Followed:
            async with contextlib.aclosing(store.follow()) as it:
                async for record in it:
                    yield [record]

        async def take(it: Followed) -> list[RecordedEvent]:
            got: list[RecordedEvent] = []
            async for batch in it:
                got += batch
                if len(got) >= total:
                    break
            return got

        followed = [one_by_one(store), store.follow_batches(limit=50), one_by_one(tiny)]
        takers = [asyncio.ensure_future(take(it)) for it in followed]
        await asyncio.sleep(0)  # every follower subscribed and reading the (empty) backlog
        await _go()
        try:
            got = await asyncio.wait_for(asyncio.gather(*takers), TIMEOUT_S)
        finally:
            for it in followed:
                await it.aclose()
    print(json.dumps({"followers": [[[r.position, r.event_id] for r in records]
                                    for records in got]}), flush=True)


def events_per_writer(appends: int, tasks: int, increments: int) -> int:
    """How many events one `writer` appends."""
    total = increments
    for number in range(tasks):
        for n, i in enumerate(range(number, appends, tasks)):
            total += 1 + i % 3 if n % 2 else 1
    return total


def main(argv: list[str]) -> None:
    """Run the role named by ``argv[0]``."""
    role, url, *rest = argv
    if role == "writer":
        tag, appends, tasks, increments = rest
        asyncio.run(writer(url, tag, int(appends), int(tasks), int(increments)))
    elif role == "follower":
        asyncio.run(follower(url, int(rest[0])))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
