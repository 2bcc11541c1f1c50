"""A synthetic market feed for the demo: ticks on a geometric random walk, 1-minute candles.

Seeded, so the same seed and the same sequence of times give the same events. Time comes
from a `gateway.base.clock.Clock`, so tests drive it with a `FakeClock`.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gateway.base.clock import Clock, sleep_or
from gateway.market.events import Candle, MarketEvent, Tick, from_ms

MINUTE_MS = 60_000
YEAR_MS = 365 * 24 * 3_600_000
DEFAULT_SYMBOLS: Mapping[str, float] = {"BTCUSD": 64_000.0, "ETHUSD": 3_100.0}
DEFAULT_VOLATILITY = 0.6
"""Annualised volatility of log returns (0.6 = 60 %, typical of major crypto pairs)."""
MEAN_TRADE_NOTIONAL = 5_000.0
"""Average value of one synthetic trade; a tick's size is drawn around it."""

Sink = Callable[[list[MarketEvent]], Awaitable[None]]
"""Where `SyntheticFeed.run` delivers each batch of events."""


@dataclass(slots=True)
class _Bar:
    start: int
    open: float
    high: float
    low: float
    close: float
    volume: float


@dataclass(slots=True)
class _Walk:
    price: float
    sigma_per_ms: float
    decimals: int
    bar: _Bar | None = None


class SyntheticFeed:
    """Ticks for each symbol every ``tick_ms`` and a 1-minute candle per minute boundary.

    ``volatility`` is annualised (one figure for all symbols, or one per symbol); each tick
    moves the price by a log-normal step scaled to the time since the previous tick, so the
    candles have the spread a real market of that volatility would show.
    """

    def __init__(
        self,
        symbols: Mapping[str, float] | None = None,
        *,
        seed: int | None = 7,
        tick_ms: int = 250,
        volatility: float | Mapping[str, float] = DEFAULT_VOLATILITY,
    ) -> None:
        symbols = dict(DEFAULT_SYMBOLS if symbols is None else symbols)
        if not symbols:
            raise ValueError("a feed needs at least one symbol")
        if tick_ms < 1:
            raise ValueError("tick_ms must be at least 1")
        self.tick_ms = tick_ms
        self._random = random.Random(seed)
        self._last_ms: int | None = None
        self._walks: dict[str, _Walk] = {}
        for symbol, start in symbols.items():
            vol = volatility if isinstance(volatility, float | int) else volatility[symbol]
            if start <= 0 or vol < 0:
                raise ValueError(f"{symbol}: the price must be > 0 and the volatility >= 0")
            decimals = max(2, 5 - math.floor(math.log10(start)))
            self._walks[symbol] = _Walk(start, vol / math.sqrt(YEAR_MS), decimals)

    @property
    def symbols(self) -> list[str]:
        """The symbols this feed quotes, in order."""
        return list(self._walks)

    def next_events(self, now_ms: int) -> list[MarketEvent]:
        """One step at ``now_ms``: the candles of minutes that have closed, then a tick each.

        A candle covers the ticks of one clock minute and is emitted by the first step in a
        later minute; minutes without ticks have no candle.
        """
        elapsed = self.tick_ms if self._last_ms is None else max(0, now_ms - self._last_ms)
        self._last_ms = now_ms
        minute = now_ms - now_ms % MINUTE_MS
        at = from_ms(now_ms)
        candles: list[MarketEvent] = []
        ticks: list[MarketEvent] = []
        for symbol, walk in self._walks.items():
            if walk.bar is not None and minute > walk.bar.start:
                candles.append(_candle(symbol, walk.bar))
                walk.bar = None
            sigma = walk.sigma_per_ms * math.sqrt(elapsed)
            walk.price *= math.exp(sigma * self._random.gauss(0.0, 1.0) - sigma * sigma / 2)
            price = max(round(walk.price, walk.decimals), 10.0**-walk.decimals)
            size = round(self._random.expovariate(walk.price / MEAN_TRADE_NOTIONAL), 6)
            ticks.append(Tick(symbol=symbol, price=price, size=size, at=at))
            bar = walk.bar
            if bar is None:
                walk.bar = _Bar(minute, price, price, price, price, size)
            else:
                bar.high, bar.low = max(bar.high, price), min(bar.low, price)
                bar.close = price
                bar.volume += size
        return candles + ticks

    async def run(self, clock: Clock, sink: Sink, stop: asyncio.Event) -> None:
        """Deliver a step to ``sink`` every ``tick_ms`` of ``clock`` time until ``stop`` is set.

        Setting ``stop`` also wakes a run asleep on the clock; an error from ``sink`` ends it.
        """
        while not stop.is_set():
            await sink(self.next_events(clock.now_ms()))
            if stop.is_set():
                break
            await sleep_or(clock, self.tick_ms, stop)


def _candle(symbol: str, bar: _Bar) -> Candle:
    return Candle(
        symbol=symbol, interval="1m", open=bar.open, close=bar.close, high=bar.high,
        low=bar.low, volume=round(bar.volume, 6), start=from_ms(bar.start),
    )
