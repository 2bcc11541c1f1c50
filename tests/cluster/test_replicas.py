"""The replicas a member keeps of the streams other members decide for (`Replicas`): a
stream read again never reads more than it lacks, however busy it is."""

from __future__ import annotations

from collections.abc import Sequence

from bench.replay_speed import make_log, write_log
from gateway.base.clock import SystemClock
from gateway.cluster.replicas import Replicas
from lanes.codec import encode
from store import MemoryEventStore, RecordedEvent
from tests.gateway.support import until

AGENT = "agent0"


class CountingStore(MemoryEventStore):
    """Counts the events `read_stream` hands out, and the reads from a stream's start."""

    def __init__(self) -> None:
        super().__init__()
        self.read_events = 0
        self.from_start = 0

    async def read_stream(self, stream: str, after_version: int = 0,
                          limit: int | None = None) -> list[RecordedEvent]:
        records = await super().read_stream(stream, after_version, limit)
        self.read_events += len(records)
        self.from_start += after_version == 0
        return records


def _records(count: int) -> list[tuple[int, str, str, str]]:
    return [(e.position, e.stream, *encode(e.event))
            for e in make_log(count, agents=1)][:count]


async def _continue(store: CountingStore, encoded: Sequence[tuple[int, str, str, str]]
                    ) -> None:
    for position, stream, type_name, data in encoded:  # one commit each, as a busy owner's
        await store.restore([RecordedEvent(position, stream, position, f"e{position}",
                                           type_name, data, position)])


async def test_a_busy_stream_read_again_reads_only_its_tail_once_per_event_burst() -> None:
    """Issue 23, 1b: a stream that left this member (or whose events the follower missed) is
    read again from its replica's version, by one reader at a time. Before, every event of
    it committed meanwhile started one more read of the whole stream: on a long log, a
    stream that moved under load made a member read and fold it from the start dozens of
    times at once, its event loop stalled for seconds, and its lease ran out."""
    encoded = _records(2_400)
    store = CountingStore()
    await store.open()
    held = {AGENT: False}
    replicas = Replicas(store, SystemClock(), [AGENT], {}, lambda s: held.get(s, False))
    try:
        await write_log(store, encoded[:2_000])
        await replicas.start()
        assert replicas.states[AGENT].version == 2_000
        held[AGENT] = True  # this member decides for it: the replica is left as it was
        await _continue(store, encoded[2_000:2_300])
        held[AGENT] = False  # handed over; its new owner writes on, one commit at a time
        store.read_events = store.from_start = 0
        replicas.refresh(AGENT)
        await _continue(store, encoded[2_300:])

        async def caught_up() -> bool:
            return replicas.states[AGENT].version == 2_400 and not replicas._tasks

        await until(caught_up, "the replica caught up")
        assert store.from_start == 0
        # The 400 events it lacked, and a few read twice at most (a burst during a read).
        assert store.read_events < 2 * 400
    finally:
        await replicas.stop()
        await store.close()
