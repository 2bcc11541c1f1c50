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
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.base.clock import SystemClock
from gateway.base.tasks import start
from gateway.llm.fake_formats import (
    FIRST_TEXT_EVENT,
    IN_STREAM,
    RATE_MESSAGE,
    Api,
    Call,
    ErrorShape,
    Fault,
    FaultKind,
    anthropic_events,
    error_body,
    error_shape,
    format_duration,
    format_rfc3339,
    openai_events,
    prompt_text,
    stream_error,
    whole,
)
from gateway.llm.fake_tools import ToolUse, pairing_problem, scripted

__all__ = [
    "WINDOW_MS", "Api", "CallRecord", "FakeProvider", "FakeProviderConfig", "Fault",
    "FaultKind", "Limit", "Reply", "ToolUse", "create_fake_provider", "default_reply",
    "estimate_tokens", "format_duration", "format_rfc3339", "scripted", "serving",
]

WINDOW_MS = 60_000
"""The sliding window every per-minute limit is counted over."""

Reply = Callable[[Mapping[str, Any]], "str | ToolUse"]
"""What the model answers to a request body: text, or tool calls (`ToolUse`; see
`gateway.llm.fake_tools.scripted`)."""
Limit = Literal["requests", "tokens", "concurrency"]
"""Which of the fake's limits refused a call."""


def default_reply(body: Mapping[str, Any]) -> str:
    """A trading decision that does nothing, as JSON."""
    return json.dumps({"decision": "no_trade", "reason": "fake provider: no signal"})


def estimate_tokens(text: str) -> int:
    """About four characters a token, at least one."""
    return max(1, math.ceil(len(text) / 4))


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
        call = Call(api=api, path=request.url.path, body=body, model=str(body.get("model", "")),
                    stream=body.get("stream") is True, at_ms=at, key=_presented_key(request),
                    number=next(self._numbers))
        fault = self._faults.popleft() if self._faults else None
        if self.config.api_key is not None and call.key != self.config.api_key:
            fault = Fault(FaultKind.UNAUTHORIZED)
        elif not isinstance(body.get("messages"), list) or not body.get("model"):
            fault = Fault(FaultKind.INVALID_REQUEST)
        elif (problem := pairing_problem(api, body)) is not None:
            fault = Fault(FaultKind.INVALID_REQUEST, message=problem)
        if fault is not None and (fault.kind is FaultKind.HANG or (
                fault.kind is FaultKind.STALL_MID_STREAM and not call.stream)):
            await self._wait(fault.seconds)  # then answer as if nothing had happened
            fault = None
        if fault is not None and not (call.stream and fault.kind in IN_STREAM):
            return self._error(call, fault)
        self._price(call)
        limited = self._limited(call)
        if limited is not None:
            return self._rate_limited(call, limited)
        self._window.append((at, call.input_tokens + call.output_tokens))
        self._record(call, 200, fault)
        if not call.stream:
            return JSONResponse(whole(call), headers=self._headers(call))
        self._active.add(call.number)
        return _Streamed(self._streamed(call, fault), headers=self._headers(call),
                         media_type="text/event-stream",
                         done=functools.partial(self._active.discard, call.number))

    def _price(self, call: Call) -> None:
        """What the call will use: its prompt, and the reply cut to ``max_tokens``."""
        call.input_tokens = estimate_tokens(prompt_text(call.body))
        reply = self.config.reply(call.body)
        text, arguments = reply if isinstance(reply, str) else reply.text, ""
        if isinstance(reply, ToolUse):
            prefix = "toolu_fake" if call.api == "anthropic" else "call_fake"
            call.tool_calls = [(f"{prefix}_{call.number}_{n}", name, json.dumps(dict(args)))
                               for n, (name, args) in enumerate(reply.calls)]
            arguments = "".join(args for _, _, args in call.tool_calls)
        limit = call.body.get("max_tokens") or call.body.get("max_completion_tokens")
        if isinstance(limit, int) and estimate_tokens(text) > limit:
            text, call.truncated = text[: limit * 4], True
        call.text, call.output_tokens = text, estimate_tokens(text + arguments)

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

    def _limited(self, call: Call) -> Limit | None:
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

    def _retry_after_ms(self, call: Call, limited: Limit) -> int:
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

    def _headers(self, call: Call, extra: Mapping[str, str] | None = None) -> dict[str, str]:
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

    def _record(self, call: Call, status: int, fault: Fault | None = None,
                limited: Limit | None = None) -> None:
        self.calls.append(CallRecord(api=call.api, path=call.path, model=call.model or None,
                                     at_ms=call.at_ms, status=status, stream=call.stream,
                                     fault=fault.kind if fault else None, limited=limited))

    def _error(self, call: Call, fault: Fault) -> Response:
        shape = error_shape(call, fault)
        extra = {}
        if fault.retry_after_s is not None:
            extra["retry-after"] = f"{fault.retry_after_s:g}"
        self._record(call, shape.status, fault)
        return JSONResponse(error_body(call, shape), status_code=shape.status,
                            headers=self._headers(call, extra))

    def _rate_limited(self, call: Call,
                      limited: Limit) -> Response:
        config = self.config
        wait_ms = max(0, self._retry_after_ms(call, limited))
        if limited == "concurrency":
            message = "Number of concurrent connections has exceeded your rate limit."
            limit = config.max_concurrent
        else:
            limit = config.requests_per_minute if limited == "requests" else (
                config.tokens_per_minute)
            message = RATE_MESSAGE.format(limit=limit, unit=limited)
        if call.api == "anthropic":
            shape = ErrorShape(429, "rate_limit_error", message)
            extra = {"retry-after": str(max(1, math.ceil(wait_ms / 1000)))}
        else:
            unit = "RPM" if limited == "requests" else "TPM"
            message = (f"Rate limit reached for {call.model} on {limited} per min ({unit}): "
                       f"Limit {limit}. Please try again in {format_duration(wait_ms)}.")
            shape = ErrorShape(429, limited, message, "rate_limit_exceeded")
            extra = {"retry-after": str(max(1, math.ceil(wait_ms / 1000))),
                     "retry-after-ms": str(wait_ms)}
        self._record(call, 429, limited=limited)
        return JSONResponse(error_body(call, shape), status_code=429,
                            headers=self._headers(call, extra))

    async def _streamed(self, call: Call, fault: Fault | None) -> AsyncIterator[bytes]:
        """The SSE events of one answer; a fault strikes after the first text delta."""
        chunk_chars = self.config.chunk_chars
        events = anthropic_events(call, chunk_chars) if call.api == "anthropic" else (
            openai_events(call, chunk_chars))
        for index, event in enumerate(events):  # `_Streamed` frees the call's slot after
            yield event
            if fault is None or index != FIRST_TEXT_EVENT[call.api]:
                continue
            if fault.kind is FaultKind.STALL_MID_STREAM:
                await self._wait(fault.seconds)
            else:
                yield stream_error(call, fault)
                return


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
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(provider, log_level="warning", lifespan="off"))
    task = start(server.serve(sockets=[sock]), "fake provider")
    try:  # the socket already listens: calls made before uvicorn accepts them just queue
        yield f"http://127.0.0.1:{port}"
    finally:
        provider.release()
        server.should_exit = True
        await asyncio.wait_for(task, timeout_s)
        sock.close()
