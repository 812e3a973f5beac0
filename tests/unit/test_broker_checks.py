"""The verdicts of ``costline topics check`` from what a probe saw: a table of brokers."""

from __future__ import annotations

import dataclasses

import pytest

from costline.rules.broker_checks import (
    ABORTED,
    AFTER_ABORT,
    AFTER_OPEN,
    BATCHED,
    BEFORE,
    CHECKS,
    GROUP_OFFSET,
    OPEN,
    Probe,
    failed,
    judge,
)

COMMITTED = (BEFORE, *BATCHED, AFTER_ABORT)
# Apache Kafka: the batch at 1-5, the aborted record at 6 and its marker at 7, 'after-abort'
# at 8, the open transaction from 9
KAFKA = Probe(batch_offsets=(1, 2, 3, 4, 5), batch_end=6, transactions=None,
              committed_reads=COMMITTED, stable_end=9, stable_position=9,
              after_commit=(OPEN, AFTER_OPEN), group_offset=GROUP_OFFSET)


def ok_of(probe: Probe) -> dict[str, bool | None]:
    return {v.name: v.ok for v in judge(probe)}


def test_a_broker_that_keeps_everything_passes_every_check() -> None:
    assert set(ok_of(KAFKA).values()) == {True}
    assert failed(judge(KAFKA)) == []
    assert [v.name for v in judge(KAFKA)] == [c.name for c in CHECKS]


@pytest.mark.parametrize(("changes", "fails"), [
    # ListOffsets counting a batch as one record (Tansu 0.6)
    ({"batch_end": 2}, ["log_end"]),
    ({"batch_offsets": (1, 2, 3)}, ["log_end"]),
    # read committed giving an aborted record
    ({"committed_reads": (BEFORE, *BATCHED, ABORTED, AFTER_ABORT)}, ["aborted_hidden"]),
    # a read that did not get the committed records at all
    ({"committed_reads": (BEFORE,), "after_commit": (OPEN, AFTER_OPEN)}, ["aborted_hidden"]),
    # read committed not stopping at the open transaction
    ({"committed_reads": (*COMMITTED, OPEN, AFTER_OPEN), "after_commit": ()}, ["open_held"]),
    ({"committed_reads": (*COMMITTED, AFTER_OPEN), "after_commit": (OPEN,)}, ["open_held"]),
    # a committed transaction never given
    ({"after_commit": ()}, ["committed_delivered"]),
    ({"after_commit": (AFTER_OPEN,)}, ["committed_delivered"]),
    # ListOffsets (read committed) wrong while a transaction is open (Tansu 0.6 says 0)
    ({"stable_end": 0}, ["stable_end"]),
    ({"stable_end": None}, ["stable_end"]),
    # a group's offset not kept
    ({"group_offset": None}, ["group_offsets"]),
    ({"group_offset": 0}, ["group_offsets"]),
])
def test_each_way_a_broker_falls_short_fails_its_own_check(
        changes: dict[str, object], fails: list[str]) -> None:
    verdicts = judge(dataclasses.replace(KAFKA, **changes))  # type: ignore[arg-type]
    assert [v.name for v in failed(verdicts)] == fails


def test_without_transactions_their_checks_do_not_apply() -> None:
    probe = Probe(batch_offsets=(1, 2, 3, 4, 5), batch_end=6,
                  transactions="KafkaTimeoutError: init_transactions timed out",
                  group_offset=GROUP_OFFSET)
    found = ok_of(probe)
    assert found == {"log_end": True, "transactions": None, "aborted_hidden": None,
                     "open_held": None, "committed_delivered": None, "stable_end": None,
                     "group_offsets": True}
    assert failed(judge(probe)) == []


def test_every_failure_says_what_it_costs() -> None:
    for c in CHECKS:
        assert c.affects in ("money", "progress") and c.otherwise
    money = {c.name for c in CHECKS if c.affects == "money"}
    assert {"aborted_hidden", "open_held", "committed_delivered", "group_offsets"} <= money
