"""Every error a client may see has one entry in `gateway.errors.CODES`: its HTTP status,
its WebSocket close code and whether it is the client's fault."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway
from gateway.errors import CODES, HTTP_STATUS, BadFrame, Busy, GatewayError, UnknownAgent


def subclasses(cls: type[GatewayError]) -> list[type[GatewayError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *subclasses(sub)]
    return found


def test_every_error_class_has_a_known_code() -> None:
    for module in pkgutil.walk_packages(gateway.__path__, "gateway."):
        importlib.import_module(module.name)
    classes = subclasses(GatewayError)
    assert len(classes) > 10
    # These end a run (recorded as its failure, with their code); no client is answered them.
    in_runs = {"SpendLimitError", "SlotRefusedError"}
    assert in_runs <= {cls.__name__ for cls in classes}
    every: list[type[GatewayError]] = [GatewayError, *classes]
    for cls in every:
        if cls.__name__ not in in_runs:
            assert cls.code in CODES, cls


@pytest.mark.parametrize(("error", "status", "close", "client"), [
    (UnknownAgent("a"), 404, None, True),
    (Busy(100), 503, 1013, False),
    (BadFrame("too_large", "x"), 413, 1009, True),
    (GatewayError("x"), 500, 1011, False),
])
def test_an_error_carries_its_status_close_code_and_fault(
        error: GatewayError, status: int, close: int | None, client: bool) -> None:
    assert (error.status, error.close_code, error.client_fault) == (status, close, client)
    assert HTTP_STATUS[error.code] == status


async def test_an_unexpected_failure_is_answered_500_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Starlette re-raises what its `Exception` handler answered, for the server to log
    (uvicorn: "Exception in ASGI application"): the handler itself logs nothing more."""
    import logging

    import httpx2
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from gateway.edge.answers import answer_error

    async def boom(request: Request) -> Response:
        raise KeyError("a bug")

    app = Starlette(routes=[Route("/boom", boom)],
                    exception_handlers={GatewayError: answer_error, Exception: answer_error})
    caplog.set_level(logging.DEBUG)
    transport = httpx2.ASGITransport(app, raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://gw") as client:
        answered = await client.get("/boom")
    assert (answered.status_code, answered.json()["code"]) == (500, "internal")
    assert "a bug" not in answered.text
    assert [r.getMessage() for r in caplog.records if r.name.startswith("gateway")] == []
    with pytest.raises(KeyError):  # what the server logs
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app),
                                     base_url="http://gw") as client:
            await client.get("/boom")
