"""The internal HTTP API the processes of a cluster call on each other (`gateway.cluster.peers` is
the calling side): requests for the agents this process owns, and slots of the provider
gates it owns. Every call carries the cluster's shared secret; without it (or on a gateway
that is not in a cluster) the routes answer 404, as if they did not exist.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.base.tasks import start
from gateway.cluster.peers import SECRET_HEADER
from gateway.edge.protocol import load_json
from gateway.errors import BadFrame, GatewayError, NotOwner, UnknownProvider
from gateway.runtime.gate import GateMoved, ProviderGate, Slot, SlotRefusedError
from gateway.runtime.intake import in_steps, settled
from lanes.gate.events import CallOutcome
from lanes.requests import AgentRequest, InvalidRequest, Priority

if TYPE_CHECKING:
    from gateway.edge.service import Service

_REQUESTS: TypeAdapter[list[AgentRequest]] = TypeAdapter(list[AgentRequest])


def internal_routes(service: Service) -> list[Route]:
    """The internal routes of ``service``."""
    api = _Internal(service)
    return [
        Route("/internal/submit", api.guard(api.submit), methods=["POST"]),
        Route("/internal/gates/{name}/acquire", api.guard(api.acquire), methods=["POST"]),
        Route("/internal/gates/{name}/release", api.guard(api.release), methods=["POST"]),
        Route("/internal/gates/{name}/cancel", api.guard(api.cancel), methods=["POST"]),
        Route("/internal/poke", api.guard(api.poke), methods=["POST"]),
    ]


class _Internal:
    def __init__(self, service: Service) -> None:
        self.service = service

    def guard(self, handler: Callable[[Request, Any], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the secret check, with its JSON body parsed; errors answered
        as error frames."""
        from gateway.edge.answers import error_response

        async def guarded(request: Request) -> Response:
            secret = self.service.cluster_secret
            given = request.headers.get(SECRET_HEADER, "")
            if secret is None or not hmac.compare_digest(given.encode(), secret.encode()):
                return JSONResponse({"type": "error", "code": "not_found",
                                     "message": "no such route"}, status_code=404)
            try:
                body = load_json(await request.body(), "the body")
                if not isinstance(body, dict):
                    raise BadFrame("invalid", "the body is a JSON object")
                return await handler(request, body)
            except Exception as error:
                return error_response(error)

        return guarded

    async def poke(self, request: Request, body: dict[str, Any]) -> Response:
        """Another member handed streams over to this one: take them now rather than at the
        next renewal."""
        if self.service.cluster is not None:
            self.service.cluster.poke()
        return JSONResponse({})

    async def submit(self, request: Request, body: dict[str, Any]) -> Response:
        """Requests forwarded by another process, for agents this one owns (never forwarded
        again: an agent that moved meanwhile is answered ``unavailable``, marked ``moved``
        with its owner as this process knows it, for the asker to send it on)."""
        from gateway.edge.answers import ack_frame, error_frame

        try:
            requests = _REQUESTS.validate_python(body.get("requests"))
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None
        principal = body.get("principal")
        answers = await settled(await in_steps(  # this process's engine: never sent on again
            self.service.engine, requests, principal if isinstance(principal, str) else None,
            parsed=True))  # (from the body's JSON text, by `guard`)
        results = [
            (ack_frame(answer) if not isinstance(answer, GatewayError)
             else error_frame(answer, request_id=r.request_id)).model_dump(
                mode="json", by_alias=True, exclude_none=True)
            for r, answer in zip(requests, answers, strict=True)]
        for result, answer in zip(results, answers, strict=True):
            if isinstance(answer, NotOwner):  # (the asker sends it on to the new owner)
                result["moved"] = {"owner": answer.owner}
        return JSONResponse({"results": results})

    def _gate(self, request: Request) -> ProviderGate:
        name = str(request.path_params["name"])
        gate = self.service.engine.gates.get(name)
        if gate is None:
            raise UnknownProvider(name)
        return gate

    async def acquire(self, request: Request, body: dict[str, Any]) -> Response:
        """Wait for a slot for a run of another process (withdrawn if that process hangs
        up first)."""
        gate = self._gate(request)
        waiting = start(gate.acquire(
            str(body["agentId"]), str(body["runId"]), Priority(body.get("priority", "normal")),
            int(body.get("inputTokens", 0)), int(body.get("outputTokens", 0)),
            slot_id=str(body["slotId"]), weight=int(body.get("weight", 1))),
            "gate: a slot asked")
        hung_up = start(_disconnected(request), "gate: the asker hangs up")
        try:
            await asyncio.wait([waiting, hung_up], return_when=asyncio.FIRST_COMPLETED)
        finally:
            hung_up.cancel()
            if not waiting.done():
                waiting.cancel()  # the asker is gone: its request is withdrawn
        try:
            slot: Slot = await waiting
        except asyncio.CancelledError:
            handler = asyncio.current_task()
            if handler is not None and handler.cancelling():
                raise  # this handler itself is cancelled (the server stops)
            return Response(status_code=499)  # withdrawn: nobody is there to read it
        except SlotRefusedError as refused:
            return JSONResponse({"refused": {"code": refused.refused.code.value,
                                             "reason": refused.refused.reason}})
        return JSONResponse({"slotId": slot.slot_id, "leaseDeadline": slot.lease_deadline,
                             "probe": slot.probe})

    async def release(self, request: Request, body: dict[str, Any]) -> Response:
        """A slot given back by a run of another process."""
        gate = self._gate(request)
        if not gate.loaded:
            raise GateMoved(gate.provider)

        def count(name: str) -> int | None:
            value = body.get(name)
            return None if value is None else int(value)

        gate.release(Slot(str(body["slotId"]), 0, False), CallOutcome(body["outcome"]),
                     input_tokens=count("inputTokens"), output_tokens=count("outputTokens"),
                     retry_after_ms=count("retryAfterMs"),
                     remaining_requests=count("remainingRequests"),
                     remaining_tokens=count("remainingTokens"), reset_at=count("resetAt"))
        return JSONResponse({})

    async def cancel(self, request: Request, body: dict[str, Any]) -> Response:
        """A slot freed by a run of another process that ended without an answer."""
        gate = self._gate(request)
        if not gate.loaded:
            raise GateMoved(gate.provider)
        gate.cancel(str(body["slotId"]))
        return JSONResponse({})


async def _disconnected(request: Request) -> None:
    """Return once the client of ``request`` hangs up."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
