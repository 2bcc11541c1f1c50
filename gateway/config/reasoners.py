"""The ``reasoner`` table of an ``[[agents]]`` table: a simulated reasoner or a real model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from gateway.config.base import ConfigModel
from gateway.market.events import Symbol
from gateway.market.hooks import AgentId
from lanes.config import MAX_MS, CallResults
from lanes.requests import Priority


class SimulatedCallConfig(ConfigModel):
    """Calls a simulated run makes: ``count`` calls to agent ``agent``."""

    agent: AgentId
    count: int = Field(default=1, ge=1, le=10_000)
    priority: Priority = Priority.NORMAL
    payload: dict[str, Any] = Field(default_factory=dict)
    timeout_ms: int | None = Field(default=None, ge=1, le=MAX_MS)


class SimulatedToolCall(ConfigModel):
    """A tool call a simulated step makes (a string argument ``$symbol``: the run's)."""

    tool: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)


class SimulatedReasonerConfig(ConfigModel):
    """The simulated reasoner (see `gateway.llm.reasoner.SimulatedReasoner`)."""

    kind: Literal["simulated"] = "simulated"
    latency_ms: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] = (200, 1_500)
    """A run's latency is drawn uniformly from ``[low, high]``."""
    trade_probability: float = Field(default=0.3, ge=0.0, le=1.0)
    steerable: bool = True
    turns: int = Field(default=2, ge=1, le=100)
    seed: int | None = 7
    symbol: Symbol = "BTCUSD"
    """The symbol of its orders when the requests name none."""
    provider: str | None = None
    """A ``[[providers]]`` name: each simulated turn then takes a slot of that gate."""
    calls: tuple[SimulatedCallConfig, ...] = Field(default=(), max_length=100)
    """Sub-agent calls each run makes (not a run about call results, nor one at a depth of
    ``call_below_depth`` or more): ``[[agents.reasoner.calls]]`` tables."""
    call_below_depth: int = Field(default=1, ge=0, le=100)
    """Runs at a call depth below this make the calls (0 never; 1 only runs on hooks,
    messages and audits, not those serving another agent's call)."""
    call_results: CallResults | None = None
    """How the calls' results come back (None: the agent's ``call_results``)."""
    tool_steps: tuple[tuple[SimulatedToolCall, ...], ...] = Field(default=(), max_length=50)
    """For an agent with ``tools``: each step's tool calls, then a final answer (each
    step one simulated model call through the gate, recorded as a real model's)."""

    @field_validator("latency_ms")
    @classmethod
    def _ordered(cls, latency: tuple[int, int]) -> tuple[int, int]:
        if latency[0] > latency[1]:
            raise ValueError(f"[low, high] with low <= high; got {list(latency)}")
        return latency


class LLMReasonerConfig(ConfigModel):
    """A real model (see `gateway.llm.reasoner.LLMReasoner`) behind a ``[[providers]]`` gate."""

    kind: Literal["llm"] = "llm"
    provider: str
    """The ``[[providers]]`` name (an anthropic or openai one)."""
    max_tokens: int = Field(default=1_024, ge=1, le=200_000)
    max_turns: int = Field(default=3, ge=1, le=20)
    """Calls per run at most; the turns after the first carry steers."""
    system_prompt: str | None = Field(default=None, min_length=1, max_length=100_000)
    """None: the gateway's own (`gateway.llm.reasoner.SYSTEM_PROMPT`)."""


class WorkerReasonerConfig(ConfigModel):
    """Runs done by an external worker on ``/ws/worker`` (see `gateway.runtime.workers`
    and docs/workers.md): bring your own agent."""

    kind: Literal["worker"] = "worker"
    provider: str | None = None
    """A ``[[providers]]`` name: each model call of the worker then takes a slot of that
    gate first (so the desk's limits hold for it too)."""
    heartbeat_ms: int = Field(default=5_000, ge=100, le=600_000)
    """How often a worker sends a heartbeat (it is told in its hello)."""
    missed_heartbeats: int = Field(default=3, ge=1, le=100)
    """A worker silent for this many heartbeats is lost: its run is aborted ``worker_lost``
    and its requests go back to the head of the queue."""
    max_steps: int = Field(default=10, ge=1, le=100)
    """Model calls per run at most, for an agent without ``tools`` (with tools: theirs)."""


ReasonerConfig = Annotated[SimulatedReasonerConfig | LLMReasonerConfig | WorkerReasonerConfig,
                           Field(discriminator="kind")]
REASONER_KINDS = frozenset({"simulated", "llm", "worker"})
