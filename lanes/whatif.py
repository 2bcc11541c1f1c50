"""What-if: re-run the recorded inputs of a real log under another policy, and compare.

Each agent is simulated on its own, from an empty state, through `decide` (so through exactly
the code the gateway runs). The model, in full:

- **Config.** An agent given another config has it from its first input to the end of the log:
  every recorded `ConfigChanged` of that agent is replaced by the other config (so later
  reconfigurations in the log are not replayed: they were changes of the very policy under
  study). Agents without another config keep their recorded configs, changes included.
- **Outside inputs** are replayed at their recorded times: requests, operator commands
  (an ``abort_run`` aborts the run that stands for the recorded one, see below), and the
  gateway's own stops and restarts (``Stopping``, ``Restarted``), which cut runs off as they
  did. The simulation does not know when the gateway was down, so timers may fire in a
  downtime.
- **Timers** are not replayed: they depend on the policy. As the runtime does, a
  `TimerElapsed` is fed whenever `next_due` says something falls due.
- **Runs.** The LLM cannot be re-run, so each run replays a recording. A recorded run's
  *script* is what its runner reported (steerability changes, then its result: finished with
  an outcome and token usage, errored, or refused for spend), as offsets from its start. A
  simulated run plays the script of the recorded run that held its first request (the k-th
  simulated run to start with a request plays the k-th recorded run that held it); a recorded
  run that never reported a result (aborted, or still running at the end) finishes with the
  agent's most common outcome after the agent's median run duration, but not before it was
  cut off in the recording. A run whose first request never ran in the recording gets that
  same median run. Results of runs that were aborted are dropped.
- **Not simulated:** orders and sub-agent calls (results carry no order intents or calls, and
  `BrokerReport` and `CallUndeliverable` inputs are skipped): what-if measures the queue, not
  trading.
- **Ties.** At the same millisecond, a timer goes first, then recorded inputs and script steps
  in the order they were recorded.
- **The end** of the simulation is the time of the last recorded input of the whole log:
  nothing due later happens.

Under the recorded configs, this model reproduces the recorded decisions of a log made by the
gateway (`tests/replay/test_whatif.py`), so the differences it reports come from the policy.
"""

from __future__ import annotations

import heapq
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lanes.config import AgentConfig
from lanes.decide import decide, next_due
from lanes.events import (
    INPUTS,
    BrokerReport,
    CallUndeliverable,
    ConfigChanged,
    Input,
    OperatorCommand,
    Outcome,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestSummarized,
    RunAborted,
    RunCompleted,
    RunErrored,
    RunFailed,
    RunFinished,
    RunsSuppressed,
    RunStarted,
    RunSteerability,
    RunSteered,
    SpendLimitHit,
    TimerElapsed,
    Usage,
)
from lanes.replay import Entry
from lanes.state import AgentState
from lanes.streams import is_agent_stream

_RUN_REPORTS = (RunSteerability, RunFinished, RunErrored, SpendLimitHit)
_SKIPPED = (TimerElapsed, BrokerReport, CallUndeliverable, *_RUN_REPORTS)
_TIMER_FIRST = -1
_LAST = 1 << 62
"""Tie-break of script steps that were never recorded (synthetic results): after the rest."""


@dataclass(frozen=True, slots=True)
class Tally:
    """What became of one agent's requests over a log (recorded or simulated)."""

    received: int = 0
    accepted: int = 0
    """Queued or steered into a run."""
    runs: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    dropped: int = 0
    summarized: int = 0
    deduped: int = 0
    rejected: int = 0
    suppressions: int = 0
    steered: int = 0
    never_ran: int = 0
    """Accepted requests that no run took by the end (pending, dropped later, aborted...)."""
    waits: tuple[int, ...] = ()
    """Milliseconds from each accepted request's arrival to the start of the first run that
    took it (0 for a steer), in arrival order."""

    def wait(self, quantile: float) -> int | None:
        """A quantile of the waits (0.5: the median), None when no request ran."""
        if not self.waits:
            return None
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


_COUNTED: dict[type, str] = {
    RunCompleted: "completed", RunFailed: "failed", RunAborted: "aborted",
    RequestDropped: "dropped", RequestSummarized: "summarized", RequestDeduped: "deduped",
    RequestRejected: "rejected", RunsSuppressed: "suppressions",
}
"""Decisions `tally` only counts, with the `Tally` field each one adds to."""


def tally(entries: Iterable[Entry],
          waiting: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Tally]:
    """The `Tally` of every agent stream of a log (entries in position order). ``waiting``:
    per stream, requests accepted before these entries and still waiting (id -> arrival
    time), whose waits count when a run takes them (a tally from a moment on)."""
    counters: dict[str, Counter[str]] = {}
    arrivals: dict[str, dict[str, int]] = {}
    waits: dict[str, dict[str, int]] = {}
    now: dict[str, int] = {}
    for stream, pending in (waiting or {}).items():
        counters[stream], arrivals[stream], waits[stream] = Counter(), dict(pending), {}
        now[stream] = 0
    for entry in entries:
        stream, event = entry.stream, entry.event
        if not is_agent_stream(stream):
            continue
        count = counters.get(stream)
        if count is None:
            count = counters[stream] = Counter()
            arrivals[stream], waits[stream], now[stream] = {}, {}, 0
        kind = type(event)
        if kind in INPUTS:
            now[stream] = max(now[stream], event.at)  # type: ignore[union-attr]
            if kind is RequestReceived:
                count["received"] += 1
            continue
        t = now[stream]
        if kind is RequestQueued:
            count["accepted"] += 1
            arrivals[stream].setdefault(event.request_id, t)  # type: ignore[union-attr,arg-type]
        elif kind is RunSteered:
            count["accepted"] += 1
            count["steered"] += 1
            waits[stream].setdefault(event.request_id, 0)  # type: ignore[union-attr,arg-type]
        elif kind is RunStarted:
            count["runs"] += 1
            for request_id in event.request_ids:  # type: ignore[union-attr]
                arrived = arrivals[stream].get(request_id)
                if arrived is not None:
                    waits[stream].setdefault(request_id, t - arrived)
        else:
            counted = _COUNTED.get(kind)
            if counted is not None:
                count[counted] += 1
    result = {}
    for stream, count in counters.items():
        ran = waits[stream]
        result[stream] = Tally(
            **count,
            never_ran=sum(1 for r in arrivals[stream] if r not in ran),
            waits=tuple(ran.values()),
        )
    return result


# ------------------------------------------------------------------------- the run book


@dataclass(frozen=True, slots=True)
class ScriptStep:
    """One report of a runner: at ``offset`` ms after its run started."""

    offset: int
    order: int
    """Where it sits among what happens at the same millisecond (its recorded position)."""
    report: Input
    """The recorded input (its ``run_id`` and ``at`` are replaced when played)."""


@dataclass(slots=True)
class RecordedRun:
    """A run of the recording: when it started, what it held, what its runner reported."""

    run_id: str
    started_at: int
    request_ids: list[str]
    steps: list[ScriptStep] = field(default_factory=list)
    ended_at: int | None = None
    """When it was cut off (aborted) without a result of its own; None if it has one or
    ran to the end of the log."""

    @property
    def result(self) -> ScriptStep | None:
        """The step that ends the run, if the runner reported one."""
        for step in self.steps:
            if not isinstance(step.report, RunSteerability):
                return step
        return None


@dataclass(slots=True)
class RunBook:
    """The recorded runs of one agent, by the requests they held."""

    runs: list[RecordedRun]
    holders: dict[str, list[RecordedRun]]
    median_ms: int | None
    """Median duration of the runs that reported a result (None: none did)."""
    outcome: Outcome
    """The most common outcome of completed runs (no trade if none completed)."""


def run_book(entries: Sequence[Entry], going: RecordedRun | None = None) -> RunBook:
    """The recorded runs of one agent's stream (in position order); ``going``: a run that
    started before these entries (its script is read from them)."""
    runs: dict[str, RecordedRun] = {} if going is None else {going.run_id: going}
    holders: dict[str, list[RecordedRun]] = {}
    now = 0
    for entry in entries:
        event = entry.event
        if type(event) in INPUTS:
            now = max(now, event.at)  # type: ignore[union-attr]
            if isinstance(event, _RUN_REPORTS):
                run = runs.get(event.run_id)
                if run is not None and run.ended_at is None:
                    run.steps.append(ScriptStep(now - run.started_at, entry.position, event))
        elif isinstance(event, RunStarted):
            run = runs[event.run_id] = RecordedRun(event.run_id, now, list(event.request_ids))
            for request_id in event.request_ids:
                holders.setdefault(request_id, []).append(run)
        elif isinstance(event, RunSteered) and event.run_id in runs:
            holders.setdefault(event.request_id, []).append(runs[event.run_id])
        elif isinstance(event, RunAborted) and event.run_id in runs:
            run = runs[event.run_id]
            if run.result is None:
                run.ended_at = now
    durations = [run.result.offset for run in runs.values() if run.result is not None]
    outcomes = Counter(
        step.report.outcome for run in runs.values()
        if (step := run.result) is not None and isinstance(step.report, RunFinished)
    )
    top = max(outcomes.items(), key=lambda item: (item[1], item[0] == Outcome.NO_TRADE),
              default=(Outcome.NO_TRADE, 0))[0]
    return RunBook(
        runs=list(runs.values()),
        holders=holders,
        median_ms=int(statistics.median(durations)) if durations else None,
        outcome=top,
    )


# ---------------------------------------------------------------------- the simulation


@dataclass(slots=True)
class _Scheduled:
    """A script step of a simulated run, or a timer."""

    run_id: str | None
    report: Input | None


class Simulation:
    """One agent's recorded inputs replayed under a config (see the module docstring)."""

    def __init__(self, agent_id: str, entries: Sequence[Entry], config: AgentConfig | None,
                 end: int, start: AgentState | None = None) -> None:
        self.agent_id = agent_id
        self.entries = entries
        self.config = config
        self.end = end
        run = None if start is None else start.active
        going = None if run is None else RecordedRun(
            run.run_id, run.started_at, [p.request.request_id for p in run.requests])
        self.book = run_book(entries, going)
        self.state = AgentState(agent_id=agent_id) if start is None else start
        """From an empty state, or from ``start`` (the agent at a moment: its own copy)."""
        self.log: list[Entry] = []
        self._queue: list[tuple[int, int, int, _Scheduled]] = []
        self._seq = 0
        self._starts: Counter[str] = Counter()
        self._standing: dict[str, str] = {}
        """Recorded run id -> the simulated run playing its script."""
        self._timer_at: int | None = None
        self._fired_idle: int | None = None
        """A timer at this time decided nothing: do not fire another one then."""
        if going is not None:  # the run going at the start plays its own recorded script
            self._play(going.run_id, going.started_at, going)
        if start is not None:
            self._schedule_timer()

    def run(self, progress: Callable[[int], None] | None = None) -> list[Entry]:
        """Simulate; the simulated log (positions count from 1 within the agent)."""
        configured = False
        for done, entry in enumerate(self.entries, start=1):
            if progress is not None and done % 1000 == 0:
                progress(1000)
            event = entry.event
            if type(event) not in INPUTS or isinstance(event, _SKIPPED):
                continue
            at: int = event.at  # type: ignore[union-attr]
            self._drain((at, entry.position))
            if self.config is not None:
                if isinstance(event, ConfigChanged):
                    event = ConfigChanged(at=at, config=self.config, principal=event.principal)
                    configured = True
                elif not configured:
                    self._feed(ConfigChanged(at=at, config=self.config, principal="what-if"))
                    configured = True
            if isinstance(event, OperatorCommand) and event.run_id in self._standing:
                event = OperatorCommand(at=at, action=event.action, principal=event.principal,
                                        run_id=self._standing[event.run_id])
            self._feed(event)  # type: ignore[arg-type]
        self._drain((self.end, _LAST + 1))
        if progress is not None:
            progress(len(self.entries) % 1000)
        return self.log

    def _feed(self, event: Input) -> None:
        decisions = decide(self.state, event)
        if decisions:
            for item in (event, *decisions):
                self.log.append(Entry(len(self.log) + 1, self.agent_id, item))
            for decision in decisions:
                if isinstance(decision, RunStarted):
                    self._start(decision)
        self._schedule_timer()

    def _push(self, at: int, order: int, item: _Scheduled) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, order, self._seq, item))

    def _drain(self, before: tuple[int, int]) -> None:
        """Play everything scheduled before ``before`` (a time and a tie-break)."""
        queue = self._queue
        while queue and (queue[0][0], queue[0][1]) < before:
            at, _, _, item = heapq.heappop(queue)
            if item.report is None:  # a timer
                if self._timer_at != at:
                    continue  # replaced by a later one
                self._timer_at = None
                if self._fired_idle == at:
                    continue
                count = len(self.log)
                self._feed(TimerElapsed(at=at))
                self._fired_idle = at if len(self.log) == count else None
                continue
            run = self.state.active
            if run is None or run.run_id != item.run_id:
                continue  # the run ended before its runner reported this
            self._feed(_replace_run(item.report, item.run_id, at))

    def _schedule_timer(self) -> None:
        """As the runtime does: one timer, at the next time something falls due."""
        due = next_due(self.state, self.state.now)
        if due is None:
            self._timer_at = None  # the timer scheduled before, if any, is cancelled
            return
        due = max(due, self.state.now)
        if due == self._timer_at:
            return
        self._timer_at = due
        self._push(due, _TIMER_FIRST, _Scheduled(None, None))

    def _start(self, started: RunStarted) -> None:
        """Schedule the script the new run plays."""
        first = started.request_ids[0]
        nth = self._starts[first]
        self._starts[first] += 1
        holders = self.book.holders.get(first)
        recorded = holders[min(nth, len(holders) - 1)] if holders else None
        self._play(started.run_id, self.state.now, recorded)

    def _play(self, run_id: str, begin: int, recorded: RecordedRun | None) -> None:
        """Schedule the script of ``recorded`` (or a median run) for the simulated run
        ``run_id`` that started at ``begin``."""
        steps: list[ScriptStep] = []
        cut_at = 0
        if recorded is not None:
            self._standing[recorded.run_id] = run_id
            steps = list(recorded.steps)
            if recorded.ended_at is not None:
                cut_at = recorded.ended_at - recorded.started_at
            elif recorded.result is None:
                cut_at = self.end - recorded.started_at
        if not any(not isinstance(s.report, RunSteerability) for s in steps):
            median = self.book.median_ms
            if median is not None:
                steps.append(ScriptStep(max(median, cut_at + 1), _LAST, RunFinished(
                    at=0, run_id="", outcome=self.book.outcome, usage=Usage())))
        for step in steps:
            self._push(begin + step.offset, step.order, _Scheduled(run_id, step.report))


def _replace_run(report: Input, run_id: str | None, at: int) -> Input:
    """A recorded runner report, for the simulated run ``run_id`` at time ``at``."""
    assert run_id is not None
    if isinstance(report, RunSteerability):
        return RunSteerability(at=at, run_id=run_id, steerable=report.steerable)
    if isinstance(report, RunFinished):  # no orders, no calls: not simulated
        return RunFinished(at=at, run_id=run_id, outcome=report.outcome, usage=report.usage)
    if isinstance(report, RunErrored):
        return RunErrored(at=at, run_id=run_id, error=report.error)
    assert isinstance(report, SpendLimitHit)
    return SpendLimitHit(at=at, run_id=run_id, provider=report.provider, reason=report.reason)


# ------------------------------------------------------------------------------ the report


@dataclass(frozen=True, slots=True)
class AgentWhatIf:
    """One agent: its recorded config (the last one) and the other one, both tallies."""

    agent_id: str
    recorded_config: AgentConfig | None
    config: AgentConfig | None
    """The other config, or None if it kept its recorded ones."""
    recorded: Tally
    whatif: Tally

    def config_changes(self) -> list[tuple[str, Any, Any]]:
        """(setting, recorded, what-if) for every setting the other config changes; nested
        settings are dotted (``budgets.maxRunsPerHour``)."""
        if self.config is None:
            return []
        before = _flat((self.recorded_config or AgentConfig()).model_dump(mode="json"))
        after = _flat(self.config.model_dump(mode="json"))
        return [(key, before.get(key), value) for key, value in after.items()
                if before.get(key) != value]


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def split_streams(entries: Iterable[Entry]) -> tuple[dict[str, list[Entry]], int]:
    """Every agent stream's entries, and the time of the last input of the whole log."""
    streams: dict[str, list[Entry]] = {}
    end = 0
    for entry in entries:
        if not is_agent_stream(entry.stream):
            continue
        streams.setdefault(entry.stream, []).append(entry)
        if type(entry.event) in INPUTS:
            end = max(end, entry.event.at)  # type: ignore[union-attr]
    return streams, end


def whatif(
    entries: Iterable[Entry],
    configs: Mapping[str, AgentConfig],
    progress: Callable[[int], None] | None = None,
) -> list[AgentWhatIf]:
    """Every agent of the log: recorded, and simulated with ``configs`` (by agent id; agents
    not named keep their recorded configs). ``progress`` is told how many more recorded
    events were simulated, now and then."""
    streams, end = split_streams(entries)
    report = []
    for agent_id, stream in sorted(streams.items()):
        config = configs.get(agent_id)
        simulated = Simulation(agent_id, stream, config, end).run(progress)
        recorded = tally(stream).get(agent_id, Tally())
        report.append(AgentWhatIf(
            agent_id=agent_id,
            recorded_config=_last_config(stream),
            config=config,
            recorded=recorded,
            whatif=tally(simulated).get(agent_id, Tally()),
        ))
    return report


def _last_config(stream: Sequence[Entry]) -> AgentConfig | None:
    for entry in reversed(stream):
        if isinstance(entry.event, ConfigChanged):
            return entry.event.config
    return None



def whatif_from(start: AgentState, after: Sequence[Entry], config: AgentConfig,
                end: int | None = None) -> AgentWhatIf:
    """What-if from a moment: the agent as it was (``start``, its own copy: it is advanced),
    then its recorded entries ``after`` that moment, in position order, re-run with
    ``config`` from the first input on (a run going at the moment plays its own recorded
    script). Both tallies count only what happened after the moment; a request waiting then
    counts its wait from its arrival. The simulation ends at ``end`` (for a live log: now,
    up to which the recording went on), and never before the last input of ``after``."""
    waiting = {start.agent_id: {p.request.request_id: p.at for p in start.pending}}
    last = max((e.event.at for e in after if type(e.event) in INPUTS),  # type: ignore[union-attr]
               default=start.now)
    end = last if end is None else max(end, last)
    recorded_config = start.config
    simulated = Simulation(start.agent_id, after, config, end, start).run()
    return AgentWhatIf(
        agent_id=start.agent_id, recorded_config=recorded_config, config=config,
        recorded=tally(after, waiting).get(start.agent_id, Tally()),
        whatif=tally(simulated, waiting).get(start.agent_id, Tally()))
