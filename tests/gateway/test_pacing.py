"""The pacer: bulk work takes one unit per turn of the event loop, so whatever else becomes
ready meanwhile runs before the rest of it."""

from __future__ import annotations

import asyncio

from gateway.base.pacing import Pacer


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



async def test_no_unit_starts_while_urgent_work_holds_the_pacer() -> None:
    pacer = Pacer()
    order: list[str] = []

    async def bulk() -> None:
        for n in range(3):
            async with pacer.turn():
                order.append(f"unit{n}")

    pacer.hold()  # an emergency stop was decided: its ack is not out yet
    flood = asyncio.create_task(bulk())
    for _ in range(20):  # many turns of the loop: none of them runs a unit
        await asyncio.sleep(0)
    assert order == [] and pacer.turns == 0
    with pacer.urgent():  # a second one, nested
        pacer.release()  # the first one is answered
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == []
    await asyncio.wait_for(flood, 1.0)  # the last one answered: the bulk work goes on
    assert order == ["unit0", "unit1", "unit2"]
