"""Policy versions: which rules decide a stream (Temporal's ``patched`` is the model).

A decision recorded under the rules of its time was right, so a log must re-decide the same
on later code. Every stream (an agent's, a provider gate's) records the policy version it
decides under: `PolicyAdopted`, the first time it decides under that version. A stream that
never adopted one decides under version 1, the rules before 2026-11-26. ``decide`` and
``decide_gate`` dispatch on the stream's version (``state.policy``), never on the code's.

The migration point: the runtime offers its version (`PolicyOffered`, an input) to every
stream it starts deciding (at a start, an adoption by a cluster member). A stream at rest
(nothing running, waiting or out) adopts it at once; one that is busy records that it will
(`PolicyDeferred`) and adopts it with the first input after which it is at rest. Logs
recorded before versions existed hold no offer, so verify keeps their old rules throughout.

A new policy change: bump `POLICY`, keep the old rule beside the new one behind
``state.policy < N`` (in the module that decides it), add a line to `VERSIONS`, and record
a golden log (tests/golden/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass

POLICY = 2
"""The newest policy version this code can decide under: what the runtime offers."""

VERSIONS: dict[int, str] = {
    1: "the rules before 2026-11-26 (and of every stream that never adopted a version)",
    2: "2026-11-26: sub-agent calls wait in a per-agent call queue (at most maxParallelCalls "
       "per run) and return their results; the provider gate shares tokens fairly under "
       "every binding limit (it holds a request back for an agent between calls that is "
       "below its share) and grants again after refusing at a wait bound",
}
"""What each version changed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyOffered:
    """Input: the gateway deciding this stream from now on can decide under ``version``."""

    at: int
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyAdopted:
    """The stream decides under ``version`` from here on."""

    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyDeferred:
    """The stream will adopt ``version`` once it is at rest (``reason``: why not now)."""

    version: int
    reason: str


def offer(policy: int, offered: int | None, version: int) -> bool:
    """Whether an offer of ``version`` is news to a stream under ``policy`` that was offered
    ``offered`` already (None: nothing)."""
    return version > policy and (offered is None or version > offered)
