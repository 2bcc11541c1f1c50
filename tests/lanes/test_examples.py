"""The cases a person would try first."""

from __future__ import annotations

from lanes import AgentConfig, Mode, replay, request_outcomes
from lanes.config import DropPolicy
from lanes.events import (
    AbortReason,
    ControlApplied,
    RequestDeduped,
    RequestReceived,
    RequestSummarized,
    RunAborted,
    RunStarted,
    TradingState,
)
from tests.lanes.harness import Bench, types


def test_emergency_stop_aborts_the_active_run_and_blocks_runs_until_resume() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    bench.send(dedupeKey="t1")
    run_id = bench.run_id
    bench.send(dedupeKey="t2")

    decisions = bench.control("emergency_stop")

    assert types(decisions) == ["ControlApplied", "RunAborted"]
    assert decisions[1] == RunAborted(
        run_id=run_id, reason=AbortReason.EMERGENCY_STOP, by=decisions[0].request_id  # type: ignore[union-attr]
    )
    assert bench.state.trading is TradingState.HALTED and bench.state.active is None
    assert types(bench.send(dedupeKey="t3")) == ["RequestQueued"]
    assert types(bench.advance(3_600_000)) == []
    assert types(bench.control("pause")) == ["RequestRejected"]
    assert bench.state.trading is TradingState.HALTED

    decisions = bench.control("resume")
    assert types(decisions) == ["ControlApplied", "RunStarted"]
    assert bench.state.active is not None
    assert [p.request.dedupe_key for p in bench.state.active.requests] == ["t2"]
    assert request_outcomes(bench.log)["ar_1"] == "aborted"


def test_collect_batches_three_triggers_into_one_run() -> None:
    bench = Bench(AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000))
    for n in range(3):
        assert types(bench.send(dedupeKey=f"two_green:BTCUSD:{n}")) == ["RequestQueued"]
        bench.advance(400)
    assert bench.state.active is None

    decisions = bench.advance(1_000)

    assert types(decisions) == ["RunStarted"]
    started = decisions[0]
    assert isinstance(started, RunStarted)
    assert started.request_ids == ("ar_1", "ar_2", "ar_3")
    assert bench.state.pending == []


def test_collect_window_cannot_be_held_open_forever_by_a_trickle() -> None:
    bench = Bench(AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000, collect_max_wait_ms=3_000))
    started = []
    for n in range(10):
        started += [d for d in bench.send(dedupeKey=f"k{n}") if isinstance(d, RunStarted)]
        started += [d for d in bench.advance(900) if isinstance(d, RunStarted)]
    assert started and started[0].request_ids == ("ar_1", "ar_2", "ar_3", "ar_4")


def test_summarize_folds_dropped_requests_into_the_next_run() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, cap=2, drop_policy=DropPolicy.SUMMARIZE))
    bench.send(dedupeKey="k0")  # runs at once
    for n in range(1, 6):
        bench.send(dedupeKey=f"k{n}")
    assert bench.pending_ids() == ["ar_5", "ar_6"]
    summarized = [e.event for e in bench.log if isinstance(e.event, RequestSummarized)]
    assert [s.request_id for s in summarized] == ["ar_2", "ar_3", "ar_4"]
    assert all("cap 2 reached, policy summarize" in s.reason for s in summarized)

    decisions = bench.finish()

    started = decisions[-1]
    assert isinstance(started, RunStarted)
    assert started.request_ids == ("ar_5",)
    assert started.summary is not None
    assert started.summary.count == 3
    assert started.summary.request_ids == ("ar_2", "ar_3", "ar_4")
    assert bench.state.summary is None


def test_redelivered_hook_trigger_is_deduped_while_pending_and_after_draining() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, dedupe_window_ms=600_000))
    bench.send(dedupeKey="busy")
    key = "two_green:BTCUSD:5m:2026-02-17T03:10:00Z"
    bench.send(dedupeKey=key)  # pending behind the active run

    pending_dup = bench.send(dedupeKey=key)
    assert pending_dup == [RequestDeduped(request_id="ar_3", duplicate_of="ar_2", key=f"k:{key}")]

    bench.finish()  # ar_2 runs
    bench.finish()  # queue drained
    assert bench.state.pending == [] and bench.state.active is None
    bench.advance(60_000)
    assert types(bench.send(dedupeKey=key)) == ["RequestDeduped"]

    bench.advance(600_001)
    assert types(bench.send(dedupeKey=key)) == ["RequestQueued", "RunStarted"]


def test_resubmitting_a_request_id_returns_its_first_decision_and_changes_nothing() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    request = bench.make(dedupeKey="x")
    bench.submit(request)
    before = replay(bench.log)[bench.agent]

    decisions = bench.submit(request)

    assert types(decisions) == ["RequestRepeated"]
    assert decisions[0].first_decision == "accepted"  # type: ignore[union-attr]
    assert bench.state.pending == before.pending and bench.state.active == before.active


def test_control_requests_are_applied_even_while_a_run_is_active() -> None:
    bench = Bench(AgentConfig(mode=Mode.QUEUE))
    bench.send()
    for _ in range(5):
        bench.send()
    decisions = bench.control("pause")
    assert decisions == [
        ControlApplied(
            request_id="ar_7",
            action="pause",  # type: ignore[arg-type]
            from_state=TradingState.ACTIVE,
            to_state=TradingState.REDUCING,
        )
    ]
    assert bench.state.active is not None  # pause lets the run go on


def test_a_stop_of_a_halted_agent_leaves_who_halted_it_and_when() -> None:
    bench = Bench()
    bench.feed(RequestReceived(at=bench.now, principal="alice", request=bench.make(
        "user_control", payload={"action": "emergency_stop"})))
    first = bench.state.trading_change
    bench.now += 2_500
    bench.feed(RequestReceived(at=bench.now, principal="bob", request=bench.make(
        "user_control", payload={"action": "emergency_stop"})))
    assert bench.state.trading_change == first and first is not None and first.by == "alice"


def test_a_halt_set_off_by_an_alert_names_the_alert() -> None:
    bench = Bench(AgentConfig(halt_on_alerts=("connector_down",)))
    bench.feed(RequestReceived(at=bench.now, principal="feeder", request=bench.make(
        "system_alert", payload={"code": "connector_down", "rule": "any_down"})))
    change = bench.state.trading_change
    assert change is not None and change.by == "alert connector_down (any_down) from feeder"
