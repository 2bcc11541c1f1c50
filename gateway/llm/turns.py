"""The conversation and its tools in each SDK's own wire shapes, and tool calls read back.

Anthropic Messages: tools as ``{name, description, input_schema}``; an assistant turn's tool
calls are ``tool_use`` blocks after its text; their results go first in the next user turn as
``tool_result`` blocks (``is_error`` for an error). OpenAI chat completions: tools as
``{type: function, function: {name, description, parameters}}``; an assistant message carries
``tool_calls`` with the arguments as JSON text; each result is a ``tool`` message naming its
``tool_call_id``, before the user's text. A model's arguments that are not a JSON object are
kept as `ToolCall.malformed` for the caller to answer with a tool error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from anthropic.types import (
    ContentBlock,
    MessageParam,
    TextBlockParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
)
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from gateway.llm.port import Message, ToolCall, ToolSpec


def parse_arguments(text: str) -> tuple[dict[str, Any], str | None]:
    """A model's tool arguments from JSON text: the object, or ``{}`` and the text itself
    when it is not a JSON object (empty text is an empty object)."""
    if not text.strip():
        return {}, None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}, text
    return (value, None) if isinstance(value, dict) else ({}, text)


# -- Anthropic ------------------------------------------------------------------------------


def anthropic_tools(tools: Sequence[ToolSpec]) -> list[ToolParam]:
    """The tools as the Messages API takes them."""
    return [ToolParam(name=tool.name, description=tool.description,
                      input_schema=dict(tool.input_schema))
            for tool in tools]


def anthropic_turns(messages: Iterable[Message]) -> list[MessageParam]:
    """The conversation as Messages API turns."""
    return [_anthropic_turn(message) for message in messages]


def _anthropic_turn(message: Message) -> MessageParam:
    if message.role == "assistant":
        if not message.tool_calls:
            return {"role": "assistant", "content": message.content}
        blocks: list[TextBlockParam | ToolUseBlockParam] = []
        if message.content:
            blocks.append(TextBlockParam(type="text", text=message.content))
        blocks += [ToolUseBlockParam(type="tool_use", id=call.id, name=call.name,
                                     input=dict(call.arguments))
                   for call in message.tool_calls]
        return {"role": "assistant", "content": blocks}
    if not message.tool_results:
        return {"role": "user", "content": message.content}
    parts: list[ToolResultBlockParam | TextBlockParam] = [
        ToolResultBlockParam(type="tool_result", tool_use_id=result.call_id,
                             content=result.content, is_error=result.is_error)
        for result in message.tool_results]
    if message.content:
        parts.append(TextBlockParam(type="text", text=message.content))
    return {"role": "user", "content": parts}


def anthropic_tool_calls(content: Iterable[ContentBlock]) -> tuple[ToolCall, ...]:
    """The ``tool_use`` blocks of a final message, in order."""
    calls: list[ToolCall] = []
    for block in content:
        if block.type != "tool_use":
            continue
        given: Any = block.input
        if isinstance(given, dict):
            calls.append(ToolCall(block.id, block.name, given))
        else:
            calls.append(ToolCall(block.id, block.name, {}, json.dumps(given)))
    return tuple(calls)


# -- OpenAI ---------------------------------------------------------------------------------


def openai_tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionFunctionToolParam]:
    """The tools as chat completions take them."""
    return [ChatCompletionFunctionToolParam(type="function", function={
        "name": tool.name, "description": tool.description,
        "parameters": dict(tool.input_schema)}) for tool in tools]


def openai_turns(system: str, messages: Iterable[Message]) -> list[ChatCompletionMessageParam]:
    """The system prompt (as a system message) and the conversation as chat messages."""
    chat: list[ChatCompletionMessageParam] = []
    if system:
        chat.append({"role": "system", "content": system})
    for message in messages:
        chat += _openai_turn(message)
    return chat


def _openai_turn(message: Message) -> list[ChatCompletionMessageParam]:
    if message.role == "assistant":
        if not message.tool_calls:
            return [ChatCompletionAssistantMessageParam(role="assistant",
                                                        content=message.content)]
        calls = [ChatCompletionMessageFunctionToolCallParam(
            id=call.id, type="function",
            function={"name": call.name, "arguments": call.malformed
                      if call.malformed is not None else json.dumps(dict(call.arguments))})
            for call in message.tool_calls]
        return [ChatCompletionAssistantMessageParam(role="assistant",
                                                    content=message.content or None,
                                                    tool_calls=calls)]
    turns: list[ChatCompletionMessageParam] = [
        ChatCompletionToolMessageParam(role="tool", tool_call_id=result.call_id,
                                       content=_openai_result(result.content, result.is_error))
        for result in message.tool_results]
    if message.content or not message.tool_results:
        turns.append(ChatCompletionUserMessageParam(role="user", content=message.content))
    return turns


def _openai_result(content: str, is_error: bool) -> str:
    # (chat completions have no error flag on a tool message: it is said in the text)
    return f"error: {content}" if is_error else content


class OpenAIToolCalls:
    """Tool calls put together from a chat completion stream's deltas (each call arrives in
    pieces: its id and name first, its arguments' text in fragments, keyed by index)."""

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]

    def add(self, deltas: Sequence[ChoiceDeltaToolCall] | None) -> None:
        """Take one chunk's tool-call deltas."""
        for delta in deltas or ():
            call = self._calls.setdefault(delta.index, ["", "", ""])
            if delta.id:
                call[0] = delta.id
            function = delta.function
            if function is not None:
                if function.name:
                    call[1] += function.name
                if function.arguments:
                    call[2] += function.arguments
        return None

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls, in index order."""
        out: list[ToolCall] = []
        for index in sorted(self._calls):
            call_id, name, text = self._calls[index]
            arguments, malformed = parse_arguments(text)
            out.append(ToolCall(call_id or f"call_{index}", name, arguments, malformed))
        return tuple(out)


def tool_text(arguments: Mapping[str, Any]) -> str:
    """A tool call's arguments as compact JSON text (what token estimates count)."""
    return json.dumps(dict(arguments), separators=(",", ":"), sort_keys=True)
