"""Several gateway processes on one PostgreSQL log: crash proof, a paused member, failover
time and throughput.

Every member is a real ``python -m gateway.cli serve --db postgresql://...`` process (a
config in a scratch directory: twelve agents with simulated reasoners of a few milliseconds,
half of them taking their slots from one shared simulated provider gate, a ``price_cross``
hook, a feed and a control token, port 0, a member lease of ``lease_ms``).

- `crash_run`: three members under feed and control load (clients on random members, so
  requests are forwarded to their agents' owners); one member, picked by a seeded random,
  gets SIGKILL after 100-600 ms of load, then starts again; ``kills`` times. Each time the
  leases are watched until every stream the dead member held is held by a live one
  (failover time). At the end every member stops gracefully and the log must hold every
  acknowledged request once, with its decision at its position, no agent with two runs at
  once, every run ended, and ``gateway verify`` clean.
- `pause_run`: a member is SIGSTOPped until the others took all its streams over, load goes
  on, then SIGCONT: not one event it writes may land after the takeover (its event ids
  carry its member id's random part, `gateway.cluster.member.incarnation`).
- `throughput`: durable requests/s through 1, 2 and 4 members, against one process on
  SQLite, in the same run.

    uv run python -m bench.cluster [--seconds S] [--kills N] [--seed N] [--lease_ms MS]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx2

from bench.common import Figure, run
from bench.crash import (
    CONTROL_TOKEN,
    FEED_TOKEN,
    ROOT,
    SEEDED,
    TIMEOUT,
    Ledger,
    Load,
    Report,
    check,
    start,
)
from bench.replay_speed import make_log, write_log
from gateway.client import ConnectionLost, ControlClient, FeedClient, GatewayClientError
from lanes import Entry
from lanes.codec import decode, encode
from lanes.events import (
    AbortReason,
    RunAborted,
    RunCompleted,
    RunFailed,
    RunStarted,
)
from lanes.streams import is_agent_stream
from store import MEMBER_PREFIX, PostgresEventStore, RecordedEvent, pg_server

AGENTS = tuple(f"a{n:02d}" for n in range(12))
CONFIG_HEAD = """
[server]
host = "127.0.0.1"
port = 0

[cluster]
lease_ms = {lease_ms}

[[tokens]]
name = "feed"
token = "{feed}"
role = "feed"

[[tokens]]
name = "ops"
token = "{control}"
role = "control"

[[providers]]
name = "sim"
kind = "simulated"

[providers.limits]
requests_per_minute = 100000
max_concurrent = 4
lease_ms = 600000

[[hooks]]
kind = "price_cross"
name = "btc_100"
symbol = "BTCUSD"
level = 100.0
direction = "both"
agents = ["a00", "a05", "a07"]
"""
AGENT = """
[[agents]]
id = "{id}"
mode = "{mode}"
cap = 20
[agents.reasoner]
latency_ms = [5, 40]
seed = {seed}
{provider}
"""
MODES = ("followup", "collect", "steer-backlog", "queue")


def config_text(lease_ms: int) -> str:
    """The members' config."""
    text = CONFIG_HEAD.format(lease_ms=lease_ms, feed=FEED_TOKEN, control=CONTROL_TOKEN)
    for n, agent in enumerate(AGENTS):
        text += AGENT.format(id=agent, mode=MODES[n % len(MODES)], seed=n + 1,
                             provider='provider = "sim"' if n % 2 else "")
    return text


@dataclass
class Member:
    """One gateway process of the cluster."""

    process: asyncio.subprocess.Process
    url: str
    log: Path

    @property
    def alive(self) -> bool:
        """Still running."""
        return self.process.returncode is None


async def start_member(config: Path, db: str, log: Path) -> Member:
    """Spawn a member; return it once ``/healthz`` answers 200."""
    process, url = await start(config, db, log)
    return Member(process, url, log)


async def kill(process: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` (if still running) and reap."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
    await asyncio.wait_for(process.wait(), TIMEOUT)


@dataclass(frozen=True)
class Leases:
    """The leases as the database has them now: live members, and each stream's holder."""

    members: set[str]
    holders: dict[str, str]

    def held_by(self, url: str) -> set[str]:
        """The streams a member serving at ``url`` holds."""
        return {s for s, owner in self.holders.items() if owner.rsplit("#", 1)[0] == url}


async def leases(db: str) -> Leases:
    """Read the leases table (with the database's clock)."""
    conn = await asyncpg.connect(db)
    try:
        rows = await conn.fetch(
            "SELECT resource, owner, expires_at, "
            "(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now FROM leases")
    finally:
        await conn.close()
    members = {r["resource"][len(MEMBER_PREFIX):] for r in rows
               if r["resource"].startswith(MEMBER_PREFIX) and r["expires_at"] > r["now"]}
    holders = {r["resource"]: r["owner"] for r in rows
               if not r["resource"].startswith(MEMBER_PREFIX) and r["owner"] in members}
    return Leases(members, holders)


async def until_held(db: str, streams: set[str], gone: str, deadline_s: float) -> float:
    """Wait until each of ``streams`` is held by a live member not serving at ``gone``;
    the seconds it took (polled every 10 ms, with a deadline)."""
    began = time.monotonic()
    while True:
        now = await leases(db)
        if all(s in now.holders and now.holders[s].rsplit("#", 1)[0] != gone
               for s in streams):
            return time.monotonic() - began
        if time.monotonic() - began > deadline_s:
            raise TimeoutError(f"not taken over in {deadline_s} s: {sorted(streams)}")
        await asyncio.sleep(0.01)  # polling a condition, with a deadline


async def read_log(db: str) -> list[RecordedEvent]:
    """Every event of the log (records)."""
    store = PostgresEventStore(db)
    await store.open()
    try:
        return await store.read()
    finally:
        await store.close()


@dataclass
class ClusterReport(Report):
    """A crash run of a cluster: `Report` and the failover times, runs and writes seen."""

    failover_s: list[float] = field(default_factory=list)
    adopted_s: list[float] = field(default_factory=list)
    """Seconds from a kill until the live members answer ``/readyz`` 200 (every stream of
    the dead member owned and loaded again)."""
    lease_losses: int = 0
    """Times a member that was alive lost its own lease (its log says so)."""
    restart_aborts: int = 0
    runs: int = 0
    late_writes: int = 0

    def lines(self) -> list[str]:
        failover = sorted(self.failover_s)
        return [
            *super().lines(),
            f"runs started              {self.runs}",
            f"aborted (restart), rerun  {self.restart_aborts}",
            f"failover p50 / max        {statistics.median(failover):.2f} / "
            f"{max(failover):.2f} s" if failover else "failover                  -",
            f"adopted p50 / max         {statistics.median(self.adopted_s):.2f} / "
            f"{max(self.adopted_s):.2f} s" if self.adopted_s else "",
            f"member leases lost        {self.lease_losses}",
            f"writes after a takeover   {self.late_writes}",
        ]


def check_runs(entries: list[Entry], report: ClusterReport) -> None:
    """No agent ever had two runs at once, and every run ended (the members stopped
    gracefully)."""
    active: dict[str, str] = {}
    for entry in entries:
        event = entry.event
        if isinstance(event, RunStarted):
            report.runs += 1
            if entry.stream in active:
                report.problems.append(f"{entry.stream}: {event.run_id} started at "
                                       f"{entry.position} while {active[entry.stream]} ran")
            active[entry.stream] = event.run_id
        elif isinstance(event, RunCompleted | RunFailed | RunAborted):
            if active.get(entry.stream) == event.run_id:
                del active[entry.stream]
            if isinstance(event, RunAborted) and event.reason is AbortReason.RESTART:
                report.restart_aborts += 1
                if not event.requeued:
                    report.problems.append(f"{event.run_id} aborted (restart) not requeued")
    if active:
        report.problems.append(f"runs never ended: {active}")


async def _load_round(members: list[Member], load: Load, seconds: float,
                      rng: random.Random) -> None:
    """Feed and control load on random live members for ``seconds``."""
    live = [m for m in members if m.alive]
    control = ControlClient(rng.choice(live).url, CONTROL_TOKEN, reconnect=False)
    feed = FeedClient(rng.choice(live).url, FEED_TOKEN, reconnect=False)
    tasks: list[asyncio.Task[None]] = []
    try:
        await control.connect()
        await feed.connect()
        tasks = [asyncio.create_task(load.control(control)),
                 asyncio.create_task(load.feed(feed))]
        done, _ = await asyncio.wait(tasks, timeout=seconds)
        for task in done:
            task.result()
            raise RuntimeError("a load task ended early")
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionLost,
                                     GatewayClientError):
                await task
        await control.close()
        await feed.close()


def _run_of(workdir: Path, lease_ms: int, seed: int
            ) -> tuple[Path, ClusterReport, Ledger, Load, random.Random]:
    """A run's config file (in ``workdir``), report, ledger, load and seeded random."""
    config = workdir / "cluster.toml"
    config.write_text(config_text(lease_ms))
    rng = random.Random(seed)
    report = ClusterReport()
    ledger = Ledger(report)
    return config, report, ledger, Load(ledger, rng, AGENTS), rng


async def _start_members(running: list[Member], members: int, config: Path, db: str,
                         workdir: Path) -> None:
    """Start ``members`` members into ``running`` (the caller kills them all after)."""
    for n in range(members):
        running.append(await start_member(config, db, workdir / f"member{n}.log"))


async def ready(members: list[Member], deadline_s: float) -> None:
    """Wait until every live member answers ``/readyz`` 200 (polled, with a deadline)."""
    began = time.monotonic()
    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        for member in members:
            while member.alive:
                with contextlib.suppress(httpx2.HTTPError):
                    if (await http.get(f"{member.url}/readyz")).status_code in (200, 404):
                        break
                if time.monotonic() - began > deadline_s:
                    raise TimeoutError(f"{member.url} not ready in {deadline_s} s")
                await asyncio.sleep(0.01)  # polling a condition, with a deadline


async def seed_log(db: str, events: int) -> None:
    """Begin the log with ``events`` events of the cluster's agents (`make_log`'s, request
    ids ``seed-N``), written in bulk."""
    encoded = [(e.position, e.stream, *encode(e.event))
               for e in make_log(events, names=AGENTS, prefix=SEEDED)]
    store = PostgresEventStore(db)
    await store.open()
    try:
        await write_log(store, encoded)
    finally:
        await store.close()


def lease_losses(logs: list[Path]) -> int:
    """Lines of the members' logs that say a member lost its own lease (a killed one says
    nothing more)."""
    markers = ("the member lease was not renewed", "joining again")
    return sum(1 for path in logs if path.exists()
               for line in path.read_text(errors="replace").splitlines()
               if any(marker in line for marker in markers))


async def crash_run(workdir: Path, db: str, *, members: int = 3, kills: int = 10,
                    seed: int = 0, min_load_ms: int = 100, max_load_ms: int = 600,
                    lease_ms: int = 1_000, log_events: int = 0) -> ClusterReport:
    """Kill a member ``kills`` times under load and start it again; check the log (which
    begins with ``log_events`` events of the agents: `seed_log`)."""
    config, report, ledger, load, rng = _run_of(workdir, lease_ms, seed)
    running: list[Member] = []
    if log_events:
        await seed_log(db, log_events)
    try:
        await _start_members(running, members, config, db, workdir)
        for _ in range(kills):
            victim = rng.randrange(members)
            loading = asyncio.create_task(_load_round(
                running, load, rng.uniform(min_load_ms, max_load_ms) / 1000 + 0.5, rng))
            await asyncio.sleep(rng.uniform(min_load_ms, max_load_ms) / 1000)  # the kill's moment
            held = (await leases(db)).held_by(running[victim].url)
            await kill(running[victim].process)
            report.kills += 1
            killed = time.monotonic()
            report.failover_s.append(await until_held(db, held, running[victim].url,
                                                      lease_ms / 1000 * 5 + 10))
            await ready([m for m in running if m is not running[victim]],
                        lease_ms / 1000 * 5 + 10)
            report.adopted_s.append(time.monotonic() - killed)
            with contextlib.suppress(ConnectionLost, GatewayClientError):
                await loading
            running[victim] = await start_member(config, db, running[victim].log)
        await stop_all(running, report)
    finally:
        for member in running:
            await kill(member.process)
    report.lease_losses = lease_losses([m.log for m in running])
    await check_log(db, ledger, report)
    return report


async def stop_all(members: list[Member], report: ClusterReport) -> None:
    """SIGTERM each member in turn, waiting for it to exit (graceful: runs recorded aborted,
    ``shutdown``, leases given up); an exit other than 0 is a problem (70: its stop outlasted
    ``shutdown_timeout_s``, what it held left to a member that may not come)."""
    for member in members:
        await kill(member.process, signal.SIGTERM)
        if member.process.returncode != 0:
            report.problems.append(f"a member's graceful stop exited "
                                   f"{member.process.returncode}")


async def check_log(db: str, ledger: Ledger, report: ClusterReport) -> list[RecordedEvent]:
    """After the members stopped: every acknowledged request in the log once with its
    decision (`bench.crash.check`; the cut-off runs are those aborted with reason
    ``restart``), no agent with two runs at once and every run ended (`check_runs`),
    ``gateway verify`` clean. The log's records."""
    records = await read_log(db)
    entries = [Entry(r.position, r.stream, decode(r.type, r.data))
               for r in records if is_agent_stream(r.stream)]
    restarts = {e.event.run_id for e in entries if isinstance(e.event, RunAborted)
                and e.event.reason is AbortReason.RESTART and e.event.requeued}
    check(entries, ledger, restarts, report)
    check_runs(entries, report)
    report.verify_exit = await _verify(db)
    if report.verify_exit != 0:
        report.problems.append(f"gateway verify exited {report.verify_exit}")
    return records


async def _verify(db: str) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "verify", db, cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    return await asyncio.wait_for(process.wait(), TIMEOUT * 4)


async def pause_run(workdir: Path, db: str, *, lease_ms: int = 1_000,
                    seed: int = 0) -> ClusterReport:
    """SIGSTOP a member past its lease, let the others take over under load, SIGCONT it:
    not one event of it may land after the takeover."""
    config, report, ledger, load, rng = _run_of(workdir, lease_ms, seed)
    running: list[Member] = []
    try:
        await _start_members(running, 3, config, db, workdir)
        victim, others = running[0], running[1:]
        await _load_round(running, load, 1.0, rng)  # its agents have runs and events
        before = await leases(db)
        incarnation = next(m for m in before.members
                           if m.rsplit("#", 1)[0] == victim.url).rsplit("#", 1)[1]
        held = before.held_by(victim.url)
        victim.process.send_signal(signal.SIGSTOP)
        try:
            loading = asyncio.create_task(_load_round(others, load, lease_ms / 1000 * 4, rng))
            report.failover_s.append(await until_held(db, held, victim.url,
                                                      lease_ms / 1000 * 5 + 10))
            taken_over = max(r.position for r in await read_log(db))
            await loading
        finally:
            victim.process.send_signal(signal.SIGCONT)
        await _load_round(running, load, lease_ms / 1000 * 2, rng)  # it rejoins meanwhile
        await stop_all(running, report)
    finally:
        for member in running:
            if member.process.returncode is None:
                member.process.send_signal(signal.SIGCONT)
            await kill(member.process)
    records = await check_log(db, ledger, report)
    late = [r for r in records if r.position > taken_over
            and r.event_id.startswith(incarnation)]
    report.late_writes = len(late)
    if late:
        report.problems.append(f"{len(late)} events of the paused member after the "
                               f"takeover, first {late[0]}")
    return report


# ------------------------------------------------------------------------- throughput

THROUGHPUT_AGENT = """
[[agents]]
id = "{id}"
mode = "queue"
cap = 100000
[agents.reasoner]
latency_ms = [600000, 600000]
"""
LOADERS = 2
"""Load processes (each with a connection to every member)."""
WINDOW = 4
"""Frames in flight per connection."""


def throughput_config(lease_ms: int) -> str:
    """Members whose agents queue everything (one run each that never ends): every request
    is two events and an ack, the durable path alone."""
    text = CONFIG_HEAD.format(lease_ms=lease_ms, feed=FEED_TOKEN, control=CONTROL_TOKEN)
    return text + "".join(THROUGHPUT_AGENT.format(id=a) for a in AGENTS)


def saturate(urls: list[str], seconds: float, start_ns: int, lane: int) -> tuple[int, int]:
    """In a child process: ``submit_many`` frames of `BATCH` requests over one feed
    connection to each of ``urls``, `WINDOW` in flight each, from ``start_ns`` for
    ``seconds``; the requests acknowledged in the middle 80 % of the time, and that time
    (ns)."""
    return asyncio.run(_saturate(urls, seconds, start_ns, lane))


async def _saturate(urls: list[str], seconds: float, start_ns: int, lane: int
                    ) -> tuple[int, int]:
    from websockets.asyncio.client import connect

    from bench.estop_latency import now_ns, sleep_until
    from bench.ws_ingest import BATCH, request_json

    begin = start_ns + int(seconds * 0.1e9)
    end = start_ns + int(seconds * 0.9e9)
    counted = [0]

    async def connection(index: int, url: str) -> None:
        headers = {"Authorization": f"Bearer {FEED_TOKEN}"}
        ws_url = url.replace("http", "ws", 1) + "/ws/feed"
        async with connect(ws_url, additional_headers=headers, compression=None,
                           max_size=16 << 20) as ws:
            assert json.loads(await ws.recv())["type"] == "hello"
            await sleep_until(start_ns)
            frame = 0

            async def send() -> None:
                nonlocal frame
                tag = f"l{lane}c{index}f{frame}-"
                items = ",".join(request_json(tag, n, AGENTS[(frame + n) % len(AGENTS)])
                                 for n in range(BATCH))
                frame += 1
                await ws.send(f'{{"type":"submit_many","id":"{tag}",'
                              f'"requests":[{items}]}}')

            for _ in range(WINDOW):
                await send()
            async for raw in ws:
                answer = json.loads(raw)
                now = now_ns()
                if answer["type"] == "acks" and begin <= now <= end:
                    counted[0] += sum(r.get("type") == "ack" for r in answer["results"])
                if now >= start_ns + int(seconds * 1e9):
                    return
                if answer["type"] == "busy":
                    await asyncio.sleep(answer["retryAfterMs"] / 1000)
                await send()

    await asyncio.gather(*(connection(i, url) for i, url in enumerate(urls)))
    return counted[0], end - begin


async def measure_throughput(workdir: Path, db: str, members: int, seconds: float,
                             lease_ms: int = 5_000) -> float:
    """Durable requests/s through ``members`` processes on the log at ``db`` (a SQLite file
    for one process, or a PostgreSQL URL)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    from bench.estop_latency import now_ns

    config = workdir / f"throughput-{members}.toml"
    config.write_text(throughput_config(lease_ms))
    running: list[Member] = []
    try:
        for n in range(members):
            running.append(await start_member(config, db, workdir / f"tp{n}.log"))
        if members > 1:  # every member has its share before the load begins
            wanted = set(AGENTS)
            deadline = time.monotonic() + TIMEOUT
            while True:
                now = await leases(db)
                owners = {owner.rsplit("#", 1)[0] for a, owner in now.holders.items()
                          if a in wanted}
                if len(owners) == members and wanted <= set(now.holders):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the agents never spread over the members")
                await asyncio.sleep(0.05)  # polling a condition, with a deadline
        urls = [m.url for m in running]
        start = now_ns() + int(2e9)
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(LOADERS, mp_context=multiprocessing.get_context("spawn")
                                 ) as pool:
            results = await asyncio.gather(*(loop.run_in_executor(
                pool, partial(saturate, urls, seconds, start, lane))
                for lane in range(LOADERS)))
        acked = sum(count for count, _ in results)
        spans = [span for _, span in results]
        return acked / (max(spans) / 1e9)
    finally:
        for member in running:
            await kill(member.process, signal.SIGTERM)
        for member in running:
            await kill(member.process)


async def _fresh_database(server_url: str, name: str) -> str:
    await pg_server.create_database(server_url, name)
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def measure(seconds: int = 10, kills: int = 10, seed: int = 0, lease_ms: int = 1_000
            ) -> list[Figure]:
    """Durable requests/s through 1, 2 and 4 members on PostgreSQL (fsync on) and one
    process on SQLite, in one run; then the crash run (failover times) and the pause run."""
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as scratch, \
            pg_server.throwaway(durable=True) as server:
        workdir = Path(scratch)

        async def all_of_it() -> tuple[dict[str, float], ClusterReport, ClusterReport]:
            rates = {"SQLite, 1 process": await measure_throughput(
                workdir, str(workdir / "throughput.db"), 1, seconds)}
            for members in (1, 2, 4):
                db = await _fresh_database(server.url, f"throughput{members}")
                rates[f"PostgreSQL, {members} member(s)"] = await measure_throughput(
                    workdir, db, members, seconds)
            crash = await crash_run(workdir, await _fresh_database(server.url, "crash"),
                                    kills=kills, seed=seed, lease_ms=lease_ms)
            pause = await pause_run(workdir, await _fresh_database(server.url, "pause"),
                                    lease_ms=lease_ms, seed=seed)
            return rates, crash, pause

        rates, crash, pause = asyncio.run(all_of_it())
    one = rates["PostgreSQL, 1 member(s)"]
    for name, rate in rates.items():
        figures.append(Figure(f"durable requests/s, {name} ({LOADERS * WINDOW} frames of "
                              "100 in flight per member)", rate, "req/s"))
    figures += [
        Figure("PostgreSQL, 1 member / SQLite, 1 process", one / rates["SQLite, 1 process"],
               "x"),
        Figure("PostgreSQL, 2 members / 1 member", rates["PostgreSQL, 2 member(s)"] / one, "x"),
        Figure("PostgreSQL, 4 members / 1 member", rates["PostgreSQL, 4 member(s)"] / one, "x"),
        Figure(f"kill -9 of a member under load (3 members, lease {lease_ms} ms)",
               crash.kills, "kills"),
        Figure("failover: kill -9 -> every stream of it owned by a live member, p50",
               statistics.median(crash.failover_s) * 1000, "ms"),
        Figure("failover, max", max(crash.failover_s) * 1000, "ms",
               f"<= lease ({lease_ms} ms) + a renewal"),
        Figure("acknowledged requests / lost / decided twice",
               crash.acked, f"/ {crash.lost} / {crash.duplicated}", "0 lost, 0 twice"),
        Figure("runs cut off by a kill, recorded aborted (restart) and rerun",
               crash.restart_aborts, "runs"),
        Figure("problems found by the checks (crash run; pause run)",
               len(crash.problems) + len(pause.problems), "", "0"),
        Figure("events a member paused past its lease wrote after the takeover",
               pause.late_writes, "events", "0"),
        Figure("paused member's streams taken over in", pause.failover_s[0] * 1000, "ms"),
    ]
    return figures


if __name__ == "__main__":
    run(measure, seconds=10, kills=10, seed=0, lease_ms=1_000)
