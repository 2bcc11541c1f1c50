"""Several gateway members on one PostgreSQL log, in this process: each a real server on its
own port with its own store (as separate processes would have), over one database."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.cluster import AGENTS, config_text, read_log
from bench.crash import CONTROL_TOKEN, FEED_TOKEN
from gateway.client import ControlClient, FeedClient
from gateway.cluster.member import assign, incarnation
from gateway.config import parse_config
from gateway.edge.server import Running, serving
from gateway.errors import NotOwner
from gateway.wiring import build_service
from lanes import parse_request
from lanes.codec import decode
from lanes.events import AbortReason, Decision, RequestReceived, RunAborted
from lanes.gate import decode_gate_event
from lanes.gate.events import SlotRequested
from store import PostgresEventStore
from tests.gateway.support import until

TIMEOUT = 20.0
LEASE_MS = 600
"""A short member lease: failovers within a second or so."""


@contextlib.asynccontextmanager
async def member(db: str, lease_ms: int = LEASE_MS) -> AsyncIterator[Running]:
    """One member serving on 127.0.0.1:<ephemeral>, stopped gracefully after."""
    config = parse_config(config_text(lease_ms))
    async with serving(build_service(config, db), "127.0.0.1", 0) as running:
        yield running


def owned(running: Running) -> set[str]:
    assert running.cluster is not None
    return set(running.cluster.owned)


async def spread(members: list[Running]) -> None:
    """Wait until every agent and the provider gate is owned by the member `assign` gives
    it, and by no other."""
    streams = [*AGENTS, "provider:sim"]

    async def settled() -> bool:
        ids = {m.cluster.member: m for m in members if m.cluster is not None}
        wanted = assign(streams, sorted(ids))
        return all(owned(m) == {s for s, w in wanted.items() if w == member}
                   for member, m in ids.items())

    await until(settled, "every stream owned by exactly one member", TIMEOUT)


def request(n: int, agent: str, **extra: Any) -> dict[str, Any]:
    return {"requestId": f"t{n}", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": agent, "kind": "hook_trigger", "dedupeKey": f"k{n}", **extra}


def test_assign_is_the_same_everywhere_and_moves_only_what_it_must() -> None:
    streams = [f"s{n}" for n in range(200)]
    before = assign(streams, ["m1", "m2", "m3"])
    assert before == assign(streams, ["m3", "m1", "m2"])  # the order of members is nothing
    counts = {m: list(before.values()).count(m) for m in ("m1", "m2", "m3")}
    assert min(counts.values()) > 40, counts  # spread, roughly evenly
    after = assign(streams, ["m1", "m2", "m3", "m4"])
    moved = [s for s in streams if before[s] != after[s]]
    assert all(after[s] == "m4" for s in moved)  # only to the newcomer
    gone = assign(streams, ["m1", "m3"])
    assert all(gone[s] == before[s] for s in streams if before[s] != "m2")


@given(st.sets(st.text(min_size=1, max_size=8), min_size=1, max_size=6),
       st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=30))
def test_assign_gives_every_resource_one_of_the_members(members: set[str],
                                                        resources: list[str]) -> None:
    found = assign(resources, sorted(members))
    assert set(found) == set(resources) and set(found.values()) <= members


async def test_two_members_share_the_agents_and_forward_what_the_other_owns(
    postgres_url: str,
) -> None:
    async with member(postgres_url) as one, member(postgres_url) as two:
        await spread([one, two])
        assert owned(one) and owned(two)
        # Every request through the first member, whoever owns the agent: all accepted once.
        async with ControlClient(one.url, CONTROL_TOKEN, reconnect=False) as client:
            acks = await client.submit_many([request(n, agent)
                                             for n, agent in enumerate(AGENTS)])
        assert {a.decision for a in acks} == {"accepted"}, acks  # type: ignore[union-attr]
        records = await read_log(postgres_url)
        received = [decode(r.type, r.data) for r in records if r.type == "RequestReceived"]
        ids = [e.request.request_id for e in received if isinstance(e, RequestReceived)]
        assert sorted(ids) == sorted(f"t{n}" for n in range(len(AGENTS)))
        by_position = {r.position: r for r in records}
        for ack in acks:
            assert by_position[ack.position].stream in AGENTS  # type: ignore[union-attr]
        # Each agent's events are written by its owner alone (its member id's prefix).
        assert one.cluster is not None and two.cluster is not None
        prefixes = {incarnation(one.cluster.member): owned(one),
                    incarnation(two.cluster.member): owned(two)}
        for record in records:
            if record.stream in AGENTS and record.type == "RequestQueued":
                writer = next(p for p in prefixes if record.event_id.startswith(p))
                assert record.stream in prefixes[writer]
        # A control's ack says what it did, passed on from the owner as it answered.
        async with ControlClient(one.url, CONTROL_TOKEN, reconnect=False) as client:
            resume = await client.submit({
                "requestId": "resume-1", "createdAt": datetime.now(UTC).isoformat(),
                "agentId": sorted(owned(two))[0], "kind": "user_control",
                "payload": {"action": "resume"}})
        assert resume.effect is not None and resume.effect.changed is False, resume


async def test_an_operator_call_for_an_agent_owned_elsewhere_is_made_at_its_owner(
    postgres_url: str,
) -> None:
    async with member(postgres_url) as one, member(postgres_url) as two:
        await spread([one, two])
        theirs = sorted(owned(two))[0]
        headers = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
        async with httpx2.AsyncClient(base_url=one.url, headers=headers,
                                     timeout=TIMEOUT) as http:
            stop = await http.post(f"/api/agents/{theirs}/control",
                                   json={"action": "emergency_stop", "requestId": "stop-1"})
            assert stop.status_code == 200, stop.text
            assert stop.json()["decision"] == "accepted"
            served = (await http.get(f"/api/agents/{theirs}")).json()["servedBy"]
            assert served == two.url  # any member says where an agent is served
            health = (await http.get("/healthz")).json()
            assert one.cluster is not None
            assert health["cluster"] == {"member": one.cluster.member,
                                         "owns": len(owned(one)), "members": 2}
            ready = await http.get("/readyz")  # its agents loaded, its replicas following
            assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
            metrics = (await http.get("/metrics")).text
            assert f"gateway_cluster_owned_streams {len(owned(one))}" in metrics
            asked: list[str] = []  # what this member's own engine is asked to operate
            engine, operate = one.service.engine, one.service.engine.operate

            async def recorded(agent_id: str, *args: Any) -> list[Decision]:
                asked.append(agent_id)
                return await operate(agent_id, *args)
            engine.operate = recorded  # type: ignore[method-assign,assignment]
            cleared = await http.post(f"/api/agents/{theirs}/queue/clear")
            assert cleared.status_code == 200, cleared.text
            assert cleared.json()["applied"] is True
            assert asked == []  # split by owner before this member's engine was asked
            # Both members read the agent as HALTED (the owner live, the other its replica).
            for running in (one, two):
                async def halted(running: Running = running) -> bool:
                    body = (await http.get(f"{running.url}/api/agents/{theirs}")).json()
                    return bool(body["trading"] == "HALTED")

                await until(halted, f"{theirs} HALTED at {running.url}")


async def test_a_member_sent_a_request_for_an_agent_it_does_not_own_says_it_moved(
    postgres_url: str,
) -> None:
    # (what a member answers a forward from one whose view of the leases is behind: the
    # asker sends it on, `tests/cluster/test_forwards.py`)
    async with member(postgres_url) as one, member(postgres_url) as two:
        await spread([one, two])
        theirs = sorted(owned(two) & set(AGENTS))[0]
        assert one.cluster is not None
        [answer] = await one.cluster.router.peers.submit_many(
            one.url, [parse_request(request(1, theirs))], None)
        # (typed, not an error frame: where to, if its view of the leases says; a view read
        # before it handed the agent over says nobody, and the asker reads the leases)
        assert isinstance(answer, NotOwner) and answer.owner in (None, two.url), answer
    records = await read_log(postgres_url)
    assert not [r for r in records if r.type == "RequestReceived"]


@pytest.mark.slow
async def test_a_member_that_stops_hands_its_agents_over_at_once(postgres_url: str) -> None:
    async with member(postgres_url, lease_ms=60_000) as one:
        async with member(postgres_url, lease_ms=60_000) as two:
            await spread([one, two])
            handed = owned(two)
            async with ControlClient(two.url, CONTROL_TOKEN, reconnect=False) as client:
                await client.submit_many([request(n, a) for n, a in enumerate(AGENTS)])
        # Its stop gave the leases back, and woke the other member: taken at once, not
        # after the lease of a minute (nor at the next renewal, a fifth of it).
        loop = asyncio.get_running_loop()
        began = loop.time()
        await until(lambda: _holds(one, handed), "the other member took them over", TIMEOUT)
        assert loop.time() - began < 60_000 / 1000 / 5
    # Handed over gracefully: a run in flight was recorded aborted (shutdown), never left
    # to be found cut off (restart) by the next owner.
    events = [(r.stream, decode(r.type, r.data)) for r in await read_log(postgres_url)
              if r.stream in AGENTS]
    assert not [e for _, e in events
                if isinstance(e, RunAborted) and e.reason is AbortReason.RESTART]


async def _holds(running: Running, streams: set[str]) -> bool:
    return streams <= owned(running)


async def test_a_member_whose_lease_expired_writes_nothing_more_and_its_agents_move(
    postgres_url: str,
) -> None:
    # (a lease of 2 s: the live member's must not run out on a starved machine meanwhile;
    # the paused one's is ended by hand)
    async with member(postgres_url, 2_000) as one, member(postgres_url, 2_000) as two:
        await spread([one, two])
        assert two.cluster is not None and two.cluster._renewer is not None
        lost = owned(two)
        old = two.cluster.member
        # As if its process had been paused: its renewals stop (and its own watchdog, which
        # would stop its agents before the lease runs out), its lease runs out.
        for task in (two.cluster._renewer, two.cluster._balancer):
            assert task is not None
            task.cancel()
        if two.cluster._watchdog is not None:
            two.cluster._watchdog.cancel()
        engine = two.service.engine
        store = engine.store
        assert isinstance(store, PostgresEventStore)
        async with ControlClient(one.url, CONTROL_TOKEN, reconnect=False) as client:
            await client.submit_many([request(n, a) for n, a in enumerate(AGENTS)])
        await engine.flush()
        await store.renew(old, 0)
        await until(lambda: _holds(one, lost), "the live member took everything over",
                    TIMEOUT)
        expired = await store.last_position()
        # The paused member still believes it owns the agent: what it decides is refused
        # by the database (its fence), typed as a request to send elsewhere, and it stops
        # the agent. (A run of its own that ended meanwhile was refused so already, and
        # stopped its agent: the agent is one it still believes it owns.)
        believed = sorted(a for a in lost if a in AGENTS and a in engine.loaded)
        if believed:
            agent = believed[0]
            with pytest.raises(NotOwner):
                await engine.submit(parse_request(request(99, agent)))
            assert agent not in engine.loaded
        else:  # (every one of them had a run end meanwhile: its refused write stopped it,
            # as the log's warnings say; seen once in a full run)
            assert not {a for a in lost if a in AGENTS} & set(engine.loaded)
        # The live member serves every agent the other one had.
        async with ControlClient(one.url, CONTROL_TOKEN, reconnect=False) as client:
            acks = await client.submit_many([request(100 + n, a)
                                             for n, a in enumerate(sorted(lost & set(AGENTS)))])
        assert {a.decision for a in acks} == {"accepted"}, acks  # type: ignore[union-attr]
    records = await read_log(postgres_url)
    assert "t99" not in {decode(r.type, r.data).request.request_id  # type: ignore[union-attr]
                         for r in records if r.type == RequestReceived.__name__}
    # Nothing of the old member after its lease expired and the other took over.
    prefix = incarnation(old)
    assert [r for r in records if r.event_id.startswith(prefix)], "it wrote before"
    assert not [r for r in records if r.position > expired and r.event_id.startswith(prefix)]


async def test_the_shared_provider_gate_serves_runs_of_every_member(postgres_url: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        members = [await stack.enter_async_context(member(postgres_url)) for _ in range(2)]
        gated = [a for n, a in enumerate(AGENTS) if n % 2]  # the config: odd ones use "sim"
        while True:  # (members' ids are random: all six may land with the gate, 1 in 64)
            await spread(members)
            holder = next(m for m in members if "provider:sim" in owned(m))
            remote = [a for a in gated if a not in owned(holder)]
            if remote or len(members) == 4:
                break
            members.append(await stack.enter_async_context(member(postgres_url)))
        assert remote, "some gated agents live on a member without the gate"
        async with FeedClient(holder.url, FEED_TOKEN, reconnect=False) as feed:
            acks = await feed.submit_many([request(200 + n, a) for n, a in enumerate(gated)])
        assert {a.decision for a in acks} == {"accepted"}, acks  # type: ignore[union-attr]

        async def every_run_ended() -> bool:
            states = [next(m for m in members if a in owned(m)).service.engine.state(a)
                      for a in gated]
            return all(s.counters.runs >= 1 and s.active is None for s in states)

        await until(every_run_ended, "every gated agent ran (collect mode waits 2 s)", TIMEOUT)
    records = await read_log(postgres_url)
    asked = {event.agent_id for event in (decode_gate_event(r.type, r.data) for r in records
                                          if r.stream == "provider:sim")
             if isinstance(event, SlotRequested)}
    assert set(remote) <= asked  # the runs of the other member took slots of this gate


async def test_a_member_with_another_secret_is_refused_and_the_error_says_why(
    postgres_url: str,
) -> None:
    from gateway.cluster.peers import Peers

    async with member(postgres_url) as one:
        wrong = Peers("not-the-cluster-secret")
        try:
            answers = await wrong.submit_many(one.url, [parse_request(request(1, "a00"))], None)
        finally:
            await wrong.close()
        assert len(answers) == 1 and isinstance(answers[0], Exception)
        assert "same [cluster] secret" in str(answers[0])
    received = [decode(r.type, r.data) for r in await read_log(postgres_url)
                if r.type == RequestReceived.__name__]
    assert not [e for e in received if isinstance(e, RequestReceived)
                and e.request.request_id == "t1"]  # nothing was taken


async def test_reads_from_a_replica_that_fell_behind_say_so_until_it_follows_again(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with member(postgres_url) as one, member(postgres_url) as two:
        await spread([one, two])
        assert one.cluster is not None
        replicas = one.cluster.replicas
        theirs, mine = sorted(owned(two))[0], sorted(owned(one))[0]
        assert replicas.behind_reason() is None

        def broken(record: Any) -> None:
            raise RuntimeError("the replica cannot fold this")

        monkeypatch.setattr(replicas, "_replicate", broken)
        async with ControlClient(two.url, CONTROL_TOKEN, reconnect=False) as client:
            ack = await client.submit(request(900, theirs))  # (one's follower fails on it)

        async def behind() -> bool:
            return replicas.behind_reason() is not None

        await until(behind, "the replica follower to fail")
        reason = replicas.behind_reason()
        assert reason is not None and "cannot fold" in reason
        headers = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
        async with httpx2.AsyncClient(base_url=one.url, headers=headers,
                                     timeout=TIMEOUT) as http:
            agent = (await http.get(f"/api/agents/{theirs}")).json()
            assert agent["behind"]["reason"] == reason and agent["behind"]["since"] > 0
            assert "behind" in (await http.get(f"/api/agents/{theirs}/queue")).json()
            listed = {a["agentId"]: a for a in (await http.get("/api/agents")).json()}
            assert "behind" in listed[theirs] and "behind" not in listed[mine]  # (its own)
            async with (ControlClient(one.url, CONTROL_TOKEN, reconnect=False) as client,
                        client.subscribe([theirs, mine]) as subscription):
                snapshot = await subscription.start()
            shown = {a["agentId"]: a for a in snapshot.agents}
            assert shown[theirs]["behind"]["reason"] == reason and "behind" not in shown[mine]
            monkeypatch.undo()  # the follower, started again, follows the log again

            async def following() -> bool:
                return replicas.behind_reason() is None

            await until(following, "the replica follower to follow the log again")
            assert "behind" not in (await http.get(f"/api/agents/{theirs}")).json()
            assert replicas.position >= ack.position
