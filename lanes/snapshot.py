"""A `LogFold` to and from JSON bytes: what a snapshot holds.

The image is flat and columnar where a state is big (request-id and dedupe memories become
parallel lists, in their order, which pruning relies on), so that loading the fold of a large
log is one JSON validation and a few ``zip`` calls. Loading gives back states equal to the fold
of the same events, field for field and in the same order.

The format is versioned by `SNAPSHOT_FORMAT`; the code that folds is versioned by whoever
stores snapshots (a snapshot made by other code is ignored, never trusted).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pydantic import TypeAdapter, ValidationError

from lanes.config import AgentConfig
from lanes.events import AgentCallDispatched, CallAnswered, Summary, TradingState, answer_id
from lanes.replay import LogFold
from lanes.schedules import ScheduleEntry
from lanes.state import (
    ActiveRun,
    AgentState,
    CallBook,
    Counters,
    OpenOrder,
    Pending,
    PendingApproval,
    TradingChange,
)
from lanes.streams import is_agent_stream

SNAPSHOT_FORMAT = 3
"""Bump when the image below changes shape."""


class BadSnapshot(ValueError):
    """Snapshot data that cannot be loaded (damaged, or of another format)."""


@dataclass(slots=True, kw_only=True)
class AgentImage:
    """One `AgentState`, with its big dicts as parallel lists."""

    agent_id: str
    config: AgentConfig
    version: int
    now: int
    trading: TradingState
    trading_change: TradingChange | None
    pending: list[Pending]
    active: ActiveRun | None
    run_seq: int
    collect_first: int | None
    collect_due: int | None
    summary: Summary | None
    run_starts: list[int]
    cooldown_until: int
    suppressed: tuple[str, int] | None
    held: str | None
    failure: tuple[str, int, str] | None
    recent_keys: list[str]
    recent_ids: list[str]
    recent_at: list[int]
    pending_keys: list[str]
    pending_key_ids: list[str]
    seen_ids: list[str]
    seen_decisions: list[str]
    seen_at: list[int]
    seen_fingerprints: list[str]
    orders: list[OpenOrder]
    positions: dict[str, float]
    counters: Counters
    schedules: list[ScheduleEntry] = field(default_factory=list)
    calls: CallBook = field(default_factory=CallBook)
    approvals: list[PendingApproval] = field(default_factory=list)
    spend: list[tuple[int, int, int, float]] = field(default_factory=list)
    desk_block: tuple[int, str] | None = None
    policy: int = 1
    policy_offered: int | None = None


@dataclass(slots=True, kw_only=True)
class FoldImage:
    """A whole `LogFold`."""

    format: int
    position: int
    anchor: str
    """The id of the event at ``position``: a snapshot is only ever applied to its own log."""
    agents: list[AgentImage]
    calls: list[tuple[str, AgentCallDispatched]]
    answers: list[tuple[str, CallAnswered]] = field(default_factory=list)


_IMAGE = TypeAdapter(FoldImage)
_FORMAT_ONLY = TypeAdapter(dict[str, object])


def dump_fold(log_fold: LogFold, anchor: str) -> bytes:
    """The fold as JSON bytes, with ``anchor`` (the id of the event at its position). Every
    state must be at rest (no request awaiting its decision): a fold of committed events
    always is."""
    agents = []
    for state in log_fold.states.values():
        if state.staged is not None:
            raise ValueError(f"{state.agent_id}: a request awaits its decision; not at rest")
        agents.append(_image(state))
    image = FoldImage(format=SNAPSHOT_FORMAT, position=log_fold.position, anchor=anchor,
                      agents=agents, calls=list(log_fold.calls.values()),
                      answers=list(log_fold.answers.values()))
    return _IMAGE.dump_json(image, by_alias=True)


def load_fold(data: bytes) -> tuple[LogFold, str]:
    """The fold and its anchor from `dump_fold` bytes; `BadSnapshot` if they are not one."""
    try:
        image = _IMAGE.validate_json(data)
    except ValidationError as error:
        found = _format_of(data)
        if found not in (None, SNAPSHOT_FORMAT):
            raise BadSnapshot(f"snapshot format {found}, this code reads "
                              f"{SNAPSHOT_FORMAT}") from None
        raise BadSnapshot(f"snapshot does not load: {error.error_count()} errors, first: "
                          f"{error.errors(include_url=False)[0]['msg']}") from None
    if image.format != SNAPSHOT_FORMAT:
        raise BadSnapshot(f"snapshot format {image.format}, this code reads {SNAPSHOT_FORMAT}")
    states: dict[str, AgentState] = {}
    for agent in image.agents:
        if not is_agent_stream(agent.agent_id) or agent.agent_id in states:
            raise BadSnapshot(f"snapshot holds a bad or repeated agent {agent.agent_id!r}")
        states[agent.agent_id] = _state(agent)
    calls = {call.call_id: (parent, call) for parent, call in image.calls}
    answers = {answer_id(answer.result.call_id): (child, answer)
               for child, answer in image.answers}
    return LogFold(states=states, position=image.position, calls=calls,
                   answers=answers), image.anchor


def _format_of(data: bytes) -> object:
    try:
        return _FORMAT_ONLY.validate_json(data).get("format")
    except ValidationError:
        return None


def _image(state: AgentState) -> AgentImage:
    seen = state.seen
    seen_values = list(seen.values())
    recent = state.recent_keys
    recent_values = list(recent.values())
    return AgentImage(
        agent_id=state.agent_id,
        config=state.config,
        version=state.version,
        now=state.now,
        trading=state.trading,
        trading_change=state.trading_change,
        pending=state.pending,
        active=state.active,
        run_seq=state.run_seq,
        collect_first=state.collect_first,
        collect_due=state.collect_due,
        summary=state.summary,
        run_starts=list(state.run_starts),
        cooldown_until=state.cooldown_until,
        suppressed=state.suppressed,
        held=state.held,
        failure=state.failure,
        recent_keys=list(recent),
        recent_ids=[v[0] for v in recent_values],
        recent_at=[v[1] for v in recent_values],
        pending_keys=list(state.pending_keys),
        pending_key_ids=list(state.pending_keys.values()),
        seen_ids=list(seen),
        seen_decisions=[v[0] for v in seen_values],
        seen_at=[v[1] for v in seen_values],
        seen_fingerprints=[v[2] for v in seen_values],
        orders=list(state.orders.values()),
        positions=state.positions,
        counters=state.counters,
        schedules=list(state.schedules.values()),
        calls=state.calls,
        approvals=list(state.approvals.values()),
        spend=list(state.spend),
        desk_block=state.desk_block,
        policy=state.policy,
        policy_offered=state.policy_offered,
    )


def _state(image: AgentImage) -> AgentState:
    columns = [
        (image.recent_keys, image.recent_ids, image.recent_at),
        (image.pending_keys, image.pending_key_ids),
        (image.seen_ids, image.seen_decisions, image.seen_at, image.seen_fingerprints),
    ]
    for group in columns:
        if len({len(column) for column in group}) > 1:
            raise BadSnapshot(f"{image.agent_id}: columns of unequal length")
    # One string object per distinct decision, as a live state has.
    decisions = {d: d for d in set(image.seen_decisions)}
    seen_decisions = list(map(decisions.__getitem__, image.seen_decisions))
    return AgentState(
        agent_id=image.agent_id,
        config=image.config,
        version=image.version,
        now=image.now,
        trading=image.trading,
        trading_change=image.trading_change,
        pending=image.pending,
        active=image.active,
        run_seq=image.run_seq,
        collect_first=image.collect_first,
        collect_due=image.collect_due,
        summary=image.summary,
        run_starts=deque(image.run_starts),
        cooldown_until=image.cooldown_until,
        suppressed=image.suppressed,
        held=image.held,
        failure=image.failure,
        recent_keys=dict(zip(image.recent_keys,
                             zip(image.recent_ids, image.recent_at, strict=True), strict=True)),
        pending_keys=dict(zip(image.pending_keys, image.pending_key_ids, strict=True)),
        seen=dict(zip(image.seen_ids,
                      zip(seen_decisions, image.seen_at, image.seen_fingerprints, strict=True),
                      strict=True)),
        orders={order.order_id: order for order in image.orders},
        positions=image.positions,
        counters=image.counters,
        schedules={entry.schedule.id: entry for entry in image.schedules},
        calls=image.calls,
        approvals={pending.approval_id: pending for pending in image.approvals},
        spend=deque(image.spend),
        desk_block=image.desk_block,
        policy=image.policy,
        policy_offered=image.policy_offered,
    )
