"""Drill-down, read from the log: an order's life (placed, waiting for approval, each broker
report, fills, cancels, how it closed) with the run that decided it, and a run in full (the
requests it was given as the model read them, each model call's text and tool calls with
their results, the steers it took, its answer and orders).

Each answer reads one agent's stream through the store's port, back from its newest event
in pages, and never more than `MAX_DRILL_SCAN` events: an order or a run older than that is
answered as not found, with the reach said.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.base.quarantine import LogReader
from gateway.errors import BadFrame
from gateway.llm.reasoner import render_requests
from gateway.market.prices import PriceWords
from gateway.tools.timeline import explain, what_came_in
from lanes.events import (
    INPUT_TYPES,
    ApprovalDecided,
    ApprovalRequested,
    BrokerReport,
    BrokerReportIgnored,
    Event,
    ModelCalled,
    OrderAccepted,
    OrderCancelRequested,
    OrderClosed,
    OrderFilled,
    OrderRejected,
    RequestReceived,
    RunAborted,
    RunCompleted,
    RunFailed,
    RunFinished,
    RunStarted,
    RunSteered,
    StepDecided,
    ToolReturned,
    is_input,
)
from lanes.requests import WireModel
from store.port import LogReads, RecordedEvent

_INPUT_NAMES = frozenset(t.__name__ for t in INPUT_TYPES)
PAGE = 1_000
MAX_DRILL_SCAN = 100_000
"""Events of an agent's stream read for one drill-down answer at most."""


# ------------------------------------------------------------------- the answers' shapes


class LifeCause(WireModel):
    """The input a step was decided of, worded as the timeline words it."""

    position: int
    type: str
    text: str


class LifeStep(WireModel):
    """One step of an order's life: ``stage`` in a word or two, the event worded as the
    timeline words it, when (its input's time) and the input that caused it (null: the
    step is an input itself, a broker report or a control)."""

    stage: str
    position: int
    at: int | None
    type: str
    text: str
    cause: LifeCause | None


class OrderLifeJson(WireModel):
    """``GET /api/agents/{id}/orders/{orderId}``: the order's life, oldest step first, and
    the run that decided it (``GET /api/agents/{id}/runs/{runId}`` tells that run)."""

    agent_id: str
    order_id: str
    run_id: str
    intent: dict[str, Any] | None
    placed_at: int | None
    status: str
    """``open``, ``filled``, ``cancelled``, ``rejected``, or ``not placed`` (waiting for or
    refused at approval)."""
    steps: list[LifeStep]
    flatten_by: str | None = None
    """An operator's flatten placed it, not a run (``runId`` is empty): its request id."""


class RequestJson(WireModel):
    """A request a run was given (``missing``: its input was not found within reach)."""

    request_id: str
    missing: bool
    position: int | None = None
    at: int | None = None
    kind: str | None = None
    priority: str | None = None
    source: str | None = None
    principal: str | None = None
    payload: dict[str, Any] | None = None


class PromptJson(WireModel):
    """What the run started with: its requests, a summary of dropped ones, and the text the
    model was given for them (one JSON a line)."""

    requests: list[RequestJson]
    summary: dict[str, Any] | None
    text: str


class ToolCallJson(WireModel):
    """A tool call of a step: its arguments, and how it ended (``asked`` until it did)."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    malformed: str | None
    status: str
    result: str | None
    result_position: int | None


class StepJson(WireModel):
    """One model call of the run: its text, tokens, the steers it saw, its tool calls."""

    step: int
    position: int
    at: int
    text: str
    stop_reason: str | None
    input_tokens: int
    output_tokens: int
    steered: list[str]
    tool_calls: list[ToolCallJson]


class RunOrderJson(WireModel):
    """An order the run decided: accepted (with its id), waiting for approval, or refused."""

    order_id: str | None
    status: str
    reason: str | None
    intent: dict[str, Any]


class RunDetailJson(WireModel):
    """``GET /api/agents/{id}/runs/{runId}``: one run in full, from the log."""

    agent_id: str
    run_id: str
    position: int
    started_at: int | None
    ended_at: int | None
    outcome: str
    detail: str | None
    usage: dict[str, int]
    answer: str
    prompt: PromptJson
    steps: list[StepJson]
    steers: list[RequestJson]
    orders: list[RunOrderJson]


DRILL_ANSWERS: dict[str, type[WireModel]] = {"OrderLifeJson": OrderLifeJson,
                                               "RunDetailJson": RunDetailJson}
"""The drill-down answers by name, for the OpenAPI document."""


async def _back(store: LogReads, stream: str, top: int) -> AsyncIterator[RecordedEvent]:
    """The stream's events from version ``top`` down, newest first, `MAX_DRILL_SCAN` at
    most."""
    low, seen = top, 0
    while low > 0 and seen < MAX_DRILL_SCAN:
        page = await store.read_stream(stream, after_version=max(0, low - PAGE), limit=PAGE)
        page = [r for r in page if r.version <= low]
        if not page:
            return
        for record in reversed(page):
            seen += 1
            yield record
        low = page[0].version - 1


class _Kept:
    """What a scan back through a stream keeps: the records offered as wanted and, for each
    decision among them, the input it was decided of (the next input met going back), so
    that a long stream is never held whole."""

    def __init__(self) -> None:
        self.records: list[RecordedEvent] = []
        self.seen = 0
        self.wanting = False
        """A decision kept waits for its input."""

    def offer(self, record: RecordedEvent, wanted: bool) -> None:
        """The next record going back; kept if ``wanted`` or the input a kept one needs."""
        self.seen += 1
        is_input = record.type in _INPUT_NAMES
        if wanted or (self.wanting and is_input):
            self.records.append(record)
            self.wanting = not is_input

    def ordered(self) -> list[RecordedEvent]:
        """What was kept, in stream order."""
        return self.records[::-1]


def _step(stage: str, record: RecordedEvent, event: Event, cause: tuple[RecordedEvent, Event]
          | None, words: PriceWords) -> dict[str, Any]:
    """One step of a life: the event worded as the timeline words it, and its input."""
    if is_input(event):
        return {"stage": stage, "position": record.position, "at": event.at,
                "type": record.type, "text": what_came_in(event, words), "cause": None}
    at = None if cause is None else getattr(cause[1], "at", None)
    return {"stage": stage, "position": record.position, "at": at, "type": record.type,
            "text": explain(event, words),
            "cause": None if cause is None else {
                "position": cause[0].position, "type": cause[0].type,
                "text": what_came_in(cause[1], words)}}


def _stage(event: Event, order_id: str, approvals: set[str]) -> str | None:
    """What an event is in the life of ``order_id`` (None: not about it)."""
    match event:
        case ApprovalRequested(order_id=oid, approval_id=aid) if oid == order_id:
            approvals.add(aid)
            return "waiting for approval"
        case ApprovalDecided(approval_id=aid, approved=approved) if aid in approvals:
            return "approved" if approved else "rejected at approval"
        case OrderAccepted(order_id=oid) if oid == order_id:
            return "placed"
        case OrderCancelRequested(order_id=oid) if oid == order_id:
            return "cancel requested"
        case BrokerReport(order_id=oid, status=status) if oid == order_id:
            return f"broker: {status.replace('_', ' ')}"
        case OrderFilled(order_id=oid) if oid == order_id:
            return "filled"
        case OrderClosed(order_id=oid, status=status) if oid == order_id:
            return f"closed: {status}"
        case BrokerReportIgnored(order_id=oid) if oid == order_id:
            return "broker report ignored"
        case RequestReceived(request=request) if request.payload.get("orderId") == order_id:
            return f"{request.payload.get('action', 'control')} asked"
    return None


async def order_life(store: LogReads, reader: LogReader, agent_id: str, order_id: str,
                     top: int, words: PriceWords | None = None) -> dict[str, Any]:
    """The life of one order of ``agent_id`` (whose stream ends at version ``top``), oldest
    step first, with the run that decided it (prices to the ticks of ``words``);
    `BadFrame` ``not_found`` if no order of that id is in the stream's last
    `MAX_DRILL_SCAN` events."""
    kept = _Kept()
    run_id: str | None = None
    flatten_by: str | None = None
    async for record in _back(store, agent_id, top):
        mentions = order_id in record.data
        kept.offer(record, mentions or record.type == "ApprovalDecided")
        if run_id is None and mentions and record.type in ("OrderAccepted", "ApprovalRequested"):
            event = reader.decode(record)
            if isinstance(event, OrderAccepted | ApprovalRequested) and \
                    event.order_id == order_id:
                run_id = event.run_id
                flatten_by = getattr(event, "by", None)
        elif flatten_by is not None:  # no run to find: the flatten's request is enough
            if not kept.wanting:
                break
        elif run_id is not None and record.type == "RunStarted" and run_id in record.data:
            started = reader.decode(record)
            if isinstance(started, RunStarted) and started.run_id == run_id:
                break
    if run_id is None:
        raise BadFrame("not_found", f"no order {order_id!r} in the last {kept.seen:,} events "
                       f"of {agent_id}; the blotter lists its orders")
    steps: list[dict[str, Any]] = []
    approvals: set[str] = set()
    cause = _Cause(reader)
    intent: dict[str, Any] | None = None
    placed_at: int | None = None
    words = (words or PriceWords()).with_orders(OrderedDict())
    for record in kept.ordered():
        if record.type in _INPUT_NAMES:
            cause.record = record
        if order_id not in record.data and not any(a in record.data for a in approvals):
            continue
        event = reader.decode(record)
        stage = _stage(event, order_id, approvals)
        if stage is None:
            continue
        if isinstance(event, OrderAccepted | ApprovalRequested) and intent is None:
            intent = event.intent.model_dump(mode="json", by_alias=True)
            words.learn(event)
        step = _step(stage, record, event, cause.get(), words)
        if stage == "placed":
            placed_at = step["at"]
        steps.append(step)
    closed = next((s["stage"].removeprefix("closed: ") for s in reversed(steps)
                   if s["stage"].startswith("closed: ")), None)
    return {"agentId": agent_id, "orderId": order_id, "runId": run_id, "intent": intent,
            "placedAt": placed_at, "status": closed or ("open" if placed_at is not None
                                                         else "not placed"),
            "steps": steps, "flattenBy": flatten_by}


class _Cause:
    """The last input read, decoded only when a decision of interest follows it."""

    def __init__(self, reader: LogReader) -> None:
        self.reader = reader
        self.record: RecordedEvent | None = None
        self._decoded: tuple[RecordedEvent, Event] | None = None

    def get(self) -> tuple[RecordedEvent, Event] | None:
        """The last input and its event (None: none read yet)."""
        if self.record is None:
            return None
        if self._decoded is None or self._decoded[0] is not self.record:
            self._decoded = (self.record, self.reader.decode(self.record))
        return self._decoded


@dataclass(slots=True)
class _Run:
    """A run as the drill-down tells it, filled in from its events."""

    run_id: str
    position: int = 0
    started_at: int | None = None
    request_ids: list[str] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    steers: list[str] = field(default_factory=list)
    orders: list[dict[str, Any]] = field(default_factory=list)
    answer: str = ""
    outcome: str = "running"
    detail: str | None = None
    ended_at: int | None = None
    usage: dict[str, int] = field(default_factory=lambda: {"inputTokens": 0, "outputTokens": 0})


def _calls_of(run: _Run, step: int) -> dict[str, dict[str, Any]]:
    for entry in reversed(run.steps):
        if entry["step"] == step:
            return {c["callId"]: c for c in entry["toolCalls"]}
    return {}


def _fold_run(run: _Run, record: RecordedEvent, event: Event, now: int) -> bool:
    """Take one of the run's events in; True once the run has ended."""
    match event:
        case RunStarted(request_ids=ids, summary=folded):
            run.position, run.started_at, run.request_ids = record.position, now, list(ids)
            run.summary = None if folded is None else {
                "count": folded.count, "firstAt": folded.first_at, "lastAt": folded.last_at}
        case ModelCalled():
            run.steps.append({
                "step": event.step, "position": record.position, "at": event.at,
                "text": event.text, "stopReason": event.stop_reason,
                "inputTokens": event.input_tokens, "outputTokens": event.output_tokens,
                "steered": list(event.steered),
                "toolCalls": [{"callId": c.call_id, "name": c.name, "arguments": c.arguments,
                               "malformed": c.malformed, "status": "asked", "result": None,
                               "resultPosition": None} for c in event.tool_calls]})
        case StepDecided(step=step, refused=refused):
            calls = _calls_of(run, step)
            for refusal in refused:
                if refusal.call_id in calls:
                    calls[refusal.call_id].update(status="refused", result=refusal.error)
        case ToolReturned(step=step, call_id=call_id, ok=ok, content=content):
            call = _calls_of(run, step).get(call_id)
            if call is not None:
                call.update(status="returned" if ok else "failed", result=content,
                            resultPosition=record.position)
        case RunSteered(request_id=request_id):
            run.steers.append(request_id)
        case RunFinished(answer=answer):
            run.answer = answer
        case OrderAccepted(order_id=oid, intent=intent):
            run.orders.append({"orderId": oid, "status": "accepted", "reason": None,
                               "intent": intent.model_dump(mode="json", by_alias=True)})
        case OrderRejected(intent=intent, reason=reason):
            run.orders.append({"orderId": None, "status": "rejected", "reason": reason,
                               "intent": intent.model_dump(mode="json", by_alias=True)})
        case ApprovalRequested(order_id=oid, intent=intent):
            run.orders.append({"orderId": oid, "status": "waiting for approval",
                               "reason": None,
                               "intent": intent.model_dump(mode="json", by_alias=True)})
        case RunCompleted(outcome=outcome, usage=usage):
            run.outcome, run.ended_at = outcome.value, now
            run.usage = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}
            return True
        case RunFailed(error=error):
            run.outcome, run.detail, run.ended_at = "failed", error, now
            return True
        case RunAborted(reason=reason, by=by):
            run.outcome, run.ended_at = "aborted", now
            run.detail = reason.value + (f" by {by}" if by else "")
            return True
    return False


def _is_of(record: RecordedEvent, run_id: str) -> bool:
    return f'"{run_id}"' in record.data


async def run_detail(store: LogReads, reader: LogReader, agent_id: str, run_id: str,
                     top: int) -> dict[str, Any]:
    """One run of ``agent_id`` (whose stream ends at version ``top``) in full: its prompt
    (the requests it started with, as the model read them), each model call with its text and
    tool calls (arguments, results), the steers it took, its answer, orders and outcome;
    `BadFrame` ``not_found`` if it is not in the stream's last `MAX_DRILL_SCAN` events."""
    kept = _Kept()
    start: RecordedEvent | None = None
    async for record in _back(store, agent_id, top):
        kept.offer(record, _is_of(record, run_id))
        if start is not None and not kept.wanting:
            break  # (with the input it started on: when it started)
        if start is None and record.type == "RunStarted" and _is_of(record, run_id):
            started = reader.decode(record)
            if isinstance(started, RunStarted) and started.run_id == run_id:
                start = record
    if start is None:
        raise BadFrame("not_found", f"no run {run_id!r} in the last {kept.seen:,} events of "
                       f"{agent_id}; its run history lists its runs")
    run = _Run(run_id)
    cause = _Cause(reader)
    ended = False
    steer_inputs: dict[str, tuple[RecordedEvent, RequestReceived]] = {}
    for record in kept.ordered():
        if record.type in _INPUT_NAMES:
            if ended:
                break  # (the decisions of the input that ended it are in; nothing after)
            cause.record = record
        if not _is_of(record, run_id):
            continue
        event = reader.decode(record)
        made = cause.get()
        now = start.recorded_at if made is None else getattr(made[1], "at", start.recorded_at)
        if isinstance(event, RunSteered) and made is not None and \
                isinstance(made[1], RequestReceived):
            steer_inputs[event.request_id] = (made[0], made[1])
        ended = _fold_run(run, record, event, now) or ended
    prompts = await _requests(store, reader, agent_id, start.version, run.request_ids)
    return {
        "agentId": agent_id, "runId": run_id, "position": run.position,
        "startedAt": run.started_at, "endedAt": run.ended_at, "outcome": run.outcome,
        "detail": run.detail, "usage": run.usage, "answer": run.answer,
        "prompt": {"requests": [_request_json(*prompts[r]) if r in prompts else
                                {"requestId": r, "missing": True} for r in run.request_ids],
                   "summary": run.summary,
                   "text": render_requests([prompts[r][1].request for r in run.request_ids
                                            if r in prompts], None)},
        "steps": run.steps,
        "steers": [_request_json(*steer_inputs[r]) if r in steer_inputs else
                   {"requestId": r, "missing": True} for r in run.steers],
        "orders": run.orders,
    }


def _request_json(record: RecordedEvent, event: RequestReceived) -> dict[str, Any]:
    request = event.request
    return {"requestId": request.request_id, "position": record.position, "at": event.at,
            "kind": request.kind.value, "priority": request.priority.value,
            "source": request.source, "principal": event.principal,
            "payload": json.loads(json.dumps(request.payload)), "missing": False}


async def _requests(store: LogReads, reader: LogReader, agent_id: str, below: int,
                    wanted: Iterable[str]) -> dict[str, tuple[RecordedEvent, RequestReceived]]:
    """The `RequestReceived` inputs of the ``wanted`` request ids, looked for back from
    version ``below``."""
    missing = set(wanted)
    found: dict[str, tuple[RecordedEvent, RequestReceived]] = {}
    async for record in _back(store, agent_id, below - 1):
        if not missing:
            break
        if record.type != "RequestReceived" or not any(r in record.data for r in missing):
            continue
        event = reader.decode(record)
        if isinstance(event, RequestReceived) and event.request.request_id in missing:
            missing.discard(event.request.request_id)
            found[event.request.request_id] = (record, event)
    return found
