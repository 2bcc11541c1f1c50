"""A caller's scope over a list of agents."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.base.roles import Role
from gateway.edge.auth import Principal

IDS = st.lists(st.sampled_from([f"agent{n}" for n in range(12)]), unique=True)


@given(IDS, st.none() | st.frozensets(st.sampled_from([f"agent{n}" for n in range(16)])))
def test_visible_keeps_the_agents_in_scope_in_their_order(ids: list[str],
                                                          scope: frozenset[str] | None) -> None:
    principal = Principal("viewer", Role.VIEWER, scope)
    assert principal.visible(ids) == [a for a in ids if principal.may_see(a)]
    assert principal.visible(iter(ids)) == principal.visible(ids)  # (any iterable, once)
