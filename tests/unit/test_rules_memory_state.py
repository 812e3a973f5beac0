"""InMemoryState prices, dedups and sums exactly like the stream processors, per bucket."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costline.rules.events import UsageEvent
from costline.rules.prices import PricingError
from costline.rules.state import BUCKET_S, align_down, literal, narrowed
from tests.unit.rulefiles.builders import DAY, HOUR, T0, fault, sample, state, usage


def test_cost_and_quantity_follow_the_price_book() -> None:
    found = state(usage(T0, 8, team="pretrain"), usage(T0, 0.1, team="pretrain"))
    assert found.totals("cost", {}, ["team"], T0, T0 + BUCKET_S) == {("pretrain",): 20_250_000}
    assert found.totals("quantity", {}, [], T0, T0 + BUCKET_S) == {(): 8_100_000}


def test_an_event_id_is_counted_once() -> None:
    event = usage(T0, 8)
    found = state(event)
    assert found.add(event) is False
    assert found.totals("cost", {}, [], T0, T0 + BUCKET_S) == {(): 20_000_000}


def test_an_event_the_book_cannot_price_is_refused_before_anything_is_counted() -> None:
    found = state()
    bad = usage(T0, 1).model_copy(update={"resource_type": "gpu.unknown"})
    with pytest.raises(PricingError):
        found.add(bad)
    assert found.totals("cost", {}, [], T0, T0 + BUCKET_S) == {}
    assert found.add(bad.model_copy(update={"resource_type": "gpu.h100"})) is True


def test_match_takes_globs_and_pseudo_tags() -> None:
    found = state(
        usage(T0, 1, team="pretrain", env="prod"),
        usage(T0, 1, team="posttrain", env="prod"),
        usage(T0, 1, "gpu.reserved", team="pretrain", env="dev"),
        usage(T0, 1000, "logs.ingest", team="pretrain"),
    )
    totals = found.totals
    assert totals("cost", {"team": "p*train", "env": "prod"}, [], T0, T0 + 300) == {(): 5_000_000}
    fixed = totals("cost", {"billing": "fixed"}, ["team"], T0, T0 + 300)
    assert fixed == {("pretrain",): 2_000_000}
    assert totals("cost", {"category": "observability"}, [], T0, T0 + 300) == {(): 500_000_000}
    assert totals("cost", {"resource_type": "gpu.*"}, ["env"], T0, T0 + 300) == {
        ("prod",): 5_000_000,
        ("dev",): 2_000_000,
    }


def test_an_absent_tag_groups_and_matches_as_empty() -> None:
    found = state(usage(T0, 1, team="pretrain"), usage(T0, 1))
    assert found.totals("cost", {}, ["team"], T0, T0 + 300) == {
        ("pretrain",): 2_500_000,
        ("",): 2_500_000,
    }
    assert found.totals("cost", {"team": "*"}, [], T0, T0 + 300) == {(): 5_000_000}
    assert found.totals("cost", {"team": ""}, [], T0, T0 + 300) == {(): 2_500_000}


@pytest.mark.parametrize(("pattern", "jobs"), [
    ("sweep[lr=1]", {"sweep[lr=1]"}),  # not a class: "sweep=" and "sweepl" are other jobs
    ("run?", {"run?"}),                # not one character: "runA" is another job
    ("run*", {"run?", "runA"}),
    ("sweep*]", {"sweep[lr=1]"}),
    ("a\\*b", {"a*b"}),               # a star that is part of the value
])
def test_only_a_star_is_a_glob_in_a_match(pattern: str, jobs: set[str]) -> None:
    """Tag values may hold any character: a match reads only ``*`` as a pattern."""
    names = ["sweep[lr=1]", "sweep=", "sweepl", "run?", "runA", "a*b", "axb"]
    found = state(*(usage(T0, 1, job=name) for name in names))
    assert set(found.totals("cost", {"job": pattern}, ["job"], T0, T0 + 300)) == {
        (job,) for job in jobs}


def test_a_narrowed_match_selects_one_group_even_with_glob_characters_in_values() -> None:
    found = state(usage(T0, 1, job="run-[1]*"), usage(T0, 1, job="run-1x"))
    match = narrowed({}, ["job"], ("run-[1]*",))
    assert match == {"job": literal("run-[1]*")}
    assert found.totals("cost", match, [], T0, T0 + 300) == {(): 2_500_000}


def test_waste_has_the_fault_type_as_a_dimension() -> None:
    found = state(
        fault(T0, units=8, lost_seconds=3600, recovery_seconds=0, job="run-42"),
        fault(T0, units=1, lost_seconds=3600, recovery_seconds=0, kind="oom"),
    )
    assert found.totals("waste", {}, ["fault"], T0, T0 + 300) == {
        ("node_failure",): 20_000_000,
        ("oom",): 2_500_000,
    }
    assert found.totals("cost", {}, [], T0, T0 + 300) == {}


def test_totals_answer_per_5_minute_bucket() -> None:
    found = state(usage(T0 + 180, 1))
    assert found.totals("cost", {}, [], T0, T0 + 300) == {(): 2_500_000}
    assert found.totals("cost", {}, [], T0 + 300, T0 + 600) == {}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40 * DAY), st.integers(1, 50)), min_size=1, max_size=40),
    st.integers(0, 40 * DAY),
    st.integers(0, 40 * DAY),
)
def test_long_windows_equal_the_sum_of_their_events(
    events: list[tuple[int, int]], a: int, b: int
) -> None:
    start, end = sorted((align_down(T0 + a), align_down(T0 + b)))
    found = state(*(usage(T0 + offset, q) for offset, q in events))
    expected = sum(q * 2_500_000 for offset, q in events if start <= align_down(T0 + offset) < end)
    assert found.totals("cost", {}, [], start, end).get((), 0) == expected


def test_samples_are_per_resource_ascending_and_since_a_time() -> None:
    found = state(
        sample(T0 + 120, 0.5, team="a"),
        sample(T0, 0.9, team="a"),
        sample(T0 + 60, 0.1, "cluster-a/node-2", team="b"),
        sample(T0 + 60, 0.1, "cluster-a/node-3", team="a", metric="mem_util"),
    )
    got = found.samples("gpu_util", {"team": "a"}, T0)
    assert [(r.resource_id, list(r.points)) for r in got] == [
        ("cluster-a/node-017", [(T0, 0.9), (T0 + 120, 0.5)])
    ]
    assert found.samples("gpu_util", {"category": "compute"}, T0 + 100)[0].points == [
        (T0 + 120, 0.5)
    ]


def test_earliest_data_and_recent_faults() -> None:
    found = state(
        usage(T0 + HOUR + 7, 1, team="a"),
        usage(T0 + DAY, 1, team="b"),
        fault(T0, job="run-1"),
        fault(T0 + HOUR, job="run-2"),
    )
    assert found.earliest("cost", {"team": "a"}) == T0 + HOUR
    assert found.earliest("cost", {"team": "c"}) is None
    assert [f.tags["job"] for f in found.faults(T0 + 1)] == ["run-2"]


@pytest.mark.parametrize("ts", [-0.5, -300.0, -299.9, 0.0, 299.9, 1796000123.75])
def test_a_bucket_starts_where_the_ledgers_slot_does(ts: float) -> None:
    """In memory and on the ledger (hence in Redis) an event falls in the same 5-minute
    bucket, before 1970 too."""
    from costline.rules.ledger import Intake
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    event = UsageEvent(event_id="u-1", kind="usage", ts=ts, resource_id="n", quantity=1.0,
                       resource_type="gpu.h100", unit="gpu_hour")
    [record] = Intake(PriceBook.load(DEFAULT_PRICES), 1).records([event]).values()
    [entry] = record.entries
    assert align_down(ts) == entry[2]


def test_a_fractional_end_takes_its_bucket_in_as_redis_does() -> None:
    """Redis's cover rounds [start, end) out to whole buckets: the memory state too."""
    from costline.rules.memory_state import InMemoryState
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    state = InMemoryState(PriceBook.load(DEFAULT_PRICES))
    state.add_all([UsageEvent(event_id="u-1", kind="usage", ts=T0 + 300.2, resource_id="n",
                              quantity=1.0, resource_type="gpu.h100", unit="gpu_hour")])
    assert state.totals("cost", {}, [], T0, T0 + 300.5) == {(): 2_490_000}
