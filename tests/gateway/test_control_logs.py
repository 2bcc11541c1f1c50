"""Every operator control is one log line once its decision is in the log: a halt at
WARNING, the rest at INFO, with the agent, the request and who sent it; no line for the
reasoning lane's requests."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import StorageFailed
from gateway.runtime.engine import Engine
from gateway.runtime.held import HeldControls
from lanes import AgentConfig
from lanes.events import RequestReceived
from store import MemoryEventStore
from tests.gateway.support import control, request


async def test_controls_are_logged_once_each_and_requests_are_not(
        caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(MemoryEventStore(), {"desk": AgentConfig()})
    await engine.start()
    with caplog.at_level(logging.INFO, logger="gateway.controls"):
        await engine.submit(request("desk"), "ops")
        stop = control("desk", "emergency_stop")
        await engine.submit(stop, "ops")
        again = await engine.submit(stop, "ops")  # the same request sent again: no line
        assert again.repeated
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


def test_a_held_stop_is_logged_once_when_stored_and_a_plain_one_not_by_the_holder(
        caplog: pytest.LogCaptureFixture) -> None:
    held = HeldControls()
    plain = RequestReceived(at=0, request=control("desk", "emergency_stop"), principal="ops")
    refused = RequestReceived(at=0, request=control("desk", "emergency_stop"), principal="ops")
    with caplog.at_level(logging.INFO, logger="gateway.controls"):
        held.decided(plain, 3)  # stored at once: said by the intake, not here
        held.committed(3)
        held.decided(refused, 5)
        answer = held.refuse(refused, StorageFailed("the disk is full"), None)
        assert isinstance(answer, StorageFailed) and answer.held
        held.committed(4)  # (an earlier append)
        assert caplog.records == []
        held.decided(refused, 6)  # stored at last, after a rebuild
        held.committed(6)
        held.committed(7)
    [line] = caplog.records
    assert line.levelname == "WARNING" and "stored, held while" in line.getMessage()
    assert getattr(line, "agent_id", None) == "desk"
    assert getattr(line, "request_id", None) == refused.request.request_id
