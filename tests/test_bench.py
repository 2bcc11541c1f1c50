"""Smoke test of the peers benchmark: it runs, names every peer and measures each."""

from __future__ import annotations

from bench import peers
from bench.common import Figure


def test_peers_measures_every_peer_in_both_shapes() -> None:
    figures = peers.measure(count=200, agents=10, concurrency=100, rounds=1)

    rates = [f for f in figures if f.unit == "req/s"]
    assert all(f.value > 0 for f in figures)
    for peer in ("gateway engine", "persist-queue", "eventsourcing", "raw sqlite3"):
        for shape in ("one at a time", "batched x100"):
            assert any(f.name.startswith(shape) and peer in f.name for f in rates), (
                f"no {shape} figure for {peer}")
    assert any("gateway" in f.name and "/ persist-queue" in f.name for f in figures)


def test_a_whole_count_prints_without_decimals() -> None:
    assert Figure("lost", 0, "requests", "0").row() == "| lost | 0 requests | 0 |"
    assert Figure("rate", 0.5, "x").row() == "| rate | 0.50 x |  |"
