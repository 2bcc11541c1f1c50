"""A WebSocket session's subscription: the snapshot, then the events as they commit, and a
heartbeat whenever it has been quiet (``subscribe`` / ``unsubscribe`` frames)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from gateway.base.tasks import spawn
from gateway.edge.protocol import (
    EVENTS_PER_FRAME,
    PNL_EVERY_MS,
    ErrorFrame,
    Heartbeat,
    PnlFrame,
    Subscribe,
)
from gateway.edge.views import (
    agent_summary,
    event_frame_text,
    events_frames,
    gate_waits_of,
    json_pieces,
    model_json,
    provider_summary,
)
from gateway.errors import BadFrame, Forbidden, NotRunning
from gateway.market.events import from_ms
from gateway.reads.pnl import pnl_view
from lanes.blotter import ORDER_EVENT_TYPES, Blotter

if TYPE_CHECKING:
    from gateway.edge.sessions import Session

log = logging.getLogger("gateway.edge.sessions")


class Subscriptions:
    """The subscription of one session: at most one follower task at a time, replaced by
    each ``subscribe`` and ended by ``unsubscribe`` or the session's end. Its frames go out
    through the session's sends."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.task: asyncio.Task[None] | None = None
        """The follower of the subscription in force, if there is one."""

    def cancel(self) -> None:
        """End the subscription in force, if there is one."""
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def subscribe(self, frame: Subscribe) -> None:
        """Check the frame against the session's principal and start following (replacing
        the subscription in force); the snapshot and the events are sent by the follower."""
        session = self.session
        engine = session.engine
        principal = session.principal
        assert principal is not None
        principal.check_read()
        known = engine.agent_ids
        if frame.agents is None:
            wanted = principal.visible(known)
        else:
            wanted = list(dict.fromkeys(frame.agents))  # each once, in the order given
            if len(wanted) > len(known):
                raise BadFrame("invalid", f"agents lists {len(wanted)} different ids and this "
                               f"gateway has {len(known)} agents; leave agents out to follow "
                               "every agent in scope", field="agents")
        # Checked with set operations (a check and a look-up per agent of a big desk held
        # the loop for 10 ms): the first agent refused is refused as before.
        if frame.agents is not None:
            scope, ids = principal.agents, set(known)
            for agent_id in [a for a in wanted
                             if a not in ids or (scope is not None and a not in scope)][:1]:
                principal.check_read(agent_id)
                engine.state(agent_id)
        if not engine.running:
            raise NotRunning()
        if frame.providers and principal.agents is not None:
            raise Forbidden("a token scoped to some agents cannot follow the provider gates "
                            "(they serve every agent); subscribe without providers")
        # Swap subscriptions with no await in between: one follower per connection, always.
        if self.task is not None:
            self.task.cancel()
        self.task = spawn(self._follow(frame, wanted), "subscription")

    async def _follow(self, frame: Subscribe, wanted: list[str]) -> None:
        session = self.session
        engine, service = session.engine, session.service
        position = await service.log.last_position()
        now = engine.clock.now_ms()
        gates = engine.gates if frame.providers else {}
        waits = gate_waits_of(engine, now)
        # A big desk's snapshot is rendered a step at a time (stops come first), into the
        # pieces of the text `Snapshot.model_dump_json` would give; they are sent as they
        # are, never joined. (Rendered before the send: a render holds no send lock, so
        # this session's control acks never wait for it.)
        head = '{"type":"snapshot"' + ("" if frame.id is None else f',"id":{model_json(frame.id)}')
        pieces = [f'{head},"position":{position},"agents":']
        async for piece in json_pieces(
                wanted, lambda a: service.said_behind(
                    a, agent_summary(engine.state(a), now, waits.get(a),
                                     no_worker=service.workers.missing(a))),
                model_json):
            pieces.append(piece)
        providers = model_json([provider_summary(n, g, now) for n, g in sorted(gates.items())])
        pieces.append(f',"providers":{providers}}}')
        await session.send_pieces(pieces)  # (the gateway's server empties the list)
        del pieces  # (not kept for the subscription's life)
        agents = set(wanted) | {gate.stream for gate in gates.values()}
        after = frame.after if frame.after is not None else position
        # Lists of a frame's worth: the batch in hand, and its texts, stay small.
        follow = session.service.log.follow_batches(after, EVENTS_PER_FRAME)
        beating = spawn(self._heartbeats(asyncio.current_task()), "heartbeats") \
            if session.service.heartbeat_s else None
        traded: set[str] | None = None  # agents with order events not yet in a pnl frame
        if frame.pnl:
            traded = set(wanted)
            beating_pnl = spawn(self._pnl(asyncio.current_task(), wanted, traded), "pnl")
        try:
            async with contextlib.aclosing(follow) as batches:
                async for batch in batches:
                    if traded is not None:
                        traded.update(r.stream for r in batch if r.type in ORDER_EVENT_TYPES)
                    texts = [event_frame_text(r) for r in batch if r.stream in agents]
                    for text in events_frames(texts) if frame.batch else texts:
                        if session.closing:
                            return
                        await session.send_text(text)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("subscription ended: %r", error)
            await session.send(ErrorFrame(
                id=frame.id, code="unavailable",
                message="the subscription ended (the log could not be read); subscribe "
                        "again with 'after' set to the last position you received"))
        finally:
            if beating is not None:
                beating.cancel()
            if traded is not None:
                beating_pnl.cancel()

    async def _pnl(self, follower: asyncio.Task[Any] | None, wanted: list[str],
                   traded: set[str]) -> None:
        """A `PnlFrame` of ``wanted`` at once, then whenever it changed (looked at every
        `PNL_EVERY_MS`): the blotters of ``traded`` agents (order events seen since) are read
        again, the others' marked to the latest prices only. None once the subscription is
        replaced or ended."""
        session = self.session
        engine, service = session.engine, session.service
        said: dict[str, Any] | None = None
        while not session.closing and self.task is follower:
            changed = set(traded)
            traded.clear()
            # An agent that never had an order accepted has no fill: nothing to read for it.
            dealt = [a for a in wanted if engine.state(a).counters.orders_accepted]
            read = dict(await service.blotters.blotters(service.log, engine.reader, dealt,
                                                        changed))
            blotters = [(a, read.get(a) or Blotter()) for a in wanted]
            view = pnl_view(blotters, engine.runs.toolbox.market, engine.clock.now_ms())
            if self.task is not follower:
                return
            body = view.model_dump(mode="json", exclude={"at"})
            for agent in body["agents"]:  # (ages change all the time: a client counts them)
                for position in agent["positions"]:
                    position.pop("markAgeMs")
            if body != said:
                await session.send(PnlFrame(pnl=view))
                said = body
            await engine.clock.sleep(PNL_EVERY_MS)

    async def _heartbeats(self, follower: asyncio.Task[Any] | None) -> None:
        """A heartbeat whenever the subscription (its ``follower``) has sent nothing for
        `Service.heartbeat_s`: a client that hears nothing for longer knows the link or the
        gateway is stuck. None once the subscription is replaced or ended."""
        session = self.session
        clock = session.engine.clock
        every = session.service.heartbeat_s * 1000
        while not session.closing and self.task is follower:
            quiet = clock.monotonic_ms() - session.last_sent
            if quiet < every:
                await clock.sleep(every - quiet)
                continue
            committed = await session.service.log.last_position()
            if self.task is not follower:
                return
            await session.send(Heartbeat(committed=committed, at=from_ms(clock.now_ms())))
            # (also when the send was skipped: no busy loop)
            session.last_sent = clock.monotonic_ms()
