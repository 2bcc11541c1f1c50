"""The provider gate shares tokens, whichever limit binds: agents of different call sizes
that always want more than the gate can give get the same tokens over a long horizon, no
grant ever exceeds a limit, and capacity is never left unused for nothing."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from unittest.mock import patch

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from lanes.gate import (
    FAIR_GRACE_MS,
    GateState,
    blocker,
    decide_gate,
    fair_hold,
    next_gate_due,
    unnamed,
)
from lanes.gate.events import (
    WINDOW_MS,
    CallOutcome,
    FreedBy,
    GateDecision,
    GateInput,
    GateLimits,
    GateLimitsChanged,
    GateTimer,
    SlotCancelled,
    SlotFreed,
    SlotGranted,
    SlotRefused,
    SlotReleased,
    SlotRequested,
)
from lanes.gate.holds import _between_calls, _held_for, fits
from lanes.gate.state import GateState as State
from lanes.gate.state import Waiting
from lanes.policy import POLICY
from tests.lanes.test_gate import T0, GateBench, granted

BASE_INPUT, BASE_OUTPUT = 1_000, 250
"""An agent of size k asks for k times these, every call."""
BINDING = ("requests", "input tokens", "output tokens", "concurrency")


@dataclass
class Saturated:
    """Agents that each call again as soon as a call ends, against one gate, in virtual
    time; every grant is checked against the limits as it is made."""

    limits: GateLimits
    sizes: list[int]
    latencies: list[int]
    weights: list[int] | None = None
    """Per agent: its weight at the gate (None: all 1)."""
    state: GateState = field(default_factory=lambda: GateState(provider="sim", policy=POLICY))
    tokens: list[int] = field(default_factory=list)
    """Per agent: the tokens (estimates, input + output) of its requests granted."""
    grants: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(at, agent, input, output) of every grant."""
    window: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Requests, input and output tokens granted in the last 60 s (``grants[first:]``)."""
    first: int = 0
    in_flight: int = 0
    refused: int = 0
    later: list[tuple[int, int, str, int]] = field(default_factory=list)
    """A heap of (at, seq, "release" | "ask", agent)."""
    asked: dict[str, int] = field(default_factory=dict)
    """Slot id -> agent."""
    seq: int = 0
    now: int = T0

    def run(self, minutes: int) -> None:
        """Every agent asks at once, then the gate runs for ``minutes``."""
        self.tokens = [0] * len(self.sizes)
        self.feed(GateLimitsChanged(at=self.now, limits=self.limits))
        for agent in range(len(self.sizes)):
            self.ask(agent)
        end = T0 + minutes * WINDOW_MS
        while self.now < end:
            due = next_gate_due(self.state, self.now)
            if self.later and (due is None or self.later[0][0] <= due):
                self.now, _, action, agent = heapq.heappop(self.later)
                if action == "release":
                    self.release(agent)
                else:
                    self.ask(agent)
            elif due is not None:
                self.now = due
                self.feed(GateTimer(at=due))
            else:
                break

    def feed(self, event: GateInput) -> None:
        for decision in decide_gate(self.state, event):
            self.handle(decision)

    def handle(self, decision: GateDecision) -> None:
        if isinstance(decision, SlotGranted):
            agent = self.asked.pop(decision.slot_id)
            size = self.sizes[agent]
            self.tokens[agent] += size * (BASE_INPUT + BASE_OUTPUT)
            self.grants.append((self.now, agent, size * BASE_INPUT, size * BASE_OUTPUT))
            self.in_flight += 1
            self.check_limits()
            self.push(self.now + self.latencies[agent], "release", agent)
        elif isinstance(decision, SlotRefused):
            self.refused += 1
            self.push(self.now + 1_000, "ask", self.asked.pop(decision.slot_id))

    def check_limits(self) -> None:
        window, grants = self.window, self.grants
        _, _, inputs, outputs = grants[-1]
        window[0] += 1
        window[1] += inputs
        window[2] += outputs
        while grants[self.first][0] <= self.now - WINDOW_MS:
            _, _, inputs, outputs = grants[self.first]
            window[0] -= 1
            window[1] -= inputs
            window[2] -= outputs
            self.first += 1
        limits = self.limits
        for limit, used in (
            (limits.requests_per_minute, window[0]),
            (limits.input_tokens_per_minute, window[1]),
            (limits.output_tokens_per_minute, window[2]),
            (limits.max_concurrent, self.in_flight),
        ):
            assert limit is None or used <= limit, "a grant exceeded a limit"

    def push(self, at: int, action: str, agent: int) -> None:
        self.seq += 1
        heapq.heappush(self.later, (at, self.seq, action, agent))

    def ask(self, agent: int) -> None:
        self.seq += 1
        slot_id = f"s{self.seq}"
        self.asked[slot_id] = agent
        size = self.sizes[agent]
        self.feed(
            SlotRequested(
                at=self.now,
                slot_id=slot_id,
                agent_id=f"agent_{agent}",
                run_id=f"run_{self.seq}",
                input_tokens=size * BASE_INPUT,
                output_tokens=size * BASE_OUTPUT,
                weight=self.weights[agent] if self.weights else 1,
            )
        )

    def release(self, agent: int) -> None:
        lease = next(
            lease for lease in self.state.leases.values() if lease.agent_id == f"agent_{agent}"
        )
        self.in_flight -= 1
        self.feed(SlotReleased(at=self.now, slot_id=lease.slot_id, outcome=CallOutcome.OK))
        self.ask(agent)


def binding_limits(binding: str, sizes: list[int], latencies: list[int],
                   weights: list[int] | None = None) -> GateLimits:
    """Limits under which ``binding`` runs out long before anything else, and each agent
    (of ``sizes[i]`` and a call lasting ``latencies[i]``) could alone take at least three
    times its fair share (the same tokens for each; with ``weights``, in proportion)."""
    call = BASE_INPUT + BASE_OUTPUT
    agents = list(zip(sizes, latencies, strict=True))
    scale = [1.0] * len(sizes) if weights is None else [
        w * len(weights) / sum(weights) for w in weights]  # (its share / the mean share)
    # The mean share, in tokens per minute: what keeps every taker at least 3x its share.
    share = int(min(WINDOW_MS // latency * size * call / k
                    for (size, latency), k in zip(agents, scale, strict=True)) // 3)
    wait = {"max_wait_ms": 600_000}
    if binding == "requests":  # (each agent's calls for its share: in proportion to weight)
        calls = sum(share * k / (size * call) for size, k in zip(sizes, scale, strict=True))
        return GateLimits(requests_per_minute=max(1, int(calls)), **wait)
    if binding == "input tokens":
        return GateLimits(input_tokens_per_minute=share * len(sizes) * BASE_INPUT // call, **wait)
    if binding == "output tokens":
        return GateLimits(output_tokens_per_minute=share * len(sizes) * BASE_OUTPUT // call, **wait)
    busy = sum(share * k / (size * call) * latency  # slot-ms a minute
               for (size, latency), k in zip(agents, scale, strict=True))
    return GateLimits(max_concurrent=max(1, int(busy / WINDOW_MS)), **wait)


def saturated(binding: str, sizes: list[int], latencies: list[int],
              weights: list[int] | None = None) -> Saturated:
    """``Saturated`` agents under limits where ``binding`` binds."""
    latencies = latencies[: len(sizes)]
    weights = None if weights is None else weights[: len(sizes)]
    return Saturated(binding_limits(binding, sizes, latencies, weights), sizes, latencies,
                     weights)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    binding=st.sampled_from(BINDING),
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=5).filter(
        lambda sizes: len(set(sizes)) > 1
    ),
    latencies=st.lists(st.integers(min_value=500, max_value=4_000), min_size=5, max_size=5),
)
def test_backlogged_agents_of_different_sizes_get_the_same_tokens_under_any_limit(
    binding: str, sizes: list[int], latencies: list[int]
) -> None:
    """Over 20 minutes, each agent's tokens are within 10 % of the mean, though their
    calls differ up to eightfold and last from 0.5 to 4 s."""
    sim = saturated(binding, sizes, latencies)
    sim.run(minutes=20)

    mean = sum(sim.tokens) / len(sim.tokens)
    assert all(abs(tokens - mean) <= 0.1 * mean for tokens in sim.tokens), (
        sim.tokens,
        sim.refused,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    binding=st.sampled_from(BINDING),
    sizes=st.lists(st.sampled_from([1, 2, 4]), min_size=2, max_size=5),
    weights=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=5, max_size=5),
    latencies=st.lists(st.integers(min_value=500, max_value=4_000), min_size=5, max_size=5),
)
def test_weighted_agents_get_tokens_in_proportion_to_their_weights_under_any_limit(
    binding: str, sizes: list[int], weights: list[int], latencies: list[int]
) -> None:
    """Over 20 minutes, each agent's tokens per unit of weight are within 10 % of the
    mean, whatever their sizes, weights and call lengths."""
    sim = saturated(binding, sizes, latencies, weights)
    sim.run(minutes=20)
    # Fairness is measured in calls' tokens: it needs enough calls of each agent that one
    # call is a small part of its share (limits this coarse failed the 10 % by one call).
    call = BASE_INPUT + BASE_OUTPUT
    assume(all(tokens >= 20 * size * call for tokens, size in zip(sim.tokens, sizes,
                                                                     strict=True)))

    per_weight = [tokens / w for tokens, w in zip(sim.tokens, weights, strict=False)]
    mean = sum(per_weight) / len(per_weight)
    assert all(abs(x - mean) <= 0.1 * mean for x in per_weight), (sim.tokens, weights[:len(sizes)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    binding=st.sampled_from(BINDING[:3]),
    sizes=st.lists(st.sampled_from([1, 2, 4]), min_size=2, max_size=6),
    latencies=st.lists(st.integers(min_value=100, max_value=1_000), min_size=6, max_size=6),
)
@example(binding="input tokens", sizes=[1, 4, 1], latencies=[100, 100, 675, 100, 100, 100])
def test_a_saturated_gate_uses_nearly_all_its_binding_limit_allows(
    binding: str, sizes: list[int], latencies: list[int]
) -> None:
    """What the fair share holds back is soon used: a saturated per-minute limit is used to
    at least 95 % over the horizon, even by a few agents whose calls each take up to a
    twentieth of it (the worst found is the example above, 95.8 %; most such desks use
    97 % and more, and the bench, 100 agents, 99 % and more; the concurrency is checked
    call by call by the next test). Coarser limits lose more to the head of the
    line (a big call waits for room while nothing overtakes it), with or without fairness."""
    sim = saturated(binding, sizes, latencies)
    limits = sim.limits
    per_minute, call = {
        "requests": (limits.requests_per_minute, 1),
        "input tokens": (limits.input_tokens_per_minute, max(sizes) * BASE_INPUT),
        "output tokens": (limits.output_tokens_per_minute, max(sizes) * BASE_OUTPUT),
    }[binding]
    assert per_minute is not None
    assume(per_minute >= 20 * call)
    minutes = 20
    sim.run(minutes)

    used = {
        "requests": len(sim.grants),
        "input tokens": sum(g[2] for g in sim.grants),
        "output tokens": sum(g[3] for g in sim.grants),
    }[binding]
    assert used >= 0.95 * per_minute * minutes, (used, per_minute * minutes)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    binding=st.sampled_from(BINDING),
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5),
    latencies=st.lists(st.integers(min_value=500, max_value=4_000), min_size=5, max_size=5),
)
def test_nothing_that_fits_waits_unless_an_agent_with_fewer_tokens_is_between_calls(
    binding: str, sizes: list[int], latencies: list[int]
) -> None:
    """After every input, the next in line is held by a limit, or by `fair_hold` for an
    agent that is between calls and has had fewer tokens (so never when only one agent
    uses the gate)."""

    class Checked(Saturated):
        def feed(self, event: GateInput) -> None:
            super().feed(event)
            state = self.state
            if not state.waiting:
                return
            head = next(iter(sorted(state.waiting.values(), key=lambda e: (e.tag, e.seq))))
            if blocker(state, head) is None:
                behind = _held_for(state, head)
                assert behind is not None, "a request that fits waits for nothing"
                assert _between_calls(state, behind), fair_hold(state, head)
                assert state.shares[behind].finish < head.tag, fair_hold(state, head)
                assert behind != head.agent_id and len(sizes) > 1

    latencies = latencies[: len(sizes)]
    sim = Checked(binding_limits(binding, sizes, latencies), sizes, latencies)
    sim.run(minutes=5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    agents=st.integers(min_value=2, max_value=16),
    rpm=st.integers(min_value=5, max_value=100),
    max_wait_ms=st.sampled_from([5_000, 600_000]),
    seed=st.integers(min_value=0, max_value=2**16),
    ends=st.lists(st.sampled_from(["release", "cancel", "pause"]), min_size=7, max_size=7),
)
def test_the_grant_path_answers_what_the_limits_and_the_fair_hold_say(
    agents: int, rpm: int, max_wait_ms: int, seed: int, ends: list[str]
) -> None:
    """At every request the grant path asks about, under the RPM alone (where it keeps a
    hold it found instead of walking the agents between calls again, `GateIndex.held`),
    `fits` says what `blocker` and `_held_for` say: agents whose calls vary in size and
    length, ending released or cancelled, asking again at once or after their grace, some
    waiting past their bound."""
    asked = 0
    rng = random.Random(seed)

    def checked(state: State, entry: Waiting) -> bool:
        nonlocal asked
        asked += 1
        answer = fits(state, entry)
        assert answer == (blocker(state, entry) is None and _held_for(state, entry) is None)
        return answer

    class Varied(Saturated):
        def ask(self, agent: int) -> None:
            self.sizes[agent] = rng.choice([1, 2, 3, 4])
            self.latencies[agent] = rng.randint(500, 3_000)
            super().ask(agent)

        def release(self, agent: int) -> None:
            end = ends[self.seq % len(ends)]
            if end == "release":
                super().release(agent)
                return
            lease = next(lease for lease in self.state.leases.values()
                         if lease.agent_id == f"agent_{agent}")
            self.in_flight -= 1
            if end == "cancel":
                self.feed(SlotCancelled(at=self.now, slot_id=lease.slot_id))
                self.ask(agent)
            else:  # released, and back after its grace
                self.feed(SlotReleased(at=self.now, slot_id=lease.slot_id,
                                       outcome=CallOutcome.OK))
                self.push(self.now + rng.randint(FAIR_GRACE_MS // 2, 3 * FAIR_GRACE_MS),
                          "ask", agent)

    limits = GateLimits(requests_per_minute=rpm, max_wait_ms=max_wait_ms)
    sim = Varied(limits, [1] * agents, [1_000] * agents)
    with patch("lanes.gate.decide.fits", checked):
        sim.run(minutes=3)
    assert asked


def test_a_hold_for_an_agent_that_does_not_call_again_ends_with_its_grace() -> None:
    """An agent with fewer tokens is kept room for its next call only while it is in a
    call and for FAIR_GRACE_MS after: if it does not ask again, the room goes to the others."""
    bench = GateBench(GateLimits(requests_per_minute=3, max_wait_ms=600_000))
    bench.request("small", agent_id="small", input_tokens=100, output_tokens=0)
    bench.request("big1", agent_id="big", input_tokens=10_000, output_tokens=0)
    bench.request("big2", agent_id="big", input_tokens=10_000, output_tokens=0)
    assert set(bench.state.leases) == {"small", "big1"}  # big2: room kept for small
    assert "held for its fair share: small" in str(
        fair_hold(bench.state, bench.state.waiting["big2"], named=True)
    )

    bench.advance(1_000)
    bench.release("small")  # and it does not ask again
    assert bench.state.waiting.keys() == {"big2"}
    assert granted(bench.advance(FAIR_GRACE_MS)) == ["big2"]


def test_a_request_refused_after_a_fair_share_hold_is_not_told_who_it_waited_for() -> None:
    """The gate's own log names the agent a fair hold kept room for (as it always has: old
    logs verify); the refused agent is told the reason without it (`unnamed`), since it
    lands in its own log, which a token scoped to that agent reads."""
    bench = GateBench(GateLimits(requests_per_minute=3, max_wait_ms=5_000))
    bench.request("small", agent_id="small-desk", input_tokens=100, output_tokens=0)
    bench.request("big1", agent_id="big", input_tokens=10_000, output_tokens=0)
    bench.request("big2", agent_id="big", input_tokens=10_000, output_tokens=0)
    bench.request("big3", agent_id="big", input_tokens=10_000, output_tokens=0)
    assert set(bench.state.leases) == {"small", "big1"}  # big2, big3: room kept for small
    assert "small-desk" not in str(fair_hold(bench.state, bench.state.waiting["big2"]))

    found = [d for d in bench.advance(5_001) if isinstance(d, SlotRefused)]

    assert [d.slot_id for d in found] == ["big2", "big3"]
    for refusal in found:
        assert "held for its fair share: small-desk and maybe other agents" in refusal.reason
        told = unnamed(refusal.reason)
        assert "small-desk" not in told, told
        assert "held for its fair share: agents with fewer tokens granted are between calls" \
            in told
        assert told.startswith("waited ") and told.endswith("; retry later")


def test_a_slot_freed_by_an_agent_with_fewer_tokens_is_kept_for_its_next_call_a_moment() -> None:
    """Under a concurrency cap, the agent that has had fewer tokens gets the slot it frees
    back if it asks again within FAIR_GRACE_MS, though another agent was waiting."""
    bench = GateBench(GateLimits(max_concurrent=1, max_wait_ms=600_000))
    bench.request("small1", agent_id="small", input_tokens=100, output_tokens=0)
    bench.request("big1", agent_id="big", input_tokens=10_000, output_tokens=0)
    bench.advance(2_000)
    assert granted(bench.release("small1")) == ["big1"]  # its turn: it has had nothing yet
    bench.advance(2_000)
    bench.request("small2", agent_id="small", input_tokens=100, output_tokens=0)
    bench.request("big2", agent_id="big", input_tokens=10_000, output_tokens=0)
    assert granted(bench.release("big1")) == ["small2"]

    freed = SlotFreed(
        slot_id="small2", by=FreedBy.RELEASED, detail="released after 0 ms: ok", outcome=OK
    )
    assert bench.release("small2") == [freed]  # big2 waits: small may call again
    bench.advance(500)
    assert granted(bench.request("small3", agent_id="small", input_tokens=100)) == ["small3"]


OK = CallOutcome.OK
