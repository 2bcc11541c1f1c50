"""A run's steps, as `decide` takes them: a model call and the tool calls it asks for, and
each tool's result (split out of `lanes.decide`).

A run whose agent has tools (`lanes.config.AgentConfig.tools`) is a loop: a model call, the
tools it asks for, their results, the next model call, until an answer without tools or the
step budget (``max_steps``). The shell makes the calls and runs the tools; every step comes
back here as an input, and the rules are applied here, so a log re-decides exactly:

- a tool call is refused (the model is told why, the run goes on) when its arguments are not
  a JSON object, the tool is not the agent's, its arguments are not the tool's, or the step
  is past the budget;
- ``place_order`` goes through the trading gate at once (`OrderAccepted`, with the id
  ``<run>-s<step>-<n>``, or `OrderRejected`; or it waits for approval: `lanes.approvals`),
  ``cancel_order`` names one of the agent's open
  orders (`OrderCancelRequested`); both only while the run is the active one, so after a
  stop (which aborts the run first) no step of it places or cancels anything;
- a step or result of a run that is not the active one is ignored (`RunResultIgnored`).
"""

from __future__ import annotations

from lanes.approvals import place
from lanes.decide import DECIDERS, Emit, _not_active
from lanes.decide_calls import send_tasks
from lanes.events import (
    ModelCalled,
    OrderCancelRequested,
    RunResultIgnored,
    StepDecided,
    TasksScheduled,
    ToolCallMade,
    ToolRefusal,
    ToolResultTaken,
    ToolReturned,
)
from lanes.requests import WireModel
from lanes.state import AgentState
from lanes.tools import (
    TOOLS,
    CancelArguments,
    ScheduleArguments,
    ToolArgumentError,
    tool_arguments,
)
from lanes.vocabulary import OrderIntent


class McpArguments(WireModel):
    """The arguments of a call of an MCP tool: its server checks them, not the core."""


def order_id(run_id: str, step: int, number: int) -> str:
    """The id of the ``number``-th order (from 1) a run's step ``step`` placed."""
    return f"{run_id}-s{step}-{number}"


@DECIDERS.on(ModelCalled)
def _model_called(state: AgentState, event: ModelCalled, emit: Emit) -> None:
    stale = _not_active(state, event.run_id)
    run = state.active
    if stale is None and run is not None and event.step != run.steps + 1:
        stale = f"step {event.step} of run {event.run_id} is out of order " \
                f"(the next is {run.steps + 1})"
    if stale is not None:
        emit(RunResultIgnored(run_id=event.run_id, reason=stale))
        return
    allowed: list[str] = []
    refused: list[ToolRefusal] = []
    orders: list[OrderIntent] = []
    cancels: list[str] = []
    tasks: list[tuple[str, ScheduleArguments | None]] = []
    waiting = 0 if run is None else len(run.scheduled)
    for call in event.tool_calls:
        arguments, problem = _checked(state, event.step, call)
        if arguments is not None and call.name in _TASK_TOOLS:
            problem, waiting = _tasks_checked(state, arguments, waiting)
            if problem:
                arguments = None
        if arguments is None:
            refused.append(ToolRefusal(call_id=call.call_id, error=problem))
            continue
        allowed.append(call.call_id)
        if isinstance(arguments, OrderIntent):
            orders.append(arguments)
        elif isinstance(arguments, CancelArguments):
            cancels.append(arguments.order_id)
        elif call.name in _TASK_TOOLS:
            tasks.append((call.call_id, arguments if isinstance(arguments, ScheduleArguments)
                          else None))
    emit(StepDecided(run_id=event.run_id, step=event.step, allowed=tuple(allowed),
                     refused=tuple(refused)))
    for number, intent in enumerate(orders, start=1):
        place(state, order_id(event.run_id, event.step, number), event.run_id, intent,
              event.prices, emit)
    for cancelled in cancels:
        if not state.orders[cancelled].cancel_requested:
            emit(OrderCancelRequested(order_id=cancelled, by=event.run_id))
    for call_id, scheduled in tasks:  # (in the model's order: scheduled, then sent)
        if scheduled is None:
            send_tasks(state, event.run_id, event.step, emit)
        else:
            emit(TasksScheduled(run_id=event.run_id, step=event.step, call_id=call_id,
                                tasks=tuple(scheduled.tasks)))


_TASK_TOOLS = ("schedule_tasks", "execute_scheduled_tasks")


def _tasks_checked(state: AgentState, arguments: WireModel, waiting: int) -> tuple[str, int]:
    """Why a ``schedule_tasks`` or ``execute_scheduled_tasks`` call is refused ("" if it is
    not), and how many tasks then wait to be sent."""
    run = state.active
    assert run is not None
    if isinstance(arguments, ScheduleArguments):
        limit = state.config.max_calls_per_run
        if run.sent + waiting + len(arguments.tasks) > limit:
            return (f"fan-out limit: a run makes at most {limit} calls (max_calls_per_run); "
                    f"this one sent {run.sent} and has {waiting} scheduled"), waiting
        return "", waiting + len(arguments.tasks)
    if waiting == 0:
        return "no tasks are scheduled: call schedule_tasks first", waiting
    return "", 0


def _checked(state: AgentState, step: int, call: ToolCallMade
             ) -> tuple[WireModel, str] | tuple[None, str]:
    """A tool call's arguments, checked (and "" for no problem); or None and why the agent's
    rules refuse the call."""
    config = state.config
    if step > config.max_steps:
        return None, f"the run's step budget ({config.max_steps} model calls) is spent"
    if call.malformed is not None:
        return None, f"the arguments are not a JSON object: {call.malformed[:200]}"
    if call.name in config.mcp_tools or call.name in config.worker_tools:
        return McpArguments(), ""  # (its server, or the worker, checks its arguments)
    if call.name not in config.tools:
        offered = ", ".join((*config.tools, *config.mcp_tools, *config.worker_tools)) \
            or "none"
        kind = "is not one of this agent's tools" if call.name in TOOLS else "does not exist"
        return None, f"the tool {call.name!r} {kind} (its tools: {offered})"
    try:
        arguments = tool_arguments(call.name, call.arguments)
    except ToolArgumentError as error:
        return None, str(error)
    if isinstance(arguments, CancelArguments) and arguments.order_id not in state.orders:
        return None, f"no open order {arguments.order_id!r} of this agent"
    return arguments, ""


@DECIDERS.on(ToolReturned)
def _tool_returned(state: AgentState, event: ToolReturned, emit: Emit) -> None:
    stale = _not_active(state, event.run_id)
    if stale is not None:
        emit(RunResultIgnored(run_id=event.run_id, reason=stale))
        return
    emit(ToolResultTaken(run_id=event.run_id, step=event.step, call_id=event.call_id,
                         ok=event.ok))

