"""Requests a WebSocket session decides at once, as it reads them, rather than in a task of
their own: a control (its run cancelled there and then, the feed's bulk work held until its
ack is out) and a feed's single request (answered from its commit's callback)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from gateway.base.tasks import spawn
from gateway.edge.answers import ack_text, error_frame
from gateway.edge.protocol import BusyFrame, Submit
from gateway.errors import Busy, GatewayError
from gateway.runtime.acks import Ack

if TYPE_CHECKING:
    from gateway.edge.auth import Principal
    from gateway.edge.service import Service

HELD_EVENTS = 2
"""Events a feed's request waits for the log with, for the intake's shares: the request
and its decision, most often."""


class DecidedNow:
    """The answers a `gateway.edge.sessions.Session` decides as it reads their frames."""

    principal: Principal | None
    service: Service
    tasks: set[asyncio.Task[None]]

    if TYPE_CHECKING:
        async def send(self, frame: BaseModel) -> None: ...
        async def send_text(self, text: str) -> None: ...
        def send_now(self, text: str) -> bool: ...
        def _done(self, size: int, task: asyncio.Task[None] | None = None) -> None: ...

    def _control_now(self, frame: Submit) -> Coroutine[Any, Any, None]:
        """A control (stop, pause, resume, cancel) decided at once, as it is read: its run is
        cancelled there and then; what it returns sends its ack after the commit."""
        principal = self.principal
        assert principal is not None
        request = frame.request
        pacer = self.service.pacer
        pacer.hold()  # the feed's bulk work waits until this ack is out
        try:
            self.service.admit(principal, request)  # (a control: never refused for capacity)
            pending = self.service.way_in.take([request], principal.name, parsed=True)[0]
        except Exception as error:
            pacer.release()
            return self.send(error_frame(error, id=frame.id, request_id=request.request_id))
        return self._acked(frame, pending)

    async def _acked(self, frame: Submit, pending: Awaitable[Ack]) -> None:
        """Send the ack of a control decided by `_control_now` (which held the pacer)."""
        try:
            try:
                ack = await pending
            except asyncio.CancelledError:
                raise
            except Exception as error:
                await self.send(error_frame(error, id=frame.id,
                                            request_id=frame.request.request_id))
            else:
                await self.send_text(ack_text(ack, frame.id))
        finally:
            self.service.pacer.release()

    def _submit_now(self, frame: Submit, size: int) -> bool:
        """A feed's one request decided at once, as it is read, with no task of its own: its
        answer is sent from its commit's callback (`_submitted`). False (nothing taken): a
        request its token may not send, answered by `_answer` as any other frame."""
        principal = self.principal
        assert principal is not None
        try:
            self.service.admit(principal, frame.request, by_feed=True)
        except GatewayError:
            return False
        intake = self.service.intake
        intake.took(self, HELD_EVENTS)
        try:
            pending = self.service.way_in.take([frame.request], principal.name,
                                               parsed=True)[0]
        except BaseException:
            intake.settled(self, HELD_EVENTS)
            raise
        pending.add_done_callback(functools.partial(self._submitted, frame, size))
        return True

    def _submitted(self, frame: Submit, size: int, pending: asyncio.Future[Ack]) -> None:
        """Send the answer of a request `_submit_now` took, once it is known (at once if
        nothing holds the connection up, else by a task that waits for room)."""
        self.service.intake.settled(self, HELD_EVENTS)
        if pending.cancelled():  # (the store closed under it: the connection goes too)
            self._done(size)
            return
        error = pending.exception()
        answer: BaseModel
        if error is None:
            text = ack_text(pending.result(), frame.id)
        else:
            if isinstance(error, Busy):
                answer = BusyFrame(id=frame.id, retry_after_ms=error.retry_after_ms)
            elif isinstance(error, Exception):
                answer = error_frame(error, id=frame.id, request_id=frame.request.request_id)
            else:  # (the loop is being torn down: nothing to answer)
                self._done(size)
                return
            text = answer.model_dump_json(exclude_none=True)
        if self.send_now(text):
            self._done(size)
            return
        task = spawn(self.send_text(text), "answer")
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._done, size))
