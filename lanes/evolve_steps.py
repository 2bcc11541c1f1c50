"""How a run's steps, orders waiting for approval and budget alerts change an agent's state
(`lanes.decide_steps`, `lanes.approvals` and `lanes.spending` decide them)."""

from __future__ import annotations

from lanes.events import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetAlert,
    DeskBudgetApplied,
    DeskBudgetSpent,
    ModelCalled,
    StepDecided,
    TasksFinished,
    TasksScheduled,
    ToolResultTaken,
    ToolReturned,
)
from lanes.evolve import EVOLVERS, _input, _run
from lanes.handlers import IllegalTransition
from lanes.state import AgentState

EVOLVERS.on(ModelCalled, ToolReturned, DeskBudgetSpent)(_input)


@EVOLVERS.on(StepDecided)
def _step(state: AgentState, event: StepDecided) -> None:
    _run(state, event.run_id, "StepDecided").steps = event.step


@EVOLVERS.on(ToolResultTaken)
def _result(state: AgentState, event: ToolResultTaken) -> None:
    _run(state, event.run_id, "ToolResultTaken")


@EVOLVERS.on(TasksScheduled)
def _scheduled(state: AgentState, event: TasksScheduled) -> None:
    run = _run(state, event.run_id, "TasksScheduled")
    run.scheduled = (*run.scheduled, *event.tasks)


@EVOLVERS.on(TasksFinished)
def _tasks_finished(state: AgentState, event: TasksFinished) -> None:
    batch = state.calls.batches.pop(event.batch_id, None)
    if batch is None or batch.open or batch.awaited_by != event.run_id:
        raise IllegalTransition(f"the tasks of {event.batch_id} are not all ended, or not "
                                f"awaited by run {event.run_id}")


@EVOLVERS.on(ApprovalRequested)
def _requested(state: AgentState, event: ApprovalRequested) -> None:
    state.approvals[event.approval_id] = event


@EVOLVERS.on(ApprovalDecided)
def _decided(state: AgentState, event: ApprovalDecided) -> None:
    if state.approvals.pop(event.approval_id, None) is None:
        raise IllegalTransition(f"approval {event.approval_id} is not waiting")
    if state.staged is not None:
        raise IllegalTransition(f"request {state.staged.request_id} was never decided")
    state.staged = event.request  # decided next like a request that arrived
    state.staged_by = None


@EVOLVERS.on(DeskBudgetApplied)
def _desk_budget(state: AgentState, event: DeskBudgetApplied) -> None:
    state.desk_block = (event.until, event.detail) if event.until else None


@EVOLVERS.on(BudgetAlert)
def _budget_alert(state: AgentState, event: BudgetAlert) -> None:
    """Nothing changes: the alert is said (`lanes.spending`)."""
