"""Time travel as a story over HTTP, on a real SQLite log with a known history: the grouped
timeline worded as the CLI's, jumps to stops, drops and suppressions, an agent's state at a
position (with its provider gate's view) and the diff between two positions, each replayed
from the log and checked against an independent fold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.base.clock import FakeClock
from gateway.edge.openapi import openapi_document
from gateway.llm.reasoner import RunContext, RunResult
from gateway.runtime.gate import ProviderGate
from gateway.tools.logs import clock
from gateway.tools.timeline import timeline_command
from lanes import AgentConfig, Mode, replay, status
from lanes.config import Budgets
from lanes.events import OrderIntent
from lanes.gate.events import GateLimits
from store import SqliteEventStore
from tests.e2e.live import Live, running
from tests.e2e.test_service import control, trigger
from tests.gateway.support import ManualReasoner, log_of, next_event, until


class GatedReasoner(ManualReasoner):
    """A manual reasoner whose runs hold a slot of their provider gate while they think."""

    async def run(self, ctx: RunContext) -> RunResult:
        assert ctx.gate is not None
        async with ctx.gate.using(ctx.agent_id, ctx.run_id):
            return await super().run(ctx)


async def next_run(reasoner: ManualReasoner, fake: FakeClock) -> RunContext:
    """The next run to start, the fake clock moved on until one does (a released slot may
    be kept a moment for its agent's next call: the gate's fair grace)."""

    async def started() -> RunContext | None:
        if reasoner._started.empty():
            fake.advance(250)
            return None
        return await reasoner.started()

    return await until(started, "the next run")


BUY = OrderIntent(symbol="BTCUSD", side="buy", qty=0.5)


@dataclass
class Desk:
    """The gateway, its log file, and the positions of the history's landmarks."""

    live: Live
    db: Path
    reasoner: ManualReasoner
    marks: dict[str, int]
    ids: dict[str, str]


async def submit(live: Live, body: dict[str, Any]) -> dict[str, Any]:
    async with live.client() as http:
        answer = await http.post(f"/api/agents/{body['agentId']}/requests", json=body)
        assert answer.status_code == 200, answer.text
        ack: dict[str, Any] = answer.json()
        return ack


@pytest.fixture
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    """btc (followup, cap 2, two runs an hour) and eth share a provider gate of one call at
    a time. btc: a runs; b and c wait; d drops b; a ends, c runs (eth's call waited at the
    gate meanwhile); c ends, d is suppressed by the hourly budget; an emergency stop."""
    db = tmp_path / "story.db"
    store = SqliteEventStore(db)
    fake = FakeClock()
    gate = ProviderGate(store, "sim", GateLimits(max_concurrent=1), clock=fake)
    reasoner = GatedReasoner()
    agents = {"btc": AgentConfig(mode=Mode.FOLLOWUP, cap=2,
                                 budgets=Budgets(max_runs_per_hour=2)),
              "eth": AgentConfig(mode=Mode.FOLLOWUP)}
    options = {"gates": {"sim": gate}, "agent_gates": {"btc": "sim", "eth": "sim"}}
    async with running(store, agents, lambda _: reasoner, fake,
                       engine_options=options) as live:
        marks: dict[str, int] = {}
        ids: dict[str, str] = {}
        a = await submit(live, trigger("btc", "a"))
        first = await next_run(reasoner, fake)
        assert first.agent_id == "btc"
        fake.advance(1_000)
        eth = await submit(live, trigger("eth", "x"))
        marks["eth waits"] = (await next_event(store, "SlotQueued", eth["position"])).position
        for key in ("b", "c", "d"):
            fake.advance(1_000)
            ids[key] = (await submit(live, trigger("btc", key)))["requestId"]
        marks["drop"] = (await next_event(store, "RequestDropped", a["position"])).position
        fake.advance(1_000)
        reasoner.finish(first.run_id)
        for _ in range(2):  # eth's call (it waited first), then btc's run of c (a trade)
            run = await next_run(reasoner, fake)
            fake.advance(1_000)
            if run.agent_id == "btc":
                reasoner.finish(run.run_id, "trade", orders=(BUY,))
            else:
                reasoner.finish(run.run_id)
        marks["suppressed"] = (await next_event(store, "RunsSuppressed")).position
        fake.advance(1_000)
        stop = await submit(live, control("btc", "emergency_stop"))
        marks["stop"] = (await next_event(store, "ControlApplied", stop["position"] - 1)
                         ).position
        yield Desk(live, db, reasoner, marks, ids)


async def get(live: Live, path: str, **params: Any) -> Any:
    async with live.client("viewer-secret") as http:
        answer = await http.get(path, params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_the_story_groups_each_input_with_its_decisions_in_the_cli_timelines_words(
    desk: Desk,
) -> None:
    story = await get(desk.live, "/api/agents/btc/story")
    printed: list[str] = []
    assert await timeline_command(desk.db, "btc", None, None, printed.append) == 0
    lines = []
    for group in story["groups"]:
        lines.append(f"{group['position']:>8}  {clock(group['at']):<23}  {group['text']}")
        lines += [f"{d['position']:>8}  {'':<23}    -> {d['text']}" for d in group["decisions"]]
    assert lines == printed[2:-1]  # between the CLI's header and its summary
    dropped = next(g for g in story["groups"] if "drop" in g["kinds"])
    assert dropped["text"].startswith("RequestReceived") and "hook_trigger/normal d" in \
        dropped["text"]
    drop = next(d for d in dropped["decisions"] if d["kinds"] == ["drop"])
    assert drop["position"] == desk.marks["drop"]
    assert drop["text"].startswith(f"dropped {desk.ids['b']}: ")

    near = await get(desk.live, "/api/agents/btc/story", at=desk.marks["drop"], around=1)
    assert near["groups"][near["index"]] == dropped
    assert len(near["groups"]) == 3
    ranged = await get(desk.live, "/api/agents/btc/story", limit=2)
    assert ranged["groups"] == story["groups"][:2] and ranged["more"] is True


async def test_jumps_find_the_next_and_previous_stop_drop_and_suppression(desk: Desk) -> None:
    async def jump(kind: str, **where: int) -> int | None:
        found = await get(desk.live, "/api/agents/btc/story/find", kind=kind, **where)
        position: int | None = found["position"]
        return position

    for kind, mark in (("stop", "stop"), ("drop", "drop"), ("suppression", "suppressed")):
        assert await jump(kind, after=0) == desk.marks[mark]
        assert await jump(kind, after=desk.marks[mark]) is None
        assert await jump(kind, before=desk.marks[mark] + 1) == desk.marks[mark]
        assert await jump(kind, before=desk.marks[mark]) is None


async def test_the_moment_is_the_agent_replayed_to_that_position(desk: Desk) -> None:
    store = desk.live.engine.store
    entries = await log_of(store)
    at = desk.marks["suppressed"]
    moment = await get(desk.live, "/api/agents/btc/moment", position=at)
    folded = replay([e for e in entries if e.position <= at])["btc"]
    view = status(folded, folded.now)
    assert moment["eventPosition"] == at and moment["version"] == folded.version
    assert moment["budgets"]["runsLastHour"] == view.runs_last_hour == 2
    assert moment["budgets"]["maxRunsPerHour"] == 2
    assert moment["suppressed"] == {"reason": "hourly", "until": view.suppressed_until}
    assert [p["requestId"] for p in moment["pending"]] == [desk.ids["d"]]
    assert moment["trading"] == "ACTIVE" and moment["why"].startswith("runs suppressed (hourly)")
    [order] = moment["orders"]
    assert (order["symbol"], order["side"], order["qty"]) == ("BTCUSD", "buy", 0.5)
    assert order["cancelRequested"] is False

    now = await get(desk.live, "/api/agents/btc/moment")
    live = desk.live.engine.state("btc")
    assert now["version"] == live.version and now["trading"] == "HALTED"
    assert now["why"] == "halted: no run starts until a resume"
    assert now["budgets"]["runsLastHour"] == status(live, live.now).runs_last_hour


async def test_the_moment_shows_what_the_provider_gate_held_for_the_agent(desk: Desk) -> None:
    waiting = await get(desk.live, "/api/agents/eth/moment", position=desk.marks["eth waits"])
    gate = waiting["gate"]
    assert gate["provider"] == "sim" and gate["maxConcurrent"] == 1
    [call] = gate["waiting"]
    assert call["why"] == "max_concurrent: 1 calls in flight"
    assert gate["inFlight"] == [] and "own log" in gate["note"]
    later = await get(desk.live, "/api/agents/eth/moment")
    assert later["gate"]["waiting"] == [] and later["gate"]["inFlight"] == []
    assert later["gate"]["note"].startswith("no run of this agent was active")


async def diff(desk: Desk, start: int, end: int) -> Any:
    return await get(desk.live, "/api/agents/btc/diff", **{"from": start, "to": end})


async def test_the_diff_says_what_changed_between_two_positions(desk: Desk) -> None:
    marks = desk.marks
    last = await desk.live.engine.store.last_position()  # the stop and what it caused
    stopped = await diff(desk, marks["suppressed"], last)
    assert {"what": "trading", "before": "ACTIVE", "after": "HALTED"} in stopped["changes"]
    assert {"what": "controls applied", "before": 0, "after": 1} in stopped["changes"]
    assert stopped["pending"] == {"added": [], "removed": []}
    [order] = stopped["orders"]  # the stop asked to cancel the open order
    assert order["change"] == "changed" and order["cancelRequested"] is True
    assert stopped["from"]["eventPosition"] == marks["suppressed"]

    before_drop = marks["drop"] - 1
    dropping = await diff(desk, before_drop, marks["drop"] + 1)
    assert dropping["pending"]["removed"] == [desk.ids["b"]]
    assert desk.ids["d"] in dropping["pending"]["added"]
    same = await diff(desk, marks["stop"], marks["stop"])
    assert same["changes"] == [] and same["orders"] == [] and same["positions"] == []


async def test_bad_questions_get_a_typed_error(desk: Desk) -> None:
    last = await desk.live.engine.store.last_position()
    async with desk.live.client("viewer-secret") as http:
        cases: tuple[tuple[str, dict[str, Any], str], ...] = (
            ("story/find", {"kind": "boom", "after": 0}, "kind"),
            ("story/find", {"kind": "stop"}, "after"),
            ("story/find", {"kind": "stop", "after": 0, "before": 3}, "after"),
            ("moment", {"position": last + 1}, "position"),
            ("moment", {"position": "x"}, "position"),
            ("diff", {"to": 1}, "from"),
            ("story", {"from": last + 5}, "from"),
        )
        for path, params, field in cases:
            answer = await http.get(f"/api/agents/btc/{path}", params=params)
            assert answer.status_code == 422, (path, answer.text)
            assert answer.json()["field"] == field, (path, answer.json())
        assert (await http.get("/api/agents/ghost/moment")).status_code == 404
    async with desk.live.client("scoped-secret") as http:
        assert (await http.get("/api/agents/eth/story")).status_code == 403


def test_the_openapi_document_types_each_story_answer() -> None:
    document = openapi_document()
    for path, shape in (("story", "StoryJson"), ("story/find", "FoundJson"),
                        ("moment", "MomentJson"), ("diff", "DiffJson")):
        operation = document["paths"][f"/api/agents/{{agent_id}}/{path}"]["get"]
        schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{shape}"}, path
    schemas = document["components"]["schemas"]
    assert {"budgets", "suppressed", "gate", "eventPosition"} <= set(
        schemas["MomentJson"]["properties"])
    assert {"from", "to", "changes", "pending"} <= set(schemas["DiffJson"]["properties"])
