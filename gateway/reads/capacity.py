"""Capacity over time, folded from the log: each agent's pending requests and run latency,
each provider gate's waiting requests, how long requests waited for a slot, and its use of
its requests-per-minute and token limits.

`CapacityFold` is pure: fed the log's records in position order, it keeps each stream's
series (no I/O, no clock; an event happens at its stream's time, the ``at`` of the input
that caused it, as replay's ``now``). `capacity_answer` cuts the series into steps for one
answer. `CapacityBook` keeps a fold up to date with the log, reading only what was appended
since it last read (a cache of a fold of the log, never the source of truth: a restart folds
the log again to the same series).

Counts (pending requests, waiting requests, the gate's window usage) are kept at the
resolution of a second: their value at the end of each second in which they changed. Waits
and run latencies are kept one sample each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.base.tasks import spawn
from lanes.events import INPUT_TYPES
from lanes.gate.events import GATE_INPUT_TYPES, WINDOW_MS
from lanes.streams import PROVIDER_PREFIX, is_agent_stream
from store.port import LogReads, RecordedEvent, StoreError

RETAIN_MS = 26 * 3_600_000
"""How far back from its newest event a fold keeps series (a day's window and some)."""
MAX_POINTS = 50_000
"""Points kept of one series (the newest; past it, the oldest quarter goes)."""
MAX_MARKS = 5_000
"""Marks kept (the newest)."""
MAX_FIRST_READ = 1_000_000
"""Events of the log's end a new book reads first (a longer log's older part is not read:
its series begin there, and the answer says so in ``since``)."""
READ_PAGE = 2_000
FOLD_STEP = 500
"""Records read at a time, and folded between two turns of the event loop."""
FIRST_WAIT_S = 1.5
"""How long an ask waits for the fold to reach the log's end before it is answered with
what was read so far (a long log's first read goes on meanwhile)."""

_AGENT_INPUTS = frozenset(t.__name__ for t in INPUT_TYPES) - {"Quarantined"}
"""(A quarantined event's stand-in moves no clock: it is not the input it stands for.)"""
_GATE_INPUTS = frozenset(t.__name__ for t in GATE_INPUT_TYPES)
_AGENT_DECISIONS = frozenset({
    "RequestQueued", "RequestDropped", "RequestSummarized", "RunStarted", "RunSteered",
    "RunCompleted", "RunFailed", "RunAborted", "ControlApplied", "RunsHeld", "RunsUnheld"})
"""The agents' decisions the fold reads."""
_GATE_TYPES = _GATE_INPUTS | {"SlotQueued", "SlotGranted", "SlotRefused", "SlotFreed",
                              "GateLimitsApplied", "BreakerOpened", "BreakerClosed"}
MARKED = {"emergency_stop": "stop", "pause": "pause", "resume": "resume"}
"""Control actions marked, by the kind of mark."""


class Steps:
    """A count over time at the resolution of a second: its value at the end of each second
    in which it changed (0 before the first)."""

    __slots__ = ("secs", "values")

    def __init__(self) -> None:
        self.secs: list[int] = []
        self.values: list[int] = []

    def set(self, at: int, value: int) -> None:
        """The count is ``value`` from ``at`` (ms) on; a time behind the last one counts as
        the last one's (a stream's clock never goes back; the desk's may, by a little)."""
        secs, values = self.secs, self.values
        sec = at // 1000
        if secs and secs[-1] >= sec:
            values[-1] = value
        elif not values or values[-1] != value:
            secs.append(sec)
            values.append(value)

    def at(self, sec: int) -> int:
        """The value at the end of second ``sec``."""
        i = bisect_right(self.secs, sec) - 1
        return self.values[i] if i >= 0 else 0

    def peaks(self, first: int, seconds: int, count: int,
              tail: Iterable[tuple[int, int]] = ()) -> list[int]:
        """For each of ``count`` steps of ``seconds`` from second ``first``: the most at
        the end of any of its seconds; ``tail``: points (second, value) after the last
        one, as if they were set."""
        secs, values = self.secs, self.values
        extra = list(tail)
        if extra:
            secs, values = list(secs), list(values)
            for sec, value in extra:
                if secs and secs[-1] >= sec:
                    values[-1] = value
                else:
                    secs.append(sec)
                    values.append(value)
        i = bisect_right(secs, first - 1)
        level = values[i - 1] if i else 0
        out: list[int] = []
        for n in range(1, count + 1):
            stop = first + n * seconds
            begun = i < len(secs) and secs[i] == stop - seconds  # (a point at its first second)
            top = -1 if begun else level
            while i < len(secs) and secs[i] < stop:
                level = values[i]
                if level > top:
                    top = level
                i += 1
            out.append(top)
        return out

    def trim(self, before: int) -> None:
        """Forget the points before second ``before``, keeping the value there."""
        i = bisect_right(self.secs, before) - 1
        if i > 0:
            del self.secs[:i], self.values[:i]


class Samples:
    """Values at times (ms), in time order: one per wait, one per run."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times: list[int] = []
        self.values: list[int] = []

    def add(self, at: int, value: int) -> None:
        """One more sample (a time behind the last one counts as the last one's)."""
        if self.times and at < self.times[-1]:
            at = self.times[-1]
        self.times.append(at)
        self.values.append(value)

    def within(self, start: int, end: int) -> tuple[int, int]:
        """The indexes of the samples in [``start``, ``end``)."""
        return bisect_left(self.times, start), bisect_left(self.times, end)

    def trim(self, before: int) -> None:
        """Forget the samples before ``before`` (ms)."""
        i = bisect_left(self.times, before)
        if i:
            del self.times[:i], self.values[:i]


@dataclass(slots=True)
class AgentTrack:
    """One agent's part of the fold."""

    now: int = 0
    received: str = "{}"
    """The last request received, as stored (a control mark names who sent it)."""
    pending: set[str] = field(default_factory=set)
    runs: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    """Runs going: when each started and its requests (steered ones too)."""
    depth: Steps = field(default_factory=Steps)
    latency: Samples = field(default_factory=Samples)
    """How long each run took, at its end (ms)."""


@dataclass(slots=True)
class GateTrack:
    """One provider gate's part of the fold."""

    now: int = 0
    waiting: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Slots waiting: when each was queued and its token estimate (input, output)."""
    window: deque[list[Any]] = field(default_factory=deque)
    """Grants of the last 60 s, oldest first: [slot, at, input tokens, output tokens], the
    estimate until the call's actual usage replaces it (as the gate counts them)."""
    charged: dict[str, list[Any]] = field(default_factory=dict)
    used: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Requests, input tokens and output tokens granted in the last 60 s."""
    depth: Steps = field(default_factory=Steps)
    waits: Samples = field(default_factory=Samples)
    usage: tuple[Steps, Steps, Steps] = field(default_factory=lambda: (Steps(), Steps(), Steps()))
    limits: list[tuple[int, int | None, int | None, int | None]] = field(default_factory=list)
    """The limits in force from each time on: (at, requests, input and output tokens per
    minute; None: unlimited)."""

    def expire(self, now: int) -> None:
        """Grants leave the window when 60 s have passed."""
        window, used = self.window, self.used
        while window and window[0][1] + WINDOW_MS <= now:
            slot, at, inputs, outputs = window.popleft()
            del self.charged[slot]
            used[0] -= 1
            used[1] -= inputs
            used[2] -= outputs
            self._count(at + WINDOW_MS)

    def _count(self, at: int) -> None:
        """`usage` from ``at`` (ms) on: as the window will be at the end of that second,
        without the grants that leave it later in the second (the series' values are each
        second's last; no later event may come to take them off)."""
        requests, inputs, outputs = self.used
        end = at - at % 1000 + 999
        for _, granted, tokens_in, tokens_out in self.window:
            if granted + WINDOW_MS > end:
                break
            requests -= 1
            inputs -= tokens_in
            outputs -= tokens_out
        for steps, value in zip(self.usage, (requests, inputs, outputs), strict=True):
            steps.set(at, value)

    def exits(self, until: int) -> list[list[tuple[int, int]]]:
        """The points of `usage` its window's grants would add by leaving it before
        ``until`` (ms): the window goes on emptying after the last event."""
        used = list(self.used)
        out: list[list[tuple[int, int]]] = [[], [], []]
        for _, at, inputs, outputs in self.window:
            leaves = at + WINDOW_MS
            if leaves >= until:
                break
            used[0] -= 1
            used[1] -= inputs
            used[2] -= outputs
            for series, value in zip(out, used, strict=True):
                if series and series[-1][0] == leaves // 1000:
                    series[-1] = (leaves // 1000, value)
                else:
                    series.append((leaves // 1000, value))
        return out


class CapacityFold:
    """Every agent's and provider gate's capacity series, fed the log's records in position
    order (`feed`); pure."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentTrack] = {}
        self.gates: dict[str, GateTrack] = {}
        self.marks: deque[dict[str, Any]] = deque(maxlen=MAX_MARKS)
        self.position = 0
        """The last position fed."""
        self.newest = 0
        """The latest time of any stream."""
        self.since: int | None = None
        """The time from which the series are whole (None: from the start of the log)."""
        self.oldest = 0
        """The time of the first input fed."""

    def feed(self, record: RecordedEvent, replaced: tuple[str, str] | None = None) -> None:
        """Fold one record (``replaced``: the type and data of what stands in for it, if
        it was set aside)."""
        self.position = record.position
        kind, data = replaced if replaced is not None else (record.type, record.data)
        stream = record.stream
        if is_agent_stream(stream):
            if kind in _AGENT_INPUTS:  # (the commonest: read no more than their time)
                track = self.agents.get(stream) or self.agents.setdefault(stream, AgentTrack())
                self._advance(track, _at(data))
                if kind == "RequestReceived":
                    track.received = data
            elif kind in _AGENT_DECISIONS:
                self._agent(stream, record.position, kind, _data(data))
        elif stream.startswith(PROVIDER_PREFIX) and kind in _GATE_TYPES:
            provider = stream[len(PROVIDER_PREFIX):]
            if kind in _GATE_INPUTS:
                gate = self.gates.get(provider) or self.gates.setdefault(provider, GateTrack())
                self._advance(gate, _at(data))
                gate.expire(gate.now)
            else:
                self._gate(provider, record.position, kind, _data(data))

    def _advance(self, track: AgentTrack | GateTrack, at: int) -> None:
        """A stream's clock reaches ``at`` (it never goes back)."""
        if at > track.now:
            track.now = at
        if track.now > self.newest:
            self.oldest = self.oldest or track.now
            self.newest = track.now

    def _agent(self, agent_id: str, position: int, kind: str, data: dict[str, Any]) -> None:
        track = self.agents.get(agent_id)
        if track is None:
            track = self.agents[agent_id] = AgentTrack()
        now, pending = track.now, track.pending
        before = len(pending)
        if kind == "RequestQueued":
            pending.add(str(data["request_id"]))
        elif kind in ("RequestDropped", "RequestSummarized"):
            pending.discard(str(data["request_id"]))  # (the one received may never have been)
        elif kind == "RunStarted":
            requests = [str(r) for r in data.get("request_ids", ())]
            pending.difference_update(requests)
            track.runs[str(data["run_id"])] = (now, requests)
        elif kind == "RunSteered":
            run = track.runs.get(str(data["run_id"]))
            if run is not None:
                run[1].append(str(data["request_id"]))
        elif kind in ("RunCompleted", "RunFailed", "RunAborted"):
            ended = track.runs.pop(str(data["run_id"]), None)
            if ended is not None:
                track.latency.add(now, now - ended[0])
                if data.get("requeued"):
                    pending.update(ended[1])
                self._cap(track.latency)
        else:
            self._agent_mark(agent_id, position, kind, data, track)
        if len(pending) != before:
            track.depth.set(now, len(pending))
            self._cap(track.depth)

    def _agent_mark(self, agent_id: str, position: int, kind: str, data: dict[str, Any],
                    track: AgentTrack) -> None:
        base = {"at": track.now, "agentId": agent_id, "position": position}
        if kind == "ControlApplied":
            mark = MARKED.get(str(data.get("action")))
            if mark is None or data.get("from_state") == data.get("to_state"):
                return  # (a control that changed nothing, a stop of a HALTED agent)
            by = _data(track.received).get("principal") or "?"  # (who sent the control)
            self.marks.append({**base, "kind": mark, "text": f"{data['action']} by {by} "
                               f"({data['from_state']} → {data['to_state']})"})
        elif kind == "RunsHeld":
            self.marks.append({**base, "kind": "held", "text": f"runs held by provider "
                               f"{data.get('provider')}: {data.get('reason')}"})
        else:
            self.marks.append({**base, "kind": "resume", "text": f"hold lifted by "
                               f"{data.get('by')}"})

    def _gate(self, provider: str, position: int, kind: str, data: dict[str, Any]) -> None:
        track = self.gates.get(provider)
        if track is None:
            track = self.gates[provider] = GateTrack()
        now, waiting = track.now, track.waiting
        slot = str(data.get("slot_id", ""))
        before = len(waiting)
        if kind == "SlotQueued":
            waiting[slot] = (now, int(data.get("input_tokens", 0)),
                             int(data.get("output_tokens", 0)))
        elif kind in ("SlotGranted", "SlotRefused", "SlotFreed"):
            queued = waiting.pop(slot, None)
            if queued is not None:
                track.waits.add(now, now - queued[0])
                self._cap(track.waits)
            if kind == "SlotGranted" and queued is not None:
                grant: list[Any] = [slot, now, queued[1], queued[2]]
                track.window.append(grant)
                track.charged[slot] = grant
                used = track.used
                used[0] += 1
                used[1] += queued[1]
                used[2] += queued[2]
                track._count(now)
            elif kind == "SlotFreed" and queued is None and slot in track.charged:
                charge, used = track.charged[slot], track.used
                for i, name in ((2, "input_tokens"), (3, "output_tokens")):
                    actual = data.get(name)
                    if actual is not None:  # (the actual usage replaces the estimate)
                        used[i - 1] += int(actual) - charge[i]
                        charge[i] = int(actual)
                track._count(now)
            for steps in track.usage:
                self._cap(steps)
        elif kind == "GateLimitsApplied":
            limits = data.get("limits", {})
            if track.limits:  # (a change: the first are the gate's from its start)
                self._gate_mark(provider, position, now, "limits", "limits " + ", ".join(
                    f"{k} {v}" for k, v in limits.items() if k.endswith("PerMinute") and v))
            track.limits.append((now, limits.get("requestsPerMinute"),
                                 limits.get("inputTokensPerMinute"),
                                 limits.get("outputTokensPerMinute")))
        elif kind == "BreakerOpened":
            self._gate_mark(provider, position, now, "breaker",
                            f"breaker open: {data.get('reason')}")
        else:
            self._gate_mark(provider, position, now, "closed", "breaker closed")
        if len(waiting) != before:
            track.depth.set(now, len(waiting))
            self._cap(track.depth)

    def _gate_mark(self, provider: str, position: int, at: int, kind: str, text: str) -> None:
        self.marks.append({"at": at, "provider": provider, "position": position,
                           "kind": kind, "text": text or "limits: none"})

    def _cap(self, series: Steps | Samples) -> None:
        """Keep a series to `MAX_POINTS`: past it, its oldest quarter goes (and the
        series are whole only from there)."""
        if len(series.values) > MAX_POINTS:
            cut = MAX_POINTS // 4
            if isinstance(series, Steps):
                self.since = max(self.since or 0, (series.secs[cut] + 1) * 1000)
                del series.secs[:cut], series.values[:cut]
            else:
                self.since = max(self.since or 0, series.times[cut])
                del series.times[:cut], series.values[:cut]

    def trim(self) -> None:
        """Forget what is older than `RETAIN_MS` before the newest event."""
        cut = self.newest - RETAIN_MS
        if cut <= (self.since or self.oldest):
            return
        self.since = cut
        for agent in self.agents.values():
            agent.depth.trim(cut // 1000)
            agent.latency.trim(cut)
        for gate in self.gates.values():
            gate.depth.trim(cut // 1000)
            gate.waits.trim(cut)
            for steps in gate.usage:
                steps.trim(cut // 1000)


def _at(text: str) -> int:
    """The time of an input, as stored: ``{"at":<ms>,...}`` (read without the rest), or as
    an older version wrote it."""
    if text.startswith('{"at":'):
        end = text.find(",", 6)
        try:
            return int(text[6:end] if end > 0 else text[6:-1])
        except ValueError:
            pass
    return int(_data(text).get("at", 0))


def _data(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:  # (an unreadable event: replay has it set aside)
        return {}
    return value if isinstance(value, dict) else {}


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True, slots=True)
class Caught:
    """A book's fold as far as it has read, and how far that is from the log's end."""

    fold: CapacityFold
    behind: int
    """Events committed that the fold has not read yet (0: it is up to date)."""


class CapacityBook:
    """A `CapacityFold` of the log, read once (at most its last `MAX_FIRST_READ` events)
    and then only from what was appended since, a page at a time in a task of its own."""

    def __init__(self) -> None:
        self.fold = CapacityFold()
        self._read = 0
        self._last = 0
        self._task: asyncio.Task[None] | None = None
        self._failed: StoreError | None = None

    async def caught_up(self, log: LogReads, replacements: Mapping[int, tuple[str, str]],
                        wait_s: float | None = None) -> Caught:
        """The fold up to the log's last committed event, or, if reading that far takes
        longer than ``wait_s`` (default `FIRST_WAIT_S`: a long log's first read), as far as
        it got meanwhile (the read goes on: ask again); ``replacements``: what stands in
        for each event set aside, by position."""
        last = await log.last_position()
        self._last = max(self._last, last)
        if self._task is None or self._task.done():
            self._task = spawn(self._read_on(log, replacements), "capacity read")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task),
                                   FIRST_WAIT_S if wait_s is None else wait_s)
        failed, self._failed = self._failed, None
        if failed is not None:  # (the next ask reads again from where this one stopped)
            raise failed
        return Caught(self.fold, max(0, last - self._read))

    async def _read_on(self, log: LogReads, replacements: Mapping[int, tuple[str, str]]
                       ) -> None:
        """Read the log up to `_last` (and what was appended while it read), a page at a
        time, folding a step at a time with the event loop's other work in between."""
        try:
            await self._read_pages(log, replacements)
        except StoreError as error:  # (said to the asker, not logged as a task's failure)
            self._failed = error

    async def _read_pages(self, log: LogReads,
                          replacements: Mapping[int, tuple[str, str]]) -> None:
        fold = self.fold
        if self._read == 0 and self._last > MAX_FIRST_READ:
            self._read = self._last - MAX_FIRST_READ
            first = await log.read(self._read, 1)
            fold.since = first[0].recorded_at if first else None
        while self._read < self._last:
            page = await log.read(self._read, READ_PAGE)
            if not page:
                break
            for start in range(0, len(page), FOLD_STEP):
                await asyncio.sleep(0)
                for record in page[start:start + FOLD_STEP]:
                    fold.feed(record, replacements.get(record.position))
            self._read = page[-1].position
        fold.trim()
