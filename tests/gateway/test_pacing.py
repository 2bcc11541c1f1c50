"""The pacer: bulk work takes one short burst per turn of the event loop, so whatever else
becomes ready meanwhile runs before the rest of it."""

from __future__ import annotations

import asyncio

from gateway.base.pacing import Pacer


async def test_work_that_becomes_ready_runs_between_units_not_after_them() -> None:
    pacer = Pacer(burst_s=0)  # (a burst of one unit: each on a turn of its own)
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
    pacer = Pacer(burst_s=0.001, clock=lambda: 0.0)  # (every unit within the burst)
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


async def test_units_within_a_burst_run_in_its_turn_and_the_next_waits_for_a_fresh_one(
) -> None:
    now = [0.0]
    pacer = Pacer(burst_s=0.001, clock=lambda: now[0])
    order: list[str] = []
    loop = asyncio.get_running_loop()

    async def bulk() -> None:
        for n in range(6):
            async with pacer.turn():
                order.append(f"unit{n}")
                if n == 0:  # a control frame becomes ready during the first unit
                    loop.call_soon(order.append, "stop")
                now[0] += 0.0004  # each unit takes 0.4 ms of the clock

    await asyncio.wait_for(bulk(), 1.0)
    # A burst is the units that start within 1 ms of its first: three of 0.4 ms; the fourth
    # waits for a fresh turn, so the stop that became ready meanwhile runs before it.
    assert order == ["unit0", "unit1", "unit2", "stop", "unit3", "unit4", "unit5"]
    assert pacer.turns == 6


async def test_a_burst_ends_with_its_turn_and_a_hold_ends_it_at_once() -> None:
    pacer = Pacer(burst_s=1.0, clock=lambda: 0.0)  # (every unit within the burst's time)
    order: list[str] = []

    async def unit(name: str) -> None:
        async with pacer.turn():
            order.append(name)

    await unit("a")
    await unit("b")  # the same turn as a: no turn of the loop in between
    assert order == ["a", "b"]
    await asyncio.sleep(0)  # the turn is over: the burst ended with it
    later = asyncio.create_task(unit("c"))
    other = asyncio.create_task(unit_marker(order))
    await asyncio.gather(later, other)
    assert order == ["a", "b", "mark", "c"]  # c waited for a fresh turn: the mark ran first
    pacer.hold()  # urgent work: no unit starts, whatever the burst
    held = asyncio.create_task(unit("d"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert "d" not in order
    pacer.release()
    await asyncio.wait_for(held, 1.0)
    assert order[-1] == "d"


async def unit_marker(order: list[str]) -> None:
    """Work that became ready beside the bulk work."""
    order.append("mark")


async def test_a_unit_cancelled_while_it_waits_lets_the_next_one_go() -> None:
    pacer = Pacer(burst_s=0.001, clock=lambda: 0.0)
    ran: list[str] = []

    async def unit(name: str) -> None:
        async with pacer.turn():
            ran.append(name)

    pacer.hold()  # the first unit waits inside its turn, holding the pacer's lock
    waiting = asyncio.create_task(unit("cancelled"))
    for _ in range(3):
        await asyncio.sleep(0)
    behind = asyncio.create_task(unit("next"))
    await asyncio.sleep(0)
    waiting.cancel()
    pacer.release()
    await asyncio.wait_for(behind, 1.0)
    assert waiting.cancelled() and ran == ["next"] and pacer.turns == 1
    async with pacer.turn():  # and the pacer is free
        ran.append("later")
    assert ran == ["next", "later"]
