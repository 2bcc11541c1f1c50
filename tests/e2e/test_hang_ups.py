"""A client that hangs up before its request is whole is no error of the gateway's: logged
in one line, never as an unexpected error with a traceback."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from urllib.parse import urlsplit

import pytest

from gateway.cluster.peers import SECRET_HEADER
from lanes import AgentConfig, Mode
from store import MemoryEventStore
from tests.e2e.live import running
from tests.gateway.support import ManualReasoner, until

SECRET = "cluster-secret"


def _hang_up(http: str, path: str, headers: str = "") -> None:
    """POST half a body to ``path``, then reset the connection (a client killed mid-send,
    or a member that gave up on its forward)."""
    where = urlsplit(http)
    assert where.hostname is not None and where.port is not None
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     '{"requests": ['.encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def test_a_member_that_hangs_up_mid_forward_is_logged_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server_log = logging.getLogger("uvicorn")  # (it does not propagate to the root's)
    server_log.addHandler(caplog.handler)
    reasoner = ManualReasoner()
    try:
        async with running(MemoryEventStore(), {"a": AgentConfig(mode=Mode.FOLLOWUP)},
                           lambda _: reasoner, cluster_secret=SECRET) as live:
            for _ in range(3):
                await asyncio.to_thread(_hang_up, live.http, "/internal/submit",
                                        f"{SECRET_HEADER}: {SECRET}\r\n")
            await until(lambda: _said(caplog, "hung up", 3), "every hang-up to be logged")
    finally:
        server_log.removeHandler(caplog.handler)
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not tracebacks, [r.getMessage() for r in tracebacks]
    assert not [r for r in caplog.records if "unexpected" in r.getMessage()]


async def _said(caplog: pytest.LogCaptureFixture, words: str, times: int) -> bool:
    return sum(words in r.getMessage() for r in caplog.records) >= times
