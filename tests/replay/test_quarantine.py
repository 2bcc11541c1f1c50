"""A log that holds an event this version cannot read (an older version let it in) names it
at every start, replay and verify, and `gateway quarantine` sets it aside so the rest starts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.base.quarantine import UnreadableEvent
from gateway.cli import main
from gateway.runtime.engine import Engine
from lanes import AgentConfig, Mode, decide
from lanes.codec import decode, encode
from lanes.events import ConfigApplied, ConfigChanged, Event, Quarantined, RequestReceived
from lanes.evolve import fold
from lanes.requests import AgentRequest
from lanes.state import AgentState
from lanes.streams import QUARANTINE_STREAM
from store import Append, NewEvent, SqliteEventStore
from tests.gateway.support import ManualReasoner, request

AGENTS = {"a1": AgentConfig(mode=Mode.QUEUE)}
Capture = pytest.CaptureFixture[str]
DEEP = '{"x":' * 210 + "1" + "}" * 210
"""A payload nested past what the decoder reads (an older version stored such)."""


async def run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``gateway argv`` (in a thread: it runs its own loop)."""
    try:
        code = await asyncio.to_thread(main, list(argv))
    except SystemExit as exited:
        code = int(exited.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def started(db: Path) -> Engine:
    engine = Engine(SqliteEventStore(db), AGENTS, reasoners=ManualReasoner.per_agent())
    await engine.start()
    return engine


async def poison(db: Path, spoil: Callable[[str], str], kind: str = "hook_trigger",
                 payload: dict[str, object] | None = None) -> int:
    """Append, as an older version would have, a request whose stored text ``spoil`` made
    unreadable, with the decisions made of it; the position of the request."""
    store = SqliteEventStore(db)
    await store.open()
    try:
        records = await store.read_stream("a1")
        state = fold(AgentState(agent_id="a1"), [_decode(r.type, r.data) for r in records])
        received = RequestReceived(at=state.now + 1, principal="old-version",
                                   request=request("a1", kind, payload=payload or {"x": 1}))
        version = state.version
        decisions = decide(state, received)
        name, text = encode(received)
        events = [NewEvent(f"old-{version}-0", name, spoil(text)),
                  *(NewEvent(f"old-{version}-{n}", *encode(d))
                    for n, d in enumerate(decisions, 1))]
        recorded = await store.append(Append("a1", events, version))
        return recorded[0].position
    finally:
        await store.close()


def _decode(type_name: str, data: str) -> Event:
    return decode(type_name, data)


def queued(engine: Engine) -> list[AgentRequest]:
    """The requests of agent a1 in its queue or its active run."""
    state = engine.state("a1")
    running = [] if state.active is None else [p.request for p in state.active.requests]
    return running + [p.request for p in state.pending]


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """A log with one agent and a request already in it."""
    path = tmp_path / "log.db"
    engine = await started(path)
    await engine.submit(request("a1"))
    await engine.stop()
    return path


async def test_a_deep_payload_is_named_everywhere_and_set_aside(db: Path,
                                                               capsys: Capture) -> None:
    position = await poison(db, lambda text: text.replace('{"x":1}', DEEP))
    code, out, _ = await run(capsys, "verify", str(db))
    assert code == 1
    assert f"position {position} (stream 'a1'" in out and "gateway quarantine" in out
    code, _, err = await run(capsys, "replay", str(db), "--agent", "a1")
    assert code == 2 and f"position {position} (stream 'a1'" in err
    with pytest.raises(UnreadableEvent, match=f"position {position} "):
        await started(db)
    code, out, _ = await run(capsys, "quarantine", str(db), "--position", str(position))
    assert code == 0, out
    assert "set aside the unreadable RequestReceived" in out and "the stream folds again" in out
    assert (await run(capsys, "verify", str(db)))[0] == 0
    engine = await started(db)  # the rest starts, the request still in its queue
    try:
        assert [r.payload for r in queued(engine) if "quarantined" in r.payload] == [
            {"quarantined": "it cannot be read by this version"}]
        entries = engine.reader.entries(await engine.store.read())
        assert [e.position for e in entries if isinstance(e.event, RequestReceived)
                and "quarantined" in e.event.request.payload] == [position]
    finally:
        await engine.stop()
    # Recorded as an event of its own, once; the original stays where it was.
    store = SqliteEventStore(db)
    await store.open()
    try:
        [record] = await store.read_stream(QUARANTINE_STREAM)
        assert [e["position"] for e in json.loads(record.data)["events"]] == [position]
        assert DEEP in (await store.read(position - 1, 1))[0].data
    finally:
        await store.close()
    code, _, err = await run(capsys, "quarantine", str(db), "--position", str(position))
    assert code == 2 and "set aside already" in err


async def test_a_user_control_stored_without_payload_is_repaired_as_a_message(
        db: Path, capsys: Capture) -> None:
    position = await poison(db, lambda text: text.replace(',"payload":{"message":""}', ""),
                            kind="user_control", payload={"message": ""})
    assert (await run(capsys, "verify", str(db)))[0] == 1
    assert (await run(capsys, "quarantine", str(db), "--position", str(position)))[0] == 0
    assert (await run(capsys, "verify", str(db)))[0] == 0
    engine = await started(db)
    try:
        assert [r.payload for r in queued(engine) if "quarantined" in r.payload] == [
            {"quarantined": "it cannot be read by this version", "message": ""}]
    finally:
        await engine.stop()


async def test_an_unreadable_config_is_set_aside_with_its_decisions(
        db: Path, capsys: Capture) -> None:
    store = SqliteEventStore(db)
    await store.open()
    try:
        records = await store.read_stream("a1")
        state = fold(AgentState(agent_id="a1"), [_decode(r.type, r.data) for r in records])
        changed = ConfigChanged(at=state.now + 1, config=AgentConfig(debounce_ms=5),
                                principal="admin")
        version = state.version
        decisions = decide(state, changed)
        name, text = encode(changed)
        # An older version took a debounce of 1e29 ms, which this one refuses.
        bad = text.replace('"debounceMs":5', '"debounceMs":100000000000000000000000000000')
        recorded = await store.append(Append("a1", [
            NewEvent("cfg-0", name, bad),
            *(NewEvent(f"cfg-{n}", *encode(d)) for n, d in enumerate(decisions, 1))], version))
    finally:
        await store.close()
    position = recorded[0].position
    code, out, _ = await run(capsys, "verify", str(db))
    assert code == 1 and f"position {position} (stream 'a1'" in out
    code, out, _ = await run(capsys, "quarantine", str(db), "--position", str(recorded[1].position),
                       "--reason", "debounce out of range")
    assert code == 0, out
    assert out.count("-> Quarantined") == len(recorded)  # the input and its decision
    assert (await run(capsys, "verify", str(db)))[0] == 0
    engine = await started(db)
    try:
        entries = engine.reader.entries(await engine.store.read())
        assert not [e for e in entries if isinstance(e.event, ConfigApplied)  # never applied
                    and e.event.config.debounce_ms == 5]
        stood_in = [e.event for e in entries if isinstance(e.event, Quarantined)]
        assert [q.original_type for q in stood_in] == [r.type for r in recorded]
        assert {q.reason for q in stood_in} == {"debounce out of range"}
    finally:
        await engine.stop()


async def test_quarantine_waits_for_no_gateway_serving_the_log(db: Path,
                                                              capsys: Capture) -> None:
    position = await poison(db, lambda text: text.replace('{"x":1}', DEEP))
    serving = SqliteEventStore(db, exclusive=True)
    await serving.open()
    try:
        code, _, err = await run(capsys, "quarantine", str(db), "--position", str(position))
        assert code == 2 and "in use by another gateway process" in err
    finally:
        await serving.close()


async def test_quarantine_refuses_a_position_with_no_event(tmp_path: Path, capsys: Capture) -> None:
    code, _, err = await run(capsys, "quarantine", str(tmp_path / "none.db"), "--position", "3")
    assert code == 2 and "no event log" in err
