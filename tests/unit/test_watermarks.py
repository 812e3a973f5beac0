"""The watermark bookkeeping of a ledger partition, case by case (``costline.rules.watermarks``)."""

from __future__ import annotations

import pytest

from costline.rules.watermarks import (
    NOTHING,
    Adopt,
    Position,
    SeekBack,
    admits,
    expired,
    folded,
    mismatch,
    resumed,
    to_write,
    verified,
    written,
)


def test_a_new_partition_resumes_after_its_stored_watermark():
    assert resumed(41) == (Position(41, 41), 42)
    assert resumed(NOTHING) == (Position(NOTHING, NOTHING), 0)


@pytest.mark.parametrize(("folded_to", "offset", "new"), [
    (10, 9, False),   # a replay of what was folded
    (10, 10, False),  # the last one folded, again
    (10, 11, True),   # the next one
    (10, 25, True),   # past a gap (records deleted, compaction): offsets need not be dense
    (NOTHING, 0, True),
])
def test_a_record_is_new_only_above_what_was_folded(folded_to, offset, new):
    assert admits(Position(5, folded_to), offset) is new


def test_folding_moves_only_the_folded_offset_and_never_back():
    position = folded(Position(5, 9), 12)
    assert position == Position(5, 12)
    assert folded(position, 3) == position


def test_a_written_window_moves_the_watermark_to_its_last_record():
    assert written(Position(5, 20), 12) == Position(12, 20)
    assert written(Position(5, 9), 12) == Position(12, 12)


@pytest.mark.parametrize(("position", "stored", "after", "action"), [
    # Redis restarted from an older snapshot: read again after what it holds, and drop
    # everything folded since (a new epoch)
    (Position(30, 40, 0), 17, Position(17, 17, 1), SeekBack(18)),
    (Position(30, 40, 2), NOTHING, Position(NOTHING, NOTHING, 3), SeekBack(0)),  # emptied
    # another worker wrote further (the partition went away and came back): adopt it
    (Position(30, 40, 0), 35, Position(35, 40, 0), Adopt(35)),
    (Position(30, 40, 0), 55, Position(55, 55, 0), Adopt(55)),
])
def test_a_refused_write_says_where_to_go_on(position, stored, after, action):
    assert mismatch(position, stored) == (after, action)


@pytest.mark.parametrize(("offsets", "applied", "left"), [
    ([11, 12, 13], 10, [11, 12, 13]),
    ([11, 12, 13], 12, [13]),  # adopted past part of the window
    ([11, 12, 13], 13, []),  # another worker counted all of it
])
def test_only_records_above_the_watermark_are_written(offsets, applied, left):
    assert to_write(offsets, Position(applied, 13)) == left


def test_an_idle_partition_whose_watermark_redis_lost_is_read_again():
    assert verified(Position(30, 30, 1), 12) == (Position(12, 12, 2), SeekBack(13))
    assert verified(Position(30, 30, 1), 30) == (Position(30, 30, 1), None)
    assert verified(Position(30, 30, 1), 31) == (Position(30, 30, 1), None)  # its write says


@pytest.mark.parametrize(("start", "kept_from", "lost"), [
    (42, 0, 0),      # the ledger still holds everything from the watermark on
    (42, 42, 0),     # it begins right where the partition is read from
    (42, 50, 8),     # retention removed 42..49 before they were counted
    (0, 1_000, 1_000),  # Redis emptied, and the ledger no longer begins at 0
])
def test_records_the_ledger_removed_before_they_were_counted(start, kept_from, lost):
    assert expired(start, kept_from) == lost
