"""The cap rule, made fast for replay and verify, still picks what it always picked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lanes import AgentRequest, Mode
from lanes.config import DropPolicy
from lanes.requests import RANK, Priority
from lanes.rules import Victim, cap_victim
from lanes.state import Pending
from tests.lanes.harness import Bench


def reference_cap_victim(
    pending: list[Pending], incoming: AgentRequest, policy: DropPolicy
) -> Victim | None:
    """The rule as first written, one request at a time (kept to check the fast one)."""
    lowest: int | None = None
    for entry in pending:
        rank = RANK[entry.request.priority]
        if rank < RANK[Priority.HIGH] and (lowest is None or rank < lowest):
            lowest = rank
    incoming_rank = RANK[incoming.priority]
    if incoming_rank < RANK[Priority.HIGH] and (lowest is None or incoming_rank < lowest):
        return Victim(None, incoming.priority)
    if lowest is None:
        return None
    if policy is DropPolicy.NEW:
        if incoming_rank == lowest:
            return Victim(None, incoming.priority)
        indexes = range(len(pending) - 1, -1, -1)
    else:
        indexes = range(len(pending))
    for index in indexes:
        if RANK[pending[index].request.priority] == lowest:
            return Victim(index, pending[index].request.priority)
    raise AssertionError("unreachable")


@given(
    priorities=st.lists(st.sampled_from(list(Priority)), max_size=12),
    incoming=st.sampled_from(list(Priority)),
    policy=st.sampled_from(list(DropPolicy)),
)
def test_cap_victim_picks_what_the_reference_rule_picks(
    priorities: list[Priority], incoming: Priority, policy: DropPolicy
) -> None:
    bench = Bench()
    pending = [Pending(bench.make(priority=p.value), 0, Mode.FOLLOWUP) for p in priorities]
    request = bench.make(priority=incoming.value)
    assert cap_victim(pending, request, policy) == reference_cap_victim(pending, request, policy)


def test_the_reference_can_tell_the_rules_apart() -> None:
    bench = Bench()
    pending = [Pending(bench.make(priority=p), 0, Mode.FOLLOWUP) for p in ("low", "low")]
    request = bench.make(priority="normal")
    assert reference_cap_victim(pending, request, DropPolicy.OLD) == Victim(0, Priority.LOW)
    assert reference_cap_victim(pending, request, DropPolicy.NEW) == Victim(1, Priority.LOW)
