"""AgentRequest validation: bad input is refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from lanes import InvalidRequest, Kind, Priority, parse_request

GOOD: dict[str, Any] = {
    "requestId": "ar_1",
    "createdAt": "2026-02-17T03:10:00Z",
    "agentId": "agent_btc_5m",
    "kind": "hook_trigger",
    "priority": "normal",
    "dedupeKey": "two_green:BTCUSD:5m:2026-02-17T03:10:00Z",
    "payload": {},
}


def fields_of(error: InvalidRequest) -> list[str]:
    return [e.field for e in error.errors]


def test_the_design_example_parses() -> None:
    request = parse_request(GOOD)
    assert request.kind is Kind.HOOK_TRIGGER and request.priority is Priority.NORMAL
    assert request.model_dump(mode="json", exclude_none=True)["createdAt"] == (
        "2026-02-17T03:10:00Z"
    )


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"colour": "red"}, "colour", "unknown field"),
        ({"kind": "gossip"}, "kind", "user_control"),
        ({"priority": "urgent"}, "priority", "high"),
        ({"agentId": "has space"}, "agentId", "pattern"),
        ({"createdAt": "2026-02-17T03:10:00"}, "createdAt", "timezone"),
        ({"requestId": ""}, "requestId", "at least 1"),
        ({"kind": "user_control", "payload": {"action": "explode"}}, "payload", "unknown action"),
        ({"kind": "user_control", "payload": {}}, "payload", "'action'"),
        ({"kind": "user_control", "payload": {"action": "cancel_order"}}, "payload", "orderId"),
        ({"kind": "agent_call", "payload": {"depth": 0}}, "payload", "depth"),
    ],
)
def test_bad_requests_name_the_field(change: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request({**GOOD, **change})
    assert fields_of(caught.value) == [field]
    assert words in str(caught.value)


def test_missing_fields_are_all_named() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request({"kind": "hook_trigger"})
    assert set(fields_of(caught.value)) == {"requestId", "createdAt", "agentId"}


def test_a_control_request_names_its_action() -> None:
    request = parse_request(
        {**GOOD, "kind": "user_control", "payload": {"action": "emergency_stop"}}
    )
    assert request.action is not None and request.action.value == "emergency_stop"
