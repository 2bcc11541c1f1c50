"""The timeline of one agent: each input and the decisions it caused, worded for
people (`story`), and the kinds of decision a person jumps between."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gateway.base.quarantine import log_reader
from gateway.market.prices import PLAIN, PriceWords
from gateway.tools.describe import describe
from gateway.tools.logs import DebugError, Log, Out, Point, clock, open_log, resolve, shown
from lanes.events import (
    AgentCallDispatched,
    AgentCallRejected,
    ApprovalDecided,
    ApprovalRequested,
    BrokerReportIgnored,
    BudgetAlert,
    CallBatchOpened,
    ConfigApplied,
    ControlApplied,
    Event,
    FallbackApplied,
    ModelCalled,
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
    StepDecided,
    TasksFinished,
    TasksScheduled,
    TimerElapsed,
    ToolResultTaken,
    ToolReturned,
    TradingState,
    is_input,
)
from lanes.replay import Entry, steps
from lanes.streams import is_agent_stream

# ------------------------------------------------------------------------------ timeline


async def timeline_command(db: Log, agent: str, start: Point | None, end: Point | None,
                           out: Out, words: PriceWords | None = None) -> int:
    """Print each input of one agent and the decisions it caused, with their reasons (prices
    to the ticks of ``words``: the config's ``[market]``)."""
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
    for group in story(entries, words):
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
        case ControlApplied(to_state=TradingState.HALTED, from_state=before) \
                if before is not TradingState.HALTED:
            return ("stop",)
        case ControlApplied() | OperatorApplied() | RunsUnheld() | RunsResumed():
            return ("control",)
        case RequestDropped() | RequestSummarized():
            return ("drop",)
        case RunsSuppressed() | BudgetAlert():
            return ("suppression",)
        case RunsHeld():
            return ("hold",)
        case RunStarted() | RunCompleted() | RunSteered() | ToolResultTaken():
            return ("run",)
        case StepDecided(refused=refused):
            return ("run", "error") if refused else ("run",)
        case OrderAccepted() | OrderFilled() | OrderClosed() | OrderCancelRequested() \
                | ApprovalRequested() | ApprovalDecided():
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


def story(entries: Iterable[Entry], words: PriceWords | None = None) -> Iterator[Group]:
    """One agent's stream (in position order) as groups: the story the timeline tells. A
    run that ends while tool calls of its last step had not returned says which were cut
    off. Prices are worded to the ticks of ``words``, which learns each order's symbol."""
    words = PriceWords() if words is None else words
    names: dict[str, str] = {}  # tool call id -> tool name (of the runs still open)
    running: dict[str, list[str]] = {}  # run id -> its tool calls that have not returned
    for step in steps(entries):
        event = step.input.event
        assert is_input(event)  # (a step starts with its input)
        if isinstance(event, ModelCalled):
            names.update((c.call_id, c.name) for c in event.tool_calls)
        said = []
        for d in step.decisions:
            words.learn(d.event)
            text = explain(d.event, words)
            match d.event:
                case StepDecided(run_id=run_id, allowed=allowed):
                    running[run_id] = list(allowed)
                case ToolResultTaken(run_id=run_id, call_id=call_id):
                    if call_id in running.get(run_id, ()):
                        running[run_id].remove(call_id)
                case RunAborted(run_id=run_id) | RunFailed(run_id=run_id) \
                        | RunCompleted(run_id=run_id):
                    cut = running.pop(run_id, [])
                    if cut:
                        text += "; tool calls cut off: " + ", ".join(
                            f"{names.get(c, '?')} ({c})" for c in cut)
                    if not running:
                        names.clear()
            said.append(Said(d.position, type(d.event).__name__, text, kinds_of(d.event)))
        yield Group(step.input.position, event.at, type(event).__name__,
                    what_came_in(event, words), tuple(said))


def what_came_in(event: Event, words: PriceWords = PLAIN) -> str:
    """An input, in a few words (prices to the ticks of ``words``)."""
    if isinstance(event, TimerElapsed):
        return "timer"
    if isinstance(event, ModelCalled):
        asked = ", ".join(f"{c.name} ({c.call_id})" for c in event.tool_calls)
        seen = f"; saw steers {', '.join(event.steered)}" if event.steered else ""
        what = f"asked for {asked}" if asked else "answered"
        return (f"ModelCalled {event.run_id} step {event.step}: {what} "
                f"({event.input_tokens}+{event.output_tokens} tokens{seen})")
    if isinstance(event, ToolReturned):
        cut = f", cut from {event.size} characters" if event.digest else ""
        how = "returned" if event.ok else "failed"
        return (f"ToolReturned {event.run_id} step {event.step}: {event.name} "
                f"({event.call_id}) {how}{cut}: {event.content[:120]}")
    name = type(event).__name__
    return f"{name} {describe(event, words)}".rstrip()


def explain(event: Event, words: PriceWords = PLAIN) -> str:
    """A decision with its reason, as a person would say it (prices to the ticks of
    ``words``, money to the cent)."""
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
        case StepDecided(run_id=run_id, step=step, allowed=allowed, refused=refused):
            parts = [f"{len(allowed)} tool call{'s' * (len(allowed) != 1)} go ahead"]
            parts += [f"{r.call_id} refused: {r.error}" for r in refused]
            return f"{run_id} step {step}: {'; '.join(parts)}"
        case ApprovalRequested(approval_id=aid, intent=intent, notional=value, expires_at=end):
            worth = "" if value is None else f", notional {words.money(value)}"
            return (f"approval {aid} asked: {words.intent(intent)}{worth} "
                    f"(expires {clock(end)})")
        case ApprovalDecided(approval_id=aid, approved=approved, by=by, reason=reason):
            return (f"approval {aid} {'approved' if approved else 'rejected'} by {by}"
                    f"{': ' + reason if reason else ''}")
        case TasksScheduled(run_id=run_id, call_id=call_id, tasks=tasks):
            to = ", ".join(task.agent_id for task in tasks)
            return f"{run_id}: {len(tasks)} task(s) scheduled by {call_id} (for {to})"
        case TasksFinished(batch_id=batch, results=results):
            ended = ", ".join(f"{r.target} {r.status.value}" for r in results)
            return f"tasks {batch} all ended: {ended}"
        case CallBatchOpened(run_id=batch, awaited_by=run_id) if run_id is not None:
            return f"tasks {batch} sent; {run_id} waits for them"
        case ToolResultTaken(run_id=run_id, call_id=call_id, ok=ok):
            return f"{run_id}: {'result' if ok else 'tool error'} of {call_id} taken"
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
        case BudgetAlert(budget=budget, window=window, fraction=fraction, used=used,
                         limit=limit):
            amount = words.money if "spend" in budget else "{:,.0f}".format
            return (f"budget alert: {budget} at {fraction:.0%} this {window} "
                    f"({amount(used)} of {amount(limit)})")
        case RunsHeld(provider=provider, reason=reason):
            return f"runs held until resume: {provider} refused for spend ({reason})"
        case RunsUnheld(by=by):
            return f"hold lifted by {by}"
        case OrderAccepted() | OrderRejected() | OrderCancelRequested(by=_) | OrderFilled() \
                | OrderClosed() | BrokerReportIgnored():
            return f"{type(event).__name__} {_order(event, words)}"
        case AgentCallDispatched() | AgentCallRejected():
            return f"{type(event).__name__} {describe(event, words)}"
        case ConfigApplied(config=config, principal=who):
            return f"config applied by {who}: {config.mode.value}, cap {config.cap}"
        case OperatorApplied(action=action, principal=who, detail=detail):
            return f"operator {action.value} by {who}{': ' + detail if detail else ''}"
        case OperatorRejected(action=action, reason=reason):
            return f"operator {action.value} refused: {reason}"
    return f"{type(event).__name__} {describe(event, words)}".rstrip()


def _order(event: Event, words: PriceWords) -> str:
    match event:
        case OrderCancelRequested(order_id=oid, by=by):
            return f"{oid} (cancel asked by {by})"
        case OrderFilled(order_id=oid, qty=qty, price=price):
            at = "an unknown price" if price is None else words.of_order(price, oid)
            return f"{oid}: {qty:g} at {at}"
        case OrderClosed(order_id=oid, status=closed, reason=reason):
            return f"{oid}: {closed}{' (' + reason + ')' if reason else ''}"
        case BrokerReportIgnored(reason=reason):
            return reason
    return describe(event, words)
