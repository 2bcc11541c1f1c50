"""Talking to the other gateway processes of a cluster (several processes on one log).

Requests for an agent another process owns are sent to that process (`Peers.submit_many`,
for `gateway.cluster.router.Router`), and a run whose provider gate another process owns
takes its slots from there (`RoutedGate`). Both go over the owner's internal HTTP API
(`gateway.edge.internal`), authenticated with the cluster's shared secret. Nothing here decides:
the owner does, and answers as it would answer a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import httpx2

from gateway.base.tasks import spawn
from gateway.errors import BadFrame, GatewayError, NotOwner
from gateway.runtime.acks import Ack
from gateway.runtime.effects import ControlEffect
from gateway.runtime.gate import GateMoved, ProviderGate, Slot, SlotRefusedError
from lanes.gate.events import CallOutcome, GateLimits, Refusal, SlotRefused
from lanes.requests import AgentRequest, Priority

log = logging.getLogger("gateway.cluster.peers")

SECRET_HEADER: Final = "x-gateway-cluster"
"""The header that carries the cluster's shared secret on internal calls."""
FORWARDED_HEADER: Final = "x-gateway-forwarded"
"""Set on a client's HTTP call proxied to the owner: the owner never proxies it again."""
CALL_TIMEOUT_S: Final = 30.0
"""How long a forwarded request may take (its commit included)."""
OWNER_WAIT_MS: Final = 100
"""How long a run waits before it asks again for a gate with no owner (a failover)."""


class PeerError(GatewayError):
    """A call to another gateway process failed (it is gone, or answered nonsense): nothing
    is known to be taken there; retry with the same requestId."""

    code = "unavailable"


class PeerUnreachable(PeerError):
    """Another gateway process could not be reached, or hung up before it answered."""


class Unanswered(GatewayError):
    """A forwarded request's owner (of an agent or a gate: ``stream``) did not answer within
    the lease (paused, cut off, gone), nor did another process take the stream over."""

    code = "unavailable"

    def __init__(self, stream: str, owners: list[str], lease_ms: int,
                 looked_again: bool = True) -> None:
        again = " and no other process has taken it over yet" if looked_again else ""
        super().__init__(
            f"{stream!r}: its gateway process ({', '.join(owners)}) did not answer within the "
            f"lease ({lease_ms} ms){again}; nothing is known to be taken: retry (with the "
            "same requestId)")
        self.stream = stream


class Peers:
    """HTTP clients to the other processes of the cluster, one connection pool for all."""

    def __init__(self, secret: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self._secret = secret
        self._tasks: set[asyncio.Task[None]] = set()
        self._client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s, connect=5.0),
            limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50))

    async def close(self) -> None:
        """Close every connection."""
        await self._client.aclose()

    async def post(self, owner: str, path: str, body: dict[str, Any],
                   timeout_s: float | None = None) -> Any:
        """POST ``body`` to ``path`` at the process serving at ``owner``: its JSON answer
        (`PeerError` if it cannot be had; a typed error the owner answered is raised as
        the same kind of `GatewayError`)."""
        try:
            response = await self._client.post(
                owner + path, json=body, headers={SECRET_HEADER: self._secret},
                timeout=httpx2.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s)
            answer = response.json()
        except (httpx2.HTTPError, ValueError) as error:
            raise PeerUnreachable(f"the gateway process at {owner} did not answer ({error!r}); "
                            "nothing is known to be taken: retry with the same "
                            "requestId") from None
        if response.status_code == 404:  # what a member with another secret answers
            raise PeerError(f"the gateway process at {owner} does not take this member's "
                            "calls: is it a member of the same log, with the same [cluster] "
                            "secret (by default derived from the tokens: the same tokens)?")
        if response.status_code >= 400:
            raise _error(answer, owner)
        return answer

    def poke(self, owner: str) -> None:
        """Wake the member at ``owner`` to take what was just handed over to it (in the
        background; if it fails, that member takes it at its next renewal)."""
        async def send() -> None:
            with contextlib.suppress(GatewayError):
                await self.post(owner, "/internal/poke", {}, timeout_s=5.0)

        task = spawn(send(), f"poke {owner}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def request(self, method: str, url: str, **options: Any) -> httpx2.Response:
        """Any HTTP call to another process (an operator's call passed on to the owner),
        without the cluster's secret; `PeerError` if it went unanswered."""
        try:
            return await self._client.request(method, url, **options)
        except httpx2.HTTPError as error:
            raise PeerError(f"the gateway process at {url} did not answer ({error!r}); "
                            "nothing is known to be taken: retry") from None

    async def submit_many(self, owner: str, requests: Sequence[AgentRequest],
                          principal: str | None) -> list[Ack | GatewayError]:
        """Submit ``requests`` at their owner: an ack or an error for each, as the owner
        answered (`NotOwner` for an agent that left it meanwhile)."""
        body = {"principal": principal,
                "requests": [r.model_dump(mode="json", by_alias=True, exclude_none=True)
                             for r in requests]}
        try:
            answer = await self.post(owner, "/internal/submit", body)
        except GatewayError as error:
            return [error for _ in requests]
        results: list[Ack | GatewayError] = []
        for request, item in zip(requests, answer["results"], strict=True):
            if isinstance(item.get("moved"), dict):  # the agent left that process meanwhile
                moved_to = item["moved"].get("owner")
                results.append(NotOwner(request.agent_id,
                                        moved_to if isinstance(moved_to, str) else None))
            elif item.get("type") == "ack":
                effect = item.get("effect")
                results.append(Ack(item["requestId"], item["decision"], item["position"],
                                   item.get("reason"), item.get("repeated", False),
                                   None if effect is None
                                   else ControlEffect.model_validate(effect)))
            else:
                results.append(_error(item, owner))
        return results


def _error(frame: dict[str, Any], owner: str) -> GatewayError:
    """The error another process answered, as a `GatewayError` with the same code."""
    code = str(frame.get("code") or "unavailable")
    message = str(frame.get("message") or f"the gateway process at {owner} refused it")
    error = BadFrame(code, message, frame.get("field"))
    return error


class RoutedGate:
    """A provider gate as a run sees it when several processes share the log: the local
    `ProviderGate` while this process owns it, else its owner's, over the internal API.
    A wait cut off by a change of owner is asked again of the new one; a slot given back
    goes to whoever owns the gate then."""

    def __init__(self, gate: ProviderGate, peers: Peers,
                 owner_of: Callable[[str], str | None]) -> None:
        self.gate = gate
        self._peers = peers
        self._owner_of = owner_of
        self._held: dict[str, str | None] = {}
        """Slots granted and not given back yet: where each was granted (None: here)."""
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def provider(self) -> str:
        """The provider's name."""
        return self.gate.provider

    @property
    def limits(self) -> GateLimits:
        """The limits in force (as the log says, wherever the gate is owned)."""
        return self.gate.state.limits or self.gate.limits

    async def acquire(self, agent_id: str, run_id: str, priority: Priority,
                      input_tokens: int, output_tokens: int, weight: int = 1) -> Slot:
        """Wait for a slot wherever the gate is owned (`SlotRefusedError` if refused)."""
        while True:
            slot_id = f"{run_id}/{self.gate.ids()}"  # a new one each time: never reused
            if self.gate.loaded:
                try:
                    slot = await self.gate.acquire(agent_id, run_id, priority, input_tokens,
                                                   output_tokens, slot_id=slot_id,
                                                   weight=weight)
                except GateMoved:
                    continue
                self._held[slot.slot_id] = None
                return slot
            owner = self._owner_of(self.gate.stream)
            if owner is None:  # no owner this moment (a failover): ask again shortly
                await self.gate.clock.sleep(OWNER_WAIT_MS)
                continue
            body = {"agentId": agent_id, "runId": run_id, "priority": priority.value,
                    "inputTokens": input_tokens, "outputTokens": output_tokens,
                    "slotId": slot_id, "weight": weight}
            try:
                answer = await self._asking(owner, body)
            except SlotRefusedError:
                raise
            except GatewayError as error:  # moved, or its owner went away: ask again
                log.info("slot of %s at %s: %s; asking again", run_id, owner, error)
                await self.gate.clock.sleep(OWNER_WAIT_MS)
                continue
            slot = Slot(answer["slotId"], answer["leaseDeadline"], answer["probe"])
            self._held[slot.slot_id] = owner
            return slot

    async def _asking(self, owner: str, body: dict[str, Any]) -> Any:
        """Ask ``owner`` for a slot; withdrawn there if the run is cancelled meanwhile."""
        path = f"/internal/gates/{self.provider}"
        try:
            answer = await self._peers.post(owner, path + "/acquire", body,
                                            timeout_s=self.limits.max_wait_ms / 1000 + 30)
        except asyncio.CancelledError:
            self._send("cancel", {"slotId": body["slotId"]}, owner)
            raise
        if "refused" in answer:
            refused = answer["refused"]
            raise SlotRefusedError(SlotRefused(
                slot_id=body["slotId"], agent_id=body["agentId"], run_id=body["runId"],
                code=Refusal(refused["code"]), reason=refused["reason"]))
        return answer

    def release(self, slot: Slot, outcome: CallOutcome, *, input_tokens: int | None = None,
                output_tokens: int | None = None, retry_after_ms: int | None = None,
                remaining_requests: int | None = None, remaining_tokens: int | None = None,
                reset_at: int | None = None) -> None:
        """Give a slot back with how the provider answered, to the gate's owner."""
        if slot.slot_id not in self._held:
            return  # given back already
        granted_by = self._held.pop(slot.slot_id)
        if self.gate.loaded:
            self.gate.release(slot, outcome, input_tokens=input_tokens,
                              output_tokens=output_tokens, retry_after_ms=retry_after_ms,
                              remaining_requests=remaining_requests,
                              remaining_tokens=remaining_tokens, reset_at=reset_at)
            return
        self._send("release", {
            "slotId": slot.slot_id, "outcome": outcome.value, "inputTokens": input_tokens,
            "outputTokens": output_tokens, "retryAfterMs": retry_after_ms,
            "remainingRequests": remaining_requests, "remainingTokens": remaining_tokens,
            "resetAt": reset_at}, granted_by)

    def cancel(self, slot: Slot) -> None:
        """Free a slot without an answer (the run was aborted or crashed)."""
        if slot.slot_id not in self._held:
            return
        granted_by = self._held.pop(slot.slot_id)
        if self.gate.loaded:
            if slot.slot_id in self.gate.state.leases:
                self.gate.cancel(slot.slot_id)
            return
        self._send("cancel", {"slotId": slot.slot_id}, granted_by)

    @contextlib.asynccontextmanager
    async def using(self, agent_id: str, run_id: str, priority: Priority = Priority.NORMAL,
                    input_tokens: int = 0, output_tokens: int = 0, weight: int = 1
                    ) -> AsyncIterator[Slot]:
        """A slot that is always given back (as `ProviderGate.using`)."""
        slot = await self.acquire(agent_id, run_id, priority, input_tokens, output_tokens,
                                  weight)
        try:
            yield slot
        finally:
            self.cancel(slot)  # (nothing, if it was released)

    def _send(self, what: str, body: dict[str, Any], owner: str | None) -> None:
        """POST a release or cancel to the gate's owner in the background (a release must
        not hold up the run's end): the current one, else ``owner`` (who granted it); if
        that one says the gate moved, once more to whoever owns it by then. A failure is
        logged: the slot's lease frees it in the end."""
        path = f"/internal/gates/{self.provider}/{what}"

        async def send() -> None:
            tried: set[str] = set()
            for _ in range(2):
                target = self._owner_of(self.gate.stream) or owner
                if self.gate.loaded:  # this process took the gate over meanwhile
                    slot = Slot(str(body["slotId"]), 0, False)
                    if what == "release":
                        self.gate.release(slot, CallOutcome(body["outcome"]), input_tokens=body[
                            "inputTokens"], output_tokens=body["outputTokens"],
                            retry_after_ms=body["retryAfterMs"],
                            remaining_requests=body["remainingRequests"],
                            remaining_tokens=body["remainingTokens"], reset_at=body["resetAt"])
                    elif slot.slot_id in self.gate.state.leases:
                        self.gate.cancel(slot.slot_id)
                    return
                if target is None or target in tried:
                    break
                tried.add(target)
                try:
                    await self._peers.post(target, path, body)
                    return
                except GatewayError as error:
                    log.info("%s at %s: %s", path, target, error)
            log.warning("%s of slot %s could not be delivered (the slot's lease frees it)",
                        what, body["slotId"])

        task = spawn(send(), f"{what} {body['slotId']}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
