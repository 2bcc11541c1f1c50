"""The probes: `/livez` answers while the process serves, `/readyz` only while it is ready for
traffic (503 with the reason otherwise), `/healthz` as it always did."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.errors import StorageFailed
from gateway.runtime.engine import Engine
from lanes import AgentConfig
from store import StoreError
from tests.e2e.live import Live, running
from tests.gateway.support import ManualReasoner, request
from tests.gateway.test_core import Flaky

TIMEOUT = 5.0


@pytest.fixture
def store() -> Flaky:
    return Flaky()


@pytest.fixture
async def live(store: Flaky) -> AsyncIterator[Live]:
    reasoner = ManualReasoner()
    async with running(store, {"btc": AgentConfig()}, lambda _: reasoner) as gw:
        yield gw


@dataclass
class Replicas:
    behind: str | None = None

    def behind_reason(self) -> str | None:
        return self.behind


@dataclass
class Member:
    """What the probes read of a cluster member."""

    adopting: list[str] = field(default_factory=list)
    replicas: Replicas = field(default_factory=Replicas)
    member: str = "http://127.0.0.1:1#0"
    owned: list[str] = field(default_factory=list)
    view: Any = None


async def probes(live: Live) -> tuple[int, dict[str, Any], int, dict[str, Any]]:
    async with live.client(None) as http:  # no token: the probes are anyone's
        livez, readyz = await http.get("/livez"), await http.get("/readyz")
    return livez.status_code, livez.json(), readyz.status_code, readyz.json()


async def test_a_running_gateway_is_live_and_ready(live: Live) -> None:
    assert await probes(live) == (200, {"status": "ok"}, 200, {"status": "ready"})


async def test_a_log_that_cannot_be_written_makes_it_unready_never_dead(
    live: Live, store: Flaky,
) -> None:
    store.refusing = True  # (its reason: "the event log is locked")
    with pytest.raises(StorageFailed):
        await asyncio.wait_for(live.engine.submit(request("btc")), TIMEOUT)
    live_code, _, ready_code, ready = await probes(live)
    assert (live_code, ready_code, ready["status"]) == (200, 503, "unready")
    assert ready["reason"] == "the event log cannot be written: it is locked by another " \
                              "process"
    async with live.client(None) as http:
        assert (await http.get("/healthz")).status_code == 503  # as it always was
    store.refusing = False
    await asyncio.wait_for(live.engine.submit(request("btc")), TIMEOUT)
    assert (await probes(live))[2] == 200


async def test_a_log_that_cannot_be_read_makes_it_unready(
    live: Live, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def unreadable() -> int:
        raise StoreError("could not read the event log: disk I/O error")

    monkeypatch.setattr(live.service.log, "last_position", unreadable)
    live_code, _, ready_code, ready = await probes(live)
    assert (live_code, ready_code) == (200, 503)
    assert ready["reason"] == "the event log cannot be read (the server's log says why)"


async def test_a_stopping_gateway_is_unready(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Engine, "running", property(lambda _self: False))
    live_code, _, ready_code, ready = await probes(live)
    assert (live_code, ready_code, ready["reasons"]) == (200, 503, ["the gateway is stopping"])


async def test_a_member_loading_agents_or_behind_the_log_is_unready(live: Live) -> None:
    member = Member(adopting=["btc", "provider:sim"])
    live.service.cluster = member  # type: ignore[assignment]
    try:
        _, _, code, ready = await probes(live)
        assert code == 503
        assert ready["reasons"] == ["2 agents or gates of this process are still being loaded"]
        member.adopting = []
        member.replicas.behind = "following the log failed (OSError()); starting again"
        _, _, code, ready = await probes(live)
        assert code == 503 and ready["reasons"] == [
            "reads of the agents of other processes are behind the log: following the log "
            "failed (OSError()); starting again"]
        member.replicas.behind = None
        assert (await probes(live))[2:] == (200, {"status": "ready"})
    finally:
        live.service.cluster = None
