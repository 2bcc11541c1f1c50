"""The legal transitions of the trading state and of the reasoning lane, and what each queue
mode does, as tables."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from lanes.config import Mode
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
    # So do decisions on approvals (an approved order still meets the trading gate).
    **{(s, ControlAction.APPROVE): s for s in TradingState},
    **{(s, ControlAction.REJECT): s for s in TradingState},
    # The operator's flatten only reduces: legal in every state, HALTED included.
    **{(s, ControlAction.FLATTEN): s for s in TradingState},
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
    (LaneState.RUNNING, "StepDecided"): LaneState.RUNNING,
    (LaneState.RUNNING, "ToolResultTaken"): LaneState.RUNNING,
    (LaneState.RUNNING, "TasksScheduled"): LaneState.RUNNING,
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


@dataclass(frozen=True, slots=True)
class ModeRule:
    """What a queue mode does with the reasoning requests of an agent."""

    steers: bool
    """A request that arrives during a run steers it, if the run can take a steer."""
    interrupts: bool
    """A high-priority request that arrives during a run aborts it and runs next."""
    follows_up: str
    """Why a request that does not interrupt follows up instead (when ``interrupts``)."""
    arrival_order: bool
    """Pending requests run in strict arrival order (else by priority, then arrival)."""
    collects: bool
    """Requests that wait together run as one batch, after a debounce."""


MODES: dict[Mode, ModeRule] = {
    Mode.FOLLOWUP: ModeRule(steers=False, interrupts=False, follows_up="",
                            arrival_order=False, collects=False),
    Mode.QUEUE: ModeRule(steers=False, interrupts=False, follows_up="",
                         arrival_order=True, collects=False),
    Mode.COLLECT: ModeRule(steers=False, interrupts=False, follows_up="",
                           arrival_order=False, collects=True),
    Mode.INTERRUPT: ModeRule(steers=False, interrupts=True,
                             follows_up="only high priority interrupts",
                             arrival_order=False, collects=False),
    Mode.STEER: ModeRule(steers=True, interrupts=True,
                         follows_up="the active run cannot take a steer and only high "
                         "priority interrupts",
                         arrival_order=False, collects=False),
    Mode.STEER_BACKLOG: ModeRule(steers=True, interrupts=False, follows_up="",
                                 arrival_order=False, collects=False),
}
"""Queue mode -> what it does (a run-time request that is not steered nor interrupts waits in
the queue; see the design card for each mode)."""
