"""Replay, verify and restart over one large log made by the engine's own rules.

    uv run python -m bench.replay_speed [--events N]

One log of ``N`` events (50 agents, every queue kept near its cap by a flood of triggers),
measured in memory (decode, fold, re-decide) and then as a SQLite file: `gateway verify` and
`gateway replay` end to end, and an engine restart without a snapshot and with one.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.common import Figure, run, timed
from gateway.base.process import gc_paused
from gateway.runtime.engine import Engine
from gateway.tools.debugger import replay_command
from gateway.tools.verify import verify_command
from lanes import AgentConfig, AgentState, Entry, Mode, decide, replay
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
from lanes.replay import Verifier
from lanes.requests import AgentRequest
from store import EventStore, RecordedEvent, SqliteEventStore

MODES = [Mode.FOLLOWUP, Mode.COLLECT, Mode.STEER_BACKLOG, Mode.QUEUE, Mode.INTERRUPT]
T0 = 1_771_297_800_000


def make_log(events: int, agents: int = 50, seed: int = 1, names: Sequence[str] = (),
             prefix: str = "r") -> list[Entry]:
    """A realistic log: triggers with redeliveries, controls, runs finishing, timers. The
    agents are ``names`` (default ``agent0``, ``agent1``, ...), the request ids ``prefix``
    and a number."""
    names = list(names) or [f"agent{n}" for n in range(agents)]
    rng = random.Random(seed)
    states: dict[str, AgentState] = {}
    log: list[Entry] = []
    now = T0

    def feed(agent: str, event: Input) -> None:
        decisions = decide(states[agent], event)
        if decisions:
            for item in (event, *decisions):
                log.append(Entry(len(log) + 1, agent, item))

    for n, agent in enumerate(names):
        states[agent] = AgentState(agent_id=agent)
        config = AgentConfig(mode=MODES[n % len(MODES)], cap=50, debounce_ms=500,
                             drop_policy=list(DropPolicy)[n % 3])
        feed(agent, ConfigChanged(at=now, config=config))
    count = 0
    while len(log) < events:
        now += rng.randint(1, 40)
        agent = names[rng.randrange(len(names))]
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
                "requestId": f"{prefix}{count}", "createdAt": "2026-02-17T03:10:00Z",
                "agentId": agent,
                "kind": "hook_trigger", "priority": rng.choice(["high", "normal", "normal", "low"]),
                "dedupeKey": f"k{rng.randrange(count + 1)}", "payload": {"symbol": "BTCUSD"},
            })
            feed(agent, RequestReceived(at=now, request=request))
    return log[:events] if _cut_is_clean(log, events) else log


def _cut_is_clean(log: list[Entry], events: int) -> bool:
    return events >= len(log) or isinstance(log[events].event, (RequestReceived, RunFinished,
                                                               TimerElapsed, ConfigChanged))


def measure(events: int = 1_000_000) -> list[Figure]:
    """In-memory decode, fold and verify speeds, then the same log as a SQLite file."""
    log = make_log(events)
    encoded = [(e.position, e.stream, *encode(e.event)) for e in log]
    with gc_paused():  # as the gateway loads a log (see gateway.runtime)
        with timed() as decoding:
            decoded = [Entry(p, s, decode(t, d)) for p, s, t, d in encoded]
        with timed() as folding:
            replay(decoded)
        with timed() as verifying:
            verifier = Verifier()
            verifier.feed(decoded)
    assert verifier.finish() is None
    n = len(log)
    figures = [
        Figure(f"log size ({len({e.stream for e in log})} agents)", n, "events"),
        Figure("replay fold (evolve over decoded events)", n / folding[0], "events/s",
               ">= 300,000"),
        Figure("decode from stored JSON", n / decoding[0], "events/s"),
        Figure("replay from stored JSON (decode + fold)", n / (decoding[0] + folding[0]),
               "events/s"),
        Figure(f"verify (re-decide {verifier.inputs:,} inputs, compare)", n / verifying[0],
               "events/s", ">= 300,000"),
    ]
    del decoded, log
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "replay.db"
        asyncio.run(_write(db, encoded))
        del encoded  # what follows runs as the commands do, in a process of their own
        return figures + asyncio.run(_on_disk(db, n))


async def _on_disk(db: Path, n: int) -> list[Figure]:
    """The log as a SQLite file: the CLI end to end, and engine restarts."""
    quiet: list[str] = []
    with timed() as verifying:
        assert await verify_command(db, quiet.append) == 0
    with timed() as replaying:
        assert await replay_command(db, None, None, quiet.append) == 0
    without, loaded = await _restart(db)
    assert loaded is None
    await _snapshot(db)
    with_snapshot = float("inf")
    for _ in range(3):  # the best of three: the machine is shared
        seconds, loaded = await _restart(db)
        assert loaded is not None
        with_snapshot = min(with_snapshot, seconds)
    return [
        Figure("`gateway verify` on the SQLite file (read, decode, re-decide; a process per "
               "CPU)",
               n / verifying[0], "events/s"),
        Figure("`gateway replay` on the SQLite file, no snapshot (read, decode, fold)",
               n / replaying[0], "events/s"),
        Figure("engine restart, no snapshot (read, decode, fold the whole log)", without, "s"),
        Figure("engine restart from a snapshot (best of 3)", with_snapshot, "s", "< 1 s"),
    ]


async def _write(db: Path, encoded: list[tuple[int, str, str, str]]) -> None:
    store = SqliteEventStore(db, synchronous="OFF")
    await store.open()
    await write_log(store, encoded)
    await store.close()


async def write_log(store: EventStore, encoded: list[tuple[int, str, str, str]]) -> None:
    """Write an encoded log (position, stream, type, data) into an open, empty store in
    bulk (imports of 50,000 events)."""
    versions: dict[str, int] = {}
    records = []
    for position, stream, type_name, data in encoded:
        versions[stream] = versions.get(stream, 0) + 1
        records.append(RecordedEvent(position, stream, versions[stream], f"e{position}",
                                     type_name, data, T0 + position))
    for start in range(0, len(records), 50_000):
        await store.restore(records[start:start + 50_000])


async def _restart(db: Path) -> tuple[float, int | None]:
    """Seconds for an engine to start on the log (open, load, fold, restart the agents); the
    snapshot it started from."""
    engine = Engine(SqliteEventStore(db), {}, snapshot_every=None)
    with timed() as starting:
        await engine.start()
    await engine.stop(graceful=False)
    return starting[0], engine.snapshots.loaded_at


async def _snapshot(db: Path) -> None:
    """Let an engine store a snapshot of the whole log (as a start on a long tail does)."""
    engine = Engine(SqliteEventStore(db), {}, snapshot_every=1)
    await engine.start()
    await engine.stop(graceful=False)  # waits for the snapshot to be written


if __name__ == "__main__":
    run(measure, events=1_000_000)
