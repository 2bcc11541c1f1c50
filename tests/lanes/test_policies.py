"""Dedupe, caps, budgets, sub-agent calls, the run lifecycle, the trading gate."""

from __future__ import annotations

import pytest

from lanes import AgentConfig, Budgets, Mode, next_due, replay, status
from lanes.config import DAY_MS, HOUR_MS, DropPolicy
from lanes.events import (
    AbortReason,
    AgentCallDispatched,
    AgentCallRejected,
    BrokerReport,
    CallIntent,
    CallUndeliverable,
    Decision,
    OperatorAction,
    OperatorCommand,
    OrderAccepted,
    OrderIntent,
    OrderRejected,
    RequestDropped,
    RequestRejected,
    Restarted,
    RunAborted,
    RunResultIgnored,
    RunsHeld,
    RunsSuppressed,
    RunStarted,
    SpendLimitHit,
    TradingState,
)
from lanes.evolve import PRUNE_EVERY
from lanes.requests import Priority
from tests.lanes.harness import Bench, types


def busy(**config: object) -> Bench:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, **config))  # type: ignore[arg-type]
    bench.send()
    assert bench.state.active is not None
    return bench


# ------------------------------------------------------------------------------- dedupe


def test_message_id_strategy_catches_the_same_message_twice() -> None:
    bench = busy(dedupe={"user_control": "messageId"})
    bench.send("user_control", messageId="m1")
    assert types(bench.send("user_control", messageId="m1")) == ["RequestDeduped"]
    assert types(bench.send("user_control", messageId="m2")) == ["RequestQueued"]


def test_user_control_is_deduped_by_request_id_only_by_default() -> None:
    bench = busy()
    bench.send("user_control", messageId="m1", dedupeKey="same")
    assert types(bench.send("user_control", messageId="m1", dedupeKey="same")) == [
        "RequestQueued"
    ]


def test_strategy_none_never_dedupes() -> None:
    bench = busy(dedupe={"hook_trigger": "none"})
    bench.send(dedupeKey="k")
    assert types(bench.send(dedupeKey="k")) == ["RequestQueued"]


# --------------------------------------------------------------------------------- caps


def test_policy_old_drops_the_oldest_pending_request() -> None:
    bench = busy(cap=2)
    bench.send()
    bench.send()
    decisions = bench.send()
    assert types(decisions) == ["RequestDropped", "RequestQueued"]
    assert decisions[0].request_id == "ar_2"  # type: ignore[union-attr]
    assert bench.pending_ids() == ["ar_3", "ar_4"]


def test_policy_new_refuses_the_incoming_request() -> None:
    bench = busy(cap=2, drop_policy=DropPolicy.NEW)
    bench.send()
    bench.send()
    decisions = bench.send()
    assert decisions == [
        RequestDropped(
            request_id="ar_4",
            reason="cap 2 reached, policy new: dropped the incoming normal-priority request",
        )
    ]
    assert bench.pending_ids() == ["ar_2", "ar_3"]


@pytest.mark.parametrize("policy", list(DropPolicy))
def test_low_goes_first_and_high_is_never_dropped_by_a_cap(policy: DropPolicy) -> None:
    bench = busy(cap=3, drop_policy=policy)
    bench.send(priority="high")
    bench.send(priority="low")
    bench.send(priority="normal")
    bench.send(priority="high")  # the low one goes
    assert [p.request.priority for p in bench.state.pending] == [
        Priority.HIGH, Priority.HIGH, Priority.NORMAL
    ]
    bench.send(priority="high")  # then the normal one
    assert all(p.request.priority is Priority.HIGH for p in bench.state.pending)
    decisions = bench.send(priority="high")  # nothing may go: refused, clearly
    assert isinstance(decisions[0], RequestRejected)
    assert "every pending request is high priority" in decisions[0].reason
    assert len(bench.state.pending) == 3


def test_an_incoming_low_request_is_the_one_dropped_when_it_is_the_lowest() -> None:
    bench = busy(cap=1)
    bench.send(priority="normal")
    decisions = bench.send(priority="low")
    assert types(decisions) == ["RequestDropped"]
    assert decisions[0].request_id == "ar_3"  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ budgets


def test_hourly_budget_suppresses_runs_with_an_alert_and_a_timer_resumes_them() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(max_runs_per_hour=2)))
    bench.send()
    bench.finish()
    bench.advance(60_000)
    bench.send()
    first_start = bench.state.run_starts[0]
    decisions = bench.finish()
    assert types(decisions) == ["RunCompleted"]
    decisions = bench.send()
    assert types(decisions) == ["RequestQueued", "RunsSuppressed"]
    suppressed = decisions[1]
    assert isinstance(suppressed, RunsSuppressed)
    assert suppressed.reason == "hourly" and suppressed.until == first_start + HOUR_MS
    assert "2/2 runs this hour" in suppressed.detail
    assert types(bench.send()) == ["RequestQueued"]  # still accepted, no second alert

    decisions = bench.advance(HOUR_MS)
    assert types(decisions) == ["RunsResumed", "RunStarted"]
    assert status(bench.state, bench.now).counters.suppressions == 1


def test_daily_budget_holds_runs_until_the_oldest_run_leaves_the_day() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(max_runs_per_day=1)))
    bench.send()
    bench.finish()
    decisions = bench.send()
    assert isinstance(decisions[-1], RunsSuppressed) and decisions[-1].reason == "daily"


def test_no_trade_outcome_starts_a_cooldown() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(no_trade_cooldown_ms=30_000)))
    bench.send()
    bench.send()
    decisions = bench.finish("no_trade")
    assert types(decisions) == ["RunCompleted", "RunsSuppressed"]
    assert decisions[1].reason == "cooldown"  # type: ignore[union-attr]
    assert types(bench.advance(29_999)) == []
    assert types(bench.advance(1)) == ["RunsResumed", "RunStarted"]


def test_a_trade_outcome_has_no_cooldown() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(no_trade_cooldown_ms=30_000)))
    bench.send()
    bench.send()
    assert types(bench.finish("trade")) == ["RunCompleted", "RunStarted"]


# ------------------------------------------------------------------------ agent calls


def test_calls_beyond_the_fan_out_limit_are_rejected_with_a_reason() -> None:
    bench = busy(max_calls_per_run=2)
    calls = tuple(CallIntent(agent_id=f"helper{n}") for n in range(3))
    decisions = bench.finish(calls=calls)
    dispatched = [d for d in decisions if isinstance(d, AgentCallDispatched)]
    rejected = [d for d in decisions if isinstance(d, AgentCallRejected)]
    assert [d.call_id for d in dispatched] == ["agent_btc_5m-r1-c1", "agent_btc_5m-r1-c2"]
    assert all(d.depth == 1 for d in dispatched)
    assert rejected == [
        AgentCallRejected(
            run_id="agent_btc_5m-r1", target="helper2",
            reason="fan-out limit of 2 calls per run reached",
            call_id="agent_btc_5m-r1-c3", code="fan_out_limit",
        )
    ]


def test_calls_beyond_the_depth_limit_are_rejected_at_both_ends() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, max_call_depth=3))
    decisions = bench.send("agent_call", payload={"depth": 4})
    assert decisions == [
        RequestRejected(request_id="ar_1", reason="agent_call depth 4 exceeds the limit of 3")
    ]
    bench.send("agent_call", payload={"depth": 3})
    assert bench.state.active is not None and bench.state.active.depth == 3
    decisions = bench.finish(calls=(CallIntent(agent_id="helper"),))
    assert any(
        isinstance(d, AgentCallRejected) and "depth 4 exceeds the limit of 3" in d.reason
        for d in decisions
    )


# ------------------------------------------------------------------------------- runs


def test_a_run_past_its_deadline_is_aborted_by_the_timer() -> None:
    bench = busy(run_timeout_ms=5_000)
    bench.send()
    decisions = bench.advance(5_000)
    assert types(decisions) == ["RunAborted", "RunStarted"]
    assert decisions[0].reason is AbortReason.TIMEOUT  # type: ignore[union-attr]


def test_a_result_for_a_run_that_was_aborted_is_ignored() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.control("emergency_stop")
    bench.control("resume")
    decisions = bench.finish(run_id=run_id, orders=(OrderIntent(symbol="BTCUSD", side="buy",
                                                                qty=1),))
    assert decisions == [
        RunResultIgnored(
            run_id=run_id, reason=f"run {run_id} is not the active run (active: none)"
        )
    ]
    assert bench.state.orders == {}


def test_a_failed_run_frees_the_lane_for_the_next_request() -> None:
    bench = busy()
    bench.send()
    assert types(bench.fail("provider exploded")) == ["RunFailed", "RunStarted"]


def test_restart_aborts_the_active_run_and_puts_its_requests_back_at_the_head() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.send(priority="high")
    decisions = bench.feed(Restarted(at=bench.now))
    assert decisions[0] == RunAborted(run_id=run_id, reason=AbortReason.RESTART, requeued=True)
    assert isinstance(decisions[1], RunStarted) and decisions[1].request_ids == ("ar_1",)
    assert bench.pending_ids() == ["ar_2"]


def test_release_aborts_the_run_and_lets_the_queue_move_on() -> None:
    bench = busy()
    bench.send()
    decisions = bench.feed(
        OperatorCommand(at=bench.now, action=OperatorAction.RELEASE, principal="alice")
    )
    assert types(decisions) == ["OperatorApplied", "RunAborted", "RunStarted"]
    assert decisions[1].reason is AbortReason.RELEASE  # type: ignore[union-attr]
    assert decisions[1].by == "alice"  # type: ignore[union-attr]


def test_abort_run_applies_only_to_the_run_that_is_still_active() -> None:
    bench = busy()
    decisions = bench.feed(OperatorCommand(at=bench.now, action=OperatorAction.ABORT_RUN,
                                           principal="alice", run_id="agent_btc_5m-r9"))
    assert types(decisions) == ["OperatorRejected"]
    assert bench.state.active is not None


def test_clear_queue_drops_every_pending_request_with_the_principal() -> None:
    bench = busy()
    bench.send()
    bench.send()
    decisions = bench.feed(OperatorCommand(at=bench.now, action=OperatorAction.CLEAR_QUEUE,
                                           principal="bob"))
    assert types(decisions) == ["OperatorApplied", "RequestDropped", "RequestDropped"]
    assert bench.state.pending == [] and bench.state.active is not None


# ------------------------------------------------------------------------ trading gate


def intent(side: str, qty: float = 1.0) -> OrderIntent:
    return OrderIntent(symbol="BTCUSD", side=side, qty=qty)  # type: ignore[arg-type]


def test_active_agent_orders_pass_the_gate_and_fills_move_the_position() -> None:
    bench = busy()
    decisions = bench.finish(orders=(intent("buy", 2.0),))
    accepted = decisions[1]
    assert isinstance(accepted, OrderAccepted) and accepted.order_id == "agent_btc_5m-r1-o1"
    bench.feed(BrokerReport(at=bench.now, order_id=accepted.order_id, status="filled",
                            filled_qty=2.0, price=64_000.0))
    assert bench.state.positions == {"BTCUSD": 2.0} and bench.state.orders == {}


def test_reducing_agent_accepts_only_orders_that_reduce_the_position() -> None:
    bench = busy()
    bench.finish(orders=(intent("buy", 2.0),))
    bench.feed(BrokerReport(at=bench.now, order_id="agent_btc_5m-r1-o1", status="filled",
                            filled_qty=2.0, price=64_000.0))
    bench.control("pause")
    bench.send()
    decisions = bench.finish(orders=(intent("buy"), intent("sell", 1.5), intent("sell", 1.0)))
    gate: list[Decision] = [d for d in decisions if isinstance(d, OrderAccepted | OrderRejected)]
    assert types(gate) == ["OrderRejected", "OrderAccepted", "OrderRejected"]
    assert isinstance(gate[0], OrderRejected) and "only orders that reduce" in gate[0].reason
    assert isinstance(gate[2], OrderRejected) and "0.5 left after open" in gate[2].reason


def test_emergency_stop_cancels_open_orders_and_cancels_pass_while_halted() -> None:
    bench = busy()
    bench.finish(orders=(intent("buy"), intent("buy")))
    decisions = bench.control("emergency_stop")
    assert types(decisions) == ["ControlApplied", "OrderCancelRequested", "OrderCancelRequested"]
    assert bench.state.trading is TradingState.HALTED
    assert types(bench.control("cancel_all")) == ["ControlApplied"]  # already requested
    decisions = bench.control("cancel_order", orderId="nope")
    assert types(decisions) == ["RequestRejected"]
    assert isinstance(decisions[0], RequestRejected)
    assert "'nope' is not open" in decisions[0].reason


def test_a_configured_system_alert_halts_the_agent() -> None:
    bench = busy(halt_on_alerts=("risk_limit",))
    assert types(bench.send("system_alert", payload={"code": "info"})) == ["RequestQueued"]
    decisions = bench.send("system_alert", payload={"code": "risk_limit"})
    assert types(decisions) == ["ControlApplied", "RunAborted"]
    assert bench.state.trading is TradingState.HALTED


# ------------------------------------------------------------------------- observability


def test_status_is_derived_from_the_state() -> None:
    bench = busy(cap=1)
    bench.send()
    bench.advance(1_000)
    bench.send()  # drops the previous pending one
    bench.send(dedupeKey="d")
    bench.send(dedupeKey="d")
    view = status(bench.state, bench.now + 500)
    assert view.pending == 1 and view.oldest_pending_age_ms == 500
    assert view.active_run is not None and view.active_run.duration_ms == 1_500
    assert (view.counters.drops, view.counters.dedupes) == (2, 1)
    assert view.runs_last_hour == 1 and view.trading is TradingState.ACTIVE


# --------------------------------------------------------------------------- memories


def test_a_request_id_is_remembered_for_the_idempotency_window() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, idempotency_window_ms=60_000))
    request = bench.make()
    bench.submit(request)
    bench.finish()
    bench.advance(60_000)
    assert types(bench.submit(request)) == ["RequestRepeated"]
    bench.advance(1)
    assert types(bench.submit(request)) == ["RequestQueued", "RunStarted"]


def test_request_id_and_dedupe_memories_stay_bounded_under_a_flood() -> None:
    bench = busy(idempotency_max=100, cap=5)
    for n in range(1_000):
        bench.send(dedupeKey=f"k{n}")
    assert len(bench.state.seen) <= 100 + PRUNE_EVERY
    assert len(bench.state.recent_keys) <= 100 + PRUNE_EVERY
    assert len(bench.state.pending) == 5


# ------------------------------------------------------------------- review regressions


def test_a_collect_window_closing_under_a_budget_hands_the_timer_on() -> None:
    bench = Bench(AgentConfig(mode=Mode.COLLECT, debounce_ms=1_000,
                              budgets=Budgets(max_runs_per_hour=1)))
    bench.send()
    bench.advance(1_000)  # runs
    bench.finish()
    bench.send()
    assert types(bench.advance(1_000)) == ["RunsSuppressed"]
    bench.send()
    due = next_due(bench.state, bench.now)
    assert types(bench.advance(1_000)) == []  # the new window closes; still suppressed
    assert next_due(bench.state, bench.now) != due  # and the timer moves on to the budget
    assert types(bench.advance(HOUR_MS)) == ["RunsResumed", "RunStarted"]


def test_a_dropped_request_may_be_redelivered() -> None:
    bench = busy(cap=1, drop_policy=DropPolicy.NEW)
    bench.send(dedupeKey="a")
    assert types(bench.send(dedupeKey="k")) == ["RequestDropped"]
    bench.finish()
    bench.finish()
    assert types(bench.send(dedupeKey="k")) == ["RequestQueued", "RunStarted"]


def test_a_request_dropped_from_the_queue_may_be_redelivered() -> None:
    bench = busy(cap=1)
    bench.send(dedupeKey="k")
    bench.send(dedupeKey="other")  # drops k (policy old)
    assert types(bench.send(dedupeKey="k")) == ["RequestDropped", "RequestQueued"]


def test_a_summarized_request_still_counts_as_seen() -> None:
    bench = busy(cap=1, drop_policy=DropPolicy.SUMMARIZE)
    bench.send(dedupeKey="k")
    bench.send(dedupeKey="other")
    assert types(bench.send(dedupeKey="k")) == ["RequestDeduped"]


def test_a_restart_keeps_the_summary_of_the_run_it_cut_off() -> None:
    bench = busy(cap=1, drop_policy=DropPolicy.SUMMARIZE)
    bench.send()
    bench.send()  # the first pending one is summarized
    bench.finish()
    assert bench.state.active is not None and bench.state.active.summary is not None
    decisions = bench.feed(Restarted(at=bench.now))
    rerun = decisions[-1]
    assert isinstance(rerun, RunStarted) and rerun.summary is not None
    assert rerun.summary.request_ids == ("ar_2",)


def test_a_full_queue_refusal_may_be_retried_with_the_same_request_id() -> None:
    bench = busy(cap=1)
    bench.send(priority="high")
    request = bench.make(priority="high")
    assert types(bench.submit(request)) == ["RequestRejected"]
    bench.finish()
    assert types(bench.submit(request)) == ["RequestQueued"]


def test_an_undeliverable_call_is_recorded_against_the_run_that_made_it() -> None:
    bench = busy()
    decisions = bench.feed(CallUndeliverable(at=bench.now, call_id="c1", run_id="r1",
                                             target="ghost", reason="unknown agent 'ghost'"))
    assert decisions == [AgentCallRejected(run_id="r1", target="ghost",
                                           reason="unknown agent 'ghost'")]


def test_a_request_id_reused_for_a_different_request_is_refused_not_repeated() -> None:
    bench = busy()
    bench.submit(bench.make(requestId="shared", dedupeKey="trigger"))
    stop = bench.make("user_control", requestId="shared", payload={"action": "emergency_stop"})
    decisions = bench.submit(stop)
    assert isinstance(decisions[0], RequestRejected)
    assert "already used for a different request" in decisions[0].reason
    assert bench.state.trading is TradingState.ACTIVE
    assert types(bench.submit(bench.make(requestId="shared", dedupeKey="trigger"))) == [
        "RequestRepeated"
    ]


# ------------------------------------------------------------------ provider spend limit


def test_a_spend_limit_fails_the_run_pauses_the_agent_and_holds_runs_until_resume() -> None:
    bench = busy()
    run_id = bench.run_id
    decisions = bench.feed(
        SpendLimitHit(at=bench.now, run_id=run_id, provider="anthropic", reason="credit too low")
    )
    assert types(decisions) == ["RunsHeld", "RunFailed"]
    held = decisions[0]
    assert isinstance(held, RunsHeld)
    assert (held.from_state, held.to_state) == (TradingState.ACTIVE, TradingState.REDUCING)
    assert bench.state.trading is TradingState.REDUCING
    view = status(bench.state, bench.now)
    assert view.held == "anthropic: credit too low"
    assert view.counters.holds == 1
    # Requests are still accepted, but no run starts, and no timer is due for them.
    assert types(bench.send()) == ["RequestQueued"]
    assert bench.state.active is None
    assert next_due(bench.state, bench.now) is None
    # A second spend limit (a late one for the same run) neither holds twice nor fails again.
    assert types(bench.feed(SpendLimitHit(at=bench.now, run_id=run_id, provider="anthropic",
                                          reason="again"))) == ["RunResultIgnored"]
    decisions = bench.control("resume")
    assert types(decisions) == ["ControlApplied", "RunsUnheld", "RunStarted"]
    after = status(bench.state, bench.now)
    assert after.held is None and after.trading is TradingState.ACTIVE
    assert replay(bench.round_tripped())[bench.agent] == bench.state


def test_a_spend_limit_while_halted_keeps_the_agent_halted() -> None:
    bench = busy()
    run_id = bench.run_id
    bench.control("emergency_stop")
    decisions = bench.feed(
        SpendLimitHit(at=bench.now, run_id=run_id, provider="openai", reason="insufficient_quota")
    )
    # The run was aborted by the stop already: its late result is ignored.
    assert types(decisions) == ["RunsHeld", "RunResultIgnored"]
    assert bench.state.trading is TradingState.HALTED
    assert types(bench.control("resume"))[:2] == ["ControlApplied", "RunsUnheld"]


def test_a_request_id_is_never_queued_twice_even_after_the_idempotency_window() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP, idempotency_window_ms=1_000, cap=500))
    bench.control("emergency_stop")
    first = bench.make()
    assert types(bench.submit(first)) == ["RequestQueued"]
    bench.advance(DAY_MS)  # far past the window, and still pending (HALTED)
    for _ in range(2 * PRUNE_EVERY):  # enough arrivals to prune the id memory
        bench.send()
    assert types(bench.submit(first)) == ["RequestRepeated"]
    assert bench.pending_ids().count(first.request_id) == 1
