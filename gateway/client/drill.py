"""What the HTTP API answers when a client drills down, as the client reads it: an order's
life, a run in full, a what-if from a moment, and the symbols' ticks."""

from __future__ import annotations

from typing import Any

from gateway.client.frames import Answer, JsonObject


class LifeCause(Answer):
    """The input a step was decided of, worded as the timeline words it."""

    position: int
    type: str
    text: str


class LifeStep(Answer):
    """One step of an order's life: its stage, the event in words, when, and its cause."""

    stage: str
    position: int
    at: int | None
    type: str
    text: str
    cause: LifeCause | None


class OrderLife(Answer):
    """An order's life, oldest step first, and the run that decided it."""

    agent_id: str
    order_id: str
    run_id: str
    intent: JsonObject | None
    placed_at: int | None
    status: str
    steps: list[LifeStep]
    flatten_by: str | None = None
    """An operator's flatten placed it, not a run: its request id."""


class RunRequest(Answer):
    """A request a run was given (``missing``: its input was not found within reach)."""

    request_id: str
    missing: bool
    position: int | None = None
    at: int | None = None
    kind: str | None = None
    priority: str | None = None
    source: str | None = None
    principal: str | None = None
    payload: JsonObject | None = None


class Prompt(Answer):
    """What the run's model was given: its requests, a summary, the text."""

    requests: list[RunRequest]
    summary: JsonObject | None
    text: str


class RunToolCall(Answer):
    """A tool call of a step, with its result."""

    call_id: str
    name: str
    arguments: JsonObject
    malformed: str | None
    status: str
    result: str | None
    result_position: int | None


class RunStep(Answer):
    """One model call of a run: its text, tokens, steers and tool calls."""

    step: int
    position: int
    at: int
    text: str
    stop_reason: str | None
    input_tokens: int
    output_tokens: int
    steered: list[str]
    tool_calls: list[RunToolCall]


class RunOrder(Answer):
    """An order the run placed (or that was refused)."""

    order_id: str | None
    status: str
    reason: str | None
    intent: JsonObject


class RunDetail(Answer):
    """One run in full, from the log."""

    agent_id: str
    run_id: str
    position: int
    started_at: int | None
    ended_at: int | None
    outcome: str
    detail: str | None
    usage: dict[str, int]
    answer: str
    prompt: Prompt
    steps: list[RunStep]
    steers: list[RunRequest]
    orders: list[RunOrder]


class SettingChange(Answer):
    """A setting the other config changes (nested ones dotted)."""

    setting: str
    recorded: Any = None
    whatif: Any = None


class MeasureRow(Answer):
    """One measure, recorded against what-if (None: nothing to measure)."""

    measure: str
    recorded: int | None = None
    whatif: int | None = None
    change: int | None = None


class WhatIf(Answer):
    """What happened after a moment, and what would have under another config."""

    agent_id: str
    position: int
    event_position: int
    at: int
    until: int
    events: int
    recorded_config: JsonObject
    config: JsonObject
    changes: list[SettingChange]
    rows: list[MeasureRow]


class Market(Answer):
    """Each symbol's tick (``tick``: that of a symbol not listed)."""

    tick: float
    ticks: dict[str, float]
