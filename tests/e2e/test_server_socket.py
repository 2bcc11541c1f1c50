"""The server's listening socket: every connection it accepts sends at once what is written
(Nagle's algorithm off), so that an HTTP answer written as a head and a body never waits for
the client's delayed ACK (40 ms on every request of a kept-alive connection before)."""

from __future__ import annotations

import asyncio
import socket

from gateway.edge.server import bind


async def test_connections_the_server_accepts_have_nagle_off() -> None:
    listening = bind("127.0.0.1", 0)
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    def connected(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(writer)

    server = await asyncio.start_server(connected, sock=listening)  # (as uvicorn serves it)
    try:
        _, client = await asyncio.open_connection(*listening.getsockname())
        writer = await asyncio.wait_for(accepted, 10)
        sock = writer.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        client.close()
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
