"""Per-agent policy: queue mode, caps, dedupe, budgets and limits.

A config lives in the log (`ConfigApplied`), so replay decides with the config that was in
force; a change applies to requests that arrive after it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from lanes.requests import Kind, WireModel

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
MAX_MS = 3_650 * DAY_MS
"""The longest duration a config takes (ten years): time arithmetic on it never overflows."""
MAX_COUNT = 1_000_000_000
"""The largest count a config takes."""
MAX_GATE_WEIGHT = 1_000
"""The largest weight an agent takes at its provider gate."""
STORED = "stored"
"""Serialization context key: the dump is for the event log (`lanes.codec`)."""


class Mode(StrEnum):
    """What an arriving reasoning request does when the agent is idle or busy."""

    FOLLOWUP = "followup"
    QUEUE = "queue"
    INTERRUPT = "interrupt"
    COLLECT = "collect"
    STEER = "steer"
    STEER_BACKLOG = "steer-backlog"


class DropPolicy(StrEnum):
    """What happens over the cap: drop the oldest, refuse the newest, or fold into a summary."""

    OLD = "old"
    NEW = "new"
    SUMMARIZE = "summarize"


class DedupeStrategy(StrEnum):
    """Which field identifies a redelivery (the requestId is always idempotent)."""

    MESSAGE_ID = "messageId"
    DEDUPE_KEY = "dedupeKey"
    NONE = "none"


DEFAULT_DEDUPE: dict[Kind, DedupeStrategy] = {
    Kind.USER_CONTROL: DedupeStrategy.NONE,
    Kind.HOOK_TRIGGER: DedupeStrategy.DEDUPE_KEY,
    Kind.SCHEDULED_AUDIT: DedupeStrategy.DEDUPE_KEY,
    Kind.SYSTEM_ALERT: DedupeStrategy.DEDUPE_KEY,
    Kind.AGENT_CALL: DedupeStrategy.NONE,
    Kind.CALL_RESULT: DedupeStrategy.NONE,
    Kind.CALL_CANCEL: DedupeStrategy.NONE,
    Kind.APPROVAL_RESULT: DedupeStrategy.NONE,
}
_NEW_KINDS = (Kind.CALL_RESULT, Kind.CALL_CANCEL, Kind.APPROVAL_RESULT)
"""Kinds added after configs were stored (their dedupe entry is stored only when set)."""


class AboveNotional(WireModel):
    """Orders wait for approval when their notional (quantity x price) is above
    ``above_notional``, for the ``symbols`` named (none: every symbol). An order whose
    price is not known waits too."""

    above_notional: float = Field(gt=0)
    symbols: tuple[str, ...] = Field(default=(), max_length=1_000)


class CallResults(StrEnum):
    """How the results of a run's sub-agent calls come back to the agent that made them."""

    ALL = "all"
    """Wait for every call of the run, then one request with all the results."""
    EACH = "each"
    """One request per result as it arrives (steered into a run that can take it)."""


def _token_limit() -> Any:
    """A token budget's field: unset by default, and then not stored."""
    return Field(default=None, ge=1, le=10**15, exclude_if=lambda value: value is None)


MCP_TOOL_PATTERN = r"^[A-Za-z0-9_-]{1,30}__[A-Za-z0-9_-]{1,64}$"
"""An MCP tool as an agent's model sees it: ``<server>__<tool>``."""

SPEND_BUDGETS = ("max_input_tokens_per_hour", "max_input_tokens_per_day",
                 "max_output_tokens_per_hour", "max_output_tokens_per_day",
                 "max_spend_per_hour", "max_spend_per_day")
"""The token and spend budgets (stored only when set)."""


class Budgets(WireModel):
    """Run budgets. ``None`` means unlimited; cooldown follows a run whose outcome is no trade."""

    max_runs_per_hour: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_runs_per_day: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    no_trade_cooldown_ms: int = Field(default=0, ge=0, le=MAX_MS)
    max_input_tokens_per_hour: int | None = _token_limit()
    max_input_tokens_per_day: int | None = _token_limit()
    max_output_tokens_per_hour: int | None = _token_limit()
    max_output_tokens_per_day: int | None = _token_limit()
    max_spend_per_hour: float | None = Field(default=None, gt=0,
                                             exclude_if=lambda value: value is None)
    """Money per hour, in the currency of the providers' prices (`cost` of each run)."""
    max_spend_per_day: float | None = Field(default=None, gt=0,
                                            exclude_if=lambda value: value is None)
    alert_at: tuple[float, ...] = Field(default=(0.8, 0.95), max_length=10,
                                        exclude_if=lambda value: value == (0.8, 0.95))
    """The fractions of a token or spend budget at which an alert is recorded
    (`BudgetAlert`); at 1, runs are suppressed with the budget named."""
    desk_counted: bool = Field(default=False, exclude_if=lambda value: not value)
    """Its runs' usage is kept for the desk's budget (set by the gateway for every agent
    when ``[desk.budgets]`` is configured)."""

    @property
    def spending(self) -> bool:
        """Whether any token or spend budget is set."""
        return any(getattr(self, name) is not None for name in SPEND_BUDGETS)


class AgentConfig(WireModel):
    """Everything that decides how one agent's lanes behave."""

    mode: Mode = Mode.STEER_BACKLOG
    debounce_ms: int = Field(default=2_000, ge=0, le=MAX_MS)
    collect_max_wait_ms: int | None = Field(default=None, ge=0, le=MAX_MS)
    """A collect window never stays open longer than this after its first request
    (default: five debounce periods), so a steady trickle cannot starve the run."""
    cap: int = Field(default=50, ge=1, le=100_000)
    drop_policy: DropPolicy = DropPolicy.OLD
    dedupe: dict[Kind, DedupeStrategy] = Field(default_factory=lambda: dict(DEFAULT_DEDUPE))
    dedupe_window_ms: int = Field(default=600_000, ge=0, le=MAX_MS)
    idempotency_window_ms: int = Field(default=DAY_MS, ge=0, le=MAX_MS)
    idempotency_max: int = Field(default=100_000, ge=1, le=10_000_000)
    """How many request ids (and dedupe keys) are remembered at most, oldest forgotten first."""
    budgets: Budgets = Field(default_factory=Budgets)
    max_call_depth: int = Field(default=3, ge=0, le=100)
    max_calls_per_run: int = Field(default=10, ge=0, le=10_000)
    max_parallel_calls: int = Field(default=5, ge=1, le=10_000)
    """The calls of one run out at once at most; the others wait in the agent's call queue,
    high priority first (FIFO within a priority)."""
    max_open_calls: int = Field(default=1_000, ge=1, le=1_000_000)
    """Calls queued or out at once at most; more are refused (``queue_full``)."""
    call_timeout_ms: int | None = Field(default=600_000, ge=1, le=MAX_MS)
    """A call out this long ends ``timed_out`` (a call's own ``timeoutMs`` wins; None: never)."""
    call_results: CallResults = CallResults.ALL
    """How call results come back, unless the run that made the calls says."""
    run_timeout_ms: int = Field(default=120_000, ge=1, le=MAX_MS)
    gate_weight: int = Field(default=1, ge=1, le=MAX_GATE_WEIGHT)
    """The agent's weight at its provider gate: under contention, agents get tokens in
    proportion to their weights (`lanes.gate`)."""
    tools: tuple[str, ...] = Field(default=(), max_length=100)
    """The built-in tools its model is offered (`lanes.tools`); with none, a run is one
    answer as before. With some, a run is a loop of model calls and tool steps."""
    mcp_tools: tuple[Annotated[str, Field(pattern=MCP_TOOL_PATTERN)], ...] = Field(
        default=(), max_length=100)
    """Tools of MCP servers its model is offered beside the built-ins, each named
    ``<server>__<tool>`` (the shell calls them; their servers check their arguments)."""
    worker_tools: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")], ...] = Field(
        default=(), max_length=100)
    """Tools a worker agent's worker runs itself (`docs/workers.md`): allowed by name,
    their results recorded as the worker reports them."""
    max_steps: int = Field(default=8, ge=1, le=100)
    """The most model calls one run makes; past it, the run fails with the budget named."""
    approval: Literal["never", "always"] | AboveNotional = "never"
    """Which of its orders wait for a human's approval: none, all, or those whose notional
    is above a sum (``{above_notional = N}``, for some ``symbols`` only if named)."""
    approval_timeout_ms: int = Field(default=900_000, ge=1, le=MAX_MS)
    """An order not approved within this long is rejected."""
    halt_on_alerts: tuple[Annotated[str, Field(min_length=1, max_length=128)], ...] = Field(
        default=(), max_length=1_000)
    """``system_alert`` codes (``payload.code``) that act as an emergency stop; ``*`` = all."""

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler,
                         info: SerializationInfo) -> dict[str, Any]:
        # Keys added after configs were stored are stored only when set: a config that does
        # not use them is stored exactly as before (old logs re-record byte for byte).
        data: dict[str, Any] = handler(self)
        if not (info.context and info.context.get(STORED)):
            return data
        for name, default in _WRITTEN_WHEN_SET:
            if getattr(self, name) == default:
                data.pop(to_camel(name), None)
                data.pop(name, None)
        dedupe = data.get("dedupe")
        if isinstance(dedupe, dict):
            for kind in _NEW_KINDS:
                if self.dedupe.get(kind) is DEFAULT_DEDUPE[kind]:
                    dedupe.pop(kind, None)
                    dedupe.pop(kind.value, None)
        return data

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, tools: tuple[str, ...]) -> tuple[str, ...]:
        from lanes.tools import TOOLS  # (lanes.tools builds on this module)

        for name in tools:
            if name not in TOOLS:
                raise ValueError(f"unknown tool {name!r}; the built-in tools are: "
                                 f"{', '.join(TOOLS)}")
        if len(set(tools)) != len(tools):
            raise ValueError("each tool may be named once")
        return tools

    @model_validator(mode="after")
    def _complete_dedupe(self) -> AgentConfig:
        missing = {k: v for k, v in DEFAULT_DEDUPE.items() if k not in self.dedupe}
        if missing:
            self.dedupe.update(missing)
        return self

    @property
    def collect_deadline_ms(self) -> int:
        """The longest a collect window stays open after its first request."""
        if self.collect_max_wait_ms is not None:
            return self.collect_max_wait_ms
        return 5 * self.debounce_ms


_WRITTEN_WHEN_SET: tuple[tuple[str, Any], ...] = tuple(
    (name, AgentConfig.model_fields[name].default)
    for name in ("max_parallel_calls", "max_open_calls", "call_timeout_ms", "call_results",
                 "gate_weight", "tools", "max_steps", "approval", "approval_timeout_ms",
                 "mcp_tools", "worker_tools"))
