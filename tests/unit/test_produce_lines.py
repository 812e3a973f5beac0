"""How ``costline produce`` turns lines into messages, without a broker."""

from __future__ import annotations

import io
import json
from typing import Any

from costline.streams.cli.produce_cmd import (
    Accepted,
    Batcher,
    Message,
    Summary,
    check_line,
    produce_lines,
    read_lines,
)


def usage(event_id: str) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "usage", "ts": 1795852800, "resource_id": "n-1",
            "resource_type": "gpu.h100", "quantity": 1, "unit": "gpu_hour"}


def fault(event_id: str) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "fault", "ts": 1795852800, "fault": "oom",
            "resource_type": "gpu.h100", "units": 8, "lost_seconds": 60,
            "recovery_seconds": 30}


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


def run(text: bytes, **options: Any) -> tuple[list[Message], Summary]:
    sent: list[Message] = []
    summary = Summary()
    produce_lines([("f.jsonl", io.BytesIO(text))], sent.append, summary, **options)
    return sent, summary


def test_lines_route_by_kind_and_keep_their_bytes() -> None:
    line = b'{"event_id":"m-1","kind":"utilization","ts":1795852800,"resource_id":"n",' \
           b'"resource_type":"gpu.h100","metric":"gpu_util","value":0.5}'
    checked = check_line(line)
    assert checked == Accepted("usage", "m-1", 1, False, line)
    assert isinstance(check_line(raw(fault("f-1"))), Accepted)
    assert check_line(raw(fault("f-1"))).topic == "faults"  # type: ignore[union-attr]


def test_forced_topic_rejects_the_other_kind_with_its_index() -> None:
    assert check_line(raw(fault("f-1")), forced="usage") == (
        "wrong_topic", "kind 'fault' belongs on the faults topic, not usage")
    code, reason = check_line(raw([usage("u-1"), fault("f-1")]), forced="usage")  # type: ignore[misc]
    assert (code, reason.split(":")[0]) == ("wrong_topic", "event 1")


def test_a_batch_of_mixed_kinds_has_no_topic() -> None:
    assert check_line(raw([usage("u-1"), fault("f-1")]))[0] == "wrong_topic"  # type: ignore[index]


def test_blank_lines_and_a_byte_order_mark_are_skipped_but_counted() -> None:
    text = b"\xef\xbb\xbf" + raw(usage("u-1")) + b"\n\n  \n" + raw(usage("u-2")) + b"\r\n"
    numbers = [number for number, _, _ in read_lines(io.BytesIO(text))]
    assert numbers == [1, 4]


def test_rejections_carry_file_and_line_and_do_not_stop_the_rest() -> None:
    text = b"\n".join([raw(usage("u-1")), b"{oops", raw({**usage("u-2"), "quantity": -1}),
                       raw(usage("u-3"))])
    sent, summary = run(text)
    assert [m.key for m in sent] == [b"u-1", b"u-3"]
    assert [(r.file, r.line, r.code) for r in summary.rejected] == [
        ("f.jsonl", 2, "invalid_json"), ("f.jsonl", 3, "out_of_range")]


def test_batch_makes_arrays_per_topic_and_keys_them_by_the_first_event() -> None:
    lines = [usage("u-0"), fault("f-0"), usage("u-1"), usage("u-2"), fault("f-1")]
    sent, _ = run(b"\n".join(raw(e) for e in lines), batch=2)
    assert [(m.topic, m.key, m.events) for m in sent] == [
        ("usage", b"u-0", 2), ("faults", b"f-0", 2), ("usage", b"u-2", 1)]
    assert json.loads(sent[0].value) == [usage("u-0"), usage("u-1")]


def test_a_ready_batch_is_sent_as_it_is() -> None:
    ready = raw([usage("u-0"), usage("u-1"), usage("u-2")])
    sent, _ = run(ready, batch=2)
    assert [(m.key, m.value, m.events) for m in sent] == [(b"u-0", ready, 3)]


def test_batcher_flushes_what_is_left() -> None:
    batcher = Batcher(10)
    line = Accepted("usage", "u-0", 1, False, raw(usage("u-0")))
    assert list(batcher.add(line)) == []
    [message] = list(batcher.flush())
    assert json.loads(message.value) == [usage("u-0")]


def test_summary_counts_only_acknowledged_messages() -> None:
    summary = Summary()
    message = Message("usage", b"k", b"[]", 3)
    summary.queued_messages = 2
    summary.delivered(message, "ns.usage.v1")
    summary.settle()
    data = summary.as_dict()
    assert (data["sent_events"], data["sent_messages"], data["failed_messages"]) == (3, 1, 1)
    assert data["topics"] == {"ns.usage.v1": {"events": 3, "messages": 1}}


def test_batches_hold_only_events_of_their_key_partition() -> None:
    from costline.connectors.kafka import partition_of

    batcher = Batcher(5, partitions=lambda topic: 6)
    sent = []
    for i in range(60):
        line = Accepted("usage", f"u-{i}", 1, False, raw(usage(f"u-{i}")))
        sent += list(batcher.add(line))
    sent += list(batcher.flush())
    assert sum(m.events for m in sent) == 60
    for message in sent:
        ids = [event["event_id"] for event in json.loads(message.value)]
        assert {partition_of(i, 6) for i in ids} == {partition_of(message.key.decode(), 6)}
