"""Shared bits of the benchmarks: timing, request making, the Markdown table."""

from __future__ import annotations

import argparse
import itertools
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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
        if isinstance(self.value, int):
            value = f"{self.value:,}"
        else:
            value = f"{self.value:,.2f}" if self.value < 100 else f"{self.value:,.0f}"
        return f"| {self.name} | {f'{value} {self.unit}'.strip()} | {self.goal} |"


def table(figures: list[Figure]) -> str:
    """The figures as a Markdown table."""
    lines = ["| measure | figure | goal |", "|---|---|---|"]
    return "\n".join(lines + [f.row() for f in figures])


def run(measure: Callable[..., list[Figure]], choices: dict[str, Sequence[str]] | None = None,
        **sizes: int) -> None:
    """Command line of one benchmark: ``--NAME N`` for each size (positional arguments of
    ``measure``) and ``--NAME CHOICE`` for each of ``choices`` (keyword arguments, the first
    choice by default), then the Markdown table."""
    parser = argparse.ArgumentParser()
    for name, default in sizes.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    for name, options in (choices or {}).items():
        parser.add_argument(f"--{name}", choices=options, default=options[0])
    args = vars(parser.parse_args())
    print(f"machine: {machine()}\n")
    print(table(measure(*(args[name] for name in sizes),
                        **{name: args[name] for name in choices or {}})))


def machine() -> str:
    """What ran the benchmark: Python, CPU, cores, memory, OS and SQLite."""
    import os
    import sqlite3

    def proc(path: str, key: str) -> str:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return ""
        return next((line.split(":", 1)[1].strip() for line in lines
                     if line.startswith(key)), "")

    cpu = proc("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
    memory = proc("/proc/meminfo", "MemTotal")
    gib = f", {int(memory.split()[0]) / 2**20:.0f} GiB" if memory else ""
    return (f"{platform.python_implementation()} {platform.python_version()} on "
            f"{platform.machine()} ({cpu}), {os.cpu_count()} cores{gib}, "
            f"{platform.system()} {platform.release()}, SQLite {sqlite3.sqlite_version}")


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
