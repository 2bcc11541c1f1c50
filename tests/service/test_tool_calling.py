"""Native tool calling through the official SDKs against the fake provider, both APIs.

Each call goes through the SDK, a socket and uvicorn; the fake answers tool calls in the API's
own shapes (streamed in fragments) and refuses a conversation whose calls and results do not
pair up, as the real services do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic.types
import httpx2
import openai.types.chat
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from gateway.llm.fake_provider import (
    FakeProvider,
    FakeProviderConfig,
    ToolUse,
    create_fake_provider,
    scripted,
    serving,
)
from gateway.llm.fake_tools import pairing_problem
from gateway.llm.port import (
    Completion,
    LLMClient,
    Message,
    ProviderCallError,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from gateway.llm.providers import AnthropicClient, OpenAIClient
from gateway.llm.turns import OpenAIToolCalls, parse_arguments
from lanes.gate.events import CallOutcome

KEY = "sk-test-0123456789abcdefghijklmnop"
MODEL = "fake-model-1"
SYSTEM = "You trade BTCUSD. Use the tools."
ASK = Message("user", "What is BTCUSD doing? Buy 1 if it is cheap.")
TOOLS = (
    ToolSpec("market_snapshot", "The latest price of a symbol.",
             {"type": "object", "properties": {"symbol": {"type": "string"}},
              "required": ["symbol"]}),
    ToolSpec("place_order", "Place an order.",
             {"type": "object", "properties": {"symbol": {"type": "string"},
                                               "side": {"enum": ["buy", "sell"]},
                                               "quantity": {"type": "number"}},
              "required": ["symbol", "side", "quantity"]}),
)
STEPS: list[list[tuple[str, dict[str, Any]]]] = [
    [("market_snapshot", {"symbol": "BTCUSD"})],
    [("place_order", {"symbol": "BTCUSD", "side": "buy", "quantity": 1}),
     ("market_snapshot", {"symbol": "ETHUSD", "note": "ünïcode \"quoted\" {braces}"})],
]
FINAL = '{"decision": "done"}'
KINDS = ["anthropic", "openai"]

on_the_shared_server = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[tuple[FakeProvider, str]]:
    provider = create_fake_provider()
    async with serving(provider) as base_url:
        yield provider, base_url


@pytest.fixture
def fake(server: tuple[FakeProvider, str]) -> Iterator[FakeProvider]:
    """The shared fake, scripted with `STEPS`, in deltas of 3 characters (so every call's
    arguments arrive in many fragments)."""
    provider, _ = server
    provider.reset(FakeProviderConfig(reply=scripted(STEPS, lambda _: FINAL), chunk_chars=3))
    yield provider
    provider.release()


@contextlib.asynccontextmanager
async def opened(kind: str, base_url: str) -> AsyncIterator[LLMClient]:
    llm: LLMClient
    if kind == "anthropic":
        llm = AnthropicClient(MODEL, api_key=KEY, base_url=base_url, timeout_s=5.0)
    else:
        llm = OpenAIClient(MODEL, api_key=KEY, base_url=f"{base_url}/v1", timeout_s=5.0)
    try:
        yield llm
    finally:
        await llm.close()


async def complete(llm: LLMClient, messages: list[Message]) -> Completion:
    return await llm.complete(system=SYSTEM, messages=messages, max_tokens=512, tools=TOOLS)


def answered(calls: tuple[ToolCall, ...], *, error: bool = False) -> Message:
    return Message("user", "", tool_results=tuple(
        ToolResult(call.id, f"result of {call.name}", is_error=error) for call in calls))


@on_the_shared_server
@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_loop_runs_to_its_final_answer_in_the_sdks_own_shapes(
        kind: str, fake: FakeProvider, server: tuple[FakeProvider, str]) -> None:
    async with opened(kind, server[1]) as llm:
        conversation = [ASK]
        first = await complete(llm, conversation)
        assert [(c.name, dict(c.arguments)) for c in first.tool_calls] == [
            ("market_snapshot", {"symbol": "BTCUSD"})]
        assert first.stop_reason == ("tool_use" if kind == "anthropic" else "tool_calls")
        conversation += [Message("assistant", first.text, tool_calls=first.tool_calls),
                         answered(first.tool_calls)]
        second = await complete(llm, conversation)
        assert [(c.name, dict(c.arguments)) for c in second.tool_calls] == [
            (name, dict(args)) for name, args in STEPS[1]]
        assert len({c.id for c in first.tool_calls + second.tool_calls}) == 3
        assert all(c.malformed is None for c in second.tool_calls)
        conversation += [Message("assistant", second.text, tool_calls=second.tool_calls),
                         answered(second.tool_calls, error=True)]
        final = await complete(llm, conversation)
    assert final.tool_calls == ()
    assert final.text == FINAL
    assert final.stop_reason == ("end_turn" if kind == "anthropic" else "stop")
    # every turn was a real call, and the results count as input
    assert [c.status for c in fake.calls] == [200, 200, 200]
    assert final.input_tokens > second.input_tokens > first.input_tokens


@on_the_shared_server
@pytest.mark.parametrize("kind", KINDS)
async def test_a_conversation_whose_calls_go_unanswered_is_refused_as_the_api_does(
        kind: str, fake: FakeProvider, server: tuple[FakeProvider, str]) -> None:
    async with opened(kind, server[1]) as llm:
        first = await complete(llm, [ASK])
        asked = Message("assistant", "", tool_calls=first.tool_calls)
        with pytest.raises(ProviderCallError) as unanswered:
            await complete(llm, [ASK, asked, Message("user", "go on")])
        wrong = Message("user", "", tool_results=(ToolResult("call_nobody", "x"),))
        with pytest.raises(ProviderCallError) as stray:
            await complete(llm, [ASK, asked, wrong])
    for caught in (unanswered, stray):
        assert caught.value.outcome is CallOutcome.REJECTED
        assert caught.value.status == 400
    assert first.tool_calls[0].id in str(unanswered.value)


@on_the_shared_server
@pytest.mark.parametrize("kind", KINDS)
async def test_without_tools_offered_the_script_answers_in_text(
        kind: str, fake: FakeProvider, server: tuple[FakeProvider, str]) -> None:
    async with opened(kind, server[1]) as llm:
        plain = await llm.complete(system=SYSTEM, messages=[ASK], max_tokens=512)
    assert plain.tool_calls == () and plain.text == FINAL


@on_the_shared_server
@pytest.mark.parametrize("kind", KINDS)
async def test_a_whole_answer_with_tool_calls_reads_as_the_sdks_own_types(
        kind: str, fake: FakeProvider, server: tuple[FakeProvider, str]) -> None:
    fake.reset(FakeProviderConfig(reply=lambda _: ToolUse(
        (("market_snapshot", {"symbol": "BTCUSD"}),), text="Let me look.")))
    tools: list[dict[str, Any]] = [
        {"name": "market_snapshot", "description": "", "input_schema": {"type": "object"}}]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "tools": tools,
                            "messages": [{"role": "user", "content": "hi"}]}
    path = "/v1/messages" if kind == "anthropic" else "/v1/chat/completions"
    async with httpx2.AsyncClient(base_url=server[1]) as http:
        answer = (await http.post(path, json=body)).json()
    if kind == "anthropic":
        message = anthropic.types.Message.model_validate(answer)
        assert [b.type for b in message.content] == ["text", "tool_use"]
        assert message.stop_reason == "tool_use"
        block = message.content[1]
        assert isinstance(block, anthropic.types.ToolUseBlock)
        assert block.input == {"symbol": "BTCUSD"}
    else:
        chat = openai.types.chat.ChatCompletion.model_validate(answer)
        choice = chat.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me look."
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and calls[0].type == "function"
        assert calls[0].function.arguments == '{"symbol": "BTCUSD"}'


# -- pieces ----------------------------------------------------------------------------------


def test_arguments_that_are_not_a_json_object_are_kept_as_malformed() -> None:
    assert parse_arguments('{"a": 1}') == ({"a": 1}, None)
    assert parse_arguments("") == ({}, None)
    assert parse_arguments("[1, 2]") == ({}, "[1, 2]")
    assert parse_arguments('{"a": ') == ({}, '{"a": ')


@given(st.dictionaries(st.text(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=8)),
    st.integers(min_value=1, max_value=7))
def test_openai_arguments_put_together_from_any_split_read_back(
        arguments: dict[str, Any], size: int) -> None:
    import json

    from openai.types.chat.chat_completion_chunk import (
        ChoiceDeltaToolCall,
        ChoiceDeltaToolCallFunction,
    )
    text = json.dumps(arguments)
    calls = OpenAIToolCalls()
    calls.add([ChoiceDeltaToolCall(index=0, id="call_1", type="function",
                                   function=ChoiceDeltaToolCallFunction(name="t", arguments=""))])
    for start in range(0, len(text), size):
        calls.add([ChoiceDeltaToolCall(index=0, function=ChoiceDeltaToolCallFunction(
            arguments=text[start:start + size]))])
    assert calls.calls() == (ToolCall("call_1", "t", arguments),)


def test_the_pairing_rules_accept_a_proper_conversation_of_either_api() -> None:
    anthropic_body = {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                      "content": "ok"}]}]}
    openai_body = {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"}]}
    assert pairing_problem("anthropic", anthropic_body) is None
    assert pairing_problem("openai", openai_body) is None
    assert pairing_problem("openai", {"messages": openai_body["messages"][:2]}) is not None
    assert pairing_problem("anthropic", {"messages": anthropic_body["messages"][:2]}) is not None
