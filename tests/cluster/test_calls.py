"""Sub-agent calls across the members of a cluster: a call to an agent another member owns is
forwarded there, and its answer comes back the same way to the caller's owner."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from bench.cluster import AGENTS, config_text, read_log
from bench.crash import CONTROL_TOKEN
from gateway.client import ControlClient
from gateway.cluster.member import assign
from gateway.config import parse_config
from gateway.edge.server import Running, serving
from gateway.wiring import build_service
from lanes import parse_request
from lanes.codec import decode
from lanes.events import CallEnded, CallStatus
from tests.cluster.test_members import LEASE_MS, TIMEOUT, owned
from tests.gateway.support import until

CALLER = """
[[agents]]
id = "caller"
mode = "followup"
[agents.reasoner]
latency_ms = [5, 10]
seed = 99
""" + "".join(f'[[agents.reasoner.calls]]\nagent = "{agent}"\n' for agent in AGENTS[:10])


@contextlib.asynccontextmanager
async def member(db: str) -> AsyncIterator[Running]:
    config = parse_config(config_text(LEASE_MS) + CALLER)
    async with serving(build_service(config, db), "127.0.0.1", 0) as running:
        yield running


async def test_calls_to_agents_of_another_member_come_back_to_the_caller(
    postgres_url: str,
) -> None:
    async with member(postgres_url) as one, member(postgres_url) as two:
        streams = [*AGENTS, "caller", "provider:sim"]

        async def settled() -> bool:
            ids = {m.cluster.member: m for m in (one, two) if m.cluster is not None}
            wanted = assign(streams, sorted(ids))
            return all(owned(m) == {s for s, w in wanted.items() if w == name}
                       for name, m in ids.items())

        await until(settled, "every stream owned by exactly one member", TIMEOUT)
        caller_at = one if "caller" in owned(one) else two
        elsewhere = owned(two if caller_at is one else one)
        assert elsewhere & set(AGENTS[:10])  # some calls must cross to the other member
        request = parse_request({"requestId": "go", "createdAt": datetime.now(UTC).isoformat(),
                                 "agentId": "caller", "kind": "user_control",
                                 "payload": {"message": "ask everyone"}})
        async with ControlClient(one.url, CONTROL_TOKEN, reconnect=False) as client:
            ack = await client.submit(request)
        assert ack.decision == "accepted"

        async def ended() -> Counter[CallStatus] | None:
            events = [decode(r.type, r.data) for r in await read_log(postgres_url)
                      if r.stream == "caller" and r.type == "CallEnded"]
            statuses = Counter(e.result.status for e in events if isinstance(e, CallEnded))
            return statuses if sum(statuses.values()) == 10 else None

        statuses = await until(ended, "the ten calls' results at the caller", TIMEOUT)
        assert statuses == {CallStatus.RETURNED: 10}

        async def followed_up() -> bool:
            return caller_at.service.engine.state("caller").counters.completed >= 2

        await until(followed_up, "the caller's run with the results", TIMEOUT)
