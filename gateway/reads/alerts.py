"""Alerts: the events of the log a desk wants to hear of at once (a halt, an order refused,
a provider's breaker opening, a budget's threshold or hold, an order waiting for a human),
in words, read from the log itself (so the history survives a restart), and the feed's own
(a connector not up, a symbol gone quiet), which the log does not hold.

`alert_of` reads an event's stored JSON without decoding it (any stream, agents' and
gates'); an `AlertBook` keeps the newest alerts of the log's last `HISTORY_WINDOW` events.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import ValidationError

from gateway.market.prices import PLAIN, PriceWords
from lanes.vocabulary import OrderIntent
from store.port import LogReads, RecordedEvent

Severity = Literal["critical", "warning", "info"]
KINDS = ("halt", "order_rejected", "breaker_open", "budget", "approval_waiting",
         "connector", "stale_feed")
"""Every kind of alert (an ``[alerts]`` rule each)."""
HISTORY_WINDOW = 50_000
"""Events of the log's end an `AlertBook` first reads."""
READ_PAGE = 5_000
TYPES = frozenset({"ControlApplied", "OrderRejected", "OrderClosed", "BreakerOpened",
                   "BudgetAlert", "RunsHeld", "DeskBudgetApplied", "ApprovalRequested",
                   "DeskKilled"})
"""The event types an alert can come from."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert: what, how bad, of which agent (or provider), when and where in the log."""

    id: str
    kind: str
    severity: Severity
    at: int
    text: str
    agent_id: str | None = None
    position: int | None = None

    def json(self) -> dict[str, Any]:
        """As sent (camelCase keys)."""
        data = asdict(self)
        data["agentId"] = data.pop("agent_id")
        return data


def alert_of(record: RecordedEvent, words: PriceWords = PLAIN) -> Alert | None:
    """The alert an event of the log is, if it is one (prices to the ticks of ``words``)."""
    if record.type not in TYPES:
        return None
    data = json.loads(record.data)
    made = _said(record.type, record.stream, data, words)
    if made is None:
        return None
    kind, severity, text = made
    agent = None if record.stream.startswith(("provider:", "gateway:")) else record.stream
    return Alert(f"log-{record.position}", kind, severity, record.recorded_at, text, agent,
                 record.position)


def _said(kind: str, stream: str, data: dict[str, Any], words: PriceWords
          ) -> tuple[str, Severity, str] | None:
    if kind == "ControlApplied":
        if data.get("to_state") == "HALTED" and data.get("from_state") != "HALTED":
            return "halt", "critical", f"{stream} HALTED ({data.get('action')})"
        return None
    if kind == "DeskKilled":
        return "halt", "critical", "desk kill: every agent in scope halted"
    if kind == "OrderRejected":
        return "order_rejected", "warning", (f"{stream}: order "
                                             f"{_order(data.get('intent'), words)} refused by "
                                             f"the trading gate: {data.get('reason')}")
    if kind == "OrderClosed":
        if data.get("status") != "rejected":
            return None
        return "order_rejected", "warning", (f"{stream}: order {data.get('order_id')} rejected "
                                             f"by the broker: {data.get('reason') or '?'}")
    if kind == "BreakerOpened":
        return "breaker_open", "critical", (f"{stream}: breaker open ({data.get('reason')}), "
                                            "no call granted until it cools down")
    if kind == "BudgetAlert":
        return "budget", "warning", (f"{stream}: {data.get('budget')} at "
                                     f"{round(float(data.get('fraction', 0)) * 100)}% this "
                                     f"{data.get('window')}")
    if kind == "RunsHeld":
        return "budget", "critical", (f"{stream}: runs held until resume, provider "
                                      f"{data.get('provider')} refused for spend")
    if kind == "DeskBudgetApplied":
        if not data.get("until"):
            return None
        return "budget", "warning", f"{stream}: runs held by the {data.get('detail')}"
    if kind == "ApprovalRequested":
        value = data.get("notional")
        worth = f" (notional {words.money(value)})" if isinstance(value, int | float) else ""
        return "approval_waiting", "info", (f"{stream}: order "
                                            f"{_order(data.get('intent'), words)}{worth} "
                                            f"waits for approval {data.get('approval_id')}")
    return None


def _order(intent: Any, words: PriceWords) -> str:
    if not isinstance(intent, dict):
        return "?"
    try:
        return words.intent(OrderIntent.model_validate(intent))
    except ValidationError:  # (an intent of an older shape: as it is)
        return f"{intent.get('side')} {intent.get('qty')} {intent.get('symbol')}"


KEPT = 5_000
"""Alerts an `AlertBook` keeps (the newest)."""


class AlertBook:
    """The log's alerts, read once from the last `HISTORY_WINDOW` events and then only from
    what was appended since (a cache of a read of the log, never the source of truth)."""

    def __init__(self, words: PriceWords = PLAIN) -> None:
        self._words = words
        self._alerts: deque[Alert] = deque(maxlen=KEPT)
        self._position = 0
        self._lock = asyncio.Lock()

    async def newest(self, log: LogReads, limit: int, kinds: Iterable[str] = KINDS,
                     agents: Iterable[str] | None = None) -> list[Alert]:
        """The newest ``limit`` alerts, newest first (of ``kinds``; of ``agents`` only, and
        no provider's, if given)."""
        async with self._lock:  # (two reads of the same new events would keep them twice)
            last = await log.last_position()
            after = max(self._position, last - HISTORY_WINDOW)
            while after < last:
                page = await log.read(after, READ_PAGE)
                if not page:
                    break
                self._alerts.extend(a for r in page
                                    if (a := alert_of(r, self._words)) is not None)
                after = page[-1].position
            self._position = max(self._position, after)
        wanted, scope = set(kinds), None if agents is None else set(agents)
        found = [a for a in reversed(self._alerts) if a.kind in wanted
                 and (scope is None or a.agent_id in scope)]
        return found[:limit]
