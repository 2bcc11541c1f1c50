"""A worker of ``/ws/worker``: bring your own agent (docs/workers.md).

    worker = Worker("ws://127.0.0.1:8000", token)

    @worker.agent("agent_btc_5m")
    async def btc(run: WorkerRun) -> dict[str, Any]:
        await run.slot(input_tokens=800, output_tokens=200)   # a slot of the desk's gate
        completion = ...                                      # your model call
        answer = await run.step(text=..., tool_calls=[...], input_tokens=..., output_tokens=...)
        ...                                                   # answer.results, answer.steers
        return {"outcome": "no_trade", "answer": "..."}

    await worker.run()    # until `stop` (reconnects with backoff when the connection drops)

Each run is one call of the agent's function, as a task of its own; a ``cancel`` from the
gateway cancels it (a `asyncio.CancelledError` in it). An exception in it sends ``failed``.
In a cluster the worker connects to every member the gateway names, and follows them as
they change (docs/workers.md, "In a cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gateway.client.errors import GatewayClientError
from gateway.client.frames import (
    ErrorFrame,
    Hello,
    MembersFrame,
    Request,
    RunFrame,
    Summary,
    ToolResultsFrame,
    WireToolResult,
    WireToolSpec,
    WorkerReady,
)
from gateway.client.wire import endpoint_url, spawn

log = logging.getLogger("gateway.client.worker")

Handler = Callable[["WorkerRun"], Awaitable[Mapping[str, Any]]]
"""One agent's runs: given a run, its result (``outcome``, ``usage``, ``orders``,
``calls``, ``answer``: a ``result`` frame of docs/workers.md without its type and run id,
snake_case or camelCase keys)."""


@dataclass(frozen=True, slots=True)
class StepAnswer:
    """What the gateway answered a step: its tools' results (in the order of the calls) and
    requests steered into the run since (give them to the model in the next call)."""

    results: list[WireToolResult]
    steers: list[Request]


@dataclass(slots=True)
class WorkerRun:
    """A run given to this worker: its requests and the tools it may call."""

    run_id: str
    agent_id: str
    requests: list[Request]
    summary: Summary | None
    depth: int
    tools: list[WireToolSpec]
    max_steps: int
    _worker: Worker
    _link: _Link
    _answers: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    steps: int = 0

    async def _send(self, frame: dict[str, Any]) -> None:
        """A frame of this run, on the connection it came by."""
        await self._link.send(frame, self._worker._ids)

    async def slot(self, *, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Wait for a slot of the agent's provider gate (with the call's estimate)."""
        await self._send({"type": "slot", "runId": self.run_id,
                          "inputTokens": input_tokens, "outputTokens": output_tokens})
        await self._answer("slot_granted")

    async def step(self, *, text: str = "", tool_calls: Sequence[Mapping[str, Any]] = (),
                   input_tokens: int = 0, output_tokens: int = 0,
                   stop_reason: str | None = None,
                   own_results: Sequence[Mapping[str, Any]] = ()) -> StepAnswer:
        """Report the model call made in the slot (``tool_calls``: ``{"id", "name",
        "arguments"}`` each) and get its tools' results. The calls of the worker's own
        tools (its agent's ``worker_tools``) are run first and their results given in
        ``own_results`` (``{"callId", "content", "isError"}`` each): they are recorded."""
        self.steps += 1
        frame: dict[str, Any] = {
            "type": "step", "runId": self.run_id, "step": self.steps, "text": text,
            "toolCalls": [dict(call) for call in tool_calls],
            "usage": {"inputTokens": input_tokens, "outputTokens": output_tokens},
            "ownResults": [dict(result) for result in own_results]}
        if stop_reason is not None:
            frame["stopReason"] = stop_reason
        await self._send(frame)
        answer = ToolResultsFrame.model_validate(await self._answer("tool_results"))
        return StepAnswer(results=answer.results, steers=answer.steers)

    async def _answer(self, kind: str) -> dict[str, Any]:
        data = await self._answers.get()
        if data.get("type") == "error":
            raise GatewayClientError.from_frame(ErrorFrame.model_validate(data))
        if data.get("type") != kind:
            raise GatewayClientError("protocol", f"expected {kind}, got {data.get('type')!r}")
        return data


@dataclass(eq=False, slots=True)
class _Link:
    """One connection of a worker, to one gateway (a member of a cluster), with the runs it
    was given."""

    url: str
    ws: ClientConnection | None = None
    member: str | None = None
    """The URL of the member it is connected to, as that member said (in a cluster)."""
    runs: dict[str, tuple[WorkerRun, asyncio.Task[None]]] = field(default_factory=dict)

    async def send(self, frame: dict[str, Any], ids: Iterator[int]) -> None:
        ws = self.ws
        if ws is None:
            raise GatewayClientError("disconnected", "the worker is not connected")
        run_id = frame.get("runId")
        frame["id"] = f"{run_id}#{next(ids)}" if run_id else str(next(ids))
        await ws.send(json.dumps(frame))

    def closed(self) -> None:
        """The connection ended: its runs are cancelled (the gateway reruns them)."""
        self.ws = None
        for _, task in self.runs.values():
            task.cancel()
        self.runs.clear()


class Worker:
    """Does the runs of worker agents (one decorated async function per agent).

    In a cluster (several gateway processes on one log) the gateway at ``url`` says where
    every member is, and the worker connects to each of them too, following the members as
    they change: an agent's runs reach it wherever the agent is owned, and at once after a
    failover (its agents' new owner is already connected to)."""

    def __init__(self, url: str, token: str, *, open_timeout: float = 10.0,
                 reconnect: bool = True) -> None:
        self.url = endpoint_url(url, "worker")
        self._token = token
        self._open_timeout = open_timeout
        self._reconnect = reconnect
        self._handlers: dict[str, Handler] = {}
        self._home = _Link(self.url)
        self._members: dict[str, tuple[_Link, asyncio.Task[None]]] = {}
        """The connections to the other members of a cluster, by URL."""
        self._ids = itertools.count(1)
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once connected and told which agents it serves (`served`)."""
        self.served: list[str] = []
        self.errors: list[ErrorFrame] = []
        """Error frames that answered no run's frame in flight (for inspection)."""

    @property
    def members(self) -> list[str]:
        """The URLs of the other members of the cluster this worker is connected to, or
        trying to be (none outside a cluster)."""
        return sorted(self._members)

    def agent(self, agent_id: str) -> Callable[[Handler], Handler]:
        """Decorate the async function that does ``agent_id``'s runs."""
        def register(handler: Handler) -> Handler:
            self._handlers[agent_id] = handler
            return handler
        return register

    def stop(self) -> None:
        """Stop `run` (its runs are cancelled; the gateway reruns them elsewhere)."""
        self._stop.set()

    async def run(self) -> None:
        """Connect and do runs until `stop` (reconnecting with backoff, if asked to)."""
        try:
            await self._keep(self._home)
        finally:
            tasks = [task for _, task in self._members.values()]
            self._members.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep(self, link: _Link) -> None:
        """Keep ``link`` connected (with backoff, if asked to) until `stop`."""
        failures = 0
        while not self._stop.is_set():
            try:
                async with connect(link.url, open_timeout=self._open_timeout,
                                   additional_headers={"Authorization":
                                                       f"Bearer {self._token}"}) as ws:
                    failures = 0
                    await self._serve(link, ws)
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError) as error:
                log.info("worker connection to %s: %r", link.url, error)
            finally:
                link.closed()
                if link is self._home:
                    self.ready.clear()
            if not self._reconnect or self._stop.is_set():
                return
            failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(),
                                       random.uniform(0, min(10.0, 0.2 * 2 ** failures)))

    async def _serve(self, link: _Link, ws: ClientConnection) -> None:
        hello = json.loads(await asyncio.wait_for(ws.recv(), self._open_timeout))
        if hello.get("type") == "error":
            raise GatewayClientError.from_frame(ErrorFrame.model_validate(hello))
        Hello.model_validate(hello)
        ready = WorkerReady.model_validate(json.loads(await ws.recv()))
        link.ws = ws
        link.member = None if ready.member is None else endpoint_url(ready.member, "worker")
        if link is self._home:
            self.served = ready.agents
            self.ready.set()
        self._follow(ready.members)
        beat = spawn(self._beat(ws, ready.heartbeat_ms / 2_000), "worker heartbeat")
        stop = spawn(self._stop.wait(), "worker stop")
        try:
            async for raw in _until(ws, stop):
                data = json.loads(raw)
                if data.get("type") == "members":
                    self._follow(MembersFrame.model_validate(data).members)
                else:
                    self._dispatch(link, data)
        finally:
            beat.cancel()
            stop.cancel()

    def _follow(self, members: Sequence[str]) -> None:
        """Be connected to each member of the cluster (the one the home connection reached
        is served by it), and to no other."""
        if not members:
            return
        wanted = {endpoint_url(url, "worker") for url in members} - {self._home.member}
        for url in set(self._members) - wanted:
            self._members.pop(url)[1].cancel()
        for url in wanted - set(self._members):
            link = _Link(url)
            self._members[url] = (link, spawn(self._keep(link), f"worker link to {url}"))

    def _dispatch(self, link: _Link, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "run":
            frame = RunFrame.model_validate(data)
            handler = self._handlers.get(frame.agent_id)
            run = WorkerRun(frame.run_id, frame.agent_id, frame.requests, frame.summary,
                            frame.depth, frame.tools, frame.max_steps, self, link)
            task = spawn(self._do(link, run, handler), f"worker run {frame.run_id}")
            link.runs[frame.run_id] = (run, task)
        elif kind in ("slot_granted", "tool_results"):
            entry = link.runs.get(str(data.get("runId")))
            if entry is not None:
                entry[0]._answers.put_nowait(data)
        elif kind == "cancel":
            entry = link.runs.pop(str(data.get("runId")), None)
            if entry is not None:
                entry[1].cancel()
        elif kind == "error":
            run_id = str(data.get("id") or "").partition("#")[0]
            entry = link.runs.get(run_id)
            if entry is not None:
                entry[0]._answers.put_nowait(data)
            else:
                self.errors.append(ErrorFrame.model_validate(data))

    async def _do(self, link: _Link, run: WorkerRun, handler: Handler | None) -> None:
        try:
            if handler is None:
                raise LookupError(f"this worker has no function for agent {run.agent_id}")
            result = dict(await handler(run))
            await run._send({**result, "type": "result", "runId": run.run_id})
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("run %s failed: %r", run.run_id, error)
            with contextlib.suppress(Exception):
                await run._send({"type": "failed", "runId": run.run_id,
                                 "error": f"{type(error).__name__}: {error}"[:500]})
        finally:
            link.runs.pop(run.run_id, None)

    async def _beat(self, ws: ClientConnection, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            await ws.send('{"type": "heartbeat"}')


async def _until(ws: ClientConnection, stop: asyncio.Task[Any]) -> AsyncIterator[str | bytes]:
    """The connection's messages until it closes or ``stop`` is done."""
    while True:
        receive = asyncio.ensure_future(ws.recv())
        done, _ = await asyncio.wait({receive, stop}, return_when=asyncio.FIRST_COMPLETED)
        if receive not in done:
            receive.cancel()
            return
        try:
            yield receive.result()
        except ConnectionClosed:
            return
