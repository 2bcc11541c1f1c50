"""A progress bar for long operations, on stderr, drawn only when stderr is a terminal.

Output meant for people and scripts goes to stdout; the bar never mixes with it, and when
stderr is not a terminal (a pipe, a CI log) nothing is drawn at all.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Self, TextIO

REDRAW_S = 0.1
"""Least time between two redraws."""
WIDTH = 28
"""Characters of the bar itself."""


class Progress:
    """``with Progress("verify", total) as bar: ... bar.advance(n)``; ``bar.elapsed`` after."""

    def __init__(self, label: str, total: int | None, *, unit: str = "events",
                 stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = self._stream.isatty() if enabled is None else enabled
        self._started = time.perf_counter()
        self._drawn = 0.0
        self._ended: float | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def advance(self, count: int = 1) -> None:
        """``count`` more units done."""
        self.done += count
        if self._enabled:
            now = time.perf_counter()
            if now - self._drawn >= REDRAW_S:
                self._drawn = now
                self._draw(now)

    def close(self) -> None:
        """Stop the clock and clear the bar."""
        if self._ended is None:
            self._ended = time.perf_counter()
            if self._enabled:
                self._stream.write("\r\033[K")
                self._stream.flush()

    @property
    def elapsed(self) -> float:
        """Seconds from the start to `close` (or to now)."""
        end = self._ended if self._ended is not None else time.perf_counter()
        return end - self._started

    def line(self, now: float | None = None) -> str:
        """The bar as text: label, bar, share, count, rate and time left."""
        now = time.perf_counter() if now is None else now
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            share = min(1.0, self.done / self.total)
            filled = int(share * WIDTH)
            left = (self.total - self.done) / rate if rate else 0.0
            return (f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {share:4.0%} "
                    f"{self.done:,}/{self.total:,} {self.unit} {rate:,.0f}/s {left:.0f}s left")
        return f"{self.label} {self.done:,} {self.unit} {rate:,.0f}/s"

    def _draw(self, now: float) -> None:
        self._stream.write("\r\033[K" + self.line(now))
        self._stream.flush()


def summary(done: int, unit: str, seconds: float) -> str:
    """``1,000,001 events in 3.2 s (312,500 events/s)``."""
    rate = f", {done / seconds:,.0f} {unit}/s" if seconds > 0 else ""
    return f"{done:,} {unit} in {seconds:.2f} s{rate}"
