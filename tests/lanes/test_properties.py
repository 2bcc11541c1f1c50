"""Invariants over random interleavings of requests, timers, results, steers and controls."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, AgentState, Budgets, evolve, replay, request_outcomes, verify
from lanes.config import DAY_MS, HOUR_MS, DedupeStrategy, DropPolicy, Mode
from lanes.events import (
    AbortReason,
    BrokerReport,
    CallIntent,
    OperatorAction,
    OperatorCommand,
    OrderIntent,
    RequestDropped,
    RequestQueued,
    RequestSummarized,
    Restarted,
    RunAborted,
    RunStarted,
    RunSteered,
    SpendLimitHit,
    Stopping,
    TradingState,
)
from lanes.requests import RANK, Priority
from tests.lanes.harness import Bench

configs = st.builds(
    AgentConfig,
    mode=st.sampled_from(list(Mode)),
    debounce_ms=st.sampled_from([0, 500, 2_000]),
    cap=st.integers(min_value=1, max_value=5),
    drop_policy=st.sampled_from(list(DropPolicy)),
    dedupe=st.fixed_dictionaries(
        {"hook_trigger": st.sampled_from(list(DedupeStrategy))}
    ),
    dedupe_window_ms=st.sampled_from([0, 60_000, 600_000]),
    budgets=st.builds(
        Budgets,
        max_runs_per_hour=st.none() | st.integers(min_value=1, max_value=3),
        max_runs_per_day=st.none() | st.integers(min_value=2, max_value=6),
        no_trade_cooldown_ms=st.sampled_from([0, 30_000, 900_000]),
    ),
    max_call_depth=st.integers(min_value=0, max_value=3),
    max_calls_per_run=st.integers(min_value=0, max_value=3),
    run_timeout_ms=st.sampled_from([5_000, 120_000]),
    halt_on_alerts=st.sampled_from([(), ("risk",)]),
)

requests = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(
            ["hook_trigger", "hook_trigger", "user_control", "scheduled_audit", "system_alert",
             "agent_call"]
        ),
        "priority": st.sampled_from(["high", "normal", "low"]),
        "dedupeKey": st.sampled_from([None, "a", "b"]),
        "messageId": st.none() | st.sampled_from(["m1", "m2"]),
        "reuse": st.sampled_from([False] * 7 + [True]),
        "depth": st.integers(min_value=1, max_value=5),
        "code": st.sampled_from(["risk", "info"]),
    }
)

request_action = st.tuples(st.just("request"), requests)
actions = st.one_of(
    request_action,
    request_action,
    request_action,
    request_action,
    st.tuples(st.just("finish"), st.fixed_dictionaries({
        "outcome": st.sampled_from(["trade", "no_trade"]),
        "orders": st.just([("buy", 2.0)]),
        "calls": st.just(0),
        "stale": st.just(False),
    })),
    st.tuples(st.just("steerable"), st.just(True)),
    st.tuples(st.just("control"), st.sampled_from(
        ["emergency_stop", "pause", "resume", "cancel_all", "cancel_order"])),
    st.tuples(
        st.just("advance"), st.sampled_from([1, 400, 2_500, 60_000, 600_000, HOUR_MS, DAY_MS])
    ),
    st.tuples(st.just("finish"), st.fixed_dictionaries({
        "outcome": st.sampled_from(["trade", "no_trade"]),
        "orders": st.lists(st.tuples(st.sampled_from(["buy", "sell"]),
                                     st.sampled_from([0.5, 1.0, 2.0])), max_size=2),
        "calls": st.integers(min_value=0, max_value=4),
        "stale": st.booleans(),
    })),
    st.tuples(st.just("fail"), st.none()),
    st.tuples(st.just("spend_limit"), st.none()),
    st.tuples(st.just("steerable"), st.booleans()),
    st.tuples(st.just("steerable"), st.just(True)),
    st.tuples(st.just("operator"), st.sampled_from(list(OperatorAction))),
    st.tuples(st.just("broker"), st.sampled_from(["filled", "partially_filled", "cancelled"])),
    st.tuples(st.just("restart"), st.none()),
    st.tuples(st.just("stop"), st.none()),
)


def play(bench: Bench, action: str, arg: Any, seen_ids: list[str]) -> None:
    """Apply one random action the way the outside world would."""
    state = bench.state
    if action == "request":
        fields: dict[str, Any] = {"priority": arg["priority"]}
        kind = arg["kind"]
        if arg["dedupeKey"]:
            fields["dedupeKey"] = arg["dedupeKey"]
        if arg["messageId"]:
            fields["messageId"] = arg["messageId"]
        if kind == "agent_call":
            fields["payload"] = {"depth": arg["depth"]}
        if kind == "system_alert":
            fields["payload"] = {"code": arg["code"]}
        if arg["reuse"] and seen_ids:
            fields["requestId"] = seen_ids[len(seen_ids) // 2]
        request = bench.make(kind, **fields)
        seen_ids.append(request.request_id)
        bench.submit(request)
    elif action == "control":
        payload = {"orderId": next(iter(state.orders), "nope")} if arg == "cancel_order" else {}
        bench.control(arg, **payload)
    elif action == "advance":
        bench.advance(arg)
    elif action in ("finish", "fail", "steerable", "spend_limit") and state.active is None:
        return
    elif action == "finish":
        orders = tuple(OrderIntent(symbol="BTCUSD", side=side, qty=qty)
                       for side, qty in arg["orders"])
        calls = tuple(CallIntent(agent_id="helper") for _ in range(arg["calls"]))
        run_id = "stale-run" if arg["stale"] else None
        bench.finish(arg["outcome"], run_id=run_id, orders=orders, calls=calls)
    elif action == "fail":
        bench.fail()
    elif action == "spend_limit":
        bench.feed(SpendLimitHit(at=bench.now, run_id=bench.run_id, provider="anthropic",
                                 reason="credit balance too low"))
    elif action == "steerable":
        bench.steerable(arg)
    elif action == "operator":
        run_id = state.active.run_id if state.active else None
        bench.feed(OperatorCommand(at=bench.now, action=arg, principal="ops", run_id=run_id))
    elif action == "broker":
        order_id = next(iter(state.orders), "unknown")
        bench.feed(BrokerReport(at=bench.now, order_id=order_id, status=arg, filled_qty=1.0,
                                price=100.0))
    elif action == "restart":
        bench.feed(Restarted(at=bench.now))
    elif action == "stop":  # a graceful shutdown, then the next start
        bench.feed(Stopping(at=bench.now))
        bench.feed(Restarted(at=bench.now))


def priority_in(state: AgentState, request_id: str) -> Priority:
    """The priority of a request the state holds (just received, or pending)."""
    if state.staged is not None and state.staged.request_id == request_id:
        return state.staged.priority
    return next(p.request.priority for p in state.pending if p.request.request_id == request_id)


def check_invariants(bench: Bench) -> None:
    """Everything that must hold of the log and the state, whatever happened."""
    config = bench.state.config
    log = bench.log
    # Replay from the stored form gives back the live state; verify finds no divergence.
    assert replay(bench.round_tripped())[bench.agent] == bench.state
    assert verify(bench.round_tripped()) is None

    # Conservation: every request is in exactly one place, and the state agrees.
    outcomes = request_outcomes(log)
    assert set(outcomes.values()) <= {
        "ran", "running", "pending", "deduped", "dropped", "summarized", "aborted", "rejected"
    }
    pending = {k for k, v in outcomes.items() if v == "pending"}
    assert pending == {p.request.request_id for p in bench.state.pending}
    running = {k for k, v in outcomes.items() if v == "running"}
    active = bench.state.active
    assert running == ({p.request.request_id for p in active.requests} if active else set())

    queued_order: dict[str, int] = {}
    starts: list[int] = []
    overflow = 0
    requeued: set[str] = set()  # put back at the head by a restart, by design
    run_requests: dict[str, list[str]] = {}
    state = AgentState(agent_id=bench.agent)
    for entry in log:
        event = entry.event
        if isinstance(event, RequestQueued):
            queued_order[event.request_id] = len(queued_order)
        elif isinstance(event, RunStarted):
            assert state.trading is not TradingState.HALTED, "a run started while HALTED"
            starts.append(state.now)
            run_requests[event.run_id] = list(event.request_ids)
        elif isinstance(event, RunSteered):
            run_requests[event.run_id].append(event.request_id)
        elif isinstance(event, RunAborted) and event.reason is AbortReason.INTERRUPT:
            assert event.by is not None and priority_in(state, event.by) is Priority.HIGH
        elif isinstance(event, RequestDropped | RequestSummarized) and "cap" in event.reason:
            assert priority_in(state, event.request_id) is not Priority.HIGH, (
                "cap dropped a high request"
            )
        evolve(state, event)
        # A cap is never exceeded by an arrival; only a restart may put the requests of the
        # interrupted run back over it (they are never lost), and the next arrival trims it.
        if isinstance(event, RunAborted) and event.requeued:
            overflow = max(0, len(state.pending) - config.cap)
            requeued.update(run_requests[event.run_id])
        elif isinstance(event, RequestQueued):
            overflow = 0
        elif isinstance(event, RunStarted | RequestDropped | RequestSummarized):
            overflow = max(0, min(overflow, len(state.pending) - config.cap))
        assert len(state.pending) <= config.cap + overflow
        # FIFO within a priority class (strict arrival order in queue mode).
        for rank in (2, 1, 0):
            order = [queued_order[p.request.request_id] for p in state.pending
                     if (RANK[p.request.priority] == rank or config.mode is Mode.QUEUE)
                     and p.request.request_id not in requeued]
            assert order == sorted(order), "pending list out of arrival order"

    # No budget window is ever exceeded.
    budgets = config.budgets
    for limit, span in ((budgets.max_runs_per_hour, HOUR_MS), (budgets.max_runs_per_day, DAY_MS)):
        if limit is not None:
            for t in starts:
                assert sum(1 for s in starts if t - span < s <= t) <= limit


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, script=st.lists(actions, min_size=10, max_size=80))
def test_random_interleavings_keep_every_invariant(
    config: AgentConfig, script: list[tuple[str, Any]]
) -> None:
    bench = Bench(config)
    seen_ids: list[str] = []
    for action, arg in script:
        play(bench, action, arg, seen_ids)
    check_invariants(bench)


@settings(max_examples=60, deadline=None)
@given(config=configs, script=st.lists(actions, max_size=40))
def test_the_log_replays_to_the_same_state_at_every_step(
    config: AgentConfig, script: list[tuple[str, Any]]
) -> None:
    bench = Bench(config)
    seen_ids: list[str] = []
    for action, arg in script:
        play(bench, action, arg, seen_ids)
        assert replay(bench.log)[bench.agent] == bench.state


def test_every_outcome_is_reachable() -> None:
    """The invariants above are not vacuous: a plain script reaches every outcome."""
    bench = Bench(AgentConfig(mode=Mode.INTERRUPT, cap=1, drop_policy=DropPolicy.SUMMARIZE))
    bench.send(dedupeKey="x")
    bench.send(dedupeKey="x")
    bench.send(priority="low")
    bench.send("user_control", payload={"action": "pause"})
    bench.send(priority="high")
    bench.control("emergency_stop")
    bench.control("pause")
    bench.send(priority="normal")
    bench.send(priority="low")
    counts = Counter(request_outcomes(bench.log).values())
    assert set(counts) == {"ran", "deduped", "summarized", "aborted", "rejected", "pending"}
