"""``[[agents.mcp]]``: the MCP servers an agent's model may use tools of
(`gateway.llm.mcp_tools`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from gateway.config.base import ConfigModel
from gateway.llm.mcp_tools import SEPARATOR, McpServerSpec

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class McpServerConfig(ConfigModel):
    """One MCP server: ``command`` (spoken to over stdio) or ``url`` (streamable HTTP, with
    ``headers_env``: header name -> the environment variable holding its value), the
    ``tools`` of it the agent's model is offered (as ``<name>__<tool>``), and how long a
    call may take."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,30}$")
    command: tuple[str, ...] = Field(default=(), max_length=100)
    url: str | None = Field(default=None, pattern=r"^https?://", max_length=2_000)
    headers_env: dict[str, EnvName] = Field(default_factory=dict, max_length=20)
    tools: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")], ...] = Field(
        min_length=1, max_length=100)
    timeout_ms: int = Field(default=10_000, ge=100, le=300_000)
    _headers: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _reachable(self, info: ValidationInfo) -> McpServerConfig:
        if bool(self.command) == (self.url is not None):
            raise ValueError("set either command (a stdio server) or url (streamable HTTP)")
        if self.headers_env and self.url is None:
            raise ValueError("headers_env is for a url server")
        context = info.context if isinstance(info.context, Mapping) else {}
        env: Mapping[str, str] = context.get("env") or os.environ
        missing = [var for var in self.headers_env.values() if not env.get(var)]
        if missing:
            raise ValueError(f"headers_env: environment variable {missing[0]} is not set")
        self._headers = {header: env[var] for header, var in self.headers_env.items()}
        return self

    def qualified(self) -> tuple[str, ...]:
        """Its tools as the model sees them."""
        return tuple(f"{self.name}{SEPARATOR}{tool}" for tool in self.tools)

    def spec(self) -> McpServerSpec:
        """How the gateway reaches it (headers resolved)."""
        return McpServerSpec(name=self.name, tools=self.tools, command=self.command,
                             url=self.url, headers=dict(self._headers),
                             timeout_ms=self.timeout_ms)
