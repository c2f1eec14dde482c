"""A node's first load request is small (``assign.head_first``): its answer, and the write of its records, come
while the node loads the rest. The split keeps every segment once and in order; small groups stay as they are."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from querycoord.task.assign import HEAD_MIN, HEAD_SHARE, head_first


@given(st.lists(st.integers(0, 5000), max_size=6))
def test_the_split_keeps_every_segment_once_in_order(sizes: list[int]) -> None:
    groups = [list(range(sum(sizes[:i]), sum(sizes[:i + 1]))) for i in range(len(sizes))]
    out = head_first(groups)
    assert [x for g in out for x in g] == [x for g in groups for x in g]
    assert out[1:] == groups[1:] if len(out) == len(groups) else out[2:] == groups[1:]


def test_a_large_first_group_gets_a_small_head_and_a_small_one_stays_whole() -> None:
    big = list(range(1250))
    out = head_first([big, [7, 8]])
    assert [len(g) for g in out] == [1250 // HEAD_SHARE, 1250 - 1250 // HEAD_SHARE, 2]
    assert head_first([list(range(2 * HEAD_MIN - 1))]) == [list(range(2 * HEAD_MIN - 1))]
    assert [len(g) for g in head_first([list(range(2 * HEAD_MIN))])] == [HEAD_MIN, HEAD_MIN]
    assert head_first([]) == []
