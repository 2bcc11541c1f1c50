"""Histories read from the log for people: an agent's runs (gate wait, model time, tokens,
orders, answer), per-agent time series with stop and resume annotations, and a bounded
search over the whole log.

Everything here is derived from recorded events, read in pages through the store's port,
never the whole log at once; each reader has a cap on the events it reads for one answer and
says when it stopped short. What a page shows from these survives a reload.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lanes.events import INPUT_TYPES
from lanes.gate.events import GATE_INPUT_TYPES
from store.port import LogReads, RecordedEvent

PAGE = 1_000
"""Events read per step."""
MAX_RUN_SCAN = 50_000
"""Events of an agent's stream read for one page of its runs."""
MAX_GATE_SCAN = 20_000
"""Events of a provider gate's stream read to time one run."""
MAX_SERIES_SCAN = 200_000
"""Events of one agent's stream read for its series."""
MAX_SEARCH_SCAN = 100_000
"""Events of the log looked at for one page of search results."""
MAX_BUCKETS = 1_000
"""Points of one series."""
SERIES = ("runs", "tokens", "requests", "drops", "failures")
"""The per-agent series: runs started, tokens used by completed runs (input + output),
requests received, requests dropped, runs failed or aborted, per step."""

_AGENT_INPUTS = frozenset(t.__name__ for t in INPUT_TYPES)
_GATE_INPUTS = frozenset(t.__name__ for t in GATE_INPUT_TYPES)
_RUN_ENDS = frozenset({"RunCompleted", "RunFailed", "RunAborted"})
ANNOTATED = {"emergency_stop": "stop", "pause": "pause", "resume": "resume"}
"""Control actions marked on the charts, by the kind of mark."""


def _data(record: RecordedEvent) -> dict[str, Any]:
    value = json.loads(record.data)
    return value if isinstance(value, dict) else {}


async def first_version(store: LogReads, stream: str, top: int,
                        reached: Callable[[RecordedEvent], bool]) -> int:
    """The lowest version of ``stream`` (1..``top``) whose event has ``reached`` (a test
    that holds from some version on, such as "position at least P"), or ``top + 1``: a
    binary search of a few single-event reads."""
    low, high = 1, top + 1
    while low < high:
        middle = (low + high) // 2
        found = await store.read_stream(stream, after_version=middle - 1, limit=1)
        if not found or reached(found[0]):
            high = middle
        else:
            low = middle + 1
    return low


# ------------------------------------------------------------------------------- runs


@dataclass
class _Slot:
    requested: int
    granted: int | None = None


@dataclass
class _Run:
    run_id: str
    version: int
    position: int
    started_at: int
    request_ids: list[str]
    depth: int
    ended_at: int | None = None
    end_position: int | None = None
    outcome: str = "running"
    detail: str | None = None
    by: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    answer: str = ""
    orders: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    steers: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    """A tool loop's steps: each model call with its tool calls and how each ended."""
    wait_ms: int = 0
    model_ms: int = 0
    slots: int = 0
    refused: int = 0
    gate_complete: bool = True
    """Whether the gate's log was read to the end of the run's slots."""

    def json(self, gated: bool) -> dict[str, Any]:
        ended = self.ended_at
        return {
            "runId": self.run_id, "version": self.version, "position": self.position,
            "startedAt": self.started_at, "endedAt": ended,
            "durationMs": None if ended is None else max(0, ended - self.started_at),
            "outcome": self.outcome, "detail": self.detail, "by": self.by,
            "requests": self.request_ids, "depth": self.depth, "steers": self.steers,
            "usage": {"inputTokens": self.input_tokens, "outputTokens": self.output_tokens},
            "gate": None if not gated else {
                "waitMs": self.wait_ms, "modelMs": self.model_ms, "calls": self.slots,
                "refused": self.refused, "complete": self.gate_complete},
            "orders": self.orders, "calls": self.calls, "answer": self.answer,
            "steps": self.steps,
        }


class _RunFold:
    """Runs from an agent's events, fed in version order (each decision at the time of the
    input before it)."""

    def __init__(self) -> None:
        self.runs: dict[str, _Run] = {}
        self.now: int | None = None
        """The time of the last input fed (None: none yet, the recorded time stands in)."""
        self.last: _Run | None = None

    def feed(self, record: RecordedEvent) -> None:
        kind = record.type
        if kind not in _AGENT_INPUTS and kind not in _RUN_EVENTS:
            return
        data = _data(record)
        if kind in _AGENT_INPUTS:
            self.now = int(data.get("at", record.recorded_at))
        now = record.recorded_at if self.now is None else self.now
        run = self.runs.get(str(data.get("run_id", "")))
        if kind == "RunStarted":
            run = _Run(run_id=str(data["run_id"]), version=record.version,
                       position=record.position, started_at=now,
                       request_ids=list(data.get("request_ids", ())),
                       depth=int(data.get("depth", 0)))
            self.runs[run.run_id] = self.last = run
        elif run is None:
            return
        elif kind == "RunFinished":
            run.answer = str(data.get("answer", ""))
        elif kind in _RUN_ENDS:
            run.ended_at, run.end_position = now, record.position
            if kind == "RunCompleted":
                run.outcome = str(data["outcome"])
                usage = data.get("usage", {})
                run.input_tokens = int(usage.get("inputTokens", 0))
                run.output_tokens = int(usage.get("outputTokens", 0))
            elif kind == "RunFailed":
                run.outcome, run.detail = "failed", str(data.get("error", ""))
            else:
                run.outcome, run.detail = "aborted", str(data.get("reason", ""))
                run.by = data.get("by")
        elif kind == "OrderAccepted":
            run.orders.append({**_intent(data), "orderId": data["order_id"],
                               "status": "accepted"})
        elif kind == "OrderRejected":
            run.orders.append({**_intent(data), "status": "rejected",
                               "reason": data.get("reason")})
        elif kind in ("AgentCallDispatched", "AgentCallRejected"):
            run.calls += 1
        elif kind == "RunSteered":
            run.steers += 1
        elif kind in _STEP_EVENTS:
            _step(run, kind, data)
        elif kind == "ApprovalRequested":
            run.orders.append({**_intent(data), "orderId": data["order_id"],
                               "status": "waiting for approval"})


_STEP_EVENTS = frozenset({"ModelCalled", "StepDecided", "ToolReturned"})
_RUN_EVENTS = frozenset({"RunStarted", "RunFinished", "OrderAccepted", "OrderRejected",
                         "AgentCallDispatched", "AgentCallRejected", "RunSteered",
                         "ApprovalRequested"}) | _RUN_ENDS | _STEP_EVENTS


def _step(run: _Run, kind: str, data: dict[str, Any]) -> None:
    """A step event of a tool loop, into ``run.steps``."""
    if kind == "ModelCalled":
        run.steps.append({
            "step": int(data.get("step", len(run.steps) + 1)),
            "tokens": int(data.get("input_tokens", 0)) + int(data.get("output_tokens", 0)),
            "steered": len(data.get("steered", ())),
            "tools": [{"callId": c.get("callId"), "name": c.get("name"), "status": "asked"}
                      for c in data.get("tool_calls", ())]})
        return
    if not run.steps:
        return
    tools = {t["callId"]: t for t in run.steps[-1]["tools"]}
    if kind == "StepDecided":
        for refusal in data.get("refused", ()):
            tool = tools.get(refusal.get("callId"))
            if tool is not None:
                tool["status"], tool["detail"] = "refused", str(refusal.get("error", ""))[:300]
    else:
        tool = tools.get(data.get("call_id"))
        if tool is not None:
            tool["status"] = "returned" if data.get("ok") else "failed"
            tool["detail"] = str(data.get("content", ""))[:300]


def _intent(data: dict[str, Any]) -> dict[str, Any]:
    intent = data.get("intent", {})  # (a wire model: camelCase, as it is sent)
    return {"symbol": intent.get("symbol"), "side": intent.get("side"),
            "qty": intent.get("qty"), "orderType": intent.get("orderType", "market"),
            "limitPrice": intent.get("limitPrice")}


async def run_history(store: LogReads, agent_id: str, top: int, *, before: int | None,
                      limit: int, gate: tuple[str, int] | None) -> dict[str, Any]:
    """The agent's newest ``limit`` runs started below version ``before`` (default: all),
    newest first, each with its outcome, tokens, orders, answer and (through ``gate``: the
    provider gate's stream and version) the time it waited for the gate and the time the
    model took. ``before`` in the answer pages on (None: no older run)."""
    ceiling = top if before is None else min(top, before - 1)
    back: list[RecordedEvent] = []
    started, done = 0, False
    low = ceiling
    while low > 0 and len(back) < MAX_RUN_SCAN:
        page = await store.read_stream(agent_id, after_version=max(0, low - PAGE), limit=PAGE)
        for record in reversed([r for r in page if r.version <= low]):
            back.append(record)
            if record.type == "RunStarted":
                started += 1
                if started > limit:  # one more than asked: there are older runs
                    done = True
                    break
        low = back[-1].version - 1 if back else 0
        if done or not page:
            break
    fold = _RunFold()
    for record in reversed(back):
        fold.feed(record)
    newest = fold.last
    after, scanned = ceiling, 0
    stop = newest is None or ceiling >= top
    while not stop and scanned < MAX_RUN_SCAN:  # the newest run's end lies above the ceiling
        page = await store.read_stream(agent_id, after_version=after, limit=PAGE)
        if not page:
            break
        for record in page:
            if record.type == "RunStarted" or (newest is not None and newest.ended_at
                                               is not None and record.type in _AGENT_INPUTS):
                stop = True
                break
            fold.feed(record)
        after = page[-1].version
        scanned += len(page)
    found = sorted(fold.runs.values(), key=lambda r: r.version, reverse=True)
    runs = found[:limit]
    if gate is not None:
        for run in runs:
            run.gate_complete = await _time_at_gate(store, agent_id, gate, run)
    if len(found) > limit:
        more: int | None = runs[-1].version
    else:  # all there are, or the read stopped short at ``low``
        more = low + 1 if low > 0 else None
    return {"agentId": agent_id,
            "runs": [r.json(gate is not None) for r in runs],
            "before": more}


async def _time_at_gate(store: LogReads, agent_id: str, gate: tuple[str, int],
                        run: _Run) -> bool:
    """Add the run's gate wait and model time from the gate's stream, reading only the
    stretch of it from the run's start until its slots are all freed after its end (found
    by a binary search on positions); False if the read stopped short."""
    stream, top = gate
    end = run.end_position
    version = await first_version(store, stream, top, lambda r: r.position >= run.position)
    slots: dict[str, _Slot] = {}
    now, scanned = 0, 0
    while scanned < MAX_GATE_SCAN:
        page = await store.read_stream(stream, after_version=version - 1, limit=PAGE)
        if not page:
            return True
        for record in page:
            if end is not None and record.position > end and not slots:
                return True
            data = _data(record)
            if record.type in _GATE_INPUTS:
                now = int(data.get("at", now))
            slot_id = str(data.get("slot_id", ""))
            if record.type == "SlotRequested":
                if data.get("run_id") == run.run_id and data.get("agent_id") == agent_id:
                    slots[slot_id] = _Slot(requested=now)
                continue
            slot = slots.get(slot_id)
            if slot is None:
                continue
            if record.type == "SlotGranted":
                slot.granted = now
                run.wait_ms += now - slot.requested
                run.slots += 1
            elif record.type in ("SlotFreed", "SlotRefused"):
                if slot.granted is None:
                    run.wait_ms += now - slot.requested
                else:
                    run.model_ms += now - slot.granted
                if record.type == "SlotRefused":
                    run.refused += 1
                del slots[slot_id]
        version = page[-1].version + 1
        scanned += len(page)
    return False


# ----------------------------------------------------------------------------- series


async def agent_series(store: LogReads, agent_id: str, top: int, *, start: int, end: int,
                       step: int) -> dict[str, Any]:
    """One agent's `SERIES` over [``start``, ``end``) in buckets of ``step`` ms, by
    recorded time, and its stop, pause, resume and hold marks (who and when)."""
    buckets = -(-(end - start) // step)
    series = {name: [0] * buckets for name in SERIES}
    marks: list[dict[str, Any]] = []
    version = await first_version(store, agent_id, top, lambda r: r.recorded_at >= start)
    principal: str | None = None
    scanned, truncated = 0, False
    while True:
        if scanned >= MAX_SERIES_SCAN:
            truncated = True
            break
        page = await store.read_stream(agent_id, after_version=version - 1, limit=PAGE)
        if not page:
            break
        for record in page:
            at = record.recorded_at
            if at >= end:
                page = []
                break
            kind = record.type
            if kind == "RequestReceived":
                principal = _data(record).get("principal")
            if at < start:
                continue
            index = (at - start) // step
            if kind == "RunStarted":
                series["runs"][index] += 1
            elif kind == "RunCompleted":
                usage = _data(record).get("usage", {})
                series["tokens"][index] += int(usage.get("inputTokens", 0)) + \
                    int(usage.get("outputTokens", 0))
            elif kind == "RequestReceived":
                series["requests"][index] += 1
            elif kind == "RequestDropped":
                series["drops"][index] += 1
            elif kind in ("RunFailed", "RunAborted"):
                series["failures"][index] += 1
            elif kind in ("ControlApplied", "RunsHeld", "RunsUnheld"):
                mark = _mark(record, principal)
                if mark is not None:
                    marks.append(mark)
        if not page:
            break
        version = page[-1].version + 1
        scanned += len(page)
    return {"agentId": agent_id, "series": series, "marks": marks, "truncated": truncated}


def _mark(record: RecordedEvent, principal: str | None) -> dict[str, Any] | None:
    data = _data(record)
    base = {"at": record.recorded_at, "agentId": record.stream, "position": record.position,
            "by": principal}
    if record.type == "ControlApplied":
        kind = ANNOTATED.get(str(data.get("action")))
        if kind is None or data.get("from_state") == data.get("to_state"):
            return None  # (a control that changed nothing, a stop of a HALTED agent: no mark)
        return {**base, "kind": kind, "action": data["action"], "from": data.get("from_state"),
                "to": data.get("to_state")}
    if record.type == "RunsHeld":
        return {**base, "kind": "held", "action": "held", "by": data.get("provider"),
                "from": data.get("from_state"), "to": data.get("to_state"),
                "detail": data.get("reason")}
    return {**base, "kind": "resume", "action": "hold lifted"}


# ----------------------------------------------------------------------------- search


def event_matcher(text: str | None, agent: str | None, kind: str | None,
                  visible: Callable[[str], bool]) -> Callable[[RecordedEvent], bool]:
    """Whether an event passes a search: in a stream the caller may see, of the agent and
    type asked for, with ``text`` (any case) in its type, stream or data (request ids,
    order ids, reasons, payloads)."""
    needle = (text or "").strip().lower()

    def matches(record: RecordedEvent) -> bool:
        if agent is not None and record.stream != agent:
            return False
        if kind is not None and record.type != kind:
            return False
        if needle and needle not in record.type.lower() and \
                needle not in record.stream.lower() and needle not in record.data.lower():
            return False
        return visible(record.stream)

    return matches


async def search_back(read: Callable[[int, int], Awaitable[list[RecordedEvent]]],
                      before: int, limit: int,
                      matches: Callable[[RecordedEvent], bool]) -> tuple[
                          list[RecordedEvent], int | None, int]:
    """The newest ``limit`` events below position ``before`` that match, newest first,
    looking at `MAX_SEARCH_SCAN` events at most: (found, where to go on (None: the start
    of the log was reached), how many were looked at). ``read(after, limit)`` is the
    store's."""
    found: list[RecordedEvent] = []
    cursor, scanned = before, 0
    while cursor > 1 and scanned < MAX_SEARCH_SCAN:
        size = min(PAGE, cursor - 1)
        page = await read(cursor - 1 - size, size)
        if not page:
            return found, None, scanned
        for record in reversed(page):
            if record.position >= cursor:
                continue
            if scanned == MAX_SEARCH_SCAN:
                return found, cursor, scanned
            scanned += 1
            cursor = record.position
            if matches(record):
                found.append(record)
                if len(found) == limit:
                    return found, (cursor if cursor > 1 else None), scanned
        cursor = min(cursor, page[0].position)
    return found, (cursor if cursor > 1 else None), scanned
