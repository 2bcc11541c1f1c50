"""Why an agent is blocked (`gateway.reads.blocked`, `lanes.gate.gate_waits`): the reasons the
overview and the agent page show, derived from the state alone."""

from __future__ import annotations

from typing import Any

from gateway.market.events import from_ms, iso
from gateway.reads.blocked import GATE_SLOW_MS, blocked_view
from lanes import AgentConfig, Budgets
from lanes.events import RequestReceived, SpendLimitHit
from lanes.gate import gate_waits
from lanes.gate.events import GateLimits
from lanes.replay import LogFold, replay
from lanes.snapshot import dump_fold, load_fold
from tests.lanes.harness import T0, Bench
from tests.lanes.test_gate import GateBench


def at(ms: int) -> str:
    return iso(from_ms(ms))


def kinds(reasons: list[dict[str, Any]]) -> list[str]:
    return [r["kind"] for r in reasons]


def stop(bench: Bench, action: str, principal: str) -> None:
    request = bench.make("user_control", payload={"action": action})
    bench.feed(RequestReceived(at=bench.now, request=request, principal=principal))


def test_a_healthy_idle_agent_is_not_blocked() -> None:
    bench = Bench()
    assert blocked_view(bench.state, bench.now) == ([], "none")


def test_a_halted_agent_says_who_stopped_it_and_when() -> None:
    bench = Bench()
    bench.advance(5_000)
    stop(bench, "emergency_stop", "ops")
    reasons, level = blocked_view(bench.state, bench.now + 1_000)
    assert reasons == [{"kind": "halted", "by": "ops", "at": at(T0 + 5_000),
                        "action": "emergency_stop"}]
    assert level == "critical"


def test_a_resume_ends_the_halt_and_a_pause_says_who_paused() -> None:
    bench = Bench()
    stop(bench, "emergency_stop", "ops")
    bench.advance(1_000)
    stop(bench, "resume", "desk")
    assert blocked_view(bench.state, bench.now) == ([], "none")
    bench.advance(1_000)
    stop(bench, "pause", "risk")
    reasons, level = blocked_view(bench.state, bench.now)
    assert reasons == [{"kind": "reducing", "by": "risk", "at": at(T0 + 2_000),
                        "action": "pause"}]
    assert level == "warning"


def test_who_halted_survives_replay_and_a_snapshot() -> None:
    bench = Bench()
    bench.advance(5_000)
    stop(bench, "emergency_stop", "ops")
    replayed = replay(bench.round_tripped())[bench.agent]
    assert replayed == bench.state
    assert replayed.trading_change is not None and replayed.trading_change.by == "ops"
    loaded, _ = load_fold(dump_fold(LogFold(states={bench.agent: replayed}), "ev"))
    assert loaded.states[bench.agent] == bench.state


def test_a_request_without_a_principal_is_attributed_to_its_source() -> None:
    bench = Bench(AgentConfig(halt_on_alerts=("*",)))
    bench.send("system_alert", payload={"code": "broker_down"}, dedupeKey="a1",
               source="risk-engine")
    reasons, _ = blocked_view(bench.state, bench.now)
    assert reasons[0]["kind"] == "halted"
    assert reasons[0]["by"] == "alert broker_down from risk-engine"  # the alert named


def test_a_spend_hold_says_why_and_a_resume_lifts_it() -> None:
    bench = Bench()
    bench.send()
    bench.advance(3_000)
    bench.feed(SpendLimitHit(at=bench.now, run_id=bench.run_id, provider="anthropic",
                             reason="credit balance too low"))
    reasons, level = blocked_view(bench.state, bench.now)
    assert reasons == [{"kind": "held", "reason": "anthropic: credit balance too low",
                        "at": at(T0 + 3_000)}]
    assert level == "warning"
    stop(bench, "resume", "ops")
    assert blocked_view(bench.state, bench.now) == ([], "none")


def test_a_failed_run_needs_attention_until_a_run_completes() -> None:
    bench = Bench()
    bench.send()
    bench.advance(2_000)
    bench.fail("provider said 500")
    reasons, level = blocked_view(bench.state, bench.now)
    assert reasons == [{"kind": "failed", "runId": "agent_btc_5m-r1", "at": at(T0 + 2_000),
                        "error": "provider said 500"}]
    assert level == "warning"
    loaded, _ = load_fold(dump_fold(LogFold(states={bench.agent: bench.state}), "ev"))
    assert loaded.states[bench.agent] == bench.state == replay(bench.round_tripped())[bench.agent]
    bench.send()
    bench.finish("trade")
    assert blocked_view(bench.state, bench.now) == ([], "none")


def test_a_resume_says_a_failure_was_seen_to() -> None:
    bench = Bench()
    bench.send()
    bench.fail("boom")
    stop(bench, "resume", "ops")
    assert blocked_view(bench.state, bench.now) == ([], "none")


def test_a_run_that_timed_out_counts_as_failed() -> None:
    bench = Bench(AgentConfig(run_timeout_ms=5_000))
    bench.send()
    bench.advance(6_000)
    reasons, _ = blocked_view(bench.state, bench.now)
    assert reasons == [{"kind": "failed", "runId": "agent_btc_5m-r1", "at": at(T0 + 5_000),
                        "error": "timed out after 5000 ms"}]


def test_a_budget_suppression_names_the_budget_and_when_it_reopens() -> None:
    bench = Bench(AgentConfig(budgets=Budgets(max_runs_per_hour=1)))
    bench.send()
    bench.finish("trade")
    bench.advance(1_000)
    bench.send()
    reasons, level = blocked_view(bench.state, bench.now)
    assert reasons == [{"kind": "suppressed", "budget": "runsPerHour",
                        "reason": "runsPerHour budget", "limit": 1,
                        "until": at(T0 + 3_600_000), "pending": 1}]
    assert level == "warning"


def test_a_cooldown_says_until_when_and_is_only_information() -> None:
    bench = Bench(AgentConfig(budgets=Budgets(no_trade_cooldown_ms=30_000)))
    bench.send()
    bench.finish("no_trade")
    bench.send()
    reasons, level = blocked_view(bench.state, bench.now)
    assert reasons == [{"kind": "cooldown", "until": at(T0 + 30_000), "suppressing": True}]
    assert level == "info"


def test_a_running_agent_says_for_how_long() -> None:
    bench = Bench()
    bench.send()
    reasons, level = blocked_view(bench.state, bench.now + 12_000)
    assert kinds(reasons) == ["running"]
    assert reasons[0]["forMs"] == 12_000 and reasons[0]["since"] == at(T0)
    assert level == "none"


def test_the_gate_names_the_limit_and_the_next_slot() -> None:
    gate = GateBench(GateLimits(requests_per_minute=1))
    gate.request("s1", agent_id="alpha")
    gate.now += 2_000
    gate.request("s2", agent_id="bravo")
    waits = gate_waits(gate.state, gate.now)
    assert list(waits) == ["bravo"]
    wait = waits["bravo"]
    assert (wait.limit, wait.first, wait.waiting, wait.since) == ("rpm", True, 1, gate.now)
    assert wait.next_slot_at == T0 + 60_000  # when alpha's grant leaves the window


def test_an_agent_behind_another_waits_for_what_holds_the_head() -> None:
    gate = GateBench(GateLimits(max_concurrent=1))
    gate.request("s1", agent_id="alpha")
    gate.request("s2", agent_id="bravo")
    gate.request("s3", agent_id="charlie")
    waits = gate_waits(gate.state, gate.now)
    assert {a: (w.limit, w.first) for a, w in waits.items()} == {
        "bravo": ("concurrency", True), "charlie": ("concurrency", False)}
    assert waits["charlie"].detail.startswith("behind another agent's request: ")
    assert not any("alpha" in w.detail or "bravo" in w.detail for w in waits.values())
    assert waits["charlie"].next_slot_at is None  # a slot comes back when a call ends


def test_a_long_gate_wait_needs_attention() -> None:
    gate = GateBench(GateLimits(max_concurrent=1))
    gate.request("s1", agent_id="alpha")
    gate.request("s2", agent_id="bravo")
    bench = Bench(agent="bravo")
    wait = gate_waits(gate.state, gate.now)["bravo"]
    short, level = blocked_view(bench.state, gate.now + 1_000, "sim-llm", wait)
    assert short[0]["kind"] == "gate" and short[0]["provider"] == "sim-llm"
    assert short[0]["limit"] == "concurrency" and level == "info"
    _, level = blocked_view(bench.state, gate.now + GATE_SLOW_MS, "sim-llm", wait)
    assert level == "warning"
