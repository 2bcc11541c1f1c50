"""Failures and acks on the wire: the one place an exception becomes an HTTP answer or an
error frame (`error_response`, `error_frame`), and the Starlette exception handlers that
make every route answer that way."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import pydantic_core
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from uvicorn.protocols.utils import ClientDisconnected

from gateway.edge.protocol import AckFrame, ErrorFrame
from gateway.errors import CODES, BadFrame, Busy, GatewayError, StorageUnreadable, Unauthorized
from gateway.runtime.acks import Ack
from lanes import InvalidRequest
from store.port import StoreError

log = logging.getLogger("gateway.edge.answers")

HANG_UPS: Final = (ClientDisconnect, ClientDisconnected, ConnectionError)
"""What a client that hung up raises (its request body cut short, its connection gone): no
failure of the gateway's, logged in one line."""


async def answer_error(request: Request, error: Exception) -> Response:
    """The exception handler of the HTTP routes (see `gateway.edge.http.Routes`). An
    unexpected failure reaches it through Starlette's `ServerErrorMiddleware`, which
    re-raises it after the answer for the server to log (uvicorn: "Exception in ASGI
    application"): it is not logged here as well; the others are never logged."""
    if request.scope["type"] != "http":
        raise error  # (a WebSocket session answers its own failures in frames)
    return error_response(error, logged=True)


def error_response(error: Exception, request_id: str | None = None,
                   logged: bool = False) -> JSONResponse:
    """The one place a failure becomes an HTTP answer; no internals leak. An unexpected
    failure is logged, unless ``logged`` (Starlette re-raises it for the server's log)."""
    frame = error_frame(error, request_id=request_id, logged=logged)
    response = JSONResponse(frame.model_dump(mode="json", exclude_none=True),
                            status_code=CODES[frame.code].status if frame.code in CODES
                            else 500)
    if isinstance(error, Busy):
        response.headers["Retry-After"] = str(max(1, error.retry_after_ms // 1000))
    if isinstance(error, Unauthorized):
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def error_frame(error: Exception, id: str | None = None, request_id: str | None = None,
                logged: bool = False) -> ErrorFrame:
    """The error frame for any failure (an unexpected one is logged, unless ``logged``
    already, and never shown)."""
    if isinstance(error, InvalidRequest):
        first = error.errors[0] if error.errors else None
        return ErrorFrame(id=id, code="invalid", message=str(error), request_id=request_id,
                          field=first.field if first else None)
    if isinstance(error, BadFrame):
        return ErrorFrame(id=id, code=error.code, message=str(error), field=error.field,
                          request_id=request_id)
    if isinstance(error, StoreError):  # a read of the log failed (a write is StorageFailed)
        error = StorageUnreadable(str(error))
    if isinstance(error, GatewayError):
        return ErrorFrame(id=id, code=error.code, message=str(error), request_id=request_id)
    if isinstance(error, HANG_UPS):
        log.info("the client hung up before its answer (%s)", type(error).__name__)
        return ErrorFrame(id=id, code="invalid", request_id=request_id,
                          message="the client hung up before its request was whole")
    if not logged:
        log.exception("unexpected error", exc_info=error)
    return ErrorFrame(id=id, code="internal", request_id=request_id,
                      message="internal error; the request was not taken; retry")


_DECISIONS: Final = frozenset({"accepted", "deduped", "dropped", "rejected"})


def ack_text(ack: Ack, id: str | None = None) -> str:
    """The JSON text `ack_frame` is sent as (its Nones left out), written out for a plain
    ack (no reason, no effect: most of a feed's), else through the model: the same text
    either way (property-tested). Building and encoding the model cost 4 us a frame."""
    request_id, decision, position, repeated = \
        ack.request_id, ack.decision, ack.position, ack.repeated
    if ack.reason is not None or ack.effect is not None or decision not in _DECISIONS \
            or type(position) is not int or type(repeated) is not bool \
            or type(request_id) is not str or not (id is None or type(id) is str):
        return ack_frame(ack, id).model_dump_json(exclude_none=True)
    head = '{"type":"ack",' if id is None else f'{{"type":"ack","id":{_json_string(id)},'
    return (f'{head}"requestId":{_json_string(request_id)},"decision":"{decision}",'
            f'"position":{position},"repeated":{"true" if repeated else "false"}}}')


def acks_text(results: Sequence[Ack | ErrorFrame], id: str | None = None) -> str:
    """The JSON text of an `AcksFrame` of ``results`` (its Nones left out), each ack written
    out as `ack_text` writes it: the same text as the model's (property-tested), without
    building a model per ack (100 of them a feed's frame)."""
    head = '{"type":"acks",' if id is None else f'{{"type":"acks","id":{_json_string(id)},'
    return f'{head}"results":{_answers_text(results)}}}'


def market_ack_text(events: int, triggered: Sequence[Ack | ErrorFrame],
                    id: str | None = None) -> str:
    """The JSON text of a `MarketAck` (as `acks_text`)."""
    head = ('{"type":"market_ack",' if id is None
            else f'{{"type":"market_ack","id":{_json_string(id)},')
    return f'{head}"events":{events},"triggered":{_answers_text(triggered)}}}'


def _answers_text(results: Sequence[Ack | ErrorFrame]) -> str:
    """A JSON array of answers: each ack's `ack_text`, each error frame's model text."""
    return "[" + ",".join([
        ack_text(result) if isinstance(result, Ack)
        else result.model_dump_json(exclude_none=True) for result in results]) + "]"


def _json_string(text: str) -> str:
    """``text`` as pydantic writes a string in JSON."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return pydantic_core.to_json(text).decode()


def ack_frame(ack: Ack, id: str | None = None) -> AckFrame:
    """An engine ack on the wire."""
    return AckFrame(id=id, request_id=ack.request_id, decision=ack.decision,  # type: ignore[arg-type]
                    position=ack.position, reason=ack.reason, repeated=ack.repeated,
                    effect=ack.effect)
