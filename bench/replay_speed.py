"""Replay fold speed and verify speed over a large log made by the engine's own rules.

    uv run python -m bench.replay_speed [--events N]
"""

from __future__ import annotations

import random

from bench.common import Figure, run, timed
from gateway.runtime import gc_paused
from lanes import AgentConfig, AgentState, Entry, Mode, decide, replay, verify
from lanes.codec import decode, encode
from lanes.config import DropPolicy
from lanes.events import (
    ConfigChanged,
    Input,
    Outcome,
    RequestReceived,
    RunFinished,
    TimerElapsed,
    Usage,
)
from lanes.requests import AgentRequest

MODES = [Mode.FOLLOWUP, Mode.COLLECT, Mode.STEER_BACKLOG, Mode.QUEUE, Mode.INTERRUPT]


def make_log(events: int, agents: int = 50, seed: int = 1) -> list[Entry]:
    """A realistic log: triggers with redeliveries, controls, runs finishing, timers."""
    rng = random.Random(seed)
    states: dict[str, AgentState] = {}
    log: list[Entry] = []
    now = 1_771_297_800_000

    def feed(agent: str, event: Input) -> None:
        decisions = decide(states[agent], event)
        if decisions:
            for item in (event, *decisions):
                log.append(Entry(len(log) + 1, agent, item))

    for n in range(agents):
        agent = f"agent{n}"
        states[agent] = AgentState(agent_id=agent)
        config = AgentConfig(mode=MODES[n % len(MODES)], cap=50, debounce_ms=500,
                             drop_policy=list(DropPolicy)[n % 3])
        feed(agent, ConfigChanged(at=now, config=config))
    count = 0
    while len(log) < events:
        now += rng.randint(1, 40)
        agent = f"agent{rng.randrange(agents)}"
        state = states[agent]
        roll = rng.random()
        if roll < 0.08 and state.active is not None:
            feed(agent, RunFinished(at=now, run_id=state.active.run_id,
                                    outcome=Outcome.NO_TRADE, usage=Usage(input_tokens=900)))
        elif roll < 0.12:
            feed(agent, TimerElapsed(at=now))
        else:
            count += 1
            request = AgentRequest.model_validate({
                "requestId": f"r{count}", "createdAt": "2026-02-17T03:10:00Z", "agentId": agent,
                "kind": "hook_trigger", "priority": rng.choice(["high", "normal", "normal", "low"]),
                "dedupeKey": f"k{rng.randrange(count + 1)}", "payload": {"symbol": "BTCUSD"},
            })
            feed(agent, RequestReceived(at=now, request=request))
    return log[:events] if _cut_is_clean(log, events) else log


def _cut_is_clean(log: list[Entry], events: int) -> bool:
    return events >= len(log) or isinstance(log[events].event, (RequestReceived, RunFinished,
                                                               TimerElapsed, ConfigChanged))


def measure(events: int = 1_000_000) -> list[Figure]:
    """Fold, decode and verify speeds over one log."""
    log = make_log(events)
    encoded = [(e.position, e.stream, *encode(e.event)) for e in log]
    with gc_paused():  # as the gateway loads a log (see gateway.runtime)
        with timed() as decoding:
            decoded = [Entry(p, s, decode(t, d)) for p, s, t, d in encoded]
        with timed() as folding:
            replay(decoded)
        with timed() as verifying:
            divergence = verify(decoded)
    assert divergence is None
    n = len(log)
    return [
        Figure(f"log size ({len({e.stream for e in log})} agents)", n, "events"),
        Figure("replay fold (evolve over decoded events)", n / folding[0], "events/s",
               ">= 300,000"),
        Figure("decode from stored JSON", n / decoding[0], "events/s"),
        Figure("replay from stored JSON (decode + fold)", n / (decoding[0] + folding[0]),
               "events/s"),
        Figure("verify (re-decide every input, compare)", n / verifying[0], "events/s"),
    ]


if __name__ == "__main__":
    run(measure, events=1_000_000)
