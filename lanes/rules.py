"""Policy rules shared by `decide` and `evolve`: dedupe keys, queue order, caps, budgets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lanes.config import DAY_MS, HOUR_MS, AgentConfig, DedupeStrategy, DropPolicy, Mode
from lanes.requests import RANK, AgentRequest, Kind, Priority
from lanes.spending import spend_blocks
from lanes.state import AgentState, Pending
from lanes.tables import MODES, ORDER_REFUSALS
from lanes.vocabulary import OrderIntent


def dedupe_key(request: AgentRequest, config: AgentConfig) -> str | None:
    """The key a redelivery of ``request`` would share, or None if it is not deduped."""
    strategy = config.dedupe[request.kind]
    if strategy is DedupeStrategy.DEDUPE_KEY and request.dedupe_key is not None:
        return "k:" + request.dedupe_key
    if strategy is DedupeStrategy.MESSAGE_ID and request.message_id is not None:
        return "m:" + request.message_id
    return None


def fingerprint(request: AgentRequest) -> str:
    """What must match for a resubmission to count as the same request (the time may not:
    a client that resends fills ``createdAt`` anew)."""
    kind = request.kind
    action = request.payload.get("action", "") if kind == Kind.USER_CONTROL else ""
    # (a StrEnum formats as its value: the same text as ``.value``, without the lookup)
    return (f"{kind}|{request.priority}|{action}|"
            f"{request.dedupe_key or ''}|{request.message_id or ''}")


def insert_index(pending: Sequence[Pending], request: AgentRequest, mode: Mode) -> int:
    """Where an arriving request goes: ``queue`` mode at the end (strict arrival order),
    every other mode after the last request of the same or a higher priority."""
    index = len(pending)
    if MODES[mode].arrival_order:
        return index
    rank = RANK[request.priority]
    while index > 0 and RANK[pending[index - 1].request.priority] < rank:
        index -= 1
    return index


@dataclass(frozen=True, slots=True)
class Victim:
    """The request a cap drops: a pending one (by index) or the incoming one (index None)."""

    index: int | None
    priority: Priority


def cap_victim(
    pending: Sequence[Pending], incoming: AgentRequest, policy: DropPolicy
) -> Victim | None:
    """Which request to drop when the queue is full, or None if all are high priority.

    ``low`` goes first, then ``normal``; ``high`` is never dropped by a cap. Within the
    lowest class present, ``new`` drops the newest and ``old``/``summarize`` the oldest.
    The incoming request is the newest of all.
    """
    # Runs on every arrival at a full queue (a flood): the scans are list searches, in C,
    # and the priorities are compared by identity (hashing an enum member runs Python).
    priorities = [entry.request.priority for entry in pending]
    lowest = _LOW if _LOW in priorities else _NORMAL if _NORMAL in priorities else None
    priority = incoming.priority
    if priority is not _HIGH and (lowest is None or (priority is _LOW and lowest is _NORMAL)):
        return Victim(None, priority)  # the incoming one is of a lower class than any
    if lowest is None:
        return None
    if policy is _NEW:
        if priority is lowest:
            return Victim(None, priority)
        priorities.reverse()
        return Victim(len(priorities) - 1 - priorities.index(lowest), lowest)
    return Victim(priorities.index(lowest), lowest)


_HIGH, _NORMAL, _LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
_NEW = DropPolicy.NEW


@dataclass(frozen=True, slots=True)
class BudgetBlock:
    """Why runs cannot start now, and when they can again."""

    reason: Literal["hourly", "daily", "cooldown", "tokens", "spend", "desk"]
    until: int
    detail: str


def _window_block(starts: Sequence[int], now: int, limit: int | None, span: int) -> int | None:
    """When the window frees a run, if ``limit`` runs already started within ``span``."""
    if limit is None or len(starts) < limit:
        return None
    # The limit-th most recent start must have left the window before another may start.
    edge = starts[len(starts) - limit]
    return edge + span if edge > now - span else None


def budget_block(state: AgentState) -> BudgetBlock | None:
    """The budget that holds runs back at ``state.now``, the one that frees last."""
    budgets = state.config.budgets
    now = state.now
    blocks: list[BudgetBlock] = []
    if now < state.cooldown_until:
        blocks.append(
            BudgetBlock(
                "cooldown",
                state.cooldown_until,
                f"cooling down {budgets.no_trade_cooldown_ms} ms after a no-trade run",
            )
        )
    hour = _window_block(state.run_starts, now, budgets.max_runs_per_hour, HOUR_MS)
    if hour is not None:
        blocks.append(
            BudgetBlock(
                "hourly",
                hour,
                f"{budgets.max_runs_per_hour}/{budgets.max_runs_per_hour} runs this hour",
            )
        )
    day = _window_block(state.run_starts, now, budgets.max_runs_per_day, DAY_MS)
    if day is not None:
        blocks.append(
            BudgetBlock(
                "daily", day, f"{budgets.max_runs_per_day}/{budgets.max_runs_per_day} runs today"
            )
        )
    if budgets.spending:
        blocks += spend_blocks(state)
    desk = state.desk_block
    if desk is not None and now < desk[0]:
        blocks.append(BudgetBlock("desk", desk[0], desk[1]))
    return max(blocks, key=lambda b: b.until, default=None)


def batch_size(pending: Sequence[Pending]) -> int:
    """How many pending requests the next run takes: the collect prefix, or just the head."""
    if not pending or pending[0].mode is not Mode.COLLECT:
        return min(1, len(pending))
    size = 0
    while size < len(pending) and pending[size].mode is Mode.COLLECT:
        size += 1
    return size


def order_refusal(state: AgentState, intent: OrderIntent) -> str | None:
    """Why the trading gate refuses this intent now, or None to accept it."""
    rule = ORDER_REFUSALS[state.trading]
    if rule != "reduce-only":
        return rule
    position = state.positions.get(intent.symbol, 0.0)
    reducing_side = "sell" if position > 0 else "buy"
    if position == 0 or intent.side != reducing_side:
        return (
            f"agent is REDUCING: only orders that reduce the {intent.symbol} position "
            f"({position:g}) are allowed"
        )
    reserved = sum(
        o.intent.qty - o.filled_qty
        for o in state.orders.values()
        if o.intent.symbol == intent.symbol and o.intent.side == reducing_side
    )
    available = abs(position) - reserved
    if intent.qty > available:
        return (
            f"agent is REDUCING: {intent.side} {intent.qty:g} {intent.symbol} would exceed the "
            f"reducible position ({available:g} left after open orders)"
        )
    return None
