"""Every task of the gateway is made here: `spawn` for work in the background (it keeps a
reference and logs failures), `start` for work its caller awaits (`tests/test_architecture.py`
holds the rest of ``gateway/`` to that)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("gateway")
T = TypeVar("T")
_running: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Run ``coro`` as a task that cannot be garbage-collected early or fail silently."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def start(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Run ``coro`` as a task its caller awaits, or races against others (`asyncio.wait`):
    the caller holds it and handles how it ends, so a failure is not logged here."""
    return asyncio.get_running_loop().create_task(coro, name=name)


async def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel ``tasks`` (None: none) and wait until they have ended."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def _finished(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("task %s failed", task.get_name(), exc_info=error)
