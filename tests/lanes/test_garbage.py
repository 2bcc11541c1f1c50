"""Deciding leaves no reference cycles behind: what an input decided is freed as soon as
nothing refers to it, not by the cyclic collector, whose passes over a big desk's garbage
hold the event loop (bench.scale's loop-stall probe)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from lanes import AgentConfig, Mode
from tests.lanes.harness import Bench


@pytest.fixture
def no_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    gc.collect()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def test_decisions_leave_no_cycles(no_collector: None) -> None:
    bench = Bench(AgentConfig(mode=Mode.FOLLOWUP))
    for _ in range(20):
        bench.send()  # a run starts
        bench.send()  # one waits
        bench.finish()  # the run ends, the next starts
        bench.fail()  # the second fails
        bench.send()
        bench.control("emergency_stop")  # aborted
        bench.control("resume")
        bench.advance(60_000)
    assert gc.collect() == 0
