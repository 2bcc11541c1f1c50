"""Replay (fold the log back into states) and verify (re-decide the inputs, compare)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from lanes.decide import decide
from lanes.events import (
    INPUTS,
    AgentCallDispatched,
    CallAnswered,
    CallUndeliverable,
    ControlApplied,
    Decision,
    Event,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestSummarized,
    RunAborted,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunSteered,
    answer_id,
)
from lanes.evolve import fold
from lanes.state import AgentState
from lanes.streams import is_agent_stream


@dataclass(frozen=True, slots=True)
class Entry:
    """One event of the log with where it sits: global position and stream."""

    position: int
    stream: str
    event: Event


def replay(
    entries: Iterable[Entry], states: dict[str, AgentState] | None = None
) -> dict[str, AgentState]:
    """Fold every agent's events into its state (continuing ``states`` if given)."""
    states = {} if states is None else states
    batches: dict[str, list[Event]] = {}
    for entry in entries:
        batch = batches.get(entry.stream)
        if batch is None:
            batch = batches[entry.stream] = []
        batch.append(entry.event)
    _fold_batches(states, batches)
    return states


def _fold_batches(states: dict[str, AgentState], batches: dict[str, list[Event]]) -> None:
    for stream, events in batches.items():
        if is_agent_stream(stream):
            state = states.get(stream)
            if state is None:
                state = states[stream] = AgentState(agent_id=stream)
            fold(state, events)


Call = tuple[str, AgentCallDispatched]
"""A sub-agent call and the agent that dispatched it."""
Answer = tuple[str, CallAnswered]
"""An answer to a sub-agent call and the agent that gives it."""


@dataclass(slots=True)
class LogFold:
    """What a start needs from the log up to ``position``: every agent's state, and the
    sub-agent calls committed as dispatched that their target has not received (nor given up
    on) yet, by call id, and the answers to calls their caller has not received yet, by
    the id of the request that carries them. A snapshot stores exactly this
    (`lanes.snapshot`)."""

    states: dict[str, AgentState] = field(default_factory=dict)
    position: int = 0
    calls: dict[str, Call] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)

    def add(self, entries: Iterable[Entry]) -> None:
        """Fold more of the log (entries in position order, after ``position``)."""
        batches: dict[str, list[Event]] = {}
        calls, answers = self.calls, self.answers
        position = self.position
        for entry in entries:
            stream, event = entry.stream, entry.event
            position = entry.position
            batch = batches.get(stream)
            if batch is None:
                batch = batches[stream] = []
            batch.append(event)
            track_call(calls, answers, stream, event)
        _fold_batches(self.states, batches)
        self.position = position


def track_call(calls: dict[str, Call], answers: dict[str, Answer], stream: str,
               event: Event) -> None:
    """Follow calls and answers on their way: a dispatched call until its target receives
    it (or it is found undeliverable), an answer until its caller receives it."""
    if type(event) is AgentCallDispatched:
        calls[event.call_id] = (stream, event)
    elif type(event) is CallAnswered:
        answers[answer_id(event.result.call_id)] = (stream, event)
    elif type(event) is CallUndeliverable:
        calls.pop(event.call_id, None)
    elif type(event) is RequestReceived and (calls or answers):
        request_id = event.request.request_id
        calls.pop(request_id, None)
        answers.pop(request_id, None)


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first place where re-deciding the recorded inputs disagrees with the log.

    ``recorded`` is what the log holds at ``position`` (None: the stream ends there) and
    ``redecided`` what `decide` makes of ``input`` (recorded at ``input_position``) there
    (None: nothing more).
    """

    position: int
    stream: str
    input: Event | None
    recorded: Event | None
    redecided: Decision | None
    input_position: int | None = None

    def describe(self) -> str:
        """One paragraph a person can act on."""
        at = "" if self.input_position is None else f" (position {self.input_position})"
        return (
            f"divergence at position {self.position} in stream {self.stream!r}:\n"
            f"  input{at}: {self.input!r}\n"
            f"  recorded:   {self.recorded!r}\n"
            f"  re-decided: {self.redecided!r}"
        )




class Verifier:
    """Re-decides a log fed to it in position order, in as many pieces as wanted.

    `feed` returns the first divergence as soon as it is seen (and every later call returns
    the same); `finish` also reports decisions a stream's last input should have had and the
    log does not hold. Streams are independent: verifying each stream on its own and taking
    the `first` of the results gives the same answer.
    """

    def __init__(self) -> None:
        self._states: dict[str, AgentState] = {}
        self._expected: dict[str, deque[Decision]] = {}
        self._inputs: dict[str, tuple[int, Event]] = {}
        self._last: dict[str, int] = {}
        self.divergence: Divergence | None = None
        self.events = 0
        """Agent events checked so far."""
        self.inputs = 0
        """Of which inputs re-decided."""

    def feed(self, entries: Iterable[Entry]) -> Divergence | None:
        """Check more of the log; the first divergence so far, or None."""
        if self.divergence is not None:
            return self.divergence
        states, expected, inputs, last = self._states, self._expected, self._inputs, self._last
        events = inputs_seen = 0
        for entry in entries:
            stream, event = entry.stream, entry.event
            if not is_agent_stream(stream):
                continue
            events += 1
            queue = expected.get(stream)
            if queue is None:
                queue = expected[stream] = deque()
            last[stream] = entry.position
            if type(event) in INPUTS:
                if queue:
                    self.divergence = self._diverged(entry.position, stream, event, queue[0])
                    break
                state = states.get(stream)
                if state is None:
                    state = states[stream] = AgentState(agent_id=stream)
                inputs[stream] = (entry.position, event)
                inputs_seen += 1
                queue.extend(decide(state, event))  # type: ignore[arg-type]  # an input
                continue
            redecided = queue.popleft() if queue else None
            if redecided != event:
                self.divergence = self._diverged(entry.position, stream, event, redecided)
                break
        self.events += events
        self.inputs += inputs_seen
        return self.divergence

    def finish(self) -> Divergence | None:
        """The first divergence of the whole log, or None: it means the same today. A
        decision missing at the end of a stream counts only when no event disagreed."""
        if self.divergence is None:
            missing = [(self._last[stream] + 1, stream) for stream, queue
                       in self._expected.items() if queue]
            if missing:
                position, stream = min(missing)
                self.divergence = self._diverged(position, stream, None,
                                                 self._expected[stream][0])
        return self.divergence

    def _diverged(self, position: int, stream: str, recorded: Event | None,
                  redecided: Decision | None) -> Divergence:
        input_position, event = self._inputs.get(stream, (None, None))
        return Divergence(position, stream, event, recorded, redecided, input_position)


def first(divergences: Iterable[Divergence | None]) -> Divergence | None:
    """The divergence a whole log has, from those of its streams verified one by one: the
    earliest event that disagrees, else the earliest decision missing at a stream's end."""
    found = [d for d in divergences if d is not None]
    disagreeing = [d for d in found if d.recorded is not None]
    return min(disagreeing or found, key=lambda d: d.position, default=None)


def verify(entries: Iterable[Entry]) -> Divergence | None:
    """Re-run `decide` over every recorded input; the first disagreement, or None."""
    verifier = Verifier()
    verifier.feed(entries)
    return verifier.finish()


@dataclass(frozen=True, slots=True)
class Step:
    """One recorded input and the decisions it caused, as the log holds them."""

    input: Entry
    decisions: tuple[Entry, ...]


def steps(entries: Iterable[Entry]) -> Iterator[Step]:
    """The log of one stream (in position order) as inputs with their decisions. Decisions
    before the first input (a log cut in the middle) are left out."""
    current: Entry | None = None
    decisions: list[Entry] = []
    for entry in entries:
        if type(entry.event) in INPUTS:
            if current is not None:
                yield Step(current, tuple(decisions))
            current, decisions = entry, []
        elif current is not None:
            decisions.append(entry)
    if current is not None:
        yield Step(current, tuple(decisions))


def request_outcomes(entries: Iterable[Entry]) -> dict[str, str]:
    """Where each request ended: ran, running, pending, deduped, dropped, summarized,
    aborted or rejected. Control-lane requests that took effect count as ran."""
    outcome: dict[str, str] = {}
    runs: dict[str, list[str]] = {}
    for entry in entries:
        event = entry.event
        if isinstance(event, RequestReceived):
            outcome.setdefault(event.request.request_id, "received")
        elif isinstance(event, RequestQueued):
            outcome[event.request_id] = "pending"
        elif isinstance(event, ControlApplied):
            outcome[event.request_id] = "ran"
        elif isinstance(event, RequestDeduped):
            outcome[event.request_id] = "deduped"
        elif isinstance(event, RequestRejected):
            # A transient refusal may concern a resubmission: the first request stands.
            if not event.transient or outcome.get(event.request_id) == "received":
                outcome[event.request_id] = "rejected"
        elif isinstance(event, RequestDropped):
            outcome[event.request_id] = "dropped"
        elif isinstance(event, RequestSummarized):
            outcome[event.request_id] = "summarized"
        elif isinstance(event, RunStarted):
            runs[event.run_id] = list(event.request_ids)
            outcome.update(dict.fromkeys(event.request_ids, "running"))
        elif isinstance(event, RunSteered):
            runs[event.run_id].append(event.request_id)
            outcome[event.request_id] = "running"
        elif isinstance(event, RunCompleted | RunFailed):
            outcome.update(dict.fromkeys(runs[event.run_id], "ran"))
        elif isinstance(event, RunAborted):
            outcome.update(
                dict.fromkeys(runs[event.run_id], "pending" if event.requeued else "aborted")
            )
    return outcome
