"""Prometheus text exposition of the gateway's own measures (no client library needed)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""For waits that are mostly nothing and at worst minutes (a provider gate's slots)."""


@dataclass(slots=True)
class Histogram:
    """A cumulative histogram in seconds, as Prometheus expects."""

    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, seconds: float) -> None:
        """Record one observation."""
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """The ``_bucket``, ``_sum`` and ``_count`` samples."""
        sep = "," if labels else ""
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{suffix} {self.total:.6f}", f"{name}_count{suffix} {self.count}"]
        return out


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    """One metric family: HELP and TYPE lines, then its samples."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def label(value: str) -> str:
    """A label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def process_lines(version: str) -> list[str]:
    """The process's own families (the names Prometheus clients use): resident memory, CPU
    seconds, open file descriptors, start time; and ``gateway_build_info``."""
    import os
    import platform
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    lines = [
        *family("process_cpu_seconds_total", "counter", "User and system CPU time spent.",
                [f"process_cpu_seconds_total {usage.ru_utime + usage.ru_stime:.3f}"]),
        *family("gateway_build_info", "gauge", "The gateway's version and Python (always 1).",
                [f'gateway_build_info{{version="{label(version)}",'
                 f'python="{label(platform.python_version())}"}} 1']),
    ]
    try:  # (Linux: /proc; elsewhere these families are left out)
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        rss = pages * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir("/proc/self/fd"))
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith("btime"))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return lines
    return [
        *lines,
        *family("process_resident_memory_bytes", "gauge", "Resident memory size.",
                [f"process_resident_memory_bytes {rss}"]),
        *family("process_open_fds", "gauge", "Open file descriptors.",
                [f"process_open_fds {fds}"]),
        *family("process_start_time_seconds", "gauge",
                "When the process started, seconds since the epoch.",
                [f"process_start_time_seconds {started:.2f}"]),
    ]
