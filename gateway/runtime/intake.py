"""The one way in for requests: decided in order, in steps, each answered after its commit.

`Intake.take` decides a list of requests and gives back one future per request: its ack
once the decision is committed, or the `GatewayError` it is refused with (an unknown agent,
say: the others go on). The requests of one agent in one call share one append (a `Group`:
one future, one version check), so a batch costs far less than as many single requests; so
do the single requests of one agent taken in one turn of the loop (appended at its end).
Requests are decided `DECIDE_STEP` at a time, letting other work (a stop) run in between: a
big batch never holds the loop for long; with a ``pacer`` (the feed's), each step of
`PACED_STEP` takes its turn. A request that cannot be stored during a storage fault may be held
(`gateway.runtime.held`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol

from gateway.errors import GatewayError, Superseded, Unstorable
from gateway.runtime.acks import Ack, ack_of
from gateway.runtime.agents import Agent, Group
from lanes.codec import Unrepeatable
from lanes.events import (
    Decision,
    Input,
    RequestReceived,
    RunAborted,
    RunCompleted,
    RunFailed,
    RunSteered,
    TasksFinished,
)
from lanes.repeatable import wrapper_reads_back
from lanes.requests import AgentRequest, Kind
from store.port import NewEvent, RecordedEvent

log = logging.getLogger("gateway.controls")
_bugs = logging.getLogger("gateway.runtime.intake")

if TYPE_CHECKING:
    from gateway.base.pacing import Pacer
    from gateway.runtime.engine import Engine

DECIDE_STEP: Final = 50
"""Requests of a batch decided before other work may run (about 1-2 ms of the loop; the
requests of one agent are still appended once per batch, `Group`)."""
PACED_STEP: Final = 5
"""The same for a feed's batch, whose steps take turns of its pacer: a stop's frame waits for
the unit under way to be read (measured under `bench.estop_latency`'s flood, alternated runs:
units of 50 held the loop 6.0-6.5 ms at p99, of 20 3.8-3.9 ms; the stop's ack p99 15.3-17.2
against 12.0-15.3 ms. Since the log's writer runs on the loop, six alternated runs: units of
20 gave the stop's ack p99 2.20-4.33x its idle p99 (median 3.1x), of 10 1.77-2.61x (median
2.4x), for 7 % less of the flood (12.1-12.9k against 11.5-11.8k req/s). Eight alternated runs
on 2026-12-05: units of 10 gave 1.39-3.29x (median 2.0x, flood p99 5.5-10.0 ms), of 5
1.71-2.08x (median 1.8x, 6.2-7.5 ms), for about 3.5 % less of the flood (11.6k against
11.2k req/s on average))."""


@dataclass(frozen=True, slots=True)
class _Placed:
    """A request decided into a group: where its answer goes, and where its decisions are."""

    future: asyncio.Future[Ack]
    received: RequestReceived
    offset: int
    """Of its input's event among the group's."""
    decisions: list[Decision]


@dataclass(slots=True)
class Batch:
    """Requests decided across several steps and appended once per agent (`in_steps`)."""

    groups: dict[str, Group] = field(default_factory=dict)
    placed: dict[Group, list[_Placed]] = field(default_factory=dict)

    def parts(self, size: int) -> list[Batch]:
        """Its agents ``size`` at a time, each part a batch of its own (to append in turns);
        this one is left empty."""
        agents = list(self.groups.items())
        parts = []
        for start in range(0, len(agents), size):
            part = Batch(dict(agents[start:start + size]))
            for group in part.groups.values():
                waiting = self.placed.pop(group, None)
                if waiting is not None:
                    part.placed[group] = waiting
            parts.append(part)
        if self.placed:  # (groups closed and replaced within the batch: with the first part)
            parts[0].placed.update(self.placed)
        self.groups.clear()
        self.placed.clear()
        return parts


class WayIn(Protocol):
    """Where requests are taken: this process's engine, or a cluster's router."""

    def take(self, requests: Sequence[AgentRequest], principal: str | None,
             batch: Batch | None = None, parsed: bool = False) -> list[asyncio.Future[Ack]]:
        """Decide ``requests`` now (where their agents are): one answer each (``parsed``:
        as `Intake.take`)."""
        ...

    def finish(self, batch: Batch) -> None:
        """Append what ``batch`` decided."""
        ...


async def in_steps(way_in: WayIn, requests: Sequence[AgentRequest], principal: str | None,
                   pacer: Pacer | None = None, parsed: bool = False
                   ) -> list[asyncio.Future[Ack]]:
    """`WayIn.take` of a list of any size, `DECIDE_STEP` requests at a time, letting other
    work (a stop) run in between (with a ``pacer``, the feed's, each `PACED_STEP` takes its
    turn); the requests of one agent are still appended once. ``parsed``: as
    `Intake.take`."""
    if len(requests) <= DECIDE_STEP and pacer is None:
        return way_in.take(requests, principal, parsed=parsed)
    batch = Batch()
    answers: list[asyncio.Future[Ack]] = []
    step = DECIDE_STEP if pacer is None else PACED_STEP
    try:
        for start in range(0, len(requests), step):
            chunk = requests[start:start + step]
            if pacer is not None:
                async with pacer.turn():
                    answers += way_in.take(chunk, principal, batch, parsed)
                continue
            if start:
                await asyncio.sleep(0)
            answers += way_in.take(chunk, principal, batch, parsed)
    finally:  # every decision appended, whatever happens to the call
        if pacer is None or len(batch.groups) <= PACED_STEP:
            way_in.finish(batch)
        else:
            await _finish_in_turns(way_in, batch, pacer)
    return answers


async def _finish_in_turns(way_in: WayIn, batch: Batch, pacer: Pacer) -> None:
    """`WayIn.finish` of a feed's batch, the appends of `PACED_STEP` agents a turn of its
    pacer (a frame of 100 requests for 100 agents makes 100 appends, about 3 ms of the loop
    in one go); whatever is left when that is interrupted is appended at once."""
    parts = batch.parts(PACED_STEP)
    try:
        for part in parts:
            async with pacer.turn():
                way_in.finish(part)
    finally:
        for part in parts:
            if part.groups or part.placed:
                way_in.finish(part)


async def settled(answers: Sequence[Awaitable[Ack]]) -> list[Ack | GatewayError]:
    """Each answer awaited: its ack, or the `GatewayError` it was refused with."""
    results: list[Ack | GatewayError] = []
    for answer in answers:
        try:
            results.append(await answer)
        except GatewayError as error:
            results.append(error)
    return results


class Intake:
    """Decides requests for the engine's agents and answers each after its commit."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.open = 0
        """Groups decided and not appended yet."""
        self._turn: Batch | None = None
        """What the takes of this turn of the loop decided (appended at its end)."""

    def take(self, requests: Sequence[AgentRequest], principal: str | None,
             batch: Batch | None = None, parsed: bool = False) -> list[asyncio.Future[Ack]]:
        """Decide ``requests`` now, in order: one future each (see the module's docstring).
        Into ``batch`` (`in_steps`), the appends wait for `finish`. Without one, they wait
        for the end of this turn of the loop, so that the requests of one agent taken one
        by one in a turn (a feed's frames of one request each) share one append; a control
        is appended at once, right after what was decided for its agent before it.

        ``parsed``: every request was just parsed from JSON text by the wire model and is
        held by the caller alone (the edge's frames and bodies), so it is known to read back
        from the log (`lanes.repeatable`): the doorway's look at it is spared."""
        loop = asyncio.get_running_loop()
        at = self._engine.clock.now_ms()
        answers: list[asyncio.Future[Ack]] = []
        if batch is not None:
            self._place(requests, at, principal, batch, answers, loop, parsed)
            return answers
        if any(request.kind is _CONTROL for request in requests):
            batch = Batch()
            try:
                self._place(requests, at, principal, batch, answers, loop, parsed)
            finally:
                self.finish(batch)
            return answers
        turn = self._turn
        if turn is None:
            turn = self._turn = Batch()
            loop.call_soon(self.end_turn)
        self._place(requests, at, principal, turn, answers, loop, parsed)
        return answers

    def end_turn(self) -> None:
        """Append what the takes of this turn of the loop decided (at its end, or sooner:
        `Engine.flush`)."""
        turn, self._turn = self._turn, None
        if turn is None:
            return
        try:
            self.finish(turn)
        except Exception:  # (no caller to raise it to: its requests were told, `finish`)
            _bugs.exception("appending what a turn of the loop decided failed")

    def finish(self, batch: Batch) -> None:
        """Append what ``batch`` decided; its requests are answered after the commits. An
        append that raises (a bug) is raised after the others went, its requests answered
        with it and its agent rebuilt from the log."""
        bugs: dict[Group, Exception] = {}
        for group in batch.groups.values():
            try:
                self.close(group)
            except Exception as error:
                bugs[group] = error
                group.agent.core.recover(None)
        for group, waiting in batch.placed.items():
            bug = bugs.get(group)
            if bug is not None:
                for item in waiting:
                    if not item.future.done():
                        item.future.set_exception(bug)
                continue
            commit = group.outcome.commit
            if commit is None:
                self._settle(group, waiting, None)
            else:
                commit.add_done_callback(partial(self._settle, group, waiting))
        batch.groups.clear()
        batch.placed.clear()
        if bugs:
            raise next(iter(bugs.values()))

    def _place(self, requests: Sequence[AgentRequest], at: int, principal: str | None,
               batch: Batch, answers: list[asyncio.Future[Ack]],
               loop: asyncio.AbstractEventLoop, parsed: bool) -> None:
        """Decide requests in order into ``groups`` (one per agent, left open for the next
        step of the same call)."""
        engine = self._engine
        groups = batch.groups
        for request in requests:
            future: asyncio.Future[Ack] = loop.create_future()
            answers.append(future)
            received = RequestReceived(at=at, request=request, principal=principal)
            try:
                agent = engine.agent(request.agent_id)
            except GatewayError as error:
                future.set_exception(self._refused(received, error))
                continue
            if agent.controls.supersedes(request.request_id):
                future.set_exception(Superseded(request))
                continue
            group = groups.get(request.agent_id)
            if group is None or group.closed:  # (closed: something else came in between)
                if agent.open is not None:
                    self.close(agent.open)
                group = groups[request.agent_id] = agent.open = Group(agent,
                                                                      agent.state.version)
                self.open += 1
            try:
                decisions, events = self.decide(agent, received, group, parsed)
            except Unstorable as error:  # refused before anything changed: the rest go on
                future.set_exception(error)
                continue
            batch.placed.setdefault(group, []).append(
                _Placed(future, received, len(group.events), decisions))
            group.events += events
            group.decisions += decisions

    def _settle(self, group: Group, waiting: list[_Placed],
                commit: asyncio.Future[list[RecordedEvent]] | None) -> None:
        """Answer the requests of a group once its append settled."""
        if commit is not None and commit.cancelled():
            for item in waiting:
                item.future.cancel()
            return
        failure = None if commit is None else commit.exception()
        error = None if failure is None else self._engine.commit_error(failure)
        records = [] if commit is None or error is not None else commit.result()
        for item in waiting:
            future = item.future
            if future.done():
                continue
            request_id = item.received.request.request_id
            if error is not None:
                future.set_exception(self._refused(item.received, error)
                                     if isinstance(error, GatewayError) else error)
                continue
            group.agent.controls.stored(request_id)
            try:
                ack = ack_of(request_id, item.decisions, records[item.offset:])
            except AssertionError as bug:  # (no decision for it: a bug, said to its caller)
                future.set_exception(bug)
                continue
            future.set_result(ack)
            if item.received.request.kind is _CONTROL and item.received.request.action \
                    and not ack.repeated:  # (a control sent again was said the first time)
                said_control(item.received, ack)

    def _refused(self, received: RequestReceived, error: GatewayError) -> GatewayError:
        """The error a request that could not be stored is answered with (a risk-reducing
        control may be held: `gateway.runtime.held`)."""
        engine = self._engine
        agent = engine.present(received.request.agent_id)
        if agent is None:
            return error
        return agent.controls.refuse(received, error, engine.faults.reason(agent.fault))

    def close(self, group: Group) -> None:
        """Append what ``group`` decided (once)."""
        if group.closed:
            return
        group.closed = True
        self.open -= 1
        agent = group.agent
        if agent.open is group:
            agent.open = None
        group.outcome = self._engine.append(agent, group.base, group.events, group.decisions)

    def decide(self, agent: Agent, event: Input, into: Group | None = None,
               parsed: bool = False) -> tuple[list[Decision], list[NewEvent]]:
        """Decide an input: the decisions and the events to append (none if none). What
        is open for the agent, unless it is ``into``, is appended first. Its effects that
        cannot wait for the commit happen now: an abort cancels its run at once, a steer
        reaches its run at once (a failed commit cancels the run, so nothing uncommitted
        outlives the failure). ``parsed``: a `RequestReceived` whose request is known to
        read back (`take`)."""
        if agent.open is not None and agent.open is not into:
            self.close(agent.open)
        engine = self._engine
        version = agent.state.version
        received = type(event) is RequestReceived
        if received:
            engine.requests_received += 1
        known = parsed and isinstance(event, RequestReceived) and wrapper_reads_back(event)
        try:  # before anything changes: an input that would not read back is never taken
            encoded = agent.core.encode(event, known)
        except Unrepeatable as error:
            what = f"request {event.request.request_id!r}" \
                if isinstance(event, RequestReceived) else type(event).__name__
            raise Unstorable(what, str(error), error.field) from None
        decisions, events = agent.core.decide(event, encoded)
        if not decisions:
            return decisions, []
        if isinstance(event, RequestReceived):
            # (held up to the version its decision reaches: the commit of what was decided
            # before it, reaching ``version``, does not store it)
            agent.controls.decided(event, version + len(events))
        runs = engine.runs
        for decision in decisions:
            if type(decision) not in _RUN_EFFECTS:  # (most: a request queued, say)
                continue
            if isinstance(decision, RunAborted | RunCompleted | RunFailed):
                runs.ended(agent, decision.run_id)
                if isinstance(decision, RunCompleted):
                    engine.desk.completed(agent.state.now, decision.usage)
            if isinstance(decision, RunAborted):
                runs.cancel(agent, decision.run_id)
            elif isinstance(decision, RunSteered):
                runs.steer(agent, decision)
            elif isinstance(decision, TasksFinished):
                runs.tasks_finished(agent, decision)
        engine.reschedule(agent)
        return decisions, events


_CONTROL = Kind.USER_CONTROL
_RUN_EFFECTS: Final = frozenset({RunAborted, RunCompleted, RunFailed, RunSteered, TasksFinished})
"""The decisions `Intake.decide` acts on at once (exact types: none is subclassed)."""


def said_control(received: RequestReceived, ack: Ack) -> None:
    """An operator's control, once its decision is in the log: one line at INFO (a halt at
    WARNING), with the agent, the request and who sent it."""
    request = received.request
    effect = ack.effect
    what = f"{effect.from_state.value} -> {effect.to_state.value}" if effect else (
        f"{ack.decision}: {ack.reason}" if ack.reason else ack.decision)
    halted = effect is not None and effect.changed and effect.to_state.value == "HALTED"
    log.log(logging.WARNING if halted else logging.INFO,
            "control %s of %s by %s (%s): %s", request.action, request.agent_id,
            received.principal or request.source or "?", request.request_id, what,
            extra={"agent_id": request.agent_id, "request_id": request.request_id,
                   "principal": received.principal})


async def take_all(way_in: WayIn, requests: Sequence[AgentRequest],
                   principal: str | None = None, pacer: Pacer | None = None
                   ) -> list[Ack | GatewayError]:
    """`in_steps`, each answer `settled`: an ack or an error for each request, in place."""
    return await settled(await in_steps(way_in, requests, principal, pacer))
