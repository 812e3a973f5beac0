"""How ``RedisState`` splits a long read into round trips (``_chunks``)."""

from __future__ import annotations

from connectors.redis_state import _chunks


def test_runs_hold_at_most_so_many_buckets_and_keep_every_interval_once() -> None:
    covers = [[("1h", i)] * size for i, size in enumerate([1, 3, 2, 5, 1, 1, 4])]
    runs = list(_chunks(covers, 4))
    assert [first for first, _ in runs] == [0, 2, 3, 4, 6]
    # the interval of 5 buckets is a run of its own: an interval is never split
    assert [sum(len(c) for c in run) for _, run in runs] == [4, 2, 5, 2, 4]
    assert [cover for _, run in runs for cover in run] == covers
    assert all(covers[first] is run[0] for first, run in runs)
    assert list(_chunks([], 4)) == []
