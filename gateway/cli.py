"""The ``gateway`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.report import status_table
from gateway.runtime import gc_paused
from lanes import Entry, replay, status, verify
from lanes.codec import decode
from lanes.gate import decode_gate_event, verify_gate
from lanes.replay import is_agent_stream
from store import RecordedEvent, SqliteEventStore, migrate


async def _records(db: Path) -> list[RecordedEvent]:
    store = SqliteEventStore(db)
    await store.open()
    try:
        return await store.read()
    finally:
        await store.close()


async def _entries(db: Path) -> list[Entry]:
    """The agents' events (provider gate streams are not agents)."""
    records = await _records(db)
    with gc_paused():
        return [Entry(r.position, r.stream, decode(r.type, r.data))
                for r in records if is_agent_stream(r.stream)]


async def _replay(db: Path, agent: str | None, at: int | None) -> int:
    entries = [e for e in await _entries(db) if at is None or e.position <= at]
    states = replay(entries)
    if agent is not None and agent not in states:
        print(f"gateway: no agent {agent!r} in {db}", file=sys.stderr)
        return 2
    chosen = [states[agent]] if agent else [states[a] for a in sorted(states)]
    now = max((s.now for s in chosen), default=0)
    for line in status_table(status(s, now) for s in chosen):
        print(line)
    for state in chosen:
        if state.pending:
            print(f"\n{state.agent_id} pending:")
            for p in state.pending:
                print(f"  {p.request.request_id:<16} {p.request.kind.value:<16} "
                      f"{p.request.priority.value:<7} {p.mode.value:<14} {p.request.dedupe_key}")
    return 0


async def _verify(db: Path) -> int:
    records = await _records(db)
    with gc_paused():
        entries = [Entry(r.position, r.stream, decode(r.type, r.data))
                   for r in records if is_agent_stream(r.stream)]
        gates: dict[str, list[RecordedEvent]] = {}
        for r in records:
            if not is_agent_stream(r.stream):
                gates.setdefault(r.stream, []).append(r)
    divergence = verify(entries)
    if divergence is not None:
        print(divergence.describe())
        return 1
    for stream, stream_records in sorted(gates.items()):
        found = verify_gate(stream, (decode_gate_event(r.type, r.data) for r in stream_records))
        if found is not None:
            record = stream_records[min(found.index, len(stream_records) - 1)]
            print(f"divergence in {stream} at position {record.position}:\n"
                  f"  input:      {found.input}\n  recorded:   {found.recorded}\n"
                  f"  re-decided: {found.redecided}")
            return 1
    gate_events = sum(len(v) for v in gates.values())
    print(f"verify: {len(entries)} agent events and {gate_events} provider gate events "
          f"({len(gates)} gates) re-decided, no divergence")
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, then stop gracefully and exit 0."""
    from gateway.clock import SystemClock
    from gateway.config import ConfigError, demo_config, load_config
    from gateway.feed import SyntheticFeed
    from gateway.server import Running, build_service, feed_market, serve_forever

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        config = demo_config() if args.command == "demo" else load_config(args.config)
    except ConfigError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    service = build_service(config, args.db)
    clock = SystemClock()

    def ready(running: Running) -> None:
        print(f"gateway serving on {running.url}", flush=True)
        if args.command == "demo":
            print(f"panel: {running.url}/", flush=True)
            for token in config.tokens:
                print(f"{token.role.value} token ({token.name}): {token.secret}", flush=True)
            print(f"event log: {args.db}; stop with Ctrl-C", flush=True)

    def feed(svc: object) -> object:
        # A lively market, so that the demo's price-cross hooks fire every few seconds.
        return feed_market(service, SyntheticFeed(volatility=3.0), clock)

    signal.signal(signal.SIGTERM, _exit_cleanly)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(service, host, port, ready,
                                  feed if args.command == "demo" else None))
    return 0


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gateway`` console script."""
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="serve three demo agents with a synthetic market feed (embedded SQLite)")
    demo.add_argument("--db", type=Path, default=Path("gateway-demo.db"))
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    serve = commands.add_parser("serve", help="serve the gateway from a config file")
    serve.add_argument("--config", type=Path, required=True)
    serve.add_argument("--db", type=Path, help="event log (default: the config's store.path)")
    serve.add_argument("--host", help="default: the config's server.host (127.0.0.1)")
    serve.add_argument("--port", type=int, help="default: the config's server.port")
    scenario = commands.add_parser(
        "scenario", help="run a short scripted scenario through the engine and print it")
    scenario.add_argument("--db", type=Path, default=Path("gateway-scenario.db"))
    scenario.add_argument("--pace", type=float, default=1.0, help="time scale of the scenario")
    mig = commands.add_parser("migrate", help="create or upgrade the event log schema")
    mig.add_argument("--db", type=Path, required=True)
    rep = commands.add_parser("replay", help="fold a log and print every agent's state")
    rep.add_argument("db", type=Path)
    rep.add_argument("--agent")
    rep.add_argument("--at", type=int, help="stop at this log position")
    ver = commands.add_parser("verify", help="re-decide every recorded input and compare")
    ver.add_argument("db", type=Path)
    commands.add_parser("schema", help="print the JSON Schema of every wire frame")
    args = parser.parse_args(argv)
    if args.command in ("replay", "verify") and not args.db.exists():
        print(f"gateway: no event log at {args.db}", file=sys.stderr)
        return 2

    if args.command == "scenario":
        from gateway.demo import run_demo

        return asyncio.run(run_demo(args.db, args.pace))
    if args.command in ("demo", "serve"):
        return _serve(args)
    if args.command == "migrate":
        asyncio.run(migrate(args.db))
        print(f"migrated {args.db}")
        return 0
    if args.command == "schema":
        from gateway.protocol import json_schemas

        print(json.dumps(json_schemas(), indent=2))
        return 0
    if args.command == "replay":
        return asyncio.run(_replay(args.db, args.agent, args.at))
    return asyncio.run(_verify(args.db))


if __name__ == "__main__":
    raise SystemExit(main())
