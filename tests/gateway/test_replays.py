"""Time travel's replays (`gateway.reads.replays`): an agent or a provider gate at any log
position, from checkpoints, is exactly the plain replay of the log up to there."""

from __future__ import annotations

import asyncio
import random

import pytest

from bench.replay_speed import T0, make_log
from gateway.base.quarantine import PLAIN, LogReader
from gateway.reads.replays import (
    MAX_BYTES,
    MAX_CHECKPOINTS,
    Replays,
    agent_replays,
    gate_replays,
)
from gateway.reads.tails import FOLD_STEP
from lanes import AgentState, Entry, replay
from lanes.codec import encode
from lanes.evolve import evolve
from lanes.gate import GateState, encode_gate_event, fold_gate
from lanes.gate.events import GateEvent, GateLimits
from lanes.streams import gate_stream
from store import MemoryEventStore, RecordedEvent
from tests.lanes.test_gate import GateBench


def records_of(log: list[Entry], versions: dict[str, int]) -> list[RecordedEvent]:
    """The log's entries as stored records (``versions``: each stream's version so far)."""
    records = []
    for entry in log:
        versions[entry.stream] = versions.get(entry.stream, 0) + 1
        type_name, data = encode(entry.event)
        records.append(RecordedEvent(entry.position, entry.stream, versions[entry.stream],
                                     f"e{entry.position}", type_name, data,
                                     T0 + entry.position))
    return records


async def stored(log: list[Entry]) -> MemoryEventStore:
    store = MemoryEventStore()
    await store.open()
    await store.restore(records_of(log, {}))
    return store


def plain(log: list[Entry], agent_id: str, position: int) -> tuple[AgentState, int]:
    """The agent replayed the plain way, and the position of its last event folded."""
    upto = [e for e in log if e.position <= position]
    mine = [e.position for e in upto if e.stream == agent_id]
    return replay(upto).get(agent_id, AgentState(agent_id=agent_id)), mine[-1] if mine else 0


@pytest.mark.parametrize("bounds", [{"checkpoints": 6}, {"budget": 60_000}],
                         ids=["by count", "by bytes"])
async def test_an_agent_at_every_position_is_its_plain_replay_asked_in_any_order(
    bounds: dict[str, int],
) -> None:
    """Checkpoints every 40 events, at most 6 of them per agent or 60 kB of them: the
    spacing doubles while the stream is folded, and every answer is still exactly the
    replay."""
    log = make_log(3_000, agents=3)
    cut = 2_000  # the rest is appended after the first asks
    store = await stored(log[:cut])
    book = agent_replays(every=40, **bounds)
    rng = random.Random(7)
    positions = list(range(0, cut + 5))
    rng.shuffle(positions)
    for position in positions[:250]:
        agent_id = f"agent{rng.randrange(3)}"
        replayed = await book.at(store, PLAIN, agent_id, position)
        assert (replayed.state, replayed.event_position) == plain(log, agent_id, position), (
            agent_id, position)

    for folded in book._folded.values():
        assert folded.every > 40
        assert len(folded.checkpoints) <= bounds.get("checkpoints", MAX_CHECKPOINTS)
        assert folded.size <= bounds.get("budget", MAX_BYTES)

    versions = {s: v for s, v in (await store.stream_versions()).items()}
    await store.restore(records_of(log[cut:], versions))
    for position in [*rng.sample(range(cut), 50), *rng.sample(range(cut, len(log) + 1), 50)]:
        agent_id = f"agent{rng.randrange(3)}"
        replayed = await book.at(store, PLAIN, agent_id, position)
        assert (replayed.state, replayed.event_position) == plain(log, agent_id, position), (
            agent_id, position)


async def test_each_answer_is_the_callers_own_copy() -> None:
    log = make_log(600, agents=1)
    store = await stored(log)
    book = agent_replays(every=50)
    for position in (300, len(log)):  # from a checkpoint; the stream as it is now
        first = await book.at(store, PLAIN, "agent0", position)
        first.state.pending.clear()
        first.state.version = -1
        again = await book.at(store, PLAIN, "agent0", position)
        assert again.state == plain(log, "agent0", position)[0]


async def test_an_agent_nobody_asked_for_lately_is_let_go_and_folded_again() -> None:
    log = make_log(900, agents=3)
    store = await stored(log)
    book = agent_replays(streams=2, every=50)
    for agent_id in ("agent0", "agent1", "agent2", "agent0"):
        replayed = await book.at(store, PLAIN, agent_id, 450)
        assert replayed.state == plain(log, agent_id, 450)[0]
    assert list(book._folded) == ["agent2", "agent0"]


async def test_folding_a_long_stream_gives_the_event_loop_a_turn_every_step() -> None:
    """A viewer's first time travel on a long stream folds all of it, and a pick folds from
    a checkpoint: an emergency stop must not wait for either. No more than `FOLD_STEP`
    events are folded without the loop running something else (a store read that returns
    at once gives no turn itself)."""
    log = make_log(12_000, agents=1)
    store = await stored(log)
    since_turn, most = 0, 0
    done = asyncio.Event()

    async def turns() -> None:
        nonlocal since_turn
        while not done.is_set():
            since_turn = 0
            await asyncio.sleep(0)

    def counted(reader: LogReader, state: AgentState, record: RecordedEvent) -> None:
        nonlocal since_turn, most
        since_turn += 1
        most = max(most, since_turn)
        evolve(state, reader.decode(record))

    book = Replays(lambda stream: AgentState(agent_id=stream), counted)
    turning = asyncio.create_task(turns())
    try:
        for position in (len(log) // 2, len(log) // 3):  # the first ask; one from a checkpoint
            replayed = await book.at(store, PLAIN, "agent0", position)
            assert replayed.state == plain(log, "agent0", position)[0]
    finally:
        done.set()
        await turning
    assert 0 < most <= FOLD_STEP, most


async def test_a_provider_gate_at_every_position_is_its_plain_fold() -> None:
    """The gate's stream beside an agent's in one log: its state at a position folds its
    own events at or before it, from checkpoints."""
    bench = GateBench(GateLimits(requests_per_minute=20, max_concurrent=2, max_wait_ms=30_000))
    for n in range(150):
        bench.request(f"s{n}", agent_id=f"agent{n % 3}")
        bench.advance(700)
        if n % 2:
            bench.release(f"s{n - 1}")
    agent_log = make_log(300, agents=1)
    stream = gate_stream("sim")
    # The gate's events and the agent's interleaved, as in one log.
    encoded: list[tuple[str, tuple[str, str]]] = []
    mine: list[tuple[int, GateEvent]] = []  # the gate's, with their positions
    for n, event in enumerate(bench.log):
        encoded.append((stream, encode_gate_event(event)))
        mine.append((len(encoded), event))
        if n < len(agent_log):
            encoded.append(("agent0", encode(agent_log[n].event)))
    store = MemoryEventStore()
    await store.open()
    versions: dict[str, int] = {}
    records = []
    for position, (name, (type_name, data)) in enumerate(encoded, 1):
        versions[name] = versions.get(name, 0) + 1
        records.append(RecordedEvent(position, name, versions[name], f"e{position}",
                                     type_name, data, T0 + position))
    await store.restore(records)
    book = gate_replays(every=30, checkpoints=5)

    for position in [*random.Random(5).sample(range(len(encoded) + 1), 120),
                     len(encoded) + 3]:
        replayed = await book.at(store, PLAIN, stream, position)
        upto = [(p, e) for p, e in mine if p <= position]
        assert replayed.state == fold_gate(GateState(provider=stream), [e for _, e in upto])
        assert replayed.event_position == (upto[-1][0] if upto else 0)
