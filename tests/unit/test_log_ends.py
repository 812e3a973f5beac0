"""Log ends as ListOffsets gives them, checked with a fetch (``connectors.kafka.log_ends``):
a broker whose ListOffsets counts a batch as one record is found out by the records a fetch
returns past its answer."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from costline.connectors.kafka import log_ends


@dataclass
class Broker:
    """A consumer of one broker: ``listed`` is what ListOffsets says, ``logs`` where each log
    really ends, ``answers`` whether a fetch of it is answered at all."""

    listed: dict[str, int]
    logs: dict[str, int]
    answers: set[str] = field(default_factory=set)
    positions: dict[str, int] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)
    assigned: list[str] = field(default_factory=list)

    def unsubscribe(self) -> None:
        self.assigned, self.high = [], {}

    def end_offsets(self, partitions: list[str]) -> dict[str, int]:
        return {tp: self.listed[tp] for tp in partitions}

    def assign(self, partitions: list[str]) -> None:
        self.assigned = list(partitions)

    def seek(self, tp: str, offset: int) -> None:
        self.positions[tp] = offset

    def poll(self, timeout_ms: int) -> dict[str, list[int]]:
        fetched = {}
        for tp in self.assigned:
            if tp in self.answers:
                fetched[tp] = list(range(self.positions[tp], self.logs[tp]))
                self.positions[tp] = self.logs[tp]
                self.high[tp] = self.logs[tp]
        return fetched

    def highwater(self, tp: str) -> int | None:
        return self.high.get(tp)

    def position(self, tp: str) -> int:
        return self.positions[tp]


def test_listoffsets_is_kept_where_a_fetch_finds_nothing_past_it() -> None:
    broker = Broker(listed={"a": 7, "b": 0}, logs={"a": 7, "b": 0}, answers={"a", "b"})
    assert log_ends(broker, ["a", "b"]) == {"a": 7, "b": 0}


def test_records_past_listoffsets_answer_move_the_end_to_the_fetch_s() -> None:
    # five records in one batch after eleven: ListOffsets says 12, the log ends at 16
    broker = Broker(listed={"a": 12, "b": 3}, logs={"a": 16, "b": 3}, answers={"a", "b"})
    assert log_ends(broker, ["a", "b"]) == {"a": 16, "b": 3}


def test_a_fetch_never_answered_keeps_listoffsets_answer_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker(listed={"a": 12, "b": 3}, logs={"a": 16, "b": 9}, answers={"b"})
    with caplog.at_level(logging.WARNING, logger="costline.kafka"):
        assert log_ends(broker, ["a", "b"], timeout_s=0.05) == {"a": 12, "b": 9}
    assert "no fetch answered within 0.05 s for a" in caplog.text


def test_nothing_to_ask_about() -> None:
    assert log_ends(Broker(listed={}, logs={}), []) == {}
