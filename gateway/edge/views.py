"""The JSON views of agents, provider gates, schedules, queues and events (camelCase, as
everything on the wire)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict
from enum import Enum
from typing import Any, TypeVar

import pydantic_core
from pydantic.alias_generators import to_camel

from gateway.edge.auth import Principal
from gateway.edge.protocol import EVENTS_PER_FRAME
from gateway.market.events import from_ms, iso
from gateway.reads.blocked import blocked_view
from gateway.runtime.engine import Engine
from gateway.runtime.gate import ProviderGate
from gateway.runtime.schedules import next_fire_at
from lanes import status
from lanes.gate import GateWait, gate_status, gate_waits
from lanes.state import AgentState
from store.port import RecordedEvent

log = logging.getLogger("gateway.edge.views")


def gate_waits_of(engine: Engine, now: int) -> dict[str, tuple[str, GateWait]]:
    """Agent id -> (provider, why its calls wait there), for the agents waiting at a gate."""
    return {agent_id: (name, wait) for name, gate in engine.gates.items()
            for agent_id, wait in gate_waits(gate.state, now).items()}


def agent_summary(state: AgentState, now: int, wait: tuple[str, GateWait] | None = None,
                  *, no_worker: bool = False) -> dict[str, Any]:
    """An agent's status as JSON (camelCase, as everything on the wire), with why it is
    blocked (``blocked``, ``attention``: see `gateway.reads.blocked`; ``wait`` is its provider and
    why its calls wait at that gate, if they do; ``no_worker``: a worker agent with no worker
    connected)."""
    view = status(state, now)
    body: dict[str, Any] = _camel(view)
    body["blocked"], body["attention"] = blocked_view(
        state, now, *(wait if wait is not None else (None, None)), no_worker=no_worker)
    body["budgets"] = state.config.budgets.model_dump(mode="json")
    book = state.calls
    body["calls"] = {"queued": len(book.queue), "out": book.out,
                     "ended": {s.value: n for s, n in book.ended.items()},
                     "answered": book.answered}
    return body


def _camel(value: Any) -> Any:
    """``value`` as JSON-ready data with camelCase keys: a dataclass as the dict of its
    fields (as `dataclasses.asdict` gives), dict keys camelCased, tuples as lists, enums as
    their values."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, dict):
        return {_camel_key(k): _camel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_camel(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    fields = _fields(kind)
    if fields is not None:
        return {camel: _camel(getattr(value, name)) for name, camel in fields}
    return value


_PLAIN = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _camel_key(key: str) -> str:
    return to_camel(key)


def _fields(kind: type) -> tuple[tuple[str, str], ...] | None:
    """A dataclass's field names, each with its camelCase key (None: not a dataclass)."""
    try:
        return _FIELDS[kind]
    except KeyError:
        fields = None if not dataclasses.is_dataclass(kind) else tuple(
            (f.name, _camel_key(f.name)) for f in dataclasses.fields(kind))
        _FIELDS[kind] = fields
        return fields


_FIELDS: dict[type, tuple[tuple[str, str], ...] | None] = {}


Item = TypeVar("Item")

JSON_ITEMS_PER_STEP = 20
"""The most items `json_pieces` renders before it lets other work run (an agent's summary
takes 40 to 175 µs here: 50 a step held the loop for 3 to 5 ms at 10,000 agents)."""
STEP_BUDGET_S = 0.0005
"""How long `json_pieces` renders before it lets other work run, whatever the count: on a
slow or busy machine 20 summaries took 3.5 ms. (A turn of the loop may also hold other
work's steps, a pass of the schedules, say: the budget leaves them room within 5 ms.)"""


async def json_pieces(items: Sequence[Item], render: Callable[[Item], Any],
                      encode: Callable[[list[Any]], str],
                      step: int = JSON_ITEMS_PER_STEP, budget_s: float | None = STEP_BUDGET_S,
                      clock: Callable[[], float] = time.perf_counter) -> AsyncIterator[str]:
    """The JSON text of ``[render(item) for item in items]`` in pieces (joined, they are that
    text), one piece per turn of the event loop: up to ``step`` items rendered and encoded
    (``encode``: a list to its JSON text), fewer once ``budget_s`` of ``clock`` has passed
    (None: no budget), so that a big desk's list never holds the loop for long (an
    emergency stop's frame waits at most one step). The first piece is rendered before
    anything is yielded, the last piece ends with ``]``; nothing ever joins them here (a 7
    MB join, or its encoding, held the loop for 10 ms and more)."""
    opening = "["
    start, count = 0, len(items)
    while start < count:
        if start:
            await asyncio.sleep(0)
        began, rendered = clock(), []
        for item in items[start:start + step]:
            rendered.append(render(item))
            if budget_s is not None and clock() - began >= budget_s:
                break
        start += len(rendered)
        text = encode(rendered)
        if len(text) > 2:
            yield opening + text[1:-1]
            opening = ","
    yield "[]" if opening == "[" else "]"


def starlette_json(value: Any) -> str:
    """``value`` as Starlette's `JSONResponse` encodes it (compact, UTF-8, no NaN)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":"))


def model_json(value: Any) -> str:
    """``value`` as a pydantic model encodes a member of type ``Any`` (`model_dump_json`)."""
    return pydantic_core.to_json(value).decode()


def provider_summary(name: str, gate: ProviderGate, now: int,
                     principal: Principal | None = None) -> dict[str, Any]:
    """A provider gate's status as JSON; waiting agents outside the principal's scope are
    counted but not named."""
    view = gate_status(gate.state, now)
    body: dict[str, Any] = _camel({**asdict(view), "limits": {}})
    body["name"] = name
    body["stream"] = gate.stream
    body["limits"] = view.limits.model_dump(mode="json")
    if principal is not None:
        body["waitingAgents"] = [a for a in body["waitingAgents"]
                                 if principal.may_see(a["agentId"])]
    return body


def schedules_view(state: AgentState, now: int) -> list[dict[str, Any]]:
    """An agent's schedules as JSON (`schedule_view` of each)."""
    return [schedule_view(state, schedule_id, now) for schedule_id in state.schedules]


def schedule_view(state: AgentState, schedule_id: str, now: int) -> dict[str, Any]:
    """One schedule as JSON: its definition, with ``lastFireAt``, ``nextFireAt`` (None while
    paused), ``fired``, ``since`` (ISO times) and ``fromFile``."""
    entry = state.schedules[schedule_id]
    view = entry.schedule.model_dump(mode="json", by_alias=True)
    next_at = next_fire_at(state, schedule_id, now)
    view.update(since=iso(from_ms(entry.since)), fired=entry.fired,
                lastFireAt=None if entry.last_fire is None else iso(from_ms(entry.last_fire)),
                nextFireAt=None if next_at is None else iso(from_ms(next_at)),
                fromFile=entry.from_file)
    return view


def queue_view(state: AgentState, now: int) -> dict[str, Any]:
    """Busy or not, the current run with its duration, the pending list with ages."""
    run = state.active
    return {
        "agentId": state.agent_id,
        "busy": run is not None,
        "trading": state.trading.value,
        "run": None if run is None else {
            "runId": run.run_id, "startedAt": run.started_at,
            "durationMs": max(0, now - run.started_at), "deadline": run.deadline,
            "steerable": run.steerable, "steers": run.steers,
            "requests": [p.request.request_id for p in run.requests],
        },
        "pending": [
            {"requestId": p.request.request_id, "kind": p.request.kind.value,
             "priority": p.request.priority.value, "mode": p.mode.value,
             "dedupeKey": p.request.dedupe_key, "ageMs": max(0, now - p.at)}
            for p in state.pending
        ],
    }


def event_json(record: RecordedEvent) -> dict[str, Any]:
    """A committed event as JSON."""
    return {"position": record.position, "stream": record.stream, "version": record.version,
            "type": record.type, "data": json.loads(record.data),
            "recordedAt": record.recorded_at}


FRAME_TEXT_BUDGET = 256 * 1024
"""An `EventsFrame` holds no more characters of events than this (unless one alone has)."""


def event_frame_text(record: RecordedEvent) -> str:
    """``record`` as the JSON text of an `EventFrame`, built around the stored JSON of its
    data: the same JSON as the model gives, without parsing and encoding the data again.

    Data that may not be strict JSON is encoded again as the model would: ``NaN`` and
    ``Infinity`` (an import before they were refused could store them) become ``null``.
    Data that is not a JSON object raises `ValueError`."""
    data = record.data
    if not (data.startswith("{") and data.endswith("}")) or "NaN" in data or \
            "Infinity" in data:
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError(f"the data of the event at position {record.position} is not "
                             "a JSON object")
        data = pydantic_core.to_json(value, inf_nan_mode="null").decode()
    return (f'{{"type":"event","position":{record.position},"stream":{json.dumps(record.stream)},'
            f'"version":{record.version},"eventType":{json.dumps(record.type)},'
            f'"data":{data},"recordedAt":{record.recorded_at}}}')


def events_frames(texts: list[str]) -> Iterator[str]:
    """The texts of `EventsFrame`s holding the event frame ``texts`` in order: at most
    `EVENTS_PER_FRAME` events and about `FRAME_TEXT_BUDGET` characters each."""
    start = size = 0
    for index, text in enumerate(texts):
        if index > start and (index - start == EVENTS_PER_FRAME
                              or size + len(text) > FRAME_TEXT_BUDGET):
            yield '{"type":"events","events":[' + ",".join(texts[start:index]) + "]}"
            start, size = index, 0
        size += len(text)
    if start < len(texts):
        yield '{"type":"events","events":[' + ",".join(texts[start:]) + "]}"
