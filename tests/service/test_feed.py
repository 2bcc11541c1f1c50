"""The synthetic feed: seeded random walks, 1-minute candles, driven by a fake clock."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics

import pytest

from gateway.base.clock import FakeClock
from gateway.market.events import Candle, MarketEvent, Tick, to_ms
from gateway.market.feed import MINUTE_MS, SyntheticFeed

TIMEOUT = 10.0
START = 1_771_297_800_000 + 15_000  # 15 s into a minute


def run_steps(feed: SyntheticFeed, steps: int, start: int = START) -> list[MarketEvent]:
    events: list[MarketEvent] = []
    for n in range(steps):
        events += feed.next_events(start + n * feed.tick_ms)
    return events


def test_the_same_seed_gives_the_same_events() -> None:
    one = run_steps(SyntheticFeed(seed=3), 600)
    assert one == run_steps(SyntheticFeed(seed=3), 600)
    assert one != run_steps(SyntheticFeed(seed=4), 600)


def test_a_tick_per_symbol_per_step_at_the_step_time() -> None:
    feed = SyntheticFeed()
    events = feed.next_events(START)
    assert [(e.symbol, to_ms(e.at)) for e in events if isinstance(e, Tick)] == [
        ("BTCUSD", START), ("ETHUSD", START)]
    assert [e.price for e in events if isinstance(e, Tick)] == pytest.approx(
        [64_000, 3_100], rel=1e-3)


def test_candles_close_at_minute_boundaries_with_consistent_ohlc() -> None:
    feed = SyntheticFeed(symbols={"BTCUSD": 64_000.0}, tick_ms=250)
    ticks: list[Tick] = []
    candles: list[Candle] = []
    for n in range(4 * 60 * 3 + 1):  # three minutes and a bit
        now = START + n * 250
        for event in feed.next_events(now):
            if isinstance(event, Candle):
                assert to_ms(event.start) + MINUTE_MS <= now  # emitted once the minute ended
                candles.append(event)
            else:
                assert isinstance(event, Tick)
                ticks.append(event)
    assert [to_ms(c.start) % MINUTE_MS for c in candles] == [0, 0, 0]
    assert len(candles) == 3
    for candle in candles:
        start = to_ms(candle.start)
        inside = [t for t in ticks if start <= to_ms(t.at) < start + MINUTE_MS]
        prices = [t.price for t in inside]
        assert candle.interval == "1m" and candle.symbol == "BTCUSD"
        assert (candle.open, candle.close) == (prices[0], prices[-1])
        assert (candle.high, candle.low) == (max(prices), min(prices))
        assert candle.volume == pytest.approx(sum(t.size for t in inside))
    assert len([t for t in ticks if to_ms(candles[1].start) <= to_ms(t.at)
                < to_ms(candles[1].start) + MINUTE_MS]) == 240


def test_a_jump_over_empty_minutes_closes_only_the_minute_with_ticks() -> None:
    feed = SyntheticFeed(symbols={"BTCUSD": 64_000.0})
    feed.next_events(START)
    events = feed.next_events(START + 5 * MINUTE_MS)
    assert [type(e) for e in events] == [Candle, Tick]


def test_the_walk_has_the_volatility_it_was_given() -> None:
    volatility = 0.8
    feed = SyntheticFeed(symbols={"X": 1_000.0}, volatility=volatility, tick_ms=1_000, seed=1)
    prices = [e.price for e in run_steps(feed, 20_001) if isinstance(e, Tick)]
    returns = [math.log(b / a) for a, b in itertools.pairwise(prices)]
    per_second = statistics.pstdev(returns)
    annualised = per_second * math.sqrt(365 * 24 * 3_600)
    assert annualised == pytest.approx(volatility, rel=0.05)
    assert all(p > 0 for p in prices)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="symbol"):
        SyntheticFeed(symbols={})
    with pytest.raises(ValueError, match="tick_ms"):
        SyntheticFeed(tick_ms=0)
    with pytest.raises(ValueError, match="volatility"):
        SyntheticFeed(volatility={"BTCUSD": -1.0, "ETHUSD": 0.5})


async def test_run_steps_on_the_clock_and_stops_on_the_stop_event() -> None:
    clock = FakeClock(START)
    feed = SyntheticFeed(tick_ms=250)
    batches: asyncio.Queue[list[MarketEvent]] = asyncio.Queue()

    async def sink(events: list[MarketEvent]) -> None:
        await batches.put(events)

    stop = asyncio.Event()
    task = asyncio.create_task(feed.run(clock, sink, stop))
    first = await asyncio.wait_for(batches.get(), TIMEOUT)
    assert {to_ms(e.at) for e in first if isinstance(e, Tick)} == {START}
    assert batches.empty()  # nothing more until the clock moves
    with_candles: dict[int, list[str]] = {}
    for n in range(1, 4 * 60):
        clock.advance(250)
        batch = await asyncio.wait_for(batches.get(), TIMEOUT)
        assert {to_ms(e.at) for e in batch if isinstance(e, Tick)} == {START + n * 250}
        if candles := [e.symbol for e in batch if isinstance(e, Candle)]:
            with_candles[n] = candles
    assert with_candles == {180: ["BTCUSD", "ETHUSD"]}  # 45 s in: the minute boundary
    stop.set()  # the run is asleep on the clock: the stop event wakes it
    await asyncio.wait_for(task, TIMEOUT)
    assert batches.empty()


async def test_run_stops_when_the_stop_is_set_inside_the_sink() -> None:
    clock = FakeClock(START)
    stop = asyncio.Event()
    calls = 0

    async def sink(events: list[MarketEvent]) -> None:
        nonlocal calls
        calls += 1
        stop.set()

    await asyncio.wait_for(SyntheticFeed().run(clock, sink, stop), TIMEOUT)
    assert calls == 1
