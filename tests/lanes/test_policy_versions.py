"""Policy versions: a stream adopts the version offered when it is at rest, defers it while
it is busy, and decides under the version it recorded (`lanes.policy`)."""

from __future__ import annotations

from lanes import replay
from lanes.config import AgentConfig, Mode
from lanes.events import CallIntent
from lanes.gate import GateState, fold_gate
from lanes.policy import POLICY, PolicyAdopted, PolicyDeferred, PolicyOffered
from tests.lanes.harness import Bench, types
from tests.lanes.test_gate import GateBench

CALLS = (CallIntent(agent_id="b"), CallIntent(agent_id="c"))


def test_an_agent_at_rest_adopts_the_offered_version_at_once_and_only_once() -> None:
    bench = Bench(policy=None)
    assert bench.state.policy == 1
    assert bench.feed(PolicyOffered(at=bench.now, version=2)) == [PolicyAdopted(version=2)]
    assert bench.state.policy == 2
    assert bench.feed(PolicyOffered(at=bench.now, version=2)) == []  # (not recorded)
    assert bench.feed(PolicyOffered(at=bench.now, version=1)) == []


def test_a_busy_agent_keeps_its_rules_until_it_is_at_rest() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP), policy=None)
    bench.send()
    bench.send()  # waits behind the run
    [deferred] = bench.feed(PolicyOffered(at=bench.now, version=2))
    assert isinstance(deferred, PolicyDeferred) and "run" in deferred.reason
    assert bench.feed(PolicyOffered(at=bench.now, version=2)) == []
    # The run's calls go out at once, as version 1 did; the next run starts: still busy.
    assert types(bench.finish("no_trade", calls=CALLS)) == [
        "RunCompleted", "AgentCallDispatched", "AgentCallDispatched", "RunStarted"]
    assert bench.state.policy == 1
    assert types(bench.finish("no_trade")) == ["RunCompleted", "PolicyAdopted"]
    assert bench.state.policy == 2 and bench.state.policy_offered is None
    bench.send()
    assert types(bench.finish("no_trade", calls=CALLS))[:3] == [
        "RunCompleted", "CallBatchOpened", "AgentCallQueued"]


def test_the_fold_of_the_log_holds_the_version_in_force() -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP), policy=None)
    bench.send()
    bench.feed(PolicyOffered(at=bench.now, version=POLICY))
    assert replay(bench.round_tripped())[bench.agent] == bench.state
    assert bench.state.policy == 1 and bench.state.policy_offered == POLICY
    bench.finish("no_trade")
    assert replay(bench.round_tripped())[bench.agent].policy == POLICY


def test_a_gate_defers_the_version_while_a_slot_is_out_and_adopts_it_when_freed() -> None:
    bench = GateBench()
    bench.state = GateState(provider="anthropic")  # as a gate that never adopted a version
    bench.log = []
    bench.request("s1")
    [deferred] = bench.feed(PolicyOffered(at=bench.now, version=2))
    assert isinstance(deferred, PolicyDeferred) and bench.state.policy == 1
    assert types(bench.release("s1"))[-1] == "PolicyAdopted"  # type: ignore[arg-type]
    assert bench.state.policy == 2
    # From here on an agent between calls (released a moment ago) is held room for:
    assert "agent_a" in bench.state.index.between
    assert fold_gate(GateState(provider="anthropic"), bench.log).policy == 2
