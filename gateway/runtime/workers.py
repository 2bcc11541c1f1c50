"""Workers: agents whose runs are done by an external process (``reasoner.kind = "worker"``).

A worker connects to ``/ws/worker`` (`gateway.edge.workers`) and is a `WorkerLink` in the
`WorkerHub` for the agents of its token's scope. A run of a worker agent is handed to one
connected worker (`WorkerReasoner`); the worker asks for a slot of the agent's provider
gate before each model call (so the desk's limits hold), reports the call as a step (recorded
as a built-in model's: `gateway.llm.reasoner.ToolSession.step`, which runs the built-in tools
the pure core allows) and ends with a result. A worker that disconnects or goes silent gets
its run aborted ``worker_lost`` (`WorkerLostError`: a recorded input), its requests back at
the head of the queue; an aborted run is cancelled here at once and the worker is told.

The run task is the only one that acts on a run; the connection only checks each frame
against the run's phase (`WorkerJob.offer`) and hands it over, so a frame out of turn, for
another run or after the end is refused there and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.base.clock import Clock, SystemClock, timeout
from gateway.errors import BadFrame
from gateway.llm.port import Completion, ToolResult
from gateway.llm.reasoner import RunContext, RunResult
from lanes.requests import AgentRequest

log = logging.getLogger("gateway.runtime.workers")

ENDED_KEPT = 1_000
"""Ended runs a link remembers, to tell a late frame from one for a run it never had."""


class NoWorker(RuntimeError):
    """A run of a worker agent with no worker connected for it: the run fails at once."""


class WorkerRunFailed(RuntimeError):
    """The worker says the run failed (its model or code broke): a failed run."""


class WorkerLostError(RuntimeError):
    """The worker doing a run disconnected or missed its heartbeats (``rerun``: another
    worker is connected for the agent, so the run starts again at once)."""

    def __init__(self, worker: str, why: str, *, rerun: bool) -> None:
        super().__init__(f"worker {worker!r} {why}")
        self.worker = worker
        self.rerun = rerun


class WorkerLink(Protocol):
    """One connected worker, as the runtime sees it (the edge's session implements it);
    each method only queues a frame, in order."""

    @property
    def name(self) -> str:
        """The worker's name (its token's)."""
        ...

    last_seen: int
    """When a frame last came from it (its hub's `Clock`, `Clock.monotonic_ms`)."""

    def serves(self, agent_id: str) -> bool:
        """Whether its token's scope includes the agent."""
        ...

    def dispatch(self, job: WorkerJob) -> None:
        """Send the ``run`` frame of a job."""
        ...

    def granted(self, run_id: str) -> None:
        """Send ``slot_granted``: the worker may make its model call."""
        ...

    def answered(self, run_id: str, step: int, results: Sequence[ToolResult],
                 steers: Sequence[AgentRequest]) -> None:
        """Send ``tool_results`` of a step, with the steers that came since the last."""
        ...

    def cancel(self, run_id: str, reason: str) -> None:
        """Send ``cancel``: the run was aborted here; nothing more of it is taken."""
        ...

    def members(self, urls: Sequence[str]) -> None:
        """Send ``members``: the cluster's live members are now ``urls``."""
        ...

    def drop(self) -> None:
        """Close the connection (it went silent)."""
        ...


@dataclass(frozen=True, slots=True)
class SlotAsked:
    """A worker asks for a slot before a model call."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class StepMade:
    """A worker's model call, made in its slot."""

    number: int
    completion: Completion
    given: Mapping[str, tuple[bool, str]] = field(default_factory=dict)
    """Call id -> (ok, text): the results of the tools the worker ran itself."""


@dataclass(frozen=True, slots=True)
class ResultGiven:
    """A worker's final result."""

    result: RunResult


@dataclass(frozen=True, slots=True)
class FailureGiven:
    """The worker gave up on the run (its error): the run fails."""

    error: str


@dataclass(frozen=True, slots=True)
class Lost:
    """The worker is gone."""

    why: str


Given = SlotAsked | StepMade | ResultGiven | FailureGiven
Item = Given | Lost
Phase = Literal["idle", "waiting", "calling", "stepping", "done"]


@dataclass(slots=True)
class WorkerJob:
    """A run handed to a worker: what the run task waits on, and the run's phase, which
    says what the worker may send now."""

    ctx: RunContext
    link: WorkerLink
    max_steps: int
    phase: Phase = "idle"
    steps: int = 0
    inbox: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    given: Mapping[str, tuple[bool, str]] = field(default_factory=dict)
    """The results of the worker's own tools in its latest step."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.ctx.run_id

    def offer(self, item: Given) -> None:
        """A frame of the worker for this run, or `BadFrame` (``out_of_order``) if the run
        is not at a point where it may come; nothing changes then."""
        if isinstance(item, SlotAsked):
            if self.phase != "idle":
                raise BadFrame("out_of_order", f"run {self.run_id}: a slot is asked before "
                               "each model call, once; wait for slot_granted or tool_results")
            if self.steps >= self.max_steps:
                raise BadFrame("step_budget", f"run {self.run_id} has made its {self.max_steps} "
                               "model calls; send its result")
            self.phase = "waiting"
        elif isinstance(item, StepMade):
            if self.phase != "calling":
                raise BadFrame("out_of_order", f"run {self.run_id}: a step reports the model "
                               "call made in a granted slot (send slot, wait for slot_granted)")
            if item.number != self.steps + 1:
                raise BadFrame("invalid", f"run {self.run_id}: the next step is number "
                               f"{self.steps + 1}, not {item.number}", field="step")
            self.steps = item.number
            self.phase = "stepping"
        elif isinstance(item, FailureGiven):
            if self.phase not in ("idle", "calling"):
                raise BadFrame("out_of_order", f"run {self.run_id}: wait for slot_granted or "
                               "tool_results before giving the run up")
            self.phase = "done"
        else:
            if self.phase != "idle":
                raise BadFrame("out_of_order", f"run {self.run_id}: a result comes after the "
                               "last step's tool_results, with no model call in flight")
            self.phase = "done"
        self.inbox.put_nowait(item)


class WorkerHub:
    """The connected workers and the runs they do. A run goes to the worker of its agent
    that has the fewest runs, the earliest connected first.

    In a cluster a worker connects to every member (each says where the others are: `cluster`),
    so that an agent's runs reach it wherever the agent is decided, and after a failover at
    once; a run that finds no worker here waits up to ``wait_ms`` for one (a member that just
    joined is connected to within a renewal)."""

    def __init__(self, *, wait_ms: int = 0, clock: Clock | None = None) -> None:
        self.agents: dict[str, WorkerReasoner] = {}
        """The worker agents (their reasoners register here)."""
        self.wait_ms = wait_ms
        """How long a run with no worker connected for its agent waits for one before it
        fails (`NoWorker`); 0: it fails at once."""
        self.clock: Clock = clock or SystemClock()
        """Whose time that wait counts."""
        self.member: str | None = None
        """In a cluster: the URL this process serves at (None: no cluster)."""
        self.members: list[str] = []
        """In a cluster: the URLs of its live members, this one included."""
        self._arrived = asyncio.Event()
        """Set (and replaced) when a worker connects."""
        self._links: list[WorkerLink] = []
        self._jobs: dict[str, WorkerJob] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        """Run id -> the name of the link it was given to, for runs that ended."""

    def attach(self, link: WorkerLink) -> list[str]:
        """A worker connected: the worker agents it serves."""
        self._links.append(link)
        self._arrived.set()
        self._arrived = asyncio.Event()
        return [agent_id for agent_id in self.agents if link.serves(agent_id)]

    def cluster(self, member: str, members: Sequence[str]) -> None:
        """This process is the cluster member at ``member``, and the live members are at
        ``members``; each worker connected is told when they change."""
        self.member = member
        urls = sorted(members)
        if urls != self.members:
            self.members = urls
            for link in self._links:
                link.members(urls)

    def detach(self, link: WorkerLink, why: str) -> None:
        """A worker went away: each of its runs is lost."""
        if link in self._links:
            self._links.remove(link)
        for job in list(self._jobs.values()):
            if job.link is link and job.phase != "done":
                job.inbox.put_nowait(Lost(why))

    def connected(self, agent_id: str) -> int:
        """How many workers are connected for an agent."""
        return sum(1 for link in self._links if link.serves(agent_id))

    def missing(self, agent_id: str) -> bool:
        """Whether the agent is a worker agent with no worker connected."""
        return agent_id in self.agents and not self.connected(agent_id)

    def job(self, link: WorkerLink, run_id: str) -> WorkerJob:
        """The run ``run_id`` of this worker, or `BadFrame` (``run_ended``: it was cancelled
        or finished; ``unknown_run``: it was not given this worker)."""
        job = self._jobs.get(run_id)
        if job is not None and job.link is link and job.phase != "done":
            return job
        if self._ended.get(run_id) == link.name or (job is not None and job.link is link):
            raise BadFrame("run_ended", f"run {run_id} has ended (cancelled, failed or its "
                           "result taken); this frame changes nothing", field="runId")
        raise BadFrame("unknown_run", f"run {run_id} was not given to this worker",
                       field="runId")

    async def _arrival(self, agent_id: str) -> None:
        """Wait up to `wait_ms` for a worker of ``agent_id`` if none is connected."""
        if self.connected(agent_id) or not self.wait_ms:
            return
        with contextlib.suppress(TimeoutError):
            async with timeout(self.clock, self.wait_ms):
                while not self.connected(agent_id):
                    await self._arrived.wait()

    def _pick(self, agent_id: str) -> WorkerLink:
        links = [link for link in self._links if link.serves(agent_id)]
        if not links:
            raise NoWorker(f"no worker is connected for agent {agent_id} (reasoner.kind = "
                           "\"worker\": connect one to /ws/worker with a worker token)")
        load = {id(link): 0 for link in links}
        for job in self._jobs.values():
            if id(job.link) in load:
                load[id(job.link)] += 1
        return min(links, key=lambda link: load[id(link)])

    def _begin(self, job: WorkerJob) -> None:
        self._jobs[job.run_id] = job

    def _end(self, job: WorkerJob) -> None:
        if self._jobs.get(job.run_id) is job:
            del self._jobs[job.run_id]
        self._ended[job.run_id] = job.link.name
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)


class WorkerReasoner:
    """The reasoner of a worker agent: its runs are done by a connected worker.

    A worker that sends nothing (not even a heartbeat) for ``heartbeat_ms`` times
    ``missed_heartbeats`` is lost; so is one that disconnects."""

    def __init__(self, hub: WorkerHub, agent_id: str, *, heartbeat_ms: int = 5_000,
                 missed_heartbeats: int = 3, max_steps: int = 10) -> None:
        self.hub = hub
        self.heartbeat_ms = heartbeat_ms
        self.missed_heartbeats = missed_heartbeats
        self.max_steps = max_steps
        hub.agents[agent_id] = self

    async def run(self, ctx: RunContext) -> RunResult:
        """Hand the run to a worker and take its slots, steps and result (`NoWorker` at
        once if none is connected, or after the hub's ``wait_ms``; `WorkerLostError` if it
        goes)."""
        await self.hub._arrival(ctx.agent_id)
        link = self.hub._pick(ctx.agent_id)
        tools = ctx.tools
        job = WorkerJob(ctx, link, tools.max_steps if tools is not None else self.max_steps)
        self.hub._begin(job)
        try:
            link.dispatch(job)
            steerable = job.max_steps > 1
            if steerable:
                ctx.set_steerable(True)
            steered: list[str] = []
            while True:
                item = await self._next(job)
                if isinstance(item, ResultGiven):
                    if steerable:
                        ctx.set_steerable(False)
                    return item.result
                assert isinstance(item, SlotAsked)  # (`WorkerJob.offer` lets nothing else in)
                completion = await ctx.call(lambda: self._call(job),
                                            input_tokens=item.input_tokens,
                                            output_tokens=item.output_tokens)
                number = job.steps
                if tools is not None:
                    results = await tools.step(number, completion, steered, job.given)
                else:
                    results = [ToolResult(call.id, "this agent has no tools", is_error=True)
                               for call in completion.tool_calls]
                if steerable and (not completion.tool_calls or number >= job.max_steps - 1):
                    ctx.set_steerable(False)  # decided at once: no steer is decided after it
                    steerable = False
                steers = ctx.take_steers()
                steered = [request.request_id for request in steers]
                job.phase = "idle"
                link.answered(job.run_id, number, results, steers)
        except WorkerLostError:
            raise
        except asyncio.CancelledError:
            link.cancel(job.run_id, "aborted")
            raise
        except Exception:
            link.cancel(job.run_id, "failed")
            raise
        finally:
            job.phase = "done"
            self.hub._end(job)

    async def _call(self, job: WorkerJob) -> Completion:
        """The model call in a granted slot: the worker's step."""
        job.phase = "calling"
        job.link.granted(job.run_id)
        item = await self._next(job)
        assert isinstance(item, StepMade)  # (`offer` takes a step or a failure while calling)
        job.given = item.given
        return item.completion

    async def _next(self, job: WorkerJob) -> SlotAsked | StepMade | ResultGiven:
        """The worker's next frame for the job; `WorkerLostError` if it is gone or silent
        (for ``heartbeat_ms`` x ``missed_heartbeats`` of the hub's clock)."""
        clock = self.hub.clock
        silence_ms = self.heartbeat_ms * self.missed_heartbeats
        while True:
            try:
                async with timeout(clock, self.heartbeat_ms):
                    item = await job.inbox.get()
            except TimeoutError:
                if clock.monotonic_ms() - job.link.last_seen < silence_ms:
                    continue
                job.link.drop()
                self.hub.detach(job.link, "missed its heartbeats")
                item = await job.inbox.get()
            if isinstance(item, FailureGiven):
                raise WorkerRunFailed(item.error)
            if not isinstance(item, Lost):
                return item
            log.warning("run %s: worker %s %s", job.run_id, job.link.name, item.why)
            raise WorkerLostError(job.link.name, item.why,
                                  rerun=self.hub.connected(job.ctx.agent_id) > 0)
