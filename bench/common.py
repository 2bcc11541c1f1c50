"""Shared bits of the benchmarks: timing, request making, the Markdown table."""

from __future__ import annotations

import argparse
import itertools
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from lanes import AgentRequest, parse_request

CREATED = datetime(2026, 2, 17, 3, 10, tzinfo=UTC).isoformat()
_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure with its unit and, where there is one, its goal."""

    name: str
    value: float
    unit: str
    goal: str = ""

    def row(self) -> str:
        """A Markdown table row."""
        value = f"{self.value:,.2f}" if self.value < 100 else f"{self.value:,.0f}"
        return f"| {self.name} | {value} {self.unit} | {self.goal} |"


def table(figures: list[Figure]) -> str:
    """The figures as a Markdown table."""
    lines = ["| measure | figure | goal |", "|---|---|---|"]
    return "\n".join(lines + [f.row() for f in figures])


def run(measure: Callable[..., list[Figure]], **sizes: int) -> None:
    """Command line of one benchmark: ``--NAME N`` for each size, then the Markdown table."""
    parser = argparse.ArgumentParser()
    for name, default in sizes.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    args = vars(parser.parse_args())
    print(f"machine: {machine()}\n")
    print(table(measure(*(args[name] for name in sizes))))


def machine() -> str:
    """What ran the benchmark."""
    import os

    return (f"{platform.python_implementation()} {platform.python_version()} on "
            f"{platform.machine()}, {os.cpu_count()} cores")


@contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)


def requests(agents: list[str], count: int, kind: str = "hook_trigger") -> list[AgentRequest]:
    """``count`` distinct hook triggers spread round-robin over ``agents``."""
    out = []
    for n, agent in zip(range(count), itertools.cycle(agents), strict=False):
        i = next(_ids)
        out.append(parse_request({
            "requestId": f"b{i}", "createdAt": CREATED, "agentId": agent, "kind": kind,
            "dedupeKey": f"bench:{i}", "payload": {"symbol": "BTCUSD", "n": n},
        }))
    return out
