"""The HTTP API's shared part: `Routes`, the base of every group of routes (the
principal, bodies, parameters, passing a call on to its owner, the exception handlers),
and the helpers they share. `gateway.edge.routes.Api` is every group together;
`gateway.edge.app` lists the routes."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.cluster.peers import FORWARDED_HEADER, Unanswered
from gateway.edge.answers import answer_error, error_response
from gateway.edge.auth import Principal
from gateway.edge.protocol import load_json
from gateway.edge.service import Service
from gateway.edge.views import agent_summary, gate_waits_of
from gateway.errors import BadFrame, Forbidden, GatewayError, NotOwner, UnknownProvider
from gateway.reads.alerts import AlertBook
from gateway.reads.capacity import CapacityBook
from gateway.reads.replays import Replayed, agent_replays, gate_replays
from gateway.reads.stories import Stories, call_events
from gateway.runtime.gate import GateMoved, ProviderGate
from lanes import InvalidRequest
from lanes.events import INPUT_TYPES
from lanes.gate import GateWait
from lanes.gate.events import GATE_INPUT_TYPES
from lanes.requests import MAX_INT, ControlAction, WireModel
from lanes.state import AgentState
from lanes.streams import gate_stream, is_agent_stream
from store.port import StoreError

log = logging.getLogger("gateway.edge.http")


class ControlBody(WireModel):
    """Body of ``POST /api/agents/{id}/control``."""

    action: ControlAction
    order_id: str | None = Field(default=None, min_length=1, max_length=128)
    approval_id: str | None = Field(default=None, min_length=1, max_length=256)
    """The order waiting for approval that ``approve`` or ``reject`` decides."""
    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    reason: str | None = Field(default=None, max_length=500)


def _json(model: BaseModel | dict[str, Any] | list[Any], status_code: int = 200) -> JSONResponse:
    body = model.model_dump(mode="json", exclude_none=True) if isinstance(model, BaseModel) \
        else model
    return JSONResponse(body, status_code=status_code)


async def streamed(pieces: AsyncIterator[str], media_type: str) -> StreamingResponse:
    """A response whose body is ``pieces`` (encoded and written one by one as they come,
    a turn of the event loop between two: a big desk's body is never joined, encoded or
    written at once). The first piece is made here, so that what fails early (an engine
    that stops) is answered as an error; one that fails later cuts the connection."""
    first = await anext(pieces)

    async def body() -> AsyncIterator[str]:
        yield first
        async for piece in pieces:
            yield piece

    return StreamingResponse(body(), media_type=media_type)


class Routes:
    """One method per HTTP route. A route raises what went wrong; `exception_handlers`
    answers it (`gateway.edge.answers.error_response`), or passes the call on to the cluster
    member that owns its agent or gate."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.engine = service.engine
        self.log = service.log
        self.blotters = service.blotters
        self.words = self.engine.runs.toolbox.market.words
        """Prices in words, to the ticks of ``[market]``."""
        self.alerts_read = AlertBook(self.words)
        self.capacity_book = CapacityBook()
        self.replays = agent_replays()
        self.gate_replays = gate_replays()
        self.stories = Stories()
        self.call_events = call_events()

    def exception_handlers(self) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
        """Starlette's exception handlers for every route: the one place a route's failure
        becomes its answer (an unexpected one is answered 500 ``internal`` and re-raised by
        Starlette for the server's log)."""
        return {NotOwner: self._passed_on, GateMoved: self._passed_on, GatewayError: answer_error,
                InvalidRequest: answer_error, StoreError: answer_error,
                ClientDisconnect: answer_error,  # (a hang-up: answered, logged in a line)
                Exception: answer_error}

    async def _passed_on(self, request: Request, error: Exception) -> Response:
        assert isinstance(error, NotOwner | GateMoved)
        return await self._pass_on(request, error)

    async def _pass_on(self, request: Request, error: NotOwner | GateMoved) -> Response:
        """An operator's call for an agent (or provider gate) another process of the cluster
        owns, made there with the caller's own token, and its answer given back as it is
        (once: a call passed on is never passed on again)."""
        peers = self.service.peers
        if peers is None or request.headers.get(FORWARDED_HEADER):
            return error_response(error)
        stream = error.agent_id if isinstance(error, NotOwner) else gate_stream(error.provider)
        owner = (error.owner if isinstance(error, NotOwner) else None) or \
            await self._locate(stream)
        if owner is None:
            return error_response(error)
        headers = {FORWARDED_HEADER: "1"}
        for name in ("authorization", "content-type"):
            if name in request.headers:
                headers[name] = request.headers[name]
        passing = peers.request(request.method, owner + request.url.path,
                                params=request.query_params, content=await request.body(),
                                headers=headers)
        router = self.service.router
        try:  # (an owner gone silent is given up after about a lease)
            answer = await (passing if router is None else router.within_lease(owner, passing))
        except GatewayError as failed:
            return error_response(failed)
        if answer is None:
            lease_ms = 0 if router is None else router.lease_ms
            return error_response(Unanswered(stream, [owner], lease_ms, looked_again=False))
        passed = {k: v for k, v in answer.headers.items()
                  if k.lower() in ("content-type", "retry-after", "www-authenticate")}
        return Response(answer.content, status_code=answer.status_code, headers=passed)

    async def _locate(self, stream: str) -> str | None:
        """The URL of the process deciding for ``stream`` (reading the leases again if it is
        not known), in a cluster."""
        cluster = self.service.cluster
        return None if cluster is None else await cluster.locate(stream)

    def _principal(self, request: Request) -> Principal:
        origin = request.headers.get("origin")
        if request.method != "GET" and not self.service.origin_allowed(origin):
            raise Forbidden(f"origin {origin!r} is not allowed; list it in "
                            "server.allowed_origins")
        return self.service.tokens.from_header(request.headers.get("authorization"))

    def _agent_id(self, request: Request) -> str:
        """The path's agent, after authentication and the scope check (so nothing about
        agents outside the scope, not even whether they exist, is revealed)."""
        agent_id = str(request.path_params["agent_id"])
        self._principal(request).check_agent(agent_id)
        self.engine.state(agent_id)  # UnknownAgent if it does not exist
        return agent_id

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        data = await self._json_body(request)
        try:
            return model.model_validate(data)
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None

    async def _json_body(self, request: Request) -> Any:
        try:
            raw = await request.body()
        except ClientDisconnect:  # gone, or cut off by the server's request timeout
            raise BadFrame("invalid", "the body ended before its Content-Length") from None
        if len(raw) > self.service.max_frame_bytes:
            raise BadFrame("too_large", f"body over {self.service.max_frame_bytes} bytes")
        return load_json(raw, "the body")

    def _summary(self, agent_id: str, now: int,
                 waits: dict[str, tuple[str, GateWait]] | None = None) -> dict[str, Any]:
        """`agent_summary`, and in a cluster which process serves the agent (``servedBy``:
        its URL; null while it moves) and whether this read of it may be stale (``behind``,
        `Service.said_behind`)."""
        if waits is None:
            waits = gate_waits_of(self.engine, now)
        body = agent_summary(self.engine.state(agent_id), now, waits.get(agent_id),
                             no_worker=self.service.workers.missing(agent_id))
        cluster = self.service.cluster
        if cluster is not None:
            body["servedBy"] = cluster.owner_of(agent_id)
        return self.service.said_behind(agent_id, body)

    async def _replayed(self, agent_id: str, position: int) -> Replayed[AgentState]:
        """The agent replayed from its stream up to log ``position``."""
        return await self.replays.at(self.log, self.engine.reader, agent_id, position)

    def _gate(self, request: Request) -> ProviderGate:
        name = str(request.path_params["name"])
        gate = self.engine.gates.get(name)
        if gate is None:
            raise UnknownProvider(name)
        return gate

def _int_param(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadFrame("invalid", f"{name} must be an integer, got {raw[:40]!r}",
                       field=name) from None
    if not 0 <= value <= MAX_INT:
        raise BadFrame("invalid", f"{name} must be between 0 and 2^63-1", field=name)
    return value


def _position_param(query: Mapping[str, str], name: str, default: int, last: int) -> int:
    """A log position from the query, no later than ``last`` (the end of the log)."""
    value = _int_param(query, name, default)
    if value > last:
        raise BadFrame("invalid", f"{name} {value} is past the end of the log (position "
                       f"{last})", field=name)
    return value


def _input_types(stream: str) -> frozenset[str]:
    """The names of the input event types of a stream (agent or provider gate)."""
    types = INPUT_TYPES if is_agent_stream(stream) else GATE_INPUT_TYPES
    return frozenset(t.__name__ for t in types)


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def own_origins(host: str, port: int) -> frozenset[str]:
    """The origins of a gateway bound to ``host``:``port``: its own address, every loopback
    name when it is bound to a loopback or to every interface, and the machine's name when
    bound to every interface. Other names (a proxy's, a LAN address) go in
    ``server.allowed_origins``."""
    shown = f"[{host}]" if ":" in host else host
    names = {shown}
    everywhere = host in ("0.0.0.0", "::")
    if everywhere or shown in LOOPBACK_NAMES or host.startswith("127."):
        names.update(LOOPBACK_NAMES)
    if everywhere:
        names.add(socket.gethostname())
    return frozenset(f"{scheme}://{name}:{port}" for name in names for scheme in ("http", "https"))
