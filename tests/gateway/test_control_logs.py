"""Every operator control is one log line once its decision is in the log: a halt at
WARNING, the rest at INFO, with the agent, the request and who sent it; no line for the
reasoning lane's requests."""

from __future__ import annotations

import logging

import pytest

from gateway.runtime.engine import Engine
from lanes import AgentConfig
from store import MemoryEventStore
from tests.gateway.support import control, request


async def test_controls_are_logged_once_each_and_requests_are_not(
        caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(MemoryEventStore(), {"desk": AgentConfig()})
    await engine.start()
    with caplog.at_level(logging.INFO, logger="gateway.controls"):
        await engine.submit(request("desk"), "ops")
        await engine.submit(control("desk", "emergency_stop"), "ops")
        await engine.submit(control("desk", "pause"), "ops")  # refused while HALTED
        await engine.submit(control("desk", "resume"), "ops")
    await engine.stop()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records
             if r.name == "gateway.controls"]
    assert [level for level, _ in lines] == ["WARNING", "INFO", "INFO"]
    assert "control emergency_stop of desk by ops" in lines[0][1]
    assert lines[0][1].endswith("ACTIVE -> HALTED")
    assert "control pause of desk by ops" in lines[1][1] and "rejected" in lines[1][1]
    assert lines[2][1].endswith("HALTED -> ACTIVE")
    assert all(getattr(r, "agent_id", None) == "desk" for r in caplog.records
               if r.name == "gateway.controls")
