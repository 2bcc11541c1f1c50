"""The replay debugger: time travel, timelines, verify, what-if, export and import.

Every command reads the log through the store (paged, the next page read while the last one
is decoded), decodes it and hands it to `lanes` (`replay`, `Verifier`, `whatif`): the code the
gateway itself runs. Tables go to stdout; a progress bar goes to stderr while a command works
(on a terminal only); each command ends with a one-line summary. Bad input raises
`DebugError` (the CLI prints it and exits 2): a path that is not an event log, an unknown
agent, a position past the end of the log, a config that does not validate.
"""

from __future__ import annotations

import asyncio
import getpass
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from gateway.base.quarantine import LogReader, UnreadableEvent, log_reader, set_aside, stand_ins
from gateway.tools.logs import (
    PAGE,
    DebugError,
    Log,
    Out,
    Point,
    _limit,
    _ms,
    _writable_log,
    clock,
    fold_until,
    open_log,
    pages,
    resolve,
    shown,
    table,
)
from gateway.tools.progress import Progress, summary
from gateway.tools.transfer import BadExport, event_line, header, parse
from lanes import AgentState, status
from lanes.codec import encode
from lanes.evolve import fold as fold_events
from lanes.handlers import IllegalTransition
from lanes.streams import QUARANTINE_STREAM, is_agent_stream
from store import DuplicateEventError, NotAnEventLog, RecordedEvent, RestoreError, check_event_log

# -------------------------------------------------------------------------------- replay


async def replay_command(db: Log, agent: str | None, at: Point | None, out: Out) -> int:
    """Print every agent's state (or one agent's, in detail) at a point of the log."""
    store = await open_log(db)
    try:
        last = await store.last_position()
        position = last if at is None else await resolve(store, at, last, "--at")
        folded = await fold_until(store, position, "replay")
        recorded_at = (await store.read(position - 1, 1))[0].recorded_at if position else None
    finally:
        await store.close()
    states = folded.fold.states
    where = f"position {position} of {last}"
    if recorded_at is not None:
        where += f", recorded {clock(recorded_at)} UTC"
    if agent is not None:
        state = states.get(agent)
        if state is None:
            raise DebugError(_no_agent(agent, db, states, position))
        for line in agent_report(state, where):
            out(line)
        out(f"\n{folded.summary('replay')}")
        return 0
    if not states:
        out(f"{shown(db)}: no agent events up to {where}")
        return 0
    out(f"{len(states)} agents at {where}\n")
    for line in agents_table(states.values()):
        out(line)
    out("")
    for line in counters_table(states.values()):
        out(line)
    for state in sorted(states.values(), key=lambda s: s.agent_id):
        if state.pending:
            out(f"\n{state.agent_id}: {len(state.pending)} pending")
            for line in pending_table(state):
                out("  " + line)
    out(f"\n{folded.summary('replay')}")
    return 0


def _no_agent(agent: str, db: Log, states: Mapping[str, AgentState], position: int) -> str:
    known = ", ".join(sorted(states)) or "none"
    return f"no agent {agent!r} in {shown(db)} up to position {position} (agents: {known})"


def agents_table(states: Iterable[AgentState]) -> list[str]:
    """One row per agent: trading, lane, queue, active run, budgets."""
    rows = []
    for state in sorted(states, key=lambda s: s.agent_id):
        view = status(state, state.now)
        run = view.active_run
        budgets = state.config.budgets
        rows.append([
            state.agent_id, view.trading.value, view.mode.value, view.pending,
            _ms(view.oldest_pending_age_ms),
            None if run is None else f"{run.run_id} ({_ms(run.duration_ms)})",
            _limit(view.runs_last_hour, budgets.max_runs_per_hour),
            _limit(view.runs_last_day, budgets.max_runs_per_day),
            None if view.suppressed_until is None else clock(view.suppressed_until)[11:],
            view.held, view.open_orders,
        ])
    return table(["agent", "trading", "mode", "pending", "oldest", "active run", "runs/h",
                  "runs/day", "suppressed to", "held", "orders"], rows, "<<<>><>><<>")


COUNTERS = ("received", "accepted", "runs", "completed", "failed", "aborts", "steers",
            "dedupes", "drops", "summarized", "rejected", "suppressions", "orders_accepted")


def counters_table(states: Iterable[AgentState]) -> list[str]:
    """One row per agent: what happened to its requests so far."""
    rows = [[state.agent_id, *(getattr(state.counters, name) for name in COUNTERS)]
            for state in sorted(states, key=lambda s: s.agent_id)]
    names = [name.replace("orders_accepted", "orders") for name in COUNTERS]
    return table(["agent", *names], rows, "<" + ">" * len(COUNTERS))


def pending_table(state: AgentState) -> list[str]:
    """The pending list in order, with ages at the state's time."""
    rows = [[n, p.request.request_id, p.request.kind.value, p.request.priority.value,
             p.mode.value, _ms(max(0, state.now - p.at)), p.request.dedupe_key]
            for n, p in enumerate(state.pending, start=1)]
    return table(["#", "request", "kind", "priority", "mode", "waiting", "dedupe key"], rows,
                 "><<<<><")


def agent_report(state: AgentState, where: str) -> list[str]:
    """One agent in full: state, active run, budgets, pending list, orders, counters."""
    config = state.config
    budgets = config.budgets
    view = status(state, state.now)
    lines = [f"{state.agent_id} at {where} (stream version {state.version}, "
             f"agent time {clock(state.now)})", ""]
    facts: list[tuple[str, object]] = [
        ("trading", view.trading.value),
        ("lane", view.lane.value),
        ("mode", f"{config.mode.value}, cap {config.cap}, drop policy "
                 f"{config.drop_policy.value}, debounce {config.debounce_ms}ms"),
        ("held", view.held),
    ]
    if state.collect_due is not None:
        facts.append(("collect window", f"closes {clock(state.collect_due)}"))
    if state.summary is not None:
        facts.append(("summary", f"{state.summary.count} requests folded for the next run"))
    lines += [f"  {name:<16}{'-' if value is None else value}" for name, value in facts]
    run = state.active
    lines.append("")
    if run is None:
        lines.append("active run: none")
    else:
        lines += [
            f"active run: {run.run_id}",
            f"  {'started':<16}{clock(run.started_at)} ({_ms(max(0, state.now - run.started_at))}"
            " ago)",
            f"  {'deadline':<16}{clock(run.deadline)}",
            f"  {'requests':<16}{', '.join(p.request.request_id for p in run.requests)}",
            f"  {'steerable':<16}{'yes' if run.steerable else 'no'} ({run.steers} steers)",
        ]
    cooling = view.cooldown_remaining_ms
    lines += ["", "budgets:", *("  " + line for line in table(
        ["budget", "now", "limit", "until"],
        [["runs last hour", view.runs_last_hour, budgets.max_runs_per_hour, None],
         ["runs last day", view.runs_last_day, budgets.max_runs_per_day, None],
         ["no-trade cooldown", _ms(cooling) if cooling else None,
          _ms(budgets.no_trade_cooldown_ms) if budgets.no_trade_cooldown_ms else "off",
          clock(state.cooldown_until) if cooling else None],
         ["runs suppressed", "yes" if state.suppressed else "no",
          None if state.suppressed is None else state.suppressed[0],
          None if state.suppressed is None else clock(state.suppressed[1])]],
        "<>><"))]
    lines += ["", f"pending: {len(state.pending)}"]
    if state.pending:
        lines += ["  " + line for line in pending_table(state)]
    if state.orders:
        lines += ["", f"open orders: {len(state.orders)}"]
        lines += ["  " + line for line in table(
            ["order", "symbol", "side", "qty", "filled", "cancel asked"],
            [[o.order_id, o.intent.symbol, o.intent.side, f"{o.intent.qty:g}",
              f"{o.filled_qty:g}", "yes" if o.cancel_requested else "no"]
             for o in state.orders.values()], "<<<>><")]
    cells = [cell for pair in vars_of(state.counters).items() for cell in pair]
    per_row = 4  # counters a line
    cells += [""] * (-len(cells) % (2 * per_row))
    rows = [cells[i:i + 2 * per_row] for i in range(0, len(cells), 2 * per_row)]
    lines += ["", "counters:"]
    headless = table([""] * (2 * per_row), rows, "<>" * per_row)[2:]
    lines += ["  " + line for line in headless]
    return lines


def vars_of(obj: Any) -> dict[str, Any]:
    """A slots dataclass as a dict, in field order."""
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


# ------------------------------------------------------------------------ export, import


async def export_command(db: Log, sink: IO[str], out: Out) -> int:
    """Write the whole log to ``sink`` as JSON Lines (`gateway.tools.transfer`)."""
    store = await open_log(db)
    try:
        last = await store.last_position()
        sink.write(header(last, last) + "\n")
        with Progress("export", last) as bar:
            async for page in pages(store, 0, last):
                sink.write("".join(event_line(record) + "\n" for record in page))
                bar.advance(len(page))
    finally:
        await store.close()
    sink.flush()
    out(f"export: {summary(last, 'events', bar.elapsed)}")
    return 0


def read_export(source: Iterable[str]) -> list[RecordedEvent]:
    """Every event of an export, each checked (`gateway.tools.transfer.parse`)."""
    try:
        with Progress("checking", None) as bar:
            records = []
            for record in parse(source):
                records.append(record)
                bar.advance()
            return records
    except BadExport as error:
        raise DebugError(f"not imported: {error}") from None


# ---------------------------------------------------------------------------- quarantine


async def quarantine_command(db: Log, position: int, reason: str, out: Out) -> int:
    """Set aside the event at ``position`` of an agent stream (`gateway.base.quarantine`), so the
    log starts, replays and verifies again; refused while a gateway serves the log."""
    try:
        if not isinstance(db, str):
            await check_event_log(db)
    except NotAnEventLog as error:
        raise DebugError(str(error)) from None
    try:
        store = await _writable_log(db)
    except DebugError as error:
        raise DebugError(f"{error}; a log is set aside with no gateway serving it") from None
    try:
        found = await store.read(max(0, position - 1), 1) if position >= 1 else []
        if not found or found[0].position != position:
            raise DebugError(f"no event at position {position} in {shown(db)}")
        record = found[0]
        if not is_agent_stream(record.stream):
            raise DebugError(f"the event at position {position} is in {record.stream!r}: "
                             "only events of agent streams can be set aside")
        reader = await log_reader(store)
        if position in reader.replacements:
            raise DebugError(f"the event at position {position} is set aside already")
        readable = True
        try:
            reader.decode(record)
        except UnreadableEvent:
            readable = False
        stream = await store.read_stream(record.stream)
        why = reason or ("it cannot be read by this version" if not readable
                         else "set aside by an operator")
        chosen = stand_ins(stream, position, why)
        who = getpass.getuser()
        now = int(datetime.now(UTC).timestamp() * 1000)
        recorded = await set_aside(store, chosen, why, who, now, f"quarantine-{uuid.uuid4()}")
        after = LogReader({**reader.replacements, **{
            item.record.position: encode(item.event) for item in chosen}})
        try:
            fold_events(AgentState(agent_id=record.stream), [after.decode(r) for r in stream])
            problem = None
        except (UnreadableEvent, IllegalTransition) as error:
            problem = str(error)
    finally:
        await store.close()
    kind = "readable" if readable else "unreadable"
    out(f"quarantine: set aside the {kind} {record.type} at position {position} of "
        f"{record.stream!r}, recorded at position {recorded.position} of "
        f"{QUARANTINE_STREAM!r} by {who}:")
    for item in chosen:
        out(f"  {item.record.position:>8}  {item.record.type:<22} -> "
            f"{type(item.event).__name__}")
    if problem is not None:
        out(f"quarantine: the stream still does not fold: {problem}; set that aside too, or "
            "restore the log from a backup")
        return 1
    out(f"quarantine: the stream folds again; 'gateway verify {shown(db)}' checks the rest")
    return 0


async def import_command(db: Log, records: Sequence[RecordedEvent], out: Out) -> int:
    """Write checked events into the log at ``db`` (created if missing): it must be empty,
    or end just before them. Every event was checked before (`read_export`), so what can
    still fail is the database itself: the events are written a page per transaction, and
    if that fails midway (disk full) the log ends at the last page written (delete it and
    import again)."""
    if not isinstance(db, str):
        try:
            if await asyncio.to_thread(db.exists):
                await check_event_log(db)
            elif not await asyncio.to_thread(db.parent.is_dir):
                raise DebugError(f"cannot create {db}: no directory {db.parent}")
        except NotAnEventLog as error:
            raise DebugError(str(error)) from None
    store = await _writable_log(db)
    try:
        with Progress("import", len(records)) as bar:
            for start in range(0, len(records), PAGE):
                chunk = records[start:start + PAGE]
                await store.restore(chunk)
                bar.advance(len(chunk))
        last = await store.last_position()
    except (RestoreError, DuplicateEventError) as error:
        raise DebugError(f"not imported: {error}") from None
    finally:
        await store.close()
    streams = len({r.stream for r in records})
    out(f"import: {len(records):,} events of {streams} streams into {shown(db)}, which now ends at "
        f"position {last}; {summary(len(records), 'events', bar.elapsed)}")
    return 0
