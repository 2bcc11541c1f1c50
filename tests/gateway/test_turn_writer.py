"""The WebSocket transport's writes: those of one loop turn go out together, in order; and
the event loop a served gateway runs on."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from gateway.base.process import loop_factory, run_on
from gateway.edge.server import TurnWriter


class Recording:
    """A transport that records what is asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return sum(len(d) for kind, d in self.calls if kind == "write")


async def a_turn() -> None:
    """Let the loop run the callbacks scheduled so far."""
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(done.set_result, None)
    await done


async def test_the_first_write_of_a_turn_goes_at_once_and_the_rest_together_at_its_end() -> None:
    transport = Recording()
    writer = TurnWriter(transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    writer.write(b"a")
    writer.write(b"b")
    writer.write(b"c")
    assert transport.calls == [("write", b"a")]
    await a_turn()
    assert transport.calls == [("write", b"a"), ("write", b"bc")]
    writer.write(b"d")  # a new turn: at once again
    assert transport.calls[-1] == ("write", b"d")


async def test_closing_writes_what_is_held_first() -> None:
    transport = Recording()
    writer = TurnWriter(transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    writer.write(b"ack1")
    writer.write(b"ack2")
    writer.write(b"close-frame")
    writer.close()
    assert transport.calls == [("write", b"ack1"), ("write", b"ack2close-frame"),
                               ("close", None)]
    await a_turn()  # nothing more, and nothing written to a closed transport
    assert transport.calls[-1] == ("close", None)


async def test_the_buffer_size_counts_what_is_held() -> None:
    transport = Recording()
    writer = TurnWriter(transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    writer.write(b"12")
    writer.write(b"345")
    assert writer.get_write_buffer_size() == 5


async def test_what_is_held_for_a_connection_gone_meanwhile_is_dropped() -> None:
    transport = Recording()
    writer = TurnWriter(transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    writer.write(b"a")
    writer.write(b"b")
    transport.closing = True  # the peer went away
    await a_turn()
    assert transport.calls == [("write", b"a")]


def test_asyncio_is_asyncio_and_auto_is_uvloop_where_installed() -> None:
    assert loop_factory("asyncio") is None
    installed = importlib.util.find_spec("uvloop") is not None
    assert (loop_factory("auto") is not None) is installed

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run_on(kind(), "asyncio").startswith("asyncio")
    if installed:
        assert run_on(kind(), "auto").startswith("uvloop")
    else:
        with pytest.raises(RuntimeError, match="uvloop"):
            loop_factory("uvloop")
