"""What the clients share: URLs, requests as wire JSON, answers read into models, and the
one way to run a background task."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ValidationError

from gateway.client.errors import GatewayClientError

log = logging.getLogger("gateway.client")
Endpoint = Literal["control", "feed", "worker"]
RequestLike = BaseModel | Mapping[str, Any]
"""A request as a model (the server's ``lanes.AgentRequest``, say) or as its wire JSON
(camelCase) object."""
MarketEventLike = BaseModel | Mapping[str, Any]
"""A market event as a model or as its wire JSON object (``{"type": "tick", ...}``)."""
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def endpoint_url(url: str, endpoint: Endpoint) -> str:
    """The WebSocket URL of ``endpoint`` given a base URL (or the endpoint URL itself)."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    if not path.endswith(("/ws/control", "/ws/feed", "/ws/worker")):
        path = f"{path}/ws/{endpoint}"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def http_url(url: str) -> str:
    """The HTTP base URL of a gateway given its base URL in any scheme (``ws`` is taken as
    ``http``) or one of its endpoint URLs."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    for endpoint in ("/ws/control", "/ws/feed", "/ws/worker"):
        path = path.removesuffix(endpoint)
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def request_json(request: RequestLike) -> dict[str, Any]:
    """A request's wire JSON. A mapping without ``requestId`` or ``createdAt`` gets them
    (a requestId is what makes resending idempotent)."""
    data = model_json(request)
    data.setdefault("requestId", f"ar_{uuid.uuid4().hex}")
    data.setdefault("createdAt", datetime.now(UTC).isoformat())
    return data


def model_json(value: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """A model's wire JSON (camelCase, without its unset optional fields), or a mapping's
    copy."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(value)


def parse(model: type[M], data: Any, status: int | None = None) -> M:
    """``data`` read as ``model``; an error frame raises its `GatewayClientError`, and an
    answer that is not what the protocol says raises one with code ``protocol``."""
    if isinstance(data, dict) and data.get("type") == "error" and "code" in data:
        raise GatewayClientError.from_json(data, status)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        what = data.get("type") if isinstance(data, dict) else None
        raise GatewayClientError("protocol", f"unexpected {what or model.__name__!r} answer: "
                                 f"{where}: {first['msg']}", where or None) from None


def spawn(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Run ``coro`` as a task whose failure is logged, never silent (the caller keeps the
    task: a client holds each of its own until it ends)."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("client task %s failed", task.get_name(), exc_info=error)
