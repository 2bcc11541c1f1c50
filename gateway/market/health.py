"""Feed health: what each connector last said of itself, when each symbol's data last came,
and whether hook rules are evaluated (an operator may pause them, e.g. while a feed
misbehaves). Read by ``GET /api/feed`` and the panel; never the source of any decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.market.events import Candle, ConnectorStatus, MarketEvent, Tick, to_ms

STALE_FEED_MS = 30_000
"""A symbol whose last tick or candle came longer ago than this is a stale feed."""
MAX_TRACKED = 4_096
"""Symbols and connectors tracked at most (the newest kept)."""


@dataclass(slots=True)
class _Symbol:
    last_at: int
    """The data's own time (ms)."""
    received: int
    """When the gateway got it (its clock, ms)."""
    price: float
    ticks: int = 0
    candles: int = 0


@dataclass(slots=True)
class _Connector:
    status: str
    detail: str | None
    at: int
    received: int
    changed: int
    """When it last changed status (received time)."""


@dataclass(frozen=True, slots=True)
class HooksState:
    """Whether hook rules are evaluated, and who last changed that, when and why."""

    paused: bool = False
    by: str | None = None
    at: int | None = None
    reason: str | None = None


class FeedHealth:
    """Connectors' statuses and each symbol's latest data, as the feed sent them."""

    def __init__(self, stale_ms: int = STALE_FEED_MS) -> None:
        self.stale_ms = stale_ms
        self._symbols: dict[str, _Symbol] = {}
        self._connectors: dict[str, _Connector] = {}
        self.hooks = HooksState()
        self.suppressed = 0
        """Hook requests not sent while the hooks were paused."""

    def observe(self, event: MarketEvent, now: int) -> None:
        """Take one market event, received at ``now`` (ms)."""
        if isinstance(event, ConnectorStatus):
            known = self._connectors.get(event.connector)
            changed = now if known is None or known.status != event.status else known.changed
            self._connectors[event.connector] = _Connector(
                event.status, event.detail, to_ms(event.at), now, changed)
            _bound(self._connectors)
            return
        symbol, at = event.symbol, to_ms(event.at if isinstance(event, Tick) else event.start)
        price = event.price if isinstance(event, Tick) else event.close
        seen = self._symbols.get(symbol)
        if seen is None:
            seen = self._symbols[symbol] = _Symbol(at, now, price)
            _bound(self._symbols)
        elif at >= seen.last_at:
            seen.last_at, seen.received, seen.price = at, now, price
        if isinstance(event, Candle):
            seen.candles += 1
        else:
            seen.ticks += 1

    def set_hooks(self, paused: bool, by: str, now: int, reason: str | None) -> bool:
        """Pause or resume hook evaluation; False if it already was so (nothing changes)."""
        if self.hooks.paused == paused:
            return False
        self.hooks = HooksState(paused, by, now, reason)
        return True

    def view(self, now: int) -> dict[str, Any]:
        """The feed's health at ``now`` (``GET /api/feed``)."""
        ages = {name: max(0, now - s.received) for name, s in self._symbols.items()}
        symbols = [{"symbol": name, "lastAt": s.last_at, "ageMs": ages[name],
                    "price": s.price, "ticks": s.ticks, "candles": s.candles,
                    "stale": ages[name] > self.stale_ms}
                   for name, s in sorted(self._symbols.items())]
        connectors = [{"connector": name, "status": c.status, "detail": c.detail, "at": c.at,
                       "ageMs": max(0, now - c.received), "sinceMs": max(0, now - c.changed)}
                      for name, c in sorted(self._connectors.items())]
        warnings = [f"connector {c['connector']} is {c['status']}"
                    + (f": {c['detail']}" if c["detail"] else "")
                    for c in connectors if c["status"] != "up"]
        warnings += [f"no data for {name} for {ages[name] // 1000} s (stale after "
                     f"{self.stale_ms // 1000} s)" for name in sorted(ages)
                     if ages[name] > self.stale_ms]
        hooks = self.hooks
        if hooks.paused:
            warnings.append(f"hook rules paused by {hooks.by}"
                            + (f": {hooks.reason}" if hooks.reason else ""))
        return {"at": now, "staleMs": self.stale_ms, "connectors": connectors,
                "symbols": symbols, "warnings": warnings,
                "hooks": {"paused": hooks.paused, "by": hooks.by, "at": hooks.at,
                          "reason": hooks.reason, "suppressed": self.suppressed}}


def _bound(tracked: dict[str, Any]) -> None:
    while len(tracked) > MAX_TRACKED:
        del tracked[min(tracked, key=lambda k: tracked[k].received)]
