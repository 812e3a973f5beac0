"""The batch script against the real Redis: sums to the micro-unit in every bucket, of any
size; credits apart from gross spend; tag sets and their oldest slot; the dedup memory, compact
however far it grows."""

from __future__ import annotations

import random

import pytest

from costline.connectors.redis_apply import DEDUP_LOAD, Applied, BatchWriter, Duplicates, Mismatch
from costline.connectors.redis_keys import (
    Calendar,
    bucket_key,
    dedup_key,
    first_seen_key,
    slot_tag,
    tagsets_key,
)
from costline.rules.ledger import event_key, tagset_id, tagset_json
from costline.rules.tally import Tally, Usage
from tests.integration.redis_writer import Writer

pytestmark = pytest.mark.integration

DAY = 86400
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
PARTS = {"gross": 0, "quantity": 1, "credits": 2}


@pytest.fixture
def writer(redis_writer: Writer) -> BatchWriter:
    return redis_writer.writer


def _tagset(team: str) -> tuple[str, str]:
    canonical = tagset_json({"team": team})
    return tagset_id(canonical), canonical


def digest(event_id: str) -> int:
    return event_key(event_id, 1)[0]


def _tally(usage: dict[tuple[str, int], tuple[int, int, int]], ids: list[str],
           waste: dict[tuple[str, int], int] | None = None, hour: int = T0) -> Tally:
    """Cells of (gross, credits, quantity) per (team, slot), waste of ``oom``, and the digests
    of ``ids`` in ``hour``."""
    tally = Tally()
    for (team, slot), (gross, credits, quantity) in usage.items():
        tsid, canonical = _tagset(team)
        tally.tagsets[tsid] = canonical
        tally.usage[(tsid, slot)] = Usage(gross, credits, quantity)
    for (team, slot), micro in (waste or {}).items():
        tsid, canonical = _tagset(team)
        tally.tagsets[tsid] = canonical
        tally.waste[(tsid, slot, "oom")] = micro
    digests = [digest(i) for i in ids]
    tally.digests = {hour: digests} if digests else {}
    tally.seen = set(digests)
    return tally


async def _part(writer: BatchWriter, slot: str, size: str, label: str | int, team: str,
                part: str) -> int | None:
    """A stored sum: ``gross``, ``quantity`` or ``credits`` of the usage field
    "<gross> <quantity> [<credits>]", or ``waste`` (of ``oom``)."""
    key, tsid = bucket_key(slot, size, label), _tagset(team)[0]
    if part == "waste":
        raw = await writer.redis.hget(key, f"{tsid}:w:oom")
        return None if raw is None else int(raw)
    raw = await writer.redis.hget(key, f"{tsid}:u")
    if raw is None:
        return None
    values = raw.split()
    index = PARTS[part]
    return int(values[index]) if index < len(values) else 0


def buckets(writer: BatchWriter, five: int) -> tuple[tuple[str, int | str], ...]:
    return (("5m", five), ("1h", five - five % 3600), ("1d", writer.calendar.date_of(five)))


async def test_many_batches_sum_exactly_in_every_bucket(writer: BatchWriter,
                                                        namespace: str) -> None:
    rng = random.Random(5)
    slot = slot_tag(namespace, 0)
    expected: dict[tuple[str, str, int | str, str], int] = {}
    for batch in range(30):
        usage: dict[tuple[str, int], tuple[int, int, int]] = {}
        waste: dict[tuple[str, int], int] = {}
        for _ in range(400):
            team, five = f"t{rng.randrange(50)}", T0 + rng.randrange(0, 2 * DAY, 300)
            kind = rng.choice(["usage", "usage", "credit", "waste"])
            if kind == "waste":
                add = {"waste": rng.randrange(0, 10**12)}
                waste[(team, five)] = waste.get((team, five), 0) + add["waste"]
            else:
                cell = list(usage.get((team, five), (0, 0, 0)))
                add = {"gross": rng.randrange(0, 10**12), "quantity": rng.randrange(0, 10**9)}
                if kind == "credit":
                    add["credits"] = rng.randrange(0, 10**11)
                cell[0] += add["gross"]
                cell[1] += add.get("credits", 0)
                cell[2] += add["quantity"]
                usage[(team, five)] = (cell[0], cell[1], cell[2])
            for part, delta in add.items():
                for size, label in buckets(writer, five):
                    key = (team, size, label, part)
                    expected[key] = expected.get(key, 0) + delta
        ids = [f"b{batch}-{i}" for i in range(400)]
        assert await writer.apply(slot, batch - 1, batch, _tally(usage, ids, waste)) == Applied()
    for (team, size, label, part), total in expected.items():
        assert await _part(writer, slot, size, label, team, part) == total


async def test_sums_stay_exact_at_any_size(writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    # past what doubles hold (2^53), past what Redis's integers hold (2^63), and on
    steps = [10**15 - 3, 7, 2**53 - 1, 2**53 + 5, 999, 10**18 + 1, 9 * 10**18, 10**19 + 3, 1]
    for mark, delta in enumerate(steps):
        # the quantity takes the steps in the other order: big beside small in one field
        quantity = steps[-1 - mark]
        tally = _tally({("big", T0): (delta, delta // 7, quantity)}, [f"e{mark}"],
                       {("big", T0): delta})
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
        total, quantities = sum(steps[:mark + 1]), sum(steps[-1 - mark:])
        for size, label in buckets(writer, T0):
            assert await _part(writer, slot, size, label, "big", "gross") == total, (mark, size)
            assert await _part(writer, slot, size, label, "big", "credits") == sum(
                s // 7 for s in steps[:mark + 1])
            assert await _part(writer, slot, size, label, "big", "quantity") == quantities
            assert await _part(writer, slot, size, label, "big", "waste") == total


async def test_round_sums_are_written_as_plain_integers(writer: BatchWriter,
                                                        namespace: str) -> None:
    # A Redis printing Lua numbers in shortest form would write 1.2e+09, which no reader takes
    # for an integer.
    slot = slot_tag(namespace, 0)
    round_ones = [1_200_000_000, 10**14, 10**15 - 10**14, 5 * 10**12]
    for mark, delta in enumerate(round_ones):
        team = f"round{mark}"
        tally = _tally({(team, T0): (delta, 0, 0)}, [f"r{mark}"], {(team, T0): delta})
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
        key = bucket_key(slot, "5m", T0)
        assert await writer.redis.hget(key, f"{_tagset(team)[0]}:u") == f"{delta} 0".encode()
        assert await writer.redis.hget(key, f"{_tagset(team)[0]}:w:oom") == str(delta).encode()


async def test_credits_are_stored_beside_gross_spend_once_there_are_any(
        writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    field = f"{_tagset('a')[0]}:u"
    key = bucket_key(slot, "5m", T0)
    assert await writer.apply(slot, -1, 0, _tally({("a", T0): (500, 0, 2)}, ["x"])) == Applied()
    assert await writer.redis.hget(key, field) == b"500 2"
    assert await writer.apply(slot, 0, 1, _tally({("a", T0): (0, 120, 0)}, ["y"])) == Applied()
    assert await writer.redis.hget(key, field) == b"500 2 120"
    assert await writer.apply(slot, 1, 2, _tally({("a", T0): (1, 0, 0)}, ["z"])) == Applied()
    assert await writer.redis.hget(key, field) == b"501 2 120"


async def test_tag_sets_keep_their_oldest_slot(writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    tsid, canonical = _tagset("a")
    for mark, at in enumerate([T0 + 3000, T0 + 600, T0 + 9000]):
        tally = _tally({("a", at): (1, 0, 0)}, [f"s{mark}"])
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
    # A fresh writer knows nothing, so it sends the tag set again (a newer slot).
    again = BatchWriter(writer.redis, namespace, Calendar("UTC"), dedup_ttl=DAY)
    assert await again.apply(slot, 2, 3, _tally({("a", T0 + 9900): (1, 0, 0)}, ["s3"])) \
        == Applied()
    assert await writer.redis.hget(tagsets_key(slot), tsid) == canonical.encode()
    assert await writer.redis.hget(first_seen_key(slot), tsid) == str(T0 + 600).encode()


async def test_what_is_known_of_tag_sets_stays_in_one_budget_over_all_slots(
        writer: BatchWriter, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("costline.connectors.redis_apply.KNOWN_TAGSETS_MAX", 60)
    slots = [slot_tag(namespace, p) for p in range(6)]
    teams = [f"t{i}" for i in range(200)]
    for batch in range(8):
        for n, slot in enumerate(slots):
            cells = {(team, T0): (1, 0, 0) for team in teams[batch * 25:batch * 25 + 25]}
            ids = [f"{n}-{batch}-{team}" for team, _ in cells]
            assert await writer.apply(slot, batch - 1, batch, _tally(cells, ids)) == Applied()
            assert writer.known_tagsets <= 60 + 25 * len(slots)
    for slot in slots:
        assert await writer.redis.hlen(tagsets_key(slot)) == 200
        assert await _part(writer, slot, "1d", writer.calendar.date_of(T0), "t0", "gross") == 1
    before = writer.known_tagsets
    writer.forget(slots[0])
    assert writer.known_tagsets < before


async def test_a_counted_event_refuses_the_batch_whole(writer: BatchWriter,
                                                       namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    assert await writer.apply(slot, -1, 0, _tally({("a", T0): (5, 0, 0)}, ["x", "y"])) \
        == Applied()
    outcome = await writer.apply(slot, 0, 1, _tally({("a", T0): (9, 0, 0)}, ["z", "y"]))
    assert outcome == Duplicates(frozenset({digest("y")}))
    assert await _part(writer, slot, "5m", T0, "a", "gross") == 5
    assert await writer.watermark(slot) == 0
    # without it, the batch applies; "z" was not remembered by the refused attempt
    assert await writer.apply(slot, 0, 1, _tally({("a", T0): (9, 0, 0)}, ["z"])) == Applied()
    assert await _part(writer, slot, "5m", T0, "a", "gross") == 14


async def test_a_write_on_another_watermark_changes_nothing(writer: BatchWriter,
                                                           namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    assert await writer.apply(slot, -1, 4, _tally({("a", T0): (5, 0, 0)}, ["x"])) == Applied()
    assert await writer.apply(slot, 2, 9, _tally({("a", T0): (5, 0, 0)}, ["y"])) == Mismatch(4)
    assert await _part(writer, slot, "5m", T0, "a", "gross") == 5


async def dedup_sets(writer: BatchWriter, slot: str, hour: int) -> list[bytes]:
    return [key async for key in writer.redis.scan_iter(f"{dedup_key(slot, hour)}:*")]


async def test_the_dedup_memory_of_an_hour_splits_into_compact_sets_as_it_grows(
        writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    ids = [f"d-{n}" for n in range(60_000)]
    # windows of every size: one of 30,000 events lands on a table that is still small
    cuts = [0, 1, 200, 1_000, 31_000, 45_000, 60_000]
    for mark, (start, end) in enumerate(zip(cuts, cuts[1:], strict=False)):
        tally = _tally({("a", T0): (1, 0, 0)}, ids[start:end])
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
    meta = await writer.redis.hgetall(dedup_key(slot, T0))
    assert int(meta[b"n"]) == 60_000
    keys = await dedup_sets(writer, slot, T0)
    assert len(keys) == 2 ** int(meta[b"l"]) + int(meta[b"s"])
    sizes = [await writer.redis.scard(key) for key in keys]
    assert sum(sizes) == 60_000
    assert max(sizes) <= 2 * DEDUP_LOAD + 100
    assert {await writer.redis.object("encoding", key) for key in keys} == {b"intset"}
    used = sum([await writer.redis.memory_usage(key, samples=0) for key in keys]) + \
        await writer.redis.memory_usage(dedup_key(slot, T0), samples=0)
    assert used / 60_000 <= 16, used / 60_000
    # every one of them is remembered: a window resending a sample of them is refused whole
    again = random.Random(3).sample(ids, 500)
    outcome = await writer.apply(slot, 5, 6, _tally({("a", T0): (1, 0, 0)}, again + ["new"]))
    assert outcome == Duplicates(frozenset(digest(i) for i in again))


async def test_each_hour_of_event_time_has_its_own_table_and_count(
        writer: BatchWriter, namespace: str) -> None:
    slot = slot_tag(namespace, 0)
    for mark, hour in enumerate([T0, T0 + 3600, T0]):
        tally = _tally({("a", hour): (1, 0, 0)}, [f"h{mark}-{n}" for n in range(10)], hour=hour)
        assert await writer.apply(slot, mark - 1, mark, tally) == Applied()
    assert await writer.redis.hget(dedup_key(slot, T0), "n") == b"20"
    assert await writer.redis.hget(dedup_key(slot, T0 + 3600), "n") == b"10"
    assert await writer.redis.ttl(dedup_key(slot, T0)) > DAY - 60
