"""A fake LLM provider on real HTTP: the Anthropic Messages API and OpenAI chat completions.

It answers like the real services (streamed SSE or JSON bodies, error bodies, rate-limit
headers), enforces per-minute request and token limits and a concurrency limit on a sliding
60 s window read from an injectable clock, and plays scripted faults, so clients, the provider
gate, benchmarks and demos can be driven without a key or a network::

    provider = create_fake_provider(FakeProviderConfig(requests_per_minute=2))
    provider.fail_next(Fault(FaultKind.OVERLOADED), times=3)
    async with serving(provider) as base_url:
        ...  # Anthropic SDK: base_url; OpenAI SDK: base_url + "/v1"
    provider.calls  # every call, in order of arrival

Anthropic clients post to ``{base_url}/v1/messages``, OpenAI clients (whose base URL
conventionally ends in ``/v1``) to ``{base_url}/v1/chat/completions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import math
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.base.clock import SystemClock

WINDOW_MS = 60_000
"""The sliding window every per-minute limit is counted over."""

Api = Literal["anthropic", "openai"]
Reply = Callable[[Mapping[str, Any]], str]
"""What the model answers to a request body."""
Limit = Literal["requests", "tokens", "concurrency"]
"""Which of the fake's limits refused a call."""


def default_reply(body: Mapping[str, Any]) -> str:
    """A trading decision that does nothing, as JSON."""
    return json.dumps({"decision": "no_trade", "reason": "fake provider: no signal"})


def estimate_tokens(text: str) -> int:
    """About four characters a token, at least one."""
    return max(1, math.ceil(len(text) / 4))


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
class FakeProviderConfig:
    """Limits (None: unlimited), the reply, and the key to demand (None: any key)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    """Input plus output tokens of the calls answered in the last 60 s."""
    max_concurrent: int | None = None
    reply: Reply = default_reply
    chunk_chars: int = 16
    """Characters per streamed text delta."""
    api_key: str | None = None


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call as the fake saw it: ``limited`` names the limit that refused it, if one did."""

    api: Api
    path: str
    model: str | None
    at_ms: int
    status: int
    stream: bool
    fault: FaultKind | None = None
    limited: Limit | None = None


@dataclass(frozen=True, slots=True)
class _ErrorShape:
    status: int
    error_type: str
    message: str
    code: str | None = None


_RATE_MESSAGE = (
    "This request would exceed the rate limit for your organization of {limit} {unit} per "
    "minute. For details, refer to the rate limits documentation. You can see the response "
    "headers for current usage. Please reduce the prompt length or the maximum tokens "
    "requested, or try again later."
)
_ANTHROPIC_FAULTS: dict[FaultKind, _ErrorShape] = {
    FaultKind.OVERLOADED: _ErrorShape(529, "overloaded_error", "Overloaded"),
    FaultKind.MID_STREAM_ERROR: _ErrorShape(529, "overloaded_error", "Overloaded"),
    FaultKind.RATE_LIMITED: _ErrorShape(
        429, "rate_limit_error", _RATE_MESSAGE.format(limit=50, unit="requests")),
    FaultKind.UNAVAILABLE: _ErrorShape(503, "api_error", "Service Unavailable"),
    FaultKind.SERVER_ERROR: _ErrorShape(500, "api_error", "Internal server error"),
    FaultKind.SPEND_LIMIT: _ErrorShape(
        400, "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
        "Billing to upgrade or purchase credits."),
    FaultKind.INVALID_REQUEST: _ErrorShape(
        400, "invalid_request_error", "messages: at least one message is required"),
    FaultKind.UNAUTHORIZED: _ErrorShape(401, "authentication_error", "invalid x-api-key"),
}
_OPENAI_FAULTS: dict[FaultKind, _ErrorShape] = {
    FaultKind.OVERLOADED: _ErrorShape(
        503, "server_error", "The server is overloaded or not ready yet."),
    FaultKind.MID_STREAM_ERROR: _ErrorShape(
        503, "overloaded_error", "The server is overloaded or not ready yet."),
    FaultKind.RATE_LIMITED: _ErrorShape(
        429, "requests", "Rate limit reached for requests per min (RPM): Limit 50, Used 50, "
        "Requested 1.", "rate_limit_exceeded"),
    FaultKind.UNAVAILABLE: _ErrorShape(503, "server_error", "Service Unavailable"),
    FaultKind.SERVER_ERROR: _ErrorShape(
        500, "server_error",
        "The server had an error while processing your request. Sorry about that!"),
    FaultKind.SPEND_LIMIT: _ErrorShape(
        429, "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota"),
    FaultKind.INVALID_REQUEST: _ErrorShape(
        400, "invalid_request_error", "'messages' is a required property"),
    FaultKind.UNAUTHORIZED: _ErrorShape(
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
        return "".join(str(block.get("text", "")) for block in content
                       if isinstance(block, dict))
    return ""


def _prompt_text(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    turns = messages if isinstance(messages, list) else []
    return _text_of(body.get("system")) + "".join(
        _text_of(turn.get("content")) for turn in turns if isinstance(turn, dict))


def _sse(event: str | None, data: Mapping[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


@dataclass(slots=True)
class _Call:
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


class FakeProvider:
    """The fake provider: an ASGI app with scripted faults, limits and a log of calls."""

    def __init__(self, config: FakeProviderConfig | None = None, *,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.config = config or FakeProviderConfig()
        self.calls: list[CallRecord] = []
        """Every call, in order of arrival."""
        self._now_ms = now_ms or SystemClock().now_ms
        self._faults: deque[Fault] = deque()
        self._window: deque[tuple[int, int]] = deque()  # (answered at, tokens), oldest first
        self._active: set[int] = set()  # numbers of the calls being answered
        self._released = asyncio.Event()
        self._numbers = itertools.count(1)
        self.app = Starlette(routes=[
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
        ])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # -- what tests and benchmarks use -----------------------------------------------------

    def fail_next(self, fault: Fault, times: int = 1) -> None:
        """Script the next ``times`` calls (after those already scripted) to play ``fault``."""
        self._faults.extend([fault] * times)

    @property
    def pending_faults(self) -> int:
        """Scripted faults not played yet."""
        return len(self._faults)

    @property
    def active(self) -> int:
        """Calls being answered now (counted against ``max_concurrent``)."""
        return len(self._active)

    def count(self, *, status: int | None = None, api: Api | None = None) -> int:
        """How many calls came (with that status, to that API)."""
        return sum(1 for call in self.calls
                   if (status is None or call.status == status)
                   and (api is None or call.api == api))

    def release(self) -> None:
        """End every hang and stall now, and make later ones end at once."""
        self._released.set()

    def reset(self, config: FakeProviderConfig | None = None, *,
              now_ms: Callable[[], int] | None = None) -> None:
        """Start afresh: end hangs and stalls, forget calls, faults and the window.

        ``config`` and ``now_ms``, if given, replace the config and the clock (so one running
        server can serve many tests or benchmark scenarios).
        """
        self.release()
        self._released = asyncio.Event()
        self.config = config or self.config
        self._now_ms = now_ms or self._now_ms
        self.calls.clear()
        self._faults.clear()
        self._window.clear()
        self._active.clear()

    # -- the two APIs ----------------------------------------------------------------------

    async def _messages(self, request: Request) -> Response:
        return await self._answer(request, "anthropic")

    async def _chat_completions(self, request: Request) -> Response:
        return await self._answer(request, "openai")

    async def _answer(self, request: Request, api: Api) -> Response:
        at = self._now_ms()
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {}
        call = _Call(api=api, path=request.url.path, body=body, model=str(body.get("model", "")),
                     stream=body.get("stream") is True, at_ms=at, key=_presented_key(request),
                     number=next(self._numbers))
        fault = self._faults.popleft() if self._faults else None
        if self.config.api_key is not None and call.key != self.config.api_key:
            fault = Fault(FaultKind.UNAUTHORIZED)
        elif not isinstance(body.get("messages"), list) or not body.get("model"):
            fault = Fault(FaultKind.INVALID_REQUEST)
        if fault is not None and (fault.kind is FaultKind.HANG or (
                fault.kind is FaultKind.STALL_MID_STREAM and not call.stream)):
            await self._wait(fault.seconds)  # then answer as if nothing had happened
            fault = None
        if fault is not None and not (call.stream and fault.kind in _IN_STREAM):
            return self._error(call, fault)
        self._price(call)
        limited = self._limited(call)
        if limited is not None:
            return self._rate_limited(call, limited)
        self._window.append((at, call.input_tokens + call.output_tokens))
        self._record(call, 200, fault)
        if not call.stream:
            return JSONResponse(self._whole(call), headers=self._headers(call))
        self._active.add(call.number)
        return _Streamed(self._streamed(call, fault), headers=self._headers(call),
                         media_type="text/event-stream",
                         done=functools.partial(self._active.discard, call.number))

    def _price(self, call: _Call) -> None:
        """What the call will use: its prompt, and the reply cut to ``max_tokens``."""
        call.input_tokens = estimate_tokens(_prompt_text(call.body))
        text = self.config.reply(call.body)
        limit = call.body.get("max_tokens") or call.body.get("max_completion_tokens")
        if isinstance(limit, int) and estimate_tokens(text) > limit:
            text, call.truncated = text[: limit * 4], True
        call.text, call.output_tokens = text, estimate_tokens(text)

    async def _wait(self, seconds: float) -> None:
        released = self._released  # a reset replaces it: waits begun before end with it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released.wait(), seconds)

    # -- limits ----------------------------------------------------------------------------

    def _prune(self, now: int) -> None:
        while self._window and self._window[0][0] <= now - WINDOW_MS:
            self._window.popleft()

    def _used_tokens(self) -> int:
        return sum(tokens for _, tokens in self._window)

    def _limited(self, call: _Call) -> Limit | None:
        self._prune(call.at_ms)
        config = self.config
        if config.requests_per_minute is not None and (
                len(self._window) >= config.requests_per_minute):
            return "requests"
        needed = call.input_tokens + call.output_tokens
        if config.tokens_per_minute is not None and (
                self._used_tokens() + needed > config.tokens_per_minute):
            return "tokens"
        if config.max_concurrent is not None and len(self._active) >= config.max_concurrent:
            return "concurrency"
        return None

    def _retry_after_ms(self, call: _Call, limited: Limit) -> int:
        """When the window will have room for this call."""
        if limited == "concurrency":
            return 1000
        if limited == "requests":
            assert self.config.requests_per_minute is not None
            excess = len(self._window) - self.config.requests_per_minute
            return self._window[excess][0] + WINDOW_MS - call.at_ms
        assert self.config.tokens_per_minute is not None
        must_free = self._used_tokens() + call.input_tokens + call.output_tokens - (
            self.config.tokens_per_minute)
        freed = 0
        for answered, tokens in self._window:
            freed += tokens
            if freed >= must_free:
                return answered + WINDOW_MS - call.at_ms
        return WINDOW_MS  # this call alone is over the limit: it never fits

    def _headers(self, call: _Call, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The rate-limit headers every answer carries, for the limits that are set."""
        now = call.at_ms
        self._prune(now)
        full_at = self._window[-1][0] + WINDOW_MS if self._window else now
        headers: dict[str, str] = {}
        limits = (("requests", self.config.requests_per_minute, len(self._window)),
                  ("tokens", self.config.tokens_per_minute, self._used_tokens()))
        for unit, limit, used in limits:
            if limit is None:
                continue
            remaining = str(max(0, limit - used))
            if call.api == "anthropic":
                headers[f"anthropic-ratelimit-{unit}-limit"] = str(limit)
                headers[f"anthropic-ratelimit-{unit}-remaining"] = remaining
                headers[f"anthropic-ratelimit-{unit}-reset"] = format_rfc3339(full_at)
            else:
                headers[f"x-ratelimit-limit-{unit}"] = str(limit)
                headers[f"x-ratelimit-remaining-{unit}"] = remaining
                headers[f"x-ratelimit-reset-{unit}"] = format_duration(full_at - now)
        request_id = f"req_fake_{call.number}"
        headers["request-id" if call.api == "anthropic" else "x-request-id"] = request_id
        headers.update(extra or {})
        return headers

    # -- answers ---------------------------------------------------------------------------

    def _record(self, call: _Call, status: int, fault: Fault | None = None,
                limited: Limit | None = None) -> None:
        self.calls.append(CallRecord(api=call.api, path=call.path, model=call.model or None,
                                     at_ms=call.at_ms, status=status, stream=call.stream,
                                     fault=fault.kind if fault else None, limited=limited))

    def _error_body(self, call: _Call, shape: _ErrorShape) -> dict[str, Any]:
        if call.api == "anthropic":
            error: dict[str, Any] = {"type": shape.error_type, "message": shape.message}
            if shape.code is not None:
                error["details"] = {"error_code": shape.code}
            return {"type": "error", "error": error, "request_id": f"req_fake_{call.number}"}
        return {"error": {"message": shape.message, "type": shape.error_type, "param": None,
                          "code": shape.code}}

    def _shape(self, call: _Call, fault: Fault) -> _ErrorShape:
        table = _ANTHROPIC_FAULTS if call.api == "anthropic" else _OPENAI_FAULTS
        base = table.get(fault.kind, table[FaultKind.SERVER_ERROR])
        message = fault.message if fault.message is not None else base.message
        return _ErrorShape(status=fault.status or base.status,
                           error_type=fault.error_type or base.error_type,
                           message=message.replace("{key}", call.key or ""),
                           code=fault.code if fault.code is not None else base.code)

    def _error(self, call: _Call, fault: Fault) -> Response:
        shape = self._shape(call, fault)
        extra = {}
        if fault.retry_after_s is not None:
            extra["retry-after"] = f"{fault.retry_after_s:g}"
        self._record(call, shape.status, fault)
        return JSONResponse(self._error_body(call, shape), status_code=shape.status,
                            headers=self._headers(call, extra))

    def _rate_limited(self, call: _Call,
                      limited: Limit) -> Response:
        config = self.config
        wait_ms = max(0, self._retry_after_ms(call, limited))
        if limited == "concurrency":
            message = "Number of concurrent connections has exceeded your rate limit."
            limit = config.max_concurrent
        else:
            limit = config.requests_per_minute if limited == "requests" else (
                config.tokens_per_minute)
            message = _RATE_MESSAGE.format(limit=limit, unit=limited)
        if call.api == "anthropic":
            shape = _ErrorShape(429, "rate_limit_error", message)
            extra = {"retry-after": str(max(1, math.ceil(wait_ms / 1000)))}
        else:
            unit = "RPM" if limited == "requests" else "TPM"
            message = (f"Rate limit reached for {call.model} on {limited} per min ({unit}): "
                       f"Limit {limit}. Please try again in {format_duration(wait_ms)}.")
            shape = _ErrorShape(429, limited, message, "rate_limit_exceeded")
            extra = {"retry-after": str(max(1, math.ceil(wait_ms / 1000))),
                     "retry-after-ms": str(wait_ms)}
        self._record(call, 429, limited=limited)
        return JSONResponse(self._error_body(call, shape), status_code=429,
                            headers=self._headers(call, extra))

    def _stop_reason(self, call: _Call) -> str:
        if call.api == "anthropic":
            return "max_tokens" if call.truncated else "end_turn"
        return "length" if call.truncated else "stop"

    def _whole(self, call: _Call) -> dict[str, Any]:
        if call.api == "anthropic":
            return {"id": f"msg_fake_{call.number}", "type": "message", "role": "assistant",
                    "model": call.model, "content": [{"type": "text", "text": call.text}],
                    "stop_reason": self._stop_reason(call), "stop_sequence": None,
                    "usage": {"input_tokens": call.input_tokens,
                              "output_tokens": call.output_tokens}}
        return {"id": f"chatcmpl-fake-{call.number}", "object": "chat.completion",
                "created": call.at_ms // 1000, "model": call.model,
                "choices": [{"index": 0, "finish_reason": self._stop_reason(call),
                             "message": {"role": "assistant", "content": call.text}}],
                "usage": self._openai_usage(call)}

    @staticmethod
    def _openai_usage(call: _Call) -> dict[str, int]:
        return {"prompt_tokens": call.input_tokens, "completion_tokens": call.output_tokens,
                "total_tokens": call.input_tokens + call.output_tokens}

    def _pieces(self, text: str) -> Iterator[str]:
        size = max(1, self.config.chunk_chars)
        return (text[i:i + size] for i in range(0, len(text), size))

    async def _streamed(self, call: _Call, fault: Fault | None) -> AsyncIterator[bytes]:
        """The SSE events of one answer; a fault strikes after the first text delta."""
        events = self._anthropic_events(call) if call.api == "anthropic" else (
            self._openai_events(call))
        for index, event in enumerate(events):  # `_Streamed` frees the call's slot after
            yield event
            if fault is None or index != _FIRST_TEXT_EVENT[call.api]:
                continue
            if fault.kind is FaultKind.STALL_MID_STREAM:
                await self._wait(fault.seconds)
            else:
                yield self._stream_error(call, fault)
                return

    def _stream_error(self, call: _Call, fault: Fault) -> bytes:
        shape = self._shape(call, fault)
        body = self._error_body(call, shape)
        return _sse("error", body) if call.api == "anthropic" else _sse(None, body)

    def _anthropic_events(self, call: _Call) -> Iterator[bytes]:
        message: dict[str, Any] = {
            "id": f"msg_fake_{call.number}", "type": "message", "role": "assistant",
            "model": call.model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": call.input_tokens, "output_tokens": 1}}
        yield _sse("message_start", {"type": "message_start", "message": message})
        yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})
        yield _sse("ping", {"type": "ping"})
        for piece in self._pieces(call.text):
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": piece}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield _sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(call), "stop_sequence": None},
            "usage": {"output_tokens": call.output_tokens}})
        yield _sse("message_stop", {"type": "message_stop"})

    def _openai_events(self, call: _Call) -> Iterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _sse(None, {**head, "choices": [choice], "usage": None})

        head = {"id": f"chatcmpl-fake-{call.number}", "object": "chat.completion.chunk",
                "created": call.at_ms // 1000, "model": call.model}
        yield chunk({"role": "assistant", "content": ""})
        for piece in self._pieces(call.text):
            yield chunk({"content": piece})
        yield chunk({}, self._stop_reason(call))
        options = call.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            yield _sse(None, {**head, "choices": [], "usage": self._openai_usage(call)})
        yield _sse(None, "[DONE]")


_IN_STREAM = frozenset({FaultKind.MID_STREAM_ERROR, FaultKind.STALL_MID_STREAM})
"""Faults that strike a streamed answer after it has begun."""
_FIRST_TEXT_EVENT: dict[Api, int] = {"anthropic": 3, "openai": 1}
"""Index of the first text delta among an answer's events: where faults strike."""


def _presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


class _Streamed(StreamingResponse):
    """A streamed answer that calls ``done`` however it ends: also when its body never ran
    (the caller went away before the answer's start could be sent)."""

    def __init__(self, content: AsyncIterator[bytes], *, headers: Mapping[str, str],
                 media_type: str, done: Callable[[], None]) -> None:
        super().__init__(content, headers=headers, media_type=media_type)
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


def create_fake_provider(config: FakeProviderConfig | None = None, *,
                         now_ms: Callable[[], int] | None = None) -> FakeProvider:
    """A fake provider (itself the ASGI app); ``now_ms`` is the clock its limits read."""
    return FakeProvider(config, now_ms=now_ms)


@contextlib.asynccontextmanager
async def serving(provider: FakeProvider, timeout_s: float = 10.0) -> AsyncIterator[str]:
    """Run ``provider`` under uvicorn on 127.0.0.1, an ephemeral port; yield its base URL.

    On exit, hangs and stalls are released and the server is stopped.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(provider, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:  # the socket already listens: calls made before uvicorn accepts them just queue
        yield f"http://127.0.0.1:{port}"
    finally:
        provider.release()
        server.should_exit = True
        await asyncio.wait_for(task, timeout_s)
        sock.close()
