"""Folding priced events into per-tag-set, per-5-minute-slot sums."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costline import rules
from costline.rules import tally as tally_module
from costline.rules.events import Category, Parsed, parse_message
from costline.rules.prices import Billing, PriceBook, PricingError
from costline.rules.tally import (
    COST,
    QUANTITY,
    SLOT_S,
    Folder,
    Tally,
    event_digest,
    tagset_id,
    tagset_json,
)

EXAMPLE = Path(rules.__file__).parent / "prices" / "example.yaml"
T0 = 1_796_025_600  # 2026-11-30T08:00:00Z, a slot boundary
H100_8H = 19_920_000  # 8 × 2.49


@pytest.fixture(scope="module")
def prices() -> PriceBook:
    return PriceBook.load(EXAMPLE)


@pytest.fixture
def folder(prices) -> Folder:
    return Folder(prices)


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


def fold(folder: Folder, events: list[Any], skip: frozenset[bytes] = frozenset()) -> Tally:
    tally = Tally()
    folder.fold(tally, events, skip)
    return tally


def dims_of(tally: Tally, tsid: str) -> dict[str, str]:
    return json.loads(tally.tagsets[tsid])


def test_a_usage_event_adds_its_cost_and_quantity_to_its_tag_set_and_slot(folder):
    tally = fold(folder, [usage()])
    [(tsid, slot)] = tally.sums
    assert slot == T0
    assert tally.sums[(tsid, slot)] == {COST: H100_8H, QUANTITY: 8_000_000}
    assert dims_of(tally, tsid) == {"team": "pretrain", "project": "llm-70b",
                                    "category": "compute", "resource_type": "gpu.h100",
                                    "billing": "elastic"}
    assert tally.events == 1
    assert tally.digests == {T0 // 3600 * 3600: [event_digest("u-1")]}


def test_usage_events_of_one_tag_set_and_slot_are_summed(folder):
    tally = fold(folder, [usage(event_id="a", quantity=0.1), usage(event_id="b", quantity=0.2),
                          usage(event_id="c", ts=T0 + 299, quantity=0.3)])
    [cell] = tally.sums.values()
    assert cell == {COST: 249_000 + 498_000 + 747_000, QUANTITY: 600_000}
    assert tally.events == 3


def test_a_stated_cost_and_category_are_folded_as_stated(folder):
    tally = fold(folder, [usage(cost=1.5, category="storage")])
    [((tsid, _), cell)] = tally.sums.items()
    assert cell[COST] == 1_500_000
    assert dims_of(tally, tsid)["category"] == "storage"


def test_a_fault_adds_its_waste_under_its_fault_type_and_no_cost(folder):
    tally = fold(folder, [fault()])
    [((tsid, slot), cell)] = tally.sums.items()
    assert slot == T0
    assert cell == {"w:node_failure": 956_160_000}
    assert dims_of(tally, tsid)["resource_type"] == "gpu.h100"
    [(ts, text)] = tally.faults
    assert ts == T0
    assert json.loads(text)["event_id"] == "f-3"


@pytest.mark.parametrize("fault_first", [False, True])
def test_waste_and_cost_of_the_same_tags_share_a_cell(folder, fault_first):
    events = [usage(), fault(fault="oom", units=1, lost_seconds=3600, recovery_seconds=0)]
    tally = fold(folder, events[::-1] if fault_first else events)
    [cell] = tally.sums.values()
    assert cell == {COST: H100_8H, QUANTITY: 8_000_000, "w:oom": 2_490_000}


def test_faults_of_different_types_are_kept_apart(folder):
    tally = fold(folder, [fault(event_id="f-1", fault="oom"),
                          fault(event_id="f-2", fault="comm_timeout")])
    [cell] = tally.sums.values()
    assert cell == {"w:oom": 956_160_000, "w:comm_timeout": 956_160_000}


def test_a_utilization_sample_adds_no_money_and_is_kept_as_a_sample(folder):
    tally = fold(folder, [utilization()])
    assert tally.sums == {}
    assert tally.samples == {("node-1", "gpu_util"): [(T0, 0.5)]}
    latest = tally.latest[("node-1", "gpu_util")]
    assert (latest.ts, latest.value, latest.resource_type) == (T0, 0.5, "gpu.h100")
    assert latest.tags == {"team": "pretrain"}
    assert tally.events == 1


def test_the_latest_utilization_sample_is_the_newest_by_event_time(folder):
    tally = fold(folder, [utilization(event_id="m-2", ts=T0 + 60, value=0.9),
                          utilization(event_id="m-1", ts=T0, value=0.1)])
    assert tally.samples[("node-1", "gpu_util")] == [(T0 + 60, 0.9), (T0, 0.1)]
    assert tally.latest[("node-1", "gpu_util")].value == 0.9


def test_the_same_event_id_twice_in_one_fold_counts_once(folder):
    tally = fold(folder, [usage(), usage(quantity=100.0)])
    [cell] = tally.sums.values()
    assert cell == {COST: H100_8H, QUANTITY: 8_000_000}
    assert tally.events == 1
    assert sum(map(len, tally.digests.values())) == 1


def test_an_event_folded_again_into_the_same_tally_counts_once(folder):
    tally = fold(folder, [usage()])
    folder.fold(tally, [usage(), usage(event_id="u-2")])
    [cell] = tally.sums.values()
    assert cell[COST] == 2 * H100_8H
    assert tally.events == 2


def test_an_event_id_shared_by_two_kinds_counts_once(folder):
    tally = fold(folder, [usage(event_id="x"), fault(event_id="x")])
    [cell] = tally.sums.values()
    assert "w:node_failure" not in cell
    assert tally.events == 1


def test_skip_excludes_the_events_whose_digest_it_holds(folder):
    skip = frozenset({event_digest("u-1"), event_digest("f-3")})
    tally = fold(folder, [usage(), usage(event_id="u-2", quantity=1.0), fault()], skip)
    [cell] = tally.sums.values()
    assert cell == {COST: 2_490_000, QUANTITY: 1_000_000}
    assert tally.events == 1
    assert list(tally.digests.values()) == [[event_digest("u-2")]]
    assert tally.faults == []


def test_event_digests_are_stable_and_distinct():
    assert event_digest("u-1") == event_digest("u-1")
    assert event_digest("u-1") != event_digest("u-2")
    assert len(event_digest("u-1")) == 12


def test_tag_sets_with_the_same_tags_in_another_order_have_the_same_id(folder):
    first = parse('{"event_id": "a", "kind": "usage", "ts": 1796025600, "resource_id": "n",'
                  ' "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour",'
                  ' "tags": {"team": "t", "project": "p", "env": "prod"}}')
    second = parse('{"event_id": "b", "kind": "usage", "ts": 1796025600, "resource_id": "n",'
                   ' "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour",'
                   ' "tags": {"env": "prod", "project": "p", "team": "t"}}')
    assert list(first.tags) != list(second.tags)
    tally = fold(folder, [first, second])
    [(tsid, _)] = tally.sums
    assert tally.sums[(tsid, T0)][COST] == 2 * 2_490_000
    assert fold(Folder(folder.prices), [second]).tagsets == {tsid: tally.tagsets[tsid]}


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


def test_different_tag_values_make_different_tag_sets(folder):
    tally = fold(folder, [usage(event_id="a", tags={"team": "a"}),
                          usage(event_id="b", tags={"team": "b"})])
    assert len(tally.sums) == 2
    assert sorted(dims_of(tally, tsid)["team"] for tsid, _ in tally.sums) == ["a", "b"]


@pytest.mark.parametrize("tags", [
    [{"a": "b", "c": "d"}, {"a": "c", "b": "d"}],  # the same strings, keys and values apart
    [{"a": "b"}, {"b": "a"}],
    [{"team": "x"}, {"env": "x"}],  # the same values
    [{"team": "t"}, {"team": "t", "env": "t"}],
])
def test_tag_sets_that_share_their_strings_are_told_apart(folder, tags):
    # the cache of tag-set ids is keyed by the keys, then the values, in one flat tuple
    tally = fold(folder, [usage(event_id=f"e-{n}", tags=t) for n, t in enumerate(tags)])
    def text(dims: dict[str, str]) -> str:
        return json.dumps(dims, sort_keys=True)

    assert sorted(text(dims_of(tally, tsid)) for tsid, _ in tally.sums) == sorted(
        text({**t, "category": "compute", "resource_type": "gpu.h100", "billing": "elastic"})
        for t in tags)


def test_pseudo_tags_win_over_tags_of_the_same_name(folder):
    tags = {"team": "t", "category": "mine", "resource_type": "fake", "billing": "free"}
    tally = fold(folder, [usage(tags=tags), fault(tags=tags)])
    [(tsid, _)] = tally.sums
    assert dims_of(tally, tsid) == {"team": "t", "category": "compute",
                                    "resource_type": "gpu.h100", "billing": "elastic"}


def test_a_tag_set_of_an_event_without_pseudo_tag_clash_equals_one_with_it(folder):
    plain = fold(folder, [usage(tags={"team": "t"})])
    clashing = fold(Folder(folder.prices), [usage(tags={"team": "t", "category": "mine"})])
    assert plain.tagsets == clashing.tagsets


@pytest.mark.parametrize(
    ("ts", "slot"),
    [(T0, T0), (T0 + 0.5, T0), (T0 + 299.999, T0), (T0 + 300, T0 + 300), (T0 + 599, T0 + 300),
     (T0 - 1, T0 - 300), ("2026-11-30T13:34:59+05:30", T0), ("2026-11-30T08:07:30Z", T0 + 300)],
)
def test_the_slot_is_the_five_minute_floor_of_ts(folder, ts, slot):
    tally = fold(folder, [usage(ts=ts)])
    [(_, got)] = tally.sums
    assert got == slot


@settings(deadline=None)
@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_the_slot_of_any_ts_is_its_five_minute_floor(prices, ts):
    tally = fold(Folder(prices), [usage(ts=ts)])
    [(_, slot)] = tally.sums
    assert slot == math.floor(ts / SLOT_S) * SLOT_S
    assert slot <= ts < slot + SLOT_S


def test_the_slot_of_a_ts_just_before_the_epoch_is_the_slot_before_it(folder):
    tally = fold(folder, [usage(ts=-0.5)])
    [(_, slot)] = tally.sums
    assert slot == -300


def test_events_of_different_slots_are_kept_apart(folder):
    tally = fold(folder, [usage(event_id="a", ts=T0 + 10), usage(event_id="b", ts=T0 + 310)])
    assert sorted(slot for _, slot in tally.sums) == [T0, T0 + 300]


def test_price_names_the_first_event_the_book_cannot_price(folder):
    events = [usage(), utilization(), usage(event_id="u-9", resource_type="gpu.b300")]
    with pytest.raises(PricingError) as caught:
        folder.price(events)
    assert caught.value.code == "unknown_resource_type"
    assert caught.value.reason.startswith("event 2: field resource_type: ")


def test_a_popular_tag_set_stays_known_however_many_rare_ones_pass(folder, monkeypatch):
    worked_out: list[str] = []

    def counted(dims: Any) -> str:
        canonical = tagset_json(dims)
        worked_out.append(canonical)
        return canonical

    monkeypatch.setattr(tally_module, "_TAGSET_CACHE_MAX", 10)
    monkeypatch.setattr(tally_module, "tagset_json", counted)
    tally = Tally()
    for n in range(200):  # the popular tag set between every two rare ones
        folder.fold(tally, [usage(event_id=f"p-{n}"),
                            usage(event_id=f"r-{n}", tags={"team": f"rare-{n}"})])
    popular = [c for c in worked_out if "llm-70b" in c]
    assert len(popular) == 1
    assert len(worked_out) == 201  # each rare one once: none is seen again
    assert len(folder._ids) <= 10 and len(folder._older) <= 10
    assert tally.events == 400


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["usage", "fault", "utilization"]),
                          st.integers(0, 7), st.integers(0, 1), st.integers(0, 1)),
                min_size=1, max_size=30),
       st.integers(0, 30))
def test_absorbing_the_tally_of_later_events_equals_folding_them_after(prices, specs, cut):
    # Each spec: kind, event id, slot and a small number: events often share their time.
    make = {"usage": lambda n, ts, v: usage(event_id=f"u{n}", ts=ts, quantity=v + 1),
            "fault": lambda n, ts, v: fault(event_id=f"f{n}", ts=ts, units=v + 1),
            "utilization": lambda n, ts, v: utilization(event_id=f"m{n}", ts=ts, value=n)}
    events = [make[kind](n, T0 + slot * SLOT_S + v, v) for kind, n, slot, v in specs]
    # The split is of events with no id in common, as the aggregator absorbs only then.
    first, later = events[:cut], [e for e in events[cut:]
                                  if e.event_id not in {f.event_id for f in events[:cut]}]
    whole = fold(Folder(prices), first + later)
    parts = fold(Folder(prices), first)
    parts.absorb(fold(Folder(prices), later))
    assert parts.sums == whole.sums
    assert parts.tagsets == whole.tagsets
    assert parts.digests == whole.digests and parts.seen == whole.seen
    assert parts.samples == whole.samples and parts.latest == whole.latest
    assert parts.faults == whole.faults and parts.events == whole.events
