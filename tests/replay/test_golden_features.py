"""The golden log of issue 24's features (`tests/golden/record_features.py`) holds them:
tool loops, approvals, a request's own ``ifBusy``, gate weights. (That it imports and
verifies clean is `tests/replay/test_golden_versions.py`'s.)"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from lanes.replay import verify
from tests.replay.test_golden_versions import GOLDEN, agent_log, lines

FEATURES = GOLDEN / "features-2026-11-28.jsonl.gz"


@pytest.fixture(scope="module")
def events() -> list[dict[str, Any]]:
    return lines(FEATURES)


def of(events: list[dict[str, Any]], kind: str, stream: str | None = None
       ) -> list[dict[str, Any]]:
    """The data of the events of type ``kind`` (of ``stream`` only, if named)."""
    return [e["data"] for e in events
            if e["type"] == kind and (stream is None or e["stream"] == stream)]


def test_it_decodes_verifies_and_is_recorded_under_version_2(events: list[dict[str, Any]]) -> None:
    log = agent_log(events)
    assert len(log) > 400 and verify(log) is None
    assert {d["version"] for d in of(events, "PolicyAdopted")} == {2}


def test_runs_are_tool_loops_of_every_read_and_order_tool(
        events: list[dict[str, Any]]) -> None:
    counts = Counter(e["type"] for e in events)
    assert counts["ModelCalled"] == counts["StepDecided"] > 30
    assert counts["ToolReturned"] == counts["ToolResultTaken"] > 20
    returned = {d["name"] for d in of(events, "ToolReturned") if d["ok"]}
    assert {"market_snapshot", "positions", "open_orders", "place_order",
            "cancel_order"} <= returned
    assert any(re.fullmatch(r"tools-r\d+-s\d+-\d+", d["order_id"])
               for d in of(events, "OrderAccepted"))
    assert any(d["by"].startswith("tools-r") for d in of(events, "OrderCancelRequested"))


def test_tool_calls_are_refused_with_the_reason_and_a_step_budget_is_spent(
        events: list[dict[str, Any]]) -> None:
    errors = [r["error"] for d in of(events, "StepDecided") for r in d["refused"]]
    assert any("does not exist" in error for error in errors)
    assert any("is not one of this agent's tools" in error for error in errors)
    assert any(error.startswith("place_order: qty") for error in errors)
    assert any(error.startswith("no open order") for error in errors)
    assert any("StepBudgetSpent" in d["error"] for d in of(events, "RunErrored", "loop"))


def test_orders_wait_for_approval_and_each_way_of_ending_is_there(
        events: list[dict[str, Any]]) -> None:
    requested = {d["approval_id"] for d in of(events, "ApprovalRequested")}
    decided = of(events, "ApprovalDecided")
    assert sorted(d["approval_id"] for d in decided) == sorted(requested)  # once each
    assert {d["approved"] for d in decided} == {True, False}
    assert any(d["by"] == "expired" for d in decided)
    assert any(not d["approved"] and d["reason"] == "too early" for d in decided)  # reject
    assert any("stopped" in d["reason"] for d in decided if not d["approved"])
    accepted = {d["order_id"] for d in of(events, "OrderAccepted")}
    assert {d["approval_id"] for d in decided if d["approved"]} <= accepted
    # Above a notional: the small order went through at once, the large one waited.
    big = of(events, "ApprovalRequested", "big")
    assert big and all(d["notional"] > 5_000 for d in big)
    assert any(d["order_id"] not in {b["order_id"] for b in big}
               for d in of(events, "OrderAccepted", "big"))
    refused = [d["reason"] for d in of(events, "RequestRejected", "appr")]
    assert len([r for r in refused if r.startswith("no order waits for approval")]) == 2


def test_requests_choose_what_they_do_while_the_agent_is_busy(
        events: list[dict[str, Any]]) -> None:
    assert any("ifBusy reject" in d["reason"] and d["transient"]
               for d in of(events, "RequestRejected", "busy"))
    assert any(d["reason"].startswith("ifBusy interrupt")
               for d in of(events, "FallbackApplied", "busy"))
    assert [d["reason"] for d in of(events, "RunAborted", "busy")] == ["interrupt"]
    assert of(events, "RunSteered", "busy")


def test_agents_of_different_weights_contend_at_the_gate(
        events: list[dict[str, Any]]) -> None:
    requested = of(events, "SlotRequested", "provider:sim")
    weights = {d["agent_id"]: d.get("weight", 1) for d in requested}
    assert (weights["w1"], weights["w4"], weights["big"]) == (1, 4, 3)
    agent_of = {d["slot_id"]: d["agent_id"] for d in requested}
    order = [agent_of[d["slot_id"]] for d in of(events, "SlotGranted")
             if agent_of[d["slot_id"]] in ("w1", "w4")]
    # While both queues wait, the heavier agent is served more (each gets every call in
    # the end):
    first = Counter(order[:12])
    assert first["w4"] >= 2 * first["w1"] > 0
    assert of(events, "SlotQueued")
