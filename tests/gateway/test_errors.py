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
