"""The gateway's errors: each says what was wrong and what to do; no internals leak."""

from __future__ import annotations

from dataclasses import dataclass

from lanes.requests import AgentRequest, FieldError, InvalidRequest


class GatewayError(Exception):
    """Base of the errors a client may see; ``code`` is stable (see `CODES` for its HTTP
    status, WebSocket close code and whether it is the client's fault), the message is for
    people."""

    code = "internal"

    @property
    def status(self) -> int:
        """The HTTP status of this error."""
        return CODES[self.code].status

    @property
    def close_code(self) -> int | None:
        """The WebSocket close code when this error ends a connection (None: it does not)."""
        return CODES[self.code].close

    @property
    def client_fault(self) -> bool:
        """Whether the client sent something wrong (rather than the gateway failing now)."""
        return CODES[self.code].client_fault


class UnknownAgent(GatewayError):
    """The request names an agent this gateway does not have."""

    code = "unknown_agent"

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"unknown agent {agent_id!r}; list agents with GET /api/agents")
        self.agent_id = agent_id


class AgentUnavailable(GatewayError):
    """The agent is being rebuilt from the log after a storage failure; retry shortly."""

    code = "unavailable"

    def __init__(self, agent_id: str, detail: str | None = None) -> None:
        cause = f" ({detail})" if detail else ""
        super().__init__(f"agent {agent_id!r} is recovering from a storage error{cause}; "
                         "nothing was taken: retry with the same requestId shortly")
        self.agent_id = agent_id


class TakingOver(GatewayError):
    """This process has just taken the agent over and is still loading it; retry shortly
    (never forwarded on: it is the owner)."""

    code = "unavailable"

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent {agent_id!r} is being taken over by this gateway process "
                         "(its last one stopped); nothing was taken: retry with the same "
                         "requestId shortly")
        self.agent_id = agent_id


class NotOwner(GatewayError):
    """Several gateway processes share the log and another one owns this agent (``owner``:
    the URL it serves at), or none does right now (its owner died: another one takes it
    over within the lease time). Nothing was taken here; the request is forwarded to the
    owner when there is one."""

    code = "unavailable"

    def __init__(self, agent_id: str, owner: str | None) -> None:
        if owner is None:
            super().__init__(f"agent {agent_id!r} has no gateway process right now (its "
                             "owner stopped; another one takes it over within the lease "
                             "time); nothing was taken: retry with the same requestId shortly")
        else:
            super().__init__(f"agent {agent_id!r} is served by the gateway process at "
                             f"{owner}; nothing was taken here: send it there, or retry with "
                             "the same requestId")
        self.agent_id = agent_id
        self.owner = owner


class NotRunning(GatewayError):
    """The engine is not started, or is stopping."""

    code = "not_running"

    def __init__(self) -> None:
        super().__init__("the gateway is not accepting requests (starting or stopping)")


class StorageFailed(GatewayError):
    """The commit failed: the request was NOT accepted and may be retried as is."""

    code = "storage_failed"

    def __init__(self, detail: str, *, held: bool = False) -> None:
        if held:
            super().__init__(
                f"the control was not stored yet: {detail}. The gateway holds it and stores "
                "and applies it itself, before anything else of this agent, as soon as the "
                "log can be written, unless the process stops first (an emergency stop has "
                "stopped the agent's run already); "
                "a retry with the same requestId is safe")
        else:
            super().__init__(
                f"the request was not stored: {detail}; retry with the same requestId")
        self.detail = detail
        self.held = held


class Superseded(GatewayError):
    """A control refused during a storage fault, sent again after a stop that was sent
    after it and is now in force: applying it now would undo that stop."""

    code = "conflict"

    def __init__(self, request: AgentRequest) -> None:
        action = request.action.value if request.action is not None else request.kind.value
        super().__init__(
            f"{action} {request.request_id!r} was refused while the event log could not be "
            "written, and a stop sent after it is in force now: it is not applied. Send a new "
            f"{action} (a new requestId) if you still want it")
        self.request_id = request.request_id


class StorageUnreadable(GatewayError):
    """The event log could not be read (a read, not a write, failed); retry shortly."""

    code = "storage_failed"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}; retry shortly")


class Unauthorized(GatewayError):
    """No token, or a token this gateway does not know."""

    code = "unauthorized"

    def __init__(self, detail: str = "a valid bearer token is required") -> None:
        super().__init__(detail)


class Forbidden(GatewayError):
    """The token is known but its role or agent scope does not allow this."""

    code = "forbidden"


class Busy(GatewayError):
    """The writer is saturated; nothing was taken. Send the same thing again later."""

    code = "busy"

    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(f"the gateway is saturated; retry in {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class BadFrame(GatewayError):
    """A frame or body that is not what the protocol expects (see ``code``)."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


class Unstorable(BadFrame):
    """An input that passed validation but would not read back from the log as it was sent
    (the last check before anything is stored); nothing was taken."""

    def __init__(self, what: str, detail: str, field: str | None = None) -> None:
        super().__init__("invalid", f"{what} cannot be stored as sent: {detail}; nothing "
                         "was taken", field)


class UnknownProvider(GatewayError):
    """The request names a provider gate this gateway does not have."""

    code = "unknown_provider"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown provider {name!r}; list them with GET /api/providers")
        self.name = name


def storage_fault_kind(reason: str) -> str:
    """What kind of storage fault ``reason`` (a `store.WriteFailed` reason) describes,
    without its paths and figures: for anyone who asks, and to tell one fault from another."""
    for marker, kind in (("locked", "it is locked by another process"),
                         ("read-only", "it is read-only"),
                         ("file size limit", "a file reached the process's size limit"),
                         ("full", "the disk is full")):
        if marker in reason:
            return kind
    return "an I/O error (the server's log says which)"


@dataclass(frozen=True, slots=True)
class Code:
    """What an error code means on each transport."""

    status: int
    """The HTTP status of an answer with this code."""
    client_fault: bool
    """The client sent something wrong (sending the same again fails again); else the
    gateway could not do it now (a retry may succeed) or failed itself."""
    close: int | None = None
    """The WebSocket close code when this error ends a connection (its handshake or auth);
    None: it is answered with an error frame and the connection stays."""


CODES: dict[str, Code] = {
    "invalid": Code(422, True),
    "malformed_json": Code(400, True),
    "unknown_type": Code(400, True),
    "too_large": Code(413, True, close=1009),
    "unauthorized": Code(401, True, close=1008),
    "forbidden": Code(403, True, close=1008),
    "unknown_agent": Code(404, True),
    "unknown_provider": Code(404, True),
    "not_found": Code(404, True),
    "conflict": Code(409, True),
    "unknown_run": Code(404, True),
    "run_ended": Code(409, True),
    "out_of_order": Code(409, True),
    "step_budget": Code(409, True),
    "busy": Code(503, False, close=1013),
    "unavailable": Code(503, False),
    "storage_failed": Code(503, False),
    "not_running": Code(503, False, close=1013),
    "internal": Code(500, False, close=1011),
}
"""Every error code a client may see, and what it means on HTTP and WebSocket (an error
frame carries the code itself)."""

HTTP_STATUS: dict[str, int] = {name: code.status for name, code in CODES.items()}
"""The HTTP status of each error code."""


__all__ = [
    "CODES",
    "HTTP_STATUS",
    "AgentUnavailable",
    "BadFrame",
    "Busy",
    "Code",
    "FieldError",
    "Forbidden",
    "GatewayError",
    "InvalidRequest",
    "NotOwner",
    "NotRunning",
    "StorageFailed",
    "StorageUnreadable",
    "Superseded",
    "Unauthorized",
    "UnknownAgent",
    "UnknownProvider",
    "Unstorable",
    "storage_fault_kind",
]
