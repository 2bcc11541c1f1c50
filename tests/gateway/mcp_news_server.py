"""A small MCP server for the tests: a tool that answers, one that hangs, one that raises.
Over stdio: ``python tests/gateway/mcp_news_server.py``; over streamable HTTP: `http_app`,
which asks for a bearer token first, and answers a call of ``outage`` as a proxy whose
upstream is down would (HTTP 502, plain text)."""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

server = MCPServer("news")


@server.tool(description="The latest headline about a symbol.")
def headlines(symbol: str) -> str:
    """The latest headline about ``symbol``."""
    return f"{symbol}: spot ETF inflows at a record"


@server.tool(description="Never answers.")
async def hang() -> str:
    """Never answers."""
    await anyio.sleep(3_600)
    return "late"


@server.tool(description="Always fails.")
def boom() -> str:
    """Always fails."""
    raise ToolError("the news feed is down")


@server.tool(description="Answered by the proxy in front (over HTTP).")
def outage() -> str:
    """Answered by the proxy in front (over HTTP)."""
    return "through"


def http_app(token: str) -> ASGIApp:
    """The server over streamable HTTP at ``/mcp``: a request without ``Authorization:
    Bearer <token>`` is answered 401; a call of ``outage`` 502."""
    inner: Any = server.streamable_http_app(json_response=True, stateless_http=True)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", ()))
        if scope["type"] == "http" and headers.get(b"authorization") != \
                f"Bearer {token}".encode():
            await PlainTextResponse("no", status_code=401)(scope, receive, send)
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await inner(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if b'"tools/call"' in body and b'"outage"' in body:
            await PlainTextResponse("bad gateway: upstream exchange down",
                                    status_code=502)(scope, receive, send)
            return
        sent = False

        async def again() -> Any:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await inner(scope, again, send)
    return app


if __name__ == "__main__":
    server.run("stdio")
