"""The ``gateway`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gzip
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TextIO, cast


def _debug(args: argparse.Namespace) -> int:
    """The replay debugger's commands (`gateway.tools.debugger` and its neighbours); bad input
    exits 2."""
    from gateway.base.quarantine import UnreadableEvent
    from gateway.tools import debugger, timeline, verify, what_if
    from gateway.tools.logs import DebugError

    try:
        if args.command == "replay":
            return asyncio.run(debugger.replay_command(args.db, args.agent, args.at, print))
        if args.command == "timeline":
            words = None if args.config is None else what_if.market_words(args.config)
            return asyncio.run(timeline.timeline_command(
                args.db, args.agent, getattr(args, "from"), args.to, print, words))
        if args.command == "verify":
            return asyncio.run(verify.verify_command(args.db, print, args.jobs))
        if args.command == "whatif":
            return what_if.whatif_command(args.db, args.config, print)
        if args.command == "export":
            return _export(args)
        if args.command == "quarantine":
            return asyncio.run(debugger.quarantine_command(args.db, args.position,
                                                           args.reason, print))
        return _import(args)
    except (DebugError, UnreadableEvent) as error:
        print(f"gateway {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _export(args: argparse.Namespace) -> int:
    from gateway.tools.debugger import export_command

    def note(line: str) -> None:
        print(line, file=sys.stderr)  # stdout may be the export itself

    if args.out is None or str(args.out) == "-":
        return asyncio.run(export_command(args.db, sys.stdout, note))
    with _text(args.out, "w") as sink:
        return asyncio.run(export_command(args.db, sink, note))


@contextlib.contextmanager
def _text(path: Path, mode: Literal["r", "w"]) -> Iterator[TextIO]:
    """A file read or written as UTF-8 text; gzipped when its name ends in ``.gz`` (with no
    name or time in the header, so the same log always gives the same bytes)."""
    if path.suffix != ".gz":
        with open(path, mode, encoding="utf-8") as text:
            yield text
        return
    with (open(path, mode + "b") as file,
          gzip.GzipFile(filename="", mode=mode + "b", fileobj=file, mtime=0) as raw,
          io.TextIOWrapper(raw, encoding="utf-8") as text):
        yield text


def _import(args: argparse.Namespace) -> int:
    from gateway.tools.debugger import import_command, read_export
    from gateway.tools.logs import DebugError

    if str(args.file) == "-":
        records = read_export(sys.stdin)
    else:
        try:
            with _text(args.file, "r") as source:
                records = read_export(source)
        except (OSError, EOFError) as error:
            why = getattr(error, "strerror", None) or error
            raise DebugError(f"cannot read {args.file}: {why}") from None
    return asyncio.run(import_command(args.db, records, print))


def _serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, then stop gracefully and exit 0."""
    from gateway.base.clock import SystemClock
    from gateway.base.logs import FORMATS, LEVELS, SettingError, chosen, configure
    from gateway.base.process import EventLoop, loop_factory, run_on
    from gateway.base.quarantine import UnreadableEvent
    from gateway.config import ConfigError, demo_config, load_config
    from gateway.edge.server import Running, serve_forever
    from gateway.market.feed import SyntheticFeed
    from gateway.wiring import build_service, feed_market
    from store import LogInUse, LogUnavailable

    try:
        configure(chosen(args.log_level, "GATEWAY_LOG_LEVEL", LEVELS, "warning"),
                  chosen(args.log_format, "GATEWAY_LOG_FORMAT", FORMATS, "text"))
    except SettingError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    env = os.environ
    for unknown in sorted(set(env) - KNOWN_VARIABLES):
        if unknown.startswith("GATEWAY_"):
            logging.getLogger("gateway").warning(
                "%s is not a setting of the gateway (ignored); the settings: %s", unknown,
                ", ".join(sorted(v for v in KNOWN_VARIABLES if v.startswith("GATEWAY_"))))
    config_file = None if args.command == "demo" else (args.config or env.get("GATEWAY_CONFIG"))
    try:
        config = load_config(config_file) if config_file else demo_config(
            agents=args.command == "demo", tokens=_kept_tokens(args, env))
        event_loop = cast(EventLoop, args.loop or _env_choice("GATEWAY_EVENT_LOOP", LOOPS)
                          or config.server.event_loop)
        port = args.port if args.port is not None else _env_port(config.server.port)
    except (ConfigError, SettingError) as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    try:
        loop_factory(event_loop)
    except RuntimeError as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    host = args.host or env.get("GATEWAY_HOST") or config.server.host
    advertise = getattr(args, "advertise", None) or (
        None if args.command == "demo" else env.get("GATEWAY_ADVERTISE"))
    if advertise:
        config = config.model_copy(update={"cluster": config.cluster.model_copy(
            update={"advertise": advertise})})
    db = args.db if args.command == "demo" else (
        args.db or env.get("GATEWAY_DB") or env.get("DATABASE_URL"))
    service = build_service(config, db)
    clock = SystemClock()

    def ready(running: Running) -> None:
        print(f"gateway serving on {running.url}", flush=True)
        if config_file is None:  # (fresh tokens, made for this start: say them)
            print(f"panel: {running.url}/", flush=True)
            for token in config.tokens:
                print(f"{token.role.value} token ({token.name}): {token.secret}", flush=True)
            print(f"event log: {db or config.store.path}; stop with Ctrl-C", flush=True)

    def feed(svc: object) -> object:
        # A lively market, so that the demo's price-cross hooks fire every few seconds.
        return feed_market(service, SyntheticFeed(volatility=3.0), clock)

    signal.signal(signal.SIGTERM, _exit_cleanly)
    _end_with_launcher()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_on(serve_forever(service, host, port, ready,
                                 feed if args.command == "demo" else None,
                                 config.server.shutdown_timeout_s),
                   event_loop)
    except (LogInUse, LogUnavailable, UnreadableEvent) as error:
        print(f"gateway: {error}", file=sys.stderr)
        return 2
    return 0


def _kill(args: argparse.Namespace) -> int:
    from gateway.tools.kill import kill_command

    token = os.environ.get(args.token_env)
    if not token:
        print(f"kill: the environment variable {args.token_env} holds no token",
              file=sys.stderr)
        return 2
    return kill_command(args.url, token, args.reason, args.list, print, flatten=args.flatten)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


PR_SET_PDEATHSIG = 1


def _end_with_launcher() -> None:
    """Under ``uv run`` (Linux), stop gracefully when the uv process ends. uv forwards
    SIGINT and SIGTERM itself, but a ``kill -9`` of uv cannot be forwarded: the server would
    go on serving where nobody sees it, holding its log."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm", encoding="utf-8") as comm:
            if comm.read().strip() != "uv":
                return
    except OSError:  # not Linux, or the parent is gone already
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        return
    if os.getppid() != parent:  # uv died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gateway`` console script."""
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gateway {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="serve three demo agents with a synthetic market feed (embedded SQLite)")
    demo.add_argument("--db", type=Path, default=Path("gateway-demo.db"))
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    demo.add_argument("--loop", choices=LOOPS, help=LOOP_HELP)
    _log_options(demo)
    serve = commands.add_parser("serve", help="serve the gateway from a config file")
    serve.add_argument("--config", type=Path,
                       help="the TOML config (else GATEWAY_CONFIG; with neither, a minimal "
                            "gateway with no agent and fresh tokens, printed)")
    serve.add_argument("--db", help="event log: a SQLite file, or a postgresql:// URL that "
                                    "several gateway processes may serve together (default: "
                                    "the config's store.url or store.path)")
    serve.add_argument("--advertise", metavar="URL",
                       help="with PostgreSQL: the URL the other processes reach this one at "
                            "(default: the config's cluster.advertise, else where it is bound)")
    serve.add_argument("--host", help="default: the config's server.host (127.0.0.1)")
    serve.add_argument("--port", type=int, help="default: the config's server.port")
    serve.add_argument("--loop", choices=LOOPS, help=LOOP_HELP)
    _log_options(serve)
    scenario = commands.add_parser(
        "scenario", help="run a short scripted scenario through the engine and print it")
    scenario.add_argument("--db", type=Path, default=Path("gateway-scenario.db"))
    scenario.add_argument("--pace", type=float, default=1.0, help="time scale of the scenario")
    mig = commands.add_parser("migrate", help="create or upgrade the event log schema")
    mig.add_argument("--db", required=True, help="a SQLite path, or a postgresql:// URL")
    _debugger_commands(commands)
    _postgres_commands(commands)
    commands.add_parser("schema", help="print the JSON Schema of every wire frame")
    kill = commands.add_parser(
        "kill", help="desk kill: halt every agent in the token's scope of a running gateway "
                     "and cancel their open orders (one recorded operator command)")
    kill.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8000")
    kill.add_argument("--token-env", required=True, metavar="VAR",
                      help="the environment variable holding a control or admin token")
    kill.add_argument("--reason", help="recorded with the kill")
    kill.add_argument("--list", action="store_true",
                      help="only name the agents a kill would halt")
    kill.add_argument("--flatten", action="store_true",
                      help="also flatten positions: after the stops, one closing market "
                           "order per symbol each agent holds")
    bridge = commands.add_parser(
        "mcp", help="a stdio MCP server for desktop MCP clients, forwarding to a gateway's "
                    "/mcp (docs/mcp.md)")
    bridge.add_argument("--url", required=True,
                        help="the gateway's MCP endpoint, e.g. http://127.0.0.1:8000/mcp")
    bridge.add_argument("--token-env", required=True, metavar="VAR",
                        help="the environment variable holding the bearer token")
    args = parser.parse_args(argv)
    if args.command == "kill":
        return _kill(args)
    if args.command in DEBUGGER_COMMANDS:
        return _debug(args)

    if args.command == "scenario":
        from gateway.tools.demo import run_demo

        return asyncio.run(run_demo(args.db, args.pace))
    if args.command in ("demo", "serve"):
        return _serve(args)
    if args.command == "migrate":
        from store import migrate

        asyncio.run(migrate(args.db))
        print(f"migrated {args.db}")
        return 0
    if args.command == "postgres":
        return _postgres(args)
    if args.command == "mcp":
        return _mcp_bridge(args.url, args.token_env)
    if args.command == "schema":
        from gateway.edge.protocol import json_schemas

        print(json.dumps(json_schemas(), indent=2))
        return 0
    raise AssertionError(f"unhandled command {args.command}")


def _mcp_bridge(url: str, variable: str) -> int:
    """``gateway mcp``: stdout carries MCP messages only (logs go to stderr)."""
    token = os.environ.get(variable)
    if not token:
        print(f"gateway mcp: environment variable {variable} is not set (or is empty)",
              file=sys.stderr)
        return 2
    from gateway.edge.mcp import bridge
    from gateway.llm.mcp_tools import error_text

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        asyncio.run(bridge(url, token))
    except Exception as error:  # (the gateway unreachable, or refusing the token)
        print(f"gateway mcp: {url}: {error_text(error)}", file=sys.stderr)
        return 1
    return 0


KNOWN_VARIABLES = frozenset({
    "GATEWAY_CONFIG", "GATEWAY_DB", "DATABASE_URL", "GATEWAY_HOST", "GATEWAY_PORT",
    "GATEWAY_ADVERTISE", "GATEWAY_EVENT_LOOP", "GATEWAY_LOG_LEVEL", "GATEWAY_LOG_FORMAT",
    "GATEWAY_TEST_LOOP", "GATEWAY_LONG_CLUSTER_TESTS"})
"""The environment's settings (and the test suite's own); another ``GATEWAY_*`` variable
is warned about once at start."""


def _kept_tokens(args: argparse.Namespace, env: Mapping[str, str]) -> Path | None:
    """Where a config-less start keeps its fresh tokens, beside its log: the same tokens at
    the next start, so a restart does not log open panels out."""
    db = args.db if args.command == "demo" else (args.db or env.get("GATEWAY_DB"))
    if db is None:
        db = "gateway.db"
    if "://" in str(db):
        return None  # (a PostgreSQL log: nowhere beside it)
    return Path(f"{db}.tokens.json")


def _env_choice(variable: str, allowed: tuple[str, ...]) -> str | None:
    from gateway.base.logs import SettingError

    value = os.environ.get(variable) or None
    if value is not None and value not in allowed:
        raise SettingError(f"{variable}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _env_port(default: int) -> int:
    from gateway.base.logs import SettingError

    value = os.environ.get("GATEWAY_PORT") or None
    if value is None:
        return default
    if not value.isdigit() or int(value) > 65_535:
        raise SettingError(f"GATEWAY_PORT: {value!r} is not a port (0 to 65535)")
    return int(value)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trading-agent-gateway")
    except PackageNotFoundError:  # (run from a checkout that was never installed)
        return "unknown"


def _log_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--log-level", help="debug, info, warning (default) or error "
                                             "(else GATEWAY_LOG_LEVEL)")
    command.add_argument("--log-format", help="text (default: time, level, logger, message) "
                                              "or json (one object a line; else "
                                              "GATEWAY_LOG_FORMAT)")


LOOPS = ("auto", "uvloop", "asyncio")
LOOP_HELP = ("the event loop: auto (uvloop where installed, as on Linux), uvloop or asyncio "
             "(default: the config's server.event_loop)")
LOG_HELP = "the event log: a SQLite file, or a postgresql:// URL"


def _log(text: str) -> object:
    from gateway.tools.logs import log_location

    return log_location(text)


DEBUGGER_COMMANDS = ("replay", "timeline", "verify", "whatif", "export", "import",
                     "quarantine")
POINT_HELP = "a log position (integer) or a time (ISO 8601, UTC unless an offset is given)"


def _point(text: str) -> object:
    from gateway.tools.logs import parse_point

    try:
        return parse_point(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return int(text)


def _debugger_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rep = commands.add_parser(
        "replay", help="every agent's state (or one agent's, in full) at a point of the log")
    rep.add_argument("db", type=_log, help=LOG_HELP)
    rep.add_argument("--agent", help="show this agent in full")
    rep.add_argument("--at", type=_point, metavar="POSITION|TIME",
                     help=f"where to stop: {POINT_HELP} (default: the end)")
    line = commands.add_parser(
        "timeline", help="each input of an agent and the decisions it caused, with reasons")
    line.add_argument("db", type=_log, help=LOG_HELP)
    line.add_argument("--agent", required=True)
    line.add_argument("--from", type=_point, metavar="POSITION|TIME", help=POINT_HELP)
    line.add_argument("--to", type=_point, metavar="POSITION|TIME", help=POINT_HELP)
    line.add_argument("--config", type=Path,
                      help="a gateway config whose [market] ticks prices are rounded to "
                           "(default: every symbol to 0.01)")
    ver = commands.add_parser(
        "verify", help="re-decide every recorded input and compare (exit 1 at a divergence)")
    ver.add_argument("db", type=_log, help=LOG_HELP)
    ver.add_argument("--jobs", type=_positive, metavar="N",
                     help="processes re-deciding streams side by side (default: one per CPU "
                          "for a large log)")
    what = commands.add_parser(
        "whatif", help="re-run the recorded inputs under another config and compare")
    what.add_argument("db", type=_log, help=LOG_HELP)
    what.add_argument("--config", type=Path, required=True,
                      help="a gateway config whose [[agents]] tables give the other policy")
    exp = commands.add_parser("export", help="write the whole log as JSON Lines")
    exp.add_argument("db", type=_log, help=LOG_HELP)
    exp.add_argument("--format", choices=["jsonl"], default="jsonl")
    exp.add_argument("--out", type=Path, help="file to write (default: stdout)")
    imp = commands.add_parser(
        "import", help="read a JSON Lines export into a log (new, or ending just before it)")
    imp.add_argument("db", type=_log, help=LOG_HELP)
    imp.add_argument("file", type=Path, help="the export (- for stdin)")
    quarantine = commands.add_parser(
        "quarantine", help="set aside an event that stops the log from starting (recorded "
                           "as an event; nothing is deleted); with no gateway serving it")
    quarantine.add_argument("db", type=_log, help=LOG_HELP)
    quarantine.add_argument("--position", type=_positive, required=True,
                            help="the position a start, replay or verify named")
    quarantine.add_argument("--reason", default="", help="why, in words (recorded)")


def _postgres_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pg = commands.add_parser(
        "postgres", help="start or stop a local PostgreSQL server for development")
    actions = pg.add_subparsers(dest="action", required=True)
    start = actions.add_parser(
        "start", help="start a server in DIR (made the first time); print its URL")
    start.add_argument("--dir", type=Path, required=True)
    start.add_argument("--port", type=int, help="default: a free port")
    stop = actions.add_parser("stop", help="stop the server running in DIR")
    stop.add_argument("--dir", type=Path, required=True)


def _postgres(args: argparse.Namespace) -> int:
    """``gateway postgres start|stop``: a local server from the installed binaries."""
    from store import pg_server

    try:
        if args.action == "stop":
            pg_server.stop(args.dir)
            return 0
        server = pg_server.start(args.dir, args.port)
        print(asyncio.run(pg_server.ensure_database(server.url, "gateway")))
        return 0
    except pg_server.PostgresUnavailable as error:
        print(f"gateway postgres: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
