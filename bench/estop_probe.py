"""A bench-only probe along an emergency stop's path through the gateway (`bench.estop_latency
--probe 1`): where a stop waits under a feed flood.

It wraps a few methods of the gateway in the bench's own process (nothing in the gateway knows
of it) and timestamps, with ``CLOCK_MONOTONIC`` (the clock the bench's clients read), each
stop as it is

- **read**: its frame taken off the control connection (`Session._control_now`);
- **queued**: its urgent append enqueued in the store;
- **taken**: taken by the writer (after the commit in flight, if any);
- **committed**: its commit's answer came back from the log's writer process;
- **settled**: its future resolved on the gateway's loop;
- **sent**: its ack written to the connection (`Session._acked` returned).

Beside those: every commit (events, seconds), every unit of the feed's pacer (seconds) and
the event loop's lag (a 1 ms timer's lateness: the longest turns of the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bench.common import Figure
from gateway.base.pacing import Pacer
from gateway.edge.sessions import Session
from store.batch import Pending
from store.committer import BatchWriter
from store.port import Append
from store.writer import GroupCommitStore

STAGES = ("read", "queued", "taken", "committed", "settled", "sent")


def now_ns() -> int:
    """``CLOCK_MONOTONIC`` in ns."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass
class Probe:
    """What the wrapped methods recorded."""

    read: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Request id -> (agent, when its frame was read)."""
    marks: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    """Stage -> (stream, when) in order."""
    sent: dict[str, int] = field(default_factory=dict)
    """Request id -> when its ack was written."""
    commits: list[tuple[int, int, int, bool]] = field(default_factory=list)
    """(started, ended, events, urgent) of each commit."""
    turns: list[int] = field(default_factory=list)
    """The pacer's units, ns each."""
    lags: list[int] = field(default_factory=list)
    """A 1 ms timer's lateness, ns each."""
    turn_cpu: list[int] = field(default_factory=list)
    """The pacer's units, ns of this thread's CPU each."""
    settles: list[tuple[int, int, int]] = field(default_factory=list)
    """(appends, ns resolving their futures, ns until the loop ran what that made ready)
    of each commit's settling on the gateway's loop."""
    beat: int = 0
    """When the lag watch last ran (the loop is stalled while it is old)."""
    stalls: dict[str, int] = field(default_factory=dict)
    """Where the loop's thread was, sampled each ms while the loop was stalled over 3 ms."""

    def mark(self, stage: str, stream: str) -> None:
        """Note ``stream`` reaching ``stage`` now."""
        self.marks.setdefault(stage, []).append((stream, now_ns()))

    def reset(self) -> None:
        """Forget everything (a new variant starts)."""
        for records in (self.read, self.marks, self.sent):
            records.clear()
        for series in (self.commits, self.turns, self.lags, self.turn_cpu):
            series.clear()
        self.stalls.clear()
        self.settles.clear()


PROBE = Probe()
_installed = False


def install() -> Probe:
    """Wrap the gateway's methods (once per process); return the probe they record into."""
    global _installed
    if _installed:
        return PROBE
    _installed = True
    probe = PROBE

    control_now = Session._control_now

    def _control_now(self: Session, frame: Any) -> Coroutine[Any, Any, None]:
        request = frame.request
        probe.read[request.request_id] = (request.agent_id, now_ns())
        return control_now(self, frame)

    acked = Session._acked

    async def _acked(self: Session, frame: Any, pending: Any) -> None:
        await acked(self, frame, pending)
        probe.sent[frame.request.request_id] = now_ns()

    append = GroupCommitStore.append

    def _append(self: GroupCommitStore, item: Append) -> Any:
        if item.urgent:
            probe.mark("queued", item.stream)
        return append(self, item)

    take_urgent = BatchWriter._take_urgent

    def _take_urgent(self: BatchWriter) -> list[Pending]:
        batch = take_urgent(self)
        for pending in batch:
            if pending.append.urgent:
                probe.mark("taken", pending.append.stream)
        return batch

    commit = BatchWriter._commit

    committing: list[int] = []  # when the commit in flight began (one at a time)

    async def _commit(self: BatchWriter, batch: list[Pending]) -> None:
        committing[:] = [now_ns()]
        await commit(self, batch)

    settle = BatchWriter._settle

    def _settle(self: BatchWriter, batch: list[Pending], *args: Any) -> None:
        started = now_ns()  # (the commit's answer came back: its futures are resolved now)
        urgent = [p.append.stream for p in batch if p.append.urgent]
        for stream in urgent:
            probe.mark("committed", stream)
        if committing:
            probe.commits.append((committing.pop(), started,
                                  sum(len(p.events) for p in batch), bool(urgent)))
        settle(self, batch, *args)
        resolved = now_ns() - started

        def after() -> None:  # behind the callbacks the resolved futures scheduled
            probe.settles.append((len(batch), resolved, now_ns() - started))

        asyncio.get_running_loop().call_soon(after)
        for pending in batch:
            if pending.append.urgent:
                probe.mark("settled", pending.append.stream)

    turn = Pacer.turn

    @contextlib.asynccontextmanager
    async def _turn(self: Pacer) -> AsyncIterator[None]:
        async with turn(self):
            started, cpu = now_ns(), time.thread_time_ns()
            try:
                yield
            finally:
                probe.turns.append(now_ns() - started)
                probe.turn_cpu.append(time.thread_time_ns() - cpu)

    patches: list[tuple[type, str, object]] = [
        (Session, "_control_now", _control_now), (Session, "_acked", _acked),
        (GroupCommitStore, "append", _append), (BatchWriter, "_take_urgent", _take_urgent),
        (BatchWriter, "_commit", _commit), (BatchWriter, "_settle", _settle),
        (Pacer, "turn", _turn)]
    for owner, name, wrapper in patches:
        setattr(owner, name, wrapper)
    return probe


async def watch_lag(probe: Probe) -> None:
    """Until cancelled: how late a 1 ms timer fires on this loop, each time."""
    main = threading.get_ident()
    done = threading.Event()
    sampler = threading.Thread(target=_sample, args=(probe, main, done), daemon=True)
    sampler.start()
    try:
        while True:
            probe.beat = due = now_ns() + 1_000_000
            await asyncio.sleep(0.001)
            probe.lags.append(max(0, now_ns() - due))
    finally:
        done.set()


def _sample(probe: Probe, main: int, done: threading.Event) -> None:
    """Each ms: if the loop's thread has not come back to the lag watch for 3 ms, note where
    it is (its innermost frames in the project's code)."""
    while not done.wait(0.001):
        if now_ns() - probe.beat < 3_000_000:
            continue
        frame = sys._current_frames().get(main)
        chain: list[str] = []
        while frame is not None and len(chain) < 3:
            name = frame.f_code.co_filename
            if any(part in name for part in ("/gateway/", "/store/", "/lanes/")) \
                    or not chain:
                short = name.rsplit("/", 2)
                chain.append(f"{'/'.join(short[-2:])}:{frame.f_code.co_name}")
            frame = frame.f_back
        key = " < ".join(chain)
        probe.stalls[key] = probe.stalls.get(key, 0) + 1


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _after(marks: list[tuple[str, int]], stream: str, since: int) -> int | None:
    return next((at for name, at in marks if name == stream and at >= since), None)


def figures(probe: Probe, tag: str, stops: list[tuple[str, int, int]],
            window: tuple[int, int]) -> list[Figure]:
    """The stages of ``stops`` ((request id, sent, acked) each), and the commits, pacer units
    and loop lags within ``window`` (ns from, to)."""
    segments: dict[str, list[float]] = {}
    for request_id, sent, acked in stops:
        if request_id not in probe.read:
            continue
        agent, read = probe.read[request_id]
        times: list[tuple[str, int | None]] = [("client sent", sent), ("read", read)]
        at = read
        for stage in STAGES[1:-1]:
            found = _after(probe.marks.get(stage, []), agent, at)
            times.append((stage, found))
            if found is not None:
                at = found
        times += [("sent", probe.sent.get(request_id)), ("client acked", acked)]
        for (a, t_a), (b, t_b) in itertools.pairwise(times):
            if t_a is not None and t_b is not None:
                segments.setdefault(f"{a} -> {b}", []).append((t_b - t_a) / 1e6)
    out = []
    for name, values in segments.items():
        out.append(Figure(f"{tag} probe: {name}, p50 / p99",
                          _pct(values, 0.5), f"ms / {_pct(values, 0.99):.2f} ms"))
    low, high = window
    commits = [c for c in probe.commits if low <= c[0] <= high]
    took = [(c[1] - c[0]) / 1e6 for c in commits]
    sizes = [float(c[2]) for c in commits]
    out += [
        Figure(f"{tag} probe: commits, events p50 / max", _pct(sizes, 0.5),
               f"/ {max(sizes, default=0):,.0f} ({len(commits)} commits)"),
        Figure(f"{tag} probe: commit duration p50 / p99", _pct(took, 0.5),
               f"ms / {_pct(took, 0.99):.2f} ms (max {max(took, default=0):.2f})"),
    ]
    turns = [t / 1e6 for t in probe.turns]
    cpu = [t / 1e6 for t in probe.turn_cpu]
    lags = [t / 1e6 for t in probe.lags]
    out += [
        Figure(f"{tag} probe: pacer unit p50 / p99", _pct(turns, 0.5),
               f"ms / {_pct(turns, 0.99):.2f} ms (max {max(turns, default=0):.2f}, "
               f"{len(turns)} units)"),
        Figure(f"{tag} probe: pacer unit CPU p50 / p99", _pct(cpu, 0.5),
               f"ms / {_pct(cpu, 0.99):.2f} ms (max {max(cpu, default=0):.2f})"),
        Figure(f"{tag} probe: loop lag (1 ms timer late) p50 / p99", _pct(lags, 0.5),
               f"ms / {_pct(lags, 0.99):.2f} ms (max {max(lags, default=0):.2f})"),
    ]
    for low, high in ((1, 10), (10, 100), (100, 400), (400, 10**9)):
        some = [x for x in probe.settles if low <= x[0] < high]
        if some:
            out.append(Figure(
                f"{tag} probe: settling commits of {low}-{high} appends: resolve p99 / "
                f"through its callbacks p50 / p99", _pct([x[1] / 1e6 for x in some], 0.99),
                f"ms / {_pct([x[2] / 1e6 for x in some], 0.5):.2f} / "
                f"{_pct([x[2] / 1e6 for x in some], 0.99):.2f} ms ({len(some)})"))
    total = sum(probe.stalls.values())
    for key, count in sorted(probe.stalls.items(), key=lambda kv: -kv[1])[:12]:
        out.append(Figure(f"{tag} probe: stalled loop at {key}", 100 * count / total,
                          f"% of {total} samples"))
    return out


def start(loop_tasks: set[asyncio.Task[None]]) -> Callable[[], None]:
    """Reset the probe and watch the loop's lag; what it returns stops the watch."""
    PROBE.reset()
    task = asyncio.get_running_loop().create_task(watch_lag(PROBE))
    loop_tasks.add(task)

    def stop() -> None:
        task.cancel()

    return stop
