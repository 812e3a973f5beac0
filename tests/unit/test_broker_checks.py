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
    COMMITTED,
    GROUP_OFFSET,
    OPEN,
    Probe,
    failed,
    verdicts_of,
)

# As Apache Kafka 4.1 answered: the batch at 1-5; the aborted record, its marker and
# 'after-abort' next; the open transaction from 9
KAFKA = Probe(batch_offsets=(1, 2, 3, 4, 5), batch_end=6, transactions=True,
              committed_reads=COMMITTED, stable_end=9, stable_position=9,
              after_commit=(*COMMITTED, OPEN, AFTER_OPEN), group_offset=GROUP_OFFSET)


def ok_of(probe: Probe) -> dict[str, bool | None]:
    return {v.name: v.ok for v in verdicts_of(probe)}


def test_a_broker_that_keeps_everything_passes_every_check() -> None:
    assert set(ok_of(KAFKA).values()) == {True}
    assert failed(verdicts_of(KAFKA)) == []
    assert [v.name for v in verdicts_of(KAFKA)] == [c.name for c in CHECKS]


@pytest.mark.parametrize(("changes", "fails"), [
    # ListOffsets counting a batch as one record (Tansu 0.6)
    ({"batch_end": 2}, ["log_end"]),
    ({"batch_offsets": (1, 2, 3)}, ["log_end"]),
    # read committed giving an aborted record (Tansu 0.6)
    ({"committed_reads": (BEFORE, *BATCHED, ABORTED, AFTER_ABORT)}, ["aborted_hidden"]),
    # a read that did not give the committed records, or not in order
    ({"committed_reads": (BEFORE,)}, ["committed_given"]),
    ({"committed_reads": (BEFORE, *BATCHED[::-1], AFTER_ABORT)}, ["committed_given"]),
    # read committed not stopping at the open transaction
    ({"committed_reads": (*COMMITTED, OPEN, AFTER_OPEN)}, ["open_held"]),
    ({"committed_reads": (*COMMITTED, AFTER_OPEN)}, ["open_held"]),
    # a committed transaction never given
    ({"after_commit": COMMITTED}, ["committed_delivered"]),
    ({"after_commit": (*COMMITTED, AFTER_OPEN)}, ["committed_delivered"]),
    # ListOffsets (read committed) wrong while a transaction is open (Tansu 0.6 says 0)
    ({"stable_end": 0}, ["stable_end"]),
    ({"stable_end": None}, ["stable_end"]),
    # a group's offset not kept
    ({"group_offset": None}, ["group_offsets"]),
    ({"group_offset": 0}, ["group_offsets"]),
])
def test_each_way_a_broker_falls_short_fails_its_own_check(
        changes: dict[str, object], fails: list[str]) -> None:
    verdicts = verdicts_of(dataclasses.replace(KAFKA, **changes))  # type: ignore[arg-type]
    assert [v.name for v in failed(verdicts)] == fails


def test_without_transactions_their_checks_do_not_apply() -> None:
    probe = Probe(batch_offsets=(1, 2, 3, 4, 5), batch_end=6, transactions=False,
                  group_offset=GROUP_OFFSET)
    found = ok_of(probe)
    assert found == {"log_end": True, "committed_given": None, "aborted_hidden": None,
                     "open_held": None, "committed_delivered": None, "stable_end": None,
                     "group_offsets": True}
    assert failed(verdicts_of(probe)) == []
    # what they saw says why, whatever else the probe holds
    assert {v.saw for v in verdicts_of(probe) if v.ok is None} == {
        "the broker runs no transactions"}


def test_every_failure_says_what_it_costs() -> None:
    for c in CHECKS:
        assert c.affects in ("money", "progress") and c.otherwise
    money = {c.name for c in CHECKS if c.affects == "money"}
    assert {"committed_given", "aborted_hidden", "open_held", "committed_delivered",
            "group_offsets"} <= money
