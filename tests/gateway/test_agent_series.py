"""A scrape chooses the agents with series of their own as it goes (`Top`), and chooses as
`pick` would over all of them: attention first, then the deepest queues, ties to the
earlier."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.edge.agent_series import Top, pick

items = st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=5)),
                 max_size=60)


@given(items, st.integers(min_value=0, max_value=70))
def test_choosing_item_by_item_chooses_as_pick_does(offered: list[tuple[bool, int]],
                                                    cap: int) -> None:
    top = Top(cap)
    for index, (attention, depth) in enumerate(offered):
        top.offer(attention, depth, index)
    assert top.chosen() == pick([a for a, _ in offered], [d for _, d in offered], cap)


def test_attention_goes_first_then_depth_then_the_earlier() -> None:
    top = Top(3)
    for index, item in enumerate([(False, 9), (True, 0), (False, 9), (False, 9), (True, 1)]):
        top.offer(*item, index)
    assert top.chosen() == [0, 1, 4]
