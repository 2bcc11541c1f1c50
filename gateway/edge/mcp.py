"""The gateway's tools over MCP (the official ``mcp`` SDK): Streamable HTTP at ``/mcp`` on
the gateway's own server, with the HTTP API's bearer tokens and roles, and `bridge`, a stdio
server for desktop MCP clients that forwards to a remote ``/mcp`` (``gateway mcp``).

Every call is authenticated at the door (no token, or an unknown one: 401, as the HTTP API);
each tool then checks the caller's role and scope before it does anything, so a refused
call records nothing. The tools themselves are `gateway.edge.mcp_tools`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from gateway.edge.answers import error_frame, error_response
from gateway.edge.auth import Principal
from gateway.edge.mcp_tools import MAX_CALL_TIMEOUT_S, Tools
from gateway.edge.routes import Api
from gateway.edge.service import Service
from gateway.errors import BadFrame, Forbidden, GatewayError, Unauthorized
from lanes import InvalidRequest
from store.port import StoreError

PRINCIPAL: Final = "gateway.principal"
"""Where the door leaves the caller in the request's ASGI scope for the tools."""
NAME: Final = "trading-agent-gateway"


class Mcp:
    """The ``/mcp`` endpoint (an ASGI app) and its MCP server; `running` is its lifespan
    (the SDK's session manager), entered by the app's."""

    def __init__(self, service: Service, api: Api) -> None:
        self.service = service
        self.tools = Tools(api)
        self.server: Server[Any] = Server(
            NAME, version="1", instructions=(
                "Tools of an event-sourced trading agent gateway: read agents and their "
                "logs, send them messages, call them, stop and resume them, decide orders "
                "waiting for approval. What you may do depends on your token's role."),
            on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        # Stateless JSON answers: each call is one POST answered in one body, so every
        # call is authenticated by its own header and no stream is held open.
        self.sessions = StreamableHTTPSessionManager(self.server, json_response=True,
                                                     stateless=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve MCP sessions while the block runs (the app's lifespan)."""
        try:
            async with self.sessions.run():
                yield
        finally:
            await self.tools.waits.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The door: a known bearer token (401 otherwise) and an allowed browser origin."""
        headers = Headers(scope=scope)
        try:
            origin = headers.get("origin")
            if not self.service.origin_allowed(origin):
                raise Forbidden(f"origin {origin!r} is not allowed; list it in "
                                "server.allowed_origins")
            scope[PRINCIPAL] = self.service.tokens.from_header(headers.get("authorization"))
        except GatewayError as refused:
            await error_response(refused)(scope, receive, send)
            return
        await self.sessions.handle_request(scope, receive, send)

    @staticmethod
    def _principal(ctx: ServerRequestContext[Any]) -> Principal:
        scope = getattr(ctx.request, "scope", None)
        principal = None if scope is None else scope.get(PRINCIPAL)
        if not isinstance(principal, Principal):
            raise Unauthorized()
        return principal

    async def _list_tools(self, ctx: ServerRequestContext[Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=spec.name, description=spec.description,
                       input_schema=spec.args.model_json_schema(by_alias=True),
                       annotations=types.ToolAnnotations(
                           read_only_hint=spec.reads, destructive_hint=not spec.reads))
            for spec in self.tools.visible(self._principal(ctx))])

    async def _call_tool(self, ctx: ServerRequestContext[Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        """Run a tool; any refusal is a tool error (``isError``) holding the gateway's error
        frame (``code``, ``message``, ``field``)."""
        try:
            principal = self._principal(ctx)
            spec = self.tools.specs.get(params.name)
            if spec is None:
                raise BadFrame("invalid", f"no tool {params.name!r}; list them with "
                               "tools/list", field="name")
            if spec not in self.tools.visible(principal):
                raise Forbidden(f"a {principal.role.value} token cannot call {spec.name}")
            try:
                args = spec.args.model_validate(params.arguments or {})
            except ValidationError as error:
                raise InvalidRequest.from_validation_error(error) from None
            body = await spec.run(principal, args)
        except (GatewayError, InvalidRequest, StoreError) as error:
            frame = error_frame(error).model_dump(mode="json", exclude_none=True)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=json.dumps(frame))],
                structured_content=frame, is_error=True)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(body))],
            structured_content=body)


class BridgeRefused(Exception):
    """The gateway refused the bridge's token or origin (401, 403)."""


async def _refused(response: httpx2.Response) -> None:
    """Raise `BridgeRefused` for a 401 or 403, with the gateway's own words (the SDK would
    say only "Server returned an error response")."""
    if response.status_code in (401, 403):
        await response.aread()
        try:
            said = str(response.json().get("message", ""))
        except ValueError:
            said = response.text[:200]
        raise BridgeRefused(f"answered {response.status_code}: {said}")


async def bridge(url: str, token: str) -> None:
    """A stdio MCP server whose tools are those of the gateway at ``url`` (its ``/mcp``),
    called with ``token``: for desktop MCP clients that start a command."""
    timeout = httpx2.Timeout(30.0, read=MAX_CALL_TIMEOUT_S + 30.0)
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
                           event_hooks={"response": [_refused]}) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as remote,
    ):
        await remote.initialize()

        async def list_tools(ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListToolsResult:
            return await remote.list_tools()

        async def call_tool(ctx: ServerRequestContext[Any],
                            params: types.CallToolRequestParams) -> types.CallToolResult:
            return await remote.call_tool(params.name, params.arguments or {})

        server: Server[Any] = Server(NAME, version="1", on_list_tools=list_tools,
                                     on_call_tool=call_tool)
        async with stdio_server() as (stdin, stdout):
            await server.run(stdin, stdout, server.create_initialization_options())
