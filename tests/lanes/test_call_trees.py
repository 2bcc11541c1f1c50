"""Sub-agent call trees over several agents, routed as the runtime routes them: calls go out
as ``agent_call`` requests, answers come back as ``call_result`` requests, in any order."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, AgentState, Entry, Mode, decide, next_due, replay, verify
from lanes.codec import decode, encode
from lanes.config import CallResults
from lanes.events import (
    AgentCallDispatched,
    AgentCallQueued,
    AgentCallRejected,
    CallAnswered,
    CallBatchOpened,
    CallEnded,
    CallIntent,
    CallResultsReady,
    CallStatus,
    CallUndeliverable,
    ConfigChanged,
    Decision,
    Input,
    ModelCalled,
    Outcome,
    RequestReceived,
    RunErrored,
    RunFinished,
    TasksFinished,
    TimerElapsed,
    ToolCallMade,
    answer_id,
    withdrawal_id,
)
from lanes.policy import POLICY, PolicyOffered
from lanes.replay import LogFold
from lanes.requests import RANK, AgentRequest, Kind, Priority
from lanes.snapshot import dump_fold, load_fold
from tests.lanes.harness import T0, Bench, types

AGENTS = ("a", "b", "c")
TASK_TOOLS = ("schedule_tasks", "execute_scheduled_tasks", "get_queue_status")
TERMINAL = {status.value for status in CallStatus}


@dataclass
class Desk:
    """Several agents and the requests in flight between them (delivered when told)."""

    configs: dict[str, AgentConfig]
    now: int = T0
    states: dict[str, AgentState] = field(default_factory=dict)
    log: list[Entry] = field(default_factory=list)
    mail: list[AgentRequest] = field(default_factory=list)
    queued: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """Per agent, a shadow of its call queue: call id -> (rank, arrival order)."""
    seq: int = 0

    def __post_init__(self) -> None:
        for agent, config in self.configs.items():
            self.states[agent] = AgentState(agent_id=agent)
            self.queued[agent] = {}
            self.feed(agent, ConfigChanged(at=self.now, config=config))
            self.feed(agent, PolicyOffered(at=self.now, version=POLICY))

    def feed(self, agent: str, event: Input) -> list[Decision]:
        state = self.states[agent]
        decisions = decide(state, event)
        for item in (event, *decisions) if decisions else ():
            self.log.append(Entry(len(self.log) + 1, agent, item))
        for decision in decisions:
            self._check(agent, decision)
            if isinstance(decision, AgentCallDispatched):
                self.mail.append(_request(decision.target, decision.call_id, Kind.AGENT_CALL,
                                          {"depth": decision.depth}, f"agent:{agent}",
                                          decision.priority))
            elif isinstance(decision, CallAnswered):
                self.mail.append(_request(
                    decision.parent, answer_id(decision.result.call_id), Kind.CALL_RESULT,
                    decision.result.model_dump(mode="json", by_alias=True, exclude_none=True),
                    f"agent:{agent}"))
            elif isinstance(decision, CallEnded) and decision.withdraw:
                self.mail.append(_request(
                    decision.result.target, withdrawal_id(decision.call_id), Kind.CALL_CANCEL,
                    {"callId": decision.call_id}, f"agent:{agent}"))
        out = Counter(c.run_id for c in state.calls.open.values() if c.dispatched)
        assert max(out.values(), default=0) <= state.config.max_parallel_calls
        return decisions

    def _check(self, agent: str, decision: Decision) -> None:
        """The priority order of the calls of each run, as each decision is made."""
        shadow = self.queued[agent]
        if isinstance(decision, AgentCallQueued):
            self.seq += 1
            shadow[decision.call_id] = (-RANK[decision.priority], self.seq)
        elif isinstance(decision, AgentCallDispatched) and decision.call_id in shadow:
            same_run = [c for c in shadow if c.rpartition("-c")[0] == decision.run_id]
            first = min(same_run, key=shadow.__getitem__)
            assert decision.call_id == first, "a call went out before a higher-priority one"
            del shadow[decision.call_id]
        elif isinstance(decision, CallEnded):
            shadow.pop(decision.call_id, None)

    def deliver(self, index: int) -> None:
        request = self.mail.pop(index % len(self.mail))
        if request.agent_id in self.states:
            self.feed(request.agent_id, RequestReceived(at=self.now, request=request))
            return
        if request.kind is not Kind.AGENT_CALL:
            return  # (an answer or a withdrawal for an agent that does not exist: lost)
        parent = (request.source or "")[len("agent:"):]
        self.feed(parent, CallUndeliverable(
            at=self.now, call_id=request.request_id, target=request.agent_id,
            run_id=request.request_id.rpartition("-c")[0], reason="unknown agent"))

    def finish(self, agent: str, calls: tuple[CallIntent, ...], fail: bool = False) -> None:
        run = self.states[agent].active
        if run is None:
            return
        if fail:
            self.feed(agent, RunErrored(at=self.now, run_id=run.run_id, error="boom"))
            return
        self.feed(agent, RunFinished(at=self.now, run_id=run.run_id, outcome=Outcome.NO_TRADE,
                                     calls=calls, answer=f"{agent} done"))

    def tasks(self, agent: str, calls: tuple[CallIntent, ...], execute: bool) -> None:
        """A step of the agent's active run schedules ``calls`` (and sends what is
        scheduled, if ``execute``), as the tools ``schedule_tasks`` and
        ``execute_scheduled_tasks`` do."""
        run = self.states[agent].active
        if run is None:
            return
        tool_calls = [ToolCallMade(call_id="t1", name="schedule_tasks", arguments={
            "tasks": [c.model_dump(mode="json", by_alias=True) for c in calls]})]
        if execute:
            tool_calls.append(ToolCallMade(call_id="t2", name="execute_scheduled_tasks"))
        self.feed(agent, ModelCalled(at=self.now, run_id=run.run_id, step=run.steps + 1,
                                     input_tokens=10, output_tokens=1,
                                     tool_calls=tuple(tool_calls)))

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while True:
            due = min((d for s in self.states.values()
                       if (d := next_due(s, self.now)) is not None), default=None)
            if due is None or due > target:
                break
            self.now = max(self.now, due)
            for agent in AGENTS:
                self.feed(agent, TimerElapsed(at=self.now))
        self.now = target

    def settle(self) -> None:
        """Deliver everything and finish every run without calls until nothing moves."""
        for _ in range(10_000):
            if self.mail:
                self.deliver(0)
            elif any(s.active is not None for s in self.states.values()):
                for agent in AGENTS:
                    self.finish(agent, ())
            elif any(s.calls.open for s in self.states.values()):
                self.advance(600_000)
            else:
                return
        raise AssertionError("the desk never settled")


def _request(agent: str, request_id: str, kind: Kind, payload: dict[str, Any], source: str,
             priority: Priority = Priority.NORMAL) -> AgentRequest:
    return AgentRequest(request_id=request_id, created_at=datetime.fromtimestamp(T0 / 1000, UTC),
                        agent_id=agent, kind=kind, priority=priority, source=source,
                        payload=payload)


def ends_of(log: list[Entry]) -> tuple[set[str], Counter[str]]:
    """Every call made, and how many times each ended."""
    made: set[str] = set()
    ended: Counter[str] = Counter()
    for entry in log:
        event = entry.event
        if isinstance(event, AgentCallQueued):
            made.add(event.call_id)
        elif isinstance(event, AgentCallRejected) and event.call_id:  # (none: ended before)
            made.add(event.call_id)
            ended[event.call_id] += 1
        elif isinstance(event, CallEnded):
            ended[event.call_id] += 1
            assert event.result.status.value in TERMINAL
    return made, ended


configs = st.builds(
    lambda parallel, mode, results, cap, timeout: AgentConfig(
        mode=mode, max_parallel_calls=parallel, call_results=results, cap=cap,
        call_timeout_ms=timeout, max_open_calls=12, tools=TASK_TOOLS),
    st.integers(min_value=1, max_value=3),
    st.sampled_from([Mode.FOLLOWUP, Mode.STEER_BACKLOG, Mode.COLLECT]),
    st.sampled_from(list(CallResults)),
    st.integers(min_value=2, max_value=6),
    st.sampled_from([None, 5_000, 60_000]),
)
call_lists = st.lists(
    st.builds(lambda target, priority: CallIntent(agent_id=target, priority=priority),
              st.sampled_from([*AGENTS, "ghost"]), st.sampled_from(list(Priority))),
    max_size=5).map(tuple)
_send = st.tuples(st.just("send"), st.sampled_from(AGENTS))
_deliver = st.tuples(st.just("deliver"), st.integers(min_value=0, max_value=50))
_finish = st.tuples(st.just("finish"), st.sampled_from(AGENTS), call_lists)
_tasks = st.tuples(st.just("tasks"), st.sampled_from(AGENTS), call_lists, st.booleans())
steps = st.lists(st.one_of(
    _send, _send, _deliver, _deliver, _deliver, _finish, _finish, _finish, _tasks, _tasks,
    st.tuples(st.just("fail"), st.sampled_from(AGENTS)),
    st.tuples(st.just("advance"), st.integers(min_value=1, max_value=20_000)),
    st.tuples(st.just("stop"), st.sampled_from(AGENTS)),
    st.tuples(st.just("resume"), st.sampled_from(AGENTS)),
), max_size=80)


def play(desk: Desk, plan: list[tuple[Any, ...]]) -> None:
    sent = 0
    for step in plan:
        action = step[0]
        if action == "send":
            sent += 1
            desk.feed(step[1], RequestReceived(at=desk.now, request=_request(
                step[1], f"u{sent}", Kind.USER_CONTROL, {"message": "go"}, "user")))
        elif action == "deliver" and desk.mail:
            desk.deliver(step[1])
        elif action == "finish":
            if desk.states[step[1]].active is None:  # some work first, to make calls in
                sent += 1
                desk.feed(step[1], RequestReceived(at=desk.now, request=_request(
                    step[1], f"u{sent}", Kind.USER_CONTROL, {"message": "go"}, "user")))
            desk.finish(step[1], step[2])
        elif action == "tasks":
            desk.tasks(step[1], step[2], step[3])
        elif action == "fail":
            desk.finish(step[1], (), fail=True)
        elif action == "advance":
            desk.advance(step[1])
        elif action in ("stop", "resume"):
            sent += 1
            action_name = "emergency_stop" if action == "stop" else "resume"
            desk.feed(step[1], RequestReceived(at=desk.now, request=_request(
                step[1], f"u{sent}", Kind.USER_CONTROL, {"action": action_name}, "user")))


@settings(max_examples=150, deadline=None)
@given(st.lists(configs, min_size=3, max_size=3), steps)
def test_every_call_ends_in_exactly_one_terminal_state(
    agent_configs: list[AgentConfig], plan: list[tuple[Any, ...]]
) -> None:
    desk = Desk(dict(zip(AGENTS, agent_configs, strict=True)))
    play(desk, plan)
    made, ended = ends_of(desk.log)
    assert all(count == 1 for count in ended.values()), "a call ended twice"
    desk.feed("a", RequestReceived(at=desk.now, request=_request(
        "a", "resume-all-a", Kind.USER_CONTROL, {"action": "resume"}, "user")))
    for agent in ("b", "c"):
        desk.feed(agent, RequestReceived(at=desk.now, request=_request(
            agent, f"resume-all-{agent}", Kind.USER_CONTROL, {"action": "resume"}, "user")))
    desk.settle()
    made, ended = ends_of(desk.log)
    assert set(ended) == made and all(count == 1 for count in ended.values())
    for state in desk.states.values():
        assert not state.calls.open and not state.calls.queue and state.calls.out == 0
        assert sum(state.calls.ended.values()) == sum(
            1 for call_id in made if call_id.startswith(f"{state.agent_id}-"))
    sent = [e.event.run_id for e in desk.log
            if isinstance(e.event, CallBatchOpened) and e.event.awaited_by is not None]
    finished = Counter(e.event.batch_id for e in desk.log if isinstance(e.event, TasksFinished))
    assert finished == Counter(sent), "a batch of tasks did not finish exactly once"
    assert replay(desk.log) == desk.states
    assert verify(desk.log) is None
    assert verify([Entry(e.position, e.stream, decode(*encode(e.event)))
                   for e in desk.log]) is None


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=4), st.lists(st.sampled_from(list(Priority)),
                                                       min_size=1, max_size=10),
       st.lists(st.integers(min_value=0, max_value=20), max_size=30))
def test_a_runs_calls_go_out_in_priority_order_never_more_than_max_parallel(
    parallel: int, priorities: list[Priority], order: list[int]
) -> None:
    desk = Desk({"a": AgentConfig(mode=Mode.FOLLOWUP, max_parallel_calls=parallel),
                 "b": AgentConfig(mode=Mode.QUEUE, cap=100), "c": AgentConfig()})
    desk.feed("a", RequestReceived(at=desk.now, request=_request(
        "a", "u1", Kind.USER_CONTROL, {"message": "go"}, "user")))
    desk.finish("a", tuple(CallIntent(agent_id="b", priority=p) for p in priorities))
    out = [e.event for e in desk.log if isinstance(e.event, AgentCallDispatched)]
    assert len(out) == min(parallel, len(priorities))
    for index in order:  # b answers its calls in whatever order they are delivered
        if desk.mail:
            desk.deliver(index)
        desk.finish("b", ())
    desk.settle()
    dispatched = [e.event for e in desk.log if isinstance(e.event, AgentCallDispatched)]
    assert len(dispatched) == len(priorities)
    ranks = [RANK[d.priority] for d in dispatched[parallel:]]
    assert ranks == sorted(ranks, reverse=True)  # (the first ones went out at once)


# ------------------------------------------------------------------------------ examples


def fan_out(bench: Bench, count: int) -> list[Decision]:
    bench.send("user_control")
    return bench.finish(calls=tuple(CallIntent(agent_id=f"c{n}") for n in range(count)))


def result(call_id: str, status: str = "returned", **fields: Any) -> AgentRequest:
    """The answer of call ``...-cN`` from its target (``c{N-1}`` in `fan_out`)."""
    target = f"c{int(call_id.rpartition('-c')[2]) - 1}"
    return _request("agent_btc_5m", answer_id(call_id), Kind.CALL_RESULT,
                    {"callId": call_id, "status": status, **fields}, f"agent:{target}")


def test_an_agent_serving_a_call_may_call_out_while_its_own_calls_hold_every_slot() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, max_parallel_calls=1))
    fan_out(bench, 1)  # its one slot holds a call to c0...
    bench.submit(_request("agent_btc_5m", "p-r1-c1", Kind.AGENT_CALL, {"depth": 1}, "agent:p"))
    decisions = bench.finish(calls=(CallIntent(agent_id="leaf"),))  # ...serving p, it calls
    assert "AgentCallDispatched" in types(decisions)  # out at once: the slots are per run


def test_all_results_come_back_as_one_request_in_call_order() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, max_parallel_calls=2))
    fan_out(bench, 3)
    assert types(bench.submit(result("agent_btc_5m-r1-c2", answer="two"))) == [
        "CallEnded", "AgentCallDispatched"]
    bench.submit(result("agent_btc_5m-r1-c3"))
    decisions = bench.submit(result("agent_btc_5m-r1-c1", "failed", error="x"))
    assert types(decisions) == ["CallEnded", "CallResultsReady", "RequestQueued", "RunStarted"]
    ready = decisions[1]
    assert isinstance(ready, CallResultsReady) and ready.last
    results = ready.request.payload["results"]
    assert [r["callId"][-2:] for r in results] == ["c1", "c2", "c3"]
    assert [r["status"] for r in results] == ["failed", "returned", "returned"]
    assert bench.state.active is not None and bench.state.active.requests[0].request is \
        ready.request


def test_each_result_is_steered_into_a_run_that_can_take_it() -> None:
    bench = Bench(AgentConfig(mode=Mode.STEER_BACKLOG, call_results=CallResults.EACH))
    fan_out(bench, 2)
    bench.send("user_control")
    bench.steerable()
    decisions = bench.submit(result("agent_btc_5m-r1-c1"))
    assert types(decisions) == ["CallEnded", "CallResultsReady", "RunSteered"]


def test_a_result_from_anyone_but_the_calls_target_is_refused() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    fan_out(bench, 1)
    forged = _request("agent_btc_5m", "forged", Kind.CALL_RESULT,
                      {"callId": "agent_btc_5m-r1-c1", "status": "returned"}, "user")
    assert types(bench.submit(forged)) == ["RequestRejected"]
    assert bench.state.calls.open


def test_a_late_result_after_a_timeout_is_refused_and_the_timeout_is_the_result() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, call_timeout_ms=10_000))
    fan_out(bench, 1)
    decisions = bench.advance(10_000)
    assert types(decisions) == ["CallEnded", "CallResultsReady", "RequestQueued", "RunStarted"]
    ended = decisions[0]
    assert isinstance(ended, CallEnded) and ended.result.status is CallStatus.TIMED_OUT
    late = bench.submit(result("agent_btc_5m-r1-c1"))
    assert types(late) == ["RequestRejected"]


def test_an_emergency_stop_cancels_the_calls_out_and_queued() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, max_parallel_calls=1))
    fan_out(bench, 3)
    decisions = bench.control("emergency_stop")
    cancelled = [d for d in decisions if isinstance(d, CallEnded)]
    assert [d.result.status for d in cancelled] == [CallStatus.CANCELLED] * 3
    assert not [d for d in decisions if isinstance(d, AgentCallDispatched)]
    assert not bench.state.calls.open


def test_more_calls_than_the_call_queue_holds_are_refused_queue_full() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, max_open_calls=2))
    decisions = fan_out(bench, 3)
    [refused] = [d for d in decisions if isinstance(d, AgentCallRejected)]
    assert refused.code == "queue_full" and "max_open_calls 2" in refused.reason


def test_a_call_served_is_answered_when_its_own_calls_come_back() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    bench.submit(_request("agent_btc_5m", "p-r1-c1", Kind.AGENT_CALL, {"depth": 1}, "agent:p"))
    decisions = bench.finish(calls=(CallIntent(agent_id="leaf"),), answer="later")
    assert not [d for d in decisions if isinstance(d, CallAnswered)]
    decisions = bench.submit(_request("agent_btc_5m", answer_id("agent_btc_5m-r1-c1"),
                                      Kind.CALL_RESULT, {"callId": "agent_btc_5m-r1-c1",
                                                         "status": "returned"}, "agent:leaf"))
    assert types(decisions)[-1] == "RunStarted"
    [answered] = [d for d in bench.finish(answer="all done") if isinstance(d, CallAnswered)]
    assert answered.parent == "p" and answered.result.call_id == "p-r1-c1"
    assert answered.result.answer == "all done"
    assert answered.result.status is CallStatus.RETURNED


@settings(max_examples=60, deadline=None)
@given(st.lists(configs, min_size=3, max_size=3), steps)
def test_a_snapshot_holds_the_calls_on_their_way_and_the_open_ones(
    agent_configs: list[AgentConfig], plan: list[tuple[Any, ...]]
) -> None:
    desk = Desk(dict(zip(AGENTS, agent_configs, strict=True)))
    play(desk, plan)
    log_fold = LogFold()
    log_fold.add(Entry(e.position, e.stream, decode(*encode(e.event))) for e in desk.log)
    loaded, _ = load_fold(dump_fold(log_fold, "ev"))
    assert loaded == log_fold and loaded.states == desk.states
    undelivered = {r.request_id for r in desk.mail if r.kind is not Kind.CALL_CANCEL}
    assert set(loaded.calls) | set(loaded.answers) >= undelivered  # (withdrawals: best effort)
