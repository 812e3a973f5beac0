"""``bench/throughput.py`` and its data sets without Kafka or Redis: how rounds are summed up,
and that each data set is what the bench says it is."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench.datasets import generate
from bench.throughput import medians, rate, shown
from costline.connectors.kafka import partition_of


def test_rounds_give_the_median_and_range_of_each_rate_and_of_c_over_a() -> None:
    rounds = []
    for a_s, c_s in ((1.0, 4.0), (2.0, 5.0), (1.0, 10.0)):
        a = rate({"elapsed_s": a_s, "cpu_s": 1.0}, 100_000)
        c = rate({"elapsed_s": c_s, "cpu_s": 2.0, "redis_cpu_s": 0.5}, 100_000)
        rounds.append({"a": a, "c": {"1": c}, "c_over_a": c["events_per_s"] / a["events_per_s"]})
    found = medians(rounds)
    assert found["a"] == {"median": 100_000, "low": 50_000, "high": 100_000}
    assert found["c"]["1"]["median"] == 20_000
    # each ratio from its own round: 0.25, 0.4 and 0.1
    assert found["c_over_a"] == {"median": 0.25, "low": 0.1, "high": 0.4}
    assert rounds[0]["c"]["1"]["cpu_us_per_event"] == pytest.approx(20.0)
    assert rounds[0]["c"]["1"]["redis_us_per_event"] == pytest.approx(5.0)


def test_a_figure_shows_its_range_only_when_the_rounds_differ() -> None:
    assert shown({"median": 0.25, "low": 0.25, "high": 0.25}, ".2f") == "0.25"
    assert shown({"median": 20_000, "low": 9_000, "high": 25_000}, ",.0f") == (
        "20,000 (9,000–25,000)")


def events_of(value: bytes) -> list[dict[str, object]]:
    return json.loads(value)  # type: ignore[no-any-return]


def test_jobs_keeps_each_job_on_its_partition_and_keys_messages_by_job() -> None:
    data = generate("jobs", 3000, 300, 4, seed=7, batch=50)
    assert sum(len(events_of(v)) for _, _, v in data.messages) == 3000
    for partition, key, value in data.messages:
        assert partition_of(key.decode(), 4) == partition
        jobs = {e["tags"]["job"] for e in events_of(value)}  # type: ignore[index]
        assert all(partition_of(job, 4) == partition for job in jobs)
    assert sum(data.events_by_partition) == 3000


def test_uniform_spreads_each_message_over_as_many_tag_sets_and_keys_it_at_random() -> None:
    data = generate("uniform", 20_000, 10_000, 4, seed=7)
    spans = [len({json.dumps([e["tags"], e["resource_type"]], sort_keys=True)
                  for e in events_of(v)}) for _, _, v in data.messages]
    assert sum(spans) / len(spans) > 90  # of 100 events
    assert len({key for _, key, _ in data.messages}) == len(data.messages)
    for partition, key, _ in data.messages:
        assert partition_of(key.decode(), 4) == partition
    shares = Counter(p for p, _, _ in data.messages)
    assert min(shares.values()) > len(data.messages) / 4 * 0.7


def test_every_tag_set_occurs_and_the_expected_total_is_the_price_books() -> None:
    from costline.rules.events import parse_message
    from costline.rules.prices import PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    book = PriceBook.load(DEFAULT_PRICES)
    for name in ("jobs", "uniform"):
        data = generate(name, 2000, 500, 2, seed=3)
        total, tagsets = 0, set()
        for _, _, value in data.messages:
            parsed = parse_message(value)
            for event in parsed.events:  # type: ignore[union-attr]
                total += book.charge(event).cost_micro  # type: ignore[arg-type]
                tagsets.add((tuple(sorted(event.tags.items())), event.resource_type))
        assert total == data.expected_micro
        assert len(tagsets) == 500
