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
import multiprocessing
import os
import tomllib
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from gateway.base.process import gc_paused
from gateway.base.quarantine import LogReader, UnreadableEvent, log_reader, set_aside, stand_ins
from gateway.config import ConfigError, validate_config
from gateway.runtime.snapshots import load_latest
from gateway.tools.describe import describe
from gateway.tools.progress import Progress, summary
from gateway.tools.transfer import BadExport, event_line, header, parse
from lanes import AgentConfig, AgentState, status
from lanes.codec import encode
from lanes.events import (
    AgentCallDispatched,
    AgentCallRejected,
    BrokerReportIgnored,
    ConfigApplied,
    ControlApplied,
    Event,
    FallbackApplied,
    OperatorApplied,
    OperatorRejected,
    OrderAccepted,
    OrderCancelRequested,
    OrderClosed,
    OrderFilled,
    OrderRejected,
    RequestDeduped,
    RequestDropped,
    RequestQueued,
    RequestRejected,
    RequestRepeated,
    RequestSummarized,
    RunAborted,
    RunCompleted,
    RunFailed,
    RunResultIgnored,
    RunsHeld,
    RunsResumed,
    RunsSuppressed,
    RunStarted,
    RunSteered,
    RunsUnheld,
    SteerabilityChanged,
    TimerElapsed,
    TradingState,
    is_input,
)
from lanes.evolve import fold as fold_events
from lanes.gate import decode_gate_event, verify_gate
from lanes.handlers import IllegalTransition
from lanes.replay import Divergence, Entry, LogFold, Verifier, first, steps
from lanes.streams import PROVIDER_PREFIX, QUARANTINE_STREAM, is_agent_stream
from lanes.whatif import AgentWhatIf, Tally, whatif
from store import (
    DuplicateEventError,
    GroupCommitStore,
    LogInUse,
    NotAnEventLog,
    PostgresEventStore,
    RecordedEvent,
    RestoreError,
    SqliteEventStore,
    StoreError,
    check_event_log,
)
from store.engine import database_url, is_postgres

PAGE = 10_000
"""Events per read."""
Out = Callable[[str], None]
Log = Path | str
"""Where an event log is: a SQLite file, or a ``postgresql://`` URL."""


def log_location(text: str) -> Log:
    """A log named on the command line: a ``postgresql://`` URL as it is, else a path."""
    return text if is_postgres(database_url(text)) else Path(text)


def shown(db: Log) -> str:
    """A log's location for people (a URL without its password)."""
    if isinstance(db, str):
        return database_url(db).render_as_string(hide_password=True)
    return str(db)


class DebugError(Exception):
    """Bad input from the person at the terminal; the message says what to do."""


# ----------------------------------------------------------------------- points in the log


@dataclass(frozen=True, slots=True)
class Point:
    """A place in the log as given on the command line: a position, or a time."""

    position: int | None = None
    time_ms: int | None = None


def parse_point(text: str) -> Point:
    """A position (an integer >= 0) or a time (ISO 8601; UTC when no offset is given)."""
    text = text.strip()
    if text.isdigit():
        return Point(position=int(text))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a log position (an integer >= 0) nor a time "
            "(ISO 8601, such as 2026-02-17T03:10:05Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Point(time_ms=int(moment.timestamp() * 1000))


def clock(ms: int) -> str:
    """A time of the log, for people: ``2026-02-17 03:10:05.120``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


async def resolve(store: GroupCommitStore, point: Point, last: int, option: str) -> int:
    """The log position a `Point` names: a position as given (it must exist), a time as the
    last event recorded at or before it (0: before the first). Times are found by bisection:
    recorded times go forward with positions (if the store's clock was ever set back, the
    answer is one of the events recorded around that time)."""
    if point.position is not None:
        if point.position > last:
            raise DebugError(f"{option} {point.position}: the log ends at position {last}")
        return point.position
    assert point.time_ms is not None
    low, high = 0, last  # the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        [record] = await store.read(middle - 1, 1)
        if record.recorded_at <= point.time_ms:
            low = middle
        else:
            high = middle - 1
    return low


# ------------------------------------------------------------------------------- reading


async def open_log(db: Log) -> GroupCommitStore:
    """The store of an existing event log (migrated to this code's schema if older)."""
    store: GroupCommitStore
    if isinstance(db, str):
        store = PostgresEventStore(db)
    else:
        try:
            await check_event_log(db)
        except NotAnEventLog as error:
            raise DebugError(str(error)) from None
        store = SqliteEventStore(db)
    try:
        await store.open()
    except (StoreError, OSError) as error:
        raise DebugError(f"cannot open {shown(db)}: {error}") from None
    return store


async def _writable_log(db: Log) -> GroupCommitStore:
    """The store of a log to change with no gateway serving it (`DebugError` if one does:
    a SQLite file is locked by its gateway, a PostgreSQL log has live members)."""
    if isinstance(db, str):
        store = await open_log(db)
        if (await store.leases()).members:
            await store.close()
            raise DebugError(f"{shown(db)} is served by gateway processes now: stop them "
                             "first")
        return store
    sqlite = SqliteEventStore(db, exclusive=True)  # never under a gateway serving it
    try:
        await sqlite.open()
    except LogInUse as error:
        raise DebugError(str(error)) from None
    return sqlite


async def pages(store: GroupCommitStore, after: int, upto: int) -> AsyncIterator[
        list[RecordedEvent]]:
    """The events in (after, upto], a page at a time; the next page is read (in the
    driver's thread) while the caller works on the last one."""
    cursor = after

    async def read(cursor: int) -> list[RecordedEvent]:
        return await store.read(cursor, min(PAGE, upto - cursor)) if cursor < upto else []

    ahead = asyncio.ensure_future(read(cursor))
    try:
        while True:
            page = await ahead
            if not page:
                return
            cursor = page[-1].position
            ahead = asyncio.ensure_future(read(cursor))
            yield page
    finally:
        ahead.cancel()




@dataclass(frozen=True, slots=True)
class Folded:
    """The fold of the log up to a position, and how it was made."""

    fold: LogFold
    snapshot: int | None
    """The position of the snapshot it started from, if any."""
    events: int
    """Events read after it."""
    seconds: float

    def summary(self, command: str) -> str:
        """``replay: from the snapshot at 990,000, folded 1,234 events in 0.31 s, ...``."""
        start = "" if self.snapshot is None else f"from the snapshot at {self.snapshot:,}, "
        return f"{command}: {start}folded {summary(self.events, 'events', self.seconds)}"


async def fold_until(store: GroupCommitStore, position: int, label: str) -> Folded:
    """The fold of the log up to ``position``: from the newest usable snapshot at or below
    it, then the events after it."""
    reader = await log_reader(store)
    with gc_paused(), Progress(label, None) as bar:
        loaded = await load_latest(store, upto=position)
        log_fold = loaded.fold
        bar.total = position - log_fold.position
        async for page in pages(store, log_fold.position, position):
            log_fold.add(reader.entries(page))
            bar.advance(len(page))
    log_fold.position = position
    snapshot = None if loaded.snapshot is None else loaded.snapshot.position
    return Folded(log_fold, snapshot, bar.done, bar.elapsed)


# -------------------------------------------------------------------------------- tables


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """Rows under headers in columns; ``align`` gives each column ``<`` or ``>`` (default
    ``<``). Cells are shown with `str`, None as ``-``."""
    cells = [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    sides = align.ljust(len(headers), "<")

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if side == ">" else v.ljust(w)
                 for v, w, side in zip(values, widths, sides, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in cells)]


def _ms(value: int | None) -> str | None:
    """A duration for people: ``850ms``, ``12.5s``, ``3h12m``, ``40d``."""
    if value is None:
        return None
    if value < 10_000:
        return f"{value}ms"
    if value < 600_000:
        return f"{value / 1000:.1f}s"
    minutes = value // 60_000
    if minutes < 48 * 60:
        return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"
    return f"{minutes // (24 * 60)}d"


def _limit(used: int, limit: int | None) -> str:
    return f"{used}/{limit}" if limit is not None else f"{used}/-"


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


# ------------------------------------------------------------------------------ timeline


async def timeline_command(db: Log, agent: str, start: Point | None, end: Point | None,
                           out: Out) -> int:
    """Print each input of one agent and the decisions it caused, with their reasons."""
    store = await open_log(db)
    try:
        last = await store.last_position()
        first = 0 if start is None else await resolve(store, start, last, "--from")
        upto = last if end is None else await resolve(store, end, last, "--to")
        records = await store.read_stream(agent)
        if not records:
            agents = sorted(s for s in await store.stream_versions() if is_agent_stream(s))
            raise DebugError(f"no agent {agent!r} in {shown(db)} "
                             f"(agents: {', '.join(agents) or 'none'})")
        reader = await log_reader(store)
    finally:
        await store.close()
    entries = reader.entries(records)
    printed = inputs = 0
    out(f"timeline of {agent}, positions {first}..{upto} (times are the inputs', UTC)")
    out(f"{'position':>8}  {'time':<23}  input, then -> each decision")
    for group in story(entries):
        if not first <= group.position <= upto:
            continue
        inputs += 1
        printed += 1 + len(group.decisions)
        out(f"{group.position:>8}  {clock(group.at):<23}  {group.text}")
        for said in group.decisions:
            out(f"{said.position:>8}  {'':<23}    -> {said.text}")
    out(f"\n{inputs} inputs and {printed - inputs} decisions of {agent} "
        f"({len(entries)} events in its stream)")
    return 0


JUMP_KINDS = ("stop", "drop", "suppression")
"""The kinds of decision a person jumps between in time travel."""
JUMP_TYPES: dict[str, frozenset[str]] = {
    "stop": frozenset({"ControlApplied"}),
    "drop": frozenset({"RequestDropped", "RequestSummarized"}),
    "suppression": frozenset({"RunsSuppressed"}),
}
"""The event types that can be of each jump kind (`kinds_of` says which are)."""


def kinds_of(event: Event) -> tuple[str, ...]:
    """What a decision is, for markers and jumps: ``stop`` (a control that halts),
    ``drop`` (a request dropped or folded into a summary), ``suppression`` (runs held back
    by a budget), ``hold`` (runs held for the provider's spend), ``run``, ``order``,
    ``error`` (a run failed or aborted, a request or order refused), ``control``; none for
    the rest."""
    match event:
        case ControlApplied(to_state=TradingState.HALTED):
            return ("stop",)
        case ControlApplied() | OperatorApplied() | RunsUnheld() | RunsResumed():
            return ("control",)
        case RequestDropped() | RequestSummarized():
            return ("drop",)
        case RunsSuppressed():
            return ("suppression",)
        case RunsHeld():
            return ("hold",)
        case RunStarted() | RunCompleted() | RunSteered():
            return ("run",)
        case OrderAccepted() | OrderFilled() | OrderClosed() | OrderCancelRequested():
            return ("order",)
        case RunFailed() | RunAborted() | RequestRejected() | OrderRejected() \
                | OperatorRejected() | AgentCallRejected():
            return ("error",)
    return ()


@dataclass(frozen=True, slots=True)
class Said:
    """One decision of a `Group`, worded as the timeline says it (`explain`)."""

    position: int
    type: str
    text: str
    kinds: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """One input of an agent's stream and the decisions it caused, worded as the timeline
    command prints them: the input by `what_came_in`, each decision by `explain`."""

    position: int
    at: int
    """The input's time (the agent's clock)."""
    type: str
    text: str
    decisions: tuple[Said, ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of its decisions (`kinds_of`), each once, in order."""
        return tuple(dict.fromkeys(k for said in self.decisions for k in said.kinds))


def story(entries: Iterable[Entry]) -> Iterator[Group]:
    """One agent's stream (in position order) as groups: the story the timeline tells."""
    for step in steps(entries):
        event = step.input.event
        assert is_input(event)  # (a step starts with its input)
        yield Group(step.input.position, event.at, type(event).__name__, what_came_in(event),
                    tuple(Said(d.position, type(d.event).__name__, explain(d.event),
                               kinds_of(d.event)) for d in step.decisions))


def what_came_in(event: Event) -> str:
    """An input, in a few words."""
    if isinstance(event, TimerElapsed):
        return "timer"
    name = type(event).__name__
    return f"{name} {describe(event)}".rstrip()


def explain(event: Event) -> str:
    """A decision with its reason, as a person would say it."""
    match event:
        case RequestQueued(mode=mode):
            return f"queued ({mode.value})"
        case RequestDeduped(duplicate_of=original, key=key):
            return f"deduped: duplicate of {original} ({key})"
        case RequestRepeated(first_decision=first):
            return f"repeated requestId: its first decision ({first}) stands"
        case RequestRejected(reason=reason):
            return f"rejected: {reason}"
        case RequestDropped(request_id=rid, reason=reason):
            return f"dropped {rid}: {reason}"
        case RequestSummarized(request_id=rid, reason=reason):
            return f"summarized {rid}: {reason}"
        case FallbackApplied(reason=reason):
            return f"fallback: {reason}"
        case ControlApplied(action=action, from_state=before, to_state=after):
            return f"control {action.value}: {before.value} -> {after.value}"
        case RunStarted(run_id=run_id, request_ids=ids, summary=folded):
            extra = f" and a summary of {folded.count} dropped" if folded else ""
            return f"run {run_id} started with {', '.join(ids)}{extra}"
        case RunSteered(run_id=run_id):
            return f"steered into {run_id}"
        case SteerabilityChanged(run_id=run_id, steerable=flag):
            return f"{run_id} {'can' if flag else 'can no longer'} take steers"
        case RunCompleted(run_id=run_id, outcome=outcome, usage=usage):
            return (f"run {run_id} completed: {outcome.value} "
                    f"({usage.input_tokens}+{usage.output_tokens} tokens)")
        case RunFailed(run_id=run_id, error=error):
            return f"run {run_id} failed: {error}"
        case RunAborted(run_id=run_id, reason=reason, requeued=requeued, by=by):
            who = f" by {by}" if by else ""
            return f"run {run_id} aborted: {reason.value}{who}{', requests requeued' * requeued}"
        case RunResultIgnored(reason=reason):
            return f"result ignored: {reason}"
        case RunsSuppressed(until=until, detail=detail):
            return f"suppressed: {detail} (runs resume {clock(until)})"
        case RunsResumed():
            return "runs resumed: the budget allows them again"
        case RunsHeld(provider=provider, reason=reason):
            return f"runs held until resume: {provider} refused for spend ({reason})"
        case RunsUnheld(by=by):
            return f"hold lifted by {by}"
        case OrderAccepted() | OrderRejected() | OrderCancelRequested(by=_) | OrderFilled() \
                | OrderClosed() | BrokerReportIgnored():
            return f"{type(event).__name__} {_order(event)}"
        case AgentCallDispatched() | AgentCallRejected():
            return f"{type(event).__name__} {describe(event)}"
        case ConfigApplied(config=config, principal=who):
            return f"config applied by {who}: {config.mode.value}, cap {config.cap}"
        case OperatorApplied(action=action, principal=who, detail=detail):
            return f"operator {action.value} by {who}{': ' + detail if detail else ''}"
        case OperatorRejected(action=action, reason=reason):
            return f"operator {action.value} refused: {reason}"
    return f"{type(event).__name__} {describe(event)}".rstrip()


def _order(event: Event) -> str:
    match event:
        case OrderCancelRequested(order_id=oid, by=by):
            return f"{oid} (cancel asked by {by})"
        case OrderFilled(order_id=oid, qty=qty, price=price):
            return f"{oid}: {qty:g} at {price}"
        case OrderClosed(order_id=oid, status=closed, reason=reason):
            return f"{oid}: {closed}{' (' + reason + ')' if reason else ''}"
        case BrokerReportIgnored(reason=reason):
            return reason
    return describe(event)


# -------------------------------------------------------------------------------- verify


PARALLEL_FROM = 200_000
"""Agent events from which `verify_command` re-decides streams in several processes."""


@dataclass(frozen=True, slots=True)
class Verified:
    """What re-deciding some agent streams found."""

    events: int
    inputs: int
    divergence: Divergence | None
    unreadable: str | None = None


async def verify_command(db: Log, out: Out, jobs: int | None = None) -> int:
    """Re-decide every recorded input (agents and provider gates); 1 at the first
    divergence, printed with its position, input, recorded and re-decided events.

    Agent streams are independent, so a large log is verified in ``jobs`` processes, each
    taking whole streams (default: one per CPU from `PARALLEL_FROM` agent events, else 1);
    the answer is the same either way (`lanes.replay.first`)."""
    store = await open_log(db)
    gates: dict[str, list[RecordedEvent]] = {}
    try:
        last = await store.last_position()
        versions = await store.stream_versions()
        agents = {s: v for s, v in versions.items() if is_agent_stream(s)}
        jobs = jobs or (os.cpu_count() or 1 if sum(agents.values()) >= PARALLEL_FROM else 1)
        with gc_paused(), Progress("verify", last) as bar:
            if jobs > 1 and len(agents) > 1:
                for stream in set(versions) - set(agents) - {QUARANTINE_STREAM}:
                    gates[stream] = await store.read_stream(stream)
                    bar.advance(len(gates[stream]))
                verified = await _verify_in_processes(db, agents, jobs, bar)
            else:
                verified = await _verify_in_order(store, last, gates, bar)
    finally:
        await store.close()
    if verified.unreadable is not None:
        out(f"verify: FAILED: {verified.unreadable}")
        return 1
    if verified.divergence is not None:
        for line in divergence_report(verified.divergence):
            out(line)
        return 1
    for stream, records in sorted(gates.items()):
        found = verify_gate(stream, (decode_gate_event(r.type, r.data) for r in records))
        if found is not None:
            record = records[min(found.index, len(records) - 1)]
            out(f"verify: DIVERGED at position {record.position} in {stream}\n"
                f"  input:      {found.input}\n  recorded:   {found.recorded}\n"
                f"  re-decided: {found.redecided}")
            return 1
    gate_events = sum(len(v) for v in gates.values())
    processes = f" in {jobs} processes" if jobs > 1 and len(agents) > 1 else ""
    out(f"verify: {verified.events:,} agent events ({verified.inputs:,} inputs re-decided) and "
        f"{gate_events:,} provider gate events ({len(gates)} gates): no divergence; "
        f"{summary(last, 'events', bar.elapsed)}{processes}")
    return 0


async def _verify_in_order(store: GroupCommitStore, last: int,
                           gates: dict[str, list[RecordedEvent]], bar: Progress) -> Verified:
    """The whole log in position order, stopping at the first divergence."""
    verifier = Verifier()
    reader = await log_reader(store)
    try:
        async for page in pages(store, 0, last):
            entries = []
            for record in page:
                if is_agent_stream(record.stream):
                    entries.append(Entry(record.position, record.stream,
                                         reader.decode(record)))
                elif record.stream.startswith(PROVIDER_PREFIX):
                    gates.setdefault(record.stream, []).append(record)
            bar.advance(len(page))
            if verifier.feed(entries) is not None:
                break
    except UnreadableEvent as error:
        return Verified(verifier.events, verifier.inputs, None, str(error))
    return Verified(verifier.events, verifier.inputs, verifier.finish())


async def _verify_in_processes(db: Log, streams: Mapping[str, int], jobs: int,
                               bar: Progress) -> Verified:
    """Whole streams re-decided in ``jobs`` processes, the results put together."""
    groups: list[list[str]] = [[] for _ in range(min(len(streams), jobs * 4))]
    sizes = [0] * len(groups)
    for stream in sorted(streams, key=lambda s: -streams[s]):  # biggest first, to the least
        smallest = sizes.index(min(sizes))
        groups[smallest].append(stream)
        sizes[smallest] += streams[stream]
    loop = asyncio.get_running_loop()
    results = []
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        waiting = [loop.run_in_executor(pool, verify_streams, db, group)
                   for group in groups if group]
        for done in asyncio.as_completed(waiting):
            result = await done
            bar.advance(result.events)
            results.append(result)
    unreadable = next((r.unreadable for r in results if r.unreadable is not None), None)
    return Verified(sum(r.events for r in results), sum(r.inputs for r in results),
                    first(r.divergence for r in results), unreadable)


def verify_streams(db: Log, streams: list[str]) -> Verified:
    """Re-decide whole agent streams of the log at ``db`` (run in a worker process)."""
    return asyncio.run(_verify_streams(db, streams))


async def _verify_streams(db: Log, streams: list[str]) -> Verified:
    store = await open_log(db)
    events = inputs = 0
    found: list[Divergence | None] = []
    try:
        reader = await log_reader(store)
        with gc_paused():
            for stream in streams:
                verifier = Verifier()
                verifier.feed(reader.entries(await store.read_stream(stream)))
                found.append(verifier.finish())
                events += verifier.events
                inputs += verifier.inputs
    except UnreadableEvent as error:
        return Verified(events, inputs, None, str(error))
    finally:
        await store.close()
    return Verified(events, inputs, first(found))


def divergence_report(divergence: Divergence) -> list[str]:
    """The first divergence, for people: where, the input, recorded and re-decided."""
    def shown(event: Event | None) -> str:
        if event is None:
            return "(nothing)"
        return f"{type(event).__name__}: {explain(event)}" if not is_input(event) \
            else what_came_in(event)

    input_at = divergence.input_position
    return [
        f"verify: DIVERGED at position {divergence.position} in stream "
        f"{divergence.stream!r}",
        f"  input       {'' if input_at is None else f'@{input_at}':<8} "
        f"{shown(divergence.input)}",
        f"  recorded    {f'@{divergence.position}':<8} {shown(divergence.recorded)}",
        f"  re-decided  {'':<8} {shown(divergence.redecided)}",
        "",
        f"  recorded:   {divergence.recorded!r}",
        f"  re-decided: {divergence.redecided!r}",
    ]


# ------------------------------------------------------------------------------- what-if


def whatif_configs(path: Path) -> dict[str, AgentConfig]:
    """The lane policy of every ``[[agents]]`` table of a gateway config file (tokens,
    providers and reasoners are not needed and not read)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise DebugError(f"cannot read {path}: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise DebugError(f"{path}: not a TOML config: {error}") from None
    agents = data.get("agents", [])
    if not isinstance(agents, list) or not agents:
        raise DebugError(f"{path}: no [[agents]] tables: nothing to compare")
    policies = [{k: v for k, v in a.items() if k != "reasoner"} if isinstance(a, dict) else a
                for a in agents]
    try:
        return validate_config({"agents": policies}, str(path)).agent_configs()
    except ConfigError as error:
        raise DebugError(str(error)) from None


def whatif_command(db: Log, config_path: Path, out: Out) -> int:
    """Re-run the recorded inputs under another config; print, per agent, how runs, drops,
    dedupes, suppressions and waits change."""
    configs = whatif_configs(config_path)

    async def read() -> tuple[list[RecordedEvent], LogReader]:
        store = await open_log(db)
        try:
            last = await store.last_position()
            records: list[RecordedEvent] = []
            with Progress("reading", last) as bar:
                async for page in pages(store, 0, last):
                    records += page
                    bar.advance(len(page))
            return records, await log_reader(store)
        finally:
            await store.close()

    with gc_paused():
        records, reader = asyncio.run(read())
        entries = reader.entries(records)
        del records
        with Progress("what-if", len(entries)) as bar:
            report = whatif(entries, configs, bar.advance)
    in_log = {agent.agent_id for agent in report}
    out(f"what-if: {shown(db)} re-run under the agents of {config_path}")
    out("  model (lanes.whatif): recorded inputs at their times, timers re-derived; each run\n"
        "  replays the recorded run that held its first request (duration, outcome, tokens);\n"
        "  orders and sub-agent calls are not simulated")
    for agent in report:
        out("")
        for line in whatif_report(agent):
            out(line)
    missing = sorted(set(configs) - in_log)
    if missing:
        out(f"\nnot in the log (nothing to compare): {', '.join(missing)}")
    out(f"\nwhat-if: {len(report)} agent(s), {summary(len(entries), 'events', bar.elapsed)}")
    return 0


WHATIF_ROWS: tuple[tuple[str, Callable[[Tally], int | None]], ...] = (
    ("requests received", lambda t: t.received),
    ("accepted", lambda t: t.accepted),
    ("runs", lambda t: t.runs),
    ("runs completed", lambda t: t.completed),
    ("runs aborted", lambda t: t.aborted),
    ("dropped", lambda t: t.dropped),
    ("summarized", lambda t: t.summarized),
    ("deduped", lambda t: t.deduped),
    ("rejected", lambda t: t.rejected),
    ("suppressions", lambda t: t.suppressions),
    ("steered", lambda t: t.steered),
    ("accepted, never ran", lambda t: t.never_ran),
    ("wait p50 (ms)", lambda t: t.wait(0.5)),
    ("wait p95 (ms)", lambda t: t.wait(0.95)),
    ("wait max (ms)", lambda t: max(t.waits, default=None)),
)


def _setting(value: object) -> str:
    return "none" if value is None else str(value)


def whatif_report(agent: AgentWhatIf) -> list[str]:
    """One agent: what changed in its config, then recorded vs what-if, row by row."""
    changes = agent.config_changes()
    if agent.config is None:
        heading = "recorded config kept"
        if agent.whatif != agent.recorded:
            heading += (" (re-simulated, it differs from its log: the model does not "
                        "reproduce this log exactly; compare with the what-if column)")
    elif not changes:
        heading = "same config as recorded"
    else:
        heading = "; ".join(f"{key} {_setting(before)} -> {_setting(after)}"
                            for key, before, after in changes)
    rows = []
    for name, measure in WHATIF_ROWS:
        before, after = measure(agent.recorded), measure(agent.whatif)
        change = None if before is None or after is None or before == after \
            else f"{after - before:+,}"
        rows.append([name, before, after, change])
    return [f"{agent.agent_id}: {heading}",
            *("  " + line for line in table(["", "recorded", "what-if", "change"], rows, "<>>>"))]


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
