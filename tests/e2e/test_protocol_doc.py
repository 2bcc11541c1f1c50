"""The protocol document and the schemas agree with the code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

from gateway.cli import main
from gateway.edge.protocol import CLIENT_TYPES, ServerFrame, json_schemas
from gateway.errors import HTTP_STATUS

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = (DOCS / "protocol.md").read_text()
CLUSTER_DOC = (DOCS / "cluster.md").read_text()


def test_every_frame_type_and_error_code_is_documented() -> None:
    for kind in CLIENT_TYPES:
        if kind != "auth":
            assert f"| `{kind}` |" in DOC, kind
    union = get_args(get_args(ServerFrame)[0])
    server_types = [get_args(model.model_fields["type"].annotation)[0] for model in union]
    assert "events" in server_types
    for kind in server_types:
        assert f"| `{kind}` |" in DOC, kind
    for code in HTTP_STATUS:
        if code not in {"not_found", "conflict"}:
            assert f"`{code}`" in DOC, code


def test_the_schema_command_prints_every_frame(capsys: object) -> None:
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert printed == json.loads(json.dumps(json_schemas()))
    client = json.dumps(printed["client"])
    assert all(f'"{kind}"' in client for kind in CLIENT_TYPES)


def test_every_http_route_is_in_the_openapi_document_and_the_protocol_doc() -> None:
    from starlette.routing import Route

    from gateway.edge.app import create_app
    from gateway.edge.auth import TokenBook
    from gateway.edge.openapi import openapi_document
    from gateway.edge.service import Service
    from gateway.runtime.engine import Engine
    from store import MemoryEventStore

    app = create_app(Service(engine=Engine(MemoryEventStore(), {}), tokens=TokenBook([])))
    paths = openapi_document()["paths"]
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/internal/"):
            assert f"`{route.path}`" in CLUSTER_DOC, route.path  # not for clients
        elif isinstance(route, Route) and route.path != "/openapi.json":
            path = route.path.replace("{position:int}", "{position}")
            assert path in paths, path
            if path.startswith("/api/"):
                shown = path.replace("{agent_id}", "{id}").replace("{run_id}", "{runId}")
                assert shown.split("{")[0].rstrip("/") in DOC, path


def test_the_schema_command_prints_the_worker_frames_and_docs_workers_names_each(
        capsys: object) -> None:
    from gateway.edge.worker_protocol import WORKER_TYPES, GatewayToWorker

    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    doc = (DOCS / "workers.md").read_text()
    to_gateway = json.dumps(printed["worker"])
    for kind in WORKER_TYPES:
        assert f'"{kind}"' in to_gateway and f"| `{kind}` |" in doc, kind
    to_worker = json.dumps(printed["gateway"])
    union = get_args(get_args(GatewayToWorker)[0])
    kinds = [get_args(model.model_fields["type"].annotation)[0] for model in union]
    assert {"ready", "run", "cancel", "error"} <= set(kinds)
    for kind in kinds:
        assert f'"{kind}"' in to_worker and f"| `{kind}` |" in doc, kind
    for code in ("unknown_run", "run_ended", "out_of_order", "step_budget"):
        assert f"`{code}`" in doc, code
