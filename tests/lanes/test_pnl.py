"""P&L folded from fills and marked to a price: realized + unrealized is the cash the fills
paid and received plus what is held at the mark, for any sequence of priced fills."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from lanes.blotter import Position
from lanes.pnl import Mark, mark, totals

prices = st.floats(min_value=0.01, max_value=100_000, allow_nan=False)
fills = st.lists(st.tuples(st.sampled_from([-1, 1]),
                           st.floats(min_value=0.001, max_value=1_000), prices),
                 min_size=1, max_size=40)


@given(fills, prices)
def test_realized_plus_unrealized_is_the_cash_of_the_fills_plus_the_holding_at_the_mark(
        sequence: list[tuple[int, float, float]], price: float) -> None:
    position, cash = Position("BTCUSD"), 0.0
    for sign, qty, fill_price in sequence:
        position.apply(sign * qty, fill_price)
        cash -= sign * qty * fill_price
    row = mark(position, Mark(price, 0), now=0, stale_ms=1)
    assert row.complete and row.unrealized is not None
    expected = cash + position.net_qty * price
    scale = sum(qty * p for _, qty, p in sequence) + abs(position.net_qty) * price
    assert math.isclose(row.realized + row.unrealized, expected, abs_tol=1e-6 * scale)


def test_a_round_trip_realizes_the_difference_and_leaves_nothing_unrealized() -> None:
    position = Position("ETHUSD")
    position.apply(2, 100.0)
    position.apply(1, 130.0)  # average 110
    position.apply(-3, 120.0)
    row = mark(position, Mark(500.0, 0), now=0, stale_ms=1)
    assert row.net_qty == 0 and row.unrealized == 0 and not row.stale
    assert math.isclose(row.realized, 30.0)


def test_a_short_gains_as_the_price_falls_and_a_stale_or_missing_mark_is_said() -> None:
    position = Position("BTCUSD")
    position.apply(-2, 100.0)
    row = mark(position, Mark(90.0, 1_000), now=62_000, stale_ms=60_000)
    assert row.unrealized == 20.0 and row.market_value == -180.0 and row.exposure == 180.0
    assert row.stale
    unknown = mark(position, None, now=0, stale_ms=60_000)
    assert unknown.unrealized is None and unknown.stale
    summed = totals([row, unknown])
    assert summed.unrealized == 20.0 and not summed.complete and summed.stale


def test_a_fill_without_a_price_makes_the_pnl_incomplete() -> None:
    position = Position("BTCUSD")
    position.apply(1, None)
    position.apply(-1, 100.0)
    assert not mark(position, Mark(100.0, 0), 0, 1).complete
