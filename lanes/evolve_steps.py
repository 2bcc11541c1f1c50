"""How a run's steps change an agent's state (`lanes.decide_steps` decides them)."""

from __future__ import annotations

from lanes.events import ModelCalled, StepDecided, ToolResultTaken, ToolReturned
from lanes.evolve import EVOLVERS, _input, _run
from lanes.state import AgentState

EVOLVERS.on(ModelCalled, ToolReturned)(_input)


@EVOLVERS.on(StepDecided)
def _step(state: AgentState, event: StepDecided) -> None:
    _run(state, event.run_id, "StepDecided").steps = event.step


@EVOLVERS.on(ToolResultTaken)
def _result(state: AgentState, event: ToolResultTaken) -> None:
    _run(state, event.run_id, "ToolResultTaken")
