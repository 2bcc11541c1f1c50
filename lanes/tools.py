"""The built-in tools an agent's model may call: one definition each.

A tool is its name, what it does (said to the model) and the model of its arguments; the
JSON Schema the model is given (`tool_schema`), the arguments' check (`tool_arguments`), the
docs (docs/agents.md) and ``gateway schema`` all come from it. What each does is the
shell's (market data, positions and orders); the rules are the pure core's: orders go
through the trading gate like any other, and sub-agent tasks are calls under the agent's
call limits (`lanes.decide_steps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import Field, ValidationError

from lanes.requests import WireModel
from lanes.vocabulary import CallIntent, OrderIntent

MAX_TASKS = 100
"""The most tasks one ``schedule_tasks`` call takes (the agent's own limits still apply)."""
MAX_CANDLES = 500
"""The most candles one ``candles`` call returns."""


class ToolKind(StrEnum):
    """What a tool does, for the rules around it."""

    READ = "read"
    """Reads what the gateway knows; changes nothing."""
    ORDER = "order"
    """Places or cancels an order: checked by the trading gate (and an approval, if set)."""
    CALLS = "calls"
    """Sub-agent calls: scheduled, sent, or looked at."""


class NoArguments(WireModel):
    """A tool that takes no arguments."""


class SymbolArguments(WireModel):
    """A symbol the feed sends."""

    symbol: str = Field(min_length=1, max_length=32, description="The symbol, e.g. BTCUSD.")


class CandlesArguments(WireModel):
    """A symbol, the candle interval and how many of the latest candles."""

    symbol: str = Field(min_length=1, max_length=32, description="The symbol, e.g. BTCUSD.")
    interval: Literal["1m", "5m", "15m", "1h"] = Field(
        description="The length of one candle.")
    count: int = Field(default=50, ge=1, le=MAX_CANDLES,
                       description="How many of the latest candles, oldest first.")


class CancelArguments(WireModel):
    """The open order to cancel."""

    order_id: str = Field(min_length=1, max_length=128, description="The open order's id.")


class ScheduleArguments(WireModel):
    """Sub-agent tasks to schedule for this run (sent by ``execute_scheduled_tasks``)."""

    tasks: list[CallIntent] = Field(min_length=1, max_length=MAX_TASKS,
                                    description="Each task: the agent to call and its payload.")


class AgentArguments(WireModel):
    """An agent of this gateway."""

    agent_id: str = Field(min_length=1, max_length=64, description="The agent's id.")


@dataclass(frozen=True, slots=True)
class Tool:
    """A built-in tool: its name, what it does, its kind and its arguments' model."""

    name: str
    description: str
    kind: ToolKind
    arguments: type[WireModel]


TOOLS: Final[Mapping[str, Tool]] = {tool.name: tool for tool in (
    Tool("market_snapshot", "The latest price, bid, ask and time of a symbol, from what the "
         "market feed sent (stale prices are marked).", ToolKind.READ, SymbolArguments),
    Tool("candles", "The latest OHLCV candles of a symbol, built from the feed's prices.",
         ToolKind.READ, CandlesArguments),
    Tool("positions", "This agent's positions: quantity, average price, market value and "
         "P&L.", ToolKind.READ, NoArguments),
    Tool("open_orders", "This agent's open orders.", ToolKind.READ, NoArguments),
    Tool("place_order", "Place an order. It goes through the trading gate (refused while "
         "the agent is halted; reduce-only while paused) and may wait for a human's "
         "approval: the answer then says 'pending approval <id>'.", ToolKind.ORDER,
         OrderIntent),
    Tool("cancel_order", "Cancel one of this agent's open orders.", ToolKind.ORDER,
         CancelArguments),
    Tool("schedule_tasks", "Schedule sub-agent tasks for this run; nothing is sent until "
         "execute_scheduled_tasks.", ToolKind.CALLS, ScheduleArguments),
    Tool("execute_scheduled_tasks", "Send the scheduled tasks and wait for their results "
         "(each bounded by its timeout); returns one result per task.", ToolKind.CALLS,
         NoArguments),
    Tool("get_queue_status", "This run's sub-agent tasks: those scheduled and not sent yet, "
         "and those sent and not all back (queued, out, or ended with their results).",
         ToolKind.CALLS, NoArguments),
    Tool("agent_status", "Another agent's trading state, queue and active run.",
         ToolKind.READ, AgentArguments),
)}
"""Every built-in tool, by name."""

TOOL_NAMES: Final = tuple(TOOLS)


class ToolArgumentError(ValueError):
    """Arguments a tool does not take; the message says what is wrong, for the model."""


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments, as the model is given it (an object, with
    the fields' descriptions; camelCase names)."""
    schema: dict[str, Any] = _untitled(tool.arguments.model_json_schema(by_alias=True))
    schema.pop("description", None)
    schema.setdefault("properties", {})
    return schema


def _untitled(schema: Any) -> Any:
    """The schema without pydantic's generated ``title`` keys (noise to a model)."""
    if isinstance(schema, dict):
        return {key: _untitled(value) for key, value in schema.items()
                if not (key == "title" and isinstance(value, str))}
    if isinstance(schema, list):
        return [_untitled(value) for value in schema]
    return schema


def tool_arguments(name: str, arguments: Mapping[str, Any]) -> WireModel:
    """The arguments of a call of the built-in tool ``name``, checked; `ToolArgumentError`
    (naming the tool and every problem) for an unknown tool or arguments it does not take."""
    tool = TOOLS.get(name)
    if tool is None:
        raise ToolArgumentError(f"unknown tool {name!r}; the tools are: {', '.join(TOOLS)}")
    try:
        return tool.arguments.model_validate(dict(arguments))
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
            for e in error.errors())
        raise ToolArgumentError(f"{name}: {problems}") from None


def tool_schemas() -> dict[str, dict[str, Any]]:
    """Every built-in tool's description, kind and argument schema (``gateway schema``)."""
    return {tool.name: {"description": tool.description, "kind": tool.kind.value,
                        "inputSchema": tool_schema(tool)} for tool in TOOLS.values()}


def tools_table() -> str:
    """The tools as the Markdown table of docs/agents.md (between its ``tools`` markers)."""
    rows = ["| tool | kind | arguments (* required) | what it does |", "|---|---|---|---|"]
    for tool in TOOLS.values():
        schema = tool_schema(tool)
        required = set(schema.get("required", ()))
        arguments = ", ".join(f"`{name}`{'*' if name in required else ''}"
                              for name in schema["properties"]) or "none"
        rows.append(f"| `{tool.name}` | {tool.kind.value} | {arguments} | {tool.description} |")
    return "\n".join(rows) + "\n"
