"""``/ws/worker``: a worker's connection (bring your own agent; docs/workers.md).

A `WorkerSession` authenticates like any session (a ``worker`` token, scoped to agents),
joins the `gateway.runtime.workers.WorkerHub` as a `WorkerLink` and hands each frame of a
run to that run's job. Frames go out in order through one writer. A frame that is malformed,
for a run this worker was not given, out of turn, or for a run that ended is answered with
an error frame and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel
from starlette.websockets import WebSocket

from gateway.base.tasks import spawn
from gateway.edge.answers import error_frame
from gateway.edge.frames import guess_id, raw_data, typed_frame
from gateway.edge.protocol import load_json
from gateway.edge.service import MAX_BAD_FRAMES, POLICY_VIOLATION, Service
from gateway.edge.sessions import Session
from gateway.edge.worker_protocol import (
    WORKER_FRAME,
    WORKER_TYPES,
    CancelFrame,
    FailedFrame,
    MembersFrame,
    ResultFrame,
    RunFrame,
    SlotFrame,
    SlotGranted,
    StepFrame,
    ToolResultsFrame,
    WireToolResult,
    WireToolSpec,
    WorkerReady,
)
from gateway.errors import BadFrame, GatewayError
from gateway.llm.port import Completion, ToolCall, ToolResult
from gateway.llm.reasoner import RunResult
from gateway.runtime.workers import (
    FailureGiven,
    ResultGiven,
    SlotAsked,
    StepMade,
    WorkerJob,
)
from lanes import InvalidRequest
from lanes.events import RunFinished
from lanes.events import WorkerReady as WorkerReadyInput
from lanes.requests import AgentRequest

log = logging.getLogger("gateway.edge.workers")

DEFAULT_HEARTBEAT_MS = 5_000
"""What a worker serving no worker agent is told to beat at."""


def worker_ws(service: Service) -> Callable[[WebSocket], Awaitable[None]]:
    """The handler of ``/ws/worker``."""

    async def handle(websocket: WebSocket) -> None:
        await WorkerSession(service, websocket).run()

    return handle


class WorkerSession(Session):
    """One worker's connection: a `gateway.runtime.workers.WorkerLink`."""

    def __init__(self, service: Service, websocket: WebSocket) -> None:
        super().__init__(service, websocket, "worker")
        self.last_seen = service.workers.clock.monotonic_ms()
        self._outbox: asyncio.Queue[BaseModel] = asyncio.Queue()

    # ------------------------------------------------------------------- the link

    @property
    def name(self) -> str:
        """The worker's name: its token's."""
        return "" if self.principal is None else self.principal.name

    def serves(self, agent_id: str) -> bool:
        """Whether its token's scope includes the agent."""
        return self.principal is not None and self.principal.may_see(agent_id)

    def dispatch(self, job: WorkerJob) -> None:
        """Send the run frame of a job."""
        ctx = job.ctx
        specs = [] if ctx.tools is None else ctx.tools.specs
        self._outbox.put_nowait(RunFrame(
            run_id=ctx.run_id, agent_id=ctx.agent_id, requests=list(ctx.requests),
            summary=ctx.summary, depth=ctx.depth, max_steps=job.max_steps,
            tools=[WireToolSpec(name=s.name, description=s.description,
                                input_schema=dict(s.input_schema)) for s in specs]))

    def granted(self, run_id: str) -> None:
        """Send ``slot_granted``."""
        self._outbox.put_nowait(SlotGranted(run_id=run_id))

    def answered(self, run_id: str, step: int, results: Sequence[ToolResult],
                 steers: Sequence[AgentRequest]) -> None:
        """Send a step's ``tool_results`` (and the steers since the last step)."""
        self._outbox.put_nowait(ToolResultsFrame(
            run_id=run_id, step=step, steers=list(steers),
            results=[WireToolResult(call_id=r.call_id, content=r.content, is_error=r.is_error)
                     for r in results]))

    def cancel(self, run_id: str, reason: str) -> None:
        """Send ``cancel``."""
        self._outbox.put_nowait(CancelFrame(run_id=run_id, reason=reason))

    def members(self, urls: Sequence[str]) -> None:
        """Send ``members`` (the cluster's live members changed)."""
        self._outbox.put_nowait(MembersFrame(members=list(urls)))

    def drop(self) -> None:
        """Close the connection (it went silent)."""
        self.closing = True
        task = spawn(self._close("missed heartbeats"), "drop a silent worker")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------------- the session

    async def _serve(self) -> None:
        hub = self.service.workers
        agents = hub.attach(self)
        try:
            beat = min((hub.agents[a].heartbeat_ms for a in agents), default=DEFAULT_HEARTBEAT_MS)
            # (first in the outbox: before any run or members frame the hub queues from now)
            self._outbox.put_nowait(WorkerReady(agents=agents, heartbeat_ms=beat,
                                                member=hub.member, members=hub.members))
            writer = spawn(self._write(), "worker writer")
            self.tasks.add(writer)
            await self._wake(agents)
            clock = hub.clock
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect" or self.closing:
                    return
                self.last_seen = clock.monotonic_ms()
                raw = raw_data(message)
                try:
                    if len(raw) > self.service.max_frame_bytes:
                        raise BadFrame("too_large", f"frame over {self.service.max_frame_bytes} "
                                       "bytes")
                    self._take(_validate(load_json(raw)))
                except (BadFrame, InvalidRequest) as error:
                    self.bad_frames += 1
                    await self.send(error_frame(error, id=guess_id(raw)))
                    if self.bad_frames >= MAX_BAD_FRAMES:
                        await self._close("too many bad frames")
                        return
                    continue
                self.bad_frames = 0
        finally:
            hub.detach(self, "disconnected")

    def _take(self, frame: Any) -> None:
        """Hand a valid frame to its run (`BadFrame` if the run cannot take it now)."""
        if isinstance(frame, SlotFrame):
            self.service.workers.job(self, frame.run_id).offer(
                SlotAsked(frame.input_tokens, frame.output_tokens))
        elif isinstance(frame, StepFrame):
            job = self.service.workers.job(self, frame.run_id)
            job.offer(StepMade(frame.step, Completion(
                text=frame.text, input_tokens=frame.usage.input_tokens,
                output_tokens=frame.usage.output_tokens, stop_reason=frame.stop_reason,
                tool_calls=tuple(ToolCall(c.id, c.name, dict(c.arguments))
                                 for c in frame.tool_calls)),
                given={r.call_id: (not r.is_error, r.content) for r in frame.own_results}))
        elif isinstance(frame, ResultFrame):
            result = RunResult(
                outcome=frame.outcome, usage=frame.usage, orders=tuple(frame.orders),
                calls=tuple(frame.calls), answer=frame.answer,
                call_results=frame.call_results if frame.calls else None)
            try:
                job = self.service.workers.job(self, frame.run_id)
            except BadFrame as error:
                if error.code == "run_ended":
                    self._discard(frame.run_id, result)
                raise
            job.offer(ResultGiven(result))
        elif isinstance(frame, FailedFrame):
            self.service.workers.job(self, frame.run_id).offer(FailureGiven(frame.error))
        # (a heartbeat: its arrival is all it says)

    def _discard(self, run_id: str, result: RunResult) -> None:
        """A result for a run that has ended (cancelled, say): recorded in its agent's
        stream as the run's result, which the core ignores (`RunResultIgnored`): never
        applied, and there to read."""
        agent_id, _, seq = run_id.rpartition("-r")
        engine = self.engine
        if not seq.isdigit() or engine.present(agent_id) is None:
            return
        late = RunFinished(at=engine.clock.now_ms(), run_id=run_id, outcome=result.outcome,
                           usage=result.usage, orders=result.orders, calls=result.calls,
                           answer=result.answer[:20_000], call_results=result.call_results)

        async def record() -> None:
            with contextlib.suppress(GatewayError):
                await engine.report(agent_id, late)
        task = spawn(record(), f"late result of {run_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _write(self) -> None:
        """Send queued frames, in order."""
        while True:
            frame = await self._outbox.get()
            await self.send(frame)

    async def _wake(self, agents: list[str]) -> None:
        """Idle worker agents whose requests wait for a worker may start a run now."""
        engine = self.engine
        for agent_id in agents:
            agent = engine.present(agent_id)
            if agent is None or not agent.live:
                continue
            state = agent.state
            if state.active is None and state.pending:
                with contextlib.suppress(GatewayError):
                    await engine.report(agent_id, WorkerReadyInput(
                        at=engine.clock.now_ms(), worker=self.name))

    async def _close(self, why: str) -> None:
        self.closing = True
        with contextlib.suppress(Exception):
            await self.ws.close(code=POLICY_VIOLATION, reason=why)


def _validate(data: Any) -> Any:
    """A worker frame from its JSON value (`BadFrame` / `InvalidRequest`)."""
    return typed_frame(data, WORKER_TYPES, WORKER_FRAME, "a worker sends one of")
