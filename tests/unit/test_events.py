"""Parsing of event messages (README, Events): what is accepted, and why the rest is refused."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costline.rules.events import (
    MAX_BATCH,
    Category,
    FaultEvent,
    FaultType,
    Parsed,
    Rejection,
    UsageEvent,
    UtilizationEvent,
    dump_event,
    parse_message,
)

NOW = 1_796_025_600.0  # 2026-11-30T08:00:00Z
NOW_RFC = "2026-11-30T08:00:00Z"


def usage(**changes: Any) -> dict[str, Any]:
    event = {
        "event_id": "u-8812", "kind": "usage", "ts": NOW_RFC,
        "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100",
        "quantity": 8.0, "unit": "gpu_hour",
        "tags": {"project": "llm-70b", "team": "pretrain", "env": "prod", "job": "run-42"},
    }
    event.update(changes)
    return event


def utilization(**changes: Any) -> dict[str, Any]:
    event = {
        "event_id": "m-19", "kind": "utilization", "ts": NOW_RFC,
        "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100",
        "metric": "gpu_util", "value": 0.02,
        "tags": {"project": "llm-70b", "team": "pretrain", "job": "run-42"},
    }
    event.update(changes)
    return event


def fault(**changes: Any) -> dict[str, Any]:
    event = {
        "event_id": "f-3", "kind": "fault", "ts": "2026-11-30T08:05:00Z", "fault": "node_failure",
        "resource_type": "gpu.h100", "units": 512, "lost_seconds": 1800, "recovery_seconds": 900,
        "tags": {"project": "llm-70b", "team": "pretrain", "job": "run-42"},
    }
    event.update(changes)
    return event


def without(event: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != key}


def encode(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


def accepted(value: Any, now: float = NOW) -> Parsed:
    result = parse_message(encode(value), now=now)
    assert isinstance(result, Parsed), result
    return result


def refused(value: Any, now: float = NOW) -> Rejection:
    result = parse_message(encode(value), now=now)
    assert isinstance(result, Rejection), result
    return result


# --- valid events -------------------------------------------------------------------------


def test_usage_event_of_the_contract_is_parsed_with_every_field():
    parsed = accepted(usage())
    assert parsed.batch is False
    [event] = parsed.events
    assert isinstance(event, UsageEvent)
    assert event.event_id == "u-8812"
    assert event.unix_ts == NOW
    assert event.resource_id == "cluster-a/node-017"
    assert event.resource_type == "gpu.h100"
    assert event.quantity == 8.0
    assert event.unit == "gpu_hour"
    assert event.tags == {"project": "llm-70b", "team": "pretrain", "env": "prod", "job": "run-42"}
    assert event.cost is None
    assert event.category is None


def test_usage_event_reads_the_optional_cost_and_category():
    [event] = accepted(usage(cost=12.5, category="storage")).events
    assert event.cost == 12.5
    assert event.category is Category.storage


def test_utilization_event_of_the_contract_is_parsed_with_every_field():
    [event] = accepted(utilization()).events
    assert isinstance(event, UtilizationEvent)
    assert event.metric == "gpu_util"
    assert event.value == 0.02
    assert event.resource_type == "gpu.h100"
    assert event.unix_ts == NOW


def test_fault_event_of_the_contract_is_parsed_with_every_field():
    [event] = accepted(fault()).events
    assert isinstance(event, FaultEvent)
    assert event.fault is FaultType.node_failure
    assert event.units == 512
    assert event.lost_seconds == 1800
    assert event.recovery_seconds == 900
    assert event.resource_id is None
    assert event.unix_ts == NOW + 300


@pytest.mark.parametrize("make", [usage, utilization, fault])
@pytest.mark.parametrize(
    ("ts", "unix"),
    [
        ("2026-11-30T08:00:00Z", NOW),
        ("2026-11-30T08:00:00+00:00", NOW),
        ("2026-11-30T13:30:00+05:30", NOW),
        ("2026-11-30T03:00:00-05:00", NOW),
        ("2026-11-30T08:00:00.250Z", NOW + 0.25),
        (1_796_025_600, NOW),
        (1_796_025_600.75, NOW + 0.75),
    ],
)
def test_every_kind_accepts_ts_as_rfc3339_with_offset_or_unix_seconds(make, ts, unix):
    [event] = accepted(make(ts=ts)).events
    assert event.unix_ts == unix


def test_unix_seconds_are_kept_as_the_number_sent():
    [as_int] = accepted(usage(ts=1_796_025_600)).events
    [as_float] = accepted(usage(ts=1_796_025_600.5)).events
    assert type(as_int.ts) is int
    assert type(as_float.ts) is float


def test_an_integer_quantity_is_accepted_as_a_number():
    [event] = accepted(usage(quantity=8)).events
    assert event.quantity == 8.0


def test_limits_are_inclusive_at_their_maximum():
    [event] = accepted(usage(
        event_id="e" * 128,
        tags={**{f"t{i}": "v" for i in range(31)}, "k" + "x" * 62: "v" * 256},
    )).events
    assert len(event.event_id) == 128
    assert len(event.tags) == 32


def test_every_fault_type_of_the_contract_is_accepted():
    names = ["node_failure", "silent_data_corruption", "comm_timeout", "storage_stall", "oom",
             "preemption", "other"]
    for name in names:
        [event] = accepted(fault(fault=name)).events
        assert event.fault == name


# --- batches --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 100, MAX_BATCH])
def test_batches_of_one_to_ten_thousand_events_are_accepted_in_order(size):
    batch = [usage(event_id=f"u-{i}") for i in range(size)]
    parsed = accepted(batch)
    assert parsed.batch is True
    assert [e.event_id for e in parsed.events] == [f"u-{i}" for i in range(size)]


@pytest.mark.parametrize("padding", [b" ", b"\n", b"\r\n\t "])
def test_whitespace_before_a_message_does_not_change_what_it_is(padding):
    single = accepted(padding + encode(usage()))
    batch = accepted(padding + encode([usage(), usage(event_id="u-2")]))
    assert (single.batch, len(single.events)) == (False, 1)
    assert (batch.batch, len(batch.events)) == (True, 2)


@pytest.mark.parametrize("padding", [b"\xef\xbb\xbf", b"\xef\xbb\xbf\n "])
def test_a_byte_order_mark_before_a_message_is_ignored_as_rfc_8259_allows(padding):
    single = accepted(padding + encode(usage()))
    batch = accepted(padding + encode([usage(), usage(event_id="u-2")]))
    assert (single.batch, len(single.events), batch.batch, len(batch.events)) == (
        False, 1, True, 2)


def test_a_whole_number_written_as_a_float_is_that_number():
    """``512.0`` is what Python's json writes for a float that holds 512: the same count."""
    [written_float] = accepted(fault(units=512.0)).events
    [written_int] = accepted(fault()).events
    assert written_float == written_int and type(written_float.units) is int


def test_a_batch_may_mix_the_three_kinds():
    parsed = accepted([usage(), utilization(), fault()])
    assert [type(e) for e in parsed.events] == [UsageEvent, UtilizationEvent, FaultEvent]


def test_a_batch_of_ten_thousand_and_one_events_is_refused():
    rejection = refused([usage(event_id=f"u-{i}") for i in range(MAX_BATCH + 1)])
    assert rejection.code == "too_long"
    assert rejection.reason.startswith("message: ")
    assert "at most 10000 items" in rejection.reason


def test_an_empty_batch_is_refused():
    rejection = refused([])
    assert rejection.code == "too_short"
    assert rejection.reason.startswith("message: ")
    assert "at least 1 item" in rejection.reason


def test_a_bad_element_refuses_the_whole_batch_and_is_named_by_its_index():
    batch = [usage(event_id=f"u-{i}") for i in range(3)] + [usage(event_id="u-3", quantity=-1)]
    rejection = refused(batch)
    assert rejection.code == "out_of_range"
    assert rejection.reason.startswith("event 3: field quantity: ")
    assert "greater than or equal to 0" in rejection.reason


def test_a_future_element_of_a_batch_is_named_by_its_index():
    batch = [usage(event_id=f"u-{i}") for i in range(3)] + [usage(event_id="u-3", ts=NOW + 601)]
    rejection = refused(batch)
    assert rejection.code == "future_ts"
    assert rejection.reason == "event 3: field ts: more than 10 minutes in the future"


def test_a_single_event_reason_has_no_event_index():
    rejection = refused(usage(quantity=-1))
    assert rejection.reason.startswith("field quantity: ")


def test_many_problems_are_summarised_after_the_first_three():
    rejection = refused(usage(event_id="", quantity=-1, unit="A", resource_type="!", extra=1))
    assert rejection.reason.count("; ") == 3
    assert rejection.reason.endswith("... and 2 more")


# --- refused messages -----------------------------------------------------------------------

INVALID = [
    pytest.param(b'{"event_id": "u-1",', "invalid_json", ["message: Invalid JSON"],
                 id="truncated-json"),
    pytest.param(b"", "invalid_json", ["message: Invalid JSON"], id="empty-message"),
    pytest.param(b"\xff\xfe{}", "invalid_json", ["message: Invalid JSON"], id="not-utf8-start"),
    pytest.param(json.dumps(usage(resource_id="node-\u00e9")).encode().replace(b"\\u00e9", b"\xe9"),
                 "invalid_json", ["message: Invalid JSON", "unicode"], id="not-utf8-in-string"),
    pytest.param(b"42", "bad_type", ["message: ", "object"], id="not-an-object"),
    pytest.param(without(usage(), "resource_type"), "missing_field",
                 ["field resource_type: Field required"], id="missing-resource-type"),
    pytest.param(without(usage(), "event_id"), "missing_field",
                 ["field event_id: Field required"], id="missing-event-id"),
    pytest.param(without(fault(), "units"), "missing_field",
                 ["field units: Field required"], id="missing-units"),
    pytest.param(without(usage(), "kind"), "missing_field",
                 ["field kind: Field required (one of usage, utilization, fault, progress, "
                  "checkpoint, restore, run_end)"],
                 id="missing-kind"),
    pytest.param(usage(quantity=True), "bad_type", ["field quantity: ", "valid number"],
                 id="quantity-true"),
    pytest.param(usage(quantity="8"), "bad_type", ["field quantity: ", "valid number"],
                 id="quantity-string"),
    pytest.param(fault(units=512.5), "bad_type", ["field units: ", "valid integer"],
                 id="units-fraction"),
    pytest.param(fault(units=True), "bad_type", ["field units: ", "valid integer"],
                 id="units-bool"),
    pytest.param(fault(units=1e300), "bad_type", ["field units: ", "valid integer"],
                 id="units-float-past-2-53"),
    pytest.param(usage(tags=["project"]), "bad_type", ["field tags: ", "an object"],
                 id="tags-list"),
    pytest.param(usage(colour="red"), "unknown_field",
                 ["field colour: Extra inputs are not permitted"], id="unknown-field"),
    pytest.param(usage(kind="invoice"), "unknown_kind",
                 ["field kind: 'invoice' is not one of usage, utilization, fault, progress, "
                  "checkpoint, restore, run_end"],
                 id="unknown-kind"),
    pytest.param(usage(quantity=-1), "out_of_range",
                 ["field quantity: ", "greater than or equal to 0"], id="negative-quantity"),
    pytest.param(usage(cost=float("inf")), "bad_type", ["field cost: "], id="infinite-cost"),
    pytest.param(usage(charge="rebate"), "bad_value", ["field charge: ", "'credit'"],
                 id="unknown-charge"),
    pytest.param(usage(category="gpus"), "bad_value", ["field category: ", "'compute'"],
                 id="unknown-category"),
    pytest.param(usage(event_id="e" * 129), "bad_format", ["field event_id: ", "pattern"],
                 id="event-id-too-long"),
    pytest.param(usage(event_id=""), "bad_format", ["field event_id: ", "pattern"],
                 id="event-id-empty"),
    pytest.param(usage(event_id="u 1"), "bad_format", ["field event_id: ", "pattern"],
                 id="event-id-space"),
    pytest.param(usage(event_id="u-1\n"), "bad_format", ["field event_id: ", "pattern"],
                 id="event-id-trailing-newline"),
    pytest.param(usage(tags={"Team": "x"}), "bad_format", ["field tags.Team", "pattern"],
                 id="tag-key-uppercase"),
    pytest.param(usage(tags={"t" + "x" * 63: "x"}), "bad_format", ["field tags.t", "pattern"],
                 id="tag-key-64-chars"),
    pytest.param(usage(tags={"1team": "x"}), "bad_format", ["field tags.1team", "pattern"],
                 id="tag-key-leading-digit"),
    pytest.param(usage(tags={"team": ""}), "too_short",
                 ["field tags.team: ", "at least 1 character"], id="tag-value-empty"),
    pytest.param(usage(tags={"team": "x" * 257}), "too_long",
                 ["field tags.team: ", "at most 256 characters"], id="tag-value-257-chars"),
    pytest.param(usage(tags={"team": 7}), "bad_type", ["field tags.team: ", "valid string"],
                 id="tag-value-number"),
    pytest.param(usage(tags={f"t{i}": "x" for i in range(33)}), "too_long",
                 ["field tags: ", "at most 32 items"], id="33-tags"),
    pytest.param(usage(ts="2026-11-30T08:00:00"), "bad_timestamp",
                 ["field ts: must be RFC 3339 with an offset or Unix seconds",
                  "'2026-11-30T08:00:00'"],
                 id="naive-ts"),
    pytest.param(usage(ts="2026-11-30"), "bad_timestamp", ["field ts: must be RFC 3339"],
                 id="date-only-ts"),
    pytest.param(usage(ts="yesterday"), "bad_timestamp", ["field ts: must be RFC 3339"],
                 id="word-ts"),
    pytest.param(usage(ts=True), "bad_timestamp", ["field ts: must be RFC 3339"], id="bool-ts"),
    pytest.param(json.dumps(usage(quantity=math.nan)).encode(), "bad_type",
                 ["field quantity: ", "finite number"], id="nan-quantity"),
    pytest.param(json.dumps(usage(quantity=math.inf)).encode(), "bad_type",
                 ["field quantity: ", "finite number"], id="infinite-quantity"),
    pytest.param(json.dumps(utilization(value=-math.inf)).encode(), "bad_type",
                 ["field value: ", "finite number"], id="infinite-value"),
    pytest.param(json.dumps(usage(ts=math.inf)).encode(), "bad_timestamp",
                 ["field ts: must be RFC 3339"], id="infinite-ts"),
    pytest.param(json.dumps(fault(lost_seconds=math.nan)).encode(), "bad_type",
                 ["field lost_seconds: ", "finite number"], id="nan-lost-seconds"),
    pytest.param(fault(units=0), "out_of_range",
                 ["field units: ", "greater than or equal to 1"], id="zero-units"),
    pytest.param(fault(units=1_000_001), "out_of_range",
                 ["field units: ", "less than or equal to 1000000"], id="too-many-units"),
    pytest.param(fault(recovery_seconds=-5), "out_of_range",
                 ["field recovery_seconds: ", "greater than or equal to 0"],
                 id="negative-recovery"),
    pytest.param(fault(fault="meteor_strike"), "bad_value", ["field fault: ", "'node_failure'"],
                 id="unknown-fault-type"),
    pytest.param(utilization(metric="GPU util"), "bad_format", ["field metric: ", "pattern"],
                 id="bad-metric-name"),
]


@pytest.mark.parametrize(("message", "code", "words"), INVALID)
def test_an_invalid_message_is_refused_with_its_code_and_reason(message, code, words):
    rejection = refused(message)
    assert rejection.code == code
    for word in words:
        assert word in rejection.reason


def test_a_ts_exactly_ten_minutes_ahead_is_accepted():
    [event] = accepted(usage(ts=NOW + 600), now=NOW).events
    assert event.unix_ts == NOW + 600


@pytest.mark.parametrize("ts", [NOW + 600.5, "2026-11-30T08:10:01Z", "2026-11-30T13:40:01+05:30"])
def test_a_ts_more_than_ten_minutes_ahead_of_now_is_refused(ts):
    rejection = refused(usage(ts=ts), now=NOW)
    assert rejection.code == "future_ts"
    assert rejection.reason == "field ts: more than 10 minutes in the future"


def test_without_an_explicit_now_the_clock_decides_what_is_future():
    assert isinstance(parse_message(encode(usage(ts=time.time() - 60))), Parsed)
    rejection = parse_message(encode(usage(ts=time.time() + 3600)))
    assert isinstance(rejection, Rejection)
    assert rejection.code == "future_ts"


@pytest.mark.parametrize("ts", ["1796025600000", "1796025600", "1.5"])
def test_a_ts_given_as_a_string_of_digits_is_refused(ts):
    rejection = refused(usage(ts=ts))
    assert rejection.code == "bad_timestamp"


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (usage(tags={"team": ""}), "too_short"),
        (usage(tags={"team": "x" * 257}), "too_long"),
        (usage(resource_id="r" * 257), "too_long"),
    ],
)
def test_a_string_of_the_wrong_length_is_refused_with_a_length_code(event, code):
    assert refused(event).code == code


# --- properties -----------------------------------------------------------------------------

event_ids = st.from_regex(r"[A-Za-z0-9._:/-]{1,128}", fullmatch=True)
names = st.from_regex(r"[a-z][a-z0-9_.-]{0,63}", fullmatch=True)
resource_types = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,127}", fullmatch=True)
resource_ids = st.text(min_size=1, max_size=256)
tags = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9_]{0,62}", fullmatch=True),
    st.text(min_size=1, max_size=256),
    max_size=32,
)
finite = st.floats(allow_nan=False, allow_infinity=False)
non_negative = st.one_of(
    st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    st.integers(min_value=0, max_value=10**15),
)
offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
rfc3339 = st.builds(
    lambda moment, zone: moment.replace(tzinfo=UTC).astimezone(zone).isoformat(),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2026, 11, 1)),
    offsets,
)
unix_seconds = st.one_of(
    st.integers(min_value=0, max_value=int(NOW)),
    st.floats(min_value=0, max_value=NOW, allow_nan=False),
)
timestamps = st.one_of(rfc3339, unix_seconds)
common = {"event_id": event_ids, "ts": timestamps, "tags": tags}

usage_events = st.fixed_dictionaries(
    {**common, "kind": st.just("usage"), "resource_id": resource_ids,
     "resource_type": resource_types, "quantity": non_negative, "unit": names},
    optional={"cost": non_negative, "category": st.sampled_from([c.value for c in Category])},
)
utilization_events = st.fixed_dictionaries(
    {**common, "kind": st.just("utilization"), "resource_id": resource_ids,
     "resource_type": resource_types, "metric": names, "value": finite},
)
fault_events = st.fixed_dictionaries(
    {**common, "kind": st.just("fault"), "fault": st.sampled_from([f.value for f in FaultType]),
     "resource_type": resource_types, "units": st.integers(min_value=1, max_value=1_000_000),
     "lost_seconds": non_negative, "recovery_seconds": non_negative},
    optional={"resource_id": resource_ids},
)
any_event = st.one_of(usage_events, utilization_events, fault_events)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


def assert_well_formed(result: Parsed | Rejection) -> None:
    assert isinstance(result, Parsed | Rejection)
    if isinstance(result, Rejection):
        assert isinstance(result.code, str) and result.code
        assert isinstance(result.reason, str) and result.reason


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_event)
def test_any_valid_event_survives_dump_and_parse_unchanged(event):
    [parsed] = accepted(event).events
    again = accepted(dump_event(parsed))
    assert again.events == [parsed]
    assert type(again.events[0]) is type(parsed)


@settings(deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_event, min_size=1, max_size=3))
def test_any_valid_batch_is_accepted_whole(batch):
    parsed = accepted(batch)
    assert parsed.batch is True
    assert [e.event_id for e in parsed.events] == [e["event_id"] for e in batch]


@settings(deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(raw):
    assert_well_formed(parse_message(raw, now=NOW))


@settings(deadline=None)
@given(json_values)
def test_arbitrary_json_values_never_raise(value):
    assert_well_formed(parse_message(json.dumps(value).encode(), now=NOW))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_event, st.data())
def test_an_event_with_one_field_replaced_by_any_json_value_never_raises(event, data):
    key = data.draw(st.sampled_from(sorted(event)))
    event[key] = data.draw(json_values)
    single = parse_message(json.dumps(event).encode(), now=NOW)
    assert_well_formed(single)
    batch = parse_message(json.dumps([usage(), event]).encode(), now=NOW)
    assert_well_formed(batch)
    assert isinstance(batch, Parsed) == isinstance(single, Parsed)


def test_every_usage_event_example_in_readme_is_accepted_and_priced() -> None:
    """README's Events section shows the format; its examples must stay events the worker
    counts (a credit among them, with its negative cost)."""
    import re
    from pathlib import Path

    from costline.rules.prices import PriceBook

    repo = Path(__file__).resolve().parents[2]
    book = PriceBook.load(repo / "rules" / "prices" / "example.yaml")
    text = (repo / "README.md").read_text()
    examples = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    assert len(examples) >= 2
    charges = []
    for example in examples:
        parsed = parse_message(example.encode())
        assert isinstance(parsed, Parsed), (parsed, example)
        [event] = parsed.events
        if isinstance(event, UsageEvent):
            charges.append(book.charge(event))
    assert [c.charge.value for c in charges] == ["usage", "credit"]
    assert charges[1].cost_micro == -500_000_000
