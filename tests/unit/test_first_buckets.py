"""Kept first buckets take in a change the way a fresh read would see it."""

from __future__ import annotations

from costline.rules.first_buckets import FirstBuckets
from costline.rules.state import Dimensions


def _dims(**pairs: str) -> Dimensions:
    return tuple(sorted(pairs.items()))


A = _dims(team="a", env="prod", job="j1")
B = _dims(team="b", env="dev", job="j2")


def _kept() -> FirstBuckets:
    firsts = FirstBuckets()
    firsts.by_measure["cost"] = {A: 1000.0, B: 2000.0}
    firsts.by_keys[("cost", ("env", "team"))] = {("prod", "a"): 1000.0, ("dev", "b"): 2000.0}
    firsts.by_group[("cost", (("env", "prod"),), ("team",))] = {("a",): 1000.0}
    return firsts


def test_an_earlier_bucket_moves_every_form_back_and_a_later_one_moves_none() -> None:
    firsts = _kept()
    firsts.lower({A: 1200.0, B: 1500.0})  # A's is later than the kept one: no change
    assert firsts.by_measure["cost"] == {A: 1000.0, B: 1500.0}
    assert firsts.by_keys[("cost", ("env", "team"))] == {("prod", "a"): 1000.0,
                                                         ("dev", "b"): 1500.0}
    # B is not in env=prod: the group answer does not take it in
    assert firsts.by_group[("cost", (("env", "prod"),), ("team",))] == {("a",): 1000.0}


def test_a_new_tag_set_joins_its_group_and_projection() -> None:
    firsts = _kept()
    new = _dims(team="c", env="prod")  # no job: read as ""
    firsts.lower({new: 500.0})
    assert firsts.by_measure["cost"][new] == 500.0
    assert firsts.by_keys[("cost", ("env", "team"))][("prod", "c")] == 500.0
    assert firsts.by_group[("cost", (("env", "prod"),), ("team",))] == {("a",): 1000.0,
                                                                       ("c",): 500.0}
