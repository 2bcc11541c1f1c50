"""The wire formats of the fake LLM provider (`gateway.llm.fake_provider`): the Anthropic
Messages API's and OpenAI chat completions' bodies, SSE events and error shapes, and the
faults a call can be scripted to play."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gateway.llm.fake_tools import Api as Api  # (its home: fake_formats' callers use it)
from gateway.llm.fake_tools import block_text, call_text


class FaultKind(StrEnum):
    """What a scripted call does instead of answering normally."""

    OVERLOADED = "overloaded"
    """Anthropic: 529 ``overloaded_error``; OpenAI: 503."""
    RATE_LIMITED = "rate_limited"
    """429 rate-limit error (``retry-after`` from ``Fault.retry_after_s``)."""
    UNAVAILABLE = "unavailable"
    """503."""
    SERVER_ERROR = "server_error"
    """500."""
    SPEND_LIMIT = "spend_limit"
    """Anthropic: 400 "credit balance is too low"; OpenAI: 429 ``insufficient_quota``."""
    INVALID_REQUEST = "invalid_request"
    """400 ``invalid_request_error``."""
    UNAUTHORIZED = "unauthorized"
    """401 (Anthropic ``authentication_error``, OpenAI ``invalid_api_key``)."""
    HANG = "hang"
    """No answer for ``Fault.seconds`` (or until `FakeProvider.release`), then a normal one."""
    MID_STREAM_ERROR = "mid_stream_error"
    """200, some text, then an error event (``overloaded_error`` unless ``error_type``);
    a non-streaming request gets the matching error status instead."""
    STALL_MID_STREAM = "stall_mid_stream"
    """200, some text, then silence for ``Fault.seconds`` (or until released), then the rest."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One scripted answer; the optional fields override the kind's real-shaped defaults.

    In ``message``, ``{key}`` is replaced by the key the caller presented (to test that
    clients never repeat it).
    """

    kind: FaultKind
    retry_after_s: float | None = None
    seconds: float = 30.0
    status: int | None = None
    error_type: str | None = None
    message: str | None = None
    code: str | None = None
    """OpenAI ``error.code``; Anthropic ``error.details.error_code``."""


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """An error answer: its status and what its body says."""

    status: int
    error_type: str
    message: str
    code: str | None = None


RATE_MESSAGE = (
    "This request would exceed the rate limit for your organization of {limit} {unit} per "
    "minute. For details, refer to the rate limits documentation. You can see the response "
    "headers for current usage. Please reduce the prompt length or the maximum tokens "
    "requested, or try again later."
)
ANTHROPIC_FAULTS: dict[FaultKind, ErrorShape] = {
    FaultKind.OVERLOADED: ErrorShape(529, "overloaded_error", "Overloaded"),
    FaultKind.MID_STREAM_ERROR: ErrorShape(529, "overloaded_error", "Overloaded"),
    FaultKind.RATE_LIMITED: ErrorShape(
        429, "rate_limit_error", RATE_MESSAGE.format(limit=50, unit="requests")),
    FaultKind.UNAVAILABLE: ErrorShape(503, "api_error", "Service Unavailable"),
    FaultKind.SERVER_ERROR: ErrorShape(500, "api_error", "Internal server error"),
    FaultKind.SPEND_LIMIT: ErrorShape(
        400, "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
        "Billing to upgrade or purchase credits."),
    FaultKind.INVALID_REQUEST: ErrorShape(
        400, "invalid_request_error", "messages: at least one message is required"),
    FaultKind.UNAUTHORIZED: ErrorShape(401, "authentication_error", "invalid x-api-key"),
}
OPENAI_FAULTS: dict[FaultKind, ErrorShape] = {
    FaultKind.OVERLOADED: ErrorShape(
        503, "server_error", "The server is overloaded or not ready yet."),
    FaultKind.MID_STREAM_ERROR: ErrorShape(
        503, "overloaded_error", "The server is overloaded or not ready yet."),
    FaultKind.RATE_LIMITED: ErrorShape(
        429, "requests", "Rate limit reached for requests per min (RPM): Limit 50, Used 50, "
        "Requested 1.", "rate_limit_exceeded"),
    FaultKind.UNAVAILABLE: ErrorShape(503, "server_error", "Service Unavailable"),
    FaultKind.SERVER_ERROR: ErrorShape(
        500, "server_error",
        "The server had an error while processing your request. Sorry about that!"),
    FaultKind.SPEND_LIMIT: ErrorShape(
        429, "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota"),
    FaultKind.INVALID_REQUEST: ErrorShape(
        400, "invalid_request_error", "'messages' is a required property"),
    FaultKind.UNAUTHORIZED: ErrorShape(
        401, "invalid_request_error", "Incorrect API key provided.", "invalid_api_key"),
}


def format_duration(ms: int) -> str:
    """A duration as OpenAI's reset headers write it: ``250ms``, ``1s``, ``6m0s``, ``1h2m3.5s``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    text = f"{minutes}m{seconds}s" if hours or minutes else f"{seconds}s"
    return f"{hours}h{text}" if hours else text


def format_rfc3339(ms: int) -> str:
    """A time as Anthropic's reset headers write it, rounded up to the second."""
    moment = datetime.fromtimestamp(math.ceil(ms / 1000), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(block_text(block) for block in content if isinstance(block, dict))
    return ""


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text of a request's system prompt and messages, tool calls and results included
    (what its input tokens count)."""
    messages = body.get("messages")
    turns = messages if isinstance(messages, list) else []
    return _text_of(body.get("system")) + "".join(
        _text_of(turn.get("content")) + call_text(turn) for turn in turns
        if isinstance(turn, dict))


def sse(event: str | None, data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event (``data`` as JSON unless it is text already)."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


@dataclass(slots=True)
class Call:
    """A call being answered: what was asked and what it costs."""

    api: Api
    path: str
    body: Mapping[str, Any]
    model: str
    stream: bool
    at_ms: int
    key: str | None
    number: int
    input_tokens: int = 0
    text: str = ""
    output_tokens: int = 0
    truncated: bool = False
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    """The tools the answer calls: (id, name, arguments as JSON text) each."""


IN_STREAM = frozenset({FaultKind.MID_STREAM_ERROR, FaultKind.STALL_MID_STREAM})
"""Faults that strike a streamed answer after it has begun."""
FIRST_TEXT_EVENT: dict[Api, int] = {"anthropic": 3, "openai": 1}
"""Index of the first text delta among an answer's events: where faults strike."""


def error_body(call: Call, shape: ErrorShape) -> dict[str, Any]:
    """The error body of the call's API for ``shape``."""
    if call.api == "anthropic":
        error: dict[str, Any] = {"type": shape.error_type, "message": shape.message}
        if shape.code is not None:
            error["details"] = {"error_code": shape.code}
        return {"type": "error", "error": error, "request_id": f"req_fake_{call.number}"}
    return {"error": {"message": shape.message, "type": shape.error_type, "param": None,
                      "code": shape.code}}


def error_shape(call: Call, fault: Fault) -> ErrorShape:
    """The error ``fault`` plays on the call's API: the kind's defaults, overridden."""
    table = ANTHROPIC_FAULTS if call.api == "anthropic" else OPENAI_FAULTS
    base = table.get(fault.kind, table[FaultKind.SERVER_ERROR])
    message = fault.message if fault.message is not None else base.message
    return ErrorShape(status=fault.status or base.status,
                      error_type=fault.error_type or base.error_type,
                      message=message.replace("{key}", call.key or ""),
                      code=fault.code if fault.code is not None else base.code)


def stop_reason(call: Call) -> str:
    """Why the answer ended, in the call's API's words."""
    if call.api == "anthropic":
        return "max_tokens" if call.truncated else "tool_use" if call.tool_calls else "end_turn"
    return "length" if call.truncated else "tool_calls" if call.tool_calls else "stop"


def whole(call: Call) -> dict[str, Any]:
    """The body of a non-streamed answer."""
    if call.api == "anthropic":
        content: list[dict[str, Any]] = [{"type": "text", "text": call.text}] if (
            call.text or not call.tool_calls) else []
        content += [{"type": "tool_use", "id": call_id, "name": name, "input": json.loads(args)}
                    for call_id, name, args in call.tool_calls]
        return {"id": f"msg_fake_{call.number}", "type": "message", "role": "assistant",
                "model": call.model, "content": content,
                "stop_reason": stop_reason(call), "stop_sequence": None,
                "usage": {"input_tokens": call.input_tokens,
                          "output_tokens": call.output_tokens}}
    message: dict[str, Any] = {"role": "assistant", "content": call.text}
    if call.tool_calls:
        message["content"] = call.text or None
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in call.tool_calls]
    return {"id": f"chatcmpl-fake-{call.number}", "object": "chat.completion",
            "created": call.at_ms // 1000, "model": call.model,
            "choices": [{"index": 0, "finish_reason": stop_reason(call), "message": message}],
            "usage": openai_usage(call)}


def openai_usage(call: Call) -> dict[str, int]:
    """OpenAI's ``usage`` of an answer."""
    return {"prompt_tokens": call.input_tokens, "completion_tokens": call.output_tokens,
            "total_tokens": call.input_tokens + call.output_tokens}


def pieces(text: str, chunk_chars: int) -> Iterator[str]:
    """The text in streamed deltas of ``chunk_chars`` characters."""
    size = max(1, chunk_chars)
    return (text[i:i + size] for i in range(0, len(text), size))


def stream_error(call: Call, fault: Fault) -> bytes:
    """The SSE error event ``fault`` ends a stream with."""
    shape = error_shape(call, fault)
    body = error_body(call, shape)
    return sse("error", body) if call.api == "anthropic" else sse(None, body)


def anthropic_events(call: Call, chunk_chars: int) -> Iterator[bytes]:
    """The SSE events of a streamed Anthropic answer."""
    message: dict[str, Any] = {
        "id": f"msg_fake_{call.number}", "type": "message", "role": "assistant",
        "model": call.model, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": call.input_tokens, "output_tokens": 1}}
    yield sse("message_start", {"type": "message_start", "message": message})
    index = 0
    if call.text or not call.tool_calls:
        yield sse("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}})
        yield sse("ping", {"type": "ping"})
        for piece in pieces(call.text, chunk_chars):
            yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": piece}})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    for call_id, name, args in call.tool_calls:
        yield sse("content_block_start", {
            "type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}})
        for piece in pieces(args, chunk_chars):
            yield sse("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece}})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    yield sse("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(call), "stop_sequence": None},
        "usage": {"output_tokens": call.output_tokens}})
    yield sse("message_stop", {"type": "message_stop"})


def openai_events(call: Call, chunk_chars: int) -> Iterator[bytes]:
    """The SSE chunks of a streamed OpenAI answer."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse(None, {**head, "choices": [choice], "usage": None})

    head = {"id": f"chatcmpl-fake-{call.number}", "object": "chat.completion.chunk",
            "created": call.at_ms // 1000, "model": call.model}
    yield chunk({"role": "assistant", "content": ""})
    for piece in pieces(call.text, chunk_chars):
        yield chunk({"content": piece})
    for index, (call_id, name, args) in enumerate(call.tool_calls):
        yield chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                     "function": {"name": name, "arguments": ""}}]})
        for piece in pieces(args, chunk_chars):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, stop_reason(call))
    options = call.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        yield sse(None, {**head, "choices": [], "usage": openai_usage(call)})
    yield sse(None, "[DONE]")
