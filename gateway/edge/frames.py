"""Client frames as they come off a WebSocket: their raw data, their id, and their validation
into the models of `gateway.edge.protocol` (a batch frame's items a step at a time)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.edge.protocol import CLIENT_FRAME, CLIENT_TYPES, MAX_BATCH, load_json
from gateway.errors import BadFrame
from gateway.market.events import MarketEvent
from lanes import AgentRequest, InvalidRequest
from lanes.requests import FieldError

Turn = Callable[[], contextlib.AbstractAsyncContextManager[None]]
"""A turn of the pacer (or nothing to wait for): what bulk work runs in."""

NO_TURN = contextlib.nullcontext()
"""The turn of a connection that is not paced."""
WORK_TYPES = frozenset({"submit", "submit_many", "market"})
"""Frame types that make work for the log (a feed connection's are admitted by the intake)."""
VALIDATE_STEP = 50
"""Items of a batch frame validated before other work may run (well under 1 ms of the loop)."""
BATCHES: dict[str, tuple[str, TypeAdapter[Any]]] = {
    "submit_many": ("requests", TypeAdapter(AgentRequest)),
    "market": ("events", TypeAdapter(MarketEvent)),
}
"""The list member of each batch frame and the model of its items."""


def makes_work(data: Any) -> bool:
    """Whether a frame's JSON value is a frame that makes work for the log (its ``type``
    may be any JSON value: a list or an object is no frame type, and no error here)."""
    kind = data.get("type") if isinstance(data, dict) else None
    return isinstance(kind, str) and kind in WORK_TYPES


def stepped(data: Any) -> bool:
    """Whether a frame's JSON value is a batch whose items are validated in steps (more
    than `VALIDATE_STEP` of them, and not more than a frame may carry)."""
    if not isinstance(data, dict):
        return False
    kind = data.get("type")
    batch = BATCHES.get(kind) if isinstance(kind, str) else None
    items = data.get(batch[0]) if batch is not None else None
    return isinstance(items, list) and VALIDATE_STEP < len(items) <= MAX_BATCH


def validate_now(data: Any) -> Any:
    """The client frame of a frame's JSON value, validated at once (`InvalidRequest` /
    `BadFrame`)."""
    return typed_frame(data, CLIENT_TYPES, CLIENT_FRAME, "expected one of")


def typed_frame(data: Any, types: Sequence[str], adapter: TypeAdapter[Any],
                expected: str) -> Any:
    """A frame of one of ``types`` from its JSON value, by ``adapter`` (`BadFrame` for no
    JSON object or an unknown type, saying the types ``expected``; `InvalidRequest` naming
    each field that is wrong)."""
    if not isinstance(data, dict):
        raise BadFrame("invalid", "a frame is a JSON object with a 'type'", field="type")
    kind = data.get("type")
    if kind not in types:
        raise BadFrame("unknown_type", f"unknown frame type {kind!r}; {expected} "
                       f"{', '.join(types)}", field="type")
    try:
        return adapter.validate_python(data)
    except ValidationError as error:
        invalid = InvalidRequest.from_validation_error(error)
        # Drop the frame type pydantic puts first in each location ("submit.request...").
        raise InvalidRequest([FieldError(e.field.split(".", 1)[-1], e.message)
                              for e in invalid.errors]) from None


async def validate_frame(data: Any, turn: Turn) -> Any:
    """The client frame of a frame's JSON value (`InvalidRequest` / `BadFrame`); the items
    of a big batch `VALIDATE_STEP` at a time, each step in a ``turn``."""
    if stepped(data):
        batch = BATCHES[data["type"]]
        data = {**data, batch[0]: await validate_items(batch[0], batch[1], data[batch[0]],
                                                        turn)}
    async with turn():
        return validate_now(data)


async def validate_items(name: str, adapter: TypeAdapter[Any], items: list[Any],
                         turn: Turn) -> list[Any]:
    """The items of a batch frame validated `VALIDATE_STEP` at a time, each step in a
    ``turn`` (other work runs in between); `InvalidRequest` naming each bad field
    (``requests.3.kind``) as the frame's own validation would."""
    checked: list[Any] = []
    errors: list[FieldError] = []
    for start in range(0, len(items), VALIDATE_STEP):
        if start:
            await asyncio.sleep(0)
        async with turn():
            for index in range(start, min(start + VALIDATE_STEP, len(items))):
                try:
                    checked.append(adapter.validate_python(items[index]))
                except ValidationError as error:
                    errors += [FieldError(f"{name}.{index}" if e.field == "(request)"
                                          else f"{name}.{index}.{e.field}", e.message)
                               for e in InvalidRequest.from_validation_error(error).errors]
    if errors:
        raise InvalidRequest(errors)
    return checked


def raw_data(message: Any) -> str | bytes:
    """The data of a WebSocket message: text, or the bytes of a binary frame (read as
    UTF-8 by `load_json`, which refuses anything else)."""
    text = message.get("text")
    if text is not None:
        return str(text)
    return bytes(message.get("bytes") or b"")


def guess_id(raw: str | bytes) -> str | None:
    """The client's frame id, if the frame is JSON enough to have one."""
    with contextlib.suppress(BadFrame):
        value = load_json(raw)
        if isinstance(value, dict):
            return frame_id(value)
    return None


def frame_id(data: dict[str, Any]) -> str | None:
    """The ``id`` of a frame's JSON object, if it is one a client may give."""
    found = data.get("id")
    return found if isinstance(found, str) and len(found) <= 128 else None
