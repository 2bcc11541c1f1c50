"""A scrape chooses the agents with series of their own as it goes (`Top`), and chooses as
a sort of all of them would (`pick`, the rule written over a whole list): attention first,
then the deepest queues, ties to the earlier."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from gateway.edge.agent_series import Top

items = st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=5)),
                 max_size=60)


def pick(attention: Sequence[bool], depth: Sequence[int], cap: int) -> list[int]:
    """The indexes of the ``cap`` items to show, in order, from the whole list at once."""
    if len(depth) <= cap:
        return list(range(len(depth)))
    first = [i for i, flag in enumerate(attention) if flag]
    others = [i for i, flag in enumerate(attention) if not flag]
    deepest = depth.__getitem__
    # (Python's sort is stable, reversed too: equal depths keep their order.)
    chosen = sorted(first, key=deepest, reverse=True)[:cap]
    chosen += sorted(others, key=deepest, reverse=True)[:cap - len(chosen)]
    return sorted(chosen)


@given(items, st.integers(min_value=0, max_value=70))
def test_choosing_item_by_item_chooses_as_a_sort_of_them_all(
        offered: list[tuple[bool, int]], cap: int) -> None:
    top = Top(cap)
    for index, (attention, depth) in enumerate(offered):
        top.offer(attention, depth, index)
    assert top.chosen() == pick([a for a, _ in offered], [d for _, d in offered], cap)


def test_attention_goes_first_then_depth_then_the_earlier() -> None:
    top = Top(3)
    for index, item in enumerate([(False, 9), (True, 0), (False, 9), (False, 9), (True, 1)]):
        top.offer(*item, index)
    assert top.chosen() == [0, 1, 4]
