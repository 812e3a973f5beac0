"""Pricing events into ledger entries, and folding entries into per-tag-set, per-slot sums."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costline import rules
from costline.rules import ledger as ledger_module
from costline.rules.events import Category, Parsed, parse_message
from costline.rules.ledger import (
    SLOT_S,
    Intake,
    Record,
    event_key,
    resource_home,
    tagset_id,
    tagset_json,
)
from costline.rules.prices import Billing, PriceBook, PricingError
from costline.rules.tally import Tally, Usage, tally_of

EXAMPLE = Path(rules.__file__).parent / "prices" / "example.yaml"
T0 = 1_796_025_600  # 2026-11-30T08:00:00Z, a slot boundary
H100_8H = 19_920_000  # 8 × 2.49
PARTITIONS = 6


@pytest.fixture(scope="module")
def prices() -> PriceBook:
    return PriceBook.load(EXAMPLE)


@pytest.fixture
def intake(prices) -> Intake:
    return Intake(prices, PARTITIONS)


def parse(raw: str | bytes) -> Any:
    parsed = parse_message(raw if isinstance(raw, bytes) else raw.encode(), now=4e9)
    assert isinstance(parsed, Parsed), parsed
    [event] = parsed.events
    return event


def usage(**changes: Any) -> Any:
    event = {"event_id": "u-1", "kind": "usage", "ts": T0, "resource_id": "node-1",
             "resource_type": "gpu.h100", "quantity": 8.0, "unit": "gpu_hour",
             "tags": {"team": "pretrain", "project": "llm-70b"}}
    event.update(changes)
    return parse(json.dumps(event))


def fault(**changes: Any) -> Any:
    event = {"event_id": "f-3", "kind": "fault", "ts": T0, "fault": "node_failure",
             "resource_type": "gpu.h100", "units": 512, "lost_seconds": 1800,
             "recovery_seconds": 900, "tags": {"team": "pretrain", "project": "llm-70b"}}
    event.update(changes)
    return parse(json.dumps(event))


def utilization(**changes: Any) -> Any:
    event = {"event_id": "m-1", "kind": "utilization", "ts": T0, "resource_id": "node-1",
             "resource_type": "gpu.h100", "metric": "gpu_util", "value": 0.5,
             "tags": {"team": "pretrain"}}
    event.update(changes)
    return parse(json.dumps(event))


def records(intake: Intake, events: list[Any]) -> list[Record]:
    """Every home's record, through their encoding (as the ledger topic carries them)."""
    return [Record.decode(r.encode()) for r in intake.records(events).values()]


def fold(intake: Intake, events: list[Any], skip: frozenset[int] = frozenset()) -> Tally:
    return tally_of(records(intake, events), skip)


def dims_of(tally: Tally, tsid: str) -> dict[str, str]:
    return json.loads(tally.tagsets[tsid])


def dedup(event_id: str) -> int:
    return event_key(event_id, PARTITIONS)[0]


def test_a_usage_event_adds_its_cost_and_quantity_to_its_tag_set_and_slot(intake):
    tally = fold(intake, [usage()])
    [(tsid, slot)] = tally.usage
    assert slot == T0
    assert tally.usage[(tsid, slot)] == Usage(gross=H100_8H, quantity=8_000_000)
    assert dims_of(tally, tsid) == {"team": "pretrain", "project": "llm-70b",
                                    "category": "compute", "resource_type": "gpu.h100",
                                    "billing": "elastic"}
    assert tally.events == 1
    assert tally.digests == {T0 // 3600 * 3600: [dedup("u-1")]}


def test_usage_events_of_one_tag_set_and_slot_are_summed(intake):
    tally = fold(intake, [usage(event_id="a", quantity=0.1), usage(event_id="b", quantity=0.2),
                          usage(event_id="c", ts=T0 + 299, quantity=0.3)])
    [cell] = tally.usage.values()
    assert cell == Usage(gross=249_000 + 498_000 + 747_000, quantity=600_000)
    assert tally.events == 3


def test_a_stated_cost_and_category_are_folded_as_stated(intake):
    tally = fold(intake, [usage(cost=1.5, category="storage")])
    [((tsid, _), cell)] = tally.usage.items()
    assert cell.gross == 1_500_000
    assert dims_of(tally, tsid)["category"] == "storage"


def test_a_credit_is_kept_apart_from_gross_spend_under_its_charge(intake):
    tally = fold(intake, [usage(), usage(event_id="c-1", quantity=0, cost=-12.5,
                                         charge="credit")])
    cells = {json.loads(tally.tagsets[tsid]).get("charge", "usage"): cell
             for (tsid, _), cell in tally.usage.items()}
    assert cells == {"usage": Usage(gross=H100_8H, quantity=8_000_000),
                     "credit": Usage(credits=12_500_000)}


def test_a_downward_adjustment_of_a_tag_set_adds_to_its_credits_not_its_gross(intake):
    tally = fold(intake, [usage(event_id="a", cost=10, charge="adjustment"),
                          usage(event_id="b", cost=-4, charge="adjustment")])
    [cell] = tally.usage.values()
    assert (cell.gross, cell.credits) == (10_000_000, 4_000_000)


def test_a_negative_metered_usage_is_refused_naming_the_field(intake):
    with pytest.raises(PricingError) as caught:
        intake.records([usage(cost=-1.0)])
    assert caught.value.code == "negative_cost"
    assert "field cost" in caught.value.reason and "usage" in caught.value.reason


def test_a_fault_adds_its_waste_under_its_fault_type_and_no_cost(intake):
    tally = fold(intake, [fault()])
    assert tally.usage == {}
    [((tsid, slot, kind), waste)] = tally.waste.items()
    assert (slot, kind, waste) == (T0, "node_failure", 956_160_000)
    assert dims_of(tally, tsid)["resource_type"] == "gpu.h100"
    [(ts, text)] = tally.faults
    assert ts == T0
    assert json.loads(text)["event_id"] == "f-3"


def test_waste_and_cost_of_the_same_tags_share_a_tag_set(intake):
    tally = fold(intake, [usage(), fault(fault="oom", units=1, lost_seconds=3600,
                                         recovery_seconds=0)])
    [(tsid, _)] = tally.usage
    assert tally.waste == {(tsid, T0, "oom"): 2_490_000}


def test_faults_of_different_types_are_kept_apart(intake):
    tally = fold(intake, [fault(event_id="f-1", fault="oom"),
                          fault(event_id="f-2", fault="comm_timeout")])
    assert sorted((kind, waste) for (_, _, kind), waste in tally.waste.items()) == [
        ("comm_timeout", 956_160_000), ("oom", 956_160_000)]


def test_a_utilization_sample_adds_no_money_and_is_kept_as_a_sample(intake):
    tally = fold(intake, [utilization()])
    assert tally.usage == {} and tally.waste == {}
    assert tally.samples == {("node-1", "gpu_util"): [(T0, 0.5)]}
    latest = tally.latest[("node-1", "gpu_util")]
    assert (latest.ts, latest.value, latest.resource_type) == (T0, 0.5, "gpu.h100")
    assert latest.tags == {"team": "pretrain"}
    assert tally.events == 0 and not tally.empty  # a gauge: never deduplicated


def test_the_latest_utilization_sample_is_the_newest_by_event_time(intake):
    tally = fold(intake, [utilization(event_id="m-2", ts=T0 + 60, value=0.9),
                          utilization(event_id="m-1", ts=T0, value=0.1)])
    assert tally.samples[("node-1", "gpu_util")] == [(T0 + 60, 0.9), (T0, 0.1)]
    assert tally.latest[("node-1", "gpu_util")].value == 0.9


def test_a_resource_s_samples_share_one_home_whatever_their_event_ids(intake):
    homes = {home for n in range(50)
             for home in intake.records([utilization(event_id=f"m-{n}")])}
    assert homes == {resource_home("node-1", PARTITIONS)}


def test_copies_of_an_event_go_home_together_and_count_once(intake):
    first = intake.records([usage()])
    again = intake.records([usage(quantity=100.0)])  # a resend, whatever else it says
    assert list(first) == list(again) == [event_key("u-1", PARTITIONS)[1]]
    tally = tally_of([*first.values(), *again.values()])
    [cell] = tally.usage.values()
    assert cell == Usage(gross=H100_8H, quantity=8_000_000)
    assert tally.events == 1
    assert sum(map(len, tally.digests.values())) == 1


def test_event_ids_spread_over_every_home_partition(intake):
    homes = {event_key(f"e-{n}", PARTITIONS)[1] for n in range(200)}
    assert homes == set(range(PARTITIONS))


def test_an_event_folded_again_into_the_same_tally_counts_once(intake):
    tally = fold(intake, [usage()])
    tally.fold(records(intake, [usage(), usage(event_id="u-2")]))
    assert sum(cell.gross for cell in tally.usage.values()) == 2 * H100_8H
    assert tally.events == 2


def test_an_event_id_shared_by_two_kinds_counts_once(intake):
    tally = fold(intake, [usage(event_id="x"), fault(event_id="x")])
    assert tally.waste == {}
    assert tally.events == 1


def test_skip_excludes_the_events_whose_digest_it_holds(intake):
    skip = frozenset({dedup("u-1"), dedup("f-3")})
    tally = fold(intake, [usage(), usage(event_id="u-2", quantity=1.0), fault()], skip)
    [cell] = tally.usage.values()
    assert cell == Usage(gross=2_490_000, quantity=1_000_000)
    assert tally.events == 1
    assert list(tally.digests.values()) == [[dedup("u-2")]]
    assert tally.faults == []


def test_event_digests_are_stable_distinct_and_63_bits():
    assert event_key("u-1", 6) == event_key("u-1", 6)
    assert dedup("u-1") != dedup("u-2")
    assert all(0 <= dedup(f"e{n}") < 2**63 for n in range(1000))


def test_a_take_refuses_a_message_whole_and_keeps_its_index(intake):
    good = json.dumps([{"event_id": "a", "kind": "usage", "ts": T0, "resource_id": "n",
                        "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour"}])
    priced_badly = json.dumps([json.loads(good)[0], {**json.loads(good)[0], "event_id": "b",
                                                     "resource_type": "gpu.b300"}])
    taken = intake.take([good.encode(), b"{nope", priced_badly.encode()], now=4e9)
    assert [(index, code) for index, code, _ in taken.refused] == [
        (1, "invalid_json"), (2, "unknown_resource_type")]
    assert taken.events == 1
    [[raw]] = taken.records.values()
    assert [entry[1] for entry in Record.decode(raw).entries] == [dedup("a")]


def test_a_large_record_is_sent_in_parts_that_name_their_own_tag_sets(intake, monkeypatch):
    monkeypatch.setattr(ledger_module, "RECORD_ENTRIES", 3)
    events = [usage(event_id=f"e-{n}", tags={"team": f"t{n}"}) for n in range(40)]
    taken = intake.take([json.dumps([json.loads(e.model_dump_json()) for e in events])
                         .encode()], now=4e9)
    parts = [Record.decode(raw) for raws in taken.records.values() for raw in raws]
    assert all(len(part.entries) <= 3 for part in parts)
    assert sum(len(part.entries) for part in parts) == 40
    for part in parts:
        assert set(part.tagsets) == {entry[3] for entry in part.entries}
    assert tally_of(parts).events == 40


def test_tag_sets_with_the_same_tags_in_another_order_have_the_same_id(intake):
    first = parse('{"event_id": "a", "kind": "usage", "ts": 1796025600, "resource_id": "n",'
                  ' "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour",'
                  ' "tags": {"team": "t", "project": "p", "env": "prod"}}')
    second = parse('{"event_id": "b", "kind": "usage", "ts": 1796025600, "resource_id": "n",'
                   ' "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour",'
                   ' "tags": {"env": "prod", "project": "p", "team": "t"}}')
    assert list(first.tags) != list(second.tags)
    tally = fold(intake, [first, second])
    [(tsid, _)] = tally.usage
    assert tally.usage[(tsid, T0)].gross == 2 * 2_490_000
    assert fold(Intake(intake.prices, PARTITIONS), [second]).tagsets == {
        tsid: tally.tagsets[tsid]}


@settings(max_examples=300)
@given(st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40), max_size=12))
def test_tagset_json_is_the_text_json_dumps_gives(dims):
    # Tag set ids are digests of this text and live in Redis: it may never change.
    dims = {**dims, "category": Category.compute, "billing": Billing.fixed}  # str enums too
    assert tagset_json(dims) == json.dumps(dims, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False)


def test_tagset_json_is_canonical_and_its_id_is_stable():
    one = tagset_json({"team": "t", "env": "prod", "name": "équipe"})
    other = tagset_json({"name": "équipe", "env": "prod", "team": "t"})
    assert one == other == '{"env":"prod","name":"équipe","team":"t"}'
    assert tagset_id(one) == tagset_id(other)
    assert len(tagset_id(one)) == 16
    assert tagset_id(one) != tagset_id(tagset_json({"env": "dev", "name": "équipe", "team": "t"}))


def test_different_tag_values_make_different_tag_sets(intake):
    tally = fold(intake, [usage(event_id="a", tags={"team": "a"}),
                          usage(event_id="b", tags={"team": "b"})])
    assert len(tally.usage) == 2
    assert sorted(dims_of(tally, tsid)["team"] for tsid, _ in tally.usage) == ["a", "b"]


@pytest.mark.parametrize("tags", [
    [{"a": "b", "c": "d"}, {"a": "c", "b": "d"}],  # the same strings, keys and values apart
    [{"a": "b"}, {"b": "a"}],
    [{"team": "x"}, {"env": "x"}],  # the same values
    [{"team": "t"}, {"team": "t", "env": "t"}],
])
def test_tag_sets_that_share_their_strings_are_told_apart(intake, tags):
    # the cache of tag-set ids is keyed by the keys, then the values, in one flat tuple
    tally = fold(intake, [usage(event_id=f"e-{n}", tags=t) for n, t in enumerate(tags)])

    def text(dims: dict[str, str]) -> str:
        return json.dumps(dims, sort_keys=True)

    assert sorted(text(dims_of(tally, tsid)) for tsid, _ in tally.usage) == sorted(
        text({**t, "category": "compute", "resource_type": "gpu.h100", "billing": "elastic"})
        for t in tags)


def test_pseudo_tags_win_over_tags_of_the_same_name(intake):
    tags = {"team": "t", "category": "mine", "resource_type": "fake", "billing": "free",
            "charge": "free"}
    tally = fold(intake, [usage(tags=tags), fault(tags=tags)])
    [(tsid, _)] = tally.usage
    assert dims_of(tally, tsid) == {"team": "t", "category": "compute",
                                    "resource_type": "gpu.h100", "billing": "elastic"}


def test_a_tag_set_of_an_event_without_pseudo_tag_clash_equals_one_with_it(intake):
    plain = fold(intake, [usage(tags={"team": "t"})])
    clashing = fold(Intake(intake.prices, PARTITIONS),
                    [usage(tags={"team": "t", "category": "mine"})])
    assert plain.tagsets == clashing.tagsets


@pytest.mark.parametrize(
    ("ts", "slot"),
    [(T0, T0), (T0 + 0.5, T0), (T0 + 299.999, T0), (T0 + 300, T0 + 300), (T0 + 599, T0 + 300),
     (T0 - 1, T0 - 300), ("2026-11-30T13:34:59+05:30", T0), ("2026-11-30T08:07:30Z", T0 + 300)],
)
def test_the_slot_is_the_five_minute_floor_of_ts(intake, ts, slot):
    tally = fold(intake, [usage(ts=ts)])
    [(_, got)] = tally.usage
    assert got == slot


@settings(deadline=None)
@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_the_slot_of_any_ts_is_its_five_minute_floor(prices, ts):
    tally = fold(Intake(prices, PARTITIONS), [usage(ts=ts)])
    [(_, slot)] = tally.usage
    assert slot == math.floor(ts / SLOT_S) * SLOT_S
    assert slot <= ts < slot + SLOT_S


def test_the_slot_of_a_ts_just_before_the_epoch_is_the_slot_before_it(intake):
    tally = fold(intake, [usage(ts=-0.5)])
    [(_, slot)] = tally.usage
    assert slot == -300


def test_events_of_different_slots_are_kept_apart(intake):
    tally = fold(intake, [usage(event_id="a", ts=T0 + 10), usage(event_id="b", ts=T0 + 310)])
    assert sorted(slot for _, slot in tally.usage) == [T0, T0 + 300]


def test_pricing_names_the_first_event_the_book_cannot_price(intake):
    events = [usage(), utilization(), usage(event_id="u-9", resource_type="gpu.b300")]
    with pytest.raises(PricingError) as caught:
        intake.records(events)
    assert caught.value.code == "unknown_resource_type"
    assert caught.value.reason.startswith("event 2: field resource_type: ")


def test_a_popular_tag_set_stays_known_however_many_rare_ones_pass(intake, monkeypatch):
    worked_out: list[str] = []

    def counted(dims: Any) -> str:
        canonical = tagset_json(dims)
        worked_out.append(canonical)
        return canonical

    monkeypatch.setattr(ledger_module, "_TAGSET_CACHE_MAX", 10)
    monkeypatch.setattr(ledger_module, "tagset_json", counted)
    tally = Tally()
    for n in range(200):  # the popular tag set between every two rare ones
        tally.fold(records(intake, [usage(event_id=f"p-{n}"),
                                    usage(event_id=f"r-{n}", tags={"team": f"rare-{n}"})]))
    popular = [c for c in worked_out if "llm-70b" in c]
    assert len(popular) == 1
    assert len(worked_out) == 201  # each rare one once: none is seen again
    assert tally.events == 400


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["usage", "fault", "utilization"]),
                          st.integers(0, 7), st.integers(0, 1), st.integers(0, 1)),
                min_size=1, max_size=30),
       st.integers(0, 30))
def test_folding_records_one_by_one_equals_folding_them_together(prices, specs, cut):
    # Each spec: kind, event id, slot and a small number: events often share their time.
    make = {"usage": lambda n, ts, v: usage(event_id=f"u{n}", ts=ts, quantity=v + 1),
            "fault": lambda n, ts, v: fault(event_id=f"f{n}", ts=ts, units=v + 1),
            "utilization": lambda n, ts, v: utilization(event_id=f"m{n}", ts=ts, value=n)}
    events = [make[kind](n, T0 + slot * SLOT_S + v, v) for kind, n, slot, v in specs]
    intake = Intake(prices, 1)
    whole = fold(intake, events)
    parts = Tally()
    parts.fold(records(intake, events[:cut]))
    parts.fold(records(intake, events[cut:]))
    assert parts.usage == whole.usage and parts.waste == whole.waste
    assert parts.tagsets == whole.tagsets
    assert parts.digests == whole.digests and parts.seen == whole.seen
    assert parts.samples == whole.samples and parts.latest == whole.latest


@pytest.mark.parametrize(("event_id", "partitions", "expected"), [
    ("u-1", 6, (5310491309176395390, 5)),
    ("u-1", 1024, (5310491309176395390, 789)),
    ("2026-12-04T00:00:00Z/gpu-0042", 6, (2992158299400946159, 5)),
    ("ключ", 1024, (5933692296812783874, 845)),
])
def test_an_event_ids_digest_and_home_never_change(event_id: str, partitions: int,
                                                   expected: tuple[int, int]) -> None:
    # A resend after an upgrade must meet its first copy's dedup memory on the same home
    # partition: these values are part of the stored state, not an implementation detail.
    assert event_key(event_id, partitions) == expected
