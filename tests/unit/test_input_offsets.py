"""Which input offsets intake may commit (``costline.rules.input_offsets``), as a table:
takes delivered in order and out of order, positions past skipped markers, rebalances."""

from __future__ import annotations

import pytest

from costline.rules.input_offsets import InputOffsets

A, B = "usage-0", "usage-1"

# (positions each take moved, in fetch order; the takes delivered, in order; partitions
# owned) → what may be committed
CASES = [
    pytest.param([{A: 5}], [0], {A, B}, {A: 5}, id="one take delivered"),
    pytest.param([{A: 5}, {A: 9}], [1], {A, B}, {}, id="a later take waits for the first"),
    pytest.param([{A: 5}, {A: 9}], [1, 0], {A, B}, {A: 9}, id="out of order, both done"),
    pytest.param([{A: 5}, {B: 3}, {A: 9}], [0, 2], {A, B}, {A: 5},
                 id="a gap holds back every partition after it"),
    pytest.param([{A: 5}, {A: 6}], [0, 1], {A, B}, {A: 6},
                 id="a take of only a marker moves its partition past it"),
    pytest.param([{A: 5}, {B: 3}], [0, 1], {B}, {B: 3}, id="only owned partitions"),
]


@pytest.mark.parametrize(("moved", "delivered", "owned", "expected"), CASES)
def test_commits(moved: list[dict[str, int]], delivered: list[int], owned: set[str],
                 expected: dict[str, int]) -> None:
    offsets = InputOffsets()
    takes = [offsets.fetched(positions) for positions in moved]
    for index in delivered:
        offsets.delivered(takes[index])
    assert offsets.to_commit(owned) == expected


def test_what_was_committed_is_not_committed_again_until_it_moves() -> None:
    offsets = InputOffsets()
    offsets.delivered(offsets.fetched({A: 5}))
    offsets.was_committed(offsets.to_commit({A}))
    assert offsets.to_commit({A}) == {}
    offsets.delivered(offsets.fetched({A: 7}))
    assert offsets.to_commit({A}) == {A: 7}


def test_takes_fetched_before_a_rebalance_are_never_committed_after_it() -> None:
    offsets = InputOffsets()
    before = offsets.fetched({A: 50})
    offsets.rebalanced()
    after = offsets.fetched({A: 12})
    offsets.delivered(before)
    offsets.delivered(after)
    assert offsets.to_commit({A}) == {A: 12}


def test_a_take_after_a_rebalance_still_waits_for_the_takes_before_it() -> None:
    offsets = InputOffsets()
    before = offsets.fetched({A: 50})
    offsets.rebalanced()
    offsets.delivered(offsets.fetched({B: 4}))
    assert offsets.to_commit({A, B}) == {}
    offsets.delivered(before)
    assert offsets.to_commit({A, B}) == {B: 4}
