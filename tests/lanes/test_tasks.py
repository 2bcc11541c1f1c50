"""Sub-agent tasks as tools of a run (`schedule_tasks`, `execute_scheduled_tasks`): calls of
one batch the run waits for, under the agent's call limits, every one ending exactly once."""

from __future__ import annotations

from typing import Any

from lanes import AgentConfig, Mode, replay, verify
from lanes.events import (
    AgentCallQueued,
    AgentCallRejected,
    CallBatchOpened,
    CallEnded,
    CallIntent,
    CallStatus,
    CallWithdrawn,
    Decision,
    ModelCalled,
    RequestReceived,
    StepDecided,
    TasksFinished,
    TasksScheduled,
    ToolCallMade,
)
from lanes.requests import Kind
from tests.lanes.harness import types
from tests.lanes.test_call_trees import TASK_TOOLS, Desk, _request


def desk(**config: Any) -> Desk:
    caller = AgentConfig(mode=Mode.FOLLOWUP, tools=TASK_TOOLS, **config)
    return Desk({"a": caller, "b": AgentConfig(), "c": AgentConfig()})


def started(board: Desk) -> str:
    board.feed("a", RequestReceived(
        at=board.now, request=_request("a", "u1", Kind.USER_CONTROL, {"message": "go"}, "user")))
    run = board.states["a"].active
    assert run is not None
    return run.run_id


def step(board: Desk, *calls: ToolCallMade) -> list[Decision]:
    run = board.states["a"].active
    assert run is not None
    return board.feed("a", ModelCalled(at=board.now, run_id=run.run_id, step=run.steps + 1,
                                       input_tokens=10, output_tokens=1, tool_calls=calls))


def schedule(*targets: str, call_id: str = "t1", **task: Any) -> ToolCallMade:
    return ToolCallMade(call_id=call_id, name="schedule_tasks", arguments={
        "tasks": [{"agentId": target, "payload": {"message": f"to {target}"}, **task}
                  for target in targets]})


EXECUTE = ToolCallMade(call_id="t9", name="execute_scheduled_tasks")


def test_scheduled_tasks_go_out_together_and_their_results_come_back_to_the_tool_in_order(
) -> None:
    board = desk()
    run_id = started(board)
    decisions = step(board, schedule("b", "c"))
    assert types(decisions) == ["StepDecided", "TasksScheduled"]
    assert board.mail == []  # nothing is sent before execute_scheduled_tasks
    decisions = step(board, EXECUTE)
    assert types(decisions) == ["StepDecided", "CallBatchOpened", "AgentCallQueued",
                                "AgentCallQueued", "AgentCallDispatched",
                                "AgentCallDispatched"]
    opened = next(d for d in decisions if isinstance(d, CallBatchOpened))
    assert (opened.run_id, opened.awaited_by) == (f"{run_id}-s2", run_id)
    assert [d.call_id for d in decisions if isinstance(d, AgentCallQueued)] == [
        f"{run_id}-s2-c1", f"{run_id}-s2-c2"]
    board.deliver(1)  # c gets its call first, and answers first
    board.finish("c", ())
    board.deliver(0)
    board.finish("b", ())
    assert not [e for e in board.log if isinstance(e.event, TasksFinished)]
    board.deliver(1)  # c's answer
    board.deliver(0)  # b's answer
    finished = [e.event for e in board.log if isinstance(e.event, TasksFinished)]
    assert len(finished) == 1 and finished[0].run_id == run_id
    assert [(r.target, r.status, r.answer) for r in finished[0].results] == [
        ("b", CallStatus.RETURNED, "b done"), ("c", CallStatus.RETURNED, "c done")]
    state = board.states["a"]
    assert state.active is not None and state.pending == []  # no results request queued
    assert not state.calls.batches and not state.calls.open
    assert replay(board.log) == board.states and verify(board.log) is None


def test_the_tools_limits_are_the_agents_call_limits_and_refusals_are_results() -> None:
    board = desk(max_calls_per_run=3, max_call_depth=5)
    run_id = started(board)
    decisions = step(board, EXECUTE)
    refused = next(d for d in decisions if isinstance(d, StepDecided)).refused
    assert "no tasks are scheduled" in refused[0].error
    decisions = step(board, schedule("b", "c", "b", "c"))  # 4 > max_calls_per_run
    refused = next(d for d in decisions if isinstance(d, StepDecided)).refused
    assert "fan-out limit: a run makes at most 3 calls" in refused[0].error
    step(board, schedule("b", "c"), EXECUTE)  # scheduled and sent in one step
    decisions = step(board, schedule("b", "c", call_id="t3"))  # 2 sent + 2 > 3
    assert "sent 2 and has 0 scheduled" in next(
        d for d in decisions if isinstance(d, StepDecided)).refused[0].error
    assert types(step(board, schedule("ghost"))) == ["StepDecided", "TasksScheduled"]
    step(board, EXECUTE)
    board.deliver(2)  # the ghost's call: undeliverable
    batch = f"{run_id}-s6"
    finished = [e.event for e in board.log if isinstance(e.event, TasksFinished)
                and e.event.batch_id == batch]
    assert [(r.target, r.status) for r in finished[0].results] == [
        ("ghost", CallStatus.REFUSED)]
    assert verify(board.log) is None


def test_a_depth_refusal_is_a_result_of_the_tool_at_once() -> None:
    board = desk(max_call_depth=0)
    started(board)
    decisions = step(board, schedule("b"), EXECUTE)
    assert types(decisions)[-3:] == ["CallBatchOpened", "AgentCallRejected", "TasksFinished"]
    finished = decisions[-1]
    assert isinstance(finished, TasksFinished)
    assert [(r.status, r.code) for r in finished.results] == [
        (CallStatus.REFUSED, "depth_limit")]
    assert isinstance(decisions[-2], AgentCallRejected)
    assert verify(board.log) is None


def test_a_stop_while_the_tool_waits_cancels_the_tasks_and_withdraws_those_out() -> None:
    board = desk()
    run_id = started(board)
    step(board, schedule("b", "c"), EXECUTE)
    board.deliver(0)  # b took its call (c's waits in the mail)
    board.feed("a", RequestReceived(
        at=board.now, request=_request("a", "stop", Kind.USER_CONTROL,
                                       {"action": "emergency_stop"}, "user")))
    ended = [e.event for e in board.log if isinstance(e.event, CallEnded)]
    assert {(c.result.status, c.result.code) for c in ended} == {
        (CallStatus.CANCELLED, "run_ended")}
    assert all(c.withdraw for c in ended)
    finished = [e.event for e in board.log if isinstance(e.event, TasksFinished)]
    assert len(finished) == 1 and finished[0].run_id == run_id
    board.settle()
    assert any(isinstance(e.event, CallWithdrawn) for e in board.log if e.stream == "b")
    assert not board.states["a"].calls.open
    assert replay(board.log) == board.states and verify(board.log) is None


def test_tasks_scheduled_and_never_sent_go_with_the_run() -> None:
    board = desk()
    started(board)
    step(board, schedule("b"))
    run = board.states["a"].active
    assert run is not None and [t.agent_id for t in run.scheduled] == ["b"]
    board.finish("a", ())
    assert board.mail == [] and not board.states["a"].calls.open
    assert not [e for e in board.log if isinstance(e.event, TasksScheduled | CallIntent)
                and e.stream != "a"]
    assert verify(board.log) is None
