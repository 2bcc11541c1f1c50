"""When a member looks at the leases next (`next_renewal_ms`): a dead member's streams are
taken as soon as its lease runs out, not up to a renewal period later."""

from __future__ import annotations

from gateway.cluster.takeover import EXPIRY_MARGIN_MS, next_renewal_ms
from store.port import LeaseView

ME = "http://me:1#a"
OTHER = "http://other:2#b"
PERIOD = 400


def test_a_member_renews_every_period_while_the_others_renew_theirs() -> None:
    assert next_renewal_ms(LeaseView(10_000, {ME: 12_000, OTHER: 11_900}, {}), ME,
                           PERIOD) == PERIOD
    assert next_renewal_ms(LeaseView(10_000, {ME: 12_000}, {}), ME, PERIOD) == PERIOD


def test_a_member_looks_again_just_after_another_members_lease_runs_out() -> None:
    """Issue 23, 1b: the others took a killed member's agents at their first renewal after
    its lease ran out, up to a period (a fifth of the lease) later; the agents acked again
    up to that much later than the lease."""
    view = LeaseView(10_000, {ME: 12_000, OTHER: 10_150}, {})
    assert next_renewal_ms(view, ME, PERIOD) == 150 + EXPIRY_MARGIN_MS
    # Already past (the database's clock said so a moment after this view): at once.
    assert next_renewal_ms(LeaseView(10_000, {ME: 12_000, OTHER: 9_000}, {}), ME,
                           PERIOD) == 1
