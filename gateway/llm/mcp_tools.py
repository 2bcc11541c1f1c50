"""Tools of MCP servers for agents' models: an agent's config names MCP servers (a command
spoken to over stdio, or a streamable HTTP URL with headers from the environment) and which
of their tools its model is offered, beside the built-ins, as ``<server>__<tool>``.

Each server is one connection kept by a task of its own (the SDK's `ClientSession`), opened
at the start and again after it drops (at most once per `RECONNECT_S`). A call is bounded by
the server's ``timeout_ms``: a server that is down, hangs or errors gives the model a tool
error within it (one whose connection failed, at once, with why), and never holds a control,
another agent or the event loop. The tools'
descriptions and schemas are the server's own, listed when the connection opens. Where
the SDK says of an HTTP server's error answer only "Server returned an error response", the
error says its status and the start of its body too (what a token refused, a proxy or the
server's own crash said).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from gateway.base.tasks import spawn
from gateway.llm.port import ToolSpec

log = logging.getLogger("gateway.mcp")
RECONNECT_S = 5.0
"""The least time between two attempts to open a server's connection."""
START_S = 30.0
"""The least time a server is given to start and list its tools (a stdio server is a process
that imports its SDK first: seconds on a loaded machine), whatever its calls' bound."""
SEPARATOR = "__"
GENERIC = "Server returned an error response"
"""All the SDK says of an HTTP error answer that is not a JSON-RPC error."""
SAID_CHARS = 200
"""The most of an error answer's body an error quotes."""


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """One MCP server an agent uses: how to reach it and which of its tools it offers."""

    name: str
    tools: tuple[str, ...]
    command: tuple[str, ...] = ()
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_ms: int = 10_000

    def key(self) -> tuple[Any, ...]:
        """What makes two specs the same server (one connection for both)."""
        return (self.name, self.command, self.url, tuple(sorted(self.headers.items())))


class McpServer:
    """One server's connection, kept open by a task, and its tools."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.tools: dict[str, types.Tool] = {}
        """Its tools, by name (as listed when the connection opened)."""
        self._session: ClientSession | None = None
        self._settled = asyncio.Event()
        """Set once an attempt to connect has connected or failed (cleared at the next)."""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tried = 0.0
        self.error: str | None = None
        """Why it is not connected, if it is not."""
        self._answered: tuple[float, str] | None = None
        """When the server last answered an HTTP request with an error, and what it said."""

    def start(self) -> None:
        """Open the connection in the background (again, if it dropped, after a while)."""
        if self._task is not None and not self._task.done():
            return
        if time.monotonic() - self._tried < RECONNECT_S and self._tried:
            return
        self._tried = time.monotonic()
        self._settled.clear()
        self._task = spawn(self._hold(), f"mcp server {self.spec.name}")

    async def stop(self) -> None:
        """Close the connection."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 5)

    async def _hold(self) -> None:
        spec = self.spec
        try:
            async with contextlib.AsyncExitStack() as stack:
                if spec.url is not None:
                    http = await stack.enter_async_context(httpx2.AsyncClient(
                        headers=dict(spec.headers), timeout=spec.timeout_ms / 1000,
                        event_hooks={"response": [self._note]}))
                    read, write = await stack.enter_async_context(
                        streamable_http_client(spec.url, http_client=http))
                else:
                    read, write = await stack.enter_async_context(stdio_client(
                        StdioServerParameters(command=spec.command[0],
                                              args=list(spec.command[1:]))))
                session = await stack.enter_async_context(ClientSession(read, write))
                start = max(START_S, spec.timeout_ms / 1000)
                await asyncio.wait_for(session.initialize(), start)
                listed = await asyncio.wait_for(session.list_tools(), start)
                self.tools = {tool.name: tool for tool in listed.tools}
                missing = [t for t in spec.tools if t not in self.tools]
                if missing:
                    log.warning("MCP server %s has no tool %s", spec.name, ", ".join(missing))
                self._session, self.error = session, None
                self._settled.set()
                await self._stop.wait()
        except Exception as error:  # a server that cannot be reached: its tools fail
            self.error = self._with_answer(error_text(error), self._tried)
            log.warning("MCP server %s is not reachable: %s", spec.name, self.error)
        finally:
            self._session = None
            self._settled.set()

    async def _note(self, response: httpx2.Response) -> None:
        """Keep what an HTTP error answer of the server said (its status and the start of
        its body): the SDK passes on only `GENERIC`."""
        if response.status_code < 400:
            return
        await response.aread()
        said = " ".join(response.text.split())[:SAID_CHARS]
        self._answered = (time.monotonic(),
                          f"HTTP {response.status_code}" + (f": {said}" if said else ""))

    def _with_answer(self, text: str, since: float) -> str:
        """``text`` with what the server's error answer said, if the SDK said only
        `GENERIC` of one that came after ``since`` (monotonic seconds)."""
        answered = self._answered
        if GENERIC not in text or answered is None or answered[0] < since:
            return text
        return f"{text} ({answered[1]})"

    def specs(self) -> list[ToolSpec]:
        """Its allowed tools as the model is offered them (those it listed)."""
        return [ToolSpec(f"{self.spec.name}{SEPARATOR}{name}",
                         self.tools[name].description or name,
                         self.tools[name].input_schema or {"type": "object"})
                for name in self.spec.tools if name in self.tools]

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> tuple[bool, str]:
        """Call ``tool``: (ok, its text), or (False, why) within the server's timeout."""
        timeout = self.spec.timeout_ms / 1000
        began = time.monotonic()
        self.start()
        try:
            async with asyncio.timeout(timeout):
                await self._settled.wait()  # (a server known unreachable fails at once)
                session = self._session
                if session is None:
                    raise ConnectionError(self.error or "not connected")
                result = await session.call_tool(tool, dict(arguments))
        except TimeoutError:
            return False, (f"MCP server {self.spec.name} did not answer {tool} within "
                           f"{self.spec.timeout_ms} ms" + (f" ({self.error})" if self.error
                                                          else ""))
        except Exception as error:  # a server that errs is a tool error, never a failure
            if self._task is not None and not isinstance(error, MCPError):
                self._task.cancel()  # (its connection may be gone: open it again; an error
                # answer, the SDK's `MCPError`, came over a connection that still works)
            said = self._with_answer(error_text(error), began)
            return False, f"MCP server {self.spec.name}: {said}"
        return not result.is_error, _text(result)


def error_text(error: BaseException) -> str:
    """What went wrong, from the first error inside the SDK's task groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"[:500]


def _text(result: types.CallToolResult) -> str:
    parts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, separators=(",", ":"))
    return "\n".join(parts)


class McpTools:
    """The MCP servers of every agent (one connection per distinct server)."""

    def __init__(self, servers: Mapping[str, Sequence[McpServerSpec]]) -> None:
        shared: dict[tuple[Any, ...], McpServer] = {}
        self._by_agent: dict[str, dict[str, McpServer]] = {}
        for agent_id, specs in servers.items():
            mine = self._by_agent[agent_id] = {}
            for spec in specs:
                mine[spec.name] = shared.setdefault(spec.key(), McpServer(spec))
        self._servers = list(shared.values())

    def start(self) -> None:
        """Open every server's connection (in the background)."""
        for server in self._servers:
            server.start()

    async def stop(self) -> None:
        """Close them all."""
        await asyncio.gather(*(server.stop() for server in self._servers))

    def specs(self, agent_id: str, allowed: Iterable[str]) -> list[ToolSpec]:
        """The MCP tools ``agent_id`` may call (``allowed``, qualified) that its servers
        listed; a server not connected is asked to connect (its tools come next run)."""
        wanted = set(allowed)
        found: list[ToolSpec] = []
        for server in self._by_agent.get(agent_id, {}).values():
            server.start()
            found += [spec for spec in server.specs() if spec.name in wanted]
        return found

    async def call(self, agent_id: str, name: str, arguments: Mapping[str, Any]
                   ) -> tuple[bool, str]:
        """Call the qualified tool ``name`` for ``agent_id``."""
        server_name, _, tool = name.partition(SEPARATOR)
        server = self._by_agent.get(agent_id, {}).get(server_name)
        if server is None:
            return False, f"no MCP server {server_name!r} for this agent"
        return await server.call(tool, arguments)
