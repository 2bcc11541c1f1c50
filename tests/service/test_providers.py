"""The LLM clients against the fake provider over real HTTP on loopback, and the fake itself.

Every client call here goes through the official SDK, a socket and uvicorn; the fake's limits
read a fake clock, so time moves only when a test advances it.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import ClientDisconnect

from gateway.base.clock import FakeClock
from gateway.llm.fake_provider import (
    FakeProvider,
    FakeProviderConfig,
    Fault,
    FaultKind,
    create_fake_provider,
    default_reply,
    estimate_tokens,
    format_duration,
    format_rfc3339,
    serving,
)
from gateway.llm.port import Completion, LLMClient, Message, ProviderCallError
from gateway.llm.providers import (
    MESSAGE_LIMIT,
    AnthropicClient,
    OpenAIClient,
    anthropic_hints,
    build_client,
    classify_error,
    openai_hints,
    parse_duration_ms,
    parse_retry_after_ms,
    parse_rfc3339_ms,
)
from lanes.gate.events import CallOutcome

KEY = "sk-test-0123456789abcdefghijklmnop"
MODEL = "fake-model-1"
START_MS = 1_771_297_800_000
SYSTEM = "You trade BTCUSD. Answer with a JSON decision."
ASK = [Message("user", "BTC is at 97000. Decide.")]
KINDS = ["anthropic", "openai"]


def client_for(kind: str, base_url: str, clock: FakeClock, *, api_key: str = KEY,
               timeout_s: float = 5.0) -> LLMClient:
    """A client of that kind pointed at the fake (OpenAI's base URL ends in /v1)."""
    if kind == "anthropic":
        return AnthropicClient(MODEL, api_key=api_key, base_url=base_url, timeout_s=timeout_s,
                               clock_ms=clock.now_ms)
    return OpenAIClient(MODEL, api_key=api_key, base_url=f"{base_url}/v1", timeout_s=timeout_s,
                        clock_ms=clock.now_ms)


@contextlib.asynccontextmanager
async def opened(kind: str, base_url: str, clock: FakeClock, **options: Any
                 ) -> AsyncIterator[LLMClient]:
    """`client_for`, closed after."""
    llm = client_for(kind, base_url, clock, **options)
    try:
        yield llm
    finally:
        await llm.close()


async def ask(llm: LLMClient) -> Completion:
    return await llm.complete(system=SYSTEM, messages=ASK, max_tokens=256)


async def failure(llm: LLMClient) -> ProviderCallError:
    with pytest.raises(ProviderCallError) as caught:
        await ask(llm)
    return caught.value


on_the_shared_server = pytest.mark.asyncio(loop_scope="module")
"""Tests that use `server` run on its event loop (one uvicorn for the module keeps it fast)."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[tuple[FakeProvider, str]]:
    provider = create_fake_provider()
    async with serving(provider) as base_url:
        yield provider, base_url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START_MS)


@pytest.fixture
def fake(server: tuple[FakeProvider, str], clock: FakeClock) -> Iterator[FakeProvider]:
    """The shared fake provider, reset: no limits, no faults, this test's clock."""
    provider, _ = server
    provider.reset(FakeProviderConfig(), now_ms=clock.now_ms)
    yield provider
    provider.release()


@pytest.fixture
def base_url(server: tuple[FakeProvider, str]) -> str:
    return server[1]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest_asyncio.fixture(loop_scope="module")
async def llm(kind: str, base_url: str, clock: FakeClock) -> AsyncIterator[LLMClient]:
    async with opened(kind, base_url, clock) as client:
        yield client


# -- success ---------------------------------------------------------------------------------


@on_the_shared_server
class TestSuccess:
    async def test_a_call_is_streamed_and_returns_text_and_usage(
            self, kind: str, fake: FakeProvider, llm: LLMClient) -> None:
        result = await ask(llm)
        text = default_reply({})
        assert result.text == text
        assert result.input_tokens == estimate_tokens(SYSTEM + ASK[0].content)
        assert result.output_tokens == estimate_tokens(text)
        assert result.stop_reason == ("end_turn" if kind == "anthropic" else "stop")
        [call] = fake.calls
        assert (call.api, call.model, call.status, call.stream) == (kind, MODEL, 200, True)

    async def test_it_carries_the_rate_limit_hints(self, fake: FakeProvider, llm: LLMClient,
                                                   clock: FakeClock) -> None:
        fake.reset(FakeProviderConfig(requests_per_minute=10, tokens_per_minute=10_000))
        result = await ask(llm)
        used = result.input_tokens + result.output_tokens
        assert result.hints.remaining_requests == 9
        assert result.hints.remaining_tokens == 10_000 - used
        assert result.hints.reset_at == START_MS + 60_000
        assert result.hints.retry_after_ms is None

    async def test_without_limits_there_are_no_hints(self, fake: FakeProvider,
                                                     llm: LLMClient) -> None:
        result = await ask(llm)
        assert (result.hints.remaining_requests, result.hints.remaining_tokens,
                result.hints.reset_at) == (None, None, None)

    async def test_the_reply_follows_the_request_and_the_system_prompt_arrives(
            self, kind: str, fake: FakeProvider, llm: LLMClient) -> None:
        seen: list[Mapping[str, Any]] = []

        def reply(body: Mapping[str, Any]) -> str:
            seen.append(body)
            return f"echo: {body['messages'][-1]['content']}"

        fake.reset(FakeProviderConfig(reply=reply, chunk_chars=3))
        result = await llm.complete(
            system=SYSTEM, max_tokens=100,
            messages=[Message("user", "hi"), Message("assistant", "yes?"), Message("user", "go")])
        assert result.text == "echo: go"
        [body] = seen
        roles = [turn["role"] for turn in body["messages"]]
        if kind == "anthropic":
            assert body["system"] == SYSTEM and roles == ["user", "assistant", "user"]
        else:
            assert body["messages"][0] == {"role": "system", "content": SYSTEM}
            assert roles == ["system", "user", "assistant", "user"]
            assert body["stream_options"] == {"include_usage": True}
            assert body["max_completion_tokens"] == 100

    async def test_a_reply_longer_than_max_tokens_is_cut(self, kind: str, fake: FakeProvider,
                                                         llm: LLMClient) -> None:
        fake.reset(FakeProviderConfig(reply=lambda _body: "x" * 400))
        result = await llm.complete(system="", messages=ASK, max_tokens=10)
        assert (len(result.text), result.output_tokens) == (40, 10)
        assert result.stop_reason == ("max_tokens" if kind == "anthropic" else "length")


# -- failures, classified -------------------------------------------------------------------

SPEND_LIMITS = {
    "anthropic": [
        Fault(FaultKind.SPEND_LIMIT),
        Fault(FaultKind.SPEND_LIMIT, message="You have reached your specified API usage "
              "limits. You will regain access on 2026-03-01 at 00:00 UTC."),
        Fault(FaultKind.SPEND_LIMIT, status=402, error_type="billing_error",
              message="Payment required"),
        Fault(FaultKind.RATE_LIMITED, code="enforced_spend_limit_reached",
              message="Your organization has reached its monthly spend limit."),
        Fault(FaultKind.SPEND_LIMIT, status=403, error_type="billing_error",
              message="This organization is on hold."),
    ],
    "openai": [
        Fault(FaultKind.SPEND_LIMIT),
        Fault(FaultKind.SPEND_LIMIT, status=402, error_type="payment_required", code="",
              message="Insufficient credits. Add more using the billing page."),
        Fault(FaultKind.SPEND_LIMIT, status=400, error_type="invalid_request_error",
              code="billing_hard_limit_reached", message="Billing hard limit has been reached"),
    ],
}


@on_the_shared_server
class TestFailures:
    async def test_a_429_with_retry_after_is_rate_limited_and_not_retried(
            self, fake: FakeProvider, llm: LLMClient) -> None:
        fake.fail_next(Fault(FaultKind.RATE_LIMITED, retry_after_s=2))
        err = await failure(llm)
        assert (err.outcome, err.status, err.hints.retry_after_ms) == (
            CallOutcome.RATE_LIMITED, 429, 2000)
        assert fake.count() == 1

    @pytest.mark.parametrize(("fault", "statuses"), [
        (Fault(FaultKind.OVERLOADED), {"anthropic": 529, "openai": 503}),
        (Fault(FaultKind.UNAVAILABLE), {"anthropic": 503, "openai": 503}),
        (Fault(FaultKind.OVERLOADED, status=529), {"anthropic": 529, "openai": 529}),
    ], ids=["overloaded", "unavailable", "529"])
    async def test_529_and_503_are_overloaded(self, kind: str, fake: FakeProvider,
                                              llm: LLMClient, fault: Fault,
                                              statuses: dict[str, int]) -> None:
        fake.fail_next(fault)
        err = await failure(llm)
        assert (err.outcome, err.status) == (CallOutcome.OVERLOADED, statuses[kind])
        assert fake.count() == 1

    async def test_a_500_is_a_server_error(self, fake: FakeProvider, llm: LLMClient) -> None:
        fake.fail_next(Fault(FaultKind.SERVER_ERROR))
        err = await failure(llm)
        assert (err.outcome, err.status) == (CallOutcome.SERVER_ERROR, 500)

    async def test_scripted_faults_play_in_order_then_calls_succeed(
            self, fake: FakeProvider, llm: LLMClient) -> None:
        fake.fail_next(Fault(FaultKind.OVERLOADED), times=2)
        fake.fail_next(Fault(FaultKind.SERVER_ERROR))
        outcomes = [(await failure(llm)).outcome for _ in range(3)]
        await ask(llm)
        assert outcomes == [CallOutcome.OVERLOADED, CallOutcome.OVERLOADED,
                            CallOutcome.SERVER_ERROR]
        assert [call.status for call in fake.calls][-1] == 200
        assert fake.pending_faults == 0

    @pytest.mark.parametrize(("api", "fault"), [
        (api, fault) for api, faults in SPEND_LIMITS.items() for fault in faults])
    async def test_spend_limit_shapes_are_spend_limits(self, fake: FakeProvider, base_url: str,
                                                       clock: FakeClock, api: str,
                                                       fault: Fault) -> None:
        fake.fail_next(fault)
        async with opened(api, base_url, clock) as llm:
            err = await failure(llm)
        assert err.outcome is CallOutcome.SPEND_LIMIT
        assert err.status == fake.calls[0].status

    @pytest.mark.parametrize(("api", "fault"), [
        ("anthropic", Fault(FaultKind.RATE_LIMITED, code="ramp_limit_exceeded")),
        ("openai", Fault(FaultKind.RATE_LIMITED, error_type="tokens",
                         message="Rate limit reached for gpt-4o on tokens per min (TPM): "
                         "Limit 30000, Used 29000, Requested 2000.")),
    ], ids=["anthropic-ramp", "openai-tpm"])
    async def test_rate_limits_are_not_mistaken_for_spend_limits(
            self, fake: FakeProvider, base_url: str, clock: FakeClock, api: str,
            fault: Fault) -> None:
        fake.fail_next(fault)
        async with opened(api, base_url, clock) as llm:
            err = await failure(llm)
        assert err.outcome is CallOutcome.RATE_LIMITED

    async def test_a_wrong_key_is_rejected(self, fake: FakeProvider, llm: LLMClient) -> None:
        fake.reset(FakeProviderConfig(api_key="sk-the-right-key-000000000000"))
        err = await failure(llm)
        assert (err.outcome, err.status) == (CallOutcome.REJECTED, 401)
        assert fake.count() == 1

    async def test_a_bad_request_is_rejected(self, fake: FakeProvider, llm: LLMClient) -> None:
        fake.fail_next(Fault(FaultKind.INVALID_REQUEST))
        err = await failure(llm)
        assert (err.outcome, err.status) == (CallOutcome.REJECTED, 400)
        assert "invalid_request_error" in str(err)

    async def test_no_answer_within_the_timeout_is_a_timeout(
            self, kind: str, fake: FakeProvider, base_url: str, clock: FakeClock) -> None:
        fake.fail_next(Fault(FaultKind.HANG, seconds=30))
        async with opened(kind, base_url, clock, timeout_s=0.2) as llm:
            began = time.monotonic()
            err = await failure(llm)
            took = time.monotonic() - began
        assert (err.outcome, err.status) == (CallOutcome.TIMEOUT, None)
        assert took < 5

    async def test_a_stream_that_stalls_past_the_timeout_is_a_timeout(
            self, kind: str, fake: FakeProvider, base_url: str, clock: FakeClock) -> None:
        fake.fail_next(Fault(FaultKind.STALL_MID_STREAM, seconds=30))
        async with opened(kind, base_url, clock, timeout_s=0.2) as llm:
            err = await failure(llm)
        assert (err.outcome, err.status) == (CallOutcome.TIMEOUT, None)
        assert fake.calls[0].status == 200

    async def test_a_refused_connection_is_a_server_error(self, kind: str,
                                                          clock: FakeClock) -> None:
        with socket.socket() as sock:  # a port nothing listens on once this socket is closed
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        async with opened(kind, f"http://127.0.0.1:{port}", clock) as llm:
            err = await failure(llm)
        assert (err.outcome, err.status) == (CallOutcome.SERVER_ERROR, None)
        assert KEY not in str(err)

    @pytest.mark.parametrize(("error_type", "outcome"), [
        ("overloaded_error", CallOutcome.OVERLOADED),
        ("rate_limit_error", CallOutcome.RATE_LIMITED),
        ("api_error", CallOutcome.SERVER_ERROR),
    ])
    async def test_an_error_inside_the_stream_is_classified(
            self, fake: FakeProvider, llm: LLMClient, error_type: str,
            outcome: CallOutcome) -> None:
        fake.fail_next(Fault(FaultKind.MID_STREAM_ERROR, error_type=error_type))
        err = await failure(llm)
        assert (err.outcome, err.status) == (outcome, None)
        assert fake.calls[0].status == 200
        assert error_type in str(err)

    async def test_the_key_never_appears_in_an_error(self, fake: FakeProvider,
                                                     llm: LLMClient) -> None:
        fake.fail_next(Fault(FaultKind.UNAUTHORIZED, message="no such key: {key}"))
        err = await failure(llm)
        assert err.outcome is CallOutcome.REJECTED
        assert "no such key" in str(err)
        for text in (str(err), repr(err), *map(str, err.args)):
            assert KEY not in text and KEY[8:] not in text

    async def test_error_messages_are_short(self, fake: FakeProvider, llm: LLMClient) -> None:
        fake.fail_next(Fault(FaultKind.SERVER_ERROR, message="trace " * 2000))
        err = await failure(llm)
        assert len(str(err)) <= len(f"{err.outcome.value}: ") + MESSAGE_LIMIT
        assert "\n" not in str(err)


# -- keys and the factory -------------------------------------------------------------------


async def test_the_key_can_come_from_the_environment(kind: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY", KEY)
    provider = create_fake_provider(FakeProviderConfig(api_key=KEY))
    async with serving(provider) as base_url:
        url = base_url if kind == "anthropic" else f"{base_url}/v1"
        llm = build_client(kind, MODEL, api_key=None, base_url=url, timeout_s=5)
        try:
            result = await ask(llm)
        finally:
            await llm.close()
    assert result.text == default_reply({})


def test_a_client_without_any_key_cannot_be_made(kind: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE",
                 "ANTHROPIC_CONFIG_DIR", "ANTHROPIC_IDENTITY_TOKEN",
                 "ANTHROPIC_IDENTITY_TOKEN_FILE", "OPENAI_API_KEY", "OPENAI_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no credentials profile on disk either
    with pytest.raises(ValueError, match="API key"):
        build_client(kind, MODEL, api_key=None, base_url="http://127.0.0.1:9", timeout_s=1)


async def test_build_client_knows_both_kinds_and_no_other() -> None:
    for kind, cls in (("anthropic", AnthropicClient), ("openai", OpenAIClient)):
        llm = build_client(kind, MODEL, api_key=KEY, base_url="http://127.0.0.1:9",
                           timeout_s=1)
        assert isinstance(llm, cls) and (llm.provider, llm.model) == (kind, MODEL)
        await llm.close()
    with pytest.raises(ValueError, match="unknown provider kind"):
        build_client("gemini", MODEL, api_key=KEY, base_url=None, timeout_s=1)


# -- the fake provider's own limits and shapes ----------------------------------------------


@on_the_shared_server
class TestTheFakesLimits:
    async def test_the_call_over_its_rpm_is_refused_until_the_window_slides(
            self, fake: FakeProvider, llm: LLMClient, clock: FakeClock) -> None:
        fake.reset(FakeProviderConfig(requests_per_minute=2))
        await ask(llm)
        clock.advance(10_000)
        await ask(llm)
        clock.advance(5_000)
        err = await failure(llm)
        assert (err.outcome, err.hints.retry_after_ms) == (CallOutcome.RATE_LIMITED, 45_000)
        assert err.hints.remaining_requests == 0
        clock.advance(45_000)
        await ask(llm)
        assert [(call.status, call.limited) for call in fake.calls] == [
            (200, None), (200, None), (429, "requests"), (200, None)]

    async def test_calls_over_its_tpm_are_refused(self, fake: FakeProvider, llm: LLMClient,
                                                  clock: FakeClock) -> None:
        one_call = estimate_tokens(SYSTEM + ASK[0].content) + estimate_tokens(default_reply({}))
        fake.reset(FakeProviderConfig(tokens_per_minute=one_call * 2 - 1))
        first = await ask(llm)
        err = await failure(llm)
        clock.advance(60_000)
        await ask(llm)
        assert first.input_tokens + first.output_tokens == one_call
        assert err.outcome is CallOutcome.RATE_LIMITED and err.hints.retry_after_ms == 60_000
        assert [call.limited for call in fake.calls] == [None, "tokens", None]

    async def test_an_over_limit_call_gets_real_shaped_429s(self, fake: FakeProvider,
                                                            base_url: str) -> None:
        fake.reset(FakeProviderConfig(requests_per_minute=1))
        body = {"model": MODEL, "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}]}
        async with httpx2.AsyncClient(base_url=base_url) as raw:
            await raw.post("/v1/messages", json=body)
            claude = await raw.post("/v1/messages", json=body)
            gpt = await raw.post("/v1/chat/completions", json=body)
        assert claude.status_code == gpt.status_code == 429
        assert claude.json()["type"] == "error"
        assert claude.json()["error"]["type"] == "rate_limit_error"
        assert claude.headers["retry-after"] == "60"
        assert claude.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert claude.headers["anthropic-ratelimit-requests-reset"] == format_rfc3339(
            START_MS + 60_000)
        error = gpt.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "requests", "rate_limit_exceeded", None)
        assert gpt.headers["x-ratelimit-remaining-requests"] == "0"
        assert gpt.headers["x-ratelimit-reset-requests"] == "1m0s"
        assert gpt.headers["retry-after-ms"] == "60000"

    async def test_it_answers_non_streaming_calls_in_the_sdk_shapes(self, fake: FakeProvider,
                                                                    base_url: str) -> None:
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=base_url,
                                            max_retries=0) as claude:
            message = await claude.messages.create(
                model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}])
        async with openai.AsyncOpenAI(api_key=KEY, base_url=f"{base_url}/v1",
                                      max_retries=0) as gpt:
            chat = await gpt.chat.completions.create(
                model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].type == "text"
        assert message.content[0].text == default_reply({})
        assert (message.stop_reason, message.usage.input_tokens) == ("end_turn", 1)
        assert chat.choices[0].message.content == default_reply({})
        assert chat.usage is not None and chat.usage.prompt_tokens == 1
        assert [(call.api, call.stream) for call in fake.calls] == [
            ("anthropic", False), ("openai", False)]


async def test_the_fake_refuses_calls_over_its_concurrency(kind: str) -> None:
    clock = FakeClock(START_MS)
    provider = create_fake_provider(FakeProviderConfig(max_concurrent=1), now_ms=clock.now_ms)
    provider.fail_next(Fault(FaultKind.STALL_MID_STREAM, seconds=30))
    path = "/v1/messages" if kind == "anthropic" else "/v1/chat/completions"
    body = {"model": MODEL, "max_tokens": 10, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    async with serving(provider) as base_url, httpx2.AsyncClient(base_url=base_url) as raw:
        async with raw.stream("POST", path, json=body) as stalled:
            assert (stalled.status_code, provider.active) == (200, 1)
            async with opened(kind, base_url, clock) as llm:
                err = await failure(llm)
            provider.release()
            await stalled.aread()
        assert provider.active == 0
    assert err.outcome is CallOutcome.RATE_LIMITED and err.hints.retry_after_ms == 1000
    assert [call.limited for call in provider.calls] == [None, "concurrency"]


async def test_a_caller_gone_before_the_stream_starts_gives_its_slot_back(kind: str) -> None:
    """The answer's start cannot be sent (the caller went away): the stream never runs, and
    the call must not stay counted against ``max_concurrent``."""
    provider = create_fake_provider(FakeProviderConfig(max_concurrent=1))
    path = "/v1/messages" if kind == "anthropic" else "/v1/chat/completions"
    body = json.dumps({"model": MODEL, "max_tokens": 10, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, object]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: object) -> None:
        raise OSError("the caller went away")

    with contextlib.suppress(OSError, ClientDisconnect):  # as a server sees the caller gone
        await provider(scope, receive, send)
    assert [call.status for call in provider.calls] == [200]
    assert provider.active == 0


# -- headers and classification, without a server -------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-02-17T03:11:00Z", START_MS + 60_000),
    ("2026-02-17T03:11:00.250Z", START_MS + 60_250),
    ("2026-02-17T03:11:00.123456789Z", START_MS + 60_123),
    ("2026-02-17T04:11:00+01:00", START_MS + 60_000),
    ("2026-02-17T03:11:00", START_MS + 60_000),
    ("next tuesday", None),
    ("", None),
])
def test_rfc3339_timestamps_are_read_to_ms(text: str, expected: int | None) -> None:
    assert parse_rfc3339_ms(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("1s", 1000), ("6m0s", 360_000), ("250ms", 250), ("1h2m3.5s", 3_723_500), ("0s", 0),
    ("0", 0), ("20ms", 20), ("1.5s", 1500), ("16.231s", 16_231), ("7m12s", 432_000),
    ("500us", 1),
    ("", None), ("soon", None), ("1x", None), ("5", None), ("1s junk", None),
])
def test_openai_durations_are_read_to_ms(text: str, expected: int | None) -> None:
    assert parse_duration_ms(text) == expected


@given(st.integers(min_value=0, max_value=10 * 24 * 3_600_000))
def test_the_fakes_durations_read_back(ms: int) -> None:
    assert parse_duration_ms(format_duration(ms)) == ms


@given(st.integers(min_value=0, max_value=4_000_000_000_000))
def test_the_fakes_reset_times_read_back_rounded_up_to_the_second(ms: int) -> None:
    assert parse_rfc3339_ms(format_rfc3339(ms)) == math.ceil(ms / 1000) * 1000


def test_retry_after_is_read_as_seconds_an_http_date_or_ms() -> None:
    date = format_datetime(datetime.fromtimestamp((START_MS + 30_000) / 1000, UTC),
                           usegmt=True)
    assert parse_retry_after_ms({"retry-after": "2"}, START_MS) == 2000
    assert parse_retry_after_ms({"retry-after": "1.5"}, START_MS) == 1500
    assert parse_retry_after_ms({"retry-after": "0.1"}, START_MS) == 100
    assert parse_retry_after_ms({"retry-after": date}, START_MS) == 30_000
    assert parse_retry_after_ms({"retry-after": date}, START_MS + 40_000) == 0
    assert parse_retry_after_ms({"retry-after": "2", "retry-after-ms": "1234.5"},
                                START_MS) == 1235
    assert parse_retry_after_ms({"retry-after": "whenever"}, START_MS) is None
    assert parse_retry_after_ms({"retry-after": "inf", "retry-after-ms": "nan"}, START_MS) is None
    assert parse_retry_after_ms({}, START_MS) is None


def test_anthropic_hints_take_the_least_tokens_and_the_earliest_reset() -> None:
    headers = {
        "Anthropic-RateLimit-Requests-Remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-02-17T03:11:00Z",
        "anthropic-ratelimit-input-tokens-remaining": "30000",
        "anthropic-ratelimit-output-tokens-remaining": "7000",
        "anthropic-ratelimit-tokens-remaining": "37000",
        "anthropic-ratelimit-output-tokens-reset": "2026-02-17T03:10:05Z",
        "anthropic-ratelimit-unified-reset": "1771297801",  # another family, another format
        "retry-after": "5",
    }
    hints = anthropic_hints(headers, START_MS)
    assert (hints.remaining_requests, hints.remaining_tokens) == (49, 7000)
    assert (hints.reset_at, hints.retry_after_ms) == (START_MS + 5000, 5000)


def test_openai_hints_reset_at_now_plus_the_shorter_duration() -> None:
    headers = {"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "149000",
               "x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "250ms"}
    hints = openai_hints(headers, START_MS)
    assert (hints.remaining_requests, hints.remaining_tokens) == (59, 149_000)
    assert (hints.reset_at, hints.retry_after_ms) == (START_MS + 250, None)


@pytest.mark.parametrize(("status", "error", "outcome"), [
    (429, {"error_type": "rate_limit_error"}, CallOutcome.RATE_LIMITED),
    (429, {"code": "insufficient_quota"}, CallOutcome.SPEND_LIMIT),
    (429, {"code": "enforced_spend_limit_reached"}, CallOutcome.SPEND_LIMIT),
    (429, {"code": "ramp_limit_exceeded"}, CallOutcome.RATE_LIMITED),
    (402, {}, CallOutcome.SPEND_LIMIT),
    (400, {"message": "Your credit balance is too low"}, CallOutcome.SPEND_LIMIT),
    (400, {"error_type": "billing_error"}, CallOutcome.SPEND_LIMIT),
    (400, {"message": "Invalid credentials format"}, CallOutcome.REJECTED),
    (401, {"message": "check your billing details"}, CallOutcome.REJECTED),
    (403, {"error_type": "permission_error"}, CallOutcome.REJECTED),
    (404, {}, CallOutcome.REJECTED),
    (413, {}, CallOutcome.REJECTED),
    (408, {}, CallOutcome.TIMEOUT),
    (504, {}, CallOutcome.TIMEOUT),
    (529, {}, CallOutcome.OVERLOADED),
    (503, {}, CallOutcome.OVERLOADED),
    (500, {"message": "billing service down"}, CallOutcome.SERVER_ERROR),
    (502, {}, CallOutcome.SERVER_ERROR),
    (None, {"error_type": "overloaded_error"}, CallOutcome.OVERLOADED),
    (None, {"error_type": "api_error"}, CallOutcome.SERVER_ERROR),
    (None, {"error_type": "billing_error"}, CallOutcome.SPEND_LIMIT),
])
def test_errors_are_classified(status: int | None, error: dict[str, str],
                               outcome: CallOutcome) -> None:
    assert classify_error(status, **error) is outcome
