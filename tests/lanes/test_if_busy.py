"""A request's own ``ifBusy``: while the agent is busy it overrides the agent's mode for
that request, under that mode's rules, and says so; while idle it changes nothing."""

from __future__ import annotations

from lanes import AgentConfig, Mode, verify
from lanes.events import FallbackApplied, RequestQueued, RequestRejected, RunAborted
from tests.lanes.harness import Bench, types


def busy(mode: Mode = Mode.FOLLOWUP) -> Bench:
    bench = Bench(AgentConfig(mode=mode))
    bench.send()
    assert bench.state.active is not None
    return bench


def test_reject_refuses_while_busy_and_is_taken_while_idle() -> None:
    bench = busy()
    decisions = bench.send(ifBusy="reject")
    assert types(decisions) == ["RequestRejected"]
    rejected = decisions[0]
    assert isinstance(rejected, RequestRejected) and rejected.transient
    assert "busy with run" in rejected.reason and "ifBusy reject" in rejected.reason
    bench.finish()
    assert types(bench.send(ifBusy="reject"))[:2] == ["RequestQueued", "RunStarted"]


def test_interrupt_preempts_only_at_high_priority_and_says_why_it_did_not() -> None:
    bench = busy()
    low = bench.send(ifBusy="interrupt")
    assert types(low) == ["FallbackApplied", "RequestQueued"]
    assert isinstance(low[0], FallbackApplied) and low[0].reason.startswith("ifBusy interrupt: ")
    high = bench.send(ifBusy="interrupt", priority="high")
    assert any(isinstance(d, RunAborted) for d in high)


def test_a_request_may_steer_an_agent_that_would_follow_up_and_queue_one_that_would_steer(
) -> None:
    bench = busy(Mode.FOLLOWUP)
    bench.steerable()
    assert types(bench.send(ifBusy="steer")) == ["RunSteered"]
    assert types(bench.send()) == ["RequestQueued"]
    steering = busy(Mode.STEER)
    steering.steerable()
    queued = steering.send(ifBusy="queue")
    assert types(queued) == ["RequestQueued"]
    assert isinstance(queued[0], RequestQueued) and queued[0].mode is Mode.QUEUE
    assert verify(bench.round_tripped()) is None and verify(steering.round_tripped()) is None
