"""What-if: the recorded inputs of a log under another policy."""

from __future__ import annotations

import pytest

from lanes import AgentConfig, Budgets, Mode
from lanes.config import DedupeStrategy, DropPolicy
from lanes.events import (
    BrokerReport,
    ConfigChanged,
    Event,
    OrderAccepted,
    OrderClosed,
    OrderFilled,
    OrderRejected,
    RequestDropped,
    RequestReceived,
    RunFinished,
    RunStarted,
    TimerElapsed,
)
from lanes.replay import Entry
from lanes.requests import Kind
from lanes.whatif import Simulation, Tally, split_streams, tally, whatif
from tests.lanes.harness import T0, Bench
from tests.replay.test_golden import NAMES, golden

ORDER_EVENTS = (OrderAccepted, OrderRejected, OrderFilled, OrderClosed, BrokerReport)


def without_orders(log: list[Entry]) -> list[Event]:
    """A log as what-if simulates it: orders are not simulated, results carry none."""
    events: list[Event] = []
    for entry in log:
        event = entry.event
        if isinstance(event, ORDER_EVENTS):
            continue
        if isinstance(event, RunFinished):
            event = RunFinished(at=event.at, run_id=event.run_id, outcome=event.outcome,
                                usage=event.usage)
        events.append(event)
    return events


@pytest.mark.parametrize("name", NAMES)
def test_under_the_recorded_configs_the_simulation_is_the_recording(name: str) -> None:
    streams, end = split_streams(golden(name))
    for agent, stream in streams.items():
        simulated = Simulation(agent, stream, None, end).run()
        assert without_orders(simulated) == without_orders(stream), agent
    report = whatif(golden(name), {})
    assert all(agent.recorded == agent.whatif for agent in report)


def flood(**changes: object) -> Tally:
    """The recorded flood, and what-if under its config with ``changes``."""
    recorded = AgentConfig(mode=Mode.FOLLOWUP, cap=10, drop_policy=DropPolicy.OLD,
                           budgets=Budgets(max_runs_per_hour=5))
    config = recorded.model_copy(update=changes)
    [agent] = whatif(golden("flood"), {"flood": config})
    assert agent.recorded_config == recorded
    return agent.whatif


@pytest.fixture(scope="module")
def recorded() -> Tally:
    return tally(golden("flood"))["flood"]


def test_the_recorded_flood(recorded: Tally) -> None:
    assert (recorded.received, recorded.runs, recorded.dropped, recorded.deduped,
            recorded.rejected, recorded.suppressions) == (400, 5, 314, 8, 63, 1)


def test_a_cap_large_enough_drops_and_refuses_nothing(recorded: Tally) -> None:
    wide = flood(cap=1_000)
    assert (wide.dropped, wide.rejected) == (0, 0)
    assert wide.accepted + wide.deduped == recorded.received
    # Redeliveries now find their original still pending (it is no longer dropped).
    assert wide.deduped > recorded.deduped
    assert wide.runs == recorded.runs  # the hourly budget still holds runs back
    assert wide.never_ran == wide.accepted - wide.runs


def test_without_the_hourly_budget_runs_follow_each_other_and_nothing_is_suppressed(
    recorded: Tally,
) -> None:
    free = flood(budgets=Budgets())
    assert free.suppressions == 0
    assert free.runs > 5 * recorded.runs
    assert free.runs - free.completed == 1  # one still running when the log ends
    assert free.accepted > recorded.accepted  # runs take requests off the queue
    assert free.dropped < recorded.dropped


def test_without_dedupe_every_redelivery_is_taken(recorded: Tally) -> None:
    dedupe = {Kind.HOOK_TRIGGER: DedupeStrategy.NONE}
    assert flood(dedupe=dedupe).deduped == 0
    assert flood(dedupe=dedupe, cap=1_000).accepted == recorded.received


def flood_log(**changes: object) -> list[Entry]:
    """The simulated log of the flood under its config with ``changes``."""
    streams, end = split_streams(golden("flood"))
    config = streams["flood"][0].event.config.model_copy(update=changes)  # type: ignore[union-attr]
    return Simulation("flood", streams["flood"], config, end).run()


def pending_drops_of_the_incomings_class(log: list[Entry]) -> int:
    """Pending requests dropped for an incoming one of the same (or a lower) priority."""
    rank = {"high": 2, "normal": 1, "low": 0}
    priority: dict[str, int] = {}
    incoming = 0
    found = 0
    for entry in log:
        event = entry.event
        if isinstance(event, RequestReceived):
            incoming = priority[event.request.request_id] = rank[event.request.priority.value]
        elif isinstance(event, RequestDropped) and "a pending" in event.reason:
            found += priority[event.request_id] >= incoming
    return found


def test_refusing_the_newest_keeps_the_oldest_of_a_class(recorded: Tally) -> None:
    # Dropping the oldest drops pending requests of the incoming one's class; refusing the
    # newest only ever drops a pending request of a lower class than the incoming one.
    assert pending_drops_of_the_incomings_class(golden("flood")) > 0
    assert pending_drops_of_the_incomings_class(flood_log(drop_policy=DropPolicy.NEW)) == 0
    assert flood(drop_policy=DropPolicy.NEW).runs == recorded.runs


def test_summarize_folds_into_the_next_run_instead_of_dropping(recorded: Tally) -> None:
    folded = flood(drop_policy=DropPolicy.SUMMARIZE)
    assert folded.dropped == 0 and folded.summarized > 0
    assert folded.runs == recorded.runs
    unlimited = flood_log(drop_policy=DropPolicy.SUMMARIZE, budgets=Budgets())
    summaries = [e.event.summary for e in unlimited
                 if isinstance(e.event, RunStarted) and e.event.summary is not None]
    assert summaries and all(summary.count > 0 for summary in summaries)


# ------------------------------------------------------------------ the model, by example


def simulate(bench: Bench, config: AgentConfig | None) -> list[Entry]:
    streams, end = split_streams(bench.log)
    return Simulation(bench.agent, streams[bench.agent], config, end).run()


def starts(log: list[Entry]) -> list[tuple[int, tuple[str, ...]]]:
    """(time, requests) of each run start."""
    now, found = 0, []
    for entry in log:
        if hasattr(entry.event, "at"):
            now = entry.event.at
        if isinstance(entry.event, RunStarted):
            found.append((now - T0, entry.event.request_ids))
    return found


def finishes(log: list[Entry]) -> list[tuple[int, str]]:
    return [(e.event.at - T0, e.event.run_id) for e in log if isinstance(e.event, RunFinished)]


def test_a_run_keeps_the_duration_of_the_recorded_run_that_held_its_first_request() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    bench.send()  # ar_1 runs at once
    bench.advance(100)
    bench.send()  # ar_2 waits
    bench.advance(400)
    bench.finish("no_trade")  # ar_1's run took 500 ms; ar_2 starts
    bench.advance(800)
    bench.finish("trade")  # ar_2's run took 800 ms
    bench.advance(2_000)
    bench.send()  # ar_3, at 3.3 s: the log ends there
    collect = simulate(bench, AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000))
    # ar_1 and ar_2 fall in one window (it closes 1 s after the last): one run, ar_1 first;
    # it plays ar_1's recorded run (500 ms). ar_3's window closes after the end of the log.
    assert starts(collect) == [(1_100, ("ar_1", "ar_2"))]
    assert finishes(collect) == [(1_600, "agent_btc_5m-r1")]
    assert [e.event.at - T0 for e in collect if isinstance(e.event, TimerElapsed)] == [1_100]


def test_a_run_without_a_recording_takes_the_median_run() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, cap=1, drop_policy=DropPolicy.NEW))
    bench.send()  # ar_1 runs
    bench.send()  # ar_2 queued
    bench.send()  # ar_3 refused: cap 1, policy new
    bench.advance(300)
    bench.finish("trade")
    bench.advance(700)
    bench.finish("trade")
    bench.advance(1_000)
    bench.send()  # the log goes on to 2 s
    wide = simulate(bench, AgentConfig(mode=Mode.FOLLOWUP, cap=5))
    # ar_3 now runs after ar_2, with the median recorded run (500 ms) and outcome (trade).
    assert starts(wide) == [(0, ("ar_1",)), (300, ("ar_2",)), (1_000, ("ar_3",)),
                            (2_000, ("ar_4",))]
    assert finishes(wide) == [(300, "agent_btc_5m-r1"), (1_000, "agent_btc_5m-r2"),
                              (1_500, "agent_btc_5m-r3")]


def test_a_recorded_reconfiguration_is_replaced_by_the_other_config() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, cap=50))
    bench.send()
    bench.feed(ConfigChanged(at=bench.now, config=AgentConfig(mode=Mode.QUEUE, cap=2)))
    for _ in range(3):
        bench.send()
    recorded = tally(bench.log)[bench.agent]
    other = AgentConfig(mode=Mode.FOLLOWUP, cap=50)
    [agent] = whatif(bench.log, {bench.agent: other})
    assert recorded.dropped == 1  # under the recorded cap of 2
    assert agent.whatif.dropped == 0  # the other config held throughout
    assert agent.config_changes() == [("mode", "queue", "followup"), ("cap", 2, 50)]


def test_progress_is_told_about_every_recorded_event() -> None:
    told: list[int] = []
    whatif(golden("flood"), {}, told.append)
    assert sum(told) == len(golden("flood"))
