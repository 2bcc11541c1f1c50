"""The paper broker: fills at the feed's prices, rests without one, cancels open orders."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.base.clock import FakeClock
from gateway.market.broker import Broker, PaperBroker
from gateway.market.events import Candle, ConnectorStatus, Tick
from lanes.events import BrokerReport, OrderIntent

AT = datetime(2026, 2, 17, 3, 10, tzinfo=UTC)


class Reports:
    """Collects what the broker reports, as (agent, report)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, BrokerReport]] = []

    async def __call__(self, agent_id: str, report: BrokerReport) -> None:
        self.seen.append((agent_id, report))

    def take(self) -> list[tuple[str, str, str, float, float | None]]:
        out: list[tuple[str, str, str, float, float | None]] = [
            (a, r.order_id, r.status, r.filled_qty, r.price) for a, r in self.seen
        ]
        self.seen.clear()
        return out


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000)


@pytest.fixture
def broker(reports: Reports, clock: FakeClock) -> PaperBroker:
    return PaperBroker(reports, clock)


def tick(price: float, symbol: str = "BTCUSD") -> Tick:
    return Tick(symbol=symbol, price=price, at=AT)


def market(side: str = "buy", qty: float = 0.5, symbol: str = "BTCUSD") -> OrderIntent:
    return OrderIntent.model_validate({"symbol": symbol, "side": side, "qty": qty})


def limit(side: str, price: float, qty: float = 1.0) -> OrderIntent:
    return OrderIntent.model_validate(
        {"symbol": "BTCUSD", "side": side, "qty": qty, "orderType": "limit", "limitPrice": price})


def test_the_paper_broker_is_a_broker(broker: PaperBroker) -> None:
    port: Broker = broker
    assert port is broker


async def test_a_market_order_fills_at_the_last_price(
    broker: PaperBroker, reports: Reports, clock: FakeClock
) -> None:
    await broker.on_market_event(tick(64_000))
    await broker.on_market_event(tick(64_010))
    clock.advance(5)
    await broker.place("a1", "o1", market(qty=0.25))
    assert reports.take() == [("a1", "o1", "filled", 0.25, 64_010)]
    assert broker.open_orders() == []


async def test_the_report_carries_the_clock_time(
    broker: PaperBroker, reports: Reports, clock: FakeClock
) -> None:
    await broker.on_market_event(tick(100))
    clock.advance(42)
    await broker.place("a1", "o1", market())
    assert reports.seen[0][1].at == 1_042


async def test_a_candle_close_is_a_price_too(broker: PaperBroker, reports: Reports) -> None:
    candle = Candle(symbol="BTCUSD", interval="1m", open=10, close=11, high=12, low=9,
                    volume=1, start=AT)
    await broker.on_market_event(candle)
    await broker.place("a1", "o1", market())
    assert reports.take() == [("a1", "o1", "filled", 0.5, 11)]


async def test_a_market_order_rests_until_its_symbol_has_a_price(
    broker: PaperBroker, reports: Reports
) -> None:
    await broker.place("a1", "o1", market(side="sell", qty=2))
    await broker.on_market_event(tick(3_000, "ETHUSD"))  # another symbol
    await broker.on_market_event(
        ConnectorStatus(connector="x", status="up", at=AT))
    assert reports.take() == []
    assert [o.order_id for o in broker.open_orders()] == ["o1"]
    await broker.on_market_event(tick(64_000))
    assert reports.take() == [("a1", "o1", "filled", 2, 64_000)]
    await broker.on_market_event(tick(64_001))
    assert reports.take() == []  # filled once


@pytest.mark.parametrize(
    ("side", "limit_price", "prices", "fills_on"),
    [
        ("buy", 99.0, [100.0, 99.5, 98.0], 2),  # buy: price <= limit
        ("buy", 99.0, [100.0, 99.0], 1),
        ("sell", 101.0, [100.0, 100.5, 103.0], 2),  # sell: price >= limit
        ("sell", 101.0, [100.0, 99.0], None),
    ],
)
async def test_a_resting_limit_order_fills_at_its_limit(
    broker: PaperBroker, reports: Reports, side: str, limit_price: float,
    prices: list[float], fills_on: int | None,
) -> None:
    await broker.on_market_event(tick(prices[0]))
    await broker.place("a1", "o1", limit(side, limit_price))
    assert reports.take() == []
    for n, price in enumerate(prices[1:], start=1):
        await broker.on_market_event(tick(price))
        expected = [("a1", "o1", "filled", 1.0, limit_price)] if n == fills_on else []
        assert reports.take() == expected, n


async def test_a_marketable_limit_order_fills_at_once_at_the_last_price(
    broker: PaperBroker, reports: Reports
) -> None:
    await broker.on_market_event(tick(100))
    await broker.place("a1", "o1", limit("buy", 105))
    await broker.place("a1", "o2", limit("sell", 95))
    assert reports.take() == [("a1", "o1", "filled", 1.0, 100), ("a1", "o2", "filled", 1.0, 100)]


async def test_a_limit_order_without_a_limit_price_is_rejected(
    broker: PaperBroker, reports: Reports
) -> None:
    intent = OrderIntent.model_validate(
        {"symbol": "BTCUSD", "side": "buy", "qty": 1, "orderType": "limit"})
    await broker.place("a1", "o1", intent)
    [(_agent, report)] = reports.seen
    assert report.status == "rejected" and report.reason is not None and "limit" in report.reason


async def test_cancel_an_open_order(broker: PaperBroker, reports: Reports) -> None:
    await broker.on_market_event(tick(100))
    await broker.place("a1", "o1", limit("buy", 90))
    await broker.cancel("a1", "o1")
    assert reports.take() == [("a1", "o1", "cancelled", 0.0, None)]
    await broker.on_market_event(tick(80))
    await broker.cancel("a1", "o1")
    assert reports.take() == []  # cancelled orders neither fill nor cancel again


async def test_cancel_unknown_filled_or_foreign_orders_does_nothing(
    broker: PaperBroker, reports: Reports
) -> None:
    await broker.cancel("a1", "nope")
    await broker.on_market_event(tick(100))
    await broker.place("a1", "o1", market())
    reports.take()
    await broker.cancel("a1", "o1")  # already filled
    await broker.place("a1", "o2", limit("buy", 90))
    await broker.cancel("a2", "o2")  # another agent's order
    assert reports.take() == []
    assert [o.order_id for o in broker.open_orders()] == ["o2"]


async def test_placing_the_same_order_id_again_does_nothing(
    broker: PaperBroker, reports: Reports
) -> None:
    await broker.place("a1", "o1", market())
    await broker.place("a1", "o1", market())
    await broker.on_market_event(tick(100))
    await broker.place("a1", "o1", market())
    assert reports.take() == [("a1", "o1", "filled", 0.5, 100)]


async def test_several_resting_orders_fill_in_order_and_a_failing_report_stops_none(
    clock: FakeClock,
) -> None:
    seen: list[str] = []

    async def report(agent_id: str, report: BrokerReport) -> None:
        seen.append(report.order_id)
        if report.order_id == "o1":
            raise RuntimeError("the engine is down")

    broker = PaperBroker(report, clock)
    for n in range(1, 4):
        await broker.place("a1", f"o{n}", market())
    await broker.on_market_event(tick(100))
    assert seen == ["o1", "o2", "o3"]
    assert broker.open_orders() == []
    assert broker.last_price("BTCUSD") == 100 and broker.last_price("ETHUSD") is None


async def test_observe_decides_fills_now_and_reports_them_from_a_task(
    broker: PaperBroker, reports: Reports
) -> None:
    await broker.place("a1", "o1", market())
    assert broker.observe(tick(50, "ETHUSD")) is None  # nothing to fill
    task = broker.observe(tick(100))
    assert task is not None
    assert broker.open_orders() == [] and broker.last_price("BTCUSD") == 100
    await task
    assert reports.take() == [("a1", "o1", "filled", 0.5, 100)]
