"""Prometheus text exposition of the gateway's own measures (no client library needed)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


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
