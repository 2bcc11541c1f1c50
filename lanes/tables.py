"""The legal transitions of the trading state and of the reasoning lane, as tables."""

from __future__ import annotations

from enum import StrEnum

from lanes.events import TradingState
from lanes.requests import ControlAction

ACTIVE, REDUCING, HALTED = TradingState.ACTIVE, TradingState.REDUCING, TradingState.HALTED

TRADING_TRANSITIONS: dict[tuple[TradingState, ControlAction], TradingState] = {
    (ACTIVE, ControlAction.EMERGENCY_STOP): HALTED,
    (ACTIVE, ControlAction.PAUSE): REDUCING,
    (ACTIVE, ControlAction.RESUME): ACTIVE,
    (REDUCING, ControlAction.EMERGENCY_STOP): HALTED,
    (REDUCING, ControlAction.PAUSE): REDUCING,
    (REDUCING, ControlAction.RESUME): ACTIVE,
    (HALTED, ControlAction.EMERGENCY_STOP): HALTED,
    (HALTED, ControlAction.RESUME): ACTIVE,
    # Cancels pass in every state and leave it as it is.
    **{(s, ControlAction.CANCEL_ORDER): s for s in TradingState},
    **{(s, ControlAction.CANCEL_ALL): s for s in TradingState},
}
"""(state, action) -> next state. A pair that is missing is refused: see `refusal`."""


def refusal(state: TradingState, action: ControlAction) -> str:
    """Why ``action`` is not legal in ``state`` (only pause while HALTED, today)."""
    return (
        f"{action.value} is not allowed while {state.value}: only resume leaves HALTED; "
        "send resume first"
    )


class LaneState(StrEnum):
    """The reasoning lane: at most one run at a time."""

    IDLE = "idle"
    RUNNING = "running"


LANE_TRANSITIONS: dict[tuple[LaneState, str], LaneState] = {
    (LaneState.IDLE, "RunStarted"): LaneState.RUNNING,
    (LaneState.RUNNING, "RunSteered"): LaneState.RUNNING,
    (LaneState.RUNNING, "SteerabilityChanged"): LaneState.RUNNING,
    (LaneState.RUNNING, "RunCompleted"): LaneState.IDLE,
    (LaneState.RUNNING, "RunFailed"): LaneState.IDLE,
    (LaneState.RUNNING, "RunAborted"): LaneState.IDLE,
}
"""(lane state, run event type) -> next lane state; any other pair is illegal."""


ORDER_REFUSALS: dict[TradingState, str | None] = {
    ACTIVE: None,
    REDUCING: "reduce-only",
    HALTED: "agent is HALTED: no new orders until resume",
}
"""What the trading gate does with a new order intent in each state."""
