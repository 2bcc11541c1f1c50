"""Capacity answers: a `CapacityFold`'s series cut into the steps of one window (the
deepest queues, the waits and run latencies by percentile, each gate's use of its limits),
for ``GET /api/capacity``."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.reads.capacity import AgentTrack, CapacityFold, GateTrack, Samples, Steps

Limits = tuple[int | None, int | None, int | None]
"""Requests, input tokens and output tokens per minute (None: unlimited)."""
MAX_ANSWER_MARKS = 200
"""Marks in one answer (the newest in the window)."""


@dataclass(frozen=True, slots=True)
class Window:
    """The steps of one answer: ``count`` steps of ``step`` ms from ``start`` (both whole
    seconds)."""

    start: int
    step: int
    count: int

    @property
    def end(self) -> int:
        """The end of the last step."""
        return self.start + self.count * self.step

    def peaks(self, steps: Steps, tail: Iterable[tuple[int, int]] = ()) -> list[int]:
        """`Steps.peaks` over these steps."""
        return steps.peaks(self.start // 1000, self.step // 1000, self.count, tail)

    def percentiles(self, samples: Iterable[Samples]) -> dict[str, list[int | None]]:
        """Per step: how many samples, and their median and 95th percentile (nearest
        rank; None where there are none)."""
        groups: list[list[int]] = [[] for _ in range(self.count)]
        start, step = self.start, self.step
        for series in samples:
            i, j = series.within(start, self.end)
            for at, value in zip(series.times[i:j], series.values[i:j], strict=True):
                groups[(at - start) // step].append(value)
        out: dict[str, list[int | None]] = {"count": [], "p50": [], "p95": []}
        for group in groups:
            group.sort()
            out["count"].append(len(group))
            out["p50"].append(_rank(group, 50))
            out["p95"].append(_rank(group, 95))
        return out


def _rank(values: list[int], percent: int) -> int | None:
    if not values:
        return None
    return values[max(0, -(-len(values) * percent // 100) - 1)]


def capacity_answer(fold: CapacityFold, window: Window, *, desk: Iterable[str],
                    agents: Iterable[str] | None, busiest: int, gates: Iterable[str],
                    limits: Mapping[str, Limits]) -> dict[str, Any]:
    """The answer for ``window``: the desk's series over the agents of ``desk`` (those the
    caller may see), each of ``agents`` (None: the ``busiest`` of the desk: the deepest
    queue in the window, then the most runs), each of ``gates`` (``limits``: each gate's
    limits now, for times before the log says), and the marks of those in the window."""
    shown_desk = sorted(set(desk))
    tracks = [fold.agents[a] for a in shown_desk if a in fold.agents]
    if agents is None:
        picked = _busiest(fold, window, shown_desk, busiest)
    else:
        picked = list(dict.fromkeys(agents))
    latency = window.percentiles(t.latency for t in tracks)
    gate_names = list(dict.fromkeys(gates))
    marks = [m for m in fold.marks if window.start <= m["at"] < window.end
             and (m.get("agentId") in set(shown_desk) or m.get("provider") in gate_names)]
    return {
        "from": window.start, "to": window.end, "step": window.step,
        "position": fold.position, "since": fold.since, "busiest": agents is None,
        "desk": {"agents": len(shown_desk), "depth": window.peaks(_desk_depth(tracks, window)),
                 "runs": latency["count"], "p50": latency["p50"], "p95": latency["p95"]},
        "agents": [_agent_json(fold.agents.get(a, AgentTrack()), a, window) for a in picked],
        "gates": [_gate_json(fold.gates.get(g, GateTrack()), g, window, limits.get(g))
                  for g in gate_names],
        "marks": marks[-MAX_ANSWER_MARKS:],
    }


def _busiest(fold: CapacityFold, window: Window, agents: list[str], count: int) -> list[str]:
    first, last = window.start // 1000, window.end // 1000
    scored: list[tuple[int, int, str]] = []
    for agent_id in agents:
        track = fold.agents.get(agent_id)
        if track is None:
            continue
        depth = track.depth
        i, j = bisect_right(depth.secs, first - 1), bisect_left(depth.secs, last)
        deepest = max([depth.at(first - 1), *depth.values[i:j]])
        start, stop = track.latency.within(window.start, window.end)
        if deepest or stop > start:
            scored.append((-deepest, start - stop, agent_id))
    return [agent_id for _, _, agent_id in sorted(scored)[:count]]


def _desk_depth(tracks: list[AgentTrack], window: Window) -> Steps:
    """The sum of the agents' pending requests over the window, second by second."""
    first, last = window.start // 1000, window.end // 1000
    current: list[int] = []
    points: list[tuple[int, int, int]] = []
    for n, track in enumerate(tracks):
        depth = track.depth
        current.append(depth.at(first - 1))
        i, j = bisect_right(depth.secs, first - 1), bisect_left(depth.secs, last)
        points += zip(depth.secs[i:j], [n] * (j - i), depth.values[i:j], strict=True)
    points.sort()
    total = sum(current)
    steps = Steps()
    steps.set((first - 1) * 1000, total)
    for sec, n, value in points:
        total += value - current[n]
        current[n] = value
        steps.set(sec * 1000, total)
    return steps


def _agent_json(track: AgentTrack, agent_id: str, window: Window) -> dict[str, Any]:
    latency = window.percentiles([track.latency])
    return {"agentId": agent_id, "depth": window.peaks(track.depth),
            "runs": latency["count"], "p50": latency["p50"], "p95": latency["p95"]}


def _gate_json(track: GateTrack, provider: str, window: Window,
               now: Limits | None) -> dict[str, Any]:
    tails = track.exits(window.end)
    used = [window.peaks(steps, tail) for steps, tail in zip(track.usage, tails, strict=True)]
    waits = window.percentiles([track.waits])
    in_force = [_limits_at(track, at, now) for at in
                range(window.start + window.step - 1, window.end, window.step)]
    latest = _limits_at(track, window.end - 1, now)
    return {
        "provider": provider,
        "limits": {"requestsPerMinute": latest[0], "inputTokensPerMinute": latest[1],
                   "outputTokensPerMinute": latest[2]},
        "waiting": window.peaks(track.depth),
        "waits": waits["count"], "waitP50": waits["p50"], "waitP95": waits["p95"],
        "requests": used[0], "inputTokens": used[1], "outputTokens": used[2],
        "requestUse": [_use(n, lim[0]) for n, lim in zip(used[0], in_force, strict=True)],
        "tokenUse": [_most(_use(i, lim[1]), _use(o, lim[2]))
                     for i, o, lim in zip(used[1], used[2], in_force, strict=True)],
    }


def _limits_at(track: GateTrack, at: int, now: Limits | None) -> Limits:
    """The limits in force at ``at``: the log's, else ``now`` (else none)."""
    i = bisect_right(track.limits, (at, float("inf"))) - 1
    if i < 0:
        return now or (None, None, None)
    return track.limits[i][1:]


def _use(used: int, limit: int | None) -> float | None:
    return None if limit is None else round(used / limit, 4)


def _most(first: float | None, second: float | None) -> float | None:
    if first is None or second is None:
        return first if second is None else second
    return max(first, second)
