"""`Intake.take(parsed=True)` spares a request the doorway's look (the edge parsed it from JSON
text, so it reads back by construction); should that promise ever be broken by a request
that cannot even be written as JSON, it is still refused before anything changes, and the
other requests of the call go on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.errors import Unstorable
from gateway.runtime.engine import Engine
from gateway.runtime.intake import settled
from lanes import AgentConfig, AgentRequest, Mode
from lanes.events import RequestReceived
from store import MemoryEventStore
from tests.gateway.support import ManualReasoner, log_of, request


@pytest.fixture
async def store() -> MemoryEventStore:
    return MemoryEventStore()


@pytest.fixture
async def engine(store: MemoryEventStore) -> AsyncIterator[Engine]:
    reasoner = ManualReasoner()
    running = Engine(store, {"a1": AgentConfig(mode=Mode.FOLLOWUP)}, reasoners=lambda _: reasoner)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def test_a_broken_promise_that_cannot_be_written_is_refused_and_the_rest_go_on(
        store: MemoryEventStore, engine: Engine) -> None:
    good = request("a1")
    # Built without validation, with a lone surrogate: no JSON text can carry it.
    bad = AgentRequest.model_construct(**{**request("a1").__dict__, "request_id": "bad-\ud800"})
    answers = await settled(engine.take([bad, good], "feed", parsed=True))

    refused, accepted = answers
    assert isinstance(refused, Unstorable)
    assert "cannot be written as JSON" in str(refused)
    assert not isinstance(accepted, Exception) and accepted.decision == "accepted"
    received = [e.event.request.request_id for e in await log_of(store)
                if isinstance(e.event, RequestReceived)]
    assert received == [good.request_id]
    assert engine.state("a1").version == len(await log_of(store))


@pytest.mark.parametrize("parsed", [False, True])
async def test_a_parsed_request_is_stored_as_a_checked_one_is(
        store: MemoryEventStore, engine: Engine, parsed: bool) -> None:
    given = request("a1", payload={"n": [1, 2.5, None, True], "s": "é"})
    [ack] = await settled(engine.take([given], "feed", parsed=parsed))
    assert not isinstance(ack, Exception) and ack.decision == "accepted"
    [stored] = [e.event for e in await log_of(store) if isinstance(e.event, RequestReceived)]
    assert stored.request == given
