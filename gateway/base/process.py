"""Process-level settings for a long-running gateway."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoop = Literal["auto", "uvloop", "asyncio"]
"""Which event loop a gateway process runs on: ``auto`` is uvloop where it is installed (a
Linux dependency of the package), else asyncio's own."""


def tune_runtime() -> None:
    """Tune a long-running gateway process: a cheap cyclic GC for many long-lived objects,
    and a short GIL switch interval.

    Agent states, pending requests and dedupe windows live long; with the default
    thresholds the collector rescans them over and over (measured: about a third of the
    time per request under a flood). Objects alive now are frozen out of collection, and
    full collections run ten times less often. Also shortens the GIL's switch interval
    (`SWITCH_INTERVAL_S`). Call once, after start-up.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(700, 20, 100)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


SWITCH_INTERVAL_S = 0.001
"""How long a thread may hold the GIL while another waits for it (CPython's default is
5 ms). A thread that waits for I/O with the GIL released (the log's readers under
aiosqlite, `asyncio.to_thread` work) needs it back for a moment after; under a flood the
event loop holds it almost always, and each such thread waited up to the whole interval.
Measured when the store's writer was such a thread: 1 ms gave 2.4x faster control-lane
commits under a 20,000/s flood (mean 17.2 -> 8.6 ms) and a higher flood rate, at no cost to
a quiet gateway."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection while a bulk load builds many long-lived objects (a replay of a
    large log builds millions, and the collector would rescan them over and over)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def loop_factory(choice: EventLoop = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop of ``choice`` (None: asyncio's default). ``uvloop`` raises
    `RuntimeError` where it is not installed; ``auto`` falls back to asyncio there."""
    if choice == "asyncio":
        return None
    if importlib.util.find_spec("uvloop") is None:
        if choice == "uvloop":
            raise RuntimeError("the uvloop event loop was asked for and uvloop is not "
                               "installed (it is a dependency on Linux only); use "
                               "event_loop = \"asyncio\"")
        return None
    import uvloop

    return uvloop.new_event_loop


def run_on(main: Coroutine[Any, Any, T], choice: EventLoop = "auto") -> T:
    """`asyncio.run` on the event loop of ``choice``."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
