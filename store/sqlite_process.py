"""The store's side of the SQLite writer process (`store.sqlite_writer`): started, spoken to
from the event loop that opened the store, stopped.

The writer's requests go out and their answers come back through an asyncio transport on the
socket pair, so a commit costs the loop only the planning of its batch and a callback when
the answer arrives, and no thread has to win the GIL back from a busy loop to go on (that
wait, a thread of the store's own waking up behind the loop under a flood, was most of a
stop's ack p99 under it: `bench.estop_latency`). One request at a time (the store's write
lock), answered in order.
"""

from __future__ import annotations

import asyncio
import marshal
import socket
import subprocess
import sys
from collections import deque
from typing import Any, Final

from . import sqlite_writer
from .writer_core import KeyConflict

WRITER_STOP_S: Final = 10.0
"""How long the writer process has to finish after its socket closed, before it is killed."""

_HEADER = sqlite_writer.HEADER


class WriterFailed(Exception):
    """The writer process answered with an error (``reason`` in words), or is gone."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Channel(asyncio.Protocol):
    """The answers of the writer process, each to the request that waits for it."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.lost: BaseException | None = None
        """Why the connection ended (None while it is up)."""

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        size = _HEADER.size
        while len(buffer) >= size:
            end = size + _HEADER.unpack_from(buffer)[0]
            if len(buffer) < end:
                return
            answer = marshal.loads(buffer[size:end])
            del buffer[:end]
            if self.waiting:
                future = self.waiting.popleft()
                if not future.done():
                    future.set_result(answer)

    def eof_received(self) -> bool:
        return False  # (the transport closes: `connection_lost`)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or EOFError("the other side of the writer's socket closed it")
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(self.lost)


class WriterProcess:
    """The writer process of a SQLite store, spoken to from the loop that opened the store:
    `call` sends a request and awaits its answer (the loop runs on meanwhile)."""

    def __init__(self, path: str, synchronous: str, busy_timeout_ms: int) -> None:
        self._opening = (path, synchronous, busy_timeout_ms)
        self._process: subprocess.Popen[bytes] | None = None
        self._transport: asyncio.Transport | None = None
        self._channel: _Channel | None = None
        self._broken = True

    @property
    def broken(self) -> bool:
        """Not started, or gone (its socket closed, or a request failed midway): the next
        transaction starts a new one."""
        return self._broken or self._channel is None or self._channel.lost is not None

    @property
    def pid(self) -> int | None:
        """The process's id (None when none runs)."""
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the process and open the database in it (`WriterFailed` if it cannot)."""
        await self.stop()
        ours, theirs = socket.socketpair()
        try:
            # In a process group of its own: Ctrl-C in a terminal and ``timeout`` signal the
            # gateway's group, and the writer must outlive the gateway's last commits (it
            # ignores those signals too, once started: a service manager signals them all).
            # (`subprocess.Popen`, not the loop's: uvloop takes no ``process_group``; it
            # starts in a few ms, once per store and after a writer process died.)
            self._process = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-I", sqlite_writer.__file__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, process_group=0)
        except OSError as exc:
            ours.close()
            raise WriterFailed(f"the SQLite writer process could not start: {exc}") from None
        finally:
            theirs.close()
        loop = asyncio.get_running_loop()
        channel = _Channel()
        try:
            transport, _ = await loop.create_unix_connection(lambda: channel, sock=ours)
        except OSError as exc:
            ours.close()
            raise self._ended(exc) from None
        self._transport, self._channel = transport, channel
        self._broken = False
        try:
            await self.call_raw(self._opening)
        except BaseException:
            await self.stop()
            raise

    async def call(self, op: str, *args: Any) -> Any:
        """Ask the process to do ``op`` (see `store.sqlite_writer.Writer`); its answer, or
        `KeyConflict` / `WriterFailed` with the reason in words."""
        return await self.call_raw((op, args))

    async def call_raw(self, message: Any) -> Any:
        """Send ``message`` as it is and await its answer (see `call`)."""
        transport, channel = self._transport, self._channel
        if transport is None or channel is None or self._broken:
            raise WriterFailed("the SQLite writer process is not running")
        if channel.lost is not None:
            raise self._ended(channel.lost)
        body = marshal.dumps(message)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        channel.waiting.append(future)
        transport.write(_HEADER.pack(len(body)) + body)
        try:
            answer = await future
        except (OSError, EOFError) as exc:
            raise self._ended(exc) from None
        except BaseException:  # (cancelled before its answer: the next would be taken for it)
            self._broken = True
            raise
        if answer[0] == "ok":
            return answer[1]
        if answer[1] == "conflict":
            raise KeyConflict(answer[2])
        raise WriterFailed(answer[2])

    def _ended(self, exc: BaseException) -> WriterFailed:
        self._broken = True
        code = None if self._process is None else self._process.poll()
        return WriterFailed("the SQLite writer process ended" + (
            f" (exit status {code})" if code is not None else f" ({exc})"))

    async def stop(self) -> None:
        """Close the socket (the process finishes what it was doing, rolls back what was not
        committed, and exits); kill it if it takes longer than `WRITER_STOP_S`."""
        transport, self._transport, self._channel = self._transport, None, None
        process, self._process = self._process, None
        self._broken = True
        if transport is not None:
            transport.close()
        if process is not None:
            await asyncio.to_thread(_wait_or_kill, process)


def _wait_or_kill(process: subprocess.Popen[bytes]) -> None:
    """Wait for ``process`` to end, at most `WRITER_STOP_S`, then kill it."""
    try:
        process.wait(WRITER_STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
