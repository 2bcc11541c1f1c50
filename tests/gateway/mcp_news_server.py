"""A small MCP server for the tests (stdio): a tool that answers, one that hangs, one that
raises. Run as ``python tests/gateway/mcp_news_server.py``."""

from __future__ import annotations

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

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


if __name__ == "__main__":
    server.run("stdio")
