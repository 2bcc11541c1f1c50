"""Schedules over HTTP: add, change, pause, resume, run now and remove, each an event."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from gateway.base.clock import FakeClock
from lanes import AgentConfig, Mode, replay, verify
from lanes.events import RequestReceived, ScheduleApplied
from lanes.schedules import Schedule
from store import MemoryEventStore
from tests.e2e.live import Live, running
from tests.gateway.support import ManualReasoner, log_of, until
from tests.gateway.test_schedules import fired, looked

ADMIN = "admin-secret"
BASE = "/api/agents/desk/schedules"


@pytest.fixture
async def live() -> AsyncIterator[Live]:
    clock = FakeClock()  # (nothing fires by itself: the test moves no time)
    reasoner = ManualReasoner()
    async with running(MemoryEventStore(clock=clock.now_ms),
                       {"desk": AgentConfig(mode=Mode.QUEUE)}, lambda _: reasoner, clock,
                       engine_options={"schedules": {
                           "desk": [Schedule(id="open", cron="30 9 * * 1-5",
                                             timezone="America/New_York")]}}) as gateway:
        async def looked() -> bool:
            return gateway.engine.schedules.scheduler.passes > 0

        await until(looked, "the config file's schedules applied")
        yield gateway


async def test_schedules_are_managed_over_http_and_recorded(live: Live) -> None:
    async with live.client(ADMIN) as admin, live.client("control-secret") as ops:
        agent = (await ops.get("/api/agents/desk")).json()
        assert [s["id"] for s in agent["schedules"]] == ["open"]
        # 2026-02-17 03:10 UTC: the next 09:30 in New York (EST) is 14:30 UTC that day.
        assert agent["schedules"][0]["nextFireAt"] == "2026-02-17T14:30:00Z"
        assert agent["schedules"][0]["fromFile"] is True

        added = await admin.put(f"{BASE}/close", json={
            "cron": "0 16 * * 1-5", "timezone": "America/New_York",
            "payload": {"scope": "positions"}, "priority": "normal", "catchUp": "once"})
        assert added.status_code == 200, added.text
        view = added.json()["schedule"]
        assert (view["id"], view["nextFireAt"], view["catchUp"], view["lastFireAt"]) == (
            "close", "2026-02-17T21:00:00Z", "once", None)

        paused = await admin.post(f"{BASE}/close/pause")
        assert paused.json()["schedule"]["nextFireAt"] is None
        assert (await admin.post(f"{BASE}/close/pause")).json()["changed"] is False
        resumed = await admin.post(f"{BASE}/close/resume")
        assert resumed.json()["schedule"]["nextFireAt"] == "2026-02-17T21:00:00Z"

        ran = await ops.post(f"{BASE}/close/run")  # an operator may fire it by hand
        assert ran.status_code == 200, ran.text
        assert ran.json()["decision"] == "accepted"

        listed = (await ops.get(BASE)).json()["schedules"]
        assert [s["id"] for s in listed] == ["open", "close"]
        assert (await admin.delete(f"{BASE}/close")).json() == {"removed": "close"}
        assert [s["id"] for s in (await ops.get(BASE)).json()["schedules"]] == ["open"]

    log = await log_of(live.engine.store)
    changes = [(e.event.schedule_id, e.event.principal) for e in log
               if isinstance(e.event, ScheduleApplied)]
    assert changes == [("open", "config"), ("close", "root"), ("close", "root"),
                       ("close", "root"), ("close", "root")]
    manual = [e.event for e in log if isinstance(e.event, RequestReceived)]
    assert len(manual) == 1
    assert manual[0].principal == "ops"
    assert manual[0].request.source == "schedule:manual"
    assert manual[0].request.payload["manual"] is True
    assert manual[0].request.payload["scope"] == "positions"
    assert replay(log)["desk"] == live.engine.state("desk")
    assert verify(log) is None


async def test_firings_late_firings_and_missed_fire_times_are_counters_on_metrics(
        live: Live) -> None:
    clock = live.engine.clock
    assert isinstance(clock, FakeClock)

    async def scraped() -> dict[str, int]:
        async with live.client("viewer-secret") as viewer:
            text = (await viewer.get("/metrics")).text
        found = re.findall(r"^gateway_schedule_(\w+)_total (\d+)$", text, re.M)
        kinds = [line for line in text.splitlines()
                 if line.startswith("# TYPE gateway_schedule_")]
        assert kinds and all(line.endswith(" counter") for line in kinds), kinds
        return {name: int(value) for name, value in found}

    assert await scraped() == {"firings": 0, "late_firings": 0, "missed_firings": 0}
    async with live.client(ADMIN) as admin:
        added = await admin.put(f"{BASE}/tick", json={"everyMs": 60_000})
        assert added.status_code == 200, added.text
        await looked(live.engine)
        clock.advance(60_000)  # its first fire time, on time
        await fired(live.engine, 1)
        assert await scraped() == {"firings": 1, "late_firings": 0, "missed_firings": 0}
        clock.advance(3 * 60_000 + 5_000)  # a loop stalled through three fire times
        await fired(live.engine, 2)
        ran = await admin.post(f"{BASE}/tick/run")  # by hand: not one of the scheduler's
        assert ran.json()["decision"] == "accepted"
        assert await scraped() == {"firings": 2, "late_firings": 1, "missed_firings": 2}


@pytest.mark.parametrize(("token", "method", "path", "body", "status", "words"), [
    (ADMIN, "PUT", f"{BASE}/x", {"cron": "61 * * * *"}, 422, "is not a cron expression"),
    (ADMIN, "PUT", f"{BASE}/x", {"everyMs": 60_000, "timezone": "Nowhere/Else"}, 422,
     "not a known time zone"),
    (ADMIN, "PUT", f"{BASE}/x", {"everyMs": 60_000, "cron": "* * * * *"}, 422,
     "exactly one of 'cron' and 'everyMs'"),
    (ADMIN, "PUT", f"{BASE}/x", {"everyMs": 60_000, "id": "y"}, 422, "is not 'x'"),
    (ADMIN, "PUT", f"{BASE}/x", {"everyMs": 60_000, "every": 1}, 422, "unknown field"),
    (ADMIN, "PUT", f"{BASE}/x", [1], 422, "must be a JSON object"),
    (ADMIN, "DELETE", f"{BASE}/nope", None, 404, "has no schedule 'nope'"),
    (ADMIN, "POST", f"{BASE}/nope/pause", None, 404, "has no schedule 'nope'"),
    ("control-secret", "PUT", f"{BASE}/x", {"everyMs": 60_000}, 403, ""),
    ("viewer-secret", "POST", f"{BASE}/open/run", None, 403, ""),
    (ADMIN, "GET", "/api/agents/ghost/schedules", None, 404, "unknown agent"),
    ("control-secret", "POST", "/api/agents/desk/requests", {
        "requestId": "forged", "createdAt": "2026-02-17T03:10:00Z", "agentId": "desk",
        "kind": "scheduled_audit", "dedupeKey": "schedule:open:9999999999999"}, 403,
     "are the scheduler's own"),
    ("control-secret", "POST", "/api/agents/desk/requests", {
        "requestId": "schedule:open:1", "createdAt": "2026-02-17T03:10:00Z",
        "agentId": "desk", "kind": "hook_trigger"}, 403, "are the scheduler's own"),
])
async def test_bad_schedule_calls_get_a_typed_error_and_change_nothing(
        live: Live, token: str, method: str, path: str, body: object, status: int,
        words: str) -> None:
    before = await live.engine.store.last_position()
    async with live.client(token) as client:
        answer = await client.request(method, path, json=body)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["message"]
    assert await live.engine.store.last_position() == before
    assert list(live.engine.state("desk").schedules) == ["open"]

