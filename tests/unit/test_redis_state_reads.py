"""How ``RedisState`` splits a long read into round trips (``_chunks``) and sums a bucket's
fields (``_sum_fields``)."""

from __future__ import annotations

from costline.connectors.redis_state import _chunks, _sum_fields


def test_runs_hold_at_most_so_many_buckets_and_keep_every_interval_once() -> None:
    covers = [[("1h", i)] * size for i, size in enumerate([1, 3, 2, 5, 1, 1, 4])]
    runs = list(_chunks(covers, 4))
    assert [first for first, _ in runs] == [0, 2, 3, 4, 6]
    # the interval of 5 buckets is a run of its own: an interval is never split
    assert [sum(len(c) for c in run) for _, run in runs] == [4, 2, 5, 2, 4]
    assert [cover for _, run in runs for cover in run] == covers
    assert all(covers[first] is run[0] for first, run in runs)
    assert list(_chunks([], 4)) == []


def test_a_bucket_is_summed_from_usage_fields_and_from_the_separate_fields_before_them() -> None:
    # A bucket written across an upgrade holds both forms of a tag set's usage.
    fields = {b"aa:u": b"10 3", b"bb:u": b"7 0", b"aa:c": b"5", b"aa:q": b"2",
              b"aa:w:oom": b"40", b"bb:w:node_failure": b"9"}
    for mapping in (fields, {k.decode(): v.decode() for k, v in fields.items()}):
        sums: dict[str, dict[str, int]] = {}
        for measure in ("cost", "quantity", "waste"):
            sums[measure] = {}
            _sum_fields(mapping, measure, sums[measure])
        assert sums == {"cost": {"aa": 15, "bb": 7}, "quantity": {"aa": 5, "bb": 0},
                        "waste": {"aa\toom": 40, "bb\tnode_failure": 9}}
