"""No accepted input may poison the log: any frame or body a client can send either gets a
typed error with nothing stored, or is stored so that `gateway verify`, `gateway replay` and
a restart all succeed on the log afterwards. Hostile JSON is written as raw text, so the
fuzzer reaches what a JSON library would never produce: lone surrogate escapes, NaN, numbers
past a double, nesting past the decoder, timestamps as numbers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from gateway.cli import main
from gateway.errors import HTTP_STATUS
from gateway.runtime.engine import Engine
from lanes.events import RequestReceived
from store import SqliteEventStore
from tests.e2e.live import TIMEOUT
from tests.security.server import AGENTS, Threaded, threaded
from tests.security.test_fuzz import any_json

EXAMPLES = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


def nested(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


# Raw JSON texts of values a client may put anywhere.
hostile = st.one_of(
    st.integers(min_value=1, max_value=260).map(nested),
    st.sampled_from(['"\\ud800"', '"x\\udfff"', '"\\udc00\\ud800"', "NaN", "Infinity",
                     "-Infinity", "1e400", "-1e400", "1e-400", str(2**64), str(-(2**70)),
                     '"\\u0000"', "null", "true", '""', "[]", "{}", "0", "-0.0", "1.5e308"]),
    *[any_json.map(json.dumps)] * 4,  # mostly plain JSON: much is stored, too
)
# Mostly valid, so that much is stored too; each hostile choice alone.
ids = st.sampled_from(['"r-{n}"'] * 6 + ['"\\ud800{n}"', '"{n}\\udfff"', "null", "1e400", '""'])
stamps = st.sampled_from(['"2026-02-17T03:10:00Z"'] * 8 + ["1e-400", "0", "1771297800",
                          '"1969-12-31T23:59:59Z"',
                          '"0001-01-01T00:00:00+14:00"', '"9999-12-31T23:59:59-14:00"',
                          '"2026-02-17T03:10:00"', "1e400", '"2026-02-17T03:10:00.5+01:00"'])
kinds = st.sampled_from(["hook_trigger", "user_control", "agent_call", "system_alert",
                         "scheduled_audit"])


@st.composite
def payload_part(draw: st.DrawFn) -> str:
    """The ``"payload": ...`` member of a request (or nothing at all)."""
    how = draw(st.sampled_from(["none", "value", "object", "action", "message", "depth"]))
    if how == "none":
        return ""
    if how == "value":
        return f',"payload":{draw(hostile)}'
    if how == "object":
        return f',"payload":{{"a":{draw(hostile)},"b":{draw(hostile)}}}'
    if how == "action":
        action = draw(st.sampled_from(['"pause"', '"cancel_order"', '"resume"', "null", '"x"'])
                      | hostile)
        return f',"payload":{{"action":{action},"orderId":{draw(hostile)}}}'
    if how == "message":
        return f',"payload":{{"message":{draw(hostile)},"action":null}}'
    return f',"payload":{{"depth":{draw(hostile)}}}'


@st.composite
def request_text(draw: st.DrawFn, n: int) -> str:
    rid = draw(ids).replace("{n}", str(n))
    dedupe = draw(st.sampled_from(["", ',"dedupeKey":"k{n}"'] * 3 + [',"dedupeKey":"\\ud800{n}"']))
    return (f'{{"requestId":{rid},"createdAt":{draw(stamps)},"agentId":"btc",'
            f'"kind":{json.dumps(draw(kinds))}{dedupe.replace("{n}", str(n))}'
            f'{draw(payload_part())}}}')


@st.composite
def frame_text(draw: st.DrawFn, n: int) -> tuple[str, str]:
    """(what, raw text): a WebSocket frame, or an HTTP body with its path."""
    what = draw(st.sampled_from(["submit", "submit_many", "subscribe", "config", "control",
                                 "http_submit"]))
    frame_id = draw(st.sampled_from(['"f{n}"'] * 4 + ['"\\ud800"', '"\\udfff{n}"'])).replace(
        "{n}", str(n))
    if what == "submit":
        return what, f'{{"type":"submit","id":{frame_id},"request":{draw(request_text(n))}}}'
    if what == "submit_many":
        many = ",".join(draw(request_text(n * 10 + i)) for i in range(3))
        return what, f'{{"type":"submit_many","id":{frame_id},"requests":[{many}]}}'
    if what == "subscribe":
        agents = draw(st.sampled_from(['["btc"]', '["btc","btc"]', '["\\ud800"]', "null",
                                       '["btc","eth","x"]']))
        return what, (f'{{"type":"subscribe","id":{frame_id},"agents":{agents},'
                      f'"after":{draw(hostile)}}}')
    if what == "config":
        key = draw(st.sampled_from(["debounceMs", "cap", "runTimeoutMs", "dedupeWindowMs",
                                    "haltOnAlerts", "mode"]))
        return what, f'{{"mode":"followup","{key}":{draw(hostile)}}}'
    if what == "control":
        action = draw(st.sampled_from(['"pause"', '"resume"']))
        request_id = draw(ids).replace("{n}", str(n))
        return what, f'{{"action":{action},"requestId":{request_id},"reason":{draw(hostile)}}}'
    return what, draw(request_text(n))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("poison") / "log.db"


@contextlib.contextmanager
def control_socket(gw: Threaded) -> Iterator[ClientConnection]:
    with connect(f"{gw.live.ws}/ws/control", open_timeout=TIMEOUT, max_size=None,
                 additional_headers={"Authorization": "Bearer admin-secret"}) as ws:
        assert json.loads(ws.recv(TIMEOUT))["type"] == "hello"
        yield ws


def test_every_frame_is_refused_typed_or_stored_readably_and_the_log_restarts(
        db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    acked: set[str] = set()
    kinds_seen: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    counter = iter(range(10**9))
    with threaded(SqliteEventStore(db)) as gw, control_socket(gw) as ws, \
            gw.http("admin-secret") as http:

        def answer_of(what: str, raw: str) -> list[dict[str, Any]]:
            if what in ("config", "control", "http_submit"):
                path = {"config": "/api/agents/btc/config", "control": "/api/agents/btc/control",
                        "http_submit": "/api/agents/btc/requests"}[what]
                response = http.post(path, content=raw.encode("utf-8", "surrogatepass"),
                                     headers={"Content-Type": "application/json"})
                assert response.status_code < 500 or response.status_code == 503, response.text
                body = response.json()
                if response.status_code >= 400:
                    assert HTTP_STATUS[body["code"]] == response.status_code, body
                return [body]
            ws.send(raw)
            ws.send(json.dumps({"type": "ping", "id": "alive"}))
            answers: list[dict[str, Any]] = []
            while True:  # every frame is answered, and the connection stays usable
                frame = json.loads(ws.recv(TIMEOUT))
                if frame["type"] == "pong" and frame.get("id") == "alive":
                    return answers
                if frame["type"] not in ("event", "events", "snapshot", "pong", "heartbeat"):
                    answers.append(frame)

        @EXAMPLES
        @given(data=st.data())
        def example(data: st.DataObject) -> None:
            what, raw = data.draw(frame_text(next(counter)))
            kinds_seen[what] += 1
            for answer in answer_of(what, raw):
                for item in [answer, *answer.get("results", [])]:
                    if item.get("type") == "error" or "code" in item:
                        assert item["code"] != "internal", item
                        errors[item["code"]] += 1
                    elif item.get("type") == "ack" and item["decision"] != "rejected":
                        acked.add(item["requestId"])

        example()
    # The gateway stopped; everything it took reads back: verify, replay and a restart.
    for argv in (["verify", str(db)], ["replay", str(db)]):
        assert main(argv) == 0, capsys.readouterr()
    capsys.readouterr()

    async def restart() -> list[str]:
        engine = Engine(SqliteEventStore(db), AGENTS)
        await engine.start()
        try:
            return [e.event.request.request_id for e in engine.reader.entries(
                await engine.store.read()) if isinstance(e.event, RequestReceived)]
        finally:
            await engine.stop()

    received = asyncio.run(restart())
    assert set(acked) <= set(received)
    with capsys.disabled():
        print(f"\nfuzzed {sum(kinds_seen.values())} inputs {dict(kinds_seen)}; "
              f"errors by code {dict(errors)}; {len(acked)} acked and stored; "
              "0 internal, 0 HTTP 500; verify, replay and restart clean")
