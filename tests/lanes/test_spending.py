"""Token and spend budgets: alerts at their fractions, runs held back at their limit with
the budget named, and let go again when the window frees enough; a log that verifies."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes import AgentConfig, verify
from lanes.config import HOUR_MS, Budgets, Mode
from lanes.events import BudgetAlert, RunsSuppressed, RunStarted, Usage
from tests.lanes.harness import Bench


def bench(**budgets: Any) -> Bench:
    return Bench(AgentConfig(mode=Mode.FOLLOWUP, budgets=Budgets(**budgets)))


def run(b: Bench, input_tokens: int = 0, output_tokens: int = 0, cost: float | None = None
        ) -> list[Any]:
    b.send()
    assert b.state.active is not None, "no run started"
    return b.finish(usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                                cost=cost))


def test_alerts_at_each_fraction_then_runs_are_held_back_with_the_budget_named() -> None:
    b = bench(max_input_tokens_per_hour=1_000)
    assert not any(isinstance(d, BudgetAlert) for d in run(b, 700))
    alerted = [d for d in run(b, 150) if isinstance(d, BudgetAlert)]
    assert [(a.budget, a.window, a.fraction, a.used) for a in alerted] == [
        ("max_input_tokens_per_hour", "hour", 0.8, 850)]
    decisions = run(b, 200)
    alert = next(d for d in decisions if isinstance(d, BudgetAlert))
    assert alert.fraction == 1.0  # 0.95 and 1 crossed at once: the highest is said
    b.now += 1_000
    held = b.send()
    suppressed = next(d for d in held if isinstance(d, RunsSuppressed))
    assert suppressed.reason == "tokens"
    assert "input tokens 1,000/1,000 this hour" in suppressed.detail
    assert b.state.active is None
    # the first run's 700 leave the window an hour after it: runs start again
    started = b.advance(HOUR_MS)
    assert any(isinstance(d, RunStarted) for d in started)
    assert verify(b.round_tripped()) is None


def test_a_spend_budget_counts_what_runs_cost_and_unset_budgets_keep_nothing() -> None:
    b = bench(max_spend_per_day=1.0, alert_at=(0.5,))
    alerted = [d for d in run(b, cost=0.6) if isinstance(d, BudgetAlert)]
    assert [(a.budget, a.fraction) for a in alerted] == [("max_spend_per_day", 0.5)]
    run(b, cost=0.5)
    suppressed = [d for d in b.send() if isinstance(d, RunsSuppressed)]
    assert suppressed and suppressed[0].reason == "spend"
    plain = bench()
    run(plain, 10_000, 10_000, 5.0)
    assert not plain.state.spend


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 600), st.integers(0, 40 * 60_000)), max_size=20))
def test_runs_never_start_past_a_token_budget_and_the_log_verifies(
        runs: list[tuple[int, int]]) -> None:
    limit = 1_000
    b = bench(max_output_tokens_per_hour=limit)
    for tokens, wait in runs:
        b.advance(wait)
        b.send()
        if b.state.active is not None:
            window = [e for e in b.state.spend if e[0] > b.now - HOUR_MS]
            assert sum(e[2] for e in window) < limit  # it started under the budget
            b.finish(usage=Usage(output_tokens=tokens))
    assert verify(b.round_tripped()) is None
