"""Fuzzing ``parse_message`` with mutated valid events: whatever arrives, the answer is a
``Rejection`` with a known code and a one-line reason, or events the rest of the pipeline can use.

The seeds are the contract's three example events and a batch of them. Mutations work on the
bytes (bit flips, truncation, deleted, inserted and repeated ranges) and on the fields (swapped,
deleted or renamed keys, another kind, deep nesting, numbers of any size written as JSON text,
any unicode including lone surrogates).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from costline.connectors.redis_keys import Calendar
from costline.rules.events import (
    MAX_BATCH,
    MAX_FUTURE_S,
    MIN_TS,
    Parsed,
    Rejection,
    UsageEvent,
    dump_event,
    parse_message,
)
from costline.rules.prices import PriceBook, PricingError
from costline.streams.settings import DEFAULT_PRICES, Settings
from costline.streams.topics import topic_specs
from costline.streams.worker.dead_letters import dead_letter
from costline.streams.worker.faust_app import faust_app

NOW = 1_796_025_600.0  # 2026-11-30T08:00:00Z
CODES = {
    "invalid_json", "missing_field", "unknown_field", "unknown_kind", "out_of_range",
    "too_long", "too_short", "bad_format", "bad_value", "bad_type", "bad_timestamp",
    "future_ts",
}
# The zones furthest from UTC on both sides, and one with a half-hour offset and DST.
ZONES = ("UTC", "Pacific/Kiritimati", "Etc/GMT+12", "Australia/Adelaide")
FUZZ = settings(deadline=None, max_examples=200,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

USAGE = {
    "event_id": "u-8812", "kind": "usage", "ts": "2026-11-30T08:00:00Z",
    "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100", "quantity": 8.0,
    "unit": "gpu_hour", "cost": 19.92, "category": "compute",
    "tags": {"project": "llm-70b", "team": "pretrain", "env": "prod", "job": "run-42"},
}
UTILIZATION = {
    "event_id": "m-19", "kind": "utilization", "ts": 1796025600,
    "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100", "metric": "gpu_util",
    "value": 0.02, "tags": {"project": "llm-70b", "team": "pretrain", "job": "run-42"},
}
FAULT = {
    "event_id": "f-3", "kind": "fault", "ts": "2026-11-30T08:05:00+01:00",
    "fault": "node_failure", "resource_type": "gpu.h100", "units": 512, "lost_seconds": 1800,
    "recovery_seconds": 900, "resource_id": "cluster-a/node-017",
    "tags": {"project": "llm-70b", "team": "pretrain", "job": "run-42"},
}
SEEDS: list[Any] = [USAGE, UTILIZATION, FAULT, [USAGE, UTILIZATION, FAULT]]

# Numbers at and beyond every edge: float range, subnormals, the 4300-digit int limit.
huge_numbers = st.sampled_from([
    "0", "-0", "-0.0", "1e308", "1.8e308", "1e309", "-1e309", "5e-324", "1e-400",
    "9223372036854775807", "9223372036854775808", "18446744073709551616",
    "1" + "0" * 400, "-1" + "0" * 400, "9" * 4300, "9" * 4301, "1e18", "-1e18",
    "-62135596800", "-2208988801", "-2208988800", "4102444800", "1796026200", "1796026201",
    "1796025600.0000001", "1E2", "0x10", "Infinity", "-Infinity", "NaN", "01", "+1", ".5",
])
unicode_text = st.one_of(
    st.text(st.characters(codec=None), max_size=40),
    st.sampled_from(["\ud800", "\udfff", "\ud83d", "a\u0000b", "\u202e", "e\u0301", "\ufeff",
                     "\U0001f4b8" * 70, "ǅ", "İ", "x" * 300]),
)
timestamps = st.sampled_from([
    "2026-11-30T08:00:00Z", "2026-11-30T08:00:00z", "2026-11-30 08:00:00+14:00",
    "2026-11-30T08:00:00-12:00", "2026-11-30T08:00:00.123456789Z", "2026-02-29T00:00:00Z",
    "2026-02-30T00:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T08:00:60Z",
    "2026-11-30T08:00:00+24:00", "0001-01-01T00:00:00+14:00", "0001-01-01T00:00:00-14:00",
    "1899-12-31T23:59:59Z", "1900-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59",
    "2026-11-30T08:10:00Z", "2026-11-30T08:10:01Z", "2026-11-30", "1796025600",
])


Tokens = dict[str, str]


def encode(value: Any, tokens: Tokens | None = None) -> bytes:
    """JSON of ``value``, each placeholder string of ``tokens`` replaced by its JSON verbatim."""
    text = json.dumps(value, ensure_ascii=True)
    for placeholder, raw in (tokens or {}).items():
        text = text.replace(json.dumps(placeholder), raw, 1)
    return text.encode()


def verbatim(tokens: Tokens, raw: str) -> str:
    """A placeholder that ``encode`` replaces by ``raw`` (a number or a nesting too deep to
    build as Python data)."""
    placeholder = f"\u0000raw{len(tokens)}\u0000"
    tokens[placeholder] = raw
    return placeholder


def utilization_at(ts: str) -> bytes:
    """The utilization seed with ``ts`` written verbatim."""
    tokens: Tokens = {}
    return encode({**UTILIZATION, "ts": verbatim(tokens, ts)}, tokens)


@st.composite
def byte_mutants(draw: st.DrawFn) -> bytes:
    """A seed's bytes after one to four flips, cuts, deletions, insertions or repeats."""
    raw = bytearray(encode(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "delete", "insert", "repeat"]))
        at = draw(st.integers(0, len(raw)))
        if op == "flip" and raw:
            index = min(at, len(raw) - 1)
            raw[index] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del raw[at:]
        elif op == "delete":
            del raw[at:at + draw(st.integers(1, 16))]
        elif op == "insert":
            raw[at:at] = draw(st.one_of(
                st.binary(min_size=1, max_size=8),
                st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\u0000", b'"', b"\\",
                                 b",", b"[", b"{", b"}", b"]", b":", b"null", b"1e999"])))
        else:
            end = min(len(raw), at + draw(st.integers(1, 32)))
            raw[at:at] = raw[at:end] * draw(st.integers(1, 3))
    return bytes(raw)


def _one(draw: st.DrawFn, event: dict[str, Any], tokens: Tokens) -> dict[str, Any]:
    """One field-level mutation of ``event`` (verbatim JSON goes to ``tokens``)."""
    keys = sorted(event)
    key = draw(st.sampled_from(keys))
    op = draw(st.sampled_from(
        ["swap", "delete", "rename", "kind", "nest", "number", "unicode", "ts", "tags"]))
    if op == "swap":
        other = draw(st.sampled_from(keys))
        event[key], event[other] = event[other], event[key]
    elif op == "delete":
        del event[key]
    elif op == "rename":
        event[draw(unicode_text)] = event.pop(key)
    elif op == "kind":
        event["kind"] = draw(st.sampled_from(["usage", "utilization", "fault", "Usage", ""]))
    elif op == "nest":
        depth = draw(st.sampled_from([1, 2, 64, 300, 5000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"v":', "}")]))
        inner = json.dumps(event[key])
        event[key] = verbatim(tokens, opener * depth + inner + closer * depth)
    elif op == "number":
        event[key] = verbatim(tokens, draw(huge_numbers))
    elif op == "unicode":
        event[key] = draw(unicode_text)
    elif op == "ts":
        event["ts"] = draw(timestamps)
    else:
        event["tags"] = draw(st.dictionaries(unicode_text, unicode_text, max_size=40))
    return event


@st.composite
def field_mutants(draw: st.DrawFn) -> bytes:
    """A seed event after one to three field mutations, as JSON."""
    event = json.loads(json.dumps(draw(st.sampled_from([USAGE, UTILIZATION, FAULT]))))
    tokens: Tokens = {}
    for _ in range(draw(st.integers(1, 3))):
        event = _one(draw, event, tokens)
    return encode(event, tokens)


def check(raw: bytes, now: float = NOW) -> None:
    """The parser's promise: a known code and a printable one-line reason (which the
    dead-letter record can carry), or events that every zone's calendar can place and that
    survive a round trip."""
    result = parse_message(raw, now=now)
    if isinstance(result, Rejection):
        assert result.code in CODES, result
        assert isinstance(result.reason, str) and result.reason.strip(), result
        assert result.reason.isprintable(), result  # one line, no control characters
        _, value = dead_letter("ns.usage.v1", 0, 7, raw, result.code, result.reason)
        assert json.loads(value)["code"] == result.code
        return
    assert isinstance(result, Parsed), result
    assert result.events and (result.batch or len(result.events) == 1)
    for event in result.events:
        ts = event.unix_ts
        assert math.isfinite(ts) and MIN_TS <= ts <= now + MAX_FUTURE_S, event
        for zone in ZONES:
            start, end, _ = Calendar(zone).day_bounds(ts)
            assert start <= ts < end
        assert parse_message(dump_event(event), now=now) == Parsed([event], False)


@FUZZ
@given(byte_mutants())
@example(b'{"event_id":"a","kind":"usage","ts":' + b"9" * 400 + b"}")
def test_byte_level_mutants_of_valid_events_are_refused_cleanly_or_usable(raw):
    check(raw)


@FUZZ
@given(field_mutants())
@example(utilization_at("-1" + "0" * 400))
@example(encode({**UTILIZATION, "ts": -1e18}))
@example(encode({**UTILIZATION, "ts": "0001-01-01T00:00:00+14:00"}))
def test_field_level_mutants_of_valid_events_are_refused_cleanly_or_usable(raw):
    check(raw)


@FUZZ
@given(st.data())
def test_one_mutated_event_refuses_its_whole_batch_and_is_named_by_index(data):
    index = data.draw(st.integers(0, 3))
    tokens: Tokens = {}
    event = _one(data.draw, json.loads(json.dumps(
        data.draw(st.sampled_from([USAGE, UTILIZATION, FAULT])))), tokens)
    alone = parse_message(encode(event, tokens), now=NOW)
    batch = [USAGE, UTILIZATION, FAULT]
    batch.insert(index, event)
    together = parse_message(encode(batch, tokens), now=NOW)
    check(encode(batch, tokens))
    if isinstance(alone, Parsed):
        assert isinstance(together, Parsed) and len(together.events) == 4
    else:
        assert isinstance(together, Rejection), together
        assert together.code == alone.code
        where = "message: " if alone.code == "invalid_json" else f"event {index}: "
        assert together.reason.startswith(where), together.reason


@pytest.mark.parametrize("depth", [10, 1000, 100_000])
@pytest.mark.parametrize("opener", [b"[", b'{"a":', b'{"event_id":"x","tags":{"a":'])
def test_deep_nesting_is_refused_as_invalid_json_or_a_type_error(depth, opener):
    result = parse_message(opener * depth, now=NOW)
    assert isinstance(result, Rejection) and result.code in {"invalid_json", "bad_type"}


@pytest.mark.parametrize("ts", [-1e18, -62135596800, "0001-01-01T00:00:00+01:00",
                                "1899-12-31T23:59:59Z", -(10**400)])
def test_a_ts_no_calendar_can_place_is_a_bad_timestamp(ts):
    raw = utilization_at(str(ts)) if isinstance(ts, int) else encode({**UTILIZATION, "ts": ts})
    result = parse_message(raw, now=NOW)
    assert isinstance(result, Rejection) and result.code == "bad_timestamp", result


def test_the_oldest_accepted_ts_has_a_day_in_every_zone():
    result = parse_message(encode({**UTILIZATION, "ts": MIN_TS}), now=NOW)
    assert isinstance(result, Parsed), result
    assert result.events[0].unix_ts == MIN_TS
    for zone in ZONES:
        start, end, date = Calendar(zone).day_bounds(MIN_TS)
        assert start <= MIN_TS < end and date.startswith(("1899-", "1900-"))


MAX_MICRO = 2**63 - 1


@pytest.mark.parametrize("event", [
    {**USAGE, "cost": 1e13},
    {**USAGE, "cost": None, "quantity": 1e13},
    {**FAULT, "units": 1_000_000, "lost_seconds": 1e300},
], ids=["cost", "quantity", "fault"])
def test_an_accepted_event_is_priced_within_a_signed_64_bit_sum_or_refused(event):
    result = parse_message(encode({k: v for k, v in event.items() if v is not None}), now=NOW)
    assert isinstance(result, Parsed), result
    [parsed] = result.events
    book = PriceBook.load(DEFAULT_PRICES)
    try:
        amount = (book.charge(parsed).cost_micro if isinstance(parsed, UsageEvent)
                  else book.waste(parsed))  # type: ignore[arg-type]
    except PricingError as exc:
        assert exc.code == "out_of_range"
    else:
        assert amount <= MAX_MICRO


def test_the_dead_letter_of_a_refused_full_batch_fits_the_producer_and_the_topic(tmp_path):
    batch = [{**USAGE, "event_id": f"u-{i}"} for i in range(MAX_BATCH)]
    batch[-1]["quantity"] = -1
    raw = encode(batch)
    result = parse_message(raw, now=NOW)
    assert isinstance(result, Rejection) and result.code == "out_of_range"
    _, record = dead_letter("ns.usage.v1", 0, 7, raw, result.code, result.reason)
    settings = Settings(state_dir=tmp_path)
    [dlq] = [spec for spec in topic_specs(settings) if spec.name == settings.topic("dlq")]
    assert len(record) <= int(dlq.configs["max.message.bytes"])
    assert len(record) <= faust_app(settings).conf.producer_max_request_size


def test_the_dead_letter_of_the_largest_message_the_input_topics_take_can_be_sent(tmp_path):
    settings = Settings(state_dir=tmp_path)
    [usage] = [spec for spec in topic_specs(settings) if spec.name == settings.topic("usage")]
    largest = int(usage.configs["max.message.bytes"]) - 1024
    raw = b'{"event_id": "' + b"x" * (largest - 16) + b'"}'
    result = parse_message(raw, now=NOW)
    assert isinstance(result, Rejection) and result.code == "missing_field"
    _, record = dead_letter("ns.usage.v1", 0, 7, raw, result.code, result.reason)
    [dlq] = [spec for spec in topic_specs(settings) if spec.name == settings.topic("dlq")]
    assert len(record) <= int(dlq.configs["max.message.bytes"])
    assert len(record) <= faust_app(settings).conf.producer_max_request_size
