"""Schema evolution: old event versions are upcast on read, newer ones refused."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from lanes.codec import AGENT_CODEC, Codec, CorruptEvent, UnknownEventVersion, decode, encode
from lanes.events import DECISION_TYPES, INPUT_TYPES, Outcome, RunFinished, Usage
from lanes.upcast import Upcaster
from tests.lanes.harness import Bench


@dataclass(frozen=True, slots=True, kw_only=True)
class Filled:
    """Version 3 of a test event: v1 had ``qty``; v2 renamed it ``quantity``; v3 added
    ``venue`` (every fill before it was on the paper broker)."""

    order_id: str
    quantity: float
    venue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """An event without fields, at version 2."""


def _rename_qty(data: dict[str, Any]) -> dict[str, Any]:
    data["quantity"] = data.pop("qty")
    return data


def _add_venue(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "venue": "paper"}


FILLED_UPCASTERS = (
    Upcaster("Filled", 1, _rename_qty),
    Upcaster("Filled", 2, _add_venue),
    Upcaster("Ping", 1, lambda data: data),
)
CODEC: Codec[Any] = Codec([Filled, Ping], FILLED_UPCASTERS)


def test_a_type_is_one_version_past_its_newest_upcaster() -> None:
    assert CODEC.version("Filled") == 3
    assert CODEC.version("Ping") == 2
    assert AGENT_CODEC.version("RunFinished") == 1  # no agent event has changed shape yet


def test_data_of_the_oldest_version_carries_no_marker_and_is_upcast() -> None:
    event = CODEC.decode("Filled", '{"order_id":"o1","qty":0.5}')
    assert event == Filled(order_id="o1", quantity=0.5, venue="paper")


def test_each_step_of_the_chain_runs_from_the_stored_version() -> None:
    event = CODEC.decode("Filled", '{"_v":2,"order_id":"o1","quantity":0.5}')
    assert event == Filled(order_id="o1", quantity=0.5, venue="paper")


def test_new_data_is_written_at_the_current_version_and_read_back() -> None:
    fill = Filled(order_id="o2", quantity=1.5, venue="binance")
    type_name, data = CODEC.encode(fill)
    assert (type_name, json.loads(data)) == (
        "Filled", {"_v": 3, "order_id": "o2", "quantity": 1.5, "venue": "binance"})
    assert data.startswith('{"_v":3,')
    assert CODEC.decode(type_name, data) == fill
    assert CODEC.encode(Ping()) == ("Ping", '{"_v":2}')
    assert CODEC.decode("Ping", '{"_v":2}') == Ping()
    assert CODEC.decode("Ping", "{}") == Ping()  # version 1


def test_a_version_newer_than_the_code_is_refused_with_what_to_do() -> None:
    with pytest.raises(UnknownEventVersion, match="version 4 was written by a newer gateway"):
        CODEC.decode("Filled", '{"_v":4,"order_id":"o1","quantity":1,"venue":"x"}')
    # A type still at version 1 here, written at version 2 by a newer gateway:
    with pytest.raises(UnknownEventVersion, match="RunFinished version 2"):
        decode("RunFinished", '{"_v":2,"at":1,"run_id":"r1","outcome":"trade"}')


@pytest.mark.parametrize(
    "data",
    ['{"_v":3,"order_id":"o1"}', '{"_v":0,"order_id":"o1","qty":1}', '{"order_id":"o1"}',
     "[1, 2]", "not json", '{"_v":"2","order_id":"o1","quantity":1}'],
    ids=["missing field", "version 0", "upcaster fails", "not an object", "not JSON",
         "version not a number"],
)
def test_broken_data_is_a_corrupt_event(data: str) -> None:
    with pytest.raises(CorruptEvent, match="Filled"):
        CODEC.decode("Filled", data)


def test_upcaster_chains_must_start_at_1_without_gaps() -> None:
    with pytest.raises(ValueError, match="leave no gap"):
        Codec([Filled], [Upcaster("Filled", 2, _add_venue)])
    with pytest.raises(ValueError, match="two upcasters"):
        Codec([Filled], [Upcaster("Filled", 1, _add_venue), Upcaster("Filled", 1, _add_venue)])
    with pytest.raises(ValueError, match="do not exist"):
        Codec([Filled], [Upcaster("Nope", 1, _add_venue)])


# --------------------------------------- a shape change of a real event, over a real log


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinishedV2:
    """What `RunFinished` could become: usage flattened, outcome renamed ``result``."""

    at: int
    run_id: str
    result: Outcome
    input_tokens: int
    output_tokens: int
    orders: tuple[Any, ...] = ()
    calls: tuple[Any, ...] = ()


def _flatten_usage(data: dict[str, Any]) -> dict[str, Any]:
    usage = data.pop("usage", {})
    data["input_tokens"] = usage.get("inputTokens", 0)
    data["output_tokens"] = usage.get("outputTokens", 0)
    data["result"] = data.pop("outcome")
    return data


def test_a_log_written_today_still_reads_after_a_change_to_an_events_shape() -> None:
    bench = Bench()
    bench.send()
    bench.finish("trade", usage=Usage(input_tokens=900, output_tokens=45))
    bench.send()
    bench.finish("no_trade")
    stored = [encode(entry.event) for entry in bench.log]  # written by today's code: v1

    RunFinishedV2.__name__ = "RunFinished"  # the class keeps its name across the change
    others = [cls for cls in INPUT_TYPES + DECISION_TYPES if cls is not RunFinished]
    tomorrow: Codec[Any] = Codec([*others, RunFinishedV2],
                                 [Upcaster("RunFinished", 1, _flatten_usage)])
    read = [tomorrow.decode(type_name, data) for type_name, data in stored]

    finished = [event for event in read if isinstance(event, RunFinishedV2)]
    assert [(f.result, f.input_tokens, f.output_tokens) for f in finished] == [
        (Outcome.TRADE, 900, 45), (Outcome.NO_TRADE, 100, 20)]
    assert [e for e in read if not isinstance(e, RunFinishedV2)] == [
        e.event for e in bench.log if not isinstance(e.event, RunFinished)]
    # And what tomorrow's code writes, it reads back at version 2.
    type_name, data = tomorrow.encode(finished[0])
    assert data.startswith('{"_v":2,') and tomorrow.decode(type_name, data) == finished[0]
