"""The AgentRequest: what arrives at an agent, validated strictly at the edge."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

AGENT_ID_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
"""Agent ids: short, no spaces, no colons (``provider:...`` streams never collide)."""


MAX_JSON_DEPTH = 32
"""How deeply free-form JSON (a request's payload, a call's payload) may nest."""
MIN_INT = -(1 << 63)
MAX_INT = (1 << 63) - 1
"""Integers in free-form JSON: what a 64-bit signed integer (SQLite's, PostgreSQL's) holds."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9999, 1, 1, tzinfo=UTC)


def plain_json(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is JSON that reads back equal: plain dicts (string keys), lists,
    strings without lone surrogates, 64-bit integers, finite floats, booleans and None,
    at most `MAX_JSON_DEPTH` levels deep. Exact types only: a subclass is not known.
    (Written out, scalars in place: it runs on every request's payload, twice: validation
    asks it before `_json_problem` looks for what is wrong, `lanes.repeatable` at the log's
    door.)"""
    kind = type(value)
    if kind is dict:
        if depth >= MAX_JSON_DEPTH:
            return False
        for key in value:
            if type(key) is not str or not (key.isascii() or _SURROGATE.search(key) is None):
                return False
        items: Iterable[Any] = value.values()
    elif kind is list:
        if depth >= MAX_JSON_DEPTH:
            return False
        items = value
    else:
        return _scalar(value, kind)
    depth += 1
    for item in items:
        kind = type(item)
        if kind is dict or kind is list:
            if not plain_json(item, depth):
                return False
        elif not _scalar(item, kind):
            return False
    return True


def _scalar(value: Any, kind: type[Any]) -> bool:
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    if kind is int:
        return bool(MIN_INT <= value <= MAX_INT)
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is bool


def _json_problem(value: Any, path: str, depth: int) -> str | None:
    """What makes ``value`` unfit to be stored as JSON and read back the same, if anything."""
    if isinstance(value, str):
        return f"{path}: a lone UTF-16 surrogate is not text" if _SURROGATE.search(value) \
            else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if MIN_INT <= value <= MAX_INT else \
            f"{path}: integer out of the 64-bit range (-2^63 to 2^63-1)"
    if isinstance(value, float):
        return None if math.isfinite(value) else \
            f"{path}: {value} is not a finite number (JSON has no NaN or Infinity)"
    if isinstance(value, dict | list):
        if depth >= MAX_JSON_DEPTH:
            return f"{path}: nested deeper than {MAX_JSON_DEPTH} levels"
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and not isinstance(key, str):
                return f"{path}: key {key!r} is not a string"
            if isinstance(key, str) and _SURROGATE.search(key):
                return f"{path}: a key holds a lone UTF-16 surrogate, which is not text"
            found = _json_problem(item, f"{path}.{key}", depth + 1)
            if found is not None:
                return found
        return None
    return f"{path}: {type(value).__name__} is not a JSON value"


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    if plain_json(value):
        return value
    problem = _json_problem(value, "payload", 0)
    if problem is not None:
        raise PydanticCustomError("json_value", "{problem}", {"problem": problem})
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
"""A free-form JSON object that is stored and read back exactly: at most `MAX_JSON_DEPTH`
levels deep, finite numbers, integers in the 64-bit range, strings without lone surrogates."""


def _timestamp_given(value: Any) -> Any:
    if isinstance(value, str | datetime):
        return value
    raise PydanticCustomError(
        "timestamp_type", "expected an ISO 8601 date-time string with a time zone, such as "
        "2026-02-17T03:10:00Z (numbers are not taken: their unit and precision are unclear)")


def in_range(value: datetime) -> bool:
    """Whether an aware date-time is from 1970-01-01 to before 9999-01-01 (UTC)."""
    # (an offset is under a day: only the first and last years need the exact comparison,
    # which costs ten times the year's)
    return 1970 < value.year < 9998 or _EARLIEST <= value < _LATEST


def _timestamp_range(value: datetime) -> datetime:
    if not in_range(value):
        raise PydanticCustomError("timestamp_range",
                                  "a date-time between 1970-01-01 and 9999-01-01 (UTC)")
    return value


Timestamp = Annotated[AwareDatetime, BeforeValidator(_timestamp_given),
                      AfterValidator(_timestamp_range)]
"""A date-time with a time zone, given as an ISO 8601 string, from 1970 to 9999."""


class Kind(StrEnum):
    """What kind of request this is; decides the default dedupe strategy."""

    USER_CONTROL = "user_control"
    HOOK_TRIGGER = "hook_trigger"
    SCHEDULED_AUDIT = "scheduled_audit"
    SYSTEM_ALERT = "system_alert"
    AGENT_CALL = "agent_call"
    CALL_RESULT = "call_result"
    """The result of a sub-agent call, on its way back to the agent that made it."""
    CALL_CANCEL = "call_cancel"
    """The agent that made a call gave up on it (stopped, or the call timed out): its
    target drops the work still to do for it."""
    APPROVAL_RESULT = "approval_result"
    """A human approved or rejected one of the agent's orders (or it expired): the outcome,
    on its way to the agent's reasoning lane."""


class Priority(StrEnum):
    """Orders the pending list, decides preemption (only high) and drops (low first)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


RANK: dict[Priority, int] = {Priority.HIGH: 2, Priority.NORMAL: 1, Priority.LOW: 0}


class ControlAction(StrEnum):
    """Actions of the control lane: applied on arrival, never behind a run."""

    EMERGENCY_STOP = "emergency_stop"
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL_ORDER = "cancel_order"
    CANCEL_ALL = "cancel_all"
    APPROVE = "approve"
    """Let an order waiting for approval go to the trading gate (``approvalId``)."""
    REJECT = "reject"
    """Refuse an order waiting for approval (``approvalId``, an optional ``reason``)."""
    FLATTEN = "flatten"
    """The operator's: cancel every open order and close every position with a market
    order (in every trading state, HALTED too: it only reduces). See `lanes.flatten`."""


class WireModel(BaseModel):
    """Base of every wire model: camelCase on the wire, unknown fields rejected, frozen."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )


IfBusy = Literal["followup", "queue", "interrupt", "collect", "steer", "steer-backlog",
                 "reject"]
"""What a request asks for itself when its agent is busy: one of the modes (under that
mode's rules: ``interrupt`` preempts only at high priority), or ``reject``."""
IF_BUSY: frozenset[str] = frozenset(get_args(IfBusy))


class AgentRequest(WireModel):
    """One request for one agent. ``payload`` is free-form except where its kind says.

    A ``user_control`` payload names either an ``action`` (control lane) or a ``message``
    (reasoning lane); ``cancel_order`` needs an ``orderId``. An ``agent_call`` payload may
    carry ``depth`` (an integer >= 1, default 1). A ``call_result`` payload is one call's
    result (``callId``, ``status``, ...) or the results a run awaited (``results``), with the
    ``depth`` of the run that made the calls.
    """

    request_id: str = Field(min_length=1, max_length=128)
    created_at: Timestamp
    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    kind: Kind
    priority: Priority = Priority.NORMAL
    dedupe_key: str | None = Field(default=None, min_length=1, max_length=512)
    message_id: str | None = Field(default=None, min_length=1, max_length=256)
    source: str | None = Field(default=None, max_length=256)
    payload: JsonObject = Field(default_factory=dict, validate_default=True)
    if_busy: IfBusy | None = Field(default=None, exclude_if=lambda value: value is None)
    """Overrides the agent's mode for this request while the agent is busy (`IfBusy`);
    stored only when set."""

    @field_validator("payload")
    @classmethod
    def _payload_fits_kind(cls, payload: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        problem = payload_problem(info.data.get("kind"), payload)
        if problem is not None:
            raise ValueError(problem)
        return payload

    @property
    def action(self) -> ControlAction | None:
        """The control action this request names, if any."""
        if self.kind is Kind.USER_CONTROL and "action" in self.payload:
            return ControlAction(self.payload["action"])
        return None

    @property
    def depth(self) -> int:
        """Sub-agent call depth: 0 for requests that are not agent calls (a call's result
        runs at the depth of the run that made the call)."""
        if self.kind is Kind.AGENT_CALL:
            return int(self.payload.get("depth", 1))
        if self.kind is Kind.CALL_RESULT:
            return int(self.payload.get("depth", 0))
        return 0


def payload_problem(kind: Any, payload: dict[str, Any]) -> str | None:
    """What a payload lacks for a request of ``kind``, if anything."""
    if kind == Kind.USER_CONTROL:
        action = payload.get("action")
        if "action" not in payload:
            if not isinstance(payload.get("message"), str):
                return ("a user_control payload needs an 'action' "
                        f"({', '.join(a.value for a in ControlAction)}) or a 'message' string")
        elif action not in ControlAction.__members__.values():
            return (f"unknown action {action!r}; expected one of "
                    f"{', '.join(a.value for a in ControlAction)}")
        elif action == ControlAction.CANCEL_ORDER and not isinstance(payload.get("orderId"),
                                                                     str):
            return "cancel_order needs an 'orderId' string"
        elif action in (ControlAction.APPROVE, ControlAction.REJECT) and not isinstance(
                payload.get("approvalId"), str):
            return f"{action} needs an 'approvalId' string"
        elif action in (ControlAction.APPROVE, ControlAction.REJECT) and not isinstance(
                payload.get("reason", ""), str):
            return "'reason' must be a string"
    elif kind == Kind.AGENT_CALL and "depth" in payload:
        depth = payload["depth"]
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            return "'depth' must be an integer >= 1"
    elif kind == Kind.CALL_RESULT:
        if not isinstance(payload.get("callId"), str) and not isinstance(
                payload.get("results"), list):
            return ("a call_result payload needs a 'callId' string (one result) or a "
                    "'results' list")
        depth = payload.get("depth", 0)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            return "'depth' must be an integer >= 0"
    elif kind == Kind.CALL_CANCEL and not isinstance(payload.get("callId"), str):
        return "a call_cancel payload needs a 'callId' string"
    elif kind == Kind.APPROVAL_RESULT and not (
            isinstance(payload.get("approvalId"), str)
            and isinstance(payload.get("approved"), bool)):
        return "an approval_result payload needs an 'approvalId' string and 'approved'"
    return None


@dataclass(frozen=True, slots=True)
class FieldError:
    """One thing wrong with a request: the field (dotted path) and what was wrong."""

    field: str
    message: str


class InvalidRequest(ValueError):
    """A request failed validation; ``errors`` names each offending field."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))

    @classmethod
    def from_validation_error(cls, error: ValidationError) -> InvalidRequest:
        """Turn pydantic's error list into field-named errors (wire names, dotted)."""
        errors = []
        for item in error.errors(include_url=False):
            field = ".".join(str(part) for part in item["loc"]) or "(request)"
            message = item["msg"]
            if item["type"] == "extra_forbidden":
                message = "unknown field; remove it"
            errors.append(FieldError(field, message))
        return cls(errors)


def parse_request(data: Mapping[str, Any]) -> AgentRequest:
    """Validate a wire request (camelCase keys); raise `InvalidRequest` naming the fields."""
    try:
        return AgentRequest.model_validate(data)
    except ValidationError as error:
        raise InvalidRequest.from_validation_error(error) from None
