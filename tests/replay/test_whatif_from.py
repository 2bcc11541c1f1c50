"""What-if from a moment (`lanes.whatif.whatif_from`, the panel's "what-if from here"): the
agent as it was at a position of its log, then its recorded inputs after it under a config."""

from __future__ import annotations

import pytest

from lanes import AgentState, Budgets
from lanes.events import ConfigChanged, RunAborted, RunCompleted, RunFailed, is_input
from lanes.evolve import evolve
from lanes.replay import Entry
from lanes.whatif import Simulation, split_streams, tally, whatif_from
from tests.replay.test_golden import NAMES, golden
from tests.replay.test_whatif import without_orders


def at(stream: list[Entry], cut: int) -> AgentState:
    """The agent after the first ``cut`` entries of its stream."""
    state = AgentState(agent_id=stream[0].stream)
    for entry in stream[:cut]:
        evolve(state, entry.event)
    return state


def moments(stream: list[Entry], count: int) -> list[int]:
    """Up to ``count`` cuts spread over the stream, each just before an input (a moment
    between two inputs, as a what-if from here starts)."""
    cuts = [i for i, e in enumerate(stream) if i and is_input(e.event)]
    step = max(1, len(cuts) // count)
    return cuts[::step]


@pytest.mark.parametrize("name", NAMES)
def test_from_any_moment_under_the_recorded_configs_the_simulation_is_the_recording(
        name: str) -> None:
    streams, end = split_streams(golden(name))
    for agent, stream in streams.items():
        for cut in moments(stream, 12):
            simulated = Simulation(agent, stream[cut:], None, end, at(stream, cut)).run()
            assert without_orders(simulated) == without_orders(stream[cut:]), (agent, cut)


@pytest.mark.parametrize("name", NAMES)
def test_with_the_config_in_force_and_none_changed_after_nothing_changes(name: str) -> None:
    streams, end = split_streams(golden(name))
    for agent, stream in streams.items():
        changed = max((i for i, e in enumerate(stream) if isinstance(e.event, ConfigChanged)),
                      default=0)
        for cut in [c for c in moments(stream, 8) if c > changed]:
            start = at(stream, cut)
            report = whatif_from(start, stream[cut:], start.config, end)
            assert report.whatif == report.recorded, (agent, cut)
            assert report.config_changes() == []


def test_a_budget_lifted_from_a_moment_lets_the_waiting_requests_run() -> None:
    streams, end = split_streams(golden("flood"))
    stream = streams["flood"]
    cut = moments(stream, 4)[1]
    start = at(stream, cut)
    assert start.config.budgets.max_runs_per_hour == 5
    assert start.suppressed is not None  # the hourly budget is spent at that moment
    waiting = len(start.pending)
    recorded = tally(stream[cut:], {"flood": {p.request.request_id: p.at
                                              for p in start.pending}})["flood"]
    lifted = start.config.model_copy(update={"budgets": Budgets()})
    report = whatif_from(start, stream[cut:], lifted, end)
    assert report.recorded == recorded
    assert report.config_changes() == [("budgets.maxRunsPerHour", 5, None)]
    assert report.whatif.runs > report.recorded.runs == 0
    assert report.whatif.suppressions == 0
    # Requests waiting at the moment count: their waits end when a run takes them.
    assert len(report.whatif.waits) >= min(waiting, report.whatif.runs)


def test_the_run_going_at_the_moment_plays_its_own_recorded_script() -> None:
    streams, end = split_streams(golden("desk"))
    checked = 0
    for agent, stream in streams.items():
        for cut in [c for c in moments(stream, 60) if at(stream, c).active is not None][:3]:
            start = at(stream, cut)
            going = start.active
            assert going is not None
            lifted = start.config.model_copy(update={"cap": start.config.cap + 5})
            simulation = Simulation(agent, stream[cut:], lifted, end, start)
            ended = [e.event for e in simulation.run()
                     if isinstance(e.event, RunCompleted | RunFailed | RunAborted)
                     and e.event.run_id == going.run_id]
            recorded = [e.event for e in stream[cut:]
                        if isinstance(e.event, RunCompleted | RunFailed | RunAborted)
                        and e.event.run_id == going.run_id]
            assert ended == recorded, (agent, cut, going.run_id)
            checked += 1
    assert checked
