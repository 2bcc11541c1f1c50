"""Tool calling in the fake provider, as the real APIs do it.

A reply may be a `ToolUse`: the model calls tools (and may say something first). The fake
answers it in the API's own shapes (`gateway.llm.fake_formats`): Anthropic ``tool_use``
blocks with ``input_json_delta`` pieces when streamed and ``stop_reason: tool_use``; OpenAI
``tool_calls`` with the arguments' text in fragments and ``finish_reason: tool_calls``. Like
the real services, it refuses (400) a conversation whose tool calls and results do not pair
up: every call answered in the very next turn, no result for a call that was not made.

`scripted` makes a reply from a script of tool steps: the n-th assistant turn of a
conversation makes the n-th step's calls, then the final answer, so concurrent conversations
each follow the script on their own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["anthropic", "openai"]
"""The two APIs the fake speaks."""

ToolStep = Sequence[tuple[str, Mapping[str, Any]]]
"""One assistant turn's tool calls: (tool name, arguments) each."""


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A scripted answer that calls ``calls`` (name, arguments), after ``text``."""

    calls: tuple[tuple[str, Mapping[str, Any]], ...]
    text: str = ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def offered_tools(body: Mapping[str, Any]) -> list[str]:
    """The names of the tools a request offers (either API's shape)."""
    names = []
    for tool in _list(body.get("tools")):
        tool = _dict(tool)
        name = tool.get("name", _dict(tool.get("function")).get("name"))
        if isinstance(name, str):
            names.append(name)
    return names


def assistant_turns(body: Mapping[str, Any]) -> int:
    """How many assistant turns a request's conversation holds."""
    return sum(1 for turn in _list(body.get("messages"))
               if _dict(turn).get("role") == "assistant")


def scripted(steps: Sequence[ToolStep], final: Callable[[Mapping[str, Any]], str]
             ) -> Callable[[Mapping[str, Any]], str | ToolUse]:
    """A reply that makes ``steps[n]``'s calls at the n-th assistant turn of a conversation
    that offers tools, and answers ``final`` after the last step (or when offered none)."""
    def reply(body: Mapping[str, Any]) -> str | ToolUse:
        turn = assistant_turns(body)
        if turn < len(steps) and offered_tools(body):
            return ToolUse(tuple((name, dict(args)) for name, args in steps[turn]))
        return final(body)
    return reply


def block_text(block: Mapping[str, Any]) -> str:
    """What a content block adds to the prompt's token count: text, a tool call's input, a
    tool result's content."""
    kind = block.get("type")
    if kind == "tool_use":
        return json.dumps(block.get("input"))
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            return "".join(str(_dict(part).get("text", "")) for part in content)
        return str(content or "")
    return str(block.get("text", ""))


def call_text(turn: Mapping[str, Any]) -> str:
    """The arguments' text of an OpenAI assistant turn's tool calls."""
    return "".join(str(_dict(_dict(call).get("function")).get("arguments", ""))
                   for call in _list(turn.get("tool_calls")))


def pairing_problem(api: Api, body: Mapping[str, Any]) -> str | None:
    """Why the conversation's tool calls and results do not pair up (the real APIs' 400
    messages), or None."""
    turns = [_dict(turn) for turn in _list(body.get("messages"))]
    return _anthropic_pairing(turns) if api == "anthropic" else _openai_pairing(turns)


def _anthropic_pairing(turns: list[dict[str, Any]]) -> str | None:
    asked: list[str] = []  # the tool_use ids of the assistant turn before
    for index, turn in enumerate(turns):
        blocks = [_dict(b) for b in _list(turn.get("content"))]
        if turn.get("role") == "user":
            answered = [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
            missing = [i for i in asked if i not in answered]
            if missing:
                return (f"messages.{index}: `tool_use` ids were found without `tool_result` "
                        f"blocks immediately after: {', '.join(missing)}. Each `tool_use` "
                        "block must have a corresponding `tool_result` block in the next "
                        "message.")
            unexpected = [i for i in answered if i not in asked]
            if unexpected:
                return (f"messages.{index}.content.0: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {unexpected[0]}. Each `tool_result` block "
                        "must have a corresponding `tool_use` block in the previous message.")
            asked = []
        else:
            if asked:
                return (f"messages.{index}: `tool_use` ids were found without `tool_result` "
                        f"blocks immediately after: {', '.join(asked)}.")
            asked = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
    if asked:
        return (f"messages.{len(turns) - 1}: the conversation ends with `tool_use` blocks "
                "and no `tool_result` for them.")
    return None


def _openai_pairing(turns: list[dict[str, Any]]) -> str | None:
    asked: list[str] = []
    for turn in turns:
        role = turn.get("role")
        if role == "tool":
            call_id = str(turn.get("tool_call_id"))
            if call_id not in asked:
                return ("Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.")
            asked.remove(call_id)
            continue
        if asked:
            return ("An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not "
                    f"have response messages: {', '.join(asked)}")
        if role == "assistant":
            asked = [str(_dict(c).get("id")) for c in _list(turn.get("tool_calls"))]
    if asked:
        return ("An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(asked)}")
    return None
