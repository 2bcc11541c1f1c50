"""The client's errors: one class per kind of refusal, each carrying the gateway's error code
and message (from an ``error`` frame or an HTTP error body), or the client's own
(``connection_lost``, ``protocol``, ``http_error``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RETRYABLE_CODES = frozenset({"not_running", "unavailable", "storage_failed"})
"""Error codes that mean "nothing was taken, send the same frame again shortly"."""


class GatewayClientError(Exception):
    """The gateway refused a frame or a call, or the client could not get an answer.

    ``code`` is the gateway's stable error code (``invalid``, ``unknown_agent``,
    ``forbidden``, ``busy``, ...) or ``connection_lost`` / ``protocol`` / ``http_error``
    from the client; ``status`` the HTTP status of an HTTP answer (None over WebSocket).
    """

    def __init__(self, code: str, message: str, field: str | None = None,
                 request_id: str | None = None, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))
        self.code = code
        self.message = message
        self.field = field
        self.request_id = request_id
        self.status = status

    @classmethod
    def from_frame(cls, frame: Any, status: int | None = None) -> GatewayClientError:
        """The exception for an error frame (a model with ``code``, ``message``, ``field``,
        ``requestId``), of the class its code belongs to."""
        kind = ERROR_CLASSES.get(frame.code, GatewayClientError)
        return kind(frame.code, frame.message, frame.field, frame.request_id, status)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], status: int | None = None) -> GatewayClientError:
        """The exception for an error's JSON object (a frame or an HTTP error body)."""
        code = str(data.get("code") or "protocol")
        kind = ERROR_CLASSES.get(code, GatewayClientError)
        field, request_id = data.get("field"), data.get("requestId")
        return kind(code, str(data.get("message", "")),
                    None if field is None else str(field),
                    None if request_id is None else str(request_id), status)


class InvalidInput(GatewayClientError):
    """What was sent was refused as it stood (``invalid``, ``malformed_json``,
    ``too_large``, ``unknown_type``): ``field`` names the part at fault, if known."""


class Unauthorized(GatewayClientError):
    """The token is missing or not known (``unauthorized``)."""


class Forbidden(GatewayClientError):
    """The token's role or scope does not allow it (``forbidden``)."""


class NotFound(GatewayClientError):
    """No such agent, provider, event, schedule or run (``unknown_agent``,
    ``unknown_provider``, ``not_found``, ``unknown_run``)."""


class Conflict(GatewayClientError):
    """It no longer applies (``conflict``: a run that is not the active one, a resume that
    would undo a later stop; a worker's ``run_ended``, ``out_of_order``, ``step_budget``);
    do not retry it as it stands."""


class Unavailable(GatewayClientError):
    """Nothing was taken now; the same call may succeed later (``busy``, ``unavailable``,
    ``storage_failed``, ``not_running``)."""


class ConnectionLost(GatewayClientError):
    """No answer can come: the client was closed, or could not reconnect."""

    def __init__(self, message: str) -> None:
        super().__init__("connection_lost", message)


ERROR_CLASSES: dict[str, type[GatewayClientError]] = {
    **dict.fromkeys(("invalid", "malformed_json", "too_large", "unknown_type"), InvalidInput),
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    **dict.fromkeys(("unknown_agent", "unknown_provider", "not_found", "unknown_run"),
                    NotFound),
    **dict.fromkeys(("conflict", "run_ended", "out_of_order", "step_budget"), Conflict),
    **dict.fromkeys(("busy", *RETRYABLE_CODES), Unavailable),
}
"""The class of the exception each of the gateway's error codes raises (others: the base)."""
