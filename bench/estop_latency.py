"""Emergency-stop latency on the control lane while a feed flood hits every agent.

The gateway runs in this process (as in `bench.ws_ingest`: uvicorn on 127.0.0.1, SQLite with
``synchronous=FULL``) with ``agents`` agents whose runs wait until cancelled; every agent has
a run going before anything is measured. Two child processes then share one wall clock:

- the **flood**: ``hook_trigger`` requests at ``rate`` per second in total, spread over all
  agents, in ``submit_many`` frames of 100 over two feed connections, paced by the clock
  for ``seconds`` (at most ``window`` frames in flight per connection: if the gateway falls
  behind, the achieved rate says so);
- the **control** client (`gateway.client.ControlClient`): ``stops`` times, spread over the
  flood, it picks the next agent, checks from a status snapshot that a run is active, sends
  ``emergency_stop`` and waits for its ack, then ``resume`` (which starts the next run).

Measured per stop: control frame sent -> ack received (client clock), and control frame
sent -> the run's task cancelled (the reasoner records the moment it sees the cancellation;
both sides read ``CLOCK_MONOTONIC``, one clock for every process on the machine).

    uv run python -m bench.estop_latency [--stops N] [--rate N] [--seconds N] [--agents N]
        [--idle 0|1] [--calm N] [--small_batch N] [--postgres 0|1]
        [--loop auto|asyncio|uvloop]

With ``--idle 1`` (the default) the same stops are first measured with no flood at all, and
the figure "stop ack p99 under the flood / idle p99" compares the two in the same run.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
from websockets.asyncio.client import connect

from bench import estop_probe
from bench.common import Figure, run
from bench.estop_probe import Probe
from bench.ws_ingest import (
    BATCH,
    CONTROL_TOKEN,
    FEED_TOKEN,
    TIMEOUT,
    agent_names,
    gateway,
    request_json,
)
from gateway.base.metrics import LATENCY_BUCKETS
from gateway.base.process import EventLoop, run_on
from gateway.client import ControlClient
from gateway.llm.port import Completion, ToolCall
from gateway.llm.reasoner import RunContext, RunResult
from lanes import AgentConfig, Mode, parse_request
from store import DEFAULT_MAX_BATCH, pg_server

CONNECTIONS = 2
LEAD_S = 1.0
"""From the children being ready to the flood's start."""
WARMUP_S = 1.0
"""From the flood's start to the first stop."""


def now_ns() -> int:
    """``CLOCK_MONOTONIC`` in ns: the same clock in every process of this machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


async def sleep_until(deadline_ns: int) -> None:
    """Sleep until ``CLOCK_MONOTONIC`` reaches ``deadline_ns``."""
    delay = (deadline_ns - now_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


STEP_MS = 50
"""With ``--tools 1``: every run takes a tool step this often (a model call and a tool
result recorded, the tool run) until it is stopped."""


class Blocker:
    """A reasoner whose runs wait until they are cancelled, which it timestamps."""

    def __init__(self, agents: int) -> None:
        self.agents = agents
        self.running: dict[str, str] = {}
        self.cancelled: dict[str, int] = {}
        """Run id -> ``CLOCK_MONOTONIC`` ns when its task saw the cancellation."""
        self.all_running = asyncio.Event()

    async def run(self, ctx: RunContext) -> RunResult:
        """Wait for ever (an agent with tools: take a tool step every `STEP_MS`, each
        recorded, as a tool loop would, for as long as its step budget lasts); note the
        cancellation."""
        self.running[ctx.agent_id] = ctx.run_id
        if len(self.running) >= self.agents:
            self.all_running.set()
        try:
            tools = ctx.tools
            if tools is not None and tools.specs:
                for step in range(1, tools.max_steps):
                    await ctx.clock.sleep(STEP_MS)
                    call = ToolCall(f"{ctx.run_id}-{step}", "positions", {})
                    await tools.step(step, Completion(text="", input_tokens=500,
                                                      output_tokens=20, tool_calls=(call,)))
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled[ctx.run_id] = now_ns()
            raise
        raise AssertionError("unreachable")


# ------------------------------------------------------------------- the flood (a child)


@dataclass(frozen=True, slots=True)
class Flood:
    """What the flood did."""

    sent: int
    acked: int
    busy: int
    started_ns: int
    last_ack_ns: int
    ended_ns: int
    """When the flood stopped sending."""


def flood(url: str, agents: int, rate: int, seconds: float, start_ns: int,
          window: int, nice: int = 0) -> Flood:
    """In a child process: ``rate`` requests/s over ``CONNECTIONS`` feed connections (at
    ``nice``: the pool's worker keeps it for its later tasks)."""
    if nice > os.nice(0):
        os.nice(nice - os.nice(0))
    return asyncio.run(_flood(f"{url}/ws/feed", agent_names(agents), rate, seconds, start_ns,
                              window))


async def _flood(url: str, names: list[str], rate: int, seconds: float, start_ns: int,
                 window: int) -> Flood:
    frames = int(rate * seconds) // BATCH
    stop_ns = start_ns + int(seconds * 1e9)
    interval_ns = int(1e9 * BATCH / rate) if rate else 0
    totals = {"sent": 0, "acked": 0, "busy": 0, "last": start_ns}
    ended = [start_ns]

    async def connection(lane: int) -> None:
        headers = {"Authorization": f"Bearer {FEED_TOKEN}"}
        async with connect(url, additional_headers=headers, compression=None,
                           max_size=16 << 20) as ws:
            assert json.loads(await ws.recv())["type"] == "hello"
            slots = asyncio.Semaphore(window)
            texts: dict[str, str] = {}
            resending: set[asyncio.Task[None]] = set()
            loop = asyncio.get_running_loop()

            def resend(frame_id: str) -> None:
                task = loop.create_task(ws.send(texts[frame_id]))
                resending.add(task)
                task.add_done_callback(resending.discard)

            async def read() -> None:
                async for raw in ws:
                    answer = json.loads(raw)
                    if answer["type"] == "busy":
                        totals["busy"] += 1
                        loop.call_later(answer["retryAfterMs"] / 1000, resend, answer["id"])
                        continue
                    if answer["type"] != "acks":
                        raise RuntimeError(f"unexpected answer: {raw[:300]!r}")
                    totals["acked"] += sum(r.get("type") == "ack" for r in answer["results"])
                    totals["last"] = now_ns()
                    del texts[answer["id"]]
                    slots.release()
                    if done and not texts:
                        return

            done = False
            reading = asyncio.create_task(read())
            for k in range(lane, frames, CONNECTIONS):
                await sleep_until(start_ns + k * interval_ns)
                await slots.acquire()
                if now_ns() >= stop_ns:
                    break  # behind schedule at the end: what was not sent is not sent
                frame_id = f"f{k}"
                items = ",".join(request_json(f"fl{k}-", n, names[(k * BATCH + n) % len(names)])
                                 for n in range(BATCH))
                texts[frame_id] = (f'{{"type":"submit_many","id":"{frame_id}",'
                                   f'"requests":[{items}]}}')
                await ws.send(texts[frame_id])
                totals["sent"] += BATCH
            if not frames:
                await sleep_until(stop_ns)  # idle: connected and silent as long as a flood
            done = True
            ended[0] = max(ended[0], now_ns())
            if texts:
                await asyncio.wait_for(reading, TIMEOUT)
            else:
                reading.cancel()

    await asyncio.gather(*(connection(lane) for lane in range(CONNECTIONS)))
    return Flood(totals["sent"], totals["acked"], totals["busy"], start_ns, totals["last"],
                 ended[0])


# ----------------------------------------------------------------- the control (a child)


@dataclass(frozen=True, slots=True)
class Stop:
    """One emergency stop: which run, when it was sent, when its ack came."""

    agent: str
    run_id: str
    request_id: str
    sent_ns: int
    acked_ns: int
    decision: str


def control(url: str, agents: int, stops: int, first_ns: int, last_ns: int) -> list[Stop]:
    """In a child process: ``stops`` emergency stops spread from ``first_ns`` to ``last_ns``,
    each followed by a resume."""
    return asyncio.run(_control(url, agent_names(agents), stops, first_ns, last_ns))


def _control_request(agent: str, action: str, n: int) -> dict[str, Any]:
    return {"requestId": f"ctl-{action}-{n}", "createdAt": datetime.now(UTC).isoformat(),
            "agentId": agent, "kind": "user_control", "priority": "high",
            "payload": {"action": action}}


async def _control(url: str, names: list[str], stops: int, first_ns: int,
                   last_ns: int) -> list[Stop]:
    spacing = (last_ns - first_ns) // max(1, stops)
    done: list[Stop] = []
    http_url = url.replace("ws://", "http://", 1)
    headers = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
    async with ControlClient(url, CONTROL_TOKEN) as client, \
            httpx2.AsyncClient(base_url=http_url, headers=headers, timeout=TIMEOUT) as http:

        async def stop_then_resume(n: int, agent: str, run_id: str) -> None:
            stop = _control_request(agent, "emergency_stop", n)
            sent = now_ns()
            ack = await client.submit(stop)
            acked = now_ns()
            done.append(Stop(agent, run_id, stop["requestId"], sent, acked, ack.decision))
            await client.submit(_control_request(agent, "resume", n))

        # Stops go out on schedule; each waits for its own ack (one connection, pipelined).
        pending: list[asyncio.Task[None]] = []
        for n in range(stops):
            agent = names[n % len(names)]
            await sleep_until(first_ns + n * spacing)
            run_id = await _active_run(http, agent)
            if run_id is not None:
                pending.append(asyncio.create_task(stop_then_resume(n, agent, run_id)))
        await asyncio.wait_for(asyncio.gather(*pending), TIMEOUT)
    return done


async def _active_run(http: httpx2.AsyncClient, agent: str) -> str | None:
    """The id of the agent's active run, from its status (``GET /api/agents/{id}``, which
    costs the gateway far less than a subscription); a few tries if it has none yet."""
    for attempt in range(20):
        response = await http.get(f"/api/agents/{agent}")
        response.raise_for_status()
        status = response.json()
        if status["trading"] == "ACTIVE" and status.get("activeRun"):
            return str(status["activeRun"]["runId"])
        await asyncio.sleep(0.005 * (attempt + 1))
    return None


# ------------------------------------------------------------------------------ measure


@dataclass(frozen=True, slots=True)
class Outcome:
    """Everything one run measured."""

    stops: list[Stop]
    flood: Flood
    cancelled: dict[str, int]
    wanted_stops: int
    commit_ms: float
    """The engine's mean time from a decision to its commit, over the flood."""
    control_commit_ms: float
    """The same for the control lane's appends (the stops and resumes)."""
    control_within_5ms: float
    """The share of those committed within 5 ms of their decision."""
    commit_p99_ms: float
    """The bucket bound (ms) under which 99 % of the flood's decisions were committed."""
    probe: Probe | None = None
    """What `bench.estop_probe` recorded (with ``--probe 1``)."""


def _ready(barrier: threading.Barrier) -> None:
    barrier.wait(TIMEOUT)  # both pool workers are up once both have got here


async def _measure(stops: int, rate: int, seconds: float, agents: int, window: int,
                   pool: ProcessPoolExecutor, max_batch: int, postgres: str | None = None,
                   probe: bool = False, nice: int = 0,
                   flood_pool: ProcessPoolExecutor | None = None, tools: bool = False
                   ) -> Outcome:
    loop = asyncio.get_running_loop()
    with multiprocessing.Manager() as manager:
        barrier = manager.Barrier(2)
        await asyncio.gather(*(loop.run_in_executor(pool, _ready, barrier) for _ in range(2)))
    blocker = Blocker(agents)
    names = agent_names(agents)
    config = AgentConfig(mode=Mode.FOLLOWUP, cap=min(100_000, int(rate * seconds) + stops + 100),
                         tools=("positions",) if tools else (), max_steps=100)
    with tempfile.TemporaryDirectory() as tmp:
        async with gateway(postgres or Path(tmp, "estop.db"), dict.fromkeys(names, config),
                           lambda _: blocker, max_batch) as (url, engine):
            for n, name in enumerate(names):
                await engine.submit(parse_request(json.loads(request_json("first-", n, name))))
            # One more request queued per stop an agent takes, so that each resume starts a
            # run for the next stop even with no flood (under one the flood queues plenty).
            for n in range(stops):
                name = names[n % len(names)]
                await engine.submit(parse_request(json.loads(request_json("next-", n, name))))
            await asyncio.wait_for(blocker.all_running.wait(), TIMEOUT)
            start = now_ns() + int(LEAD_S * 1e9)
            first = start + int(WARMUP_S * 1e9)
            last = start + int((seconds - 0.5) * 1e9)
            histogram, controls = engine.commit_latency, engine.control_commit_latency
            before = (histogram.total, histogram.count, list(histogram.counts))
            controls_before = (controls.total, controls.count, list(controls.counts))
            watching: set[asyncio.Task[None]] = set()
            unwatch = estop_probe.start(watching) if probe else None
            flooding = loop.run_in_executor(
                flood_pool or pool, partial(flood, url, agents, rate, seconds, start, window, nice))
            stopping = loop.run_in_executor(
                pool, partial(control, url, agents, stops, first, last))
            done, the_flood = await asyncio.gather(stopping, flooding)
            if unwatch is not None:
                unwatch()
            await engine.flush()
            commits = histogram.count - before[1]
            commit_ms = 1000 * (histogram.total - before[0]) / max(1, commits)
            control_commits = controls.count - controls_before[1]
            control_ms = 1000 * (controls.total - controls_before[0]) / max(1, control_commits)
            fast = LATENCY_BUCKETS.index(0.005) + 1  # the buckets up to 5 ms
            within = sum(controls.counts[:fast]) - sum(controls_before[2][:fast])
            spread = [now - then for now, then in zip(histogram.counts, before[2], strict=True)]
    return Outcome(done, the_flood, dict(blocker.cancelled), stops, commit_ms, control_ms,
                   within / max(1, control_commits), _bucket_p99(spread),
                   estop_probe.PROBE if probe else None)


def _bucket_p99(counts: list[int]) -> float:
    """The smallest latency bucket bound (ms) holding 99 % of the observations (inf: past
    the last bound)."""
    total, running = sum(counts), 0
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
        running += count
        if running >= 0.99 * total:
            return bound * 1000
    return float("inf")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _during(out: Outcome) -> list[Stop]:
    """The stops sent while the flood (or the idle stretch) lasted."""
    return [s for s in out.stops if s.sent_ns <= out.flood.ended_ns]


def _ack_ms(out: Outcome) -> list[float]:
    """Frame sent -> ack received (ms) of each stop sent during the flood."""
    return [(s.acked_ns - s.sent_ns) / 1e6 for s in _during(out)]


def _figures(out: Outcome, rate: int, agents: int, max_batch: int,
             engine: str = "") -> list[Figure]:
    flood_ = out.flood
    offered = f"{rate:,}/s offered" if rate else "idle, no flood"
    tag = f"[{engine}{offered}]" if max_batch == DEFAULT_MAX_BATCH else (
        f"[{engine}{offered}, max_batch {max_batch:,}]")
    during = _during(out)
    ack_ms = _ack_ms(out)
    abort_ms = [(out.cancelled[s.run_id] - s.sent_ns) / 1e6 for s in during
                if s.run_id in out.cancelled]
    aborted = sum(s.run_id in out.cancelled for s in out.stops)
    flood_s = max(1, flood_.last_ack_ns - flood_.started_ns) / 1e9
    return [
        Figure(f"{tag} feed flood achieved, acked after commit ({agents} agents, "
               f"{BATCH}/frame, {CONNECTIONS} conns)", flood_.acked / flood_s, "req/s"),
        Figure(f"{tag} flood busy answers (retried)", flood_.busy, "frames"),
        Figure(f"{tag} engine: decision -> commit, mean over the flood", out.commit_ms, "ms"),
        Figure(f"{tag} engine: decision -> commit, p99 over the flood (bucket bound)",
               out.commit_p99_ms, "ms", "<= 50 ms (the intake's budget)"),
        Figure(f"{tag} engine: control-lane decision -> commit, mean", out.control_commit_ms,
               "ms"),
        Figure(f"{tag} engine: control-lane commits within 5 ms of the decision",
               100 * out.control_within_5ms, "%"),
        Figure(f"{tag} emergency stops sent during the flood", len(during),
               f"of {out.wanted_stops}"),
        Figure(f"{tag} stops that aborted a running task", aborted, f"of {len(out.stops)}"),
        Figure(f"{tag} stop: frame sent -> run task cancelled, p50",
               _percentile(abort_ms, 0.5), "ms"),
        Figure(f"{tag} stop: frame sent -> run task cancelled, p99",
               _percentile(abort_ms, 0.99), "ms"),
        Figure(f"{tag} stop: frame sent -> ack received, p50", _percentile(ack_ms, 0.5), "ms"),
        Figure(f"{tag} stop: frame sent -> ack received, p99", _percentile(ack_ms, 0.99), "ms",
               "<= 5 ms"),
        Figure(f"{tag} stop: frame sent -> ack received, max",
               max(ack_ms, default=float("nan")), "ms"),
    ] + ([] if out.probe is None else estop_probe.figures(
        out.probe, tag, [(s.request_id, s.sent_ns, s.acked_ns) for s in during],
        (flood_.started_ns, flood_.ended_ns)))


def measure(stops: int = 200, rate: int = 20_000, seconds: int = 10, agents: int = 100,
            window: int = 50, calm: int = 5_000, small_batch: int = 500,
            postgres: int = 1, idle: int = 1, probe: int = 0, flood_nice: int = 0,
            tools: int = 0, loop: EventLoop = "auto") -> list[Figure]:
    """Emergency-stop latency with no flood at all (``idle``; 0: skip): the same stops, the
    same client, the feed connections open and silent; then under a feed flood of ``rate``
    requests/s, and the flood rate achieved, and the ratio of the two ack p99s; then the
    same under a flood of ``calm`` requests/s (0: skip), one the gateway keeps up with, to
    tell queueing from the control path itself; then the first flood again with commits of
    at most ``small_batch`` events (``[store] max_batch``; 0: skip), to show what smaller
    commits trade. ``probe`` (1: on) adds where each stop waited (`bench.estop_probe`).
    ``flood_nice`` runs the flood's process at that niceness (as if the flood came from
    another machine: on a small one, the load generator takes a core from the gateway).
    ``tools`` (1: on) gives every agent a tool and makes each run a tool loop that records a
    step every `STEP_MS` until it is stopped: the first flood is then measured twice, without
    and with the tool loops, back to back (the rest is skipped). The gateway runs on the
    event loop ``loop`` names (by default the one `gateway serve` picks: uvloop on Linux)."""
    if tools:
        return [Figure(f"[{'tool loops' if looping else 'waiting runs'}] {figure.name}",
                       figure.value, figure.unit, figure.goal)
                for looping in (False, True)
                for figure in _tool_variant(stops, rate, seconds, agents, window, looping, loop)]
    if probe:
        estop_probe.install()
    context = multiprocessing.get_context("spawn")
    figures: list[Figure] = []
    # A niced flood runs in a pool of its own (a worker cannot be made less nice again).
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool, \
            ProcessPoolExecutor(max_workers=1, mp_context=context) as flood_pool:
        niced = flood_pool if flood_nice else None
        idle_p99 = float("nan")
        if idle:
            out = run_on(_measure(stops, 0, seconds, agents, window, pool,
                                  DEFAULT_MAX_BATCH, probe=bool(probe), nice=flood_nice,
                                  flood_pool=niced), loop)
            figures += _figures(out, 0, agents, DEFAULT_MAX_BATCH)[4:]  # no flood figures
            idle_p99 = _percentile(_ack_ms(out), 0.99)
        for offered, batch in ((rate, DEFAULT_MAX_BATCH), (calm, DEFAULT_MAX_BATCH),
                               (rate, small_batch)):
            if offered > 0 and batch > 0:
                out = run_on(_measure(stops, offered, seconds, agents, window, pool,
                                      batch, probe=bool(probe), nice=flood_nice,
                                      flood_pool=niced), loop)
                figures += _figures(out, offered, agents, batch)
                if idle and offered == rate and batch == DEFAULT_MAX_BATCH:
                    figures.append(Figure(
                        f"[{rate:,}/s offered] stop ack p99 under the flood / idle p99 "
                        "(same run)", _percentile(_ack_ms(out), 0.99) / idle_p99, "x",
                        "<= 2x"))
        if postgres and pg_server.find_binaries() is not None:
            # The same floods on PostgreSQL (a throwaway server, fsync on; one member).
            with pg_server.throwaway(durable=True) as server:
                for n, offered in enumerate((rate, calm)):
                    if offered > 0:
                        url = asyncio.run(pg_server.create_database(server.url, f"estop{n}"))
                        out = run_on(_measure(stops, offered, seconds, agents, window,
                                              pool, DEFAULT_MAX_BATCH, url), loop)
                        figures += _figures(out, offered, agents, DEFAULT_MAX_BATCH,
                                            "PostgreSQL, ")
    return figures


def _tool_variant(stops: int, rate: int, seconds: int, agents: int, window: int,
                  tools: bool, loop: EventLoop = "auto") -> list[Figure]:
    """The stops under the first flood, the runs waiting (``tools`` False) or looping."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        out = run_on(_measure(stops, rate, seconds, agents, window, pool,
                              DEFAULT_MAX_BATCH, tools=tools), loop)
    return _figures(out, rate, agents, DEFAULT_MAX_BATCH)


if __name__ == "__main__":
    run(measure, {"loop": ("auto", "asyncio", "uvloop")}, stops=200, rate=20_000, seconds=10,
        agents=100, window=50, calm=5_000, small_batch=500, postgres=1, idle=1, probe=0,
        flood_nice=0, tools=0)
