"""The frames of ``/ws/worker``: a worker doing the runs of worker agents (docs/workers.md).

Worker -> gateway: `SlotFrame` (before each model call), `StepFrame` (the call it made in the
slot), `ResultFrame` (the run's end) or `FailedFrame` (it gave up), `WorkerHeartbeat` (at
least every ``heartbeatMs``); gateway -> worker: `WorkerReady` (once authenticated),
`MembersFrame` (in a cluster, when its members change), `RunFrame`, `SlotGranted`,
`ToolResultsFrame`, `CancelFrame`, and `gateway.edge.protocol.ErrorFrame` for a frame that
is refused (it changed nothing). Schemas: ``gateway schema`` (``worker``, ``gateway``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from gateway.edge.protocol import ClientId, ErrorFrame
from lanes.config import CallResults
from lanes.events import CallIntent, OrderIntent, Outcome, Summary, Usage
from lanes.requests import MAX_INT, AgentRequest, JsonObject, WireModel

RunId = Annotated[str, Field(min_length=1, max_length=128)]
Tokens = Annotated[int, Field(ge=0, le=MAX_INT)]

# ------------------------------------------------------------------- worker -> gateway


class SlotFrame(WireModel):
    """Ask for a slot of the agent's provider gate before a model call, with the call's
    estimated tokens; answered by `SlotGranted` (perhaps after a wait: the desk's limits)."""

    type: Literal["slot"]
    run_id: RunId
    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    id: ClientId = None


class WireToolCall(WireModel):
    """A tool call the model asked for (``arguments``: its JSON object)."""

    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    arguments: JsonObject = Field(default_factory=dict)


class StepFrame(WireModel):
    """The model call made in the granted slot: recorded as a step of the run (the slot is
    given back with ``usage``); answered by `ToolResultsFrame` with the results of the
    gateway's tools it called (errors for refused calls and tools it does not have)."""

    type: Literal["step"]
    run_id: RunId
    step: int = Field(ge=1, le=1_000)
    """1 for the first model call of the run, then 2, ..."""
    usage: Usage = Field(default_factory=Usage)
    stop_reason: str | None = Field(default=None, max_length=64)
    text: str = Field(default="", max_length=100_000)
    tool_calls: list[WireToolCall] = Field(default_factory=list, max_length=100)
    own_results: list[WireToolResult] = Field(default_factory=list, max_length=100)
    """The results of the tool calls of the step that are the worker's own tools (its
    agent's ``worker_tools``), run before the step is sent: recorded as the tools' results."""
    id: ClientId = None


class ResultFrame(WireModel):
    """The run's end: what it came to (orders go through the trading gate, calls to the
    agents they name). Taken once; after it, or after a `CancelFrame`, nothing of the run is."""

    type: Literal["result"]
    run_id: RunId
    outcome: Outcome
    usage: Usage = Field(default_factory=Usage)
    orders: list[OrderIntent] = Field(default_factory=list, max_length=100)
    calls: list[CallIntent] = Field(default_factory=list, max_length=100)
    answer: str = Field(default="", max_length=20_000)
    call_results: CallResults | None = None
    id: ClientId = None


class FailedFrame(WireModel):
    """The worker gives the run up (its model or code broke): the run fails, recorded with
    ``error``."""

    type: Literal["failed"]
    run_id: RunId
    error: str = Field(min_length=1, max_length=500)
    id: ClientId = None


class WorkerHeartbeat(WireModel):
    """The worker is alive (send one at least every ``heartbeatMs``)."""

    type: Literal["heartbeat"]
    id: ClientId = None


WorkerFrame = Annotated[SlotFrame | StepFrame | ResultFrame | FailedFrame | WorkerHeartbeat,
                        Field(discriminator="type")]
WORKER_FRAME: TypeAdapter[Any] = TypeAdapter(WorkerFrame)
WORKER_TYPES = ("slot", "step", "result", "failed", "heartbeat")

# ------------------------------------------------------------------- gateway -> worker


class WorkerReady(WireModel):
    """Sent after `gateway.edge.protocol.Hello`: the worker agents this worker serves, and
    (in a cluster) where the members are: a worker connects to each, so that each agent's
    runs reach it wherever the agent is owned."""

    type: Literal["ready"] = "ready"
    agents: list[str]
    heartbeat_ms: int
    """Send a frame (a heartbeat if nothing else) at least this often."""
    member: str | None = None
    """In a cluster: the URL of the member this connection is to (None: no cluster)."""
    members: list[str] = Field(default_factory=list)
    """In a cluster: the URL of every live member, this one included."""


class MembersFrame(WireModel):
    """The cluster's live members changed: be connected to each of them (and to no other)."""

    type: Literal["members"] = "members"
    members: list[str]


class WireToolSpec(WireModel):
    """A tool the run may call (the agent's; run by the gateway when a step calls it)."""

    name: str
    description: str
    input_schema: dict[str, Any]


class RunFrame(WireModel):
    """A run to do: its requests, the agent's context and the tools it may call."""

    type: Literal["run"] = "run"
    run_id: str
    agent_id: str
    requests: list[AgentRequest]
    summary: Summary | None = None
    """Requests folded away by the queue cap, if any."""
    depth: int
    tools: list[WireToolSpec]
    max_steps: int
    """Model calls (steps) the run may make at most."""


class SlotGranted(WireModel):
    """The slot is yours: make the model call now, then send its `StepFrame`."""

    type: Literal["slot_granted"] = "slot_granted"
    run_id: str


class WireToolResult(WireModel):
    """The answer to one tool call of the step, in its order."""

    call_id: str
    content: str
    is_error: bool = False


class ToolResultsFrame(WireModel):
    """A step's tool results, and requests steered into the run since the last step (give
    them to the model in the next call)."""

    type: Literal["tool_results"] = "tool_results"
    run_id: str
    step: int
    results: list[WireToolResult]
    steers: list[AgentRequest] = Field(default_factory=list)


class CancelFrame(WireModel):
    """The run was aborted (an emergency stop, an operator, its timeout) or failed here:
    stop it; anything sent for it from now on is refused."""

    type: Literal["cancel"] = "cancel"
    run_id: str
    reason: str


GatewayToWorker = Annotated[
    WorkerReady | MembersFrame | RunFrame | SlotGranted | ToolResultsFrame | CancelFrame
    | ErrorFrame,
    Field(discriminator="type"),
]


def worker_schemas() -> dict[str, Any]:
    """JSON Schemas of the frames of ``/ws/worker`` (both ways)."""
    return {"worker": TypeAdapter(WorkerFrame).json_schema(by_alias=True),
            "gateway": TypeAdapter(GatewayToWorker).json_schema(by_alias=True)}
