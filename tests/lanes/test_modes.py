"""The design's mode table, one row and column at a time."""

from __future__ import annotations

import pytest

from lanes import AgentConfig, Budgets, Mode
from lanes.events import (
    AbortReason,
    ConfigChanged,
    FallbackApplied,
    RunAborted,
    RunStarted,
    RunSteered,
)
from tests.lanes.harness import Bench, types


def busy(mode: Mode, **config: object) -> Bench:
    """An agent of that mode with a run in progress."""
    bench = Bench(AgentConfig(mode=mode, **config))  # type: ignore[arg-type]
    assert types(bench.send()) == ["RequestQueued", "RunStarted"]
    return bench


@pytest.mark.parametrize("mode", [Mode.FOLLOWUP, Mode.INTERRUPT, Mode.STEER, Mode.STEER_BACKLOG,
                                  Mode.QUEUE])
def test_an_idle_agent_runs_a_request_at_once(mode: Mode) -> None:
    bench = Bench(AgentConfig(mode=mode))
    decisions = bench.send()
    assert types(decisions) == ["RequestQueued", "RunStarted"]
    assert decisions[1] == RunStarted(
        run_id="agent_btc_5m-r1", request_ids=("ar_1",), depth=0, deadline=bench.now + 120_000
    )


def test_followup_runs_each_request_after_the_current_run_one_run_per_request() -> None:
    bench = busy(Mode.FOLLOWUP)
    bench.send()
    bench.send()
    assert bench.pending_ids() == ["ar_2", "ar_3"]
    assert types(bench.finish()) == ["RunCompleted", "RunStarted"]
    assert [p.request.request_id for p in bench.state.active.requests] == ["ar_2"]  # type: ignore[union-attr]


def test_followup_orders_by_priority_fifo_within_a_class() -> None:
    bench = busy(Mode.FOLLOWUP)
    for priority in ["low", "normal", "high", "normal", "high", "low"]:
        bench.send(priority=priority)
    assert bench.pending_ids() == ["ar_4", "ar_6", "ar_3", "ar_5", "ar_2", "ar_7"]


def test_queue_mode_drains_in_strict_arrival_order_whatever_the_priority() -> None:
    bench = busy(Mode.QUEUE)
    for priority in ["low", "high", "normal"]:
        bench.send(priority=priority)
    assert bench.pending_ids() == ["ar_2", "ar_3", "ar_4"]
    bench.finish()
    assert bench.state.active.requests[0].request.request_id == "ar_2"  # type: ignore[union-attr]


def test_interrupt_with_high_priority_aborts_the_run_and_runs_the_new_request() -> None:
    bench = busy(Mode.INTERRUPT)
    first = bench.run_id
    decisions = bench.send(priority="high")
    assert types(decisions) == ["RequestQueued", "RunAborted", "RunStarted"]
    assert decisions[1] == RunAborted(run_id=first, reason=AbortReason.INTERRUPT, by="ar_2")
    assert isinstance(decisions[2], RunStarted) and decisions[2].request_ids == ("ar_2",)


def test_interrupt_with_normal_priority_falls_back_to_followup_as_an_event() -> None:
    bench = busy(Mode.INTERRUPT)
    decisions = bench.send(priority="normal")
    assert types(decisions) == ["FallbackApplied", "RequestQueued"]
    assert isinstance(decisions[0], FallbackApplied)
    assert "only high priority interrupts" in decisions[0].reason
    assert bench.state.active is not None and bench.pending_ids() == ["ar_2"]


def test_an_interrupt_never_jumps_ahead_of_an_earlier_high_request() -> None:
    bench = busy(Mode.FOLLOWUP)
    bench.send(priority="high")  # waits as a followup
    bench.feed(ConfigChanged(at=bench.now, config=AgentConfig(mode=Mode.INTERRUPT)))
    decisions = bench.send(priority="high")
    started = decisions[-1]
    assert isinstance(started, RunStarted) and started.request_ids == ("ar_2",)
    assert bench.pending_ids() == ["ar_3"]


def test_interrupt_falls_back_when_the_budget_would_not_let_a_new_run_start() -> None:
    bench = busy(Mode.INTERRUPT, budgets=Budgets(max_runs_per_hour=1))
    decisions = bench.send(priority="high")
    assert types(decisions) == ["FallbackApplied", "RequestQueued"]
    assert isinstance(decisions[0], FallbackApplied)
    assert "runs suppressed" in decisions[0].reason


@pytest.mark.parametrize("mode", [Mode.STEER, Mode.STEER_BACKLOG])
def test_steer_injects_into_a_run_that_can_take_it(mode: Mode) -> None:
    bench = busy(mode)
    bench.steerable(True)
    decisions = bench.send()
    assert decisions == [RunSteered(run_id=bench.run_id, request_id="ar_2")]
    assert [p.request.request_id for p in bench.state.active.requests] == ["ar_1", "ar_2"]  # type: ignore[union-attr]
    assert bench.state.pending == []


def test_steer_when_the_run_cannot_take_it_high_interrupts() -> None:
    bench = busy(Mode.STEER)
    assert types(bench.send(priority="high")) == ["RequestQueued", "RunAborted", "RunStarted"]


def test_steer_when_the_run_cannot_take_it_others_follow_up() -> None:
    bench = busy(Mode.STEER)
    decisions = bench.send(priority="normal")
    assert types(decisions) == ["FallbackApplied", "RequestQueued"]


def test_steer_backlog_when_the_run_cannot_take_it_enqueues_and_never_interrupts() -> None:
    bench = busy(Mode.STEER_BACKLOG)
    run_id = bench.run_id
    assert types(bench.send(priority="high")) == ["RequestQueued"]
    assert bench.run_id == run_id


def test_steerability_is_an_input_so_replay_knows_it() -> None:
    bench = busy(Mode.STEER_BACKLOG)
    bench.steerable(True)
    bench.steerable(False)
    assert types(bench.send()) == ["RequestQueued"]
    assert types(bench.steerable(False)) == []  # no change, nothing to record


def test_collect_while_busy_runs_once_after_the_run_ends_and_the_window_closes() -> None:
    bench = Bench(AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000))
    assert types(bench.send()) == ["RequestQueued"]  # idle: the window opens
    assert types(bench.advance(1_500)) == ["RunStarted"]
    bench.send()
    bench.send()
    assert types(bench.finish()) == ["RunCompleted"]  # window still open
    decisions = bench.advance(1_000)
    assert isinstance(decisions[-1], RunStarted) and decisions[-1].request_ids == ("ar_2", "ar_3")


def test_a_config_change_applies_to_new_requests_only() -> None:
    bench = busy(Mode.QUEUE)
    bench.send(priority="low")
    bench.feed(ConfigChanged(at=bench.now, config=AgentConfig(mode=Mode.FOLLOWUP)))
    bench.send(priority="high")
    # The low request queued under strict FIFO keeps its place ahead of nothing it overtook;
    # the new high request is ordered by priority among what is pending.
    assert bench.pending_ids() == ["ar_3", "ar_2"]
    assert [p.mode for p in bench.state.pending] == [Mode.FOLLOWUP, Mode.QUEUE]
