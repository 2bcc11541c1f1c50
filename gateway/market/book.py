"""What the feed said, kept for the agents' tools: each symbol's latest tick and its latest
candles per interval (bounded), read by ``market_snapshot`` and ``candles``."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from gateway.market.events import Candle, MarketEvent, Tick, from_ms, iso, to_ms
from gateway.market.prices import TICK, PriceWords

CANDLES_KEPT = 500
"""Candles kept per symbol and interval (the most a ``candles`` call returns)."""
STALE_MS = 60_000
"""A price older than this is marked stale."""


class MarketBook:
    """The latest market data by symbol, from every market event the gateway sees."""

    def __init__(self, stale_ms: int = STALE_MS, ticks: Mapping[str, float] | None = None,
                 tick: float = TICK) -> None:
        self.stale_ms = stale_ms
        self.ticks = dict(ticks or {})
        """Each symbol's tick (its smallest price step), from ``[market]``..."""
        self.tick = tick
        """... and that of a symbol not listed."""
        self.words = PriceWords(tick, self.ticks)
        """Prices in words, to these ticks."""
        self._ticks: dict[str, Tick] = {}
        self._candles: dict[tuple[str, str], deque[Candle]] = {}

    def observe(self, event: MarketEvent) -> None:
        """Keep what a market event says (connector statuses carry no prices)."""
        if isinstance(event, Tick):
            last = self._ticks.get(event.symbol)
            if last is None or event.at >= last.at:
                self._ticks[event.symbol] = event
        elif isinstance(event, Candle):
            kept = self._candles.setdefault((event.symbol, event.interval),
                                            deque(maxlen=CANDLES_KEPT))
            if kept and kept[-1].start == event.start:
                kept[-1] = event  # (the same bar, updated)
            elif not kept or event.start > kept[-1].start:
                kept.append(event)

    def tick_of(self, symbol: str) -> float:
        """The smallest step of ``symbol``'s price."""
        return self.words.tick_of(symbol)

    def symbols(self) -> list[str]:
        """The symbols seen, sorted."""
        return sorted({*self._ticks, *(symbol for symbol, _ in self._candles)})

    def price(self, symbol: str) -> tuple[float, int] | None:
        """The latest price of ``symbol`` and when (ms), from a tick or else a candle."""
        tick = self._ticks.get(symbol)
        closes = [kept[-1] for (s, _), kept in self._candles.items() if s == symbol and kept]
        latest = max(closes, key=lambda c: to_ms(c.start), default=None)
        if tick is not None and (latest is None or to_ms(tick.at) >= to_ms(latest.start)):
            return tick.price, to_ms(tick.at)
        if latest is not None:
            return latest.close, to_ms(latest.start)
        return None

    def snapshot(self, symbol: str, now_ms: int) -> dict[str, Any] | None:
        """``market_snapshot``'s answer for ``symbol`` (None: nothing seen for it)."""
        seen = self.price(symbol)
        if seen is None:
            return None
        price, at = seen
        age = max(0, now_ms - at)
        return {"symbol": symbol, "price": price, "at": iso(from_ms(at)), "ageMs": age,
                "stale": age > self.stale_ms}

    def candles(self, symbol: str, interval: str, count: int) -> list[dict[str, Any]]:
        """The latest ``count`` candles of ``symbol`` at ``interval``, oldest first."""
        kept = self._candles.get((symbol, interval), ())
        chosen = list(kept)[-count:] if count > 0 else []
        return [{"start": iso(c.start), "open": c.open, "high": c.high, "low": c.low,
                 "close": c.close, "volume": c.volume} for c in chosen]

