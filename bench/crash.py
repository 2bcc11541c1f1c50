"""Crash proof: the real gateway process under feed and control load, ``kill -9`` again and
again on one SQLite log, restarted each time.

Each round starts ``python -m gateway.cli serve`` (a config in a scratch directory: SQLite
with ``synchronous=FULL``, three agents with simulated reasoners of a few milliseconds, a
``price_cross`` hook, a feed and a control token, port 0), waits until ``/healthz`` answers
200 (polled, with a timeout), then loads it from this process: a `ControlClient` submitting
requests in small batches (and, first, resubmitting every request of the previous round
whose ack never came plus a sample of acknowledged ones) and a `FeedClient` sending ticks
that cross the hook's level (and, first, the ticks whose ack never came). After a random
100-600 ms of load (seeded) the process gets SIGKILL. Before the next start the log is read
to note each run the kill cut off.

The clients keep a ledger of every ack (request id -> decision + log position). At the end
(after one last start and a graceful stop) the log must hold every acknowledged request with
the acknowledged decision at the acknowledged position, no request id decided twice as new
(a resubmission is a ``RequestRepeated``), every cut-off run recorded as aborted with reason
``restart``, `lanes.verify` clean and ``gateway verify DB`` exiting 0.

Each restart is timed from the spawn to ``/healthz`` 200 and to ``/readyz`` 200 (a server
without ``/readyz``: its ``/healthz``). With ``--log-events N`` the log starts with ``N``
events of 50 other agents (`bench.replay_speed.make_log`, written in bulk, with a snapshot
stored as a running gateway would have), so restarts are measured on a long log;
``--seeded-log PATH`` keeps that log in ``PATH`` and reuses it when it is there already.

    uv run python -m bench.crash [--kills N] [--seed N] [--min-load-ms N] [--max-load-ms N]
                                 [--log-events N] [--seeded-log PATH] [--compile-bytecode]

``--compile-bytecode`` compiles the gateway's bytecode before the first start, as ``pip
install`` does: without it, where Python may not write bytecode (``PYTHONDONTWRITEBYTECODE``,
a read-only install), every start compiles its imports again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2

from gateway.client import (
    AckFrame,
    ConnectionLost,
    ControlClient,
    ErrorFrame,
    FeedClient,
    GatewayClientError,
)
from lanes import AgentState, Entry, replay, verify
from lanes.codec import decode
from lanes.events import (
    AbortReason,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRepeated,
    RequestSummarized,
    RunAborted,
    RunSteered,
)
from lanes.streams import is_agent_stream
from store import SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]
SEEDED = "seed-"
"""The prefix of the request ids of a seeded log."""
SEEDED_AGENTS = tuple(f"agent{n}" for n in range(50))
"""The agents of a seeded log (`bench.replay_speed.make_log`'s)."""
TIMEOUT = 30.0
AGENTS = ("btc", "eth", "sol")
FEED_TOKEN = "crash-feed-secret"
CONTROL_TOKEN = "crash-control-secret"
DECISION_OF: dict[type, str] = {
    RequestQueued: "accepted", RunSteered: "accepted", RequestDeduped: "deduped",
    RequestDropped: "dropped", RequestSummarized: "dropped", RequestRejected: "rejected",
}
CONFIG = """
[server]
host = "127.0.0.1"
port = 0

[store]
path = "{db}"
synchronous = "FULL"

[[tokens]]
name = "feed"
token = "{feed}"
role = "feed"

[[tokens]]
name = "ops"
token = "{control}"
role = "control"

[[agents]]
id = "btc"
mode = "followup"
cap = 20
[agents.reasoner]
latency_ms = [5, 40]
seed = 1

[[agents]]
id = "eth"
mode = "collect"
debounce_ms = 20
cap = 20
[agents.reasoner]
latency_ms = [5, 40]
seed = 2

[[agents]]
id = "sol"
mode = "steer-backlog"
cap = 20
drop_policy = "summarize"
[agents.reasoner]
latency_ms = [5, 40]
seed = 3

[[hooks]]
kind = "price_cross"
name = "btc_100"
symbol = "BTCUSD"
level = 100.0
direction = "both"
agents = ["btc", "sol"]
"""


@dataclass
class Ack:
    decision: str
    position: int
    agent: str


@dataclass
class Report:
    """What one crash run saw; `problems` is empty when every check held."""

    kills: int = 0
    acked: int = 0
    repeated_acks: int = 0
    lost: int = 0
    duplicated: int = 0
    cut_off_runs: int = 0
    aborted_recorded: int = 0
    restart_s: list[float] = field(default_factory=list)
    ready_s: list[float] = field(default_factory=list)
    """Seconds from the spawn to ``/readyz`` 200, each restart."""
    events: int = 0
    verify_exit: int | None = None
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        restart = sorted(self.restart_s)
        return [
            f"kills                     {self.kills}",
            f"acknowledged requests     {self.acked} (+{self.repeated_acks} repeated acks)",
            f"lost                      {self.lost}",
            f"duplicated                {self.duplicated}",
            f"cut-off runs              {self.cut_off_runs}",
            f"aborted (restart) found   {self.aborted_recorded}",
            f"restart to /healthz p50   {statistics.median(restart) * 1000:.0f} ms"
            if restart else "restart                   -",
            f"restart to /healthz max   {max(restart) * 1000:.0f} ms" if restart else "",
            f"restart to /readyz p50    {statistics.median(self.ready_s) * 1000:.0f} ms"
            if self.ready_s else "",
            f"restart to /readyz max    {max(self.ready_s) * 1000:.0f} ms"
            if self.ready_s else "",
            f"log events                {self.events}",
            f"gateway verify exit       {self.verify_exit}",
            f"problems                  {len(self.problems)}",
            *(f"  {p}" for p in self.problems[:20]),
        ]


class Ledger:
    """The clients' own record of what the gateway acknowledged."""

    def __init__(self, report: Report) -> None:
        self.acks: dict[str, Ack] = {}
        self.report = report

    def take(self, answer: AckFrame | ErrorFrame, agent: str | None = None) -> None:
        if not isinstance(answer, AckFrame):
            return
        first = self.acks.get(answer.request_id)
        if answer.repeated:
            self.report.repeated_acks += 1
            if first is not None and first.decision != answer.decision:
                self.report.problems.append(
                    f"{answer.request_id}: acked {first.decision}, repeated as {answer.decision}")
            return
        if first is not None:
            self.report.problems.append(f"{answer.request_id}: acked twice as new")
            return
        self.acks[answer.request_id] = Ack(answer.decision, answer.position, agent or "")


async def start(config: Path, db: Path | str, log: Path, prefix: Sequence[str] = (),
                options: Sequence[str] = ()) -> tuple[asyncio.subprocess.Process, str]:
    """Spawn the gateway (under ``prefix``: ``nsenter ...``, say; with more ``options`` of
    ``gateway serve``); return it and its URL once ``/healthz`` answers 200."""
    stderr = log.open("ab")
    try:
        process = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
            "--db", str(db), "--port", "0", *options, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=stderr)
    finally:
        stderr.close()
    try:
        assert process.stdout is not None
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), TIMEOUT)).decode()
            if not line:
                raise RuntimeError(f"the gateway exited early; see {log}")
            if line.startswith("gateway serving on"):
                url = line.split()[-1]
                break
        deadline = time.monotonic() + TIMEOUT
        async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            while True:
                with contextlib.suppress(httpx2.HTTPError):
                    if (await http.get("/healthz")).status_code == 200:
                        return process, url
                if time.monotonic() > deadline:
                    raise TimeoutError("/healthz never answered 200")
                await asyncio.sleep(0.01)  # polling a condition, with a deadline
    except BaseException:
        await kill(process)
        raise


async def ready(url: str) -> None:
    """Return once ``/readyz`` answers 200 (a server without it: at once, its ``/healthz``
    answered already)."""
    deadline = time.monotonic() + TIMEOUT
    async with httpx2.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                status = (await http.get("/readyz")).status_code
                if status in (200, 404):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("/readyz never answered 200")
            await asyncio.sleep(0.01)  # polling a condition, with a deadline


async def seed_log(db: Path, events: int, keep: Path | None = None) -> None:
    """A log of ``events`` events of 50 agents, with a snapshot, at ``db`` (copied from
    ``keep`` if that holds one already; else made, and kept there too)."""
    if keep is not None and keep.exists():  # noqa: ASYNC240 (a benchmark's setup)
        shutil.copyfile(keep, db)
        return
    from bench.replay_speed import _snapshot, _write, make_log
    from lanes.codec import encode

    encoded = [(e.position, e.stream, *encode(e.event))
               for e in make_log(events, prefix=SEEDED)]
    await _write(db, encoded)
    del encoded
    await _snapshot(db)  # as a gateway running on it would have stored (every 100,000)
    if keep is not None:
        shutil.copyfile(db, keep)


def compile_imports() -> None:
    """Compile the bytecode of the gateway and its dependencies, as ``pip install`` does
    (``uv sync`` only with ``--compile-bytecode``): where none is cached and none may be
    written (``PYTHONDONTWRITEBYTECODE``), every start compiles its imports again, about a
    second of it."""
    paths = [str(ROOT / name) for name in ("gateway", "lanes", "store", "migrations")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *paths,
                    sysconfig.get_paths()["purelib"]], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL (if still running) and reap."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
    await asyncio.wait_for(process.wait(), TIMEOUT)


class Load:
    """Feed and control load of one round; what was sent but never acked carries over."""

    def __init__(self, ledger: Ledger, rng: random.Random,
                 agents: Sequence[str] = AGENTS) -> None:
        self.ledger = ledger
        self.rng = rng
        self.agents = agents
        self.unacked: dict[str, dict[str, Any]] = {}
        self.bodies: dict[str, dict[str, Any]] = {}
        self.unacked_ticks: dict[int, dict[str, Any]] = {}
        self.n = 0
        self.ticks = 0
        self.t0 = datetime.now(UTC)

    def request(self) -> dict[str, Any]:
        n, self.n = self.n, self.n + 1
        agent = self.agents[n % len(self.agents)]
        kind = "agent_call" if n % 5 == 0 else "hook_trigger"
        body: dict[str, Any] = {
            "requestId": f"r{n}", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": agent, "kind": kind, "priority": self.rng.choice(
                ["low", "normal", "normal", "high"]),
        }
        if kind == "hook_trigger":
            body["dedupeKey"] = f"k{n % 11}"
        return body

    def tick(self) -> dict[str, Any]:
        n, self.ticks = self.ticks, self.ticks + 1
        return {"type": "tick", "symbol": "BTCUSD", "price": 99.0 if n % 2 else 101.0,
                "size": 1.0, "at": (self.t0 + timedelta(milliseconds=n)).isoformat()}

    async def control(self, client: ControlClient) -> None:
        again = list(self.unacked.values())
        acked = list(self.ledger.acks)
        # The same request again (a different body under a used id is refused).
        again += [self.bodies[i] for i in self.rng.sample(acked, min(5, len(acked)))
                  if i in self.bodies]
        batches = [again] if again else []
        while True:
            batch = batches.pop() if batches else [
                self.request() for _ in range(self.rng.randint(1, 8))]
            for body in batch:
                self.bodies[body["requestId"]] = body
                self.unacked.setdefault(body["requestId"], body)
            for body, answer in zip(batch, await client.submit_many(batch), strict=True):
                self.ledger.take(answer, body["agentId"])
                self.unacked.pop(body["requestId"], None)

    async def feed(self, client: FeedClient) -> None:
        again = list(self.unacked_ticks.items())
        while True:
            if again:
                batch, again = again, []
            else:
                batch = [(self.ticks, self.tick()) for _ in range(self.rng.randint(1, 4))]
            self.unacked_ticks.update(batch)
            ack = await client.market(tick for _, tick in batch)
            for answer in ack.triggered:
                self.ledger.take(answer)
            for n, _ in batch:
                self.unacked_ticks.pop(n, None)


async def read_log(db: Path, after: int = 0) -> list[Entry]:
    """The agents' events after position ``after``, decoded."""
    store = SqliteEventStore(db)
    await store.open()
    try:
        return [Entry(r.position, r.stream, decode(r.type, r.data))
                for r in await store.read(after) if is_agent_stream(r.stream)]
    finally:
        await store.close()


async def one_round(config: Path, db: Path, log: Path, load: Load, seconds: float,
                    report: Report) -> None:
    began = time.monotonic()
    process, url = await start(config, db, log)
    report.restart_s.append(time.monotonic() - began)
    try:
        await ready(url)
    except BaseException:
        await kill(process)
        raise
    report.ready_s.append(time.monotonic() - began)
    tasks: list[asyncio.Task[None]] = []
    clients: list[ControlClient | FeedClient] = []
    try:
        control = ControlClient(url, CONTROL_TOKEN, reconnect=False)
        clients.append(control)
        await control.connect()
        feed = FeedClient(url, FEED_TOKEN, reconnect=False)
        clients.append(feed)
        await feed.connect()
        tasks = [asyncio.create_task(load.control(control)),
                 asyncio.create_task(load.feed(feed))]
        # The load runs for `seconds`, then the kill comes at that random moment.
        done, _ = await asyncio.wait(tasks, timeout=seconds)
        for task in done:  # a load task ended before the kill: that is a failure
            task.result()
            raise RuntimeError("a load task ended before the kill")
    finally:
        await kill(process)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionLost, GatewayClientError):
                await task
        for client in clients:
            await client.close()
    report.kills += 1


async def crash_run(workdir: Path, kills: int, seed: int = 0, min_load_ms: int = 100,
                    max_load_ms: int = 600, log_events: int = 0,
                    seeded_log: Path | None = None, compile_bytecode: bool = False) -> Report:
    """Kill the gateway ``kills`` times under load; check the log against the ledger
    (which starts with ``log_events`` events of other agents: `seed_log`). With
    ``compile_bytecode``, the gateway's code is compiled first (`compile_imports`)."""
    rng = random.Random(seed)
    db = workdir / "events.db"
    if log_events:
        await seed_log(db, log_events, seeded_log)
    config = workdir / "gateway.toml"
    text = CONFIG.format(db=db, feed=FEED_TOKEN, control=CONTROL_TOKEN)
    if log_events:  # the seeded agents are the config's too (a reasoner each for their runs)
        text += "".join(f'\n[[agents]]\nid = "{agent}"\n' for agent in SEEDED_AGENTS)
    config.write_text(text)
    if compile_bytecode:
        compile_imports()
    log = workdir / "gateway.log"
    report = Report()
    ledger = Ledger(report)
    load = Load(ledger, rng)
    cut_off: set[str] = set()
    states: dict[str, AgentState] = {}
    seen = 0
    if log_events:  # runs the seeded log left open are cut off too (the first start aborts them)
        seeded = await read_log(db)
        states = replay(seeded)
        seen = seeded[-1].position if seeded else 0
        cut_off |= {s.active.run_id for s in states.values() if s.active is not None}
        cut_off |= {e.event.run_id for e in seeded if isinstance(e.event, RunAborted)
                    and e.event.reason is AbortReason.RESTART}  # (by the seeding's start)
        del seeded
    for _ in range(kills):
        await one_round(config, db, log, load, rng.uniform(min_load_ms, max_load_ms) / 1000,
                        report)
        new = await read_log(db, seen)  # the log is only appended to: fold what is new
        seen = new[-1].position if new else seen
        states = replay(new, states)
        cut_off |= {s.active.run_id for s in states.values() if s.active is not None}
    # One last start records the last kill's cut-off runs; then a graceful stop.
    process, _ = await start(config, db, log)
    try:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), TIMEOUT)
        if process.returncode != 0:
            report.problems.append(f"graceful stop exited {process.returncode}")
    finally:
        await kill(process)
    entries = await read_log(db)
    check(entries, ledger, cut_off, report, AGENTS)
    verify_process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "verify", str(db), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    report.verify_exit = await asyncio.wait_for(verify_process.wait(), TIMEOUT * 4)
    if report.verify_exit != 0:
        report.problems.append(f"gateway verify exited {report.verify_exit}")
    return report


def check(entries: list[Entry], ledger: Ledger, cut_off: set[str], report: Report,
          agents: Collection[str] | None = None) -> None:
    """Every acked request with its decision, none decided twice (of ``agents`` only, if
    given), cut-off runs aborted."""
    report.events = len(entries)
    report.acked = len(ledger.acks)
    by_position = {e.position: e for e in entries}
    received: Counter[str] = Counter()
    repeated: Counter[str] = Counter()
    for e in entries:
        if agents is not None and e.stream not in agents:  # (a seeded log's agents)
            continue
        if isinstance(e.event, RequestReceived):
            received[e.event.request.request_id] += 1
        elif isinstance(e.event, RequestRepeated):
            repeated[e.event.request_id] += 1
    for request_id, ack in ledger.acks.items():
        entry = by_position.get(ack.position)
        if (entry is None or getattr(entry.event, "request_id", None) != request_id
                or DECISION_OF.get(type(entry.event)) != ack.decision
                or received[request_id] < 1):
            report.lost += 1
            report.problems.append(f"{request_id}: acked {ack.decision} at {ack.position}, "
                                   f"log has {entry}")
    for request_id, count in received.items():
        if count - repeated[request_id] != 1:
            report.duplicated += 1
            report.problems.append(f"{request_id}: received {count}x, repeated "
                                   f"{repeated[request_id]}x")
    restarts = {e.event.run_id for e in entries
                if isinstance(e.event, RunAborted) and e.event.reason is AbortReason.RESTART
                and e.event.requeued}
    report.cut_off_runs = len(cut_off)
    report.aborted_recorded = len(cut_off & restarts)
    if cut_off - restarts:
        report.problems.append(f"cut-off runs not recorded as aborted: {cut_off - restarts}")
    if restarts - cut_off:
        report.problems.append(f"restart aborts of runs not cut off: {restarts - cut_off}")
    if [e.position for e in entries] != sorted({e.position for e in entries}):
        report.problems.append("log positions out of order")
    divergence = verify(entries)
    if divergence is not None:
        report.problems.append(f"lanes.verify: {divergence}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.crash", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-load-ms", type=int, default=100)
    parser.add_argument("--max-load-ms", type=int, default=600)
    parser.add_argument("--log-events", type=int, default=0,
                        help="events of other agents in the log before the first start")
    parser.add_argument("--seeded-log", type=Path, default=None,
                        help="keep the seeded log here and reuse it (made if missing)")
    parser.add_argument("--compile-bytecode", action="store_true",
                        help="compile the gateway's bytecode first, as pip install does")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        began = time.monotonic()
        report = asyncio.run(crash_run(Path(scratch), args.kills, args.seed,
                                       args.min_load_ms, args.max_load_ms, args.log_events,
                                       args.seeded_log, args.compile_bytecode))
        print("\n".join(line for line in report.lines() if line))
        print(f"wall time                 {time.monotonic() - began:.1f} s")
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
