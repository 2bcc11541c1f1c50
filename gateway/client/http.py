"""The HTTP transport of `gateway.client.HttpClient`: one connection pool, bearer
authentication, JSON in and out, typed errors, and retries of what the gateway did not take.

This is the only module of the client that imports the HTTP library (``httpx2``), so that
another one with the same API can take its place here alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx2
from pydantic import BaseModel

from gateway.client.errors import RETRYABLE_CODES, ConnectionLost, GatewayClientError
from gateway.client.wire import http_url, parse

M = TypeVar("M", bound=BaseModel)
Query = Mapping[str, str | int | None]


def path(*parts: str) -> str:
    """A path under the API from its segments, each quoted (an id is never read as ``/``)."""
    return "/" + "/".join(quote(part, safe="") for part in parts)


class HttpBase:
    """Calls of the HTTP API over one pool of connections (an async context manager).

    ``url`` is the gateway's base URL (``ws://`` is taken as ``http://``); ``token`` its
    bearer token. A call the gateway answered ``busy`` (nothing was taken) is sent again
    after its ``Retry-After``, up to ``retries`` times; one answered ``unavailable``,
    ``storage_failed`` or ``not_running`` too, if sending it again is safe (a read, or a
    request with its ``requestId``). Any other refusal raises its `GatewayClientError`.
    """

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0,
                 retries: int = 3, max_backoff_s: float = 5.0,
                 transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self.url = http_url(url)
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx2.AsyncClient(base_url=self.url, headers=headers,
                                       timeout=timeout_s, transport=transport)
        self._retries = retries
        self._max_backoff = max_backoff_s

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _get(self, model: type[M], where: str, query: Query | None = None) -> M:
        return parse(model, await self._json("GET", where, query=query))

    async def _post(self, model: type[M], where: str, body: Any = None, *,
                    idempotent: bool = False) -> M:
        return parse(model, await self._json("POST", where, body=body, idempotent=idempotent))

    async def _json(self, method: str, where: str, *, query: Query | None = None,
                    body: Any = None, idempotent: bool | None = None,
                    accept: frozenset[int] = frozenset()) -> Any:
        """The JSON of the answer to one call (``accept``: error statuses whose body is the
        answer, not an error)."""
        response = await self._send(method, where, query, body,
                                    method == "GET" if idempotent is None else idempotent)
        if response.status_code < 400 or response.status_code in accept:
            return _body(response)
        raise _error(response)

    async def _text(self, where: str) -> str:
        response = await self._send("GET", where, None, None, True)
        if response.status_code >= 400:
            raise _error(response)
        return response.text

    async def _send(self, method: str, where: str, query: Query | None, body: Any,
                    idempotent: bool) -> httpx2.Response:
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        content = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {} if content is None else {"Content-Type": "application/json"}
        attempt = 0
        while True:
            try:
                response = await self._http.request(method, where, params=params,
                                                    content=content, headers=headers)
            except httpx2.TransportError as error:
                raise ConnectionLost(f"{method} {where}: {error!r}") from error
            delay = self._retry_delay(response, attempt, idempotent)
            if delay is None:
                return response
            attempt += 1
            await asyncio.sleep(delay)

    def _retry_delay(self, response: httpx2.Response, attempt: int,
                     idempotent: bool) -> float | None:
        """How long to wait before sending the call again (None: do not)."""
        if response.status_code != 503 or attempt >= self._retries:
            return None
        try:
            code = response.json().get("code")
        except (ValueError, AttributeError):
            return None
        if code != "busy" and not (idempotent and code in RETRYABLE_CODES):
            return None
        after = response.headers.get("Retry-After", "")
        backoff = min(self._max_backoff, 0.05 * 2 ** attempt)
        return min(self._max_backoff, float(after)) if after.isdecimal() else backoff


def _body(response: httpx2.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise GatewayClientError("protocol", f"HTTP {response.status_code}: the answer is not "
                                 f"JSON: {response.text[:200]!r}",
                                 status=response.status_code) from None


def _error(response: httpx2.Response) -> GatewayClientError:
    """The typed error of an error answer (the gateway's code and message; ``http_error``
    for an answer that is not one of the gateway's errors)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and "code" in data and "message" in data:
        return GatewayClientError.from_json(data, response.status_code)
    return GatewayClientError("http_error", f"HTTP {response.status_code} "
                              f"{response.reason_phrase}: {response.text[:200]!r}",
                              status=response.status_code)
