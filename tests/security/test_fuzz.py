"""Fuzzing the wire: WebSocket frames and HTTP bodies and query parameters, valid, nearly valid
and garbage. The gateway answers every one in time with a typed error (or a documented close
code), never a 500, keeps the connection usable after recoverable errors, and the log holds
exactly the requests it acknowledged."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from gateway.errors import HTTP_STATUS
from lanes import verify
from tests.e2e.live import TIMEOUT
from tests.security.server import Threaded, raw_http, received_ids, threaded, trigger

FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
CODES = set(HTTP_STATUS)
MAX_FRAME = 64 << 10


@pytest.fixture(scope="module")
def gw() -> Iterator[Threaded]:
    with threaded(max_frame_bytes=MAX_FRAME) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def acked() -> set[str]:
    """Request ids the gateway acknowledged (over any path) during this module."""
    return set()


def open_ws(stack: contextlib.ExitStack, gw: Threaded, endpoint: str, token: str
            ) -> ClientConnection:
    ws = stack.enter_context(connect(
        f"{gw.live.ws}/ws/{endpoint}", open_timeout=TIMEOUT, max_size=None,
        additional_headers={"Authorization": f"Bearer {token}"}))
    hello = json.loads(ws.recv(TIMEOUT))
    assert hello["type"] == "hello", hello
    return ws


def recv(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(ws.recv(TIMEOUT))
    return frame


# ------------------------------------------------------------------------ strategies

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.text(max_size=30)
any_json = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) |
                        st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
weird: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=20), st.just("x" * 70_000), st.just([]), st.just({}),
    st.just("\x00../../etc/passwd"), st.just("' OR 1=1--"))


def _valid(kind: str) -> dict[str, Any]:
    if kind == "submit":
        return {"type": "submit", "request": trigger()}
    if kind == "submit_many":
        return {"type": "submit_many", "requests": [trigger(), trigger("eth")]}
    if kind == "market":
        return {"type": "market", "events": [
            {"type": "tick", "symbol": "BTCUSD", "price": 64012.5, "size": 0.2,
             "at": "2026-02-17T03:10:00.250Z"}]}
    if kind == "subscribe":
        return {"type": "subscribe", "agents": ["btc"]}
    return {"type": "ping"}


def valid_frames() -> st.SearchStrategy[dict[str, Any]]:
    return st.sampled_from(["submit", "submit_many", "market", "subscribe", "ping"]).map(_valid)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A valid frame with one thing wrong: a field dropped, of a wrong type, huge, or extra."""
    frame = draw(valid_frames())
    paths = _paths(frame)
    path = draw(st.sampled_from(paths))
    *parents, last = path
    holder: Any = frame
    for key in parents:
        holder = holder[key]
    how = draw(st.sampled_from(["drop", "replace", "extra"]))
    if how == "drop":
        del holder[last]
    elif how == "replace":
        holder[last] = draw(weird)
    elif isinstance(holder, dict):
        holder[draw(st.text(min_size=1, max_size=12))] = draw(weird)
    else:
        holder.append(draw(weird))
    frame["id"] = draw(st.none() | st.text(max_size=10))
    return frame


raw_frames = (
    mutated().map(json.dumps)
    | any_json.map(json.dumps)
    | st.binary(max_size=200)
    | st.text(max_size=200)
    | st.integers(min_value=1, max_value=100_000).map(lambda n: "[" * n)
    | st.integers(min_value=1, max_value=100_000).map(lambda n: '{"a":' * n)
)


# --------------------------------------------------------------------------- WebSocket


@pytest.fixture(scope="module")
def sockets(gw: Threaded) -> Iterator[dict[str, ClientConnection]]:
    with contextlib.ExitStack() as stack:
        yield {"control": open_ws(stack, gw, "control", "control-secret"),
               "feed": open_ws(stack, gw, "feed", "feed-secret")}


def _check_answer(answer: dict[str, Any], acked: set[str]) -> None:
    if answer["type"] == "error":
        assert answer["code"] in CODES, answer
        assert answer["code"] != "internal", answer
    for ack in [answer, *answer.get("results", []), *answer.get("triggered", [])]:
        if ack.get("type") == "ack" and ack.get("decision") != "rejected":
            acked.add(ack["requestId"])


@pytest.mark.parametrize("endpoint", ["control", "feed"])
def test_fuzzed_frames_get_typed_answers_and_the_connection_keeps_working(
    gw: Threaded, sockets: dict[str, ClientConnection], acked: set[str], endpoint: str
) -> None:
    before = gw.log()
    ws = sockets[endpoint]
    owed = [0]  # fuzzed frames not answered yet (answers to valid frames may come late)
    pings = iter(range(10**9))

    @FUZZ
    @given(raw=raw_frames, binary=st.booleans())
    def example(raw: str | bytes, binary: bool) -> None:
        ws.send(raw.encode() if binary and isinstance(raw, str) else raw)
        owed[0] += 1
        alive = f"alive-{next(pings)}"
        ws.send(json.dumps({"type": "ping", "id": alive}))  # still usable
        ponged = False
        while not ponged or owed[0] > 0:
            answer = recv(ws)
            if answer["type"] in ("event", "heartbeat"):  # a subscription's, not answers
                continue
            if answer["type"] == "pong" and answer.get("id") == alive:
                ponged = True
                continue
            _check_answer(answer, acked)
            owed[0] -= 1
        assert owed[0] == 0  # one answer per frame, never more

    example()
    after = gw.log()
    assert after[:len(before)] == before
    assert verify(after) is None
    new = received_ids(after[len(before):])
    assert set(new) <= acked
    assert len(new) == len(set(new))


def test_frames_over_the_limit_are_refused_and_the_socket_survives(gw: Threaded) -> None:
    with connect(f"{gw.live.ws}/ws/control", open_timeout=TIMEOUT, max_size=None,
                 additional_headers={"Authorization": "Bearer control-secret"}) as ws:
        assert recv(ws)["type"] == "hello"
        big = json.dumps({"type": "submit", "id": "big",
                          "request": trigger(payload={"x": "y" * (2 * MAX_FRAME)})})
        ws.send(big)
        answer = recv(ws)
        assert (answer["type"], answer["code"], answer.get("id")) == ("error", "too_large", "big")
        ws.send(json.dumps({"type": "ping", "id": "p"}))
        assert recv(ws)["type"] == "pong"
        ws.send("x" * (5 << 20))  # beyond the server's WebSocket message size: 1009
        with pytest.raises(ConnectionClosed) as closed:
            recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_twenty_bad_frames_in_a_row_close_with_1008(gw: Threaded) -> None:
    with connect(f"{gw.live.ws}/ws/control", open_timeout=TIMEOUT,
                 additional_headers={"Authorization": "Bearer control-secret"}) as ws:
        assert recv(ws)["type"] == "hello"
        for _ in range(20):
            ws.send("{")
            assert recv(ws)["code"] == "malformed_json"
        with pytest.raises(ConnectionClosed) as closed:
            recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


# -------------------------------------------------------------------------------- HTTP

POSTS = ["/api/agents/btc/requests", "/api/agents/btc/control", "/api/agents/btc/queue/clear",
         "/api/agents/btc/release", "/api/agents/btc/runs/r1/abort", "/api/agents/btc/config",
         "/api/providers/openai/limits"]
GETS = ["/healthz", "/metrics", "/openapi.json", "/api/agents", "/api/agents/btc",
        "/api/agents/btc/queue", "/api/events", "/api/events/1", "/api/event-types",
        "/api/agents/btc/events", "/api/replay", "/api/providers", "/api/providers/openai",
        "/api/agents/btc/runs", "/api/charts", "/api/capacity", "/api/orders", "/api/pnl",
        "/api/agents/btc/orders",
        "/api/agents/btc/story", "/api/agents/btc/story/find", "/api/agents/btc/moment",
        "/api/agents/btc/diff"]
PARAMS = ["after", "limit", "agent", "type", "beforeVersion", "position", "around", "q",
          "before", "from", "to", "step", "symbol", "at", "kind", "provider", "busiest"]

bodies = (
    mutated().map(lambda f: json.dumps(f.get("request", f)).encode())
    | any_json.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200)
    | st.integers(min_value=1, max_value=100_000).map(lambda n: b"[" * n)
    | st.just(b"x" * (MAX_FRAME + 1))
)


def _check(response: httpx2.Response) -> None:
    assert response.status_code < 500 or response.status_code == 503, response.text
    if response.status_code >= 400:
        body = response.json()
        assert body["type"] == "error" and body["code"] in CODES, body
        assert HTTP_STATUS[body["code"]] == response.status_code, body


def test_fuzzed_http_bodies_and_queries_get_json_errors_never_500(
    gw: Threaded, acked: set[str]
) -> None:
    before = gw.log()
    with gw.http("admin-secret") as http:

        @FUZZ
        @given(path=st.sampled_from(POSTS), body=bodies,
               content_type=st.sampled_from(["application/json", "text/plain", "x/y"]))
        def post(path: str, body: bytes, content_type: str) -> None:
            response = http.post(path, content=body, headers={"Content-Type": content_type})
            _check(response)
            if response.status_code == 200 and response.json().get("type") == "ack":
                acked.add(response.json()["requestId"])

        @FUZZ
        @given(path=st.sampled_from(GETS),
               query=st.dictionaries(st.sampled_from(PARAMS),
                                     st.text(max_size=30) | st.integers().map(str), max_size=4))
        def get(path: str, query: dict[str, str]) -> None:
            _check(http.get(path, params=query))

        post()
        get()
    after = gw.log()
    assert after[:len(before)] == before
    assert verify(after) is None
    assert set(received_ids(after[len(before):])) <= acked


def test_a_deeply_nested_body_is_a_400_not_a_500(gw: Threaded) -> None:
    status, body = raw_http(gw.host, "/api/agents/btc/requests", "POST",
                            {"Authorization": "Bearer control-secret",
                             "Content-Type": "application/json"}, b"[" * 60_000)
    assert status == 400, body
    assert json.loads(body)["code"] == "malformed_json"


@pytest.mark.parametrize("raw", ["[" * 60_000, '{"a":' * 12_000, "[" * 100_000])
def test_a_deeply_nested_frame_is_an_error_frame_not_a_dropped_connection(
    gw: Threaded, raw: str
) -> None:
    with connect(f"{gw.live.ws}/ws/control", open_timeout=TIMEOUT,
                 additional_headers={"Authorization": "Bearer control-secret"}) as ws:
        assert recv(ws)["type"] == "hello"
        ws.send(raw)
        assert recv(ws)["code"] in {"malformed_json", "too_large"}
        ws.send(json.dumps({"type": "ping", "id": "p"}))
        assert recv(ws)["type"] == "pong"


def test_fuzzed_first_frames_before_auth_are_refused_with_1008(gw: Threaded) -> None:
    @settings(FUZZ, max_examples=30)
    @given(raw=raw_frames | st.builds(lambda t: json.dumps({"type": "auth", "token": t}),
                                      st.text(max_size=600)))
    def example(raw: str | bytes) -> None:
        with connect(f"{gw.live.ws}/ws/control", open_timeout=TIMEOUT) as ws:
            ws.send(raw)
            answer = recv(ws)
            assert answer["type"] == "error" and answer["code"] in CODES - {"internal"}, answer
            with pytest.raises(ConnectionClosed) as closed:
                recv(ws)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008

    example()


frame_shaped = st.fixed_dictionaries(
    {"type": any_json | st.sampled_from(["submit", "submit_many", "market", "subscribe",
                                         "unsubscribe", "ping", "auth"])},
    optional={key: any_json for key in ("id", "request", "requests", "events", "agents",
                                        "after", "providers", "batch", "token")})
"""A JSON object with a ``type`` of any JSON value (a list, an object, a number...) and the
frames' members holding any JSON values."""


class _Errors(logging.Handler):
    """The server's log records at ERROR and above (a traceback is one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("endpoint", ["control", "feed"])
def test_any_json_value_in_any_position_gets_a_typed_answer_on_a_live_connection(
    gw: Threaded, acked: set[str], endpoint: str
) -> None:
    """Not only mutations of valid frames: every JSON value, as a frame or in a frame's
    members (its type a list or an object, say), is answered with a typed error or taken,
    the connection stays open, and the server logs no error for it."""
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    token = "control-secret" if endpoint == "control" else "feed-secret"
    pings = iter(range(10**9))
    try:
        with contextlib.ExitStack() as stack:
            ws = open_ws(stack, gw, endpoint, token)

            @FUZZ
            @given(value=frame_shaped | any_json)
            def example(value: Any) -> None:
                ws.send(json.dumps(value))
                alive = f"alive-{next(pings)}"
                ws.send(json.dumps({"type": "ping", "id": alive}))
                answers = []
                while True:
                    answer = recv(ws)  # (a dropped connection raises here)
                    if answer["type"] in ("event", "heartbeat", "snapshot"):
                        continue
                    if answer["type"] == "pong" and answer.get("id") == alive:
                        break
                    _check_answer(answer, acked)
                    answers.append(answer)
                assert len(answers) <= 1, answers  # one answer per frame, never more

            example()
    finally:
        logging.getLogger().removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []
