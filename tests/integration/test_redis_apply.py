"""The batch script against the real Redis: sums to the micro-unit in every bucket, also past
what Lua's doubles hold exactly; tag sets and their oldest slot; the dedup memory."""

from __future__ import annotations

import random

import pytest

from costline.connectors.redis_apply import Applied, BatchWriter, Duplicates, Overflow
from costline.connectors.redis_keys import (
    Calendar,
    bucket_key,
    first_seen_key,
    slot_tag,
    tagsets_key,
)
from costline.rules.tally import Tally, event_digest, tagset_id, tagset_json
from tests.integration.redis_writer import Writer

pytestmark = pytest.mark.integration

DAY = 86400
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


@pytest.fixture
def writer(redis_writer: Writer) -> BatchWriter:
    return redis_writer.writer


def _tagset(team: str) -> tuple[str, str]:
    canonical = tagset_json({"team": team})
    return tagset_id(canonical), canonical


def _tally(cells: dict[tuple[str, int], dict[str, int]], ids: list[str]) -> Tally:
    tally = Tally()
    for (team, slot), measures in cells.items():
        tsid, canonical = _tagset(team)
        tally.tagsets[tsid] = canonical
        tally.sums[(tsid, slot)] = dict(measures)
    tally.digests = {T0: [event_digest(i) for i in ids]} if ids else {}
    tally.events = len(ids)
    return tally


async def _field(writer: BatchWriter, slot: str, size: str, label: str | int, team: str,
                 measure: str) -> int | None:
    """A sum as stored: cost ``c`` and quantity ``q`` in the usage field "<cost> <quantity>"."""
    key, tsid = bucket_key(slot, size, label), _tagset(team)[0]
    if measure in ("c", "q"):
        raw = await writer.redis.hget(key, f"{tsid}:u")
        return None if raw is None else int(raw.split()[("c", "q").index(measure)])
    raw = await writer.redis.hget(key, f"{tsid}:{measure}")
    return None if raw is None else int(raw)


async def test_many_batches_sum_exactly_in_every_bucket(writer: BatchWriter,
                                                        namespace: str) -> None:
    rng = random.Random(5)
    slot = slot_tag(namespace, "usage", 0)
    expected: dict[tuple[str, str, int | str, str], int] = {}
    for batch in range(30):
        cells: dict[tuple[str, int], dict[str, int]] = {}
        for _ in range(400):
            team = f"t{rng.randrange(50)}"
            five = T0 + rng.randrange(0, 2 * DAY, 300)
            measures = cells.setdefault((team, five), {})
            # usage, and now and then waste beside it (or alone) in the same cell
            kinds = rng.choice([("c", "q"), ("c", "q"), ("c", "q", "w:oom"), ("w:oom",)])
            for measure in kinds:
                delta = rng.randrange(0, 10**12)
                measures[measure] = measures.get(measure, 0) + delta
                for size, label in (("5m", five), ("1h", five - five % 3600),
                                    ("1d", writer.calendar.date_of(five))):
                    key = (team, size, label, measure)
                    expected[key] = expected.get(key, 0) + delta
        ids = [f"b{batch}-{i}" for i in range(400)]
        assert await writer.apply(slot, batch - 1, batch, _tally(cells, ids)) == Applied()
    for (team, size, label, measure), total in expected.items():
        assert await _field(writer, slot, size, label, team, measure) == total


async def test_sums_stay_exact_past_what_doubles_hold(writer: BatchWriter,
                                                      namespace: str) -> None:
    slot = slot_tag(namespace, "usage", 0)
    steps = [10**15 - 3, 7, 2**53 - 1, 2**53 + 5, 999, 10**18 + 1, 1]
    for mark, delta in enumerate(steps):
        # the quantity takes the steps in the other order: big beside small in one field
        quantity = steps[-1 - mark]
        tally = _tally({("big", T0): {"c": delta, "q": quantity}}, [f"e{mark}"])
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
        total, quantities = sum(steps[:mark + 1]), sum(steps[-1 - mark:])
        for size, label in (("5m", T0), ("1h", T0), ("1d", "2026-01-01")):
            assert await _field(writer, slot, size, label, "big", "c") == total, (mark, size)
            assert await _field(writer, slot, size, label, "big", "q") == quantities, mark


async def test_round_sums_are_written_as_plain_integers(writer: BatchWriter,
                                                        namespace: str) -> None:
    # The script hands sums to Redis as Lua numbers; a Redis printing them in shortest form
    # would write 1.2e+09, which no reader (and no later HINCRBY) takes for an integer.
    slot = slot_tag(namespace, "usage", 0)
    round_ones = [1_200_000_000, 10**14, 10**15 - 10**14, 5 * 10**12]
    for mark, delta in enumerate(round_ones):
        team = f"round{mark}"
        tally = _tally({(team, T0): {"c": delta}}, [f"r{mark}"])
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
        raw = await writer.redis.hget(bucket_key(slot, "5m", T0), f"{_tagset(team)[0]}:u")
        assert raw == f"{delta} 0".encode(), (delta, raw)


async def test_a_batch_past_what_doubles_hold_adds_its_small_deltas_exactly(
        writer: BatchWriter, namespace: str) -> None:
    # Such a batch leaves every addition to HINCRBY: its small deltas travel as Lua numbers,
    # its big ones as decimal strings.
    slot = slot_tag(namespace, "usage", 0)
    cells = {("small", T0): {"c": 1_200_000_000, "q": 7, "w:oom": 3},
             ("huge", T0): {"c": 2**53 + 5}, ("huge", T0 + 300): {"c": 2**53 + 9, "q": 1},
             ("waste", T0): {"w:oom": 2**53 + 1}}
    assert await writer.apply(slot, -1, 0, _tally(cells, ["s", "h"])) == Applied()
    for size, label in (("5m", T0), ("1h", T0), ("1d", "2026-01-01")):
        assert await _field(writer, slot, size, label, "small", "c") == 1_200_000_000
        assert await _field(writer, slot, size, label, "small", "q") == 7
        assert await _field(writer, slot, size, label, "small", "w:oom") == 3
        assert await _field(writer, slot, size, label, "waste", "w:oom") == 2**53 + 1
    assert await _field(writer, slot, "5m", T0, "huge", "c") == 2**53 + 5
    assert await _field(writer, slot, "5m", T0, "huge", "q") == 0
    for size, label in (("1h", T0), ("1d", "2026-01-01")):
        assert await _field(writer, slot, size, label, "huge", "c") == 2**54 + 14
        assert await _field(writer, slot, size, label, "huge", "q") == 1


async def test_tag_sets_keep_their_oldest_slot(writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, "usage", 0)
    tsid, canonical = _tagset("a")
    for mark, at in enumerate([T0 + 3000, T0 + 600, T0 + 9000]):
        tally = _tally({("a", at): {"c": 1}}, [f"s{mark}"])
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
    # A fresh writer knows nothing, so it sends the tag set again (a newer slot).
    again = BatchWriter(writer.redis, namespace, Calendar("UTC"), dedup_ttl=DAY)
    assert await again.apply(slot, 2, 3, _tally({("a", T0 + 9900): {"c": 1}}, ["s3"])) \
        == Applied()
    assert await writer.redis.hget(tagsets_key(slot), tsid) == canonical.encode()
    assert await writer.redis.hget(first_seen_key(slot), tsid) == str(T0 + 600).encode()


async def test_what_is_known_of_tag_sets_stays_in_one_budget_over_all_slots(
        writer: BatchWriter, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The budget is shared: however many partitions the worker owns, it remembers at most
    # the budget plus one batch's new tag sets per slot.
    monkeypatch.setattr("costline.connectors.redis_apply.KNOWN_TAGSETS_MAX", 60)
    slots = [slot_tag(namespace, "usage", p) for p in range(6)]
    teams = [f"t{i}" for i in range(200)]
    for batch in range(8):
        for n, slot in enumerate(slots):
            cells = {(team, T0): {"c": 1} for team in teams[batch * 25:batch * 25 + 25]}
            ids = [f"{n}-{batch}-{team}" for team, _ in cells]
            assert await writer.apply(slot, batch - 1, batch, _tally(cells, ids)) == Applied()
            assert writer.known_tagsets <= 60 + 25 * len(slots)
    # A tag set forgotten is sent again, and is still one tag set in Redis.
    for slot in slots:
        assert await writer.redis.hlen(tagsets_key(slot)) == 200
        assert await _field(writer, slot, "1d", writer.calendar.date_of(T0), "t0", "c") == 1
    before = writer.known_tagsets
    writer.forget(slots[0])
    assert writer.known_tagsets < before


async def test_a_counted_event_refuses_the_batch(writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, "usage", 0)
    assert await writer.apply(slot, -1, 0, _tally({("a", T0): {"c": 5}}, ["x", "y"])) \
        == Applied()
    outcome = await writer.apply(slot, 0, 1, _tally({("a", T0): {"c": 9}}, ["z", "y"]))
    assert outcome == Duplicates(frozenset({event_digest("y")}))
    assert await _field(writer, slot, "5m", T0, "a", "c") == 5


async def test_a_sum_past_what_redis_holds_refuses_the_batch_whole(
        writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, "usage", 0)
    near = 9 * 10**18  # counted already: within what a bucket field may hold
    assert await writer.apply(slot, -1, 0, _tally({("a", T0): {"c": near}}, ["x"])) \
        == Applied()
    outcome = await writer.apply(slot, 0, 1, _tally(
        {("a", T0 + 300): {"c": 3 * 10**17}, ("b", T0): {"c": 7}}, ["y", "z"]))
    tsid = _tagset("a")[0]
    # Both buckets the 5-minute slot adds to in full would pass the limit; its own does not.
    assert outcome == Overflow({
        f"{bucket_key(slot, '1h', T0)} {tsid}:c": near,
        f"{bucket_key(slot, '1d', '2026-01-01')} {tsid}:c": near,
    })
    # Nothing of the refused batch was written: not its other sums, not its dedup memory,
    # not the watermark, so the batch without the offending sums applies in full.
    assert await writer.watermark(slot) == 0
    assert await _field(writer, slot, "1d", "2026-01-01", "a", "c") == near
    assert await _field(writer, slot, "5m", T0, "b", "c") is None
    assert await writer.redis.smismember(f"{slot}:seen:{T0}", [event_digest("y"),
                                                              event_digest("z")]) == [0, 0]
    assert await writer.apply(slot, 0, 1, _tally({("b", T0): {"c": 7}}, ["y", "z"])) \
        == Applied()
    assert await _field(writer, slot, "1d", "2026-01-01", "b", "c") == 7


async def test_a_quantity_past_what_redis_holds_is_named_as_a_quantity(
        writer: BatchWriter, namespace: str) -> None:
    # Cost and quantity share a field; the refusal still names the sum that would overflow.
    slot = slot_tag(namespace, "usage", 0)
    near = 9 * 10**18
    assert await writer.apply(slot, -1, 0, _tally({("a", T0): {"c": 1, "q": near}}, ["x"])) \
        == Applied()
    outcome = await writer.apply(slot, 0, 1, _tally({("a", T0): {"c": 1, "q": 3 * 10**17}},
                                                    ["y"]))
    tsid = _tagset("a")[0]
    assert outcome == Overflow({
        f"{bucket_key(slot, size, label)} {tsid}:q": near
        for size, label in (("5m", T0), ("1h", T0), ("1d", "2026-01-01"))
    })
    assert await writer.watermark(slot) == 0
    assert await _field(writer, slot, "1d", "2026-01-01", "a", "c") == 1
    assert await _field(writer, slot, "1d", "2026-01-01", "a", "q") == near
