"""Policy versions, as `decide` makes them for an agent (`lanes.policy` says why and when),
and the rules of earlier versions that `decide` dispatches to (split out of `lanes.decide`)."""

from __future__ import annotations

from lanes.decide import DECIDERS, Emit
from lanes.events import AgentCallDispatched, AgentCallRejected, RunFinished
from lanes.policy import PolicyAdopted, PolicyDeferred, PolicyOffered, offer
from lanes.state import AgentState


def busy(state: AgentState) -> str | None:
    """Why the stream is not at rest (a run, requests waiting, calls out), or None."""
    if state.active is not None:
        return f"run {state.active.run_id} is active"
    if state.pending:
        return f"{len(state.pending)} request(s) wait"
    calls = state.calls
    if calls.open or calls.batches:
        return "sub-agent calls are open"
    return None


@DECIDERS.on(PolicyOffered)
def _offered(state: AgentState, event: PolicyOffered, emit: Emit) -> None:
    if not offer(state.policy, state.policy_offered, event.version):
        return
    why = busy(state)
    if why is None:
        emit(PolicyAdopted(version=event.version))
    else:
        emit(PolicyDeferred(version=event.version, reason=f"{why}: adopted once at rest"))


def adopt_at_rest(state: AgentState, emit: Emit) -> None:
    """After an input: adopt the deferred version if the stream is at rest now."""
    version = state.policy_offered
    if version is not None and busy(state) is None:
        emit(PolicyAdopted(version=version))


# ------------------------------------------------------------------------------ version 1


def make_calls_v1(state: AgentState, run_id: str, run_depth: int, event: RunFinished,
                  emit: Emit) -> None:
    """Version 1: each call within the limits goes out at once, its result never comes
    back, and nothing answers the calls a run served."""
    config = state.config
    depth = run_depth + 1
    for number, call in enumerate(event.calls, start=1):
        if number > config.max_calls_per_run:
            why = f"fan-out limit of {config.max_calls_per_run} calls per run reached"
        elif depth > config.max_call_depth:
            why = f"call depth {depth} exceeds the limit of {config.max_call_depth}"
        else:
            emit(AgentCallDispatched(call_id=f"{run_id}-c{number}", run_id=run_id,
                                     target=call.agent_id, depth=depth,
                                     priority=call.priority, payload=call.payload))
            continue
        emit(AgentCallRejected(run_id=run_id, target=call.agent_id, reason=why))
