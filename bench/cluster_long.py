"""Failover on a long log (issue 23, 1b): kill -9 of a member of three, under load, when the
log already holds ``--events`` events (1,000,000 by default).

The log is seeded first with the events of ``--agents`` agents (`bench.replay_speed.make_log`:
inputs and the decisions `lanes.decide` makes of them, as a gateway writes them, in bulk
imports) and one snapshot of its whole fold at its end, sealed as a gateway's snapshot worker
seals one (`gateway.runtime.snapshots.seal`). Then three members (real ``gateway serve``
processes, member lease ``--lease_ms``) serve it: the agents spread over them, each with a
simulated reasoner of a few milliseconds, half taking their slots from one shared gate.

Load, from the start to the end:

- feed: a child process sends hook triggers to every member (``--rate`` requests/s in all,
  batches of `BATCH`), so most are forwarded to their agent's owner;
- stops: every `STOP_EVERY_MS` an emergency stop (then a resume, not timed) for a random
  agent through a random live member, sent again every `RETRY_MS` (through another random
  live member) while it is answered ``unavailable``; its latency is from its first send to
  its ack.

After ``--warmup`` seconds one member is killed (SIGKILL). From then on, each agent it held
is probed (a hook trigger through a random live member, again every `RETRY_MS` while
refused): its takeover time is from the kill to the first ack. The run goes on ``--after``
seconds past the last takeover.

The target (exit 1 when missed): every agent of the dead member acked again within the lease
+ 1 s; no live member lost its lease (its log says so); every stop acked within 1 s of its
first send, except those in the lease window of their own dead owner (the stop's agent was
the dead member's, and the stop was sent before the kill + the lease and not acked before the
kill: shown on their own line).

    uv run python -m bench.cluster_long [--events N] [--agents N] [--lease_ms MS]
                                        [--rate N] [--warmup S] [--after S] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.cluster import AGENT, CONFIG_HEAD, MODES, Member, kill, leases, ready, start_member
from bench.common import Figure, machine, table
from bench.crash import CONTROL_TOKEN, FEED_TOKEN, TIMEOUT
from bench.estop_latency import now_ns, sleep_until
from bench.replay_speed import make_log, write_log
from gateway.client import (
    AckFrame,
    ConnectionLost,
    ControlClient,
    FeedClient,
    GatewayClientError,
    Unavailable,
)
from gateway.runtime.snapshots import KEEP, seal
from lanes.codec import encode
from lanes.replay import LogFold
from lanes.snapshot import dump_fold
from store import PostgresEventStore, pg_server

MEMBERS = 3
BATCH = 10
"""Requests per frame of the feed load."""
WINDOW = 4
"""Feed frames in flight per connection at most (a slower member gets fewer)."""
STOP_EVERY_MS = 100
RETRY_MS = 50
"""How soon a stop or a probe answered ``unavailable`` (or cut off) is sent again."""
FEED_TIMEOUT_S = 5.0
GIVE_UP_S = 20.0
"""A stop not acked by then counts as never acked."""
LEASE_LOST = ("the member lease was not renewed", "joining again")
RENEWAL_FAILED = "renewing the member lease failed"
HEAD = CONFIG_HEAD[:CONFIG_HEAD.index("[[hooks]]")]
"""`bench.cluster`'s config without its hook (its agents are other ones)."""


def agent_names(agents: int) -> list[str]:
    """The seeded agents (`make_log`'s names)."""
    return [f"agent{n}" for n in range(agents)]


def config_text(agents: int, lease_ms: int) -> str:
    """The members' config."""
    text = HEAD.format(lease_ms=lease_ms, feed=FEED_TOKEN, control=CONTROL_TOKEN)
    for n, agent in enumerate(agent_names(agents)):
        text += AGENT.format(id=agent, mode=MODES[n % len(MODES)], seed=n + 1,
                             provider='provider = "sim"' if n % 2 else "")
    return text


async def seed(db: str, events: int, agents: int) -> int:
    """Write ``events`` events of ``agents`` agents into the empty log at ``db``, then a
    snapshot of their fold at the end (as a gateway's snapshot worker stores one); the log's
    last position."""
    log = make_log(events, agents, prefix="seed-")
    encoded = [(e.position, e.stream, *encode(e.event)) for e in log]
    fold = LogFold()
    fold.add(log)
    del log
    store = PostgresEventStore(db)
    await store.open()
    try:
        await write_log(store, encoded)  # event ids e<position>
        snapshot = seal(fold.position, dump_fold(fold, f"e{fold.position}"),
                        int(time.time() * 1000))
        await store.save_snapshot(snapshot, KEEP)
    finally:
        await store.close()
    return fold.position


# ------------------------------------------------------------------------------ feed load

def feed(urls: list[str], agents: list[str], rate: int, start_ns: int, end_ns: int,
         lane: int) -> tuple[int, int, int, str]:
    """In a child process: hook triggers at ``rate``/s over one connection per URL from
    ``start_ns`` to ``end_ns`` (a connection whose member died moves to the next URL); the
    requests acked, those refused (unavailable, cut off, or not sent: a full window), those
    not answered within `FEED_TIMEOUT_S`, and the most frequent refusal."""
    return asyncio.run(_feed(urls, agents, rate, start_ns, end_ns, lane))


async def _feed(urls: list[str], agents: list[str], rate: int, start_ns: int, end_ns: int,
                lane: int) -> tuple[int, int, int, str]:
    counts = [0, 0, 0]
    why: Counter[str] = Counter()
    interval_ns = int(BATCH / (rate / len(urls)) * 1e9)

    async def connection(index: int) -> None:
        rng = random.Random(lane * 1000 + index)
        numbers = itertools.count()
        client: FeedClient | None = None
        flying: set[asyncio.Task[None]] = set()

        async def send(client: FeedClient, batch: list[dict[str, Any]]) -> None:
            try:
                async with asyncio.timeout(FEED_TIMEOUT_S):
                    answers = await client.submit_many(batch)
            except TimeoutError:
                counts[2] += len(batch)
                return
            except GatewayClientError as error:
                counts[1] += len(batch)
                why[repr(error)[:90]] += len(batch)
                return
            for answer in answers:
                counts[0 if isinstance(answer, AckFrame) else 1] += 1
                if not isinstance(answer, AckFrame):
                    why[str(answer)[:90]] += 1

        at = start_ns
        try:
            while at < end_ns:
                await asyncio.sleep(max(0.0, (at - now_ns()) / 1e9))  # (a turn, at least)
                at = max(at, now_ns() - interval_ns) + interval_ns  # (late: no catching up)
                if client is None or not client.connected:
                    client = await _reconnect(client, urls, index)
                    if client is None:
                        continue
                if len(flying) >= WINDOW:
                    counts[1] += BATCH
                    why["not sent: a full window"] += BATCH
                    continue
                created = datetime.now(UTC).isoformat()
                batch = [{"requestId": f"f{lane}-{index}-{n}", "createdAt": created,
                          "agentId": rng.choice(agents), "kind": "hook_trigger",
                          "dedupeKey": f"f{lane}-{index}-{n}", "payload": {"n": n}}
                         for n in itertools.islice(numbers, BATCH)]
                task = asyncio.create_task(send(client, batch))
                flying.add(task)
                task.add_done_callback(flying.discard)
        finally:
            for task in list(flying):
                task.cancel()
            await asyncio.gather(*flying, return_exceptions=True)
            if client is not None:
                await client.close()

    await asyncio.gather(*(connection(i) for i in range(len(urls))))
    return counts[0], counts[1], counts[2], why.most_common(1)[0][0] if why else ""


async def _reconnect(client: FeedClient | None, urls: list[str], index: int
                     ) -> FeedClient | None:
    """A connection to the first member (from ``index`` on) that takes one."""
    if client is not None:
        await client.close()
    for offset in range(len(urls)):
        fresh = FeedClient(urls[(index + offset) % len(urls)], FEED_TOKEN, reconnect=False,
                           retries=0)
        with contextlib.suppress(GatewayClientError, OSError):
            await fresh.connect()
            return fresh
    return None


# ---------------------------------------------------------------------------- measuring

@dataclass
class Stop:
    """One emergency stop: its agent, when it was first sent and acked (ns; None: never)."""

    agent: str
    sent: int
    acked: int | None = None
    tries: int = 0


@dataclass
class LongReport:
    """What a run saw."""

    events: int = 0
    victim_agents: list[str] = field(default_factory=list)
    takeover_s: dict[str, float] = field(default_factory=dict)
    """Per agent of the dead member: seconds from the kill to its first ack."""
    in_window: list[Stop] = field(default_factory=list)
    others: list[Stop] = field(default_factory=list)
    lease_losses: int = 0
    renewal_failures: int = 0
    feed_acked: int = 0
    feed_refused: int = 0
    feed_timed_out: int = 0
    feed_refusal: str = ""
    feed_seconds: float = 0.0
    seconds_to_ready: float = 0.0


class Controls:
    """One control connection per member, and the requests sent through them."""

    def __init__(self, members: list[Member], rng: random.Random) -> None:
        self.members = members
        self.rng = rng
        self.clients = {m.url: ControlClient(m.url, CONTROL_TOKEN, reconnect=False,
                                             retries=0) for m in members}
        self.dead: set[str] = set()
        self._ids = itertools.count()

    async def connect(self) -> None:
        for client in self.clients.values():
            await client.connect()

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()

    def request(self, agent: str, kind: str, action: str | None = None) -> dict[str, Any]:
        n = next(self._ids)
        body: dict[str, Any] = {"requestId": f"c{n}", "createdAt": datetime.now(UTC).isoformat(),
                                "agentId": agent, "kind": kind, "priority": "high",
                                "payload": {"n": n}}
        if action is not None:
            body["payload"] = {"action": action}
        else:
            body["dedupeKey"] = f"c{n}"
        return body

    async def send(self, body: dict[str, Any], deadline_ns: int) -> tuple[AckFrame | None, int]:
        """Send ``body`` through random live members until it is acked (or the deadline);
        the ack and the number of tries."""
        tries = 0
        while now_ns() < deadline_ns:
            live = [url for url in self.clients if url not in self.dead]
            url = self.rng.choice(live)
            tries += 1
            try:
                return await self.clients[url].submit(body), tries
            except (Unavailable, ConnectionLost):
                await asyncio.sleep(RETRY_MS / 1000)
        return None, tries


async def stopping(controls: Controls, agents: list[str], stops: list[Stop],
                   until: asyncio.Event) -> None:
    """An emergency stop (then a resume) every `STOP_EVERY_MS` until ``until`` is set."""
    tasks: set[asyncio.Task[None]] = set()

    async def one(agent: str) -> None:
        stop = Stop(agent, now_ns())
        stops.append(stop)
        ack, stop.tries = await controls.send(
            controls.request(agent, "user_control", "emergency_stop"),
            stop.sent + int(GIVE_UP_S * 1e9))
        if ack is not None:
            stop.acked = now_ns()
            await controls.send(controls.request(agent, "user_control", "resume"),
                                now_ns() + int(GIVE_UP_S * 1e9))

    at = now_ns()
    while not until.is_set():
        task = asyncio.create_task(one(controls.rng.choice(agents)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        at += STOP_EVERY_MS * 1_000_000
        await sleep_until(at)
    await asyncio.gather(*tasks)


async def taken_over(controls: Controls, agent: str, killed: int, deadline_ns: int) -> float:
    """Seconds from ``killed`` to the first ack of a request for ``agent`` (sent again every
    `RETRY_MS` while refused, one at a time); inf if none by ``deadline_ns``."""
    ack, _ = await controls.send(controls.request(agent, "hook_trigger"), deadline_ns)
    return (now_ns() - killed) / 1e9 if ack is not None else float("inf")


def count_lines(logs: list[Path], markers: tuple[str, ...]) -> int:
    """Lines of the members' logs that hold one of ``markers``."""
    return sum(1 for path in logs if path.exists()
               for line in path.read_text(errors="replace").splitlines()
               if any(marker in line for marker in markers))


async def spread(db: str, agents: list[str], members: int) -> None:
    """Wait until every agent is held, by ``members`` members in all."""
    deadline = time.monotonic() + TIMEOUT * 2
    while True:
        now = await leases(db)
        owners = {now.holders[a].rsplit("#", 1)[0] for a in agents if a in now.holders}
        if len(owners) == members and set(agents) <= set(now.holders):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the agents never spread over the members")
        await asyncio.sleep(0.05)  # polling a condition, with a deadline


async def long_run(workdir: Path, db: str, *, events: int, agents: int, lease_ms: int,
                   rate: int, warmup: float, after: float, seed_n: int) -> LongReport:
    """Seed, start the members, load them, kill one; what was seen."""
    report = LongReport()
    rng = random.Random(seed_n)
    names = agent_names(agents)
    report.events = await seed(db, events, agents)
    config = workdir / "long.toml"
    config.write_text(config_text(agents, lease_ms))
    running: list[Member] = []
    try:
        began = time.monotonic()
        for n in range(MEMBERS):
            running.append(await start_member(config, db, workdir / f"long{n}.log"))
        await spread(db, names, MEMBERS)
        await ready(running, TIMEOUT * 2)
        report.seconds_to_ready = time.monotonic() - began
        report = await _loaded(running, db, names, report, rng, lease_ms=lease_ms,
                               rate=rate, warmup=warmup, after=after)
    finally:
        for member in running:
            await kill(member.process)
    return report


async def _loaded(running: list[Member], db: str, names: list[str], report: LongReport,
                  rng: random.Random, *, lease_ms: int, rate: int, warmup: float,
                  after: float) -> LongReport:
    controls = Controls(running, rng)
    await controls.connect()
    stops: list[Stop] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        await loop.run_in_executor(pool, now_ns)  # the child started, this module imported
        start = now_ns() + int(0.5e9)
        end = start + int((warmup + lease_ms / 1000 + 2 + after) * 1e9)
        feeding = loop.run_in_executor(pool, partial(
            feed, [m.url for m in running], names, rate, start, end, 0))
        try:
            await sleep_until(start)
            stopper = asyncio.create_task(stopping(controls, names, stops, done))
            await sleep_until(start + int(warmup * 1e9))
            victim = rng.choice(running)
            held = sorted(a for a in (await leases(db)).held_by(victim.url) if a in names)
            controls.dead.add(victim.url)
            killed = now_ns()
            print(f"killed {victim.url} at {datetime.now(UTC).time()}", file=sys.stderr)
            await kill(victim.process)
            deadline = killed + int((lease_ms / 1000 + 10) * 1e9)
            times = await asyncio.gather(*(taken_over(controls, agent, killed, deadline)
                                           for agent in held))
            report.victim_agents, report.takeover_s = held, dict(zip(held, times, strict=True))
            await asyncio.sleep(after)
            done.set()
            await stopper
            (report.feed_acked, report.feed_refused, report.feed_timed_out,
             report.feed_refusal) = await feeding
            report.feed_seconds = (end - start) / 1e9
        finally:
            done.set()
            await controls.close()
    window_end = killed + lease_ms * 1_000_000
    for stop in stops:
        dead_owner = stop.agent in held and stop.sent < window_end and (
            stop.acked is None or stop.acked > killed)
        (report.in_window if dead_owner else report.others).append(stop)
    live = [m.log for m in running if m is not victim]
    report.lease_losses = count_lines(live, LEASE_LOST)
    report.renewal_failures = count_lines(live, (RENEWAL_FAILED,))
    return report


def _latencies(stops: list[Stop]) -> list[float]:
    return sorted((s.acked - s.sent) / 1e6 if s.acked is not None else float("inf")
                  for s in stops)


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def figures(report: LongReport, lease_ms: int) -> list[Figure]:
    """The run as figures."""
    takeovers = sorted(report.takeover_s.values())
    window, others = _latencies(report.in_window), _latencies(report.others)
    out = [
        Figure("log events before the members start (with a snapshot at the end)",
               report.events, "events"),
        Figure(f"{MEMBERS} members started, agents spread, every /readyz 200",
               report.seconds_to_ready, "s"),
        Figure("feed load acked (all members)", report.feed_acked / report.feed_seconds,
               "req/s", f"{report.feed_refused:,} refused or not sent, "
               f"{report.feed_timed_out:,} unanswered in {FEED_TIMEOUT_S:.0f} s; "
               f"most refused: {report.feed_refusal or '-'}"),
        Figure("agents of the killed member", len(report.victim_agents), "agents"),
        Figure("kill -9 -> agent acked again at its new owner, p50",
               statistics.median(takeovers) if takeovers else 0.0, "s"),
        Figure("kill -9 -> agent acked again at its new owner, max",
               takeovers[-1] if takeovers else 0.0, "s", f"<= {lease_ms / 1000 + 1:.1f} s"),
        Figure("member leases lost by live members", report.lease_losses, "", "0"),
        Figure("lease renewals that failed (live members)", report.renewal_failures, ""),
    ]
    for name, values, goal in (
            ("emergency stops, all but the dead owner's window", others, "max <= 1,000 ms"),
            ("emergency stops in their dead owner's lease window", window, "")):
        out += [Figure(f"{name}: count", len(values), "stops"),
                Figure("... p50 / p99", _quantile(values, 0.5),
                       f"/ {_quantile(values, 0.99):,.0f} ms"),
                Figure("... max", values[-1] if values else 0.0, "ms", goal)]
    return out


def missed(report: LongReport, lease_ms: int) -> list[str]:
    """What of the target was missed (empty: met)."""
    problems = []
    late = {a: t for a, t in report.takeover_s.items() if t > lease_ms / 1000 + 1}
    if late:
        problems.append(f"agents acked again later than lease + 1 s: {late}")
    if not report.victim_agents:
        problems.append("the killed member held no agent")
    if report.lease_losses:
        problems.append(f"live members lost their lease {report.lease_losses} times")
    slow = [s for s in _latencies(report.others) if s > 1000]
    if slow:
        problems.append(f"{len(slow)} stops outside their dead owner's window acked after "
                        f"more than 1 s (max {slow[-1]:,.0f} ms)")
    return problems


def measure(events: int = 1_000_000, agents: int = 50, lease_ms: int = 2_000,
            rate: int = 600, warmup: float = 3.0, after: float = 3.0, seed_n: int = 0,
            keep: Path | None = None, server: pg_server.PostgresServer | None = None
            ) -> tuple[LongReport, list[Figure]]:
    """The run on a fresh database of ``server`` (default: a throwaway server, fsync on):
    its report and figures (the members' logs and config in ``keep``, if given)."""
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        if server is None:
            server = stack.enter_context(pg_server.throwaway(durable=True))
        workdir = keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        url = server.url

        async def go() -> LongReport:
            db = await pg_server.create_database(url, f"long_{os.getpid()}_{time.time_ns()}")
            return await long_run(workdir, db, events=events, agents=agents,
                                  lease_ms=lease_ms, rate=rate, warmup=warmup,
                                  after=after, seed_n=seed_n)

        report = asyncio.run(go())
    return report, figures(report, lease_ms)


def main() -> None:
    """Run it, print the table; exit 1 if the target was missed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--lease_ms", type=int, default=2_000)
    parser.add_argument("--rate", type=int, default=600, help="feed requests/s in all")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--after", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the members' logs in this directory")
    args = parser.parse_args()
    print(f"machine: {machine()}\n")
    report, found = measure(args.events, args.agents, args.lease_ms, args.rate, args.warmup,
                            args.after, args.seed, args.keep)
    print(table(found))
    problems = missed(report, args.lease_ms)
    for problem in problems:
        print(f"MISSED: {problem}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
