"""LLM clients on the official SDKs: one streamed call each, its failure classified.

`AnthropicClient` speaks the Messages API, `OpenAIClient` OpenAI-compatible chat completions.
Both stream, never retry (``max_retries=0``: the provider gate owns retries), hold the whole
call to ``timeout_s``, read the provider's rate-limit headers into `RateHints`, and turn every
failure into a `ProviderCallError` whose message is short and never carries the key.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from email.utils import parsedate_to_datetime
from typing import Literal

import anthropic
import httpx2
import openai
from openai.types.completion_usage import CompletionUsage

from gateway.base.clock import SystemClock
from gateway.llm.port import (
    Completion,
    LLMClient,
    Message,
    ProviderCallError,
    RateHints,
    ToolSpec,
)
from gateway.llm.turns import (
    OpenAIToolCalls,
    anthropic_tool_calls,
    anthropic_tools,
    anthropic_turns,
    openai_tools,
    openai_turns,
    tool_text,
)
from lanes.gate.events import CallOutcome

PROVIDER_KINDS = ("anthropic", "openai")
"""What `build_client` knows how to build."""

MESSAGE_LIMIT = 300
"""Error messages are cut to this many characters."""

MaxTokensParam = Literal["max_completion_tokens", "max_tokens"]
"""The request field an OpenAI-compatible server takes the output limit in."""

_wall_clock_ms = SystemClock().now_ms

# -- rate-limit headers ---------------------------------------------------------------------

_FRACTION = re.compile(r"(\.\d{6})\d+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_MS = {unit: Decimal(ms) for unit, ms in (
    ("ns", "0.000001"), ("us", "0.001"), ("µs", "0.001"), ("ms", "1"), ("s", "1000"),
    ("m", "60000"), ("h", "3600000"))}


def parse_rfc3339_ms(value: str) -> int | None:
    """An RFC 3339 timestamp (``2026-02-17T03:11:00Z``) in ms since the epoch; None if not one.

    A timestamp without an offset is taken as UTC.
    """
    text = _FRACTION.sub(r"\1", value.strip())  # fromisoformat takes at most microseconds
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return math.floor(moment.timestamp() * 1000)


def parse_duration_ms(value: str) -> int | None:
    """A Go-style duration (``1s``, ``6m0s``, ``250ms``, ``1h2m3.5s``) in ms; None if not one."""
    text = value.strip()
    if not text:
        return None
    if text in {"0", "0s"}:
        return 0
    total = Decimal(0)  # decimal, so "16.231s" is 16231 ms, not 16232
    position = 0
    for part in _DURATION_PART.finditer(text):
        if part.start() != position:
            return None
        total += Decimal(part.group(1)) * _DURATION_MS[part.group(2)]
        position = part.end()
    if position != len(text):
        return None
    return math.ceil(total)


def parse_retry_after_ms(headers: Mapping[str, str], now_ms: int) -> int | None:
    """``retry-after-ms``, else ``retry-after`` in seconds or as an HTTP date, in ms from now.

    ``headers`` must have lower-case names (httpx2 headers do).
    """
    exact = _number(headers.get("retry-after-ms"))
    if exact is not None:
        return max(0, math.ceil(exact))
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return max(0, math.ceil(seconds * 1000))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0, math.ceil(moment.timestamp() * 1000) - now_ms)


def _number(value: str | None) -> Decimal | None:
    """A finite decimal number, or None."""
    if value is None:
        return None
    try:
        number = Decimal(value.strip())
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return max(0, int(value.strip()))  # a negative count is nonsense: read it as 0
    except ValueError:
        return None


def _least(values: Iterable[int | None]) -> int | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


_ANTHROPIC_TOKEN_KINDS = ("tokens", "input-tokens", "output-tokens")
_ANTHROPIC_PREFIX = "anthropic-ratelimit-"


def anthropic_hints(headers: Mapping[str, str], now_ms: int) -> RateHints:
    """What Anthropic's ``anthropic-ratelimit-*`` and ``retry-after`` headers say.

    Remaining tokens are the least of the token counts given; the reset is the earliest.
    """
    h = _lowered(headers)
    prefix = _ANTHROPIC_PREFIX
    resets = (parse_rfc3339_ms(h[name]) for name in (
        f"{prefix}{kind}-reset" for kind in ("requests", *_ANTHROPIC_TOKEN_KINDS)) if name in h)
    return RateHints(
        remaining_requests=_int(h.get(f"{prefix}requests-remaining")),
        remaining_tokens=_least(_int(h.get(f"{prefix}{kind}-remaining"))
                                for kind in _ANTHROPIC_TOKEN_KINDS),
        reset_at=_least(resets),
        retry_after_ms=parse_retry_after_ms(h, now_ms),
    )


def openai_hints(headers: Mapping[str, str], now_ms: int) -> RateHints:
    """What OpenAI's ``x-ratelimit-*`` and ``retry-after(-ms)`` headers say.

    The resets are durations from now; the earlier one is taken.
    """
    h = _lowered(headers)
    resets = (parse_duration_ms(h[name]) for name in ("x-ratelimit-reset-requests",
                                                     "x-ratelimit-reset-tokens") if name in h)
    soonest = _least(resets)
    return RateHints(
        remaining_requests=_int(h.get("x-ratelimit-remaining-requests")),
        remaining_tokens=_int(h.get("x-ratelimit-remaining-tokens")),
        reset_at=None if soonest is None else now_ms + soonest,
        retry_after_ms=parse_retry_after_ms(h, now_ms),
    )


# -- classifying failures -------------------------------------------------------------------

_SPEND_WORDS = re.compile(
    r"billing|\bcredits?\b|credit balance|spend.?limit|usage.?limits?\b|insufficient.?quota"
    r"|exceeded your current quota|payment",
    re.IGNORECASE,
)
_SPEND_STATUSES = frozenset({400, 403, 429})
_STREAM_ERRORS = {
    "overloaded_error": CallOutcome.OVERLOADED,
    "rate_limit_error": CallOutcome.RATE_LIMITED,
    "rate_limit_exceeded": CallOutcome.RATE_LIMITED,
    "timeout_error": CallOutcome.TIMEOUT,
}
"""Error types that can arrive inside a 200 stream; any other is a server error."""


def says_spend_limit(*texts: str | None) -> bool:
    """Whether an error's type, code or message speaks of billing, credit or a spend limit."""
    return any(text and _SPEND_WORDS.search(text) for text in texts)


def classify_error(status: int | None, *, error_type: str | None = None,
                   code: str | None = None, message: str | None = None) -> CallOutcome:
    """How the gate is to take an error answer; ``status`` None: an error inside a stream.

    402, or a 400/403/429 (or stream error) that speaks of billing, credit, spend or usage
    limits, or insufficient quota, is a spend limit and must not be retried.
    """
    spend_shaped = says_spend_limit(error_type, code, message)
    if status == 402 or (spend_shaped and (status is None or status in _SPEND_STATUSES)):
        return CallOutcome.SPEND_LIMIT
    if status is None:
        return _STREAM_ERRORS.get(error_type or code or "", CallOutcome.SERVER_ERROR)
    if status == 429:
        return CallOutcome.RATE_LIMITED
    if status in (503, 529):
        return CallOutcome.OVERLOADED
    if status in (408, 504):
        return CallOutcome.TIMEOUT
    if status >= 500:
        return CallOutcome.SERVER_ERROR
    return CallOutcome.REJECTED


_KEY_SHAPED = re.compile(r"\b(sk-[A-Za-z0-9]{0,4})[A-Za-z0-9_\-]{12,}")


def short_message(text: str, secret: str | None = None) -> str:
    """``text`` on one line, without ``secret`` or anything shaped like a key, cut short."""
    if secret:
        text = text.replace(secret, "[redacted]")
    text = _KEY_SHAPED.sub(r"\1…[redacted]", " ".join(text.split()))
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"


def _error_failure(status: int | None, error_type: str | None, code: str | None,
                   message: str | None, hints: RateHints, secret: str | None
                   ) -> ProviderCallError:
    outcome = classify_error(status, error_type=error_type, code=code, message=message)
    where = f"HTTP {status}" if status is not None else "error in stream"
    label = " ".join(part for part in (error_type, code if code != error_type else None) if part)
    head = f"{where} {label}" if label else where
    text = f"{head}: {message or 'no message'}"
    return ProviderCallError(outcome, short_message(text, secret), status=status, hints=hints)


def _transport_failure(err: BaseException, timeout_s: float, secret: str | None
                       ) -> ProviderCallError:
    """No answer: a timeout, or a connection failure named by its root cause."""
    chain = [err]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    timeouts = (TimeoutError, httpx2.TimeoutException, anthropic.APITimeoutError,
                openai.APITimeoutError)
    if any(isinstance(link, timeouts) for link in chain):
        return ProviderCallError(CallOutcome.TIMEOUT, f"no answer within {timeout_s:g} s")
    root = chain[-1]
    text = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
    return ProviderCallError(CallOutcome.SERVER_ERROR, short_message(text, secret))


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# -- the clients ----------------------------------------------------------------------------


class AnthropicClient:
    """The Anthropic Messages API, streamed, on the official SDK.

    The key is ``api_key`` or else ``ANTHROPIC_API_KEY`` (read by the SDK). ``timeout_s``
    bounds the whole call, from connecting to the last event.
    """

    provider = "anthropic"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 timeout_s: float = 60.0, clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self._clock_ms = clock_ms
        try:
            self._sdk = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url,
                                                 max_retries=0, timeout=timeout_s)
        except anthropic.CredentialsError as err:
            raise ValueError(f"Anthropic credentials: {short_message(str(err))}") from None
        if self._sdk.api_key is None and self._sdk.auth_token is None and (
                self._sdk.credentials is None):
            raise ValueError("no Anthropic API key: pass api_key or set ANTHROPIC_API_KEY")

    async def complete(self, *, system: str, messages: Sequence[Message],
                       max_tokens: int, tools: Sequence[ToolSpec] = ()) -> Completion:
        """Stream one message, offering ``tools``; a failure raises `ProviderCallError`,
        classified."""
        turns = anthropic_turns(messages)
        try:
            async with asyncio.timeout(self.timeout_s), self._sdk.messages.stream(
                model=self.model, max_tokens=max_tokens, messages=turns,
                system=system if system else anthropic.omit,
                tools=anthropic_tools(tools) if tools else anthropic.omit,
            ) as stream:
                hints = anthropic_hints(stream.response.headers, self._clock_ms())
                parts = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
        except (anthropic.AnthropicError, httpx2.HTTPError, TimeoutError) as err:
            raise self._failure(err) from None
        except (ValueError, AssertionError, KeyError, TypeError, AttributeError) as err:
            # A 200 whose body is not the API's (empty, not SSE, bad JSON): the provider's
            # fault, classified so that the gate counts it and the run may retry.
            raise ProviderCallError(CallOutcome.SERVER_ERROR,
                                    f"malformed answer: {type(err).__name__}") from None
        usage = final.usage
        input_tokens = (usage.input_tokens + (usage.cache_creation_input_tokens or 0)
                        + (usage.cache_read_input_tokens or 0))
        return Completion(text="".join(parts), input_tokens=input_tokens,
                          output_tokens=usage.output_tokens, stop_reason=final.stop_reason,
                          hints=hints, tool_calls=anthropic_tool_calls(final.content))

    def _failure(self, err: BaseException) -> ProviderCallError:
        secret = self._sdk.api_key or self._sdk.auth_token
        if isinstance(err, anthropic.APIStatusError):
            # An `error` event inside a 200 stream comes as a status error with status 200.
            status = err.status_code if err.status_code >= 400 else None
            hints = anthropic_hints(err.response.headers, self._clock_ms())
            return _error_failure(status, _str(err.type), err.error_code,
                                  err.api_message or err.message, hints, secret)
        return _transport_failure(err, self.timeout_s, secret)

    async def close(self) -> None:
        """Close the SDK client and its connections."""
        await self._sdk.close()


class OpenAIClient:
    """OpenAI-compatible chat completions, streamed with usage, on the official SDK.

    The key is ``api_key`` or else ``OPENAI_API_KEY``. The system prompt goes as a system
    message. ``max_tokens_param`` names the limit's field: ``max_completion_tokens`` (OpenAI
    today) or ``max_tokens`` (older OpenAI-compatible servers). ``timeout_s`` bounds the call.
    """

    provider = "openai"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 timeout_s: float = 60.0, clock_ms: Callable[[], int] = _wall_clock_ms,
                 max_tokens_param: MaxTokensParam = "max_completion_tokens") -> None:
        if max_tokens_param not in ("max_completion_tokens", "max_tokens"):
            raise ValueError(f"unknown max_tokens_param {max_tokens_param!r}")
        self.model = model
        self.timeout_s = timeout_s
        self._clock_ms = clock_ms
        self.max_tokens_param: MaxTokensParam = max_tokens_param
        """The request field that carries ``max_tokens``."""
        try:
            self._sdk = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0,
                                           timeout=timeout_s)
        except openai.OpenAIError:
            raise ValueError("no OpenAI API key: pass api_key or set OPENAI_API_KEY") from None

    async def complete(self, *, system: str, messages: Sequence[Message],
                       max_tokens: int, tools: Sequence[ToolSpec] = ()) -> Completion:
        """Stream one chat completion, offering ``tools``; a failure raises
        `ProviderCallError`, classified."""
        chat = openai_turns(system, messages)
        limit = self.max_tokens_param
        parts: list[str] = []
        calls = OpenAIToolCalls()
        usage: CompletionUsage | None = None
        stop_reason: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                stream = await self._sdk.chat.completions.create(
                    model=self.model, messages=chat, stream=True,
                    stream_options={"include_usage": True},
                    max_completion_tokens=max_tokens if limit == "max_completion_tokens"
                    else openai.omit,
                    max_tokens=max_tokens if limit == "max_tokens" else openai.omit,
                    tools=openai_tools(tools) if tools else openai.omit,
                )
                async with stream:
                    hints = openai_hints(stream.response.headers, self._clock_ms())
                    async for chunk in stream:
                        usage = chunk.usage or usage
                        for choice in chunk.choices:
                            if choice.index != 0:
                                continue
                            if choice.delta.content:
                                parts.append(choice.delta.content)
                            calls.add(choice.delta.tool_calls)
                            stop_reason = choice.finish_reason or stop_reason
        except (openai.OpenAIError, httpx2.HTTPError, TimeoutError) as err:
            raise self._failure(err) from None
        except (ValueError, AssertionError, KeyError, TypeError, AttributeError) as err:
            # A 200 whose body is not the API's (empty, not SSE, bad JSON): the provider's
            # fault, classified so that the gate counts it and the run may retry.
            raise ProviderCallError(CallOutcome.SERVER_ERROR,
                                    f"malformed answer: {type(err).__name__}") from None
        text = "".join(parts)
        tool_calls = calls.calls()
        if usage is None:  # a server that ignores include_usage: estimate rather than say 0
            input_tokens = _estimate_tokens(system, *(m.content for m in messages))
            output_tokens = _estimate_tokens(text, *(tool_text(c.arguments) for c in tool_calls))
        else:
            input_tokens, output_tokens = usage.prompt_tokens, usage.completion_tokens
        return Completion(text=text, input_tokens=input_tokens, output_tokens=output_tokens,
                          stop_reason=stop_reason, hints=hints, tool_calls=tool_calls)

    def _failure(self, err: BaseException) -> ProviderCallError:
        secret = self._sdk.api_key or None
        if isinstance(err, openai.APIStatusError):
            body = err.body  # the SDK has already taken the ``error`` object out of the body
            message = _str(body.get("message")) if isinstance(body, dict) else _str(body)
            hints = openai_hints(err.response.headers, self._clock_ms())
            return _error_failure(err.status_code, err.type, err.code, message or err.message,
                                  hints, secret)
        if isinstance(err, openai.APIError) and not isinstance(err, openai.APIConnectionError):
            # ``data: {"error": ...}`` inside a 200 stream
            return _error_failure(None, err.type, err.code, err.message, RateHints(), secret)
        return _transport_failure(err, self.timeout_s, secret)

    async def close(self) -> None:
        """Close the SDK client and its connections."""
        await self._sdk.close()


def _estimate_tokens(*texts: str) -> int:
    return max(1, math.ceil(sum(len(text) for text in texts) / 4))


def build_client(kind: str, model: str, *, api_key: str | None = None,
                 base_url: str | None = None, timeout_s: float = 60.0,
                 max_tokens_param: MaxTokensParam | None = None) -> LLMClient:
    """The client for a provider kind (``anthropic`` or ``openai``); ValueError if unknown.
    ``max_tokens_param`` is for ``openai`` only (None: its default)."""
    if max_tokens_param is not None and kind != "openai":
        raise ValueError(f"max_tokens_param is for an openai provider, not {kind!r}")
    if kind == "anthropic":
        return AnthropicClient(model, api_key=api_key, base_url=base_url, timeout_s=timeout_s)
    if kind == "openai":
        return OpenAIClient(model, api_key=api_key, base_url=base_url, timeout_s=timeout_s,
                            max_tokens_param=max_tokens_param or "max_completion_tokens")
    raise ValueError(f"unknown provider kind {kind!r} (known: {', '.join(PROVIDER_KINDS)})")
