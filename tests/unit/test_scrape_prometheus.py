"""The Prometheus text format parser, the mapping file and samples → events, without sockets.

``tests/data/dcgm-exporter-node-017.prom`` is a dcgm-exporter page written from the public
format (NVIDIA dcgm-exporter's default counters, their HELP texts and its labels) for eight
H100s on node-017, GPU 0 idle in Slurm job 4242 and GPU 7 in no job.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from costline.connectors.prometheus_scrape import (
    ExpositionError,
    Page,
    PrometheusScraper,
    ScrapeMapping,
    load_mapping,
    parse_page,
    parse_sample,
    render,
)
from costline.rules.events import UsageEvent, UtilizationEvent
from costline.rules.prices import PriceBook
from costline.rules.yaml_source import SourceInvalid

DATA = Path(__file__).resolve().parents[1] / "data"
BOOK = PriceBook.load(Path(__file__).resolve().parents[2] / "rules" / "prices" / "example.yaml")
URL = "http://127.0.0.1:9400/metrics"
NOW = 1795852800.0


# -- the format -------------------------------------------------------------------------------


def test_a_sample_with_escaped_labels_and_a_timestamp() -> None:
    line = r'http_requests_total{method="post",path="C:\\dir \"x\"\n",} 1027 1395066363000'
    sample = parse_sample(line)
    assert sample.name == "http_requests_total"
    assert sample.labels == {"method": "post", "path": 'C:\\dir "x"\n'}
    assert (sample.value, sample.timestamp_s) == (1027.0, 1395066363.0)


@pytest.mark.parametrize(("line", "value"), [
    ("node_load1 1.52", 1.52), ("x{} 2.70553174016e+11", 2.70553174016e11), ("x -Inf", -math.inf),
    ("x +Inf", math.inf), ("up{job=\"a\"}\t1", 1.0), ("x_total 17 # {trace_id=\"a\"} 1", 17.0),
])
def test_values_in_every_spelling(line: str, value: float) -> None:
    assert parse_sample(line).value == value


def test_not_a_number_is_a_value() -> None:
    assert math.isnan(parse_sample("x NaN").value)


@pytest.mark.parametrize("line", [
    "x", "x 1 2 3", '{a="b"} 1', 'x{a="b" 1', 'x{a=b} 1', 'x{a="1",a="2"} 1', "x 1_000",
    "x{a=\"b\"}1", "x one",
])
def test_malformed_lines_are_refused(line: str) -> None:
    with pytest.raises(ExpositionError):
        parse_sample(line)


def test_a_page_keeps_types_and_reports_bad_lines_by_number() -> None:
    page = parse_page("# HELP a A.\n# TYPE a counter\na_total 1\n\nbroken{\n# EOF\n")
    assert [s.name for s in page.samples] == ["a_total"]
    assert page.type_of("a_total") == "counter"
    assert page.errors == ["line 5: bad label at column 8"]


def test_the_recorded_dcgm_page_parses_whole() -> None:
    page = parse_page((DATA / "dcgm-exporter-node-017.prom").read_text())
    assert (len(page.samples), page.errors) == (120, [])
    assert page.types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    util = [s for s in page.samples if s.name == "DCGM_FI_DEV_GPU_UTIL"]
    assert util[0].labels["Hostname"] == "node-017" and util[0].labels["UUID"].startswith("GPU-")


# -- the mapping ------------------------------------------------------------------------------


def test_templates_fill_labels_and_fail_on_a_missing_one() -> None:
    assert render("{Hostname}/gpu{gpu}", {"Hostname": "node-017", "gpu": "3"}) == "node-017/gpu3"
    assert render("{hpc_job}", {}) is None
    assert render("static", {}) == "static"


def test_the_example_mappings_load_against_the_example_price_book() -> None:
    for name in ("dcgm-exporter.yaml", "node-exporter.yaml"):
        assert load_mapping(DATA / name, BOOK).metrics


@pytest.mark.parametrize(("text", "message"), [
    ("metrics:\n  x:\n    kind: utilization\n    resource_type: gpu.h100\n",
     "utilization needs metric"),
    ("metrics:\n  x:\n    kind: usage\n    resource_type: gpu.h100\n    unit: gb\n",
     "unit 'gb' but gpu.h100 is priced per 'gpu_hour'"),
    ("metrics:\n  x:\n    kind: usage\n    resource_type: gpu.z9\n    unit: gpu_hour\n",
     "'gpu.z9' is not in the price book"),
    ("metrics:\n  x:\n    kind: usage\n    resource_type: gpu.h100\n    unit: gpu_hour\n"
     "    colour: red\n", "Extra inputs are not permitted"),
    ("tags: {Team: x}\nmetrics: {}\n", "tags.Team"),
])
def test_a_bad_mapping_says_where(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(text)
    with pytest.raises(SourceInvalid) as caught:
        load_mapping(path, BOOK)
    problem = caught.value.errors[0]
    assert problem.file == str(path) and problem.line >= 1
    assert message in str(caught.value)


# -- samples → events ---------------------------------------------------------------------------


def dcgm_events() -> tuple[list[UsageEvent | UtilizationEvent], PrometheusScraper]:
    scraper = PrometheusScraper(URL, load_mapping(DATA / "dcgm-exporter.yaml", BOOK), 60)
    page = parse_page((DATA / "dcgm-exporter-node-017.prom").read_text())
    return scraper.events(page, NOW), scraper


def test_dcgm_gpu_utilization_becomes_fractions_per_gpu_with_its_job() -> None:
    events, scraper = dcgm_events()
    util = {e.resource_id: e for e in events
            if isinstance(e, UtilizationEvent) and e.metric == "gpu_util"}
    assert sorted(util) == [f"node-017/gpu{g}" for g in range(8)]
    assert util["node-017/gpu0"].value == pytest.approx(0.02)
    assert util["node-017/gpu3"].value == pytest.approx(1.0)
    assert util["node-017/gpu0"].tags == {
        "cluster": "cluster-a", "node": "node-017", "slurm_job_id": "4242",
        "gpu_uuid": util["node-017/gpu0"].tags["gpu_uuid"]}
    assert "slurm_job_id" not in util["node-017/gpu7"].tags
    assert (util["node-017/gpu0"].ts, util["node-017/gpu0"].resource_type) == (NOW, "gpu.h100")
    assert len(events) == 24 and not +scraper.skipped


def test_event_ids_differ_by_series_and_repeat_for_the_same_scrape() -> None:
    first, _ = dcgm_events()
    again, _ = dcgm_events()
    assert [e.event_id for e in first] == [e.event_id for e in again]
    assert len({e.event_id for e in first}) == len(first)


NODE_PAGE = """# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{{cpu="0",mode="user"}} {user}
node_cpu_seconds_total{{cpu="0",mode="idle"}} 5000
# TYPE node_filesystem_size_bytes gauge
node_filesystem_size_bytes{{device="/dev/vda",fstype="ext4",mountpoint="/"}} 2.0e+11
node_filesystem_size_bytes{{device="tmpfs",fstype="tmpfs",mountpoint="/run"}} 1.0e+9
"""


def node_scraper() -> PrometheusScraper:
    return PrometheusScraper("http://node-017:9100/metrics",
                             load_mapping(DATA / "node-exporter.yaml", BOOK), 60)


def usage(events: list[UsageEvent | UtilizationEvent], rtype: str) -> list[UsageEvent]:
    return [e for e in events if isinstance(e, UsageEvent) and e.resource_type == rtype]


def test_a_gauge_counts_its_value_for_the_hours_since_the_previous_scrape() -> None:
    scraper = node_scraper()
    first = usage(scraper.events(parse_page(NODE_PAGE.format(user=100)), NOW), "storage.ssd")
    assert [(e.resource_id, e.ts, e.unit) for e in first] == [
        ("node-017:9100/", NOW - 60, "gb_hour")]
    assert first[0].quantity == pytest.approx(200 * 60 / 3600)
    later = usage(scraper.events(parse_page(NODE_PAGE.format(user=100)), NOW + 300),
                  "storage.ssd")
    assert later[0].quantity == pytest.approx(200 * 300 / 3600) and later[0].ts == NOW
    assert later[0].tags == {"cluster": "cluster-a", "node": "node-017:9100",
                             "device": "/dev/vda"}


def test_a_counter_counts_its_increase_and_survives_a_reset() -> None:
    scraper = node_scraper()
    assert usage(scraper.events(parse_page(NODE_PAGE.format(user=3600)), NOW),
                 "cpu.general") == []
    assert scraper.skipped["counter_baseline"] == 1
    grown = usage(scraper.events(parse_page(NODE_PAGE.format(user=5400)), NOW + 60),
                  "cpu.general")
    assert [(e.resource_id, e.unit) for e in grown] == [("node-017:9100/cpu0", "vcpu_hour")]
    assert grown[0].quantity == pytest.approx(0.5)
    reset = usage(scraper.events(parse_page(NODE_PAGE.format(user=720)), NOW + 120),
                  "cpu.general")
    assert reset[0].quantity == pytest.approx(0.2)


def test_samples_without_the_labels_a_template_needs_or_without_a_value_are_skipped() -> None:
    mapping = ScrapeMapping.model_validate({"metrics": {"up": {
        "kind": "utilization", "metric": "up", "resource_type": "cpu.general",
        "resource_id": "{host}"}}})
    scraper = PrometheusScraper(URL, mapping, 60)
    page = parse_page('up{host="a"} 1\nup 1\nup{host="b"} NaN\n')
    assert [e.resource_id for e in scraper.events(page, NOW)] == ["a"]
    assert scraper.skipped == {"missing_label": 1, "not_a_number": 1}


def test_an_empty_page_is_no_events() -> None:
    assert node_scraper().events(Page(), NOW) == []


def test_a_series_gone_for_ten_intervals_is_forgotten_and_starts_a_new_baseline() -> None:
    scraper = node_scraper()
    scraper.events(parse_page(NODE_PAGE.format(user=100)), NOW)
    scraper.events(Page(), NOW + 11 * 60)  # the exporter listed nothing for a while
    back = scraper.events(parse_page(NODE_PAGE.format(user=200)), NOW + 12 * 60)
    assert usage(back, "cpu.general") == []
    assert scraper.skipped["counter_baseline"] == 2
