"""``[market]``: each symbol's tick, the smallest step of its price, by which the panel
rounds every price it shows (``GET /api/market``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.base import ConfigModel
from gateway.market.prices import TICK as DEFAULT_TICK


class SymbolConfig(ConfigModel):
    """One symbol: its tick (a price step: ``0.5`` for BTCUSD in halves, ``0.01`` in cents)."""

    symbol: str = Field(pattern=r"^[A-Za-z0-9._:/\-]{1,32}$")
    tick: float = Field(gt=0, le=1_000_000)


class MarketConfig(ConfigModel):
    """The market's symbols and their ticks; ``tick`` is that of every symbol not listed."""

    tick: float = Field(default=DEFAULT_TICK, gt=0, le=1_000_000)
    symbols: tuple[SymbolConfig, ...] = Field(default=(), max_length=10_000)

    @model_validator(mode="after")
    def _each_once(self) -> MarketConfig:
        seen: set[str] = set()
        for i, entry in enumerate(self.symbols):
            if entry.symbol in seen:
                raise ValueError(f"symbols[{i}].symbol: {entry.symbol} is listed twice; give "
                                 "each symbol one tick")
            seen.add(entry.symbol)
        return self

    def ticks(self) -> dict[str, float]:
        """Each listed symbol's tick."""
        return {entry.symbol: entry.tick for entry in self.symbols}
