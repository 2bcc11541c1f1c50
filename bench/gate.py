"""The provider gate saturated: 100 agents on a 600 RPM limit for 10 simulated minutes.

Every agent always wants the provider: it asks for a slot, waits, calls for a simulated
latency (1.5 to 6 s), releases with its actual usage (input as estimated, output 25 to 100 %
of the estimate), and asks again at once (1 s later if refused). The pure core (`lanes.gate`)
runs in virtual time, fed as the live gate feeds it: the inputs, and a `GateTimer` whenever
`next_gate_due` says something is due. The variants, reported apart:

- **equal**: 100 equal agents (normal priority, 1,500-4,000 input and 400-1,000 output
  tokens estimated per call);
- **priorities**: 20 high, 50 normal and 30 low agents (the aging between classes at work:
  the share is fair within a class; between classes, the higher one goes first unless a
  lower one has waited ``priority_aging_ms`` per rank longer, so under saturation the high
  agents make more calls than the low ones);
- **token sizes**: half the agents send prompts and answers 4x bigger; the RPM binds;
- **token sizes, input TPM binding**: the same agents under an input-token limit that runs
  out long before the RPM does (not timed);
- **token sizes, output TPM binding**: the same under an output-token limit (not timed);
- **token sizes, concurrency binding**: the same agents, no per-minute limit, at most 10
  calls in flight (not timed).

The gate's share is tokens, whichever limit binds (see `lanes.gate`): agents that all
want more than the gate can give get the same number of tokens over time, counted as the
gate counts them in its fair order, the estimates (input + output) of their granted
requests. So where the agents differ in size the fair result is the same tokens per agent,
and the 1x agents make four times the calls of the 4x ones, under the RPM as under a token
limit or the concurrency cap.

Measures:

- **utilisation** of the limit that binds: requests granted in the period / (RPM x
  minutes), the most a sliding 60 s window can grant (goal >= 98 %); where input tokens
  bind, input tokens granted / (ITPM x minutes); where output tokens bind, output tokens
  charged (the actual usage once released, as the gate's window counts them) / (OTPM x
  minutes); where the concurrency binds, the time slots were held / (max_concurrent x the
  period);
- **Jain's index** J(x) = (sum x)^2 / (n sum x^2), shown x 100, over the granted requests of
  equal agents (100 % is perfectly even, 100/n % is one agent taking all; goal >= 99 %),
  and over the tokens granted (the estimates, input + output, of the requests granted in
  the period) to all agents where they differ in size (goal >= 99 %); with the tokens per
  4x agent / per 1x agent (goal 1 +- 0.1; 4 would be a share by requests);
- **wait** from `SlotRequested` to its `SlotGranted`, in virtual time (p50 / p99 / max);
- **overhead per slot**: the recorded inputs are fed again to a fresh gate with nothing else
  in the loop: the time of `decide_gate` / slots granted, which is one slot's whole life
  (its request, its grant by a timer or a release, its release, the timers it causes); the
  best of 5 runs, after `gateway.base.process.tune_runtime` as in the gateway. The figure
  is CPU time (`time.process_time`: what this process ran, so it holds on a shared machine,
  where other processes' turns inflate the wall time), with the wall time of the same runs
  beside it. Then with what the live gate adds per input: `next_gate_due` after each input,
  and the doorway check of each input (`Codec.encode_checked`, as `ProviderGate` stores it)
  and `encode_gate_event` of each decision: the live gate's whole cost per slot.

    uv run python -m bench.gate [--agents N] [--rpm N] [--minutes N]
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.common import Figure, run
from gateway.base.process import tune_runtime
from lanes.gate import GATE_CODEC, GateState, decide_gate, encode_gate_event, next_gate_due
from lanes.gate.events import (
    WINDOW_MS,
    CallOutcome,
    GateDecision,
    GateInput,
    GateLimits,
    GateLimitsChanged,
    GateTimer,
    SlotGranted,
    SlotRefused,
    SlotReleased,
    SlotRequested,
)
from lanes.policy import POLICY, PolicyOffered
from lanes.requests import Priority

START = 1_771_297_800_000  # 2026-02-17T03:10:00Z
LATENCY_MS = (1_500, 6_000)
"""A simulated provider call takes this long (uniform)."""
RETRY_MS = 1_000
"""An agent whose request was refused asks again this much later."""


@dataclass(frozen=True, slots=True)
class Agent:
    """One simulated agent: its priority and the range of its token estimates."""

    name: str
    priority: Priority = Priority.NORMAL
    input_tokens: tuple[int, int] = (1_500, 4_000)
    output_tokens: tuple[int, int] = (400, 1_000)
    group: str = "all"
    """Agents of one group are equal: Jain's index is taken within a group."""
    weight: int = 1
    """Its gate weight: its share of tokens under contention is in proportion to it."""


@dataclass(slots=True)
class Sim:
    """What one simulation granted, and the inputs it fed (to replay for timing)."""

    limits: GateLimits
    agents: list[Agent]
    end: int
    granted: dict[str, int] = field(default_factory=dict)
    """Agent -> requests granted in the period."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Agent -> estimated tokens granted in the period."""
    input_tokens: int = 0
    """Estimated input tokens granted in the period, all agents."""
    output_charged: dict[str, int] = field(default_factory=dict)
    """Slot granted in the period -> its output tokens as the window counts them: the
    estimate, then the actual usage once released."""
    held_ms: int = 0
    """Time slots were held within the period, all slots together."""
    waits: dict[str, list[int]] = field(default_factory=dict)
    """Agent -> every wait, ms."""
    refused: int = 0
    inputs: list[GateInput] = field(default_factory=list)


def simulate(agents: list[Agent], limits: GateLimits, minutes: int, seed: int = 1) -> Sim:
    """Run the agents against one gate for ``minutes`` of virtual time."""
    rng = random.Random(seed)
    sim = Sim(limits, agents, START + minutes * WINDOW_MS)
    for agent in agents:
        sim.granted[agent.name] = sim.tokens[agent.name] = 0
        sim.waits[agent.name] = []
    by_name = {agent.name: agent for agent in agents}
    state = GateState(provider="sim")
    asked: dict[str, tuple[int, SlotRequested]] = {}  # slot id -> (asked at, request)
    calling: dict[str, SlotRequested] = {}  # granted slots whose call is under way
    later: list[tuple[int, str, str]] = []  # a heap of (at, "release" | "ask", slot | agent)
    granted_at: dict[str, int] = {}  # slot granted in the period and not yet released
    ids = itertools.count(1)

    def feed(event: GateInput) -> None:
        sim.inputs.append(event)
        for decision in decide_gate(state, event):
            handle(decision, event.at)

    def handle(decision: GateDecision, now: int) -> None:
        if isinstance(decision, SlotGranted):
            at, request = asked.pop(decision.slot_id)
            if now < sim.end:
                sim.granted[request.agent_id] += 1
                sim.tokens[request.agent_id] += request.input_tokens + request.output_tokens
                sim.input_tokens += request.input_tokens
                sim.output_charged[decision.slot_id] = request.output_tokens
                granted_at[decision.slot_id] = now
            sim.waits[request.agent_id].append(now - at)
            calling[decision.slot_id] = request
            heapq.heappush(later, (now + rng.randint(*LATENCY_MS), "release", decision.slot_id))
        elif isinstance(decision, SlotRefused):
            sim.refused += 1
            del asked[decision.slot_id]
            heapq.heappush(later, (now + RETRY_MS, "ask", decision.agent_id))

    def ask(agent: Agent, now: int) -> None:
        n = next(ids)
        request = SlotRequested(
            at=now,
            slot_id=f"s{n}",
            agent_id=agent.name,
            run_id=f"run{n}",
            priority=agent.priority,
            input_tokens=rng.randint(*agent.input_tokens),
            output_tokens=rng.randint(*agent.output_tokens),
            weight=agent.weight,
        )
        asked[request.slot_id] = now, request
        feed(request)

    def release(now: int, slot_id: str) -> None:
        request = calling.pop(slot_id)
        output = rng.randint(request.output_tokens // 4, request.output_tokens)
        if slot_id in sim.output_charged:
            sim.output_charged[slot_id] = output
        if slot_id in granted_at:
            sim.held_ms += min(now, sim.end) - granted_at.pop(slot_id)
        feed(
            SlotReleased(
                at=now,
                slot_id=slot_id,
                outcome=CallOutcome.OK,
                input_tokens=request.input_tokens,
                output_tokens=output,
            )
        )
        ask(by_name[request.agent_id], now)

    # As the live gate starts (`gateway.runtime.gate`): offered this code's policy first, so
    # the rules measured are the ones a gateway decides under, not version 1's.
    feed(PolicyOffered(at=START, version=POLICY))
    feed(GateLimitsChanged(at=START, limits=limits))
    for agent in agents:
        ask(agent, START)
    now = START
    while now < sim.end:
        due = next_gate_due(state, now)
        if later and (due is None or later[0][0] <= due):
            now, action, name = heapq.heappop(later)
            if action == "release":
                release(now, name)
            else:
                ask(by_name[name], now)
        elif due is not None:
            now = due
            feed(GateTimer(at=now))
        else:
            break
    sim.held_ms += sum(sim.end - at for at in granted_at.values())  # still held at the end
    return sim


def jain(values: Sequence[int]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one takes everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True, slots=True)
class Overhead:
    """Microseconds per granted slot: CPU time and wall time, each the best of its runs."""

    cpu_us: float
    wall_us: float


def replay_us(
    inputs: list[GateInput], due: bool = False, encode: bool = False, repeat: int = 5
) -> Overhead:
    """Microseconds per granted slot to decide ``inputs`` again on a fresh gate, and with
    ``due`` ask `next_gate_due` after each (as the live gate arms its timer), and with
    ``encode`` check each input at the doorway (`Codec.encode_checked`, which encodes it)
    and encode its decisions, as the live gate appends them: the best of ``repeat`` runs, in
    CPU time and in wall time."""
    best_cpu = best_wall = float("inf")
    slots = 0
    for _ in range(repeat):
        state = GateState(provider="sim")
        tune_runtime()
        cpu, wall = time.process_time(), time.perf_counter()
        for event in inputs:
            if encode:  # (the live gate's doorway: every input, before it is decided)
                GATE_CODEC.encode_checked(event)
            decisions = decide_gate(state, event)
            if due:
                next_gate_due(state, event.at)
            if encode:
                for decision in decisions:
                    encode_gate_event(decision)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        best_cpu, best_wall = min(best_cpu, cpu), min(best_wall, wall)
        slots = state.counters.granted
    return Overhead(best_cpu / slots * 1e6, best_wall / slots * 1e6)


def two_sizes(n: int) -> list[Agent]:
    """Half the agents (the odd ones) send prompts and answers 4x bigger than the others."""
    big = Agent("", input_tokens=(6_000, 16_000), output_tokens=(1_600, 4_000), group="4x")
    return [replace(big, name=f"a{i}") if i % 2 else Agent(f"a{i}", group="1x") for i in range(n)]


def mixed_priorities(n: int) -> list[Agent]:
    """A fifth of the agents high, three tenths low, the rest normal."""
    high, low = n // 5, n * 3 // 10
    ranks = [Priority.HIGH] * high + [Priority.LOW] * low + [Priority.NORMAL] * (n - high - low)
    return [Agent(f"a{i}", priority=p, group=p.value) for i, p in enumerate(ranks)]


def weighted(n: int) -> list[Agent]:
    """Equal agents of weights 1, 2 and 4: two fifths weigh 1, two fifths 2, a fifth 4."""
    ones, twos = n * 2 // 5, n * 2 // 5
    weights = [1] * ones + [2] * twos + [4] * (n - ones - twos)
    return [Agent(f"a{i}", group=f"weight {w}", weight=w) for i, w in enumerate(weights)]


@dataclass(frozen=True, slots=True)
class Variant:
    """Who shares the gate, and under which limits besides the RPM."""

    agents: Callable[[int], list[Agent]]
    input_tokens_per_minute: int | None = None
    """If set, the input tokens rather than the requests are what runs out."""
    output_tokens_per_minute: int | None = None
    """If set, the output tokens rather than the requests are what runs out."""
    timed: bool = True
    """Whether to measure the gate's cost per slot on this variant."""
    max_concurrent: int | None = None
    """If set, calls in flight rather than requests per minute are what runs out (and no
    per-minute limit is set)."""


VARIANTS: dict[str, Variant] = {
    "equal": Variant(lambda n: [Agent(f"a{i}") for i in range(n)]),
    "priorities": Variant(mixed_priorities),
    "token sizes": Variant(two_sizes),
    "token sizes, input TPM binding": Variant(two_sizes, 1_000_000, timed=False),
    "token sizes, output TPM binding": Variant(
        two_sizes, output_tokens_per_minute=150_000, timed=False
    ),
    "token sizes, concurrency binding": Variant(two_sizes, timed=False, max_concurrent=10),
    "weights": Variant(weighted),
}


def measure(agents: int = 100, rpm: int = 600, minutes: int = 10) -> list[Figure]:
    """Every variant's utilisation, fairness and waits, and the gate's cost per slot."""
    figures: list[Figure] = []
    for name, variant in VARIANTS.items():
        itpm, otpm = variant.input_tokens_per_minute, variant.output_tokens_per_minute
        cap = variant.max_concurrent
        limits = GateLimits(requests_per_minute=rpm if cap is None else None,
                            input_tokens_per_minute=itpm, output_tokens_per_minute=otpm,
                            max_concurrent=cap)
        sim = simulate(variant.agents(agents), limits, minutes)
        tag = f"[{name}]"
        groups: dict[str, list[Agent]] = {}
        for agent in sim.agents:
            groups.setdefault(agent.group, []).append(agent)
        if cap is not None:
            figures += [
                Figure(f"{tag} utilisation: time slots held / (max_concurrent x period)",
                       100 * sim.held_ms / (cap * minutes * WINDOW_MS), "%", ">= 98 %"),
                Figure(f"{tag} calls granted (max {cap} in flight)",
                       sum(sim.granted.values()), "requests"),
            ]
        elif itpm is not None:
            figures.append(Figure(f"{tag} utilisation: input tokens granted / (ITPM x minutes)",
                                  100 * sim.input_tokens / (itpm * minutes), "%", ">= 98 %"))
        elif otpm is not None:
            figures.append(Figure(
                f"{tag} utilisation: output tokens charged / (OTPM x minutes)",
                100 * sum(sim.output_charged.values()) / (otpm * minutes), "%", ">= 98 %"))
        else:
            figures.append(Figure(f"{tag} utilisation: granted / (RPM x minutes)",
                                  100 * sum(sim.granted.values()) / (rpm * minutes), "%",
                                  ">= 98 %"))
        for group, members in groups.items():
            part = "" if len(groups) == 1 else f" {group} ({len(members)} agents)"
            counts = [sim.granted[a.name] for a in members]
            waits = [w / 1000 for a in members for w in sim.waits[a.name]]
            figures += [
                Figure(f"{tag}{part} Jain's index over granted requests", 100 * jain(counts),
                       "%", ">= 99 %"),
                Figure(f"{tag}{part} granted per agent", mean(counts), "requests"),
                Figure(f"{tag}{part} wait, p99", percentile(waits, 0.99),
                       f"s (p50 {percentile(waits, 0.5):.2f} s, max {max(waits):.1f} s)"),
            ]
        if variant.agents is two_sizes:
            tokens = {group: mean([sim.tokens[a.name] for a in members])
                      for group, members in groups.items()}
            figures += [
                Figure(f"{tag} Jain's index over granted tokens, all agents",
                       100 * jain(list(sim.tokens.values())), "%", ">= 99 %"),
                Figure(f"{tag} tokens granted per 4x agent / per 1x agent",
                       tokens["4x"] / tokens["1x"], "x", "1 +- 0.1 (4 would be by requests)"),
            ]
        if variant.agents is weighted:
            per_weight = [sim.tokens[a.name] / a.weight for a in sim.agents]
            middle = mean(per_weight)
            figures += [
                Figure(f"{tag} tokens granted per unit of weight, farthest agent from the mean",
                       100 * max(abs(x - middle) for x in per_weight) / middle, "%",
                       "<= 10 %"),
                Figure(f"{tag} Jain's index over tokens per unit of weight, all agents",
                       100 * jain([round(x) for x in per_weight]), "%", ">= 99 %"),
            ]
        if sim.refused:
            figures.append(Figure(f"{tag} requests refused", sim.refused, "requests"))
        if variant.timed:
            figures += [
                _overhead(f"{tag} gate overhead per slot: decide_gate, CPU time",
                          replay_us(sim.inputs), "< 20 us"),
                _overhead(f"{tag} ... and next_gate_due after each input",
                          replay_us(sim.inputs, due=True)),
                _overhead(f"{tag} ... and the doorway check of every input and the encoding "
                          "of every decision (the live gate's whole cost)",
                          replay_us(sim.inputs, due=True, encode=True)),
            ]
    return figures


def _overhead(name: str, overhead: Overhead, goal: str = "") -> Figure:
    """A row of CPU time per slot, with the wall time of the same runs beside it."""
    return Figure(name, overhead.cpu_us, f"us CPU (wall {overhead.wall_us:.2f} us)", goal)


def mean(values: Sequence[float]) -> float:
    """The mean of ``values``."""
    return sum(values) / len(values)


if __name__ == "__main__":
    run(measure, agents=100, rpm=600, minutes=10)
