"""The capacity fold against replay: over random scripts of an agent and of a provider gate,
the fold's queue depth, gate waiting count, gate window usage and run latencies are what
replaying the same log says at every event, and its per-second series are the replayed
state at the end of each second."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.reads.capacity import CapacityFold, Steps
from gateway.reads.capacity_view import Window, capacity_answer
from lanes import AgentConfig, AgentState, Entry, evolve
from lanes.codec import encode
from lanes.events import RunAborted, RunCompleted, RunFailed
from lanes.gate import GateState, encode_gate_event, evolve_gate, window_usage
from lanes.gate.events import CallOutcome, GateLimits
from lanes.requests import Priority
from lanes.streams import gate_stream, is_agent_stream
from store.port import RecordedEvent
from tests.lanes.harness import T0, Bench
from tests.lanes.test_gate import GateBench
from tests.lanes.test_gate_properties import actions as gate_actions
from tests.lanes.test_gate_properties import limit_sets
from tests.lanes.test_gate_properties import play as play_gate
from tests.lanes.test_properties import actions, configs, play


def record(position: int, stream: str, event: Any) -> RecordedEvent:
    kind, data = encode(event) if is_agent_stream(stream) else encode_gate_event(event)
    return RecordedEvent(position, stream, position, f"e{position}", kind, data, T0)


def end_of_second(samples: list[tuple[int, int]]) -> dict[int, int]:
    """(time, value) after each event -> the value at the end of each second seen."""
    return {at // 1000: value for at, value in samples}


def check_steps(steps: Steps, expected: dict[int, int]) -> None:
    for sec, value in expected.items():
        assert steps.at(sec) == value, (sec, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, script=st.lists(actions, min_size=5, max_size=80))
def test_an_agents_depth_and_run_latency_are_what_replay_says_at_every_event(
    config: AgentConfig, script: list[tuple[str, Any]]
) -> None:
    bench = Bench(config)
    seen: list[str] = []
    for action, arg in script:
        play(bench, action, arg, seen)
    fold = CapacityFold()
    state = AgentState(agent_id=bench.agent)
    depths: list[tuple[int, int]] = []
    latencies: list[tuple[int, int]] = []
    for entry in bench.log:
        event = entry.event
        if isinstance(event, RunCompleted | RunFailed | RunAborted):
            assert state.active is not None
            latencies.append((state.now, state.now - state.active.started_at))
        evolve(state, event)
        fold.feed(record(entry.position, entry.stream, event))
        track = fold.agents[bench.agent]
        assert track.now == state.now
        assert len(track.pending) == len(state.pending), entry
        depths.append((state.now, len(state.pending)))
    track = fold.agents[bench.agent]
    check_steps(track.depth, end_of_second(depths))
    assert list(zip(track.latency.times, track.latency.values, strict=True)) == latencies


_HIGH = ("request", {"agent": 0, "priority": Priority.HIGH, "input_tokens": 0,
                     "output_tokens": 0, "retry": False, "again": False})
_OPEN = GateLimits(requests_per_minute=None, max_wait_ms=0, lease_ms=10_000,
                   priority_aging_ms=1_000, backoff_base_ms=100, backoff_cap_ms=1_000,
                   max_attempts=1, breaker_threshold=1, breaker_cooldown_ms=1_000)
_LAST_SECOND = [  # (found by Hypothesis in CI): the log's last second, where a grant made
    # at its start leaves the window later in it, with no event after to take it off
    *[_HIGH] * 7, ("limits", _OPEN.model_copy(update={"max_wait_ms": 60_000})),
    ("release", {"pick": 0, "outcome": CallOutcome.RATE_LIMITED, "usage": None,
                 "retry_after_ms": None, "hints": (1, None, None), "any": False}),
    _HIGH, _HIGH, ("advance", 60_000)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limits=limit_sets, script=st.lists(gate_actions, min_size=5, max_size=80))
@example(limits=_OPEN, script=_LAST_SECOND)
def test_a_gates_waiting_waits_and_window_usage_are_what_replay_says_at_every_event(
    limits: GateLimits, script: list[tuple[str, Any]]
) -> None:
    bench = GateBench(limits)
    runs: dict[int, str] = {}
    for action, arg in script:
        play_gate(bench, action, arg, runs)
    stream = gate_stream(bench.state.provider)
    fold = CapacityFold()
    state = GateState(provider=bench.state.provider)
    waiting: list[tuple[int, int]] = []
    # The window's usage at the end of each second with an event, as the state after that
    # second's last event says then (a grant may leave the window after that event).
    usage: dict[int, tuple[int, int, int]] = {}
    queued: dict[str, int] = {}
    waits: list[tuple[int, int]] = []
    for position, event in enumerate(bench.log, 1):
        before = set(state.waiting)
        evolve_gate(state, event)
        for slot_id in before - set(state.waiting):  # a wait ended (granted, refused, freed)
            waits.append((state.now, state.now - queued.pop(slot_id)))
        for slot_id in set(state.waiting) - before:
            queued[slot_id] = state.now
        fold.feed(record(position, stream, event))
        track = fold.gates[bench.state.provider]
        assert track.now == state.now
        assert len(track.waiting) == len(state.waiting)
        assert tuple(track.used) == window_usage(state, state.now), event
        waiting.append((state.now, len(state.waiting)))
        usage[state.now // 1000] = window_usage(state, state.now // 1000 * 1000 + 999)
    track = fold.gates[bench.state.provider]
    check_steps(track.depth, end_of_second(waiting))
    for k in range(3):
        check_steps(track.usage[k], {sec: used[k] for sec, used in usage.items()})
    assert list(zip(track.waits.times, track.waits.values, strict=True)) == waits
    # After the last event the window goes on emptying by itself, as the gate counts it.
    end = state.now + 2 * 60_000
    for k, points in enumerate(track.exits(end)):
        for sec, value in points:
            assert window_usage(state, sec * 1000 + 999)[k] == value


def test_steps_give_the_most_at_the_end_of_any_second_of_each_step() -> None:
    steps = Steps()
    for at, value in [(1_000, 3), (1_500, 5), (2_200, 1), (7_000, 4), (7_900, 0)]:
        steps.set(at, value)
    assert steps.secs == [1, 2, 7] and steps.values == [5, 1, 0]  # end of each second
    assert steps.peaks(0, 2, 5) == [5, 1, 1, 1, 0]
    assert steps.peaks(0, 2, 5, tail=[(8, 6), (9, 2)]) == [5, 1, 1, 1, 6]
    assert steps.peaks(0, 1, 10) == [0, 5, 1, 1, 1, 1, 1, 0, 0, 0]
    assert steps.peaks(3, 4, 2) == [1, 0]
    steps.trim(5)
    assert steps.secs == [2, 7] and steps.at(6) == 1


def test_an_answer_names_the_busiest_agents_and_sums_the_desk_by_the_second() -> None:
    fold = CapacityFold()
    log: list[Entry] = []
    for name, requests in (("quiet", 1), ("busy", 4), ("mid", 2)):
        bench = Bench(AgentConfig(), agent=name)
        bench.control("emergency_stop")  # nothing runs: every request stays pending
        for _ in range(requests):
            bench.send()
        log += bench.log
    for position, entry in enumerate(log, 1):
        fold.feed(record(position, entry.stream, entry.event))
    window = Window(T0 // 1000 * 1000, 10_000, 3)
    answer = capacity_answer(fold, window, desk=["quiet", "busy", "mid"], agents=None,
                             busiest=2, gates=[], limits={})
    assert [a["agentId"] for a in answer["agents"]] == ["busy", "mid"]
    assert answer["desk"]["depth"] == [7, 7, 7] and answer["desk"]["agents"] == 3
    assert [m["kind"] for m in answer["marks"]] == ["stop"] * 3
    scoped = capacity_answer(fold, window, desk=["quiet"], agents=None, busiest=5, gates=[],
                             limits={})
    assert scoped["desk"]["depth"] == [1, 1, 1]
    assert [a["agentId"] for a in scoped["agents"]] == ["quiet"]
    assert [m["agentId"] for m in scoped["marks"]] == ["quiet"]
