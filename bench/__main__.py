"""Run every benchmark and write one Markdown report (``bench/results/report.md``).

    uv run python -m bench [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    cluster,
    crash,
    estop_latency,
    fanout,
    gate,
    mcp_call,
    panel_load,
    peers,
    pg_throughput,
    replay_speed,
    scale,
    throughput,
    time_travel,
    tool_loop,
    worker_dispatch,
    ws_ingest,
)
from bench.common import Figure, machine, table
from store import pg_server


def crash_figures(kills: int) -> list[Figure]:
    """`bench.crash.crash_run` in a scratch directory, as figures."""
    with tempfile.TemporaryDirectory() as scratch:
        report = asyncio.run(crash.crash_run(Path(scratch), kills))
    restart_ms = [s * 1000 for s in report.restart_s]
    return [
        Figure("kills (SIGKILL at a random moment under load)", report.kills, "kills"),
        Figure("acknowledged requests", report.acked, "requests"),
        Figure("acknowledged requests lost", report.lost, "requests", "0"),
        Figure("requests decided twice as new", report.duplicated, "requests", "0"),
        Figure("runs cut off by a kill", report.cut_off_runs, "runs"),
        Figure("... recorded as aborted (restart) at the next start", report.aborted_recorded,
               "runs", "all"),
        Figure("restart to /healthz 200, p50", statistics.median(restart_ms), "ms"),
        Figure("restart to /healthz 200, max", max(restart_ms), "ms"),
        Figure("restart to /readyz 200, p50", statistics.median(report.ready_s) * 1000, "ms",
               "<= 2,000"),
        Figure("restart to /readyz 200, max", max(report.ready_s) * 1000, "ms"),
        Figure("`gateway verify` exit code on the final log",
               -1 if report.verify_exit is None else report.verify_exit, "", "0"),
        Figure("problems found by the checks", len(report.problems), "", "0"),
    ]


def main() -> None:
    """Run them all, print the report and save it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    size = 10 if args.quick else 1
    requests, events, decisions = 100_000 // size, 1_000_000 // size, 200_000 // size
    agents, frames, batched = 10_000 // size, 20_000 // size, 100_000 // size
    stops, seconds, minutes = 200 // size, max(3, 10 // size), max(1, 10 // size)
    kills, rounds = (5, 1) if args.quick else (20, 3)
    # Each section: its title, the command that reproduces it alone, and the run.
    sections: list[tuple[str, str, Callable[[], list[Figure]]]] = [
        ("Durable throughput vs raw sqlite3 writing the same rows",
         f"bench.throughput --requests {requests}",
         lambda: throughput.measure(count=requests)),
        ("Durable enqueue vs persist-queue, eventsourcing and raw sqlite3 "
         "(all WAL, synchronous=FULL)",
         f"bench.peers --requests {requests} --rounds {rounds}",
         lambda: peers.measure(count=requests, rounds=rounds)),
        ("Replay and verify",
         f"bench.replay_speed --events {events}",
         lambda: replay_speed.measure(events=events)),
        ("Time travel on one agent's long stream: a pick, and the event loop meanwhile",
         f"bench.time_travel --events {events // 10}",
         lambda: time_travel.measure(events=events // 10)),
        ("Cost per decision at 10 and 10,000 agents, memory per agent",
         f"bench.scale --requests {decisions} --agents {agents}",
         lambda: scale.measure(count=decisions, agents=agents)),
        ("Feed ingest over one WebSocket vs a bare websockets server",
         f"bench.ws_ingest --requests {frames} --batched {batched}",
         lambda: ws_ingest.measure(count=frames, batched=batched)),
        ("Event delivery to subscribers: one frame per event vs batched frames",
         f"bench.fanout --requests {requests // 2}",
         lambda: fanout.measure(count=requests // 2)),
        ("Emergency-stop latency under a feed flood",
         f"bench.estop_latency --stops {stops} --seconds {seconds}",
         lambda: estop_latency.measure(stops=stops, seconds=seconds)),
        ("Runs as tool loops: one step, model call to the next, fake provider at 0 latency",
         f"bench.tool_loop --runs {max(10, 40 // size)}",
         lambda: tool_loop.measure(runs=max(10, 40 // size))),
        ("An MCP call_agent round trip against the simulated reasoner at 50 ms",
         f"bench.mcp_call --calls {max(20, 200 // size)}",
         lambda: mcp_call.measure(calls=max(20, 200 // size))),
        ("Run dispatch to a worker (/ws/worker) and back vs the simulated reasoner, 20 ms "
         "model calls",
         f"bench.worker_dispatch --runs {max(20, 200 // size)}",
         lambda: worker_dispatch.measure(runs=max(20, 200 // size))),
        ("The panel's load time at 1,000 agents (Chromium): overview with every agent, the "
         "capacity view",
         f"bench.panel_load --agents 1000 --runs 4 --reps {max(2, 5 // size)}",
         lambda: panel_load.measure(agents=1_000, runs=4, reps=max(2, 5 // size))),
        ("Provider gate: 100 agents saturating 600 RPM",
         f"bench.gate --minutes {minutes}",
         lambda: gate.measure(minutes=minutes)),
        ("The event store on PostgreSQL vs SQLite; 1, 2 and 4 writer processes on one log",
         f"bench.pg_throughput --appends {requests // 10}",
         lambda: pg_throughput.measure(appends=requests // 10)
         if pg_server.find_binaries() else []),  # PostgreSQL not installed: no figures
        ("Crash safety: kill -9 under load, restarted on the same log",
         f"bench.crash --kills {kills}",
         lambda: crash_figures(kills)),
        ("Several gateway processes on one PostgreSQL log: throughput, failover, a paused "
         "member",
         f"bench.cluster --seconds {seconds} --kills {kills // 2}",
         lambda: cluster.measure(seconds=seconds, kills=kills // 2)
         if pg_server.find_binaries() else []),
    ]
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Benchmark report\n\n{now} — {machine()}\n",
             f"Whole suite: `uv run python -m bench{' --quick' if args.quick else ''}`\n"]
    print("\n".join(lines), flush=True)
    for title, command, run in sections:
        began = time.monotonic()
        figures = run()
        lines += [f"## {title}\n", f"`uv run python -m {command}` "
                  f"({time.monotonic() - began:.0f} s)\n", table(figures), ""]
        print("\n".join(lines[-4:]), flush=True)
    out = Path(__file__).parent / "results" / "report.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"report written to {out}")


if __name__ == "__main__":
    main()
