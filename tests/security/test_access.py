"""Who may do what: the role and scope matrix over every route and both WebSocket endpoints,
cross-origin refusals, secrets kept out of logs and the event log, injection and path
traversal attempts that find nothing and change nothing."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from gateway.errors import HTTP_STATUS
from lanes import verify
from tests.e2e.live import TIMEOUT, TOKENS, browser_protocols
from tests.security.server import Threaded, raw_http, received_ids, threaded, trigger

ALLOWED_ORIGIN = "https://panel.example"


@pytest.fixture(scope="module")
def gw() -> Iterator[Threaded]:
    with threaded(allowed_origins=frozenset({ALLOWED_ORIGIN})) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def http(gw: Threaded) -> Iterator[httpx2.Client]:
    """One client for the module (making one costs more than a hundred requests)."""
    with gw.http() as client:
        yield client


# ----------------------------------------------------------------------- role matrix

OK, NO, ANON = "ok", 403, 401
ROLES = ["feed-secret", "viewer-secret", "control-secret", "admin-secret", "scoped-secret",
         None, "wrong-secret"]
READ = {"feed-secret": NO, "viewer-secret": OK, "control-secret": OK, "admin-secret": OK,
        "scoped-secret": OK}
READ_OTHER = {**READ, "scoped-secret": NO}  # an agent outside the scoped token's scope
SUBMIT = {**READ, "feed-secret": OK, "viewer-secret": NO}
SUBMIT_OTHER = {**SUBMIT, "scoped-secret": NO}
OPERATE = {**READ, "feed-secret": NO, "viewer-secret": NO}
OPERATE_OTHER = {**OPERATE, "scoped-secret": NO}
ADMIN = {"feed-secret": NO, "viewer-secret": NO, "control-secret": NO, "admin-secret": OK,
         "scoped-secret": NO}
PUBLIC = dict.fromkeys(READ, OK)


def _body(kind: str, agent: str) -> Any:
    if kind == "request":
        return trigger(agent)
    if kind == "control":
        return {"action": "cancel_all"}
    if kind == "config":
        return {}
    if kind == "limits":
        return {"requestsPerMinute": 60}
    return None


# (method, path, body kind, expected per token; None and a wrong token are 401 unless public)
MATRIX: list[tuple[str, str, str | None, dict[str, Any]]] = [
    ("GET", "/healthz", None, PUBLIC),
    ("GET", "/livez", None, PUBLIC),
    ("GET", "/readyz", None, PUBLIC),
    ("GET", "/openapi.json", None, PUBLIC),
    ("GET", "/metrics", None, READ),
    ("GET", "/api/agents", None, READ),
    ("GET", "/api/agents/btc", None, READ),
    ("GET", "/api/agents/eth", None, READ_OTHER),
    ("GET", "/api/agents/btc/queue", None, READ),
    ("GET", "/api/agents/eth/queue", None, READ_OTHER),
    ("GET", "/api/agents/btc/events", None, READ),
    ("GET", "/api/agents/eth/events", None, READ_OTHER),
    ("GET", "/api/events", None, READ),
    ("GET", "/api/events?agent=eth", None, READ_OTHER),
    ("GET", "/api/events/1", None, READ),
    ("GET", "/api/event-types", None, READ),
    ("GET", "/api/events?q=x&agent=eth", None, READ_OTHER),
    ("GET", "/api/agents/btc/runs", None, READ),
    ("GET", "/api/agents/eth/runs", None, READ_OTHER),
    ("GET", "/api/charts", None, READ),
    ("GET", "/api/charts?agent=eth", None, READ_OTHER),
    ("GET", "/api/capacity", None, READ),
    ("GET", "/api/capacity?agent=eth", None, READ_OTHER),
    ("GET", "/api/orders", None, READ),
    ("GET", "/api/pnl", None, READ),
    ("GET", "/api/feed", None, READ),
    ("GET", "/api/desk/budget", None, READ),
    ("GET", "/api/pnl?agent=eth", None, READ_OTHER),
    ("GET", "/api/orders?agent=eth", None, READ_OTHER),
    ("GET", "/api/agents/btc/orders", None, READ),
    ("GET", "/api/agents/eth/orders", None, READ_OTHER),
    ("GET", "/api/replay?agent=btc", None, READ),
    ("GET", "/api/replay?agent=eth", None, READ_OTHER),
    ("GET", "/api/agents/btc/story", None, READ),
    ("GET", "/api/agents/eth/story?at=1", None, READ_OTHER),
    ("GET", "/api/agents/btc/story/find?kind=stop&after=0", None, READ),
    ("GET", "/api/agents/eth/story/find?kind=drop&after=0", None, READ_OTHER),
    ("GET", "/api/agents/btc/moment", None, READ),
    ("GET", "/api/agents/eth/moment", None, READ_OTHER),
    ("GET", "/api/agents/btc/diff?from=0&to=0", None, READ),
    ("GET", "/api/agents/eth/diff?from=0&to=0", None, READ_OTHER),
    ("GET", "/api/providers", None, READ),
    ("GET", "/api/providers/none", None, READ),
    ("POST", "/api/agents/btc/requests", "request", SUBMIT),
    ("POST", "/api/agents/eth/requests", "request", SUBMIT_OTHER),
    ("POST", "/api/agents/btc/control", "control", OPERATE),
    ("POST", "/api/agents/eth/control", "control", OPERATE_OTHER),
    ("POST", "/api/agents/btc/queue/clear", None, OPERATE),
    ("POST", "/api/agents/eth/queue/clear", None, OPERATE_OTHER),
    ("POST", "/api/agents/btc/release", None, OPERATE),
    ("POST", "/api/agents/eth/release", None, OPERATE_OTHER),
    ("POST", "/api/agents/btc/runs/r1/abort", None, OPERATE),
    ("POST", "/api/agents/eth/runs/r1/abort", None, OPERATE_OTHER),
    ("POST", "/api/agents/btc/config", "config", ADMIN),
    ("POST", "/api/providers/none/limits", "limits", ADMIN),
]


def _expected(table: dict[str, Any], token: str | None) -> Any:
    if table is PUBLIC:
        return OK
    return table.get(token or "", ANON)


@pytest.mark.parametrize(("method", "path", "body", "table"), MATRIX,
                         ids=[f"{m} {p}" for m, p, _, _ in MATRIX])
def test_every_route_answers_each_role_and_scope_as_documented(
    http: httpx2.Client, method: str, path: str, body: str | None, table: dict[str, Any]
) -> None:
    agent = path.split("/")[3] if path.startswith("/api/agents/") else "btc"
    for token in ROLES:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        payload = _body(body, agent) if body else None
        response = http.request(method, path, headers=headers, json=payload)
        expected = _expected(table, token)
        where = f"{method} {path} as {token}: {response.status_code} {response.text[:200]}"
        if expected == OK:  # allowed: past auth, whatever the route then answers
            assert response.status_code not in (401, 403), where
            assert response.status_code < 500, where
        else:
            assert response.status_code == expected, where
            error = response.json()
            assert error["code"] == ("unauthorized" if expected == 401 else "forbidden")
            assert HTTP_STATUS[error["code"]] == expected


def test_a_scoped_token_lists_and_reads_only_its_agents(gw: Threaded) -> None:
    with gw.http("scoped-secret") as http:
        assert [a["agentId"] for a in http.get("/api/agents").json()] == ["btc"]
        streams = {e["stream"] for e in http.get("/api/events?limit=1000").json()["events"]}
        assert streams <= {"btc"}
        assert 'agent="eth"' not in http.get("/metrics").text


WS: list[tuple[str, str | None, str]] = [
    ("feed", "feed-secret", "feed"), ("feed", "viewer-secret", "forbidden"),
    ("feed", "control-secret", "control"), ("feed", "admin-secret", "admin"),
    ("feed", "scoped-secret", "control"), ("feed", None, "unauthorized"),
    ("feed", "wrong-secret", "unauthorized"),
    ("control", "feed-secret", "forbidden"), ("control", "viewer-secret", "viewer"),
    ("control", "control-secret", "control"), ("control", "admin-secret", "admin"),
    ("control", "scoped-secret", "control"), ("control", None, "unauthorized"),
    ("control", "wrong-secret", "unauthorized"),
]


@pytest.mark.parametrize(("endpoint", "token", "outcome"), WS)
@pytest.mark.parametrize("by", ["header", "frame"])
def test_websocket_endpoints_admit_roles_as_documented(
    gw: Threaded, endpoint: str, token: str | None, outcome: str, by: str
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token and by == "header" else {}
    with connect(f"{gw.live.ws}/ws/{endpoint}", open_timeout=TIMEOUT,
                 additional_headers=headers) as ws:
        if by == "frame" or not token:  # no header: the first frame must authenticate
            first = {"type": "auth", "token": token} if token else {"type": "ping"}
            ws.send(json.dumps(first))
        answer = json.loads(ws.recv(TIMEOUT))
        if outcome in ("unauthorized", "forbidden"):
            assert (answer["type"], answer["code"]) == ("error", outcome), answer
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(TIMEOUT)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            return
        assert (answer["type"], answer["role"]) == ("hello", outcome), answer
        request = trigger("btc", "user_control", priority="high",
                          payload={"message": "hi"})
        ws.send(json.dumps({"type": "submit", "id": "s", "request": request}))
        reply = json.loads(ws.recv(TIMEOUT))
        if outcome in ("feed", "viewer"):  # feed: triggers and alerts only; viewer: nothing
            assert reply["code"] == "forbidden", reply
        else:
            assert reply["type"] == "ack", reply
        ws.send(json.dumps({"type": "subscribe", "id": "sub", "agents": ["eth"]}))
        reply = json.loads(ws.recv(TIMEOUT))
        if outcome == "feed" or token == "scoped-secret":
            assert reply["code"] == "forbidden", reply
        else:
            assert reply["type"] == "snapshot", reply


# ---------------------------------------------------------------------------- origins


@pytest.mark.parametrize("endpoint", ["feed", "control"])
def test_a_foreign_origin_is_refused_at_the_websocket_handshake(
    gw: Threaded, endpoint: str
) -> None:
    with pytest.raises(InvalidStatus) as refused, connect(
            f"{gw.live.ws}/ws/{endpoint}", open_timeout=TIMEOUT, origin=Origin("https://evil.example"),
            additional_headers={"Authorization": "Bearer admin-secret"}):
        pass
    assert refused.value.response.status_code == 403


@pytest.mark.parametrize("origin", [ALLOWED_ORIGIN, "same"])
def test_the_own_and_allowed_origins_are_accepted(gw: Threaded, origin: str) -> None:
    origin = f"http://{gw.host}" if origin == "same" else origin
    with connect(f"{gw.live.ws}/ws/control", open_timeout=TIMEOUT, origin=Origin(origin),
                 additional_headers={"Authorization": "Bearer viewer-secret"}) as ws:
        assert json.loads(ws.recv(TIMEOUT))["type"] == "hello"


def test_a_foreign_origin_cannot_post_but_may_read(gw: Threaded) -> None:
    with gw.http("admin-secret") as http:
        http.headers["Origin"] = "https://evil.example"
        before = len(gw.log())
        refused = http.post("/api/agents/btc/requests", json=trigger("btc"))
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        assert http.post("/api/agents/btc/release").status_code == 403
        assert len(gw.log()) == before
        assert http.get("/api/agents").status_code == 200
        allowed = http.post("/api/agents/btc/requests", json=trigger("btc"),
                            headers={"Origin": ALLOWED_ORIGIN})
        assert allowed.status_code == 200, allowed.text


# ----------------------------------------------------------------------------- secrets


def test_tokens_never_reach_the_logs_or_the_event_log(
    gw: Threaded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # uvicorn's own loggers do not propagate: listen to them directly, at INFO (access
    # lines; the gateway serves at WARNING). At DEBUG the websockets library traces every
    # frame, the auth frame included: a library trace, never on in the gateway.
    for name in SERVER_LOGGERS:
        caplog.set_level(logging.DEBUG if name == "gateway" else logging.INFO, logger=name)
        logging.getLogger(name).addHandler(caplog.handler)
    try:
        _authenticate_every_way(gw)
    finally:
        for name in SERVER_LOGGERS:
            logging.getLogger(name).removeHandler(caplog.handler)
    records = gw.call(gw.live.engine.store.read())
    client_side = ("websockets.client", "httpx", "httpcore")  # the test's own clients
    server = [r for r in caplog.records if not r.name.startswith(client_side)]
    assert any(r.name == "uvicorn.access" for r in server), "the capture is not working"
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in server)
    stored = "\n".join(f"{r.stream} {r.type} {r.data}" for r in records)
    for token in SECRETS:
        as_subprotocol = browser_protocols(token)[1]
        assert token not in logged and as_subprotocol not in logged
        assert token not in stored and as_subprotocol not in stored
    assert "ops" in stored  # the principal's name is what is recorded


SERVER_LOGGERS = ["uvicorn", "uvicorn.error", "uvicorn.access", "gateway",
                  "websockets.server", "starlette"]
SECRETS = [*TOKENS, "wrong-secret-xyz"]


def _authenticate_every_way(gw: Threaded) -> None:
    with gw.http() as http:
        for token in SECRETS:
            auth = {"Authorization": f"Bearer {token}"}
            http.get("/api/agents", headers=auth)
            http.post("/api/agents/btc/requests", headers=auth,
                      json=trigger("btc", "system_alert"))
            http.post("/api/agents/eth/control", headers=auth, json={"action": "cancel_all"})
            for endpoint in ("feed", "control"):
                with connect(f"{gw.live.ws}/ws/{endpoint}", open_timeout=TIMEOUT) as ws:
                    ws.send(json.dumps({"type": "auth", "token": token}))
                    ws.recv(TIMEOUT)
                    ws.send(json.dumps({"type": "submit", "request": trigger("btc")}))
                    with contextlib.suppress(ConnectionClosed):
                        ws.recv(TIMEOUT)
                with connect(f"{gw.live.ws}/ws/{endpoint}", open_timeout=TIMEOUT,
                             subprotocols=browser_protocols(token)) as ws, \
                        contextlib.suppress(ConnectionClosed):  # as the panel does
                    ws.recv(TIMEOUT)


# ----------------------------------------------------------------------------- injection

INJECTIONS = ["x' OR 1=1--", "btc' OR '1'='1", "btc; DROP TABLE events;--", "../btc",
              "../../etc/passwd", "btc\x00", "btc%00", "%2e%2e%2fbtc", "*", "%", "btc/../eth",
              '{"$ne": null}', "\u202ebtc"]


@pytest.mark.parametrize("param", ["agent", "type", "q"])
def test_injected_filters_find_nothing_and_change_nothing(gw: Threaded, param: str) -> None:
    before = gw.log()
    with gw.http("admin-secret") as http:
        assert http.post("/api/agents/btc/requests", json=trigger("btc")).status_code == 200
        for value in INJECTIONS:
            response = http.get("/api/events", params={param: value, "limit": "1000"})
            assert response.status_code == 200, response.text
            assert response.json()["events"] == [], value
            replay = http.get("/api/replay", params={"agent": value})
            assert replay.status_code in (404, 422), replay.text
    after = gw.log()
    assert after[:len(before)] == before and len(after) > len(before)
    assert verify(after) is None


@pytest.mark.parametrize("agent", ["x' OR 1=1--", "..%2F..%2Fetc%2Fpasswd", "btc%00",
                                   "%2e%2e", "btc%20OR%201=1"])
def test_injected_agent_ids_in_paths_are_unknown_and_change_nothing(
    gw: Threaded, agent: str
) -> None:
    before = gw.log()
    headers = {"Authorization": "Bearer admin-secret", "Content-Type": "application/json"}
    body = json.dumps(trigger("btc")).encode()
    for suffix, method in [("", "GET"), ("/queue", "GET"), ("/events", "GET"),
                           ("/requests", "POST"), ("/control", "POST"), ("/release", "POST"),
                           ("/config", "POST")]:
        status, answer = raw_http(gw.host, f"/api/agents/{agent}{suffix}", method, headers,
                                  body if method == "POST" else b"")
        assert 400 <= status < 500, (agent, suffix, status, answer)
    assert gw.log() == before


def test_requests_with_injected_ids_are_stored_verbatim_or_refused(gw: Threaded) -> None:
    before = received_ids(gw.log())
    with gw.http("admin-secret") as http:
        for value in ["../../etc/passwd", "x' OR 1=1--", "a\x00b"]:
            request = {**trigger("btc"), "requestId": value}
            http.post("/api/agents/btc/requests", json=request)
            wrong = http.post("/api/agents/btc/requests", json={**trigger("btc"),
                                                                "agentId": value})
            assert wrong.status_code in (404, 422), wrong.text
    after = received_ids(gw.log())
    assert after[:len(before)] == before
    assert set(after[len(before):]) <= {"../../etc/passwd", "x' OR 1=1--", "a\x00b"}
    assert verify(gw.log()) is None


# ----------------------------------------------------------------------- static files

TRAVERSALS = ["/../pyproject.toml", "/%2e%2e/pyproject.toml", "/%2E%2E/pyproject.toml",
              "/..%2fpyproject.toml", "/..%2Fpyproject.toml", "/%2e%2e%2fpyproject.toml",
              "/web/../../etc/passwd", "/js/../../pyproject.toml",
              "/js/%2e%2e/%2e%2e/pyproject.toml", "/..%5cpyproject.toml", "/....//pyproject.toml",
              "/%252e%252e/pyproject.toml", "//etc/passwd", "/../../../../etc/passwd",
              "/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/..%00/pyproject.toml",
              "/index.html/../../pyproject.toml", "/gateway/app.py", "/../gateway/app.py"]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_static_files_never_leave_web(gw: Threaded, target: str) -> None:
    status, body = raw_http(gw.host, target)
    assert b"[project]" not in body and b"root:" not in body and b"import " not in body, target
    assert status in (200, 400, 404, 405), (target, status)
    if status == 200:  # normalised into web/: only the panel itself
        assert b"<html" in body.lower() or b"<!doctype" in body.lower(), target


def test_the_panel_itself_is_served(gw: Threaded) -> None:
    status, body = raw_http(gw.host, "/")
    assert status == 200 and b"<" in body


def test_a_browser_app_on_an_allowed_origin_gets_its_preflight_answered_and_no_other(
        gw: Threaded) -> None:
    with httpx2.Client(base_url=gw.live.http, timeout=TIMEOUT) as http:
        asked = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
        allowed = http.options("/api/agents/btc/control",
                               headers={"Origin": ALLOWED_ORIGIN, **asked})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "POST" in allowed.headers["access-control-allow-methods"]
        foreign = http.options("/api/agents/btc/control",
                               headers={"Origin": "https://evil.example", **asked})
        assert foreign.status_code == 400
        assert "access-control-allow-origin" not in foreign.headers
        read = http.get("/api/agents", headers={"Origin": ALLOWED_ORIGIN,
                                                "Authorization": "Bearer viewer-secret"})
        assert read.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
