"""Time travel's replays (`gateway.runtime.replays`): an agent at any log position, from
checkpoints, is exactly the plain replay of the log up to there."""

from __future__ import annotations

import asyncio
import random

import pytest

from bench.replay_speed import T0, make_log
from gateway.runtime.replays import FOLD_STEP, MAX_BYTES, MAX_CHECKPOINTS, ReplayBook
from gateway.tools.quarantine import PLAIN
from lanes import AgentState, Entry, replay
from lanes.codec import encode
from store import MemoryEventStore, RecordedEvent


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
    book = ReplayBook(every=40, **bounds)
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
    book = ReplayBook(every=50)
    for position in (300, len(log)):  # from a checkpoint; the stream as it is now
        first = await book.at(store, PLAIN, "agent0", position)
        first.state.pending.clear()
        first.state.version = -1
        again = await book.at(store, PLAIN, "agent0", position)
        assert again.state == plain(log, "agent0", position)[0]


async def test_an_agent_nobody_asked_for_lately_is_let_go_and_folded_again() -> None:
    log = make_log(900, agents=3)
    store = await stored(log)
    book = ReplayBook(agents=2, every=50)
    for agent_id in ("agent0", "agent1", "agent2", "agent0"):
        replayed = await book.at(store, PLAIN, agent_id, 450)
        assert replayed.state == plain(log, agent_id, 450)[0]
    assert list(book._folded) == ["agent2", "agent0"]


async def test_folding_a_long_stream_gives_the_event_loop_a_turn_every_step() -> None:
    """A viewer's first time travel on a long stream folds all of it: an emergency stop
    must not wait for that (a store read that returns at once gives no turn itself)."""
    log = make_log(12_000, agents=1)
    store = await stored(log)
    turns = 0
    done = asyncio.Event()

    async def count_turns() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)

    counting = asyncio.create_task(count_turns())
    try:
        replayed = await ReplayBook().at(store, PLAIN, "agent0", len(log) // 2)
    finally:
        done.set()
        await counting
    assert replayed.state == plain(log, "agent0", len(log) // 2)[0]
    assert turns >= len(log) // FOLD_STEP - 2, turns
