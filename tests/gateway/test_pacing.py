"""The pacer: bulk work takes one unit per turn of the event loop, so whatever else becomes
ready meanwhile runs before the rest of it."""

from __future__ import annotations

import asyncio

from gateway.pacing import Pacer


async def test_work_that_becomes_ready_runs_between_units_not_after_them() -> None:
    pacer = Pacer()
    order: list[str] = []

    async def bulk(name: str) -> None:
        for n in range(5):
            async with pacer.turn():
                order.append(f"{name}{n}")

    async def control() -> None:
        order.append("stop")

    flood = [asyncio.create_task(bulk("a")), asyncio.create_task(bulk("b"))]
    await asyncio.sleep(0)  # the bulk work has begun
    await asyncio.sleep(0)
    stop = asyncio.create_task(control())
    await asyncio.gather(*flood, stop)
    assert order.index("stop") <= 2  # it waited for at most a unit or two, never all ten
    assert sorted(order) == sorted(["stop", *(f"a{n}" for n in range(5)),
                                    *(f"b{n}" for n in range(5))])
    # The two bulk tasks took turns: neither ran all of its units at once.
    assert order.index("b0") < order.index("a4") and pacer.turns == 10

