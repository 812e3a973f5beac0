"""Prometheus text exposition pages → utilization and usage events (README, Events).

Any exporter a cluster already runs (node-exporter, dcgm-exporter, a scheduler's exporter)
becomes a costline source through a YAML mapping: which metric is which event, how its value
scales, and how its labels fill ``resource_id``, ``resource_type`` and tags. The parser is a
small one of our own: the text format (version 0.0.4, and the OpenMetrics lines that matter)
is a few rules, and a dependency for it would be larger than the code.

Usage needs an amount over time, which a single sample is not: a ``gauge`` mapping counts its
value for the hours since the previous scrape (``--interval`` on the first), a ``counter``
mapping counts its increase since the previous scrape (a reset counts from zero; the first
scrape only sets the baseline). ``docs/SCRAPE.md`` describes the mapping file.
"""

from __future__ import annotations

import hashlib
import math
import re
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costline.rules.events import (
    MAX_TAGS,
    Name,
    ResourceType,
    TagKey,
    UsageEvent,
    UtilizationEvent,
)
from costline.rules.globs import glob_match
from costline.rules.prices import PriceBook
from costline.rules.yaml_source import Document, SourceError, SourceInvalid, load_document

ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5"
MAX_PAGE_BYTES = 64 * 1024 * 1024
MAX_TEXT = 256

# -- the exposition format ------------------------------------------------------------------

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


class ExpositionError(ValueError):
    """A line that is not a sample, a comment or blank."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_s: float | None = None


@dataclass
class Page:
    """A parsed page: its samples, the declared ``# TYPE`` of each family, bad lines."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def type_of(self, name: str) -> str | None:
        """The family type; OpenMetrics declares ``foo`` for the sample ``foo_total``."""
        return self.types.get(name) or self.types.get(name.removesuffix("_total"))


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), text)


def _labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Labels from the ``{`` at ``pos``; returns them and the position after ``}``."""
    labels: dict[str, str] = {}
    pos += 1
    while True:
        if line[pos:].lstrip().startswith("}"):
            return labels, line.index("}", pos) + 1
        match = _LABEL.match(line, pos)
        if match is None:
            raise ExpositionError(f"bad label at column {pos + 1}")
        name, value = match.group(1), _unescape(match.group(2))
        if name in labels:
            raise ExpositionError(f"label {name!r} repeated")
        labels[name] = value
        pos = match.end()
        if line.startswith(",", pos):
            pos += 1
        elif not line.startswith("}", pos):
            raise ExpositionError(f"expected ',' or '}}' at column {pos + 1}")


def _number(text: str) -> float:
    if "_" in text:  # Python's float() takes 1_000; the format does not
        raise ExpositionError(f"bad number {text!r}")
    try:
        return float(text)
    except ValueError:
        raise ExpositionError(f"bad number {text!r}") from None


def parse_sample(line: str) -> Sample:
    """One sample line: ``name{label="value",...} value [timestamp]``."""
    match = _METRIC.match(line)
    if match is None:
        raise ExpositionError("no metric name")
    labels: dict[str, str] = {}
    pos = match.end()
    if line.startswith("{", pos):
        labels, pos = _labels(line, pos)
    rest = line[pos:].split(" # ", 1)[0].split()  # an OpenMetrics exemplar follows " # "
    if not 1 <= len(rest) <= 2 or (pos < len(line) and line[pos] not in " \t"):
        raise ExpositionError("expected a value and an optional timestamp")
    stamp = None
    if len(rest) == 2:
        # The text format writes milliseconds as an integer; OpenMetrics writes seconds.
        stamp = int(rest[1]) / 1000 if rest[1].lstrip("-").isdigit() else _number(rest[1])
    return Sample(match.group(0), labels, _number(rest[0]), stamp)


def _comment(page: Page, line: str) -> None:
    parts = line[1:].split(None, 3)
    if len(parts) >= 3 and parts[0] == "TYPE":
        page.types[parts[1]] = parts[2].lower()


def parse_page(text: str) -> Page:
    """A whole page; a bad line is recorded and skipped, the rest still counts."""
    page = Page()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line == "# EOF":
            continue
        if line.startswith("#"):
            _comment(page, line)
            continue
        try:
            page.samples.append(parse_sample(line))
        except ExpositionError as exc:
            page.errors.append(f"line {number}: {exc}")
    return page


def fetch_page(url: str, timeout_s: float = 10.0) -> str:
    """GET a metrics page, as an exporter expects Prometheus to."""
    request = urllib.request.Request(url, headers={"Accept": ACCEPT,
                                                   "User-Agent": "costline-scrape"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        body: bytes = response.read(MAX_PAGE_BYTES + 1)
        charset = response.headers.get_content_charset() or "utf-8"
    if len(body) > MAX_PAGE_BYTES:
        raise ValueError(f"{url}: page larger than {MAX_PAGE_BYTES} bytes")
    return body.decode(charset, errors="replace")


# -- the mapping file -----------------------------------------------------------------------

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
Template = Annotated[str, Field(min_length=1, max_length=1024)]


def render(template: str, labels: Mapping[str, str]) -> str | None:
    """``"{Hostname}/gpu{gpu}"`` with a sample's labels; ``None`` when a label is missing or
    the result is empty."""
    missing = False

    def fill(match: re.Match[str]) -> str:
        nonlocal missing
        value = labels.get(match.group(1))
        if value is None or value == "":
            missing = True
            return ""
        return value

    text = _FIELD.sub(fill, template)
    return None if missing or not text else text[:MAX_TEXT]


class SeriesMapping(BaseModel):
    """How the samples of one metric become events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["utilization", "usage"]
    match: dict[str, str] = Field(default_factory=dict)  # label → glob; all must match
    resource_type: ResourceType
    resource_id: Template = "{instance}"
    tags: Annotated[dict[TagKey, Template], Field(max_length=MAX_TAGS)] = Field(
        default_factory=dict)
    scale: Annotated[float, Field(allow_inf_nan=False)] = 1.0
    metric: Name | None = None  # utilization: the gauge's costline name (gpu_util)
    unit: Name | None = None  # usage: the price book's unit of resource_type
    type: Literal["gauge", "counter"] | None = None  # usage; default: the page's # TYPE

    @model_validator(mode="after")
    def _fits_kind(self) -> SeriesMapping:
        if self.kind == "utilization" and (self.metric is None or self.unit or self.type):
            raise ValueError("utilization needs metric, and takes no unit or type")
        if self.kind == "usage" and (self.unit is None or self.metric):
            raise ValueError("usage needs unit, and takes no metric")
        return self

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(glob_match(labels.get(k, ""), glob) for k, glob in self.match.items())


class ScrapeMapping(BaseModel):
    """A mapping file: tags for every event, and metric name → one mapping or a list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tags: Annotated[dict[TagKey, Template], Field(max_length=MAX_TAGS)] = Field(
        default_factory=dict)
    metrics: Annotated[dict[str, SeriesMapping | list[SeriesMapping]], Field(min_length=1)]

    def rules_for(self, name: str) -> list[SeriesMapping]:
        found = self.metrics.get(name)
        if found is None:
            return []
        return found if isinstance(found, list) else [found]


def _unpriced(doc: Document, mapping: ScrapeMapping, book: PriceBook) -> list[SourceError]:
    """Usage mappings the worker could not price: an unknown type or another unit."""
    problems = []
    for name in mapping.metrics:
        line, col = doc.position(("metrics", name))
        for rule in mapping.rules_for(name):
            price = book.prices.get(rule.resource_type)
            if rule.kind != "usage":
                continue
            if price is None:
                why = f"{rule.resource_type!r} is not in the price book"
            elif price.unit != rule.unit:
                why = f"unit {rule.unit!r} but {rule.resource_type} is priced per {price.unit!r}"
            else:
                continue
            problems.append(SourceError(doc.file, line, col, f"metrics.{name}: {why}"))
    return problems


def load_mapping(path: Path | str, book: PriceBook | None = None) -> ScrapeMapping:
    """Read and check a mapping file; ``SourceInvalid`` says ``FILE:LINE:COL`` for each
    problem, including usage the price book cannot price."""
    doc = load_document(path)
    try:
        mapping = ScrapeMapping.model_validate(doc.data)
    except ValidationError as exc:
        raise SourceInvalid(doc.errors_from(exc)) from exc
    problems = _unpriced(doc, mapping, book) if book is not None else []
    if problems:
        raise SourceInvalid(problems)
    return mapping


# -- samples → events -----------------------------------------------------------------------


def instance_of(url: str) -> str:
    """``host:port`` of a target, the ``instance`` label Prometheus would attach."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def series_key(sample: Sample) -> str:
    """The identity of a time series: its name and its sorted labels."""
    labels = ",".join(f"{k}={v!r}" for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}}"


@dataclass
class PrometheusScraper:
    """Turns pages of one target into events; remembers what usage needs between scrapes
    (each counter's last value, each gauge's last scrape time)."""

    url: str
    mapping: ScrapeMapping
    interval_s: float
    skipped: Counter[str] = field(default_factory=Counter)
    _last: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def instance(self) -> str:
        return instance_of(self.url)

    def events(self, page: Page, now: float) -> list[UsageEvent | UtilizationEvent]:
        """The events of one page scraped at ``now``; skips are counted in ``skipped``."""
        found: list[UsageEvent | UtilizationEvent] = []
        self._forget(now - 10 * self.interval_s)
        if page.errors:
            self.skipped["bad_line"] += len(page.errors)
        for sample in page.samples:
            for index, rule in enumerate(self.mapping.rules_for(sample.name)):
                if rule.selects(sample.labels):
                    event = self._event(page, sample, index, rule, now)
                    if event is not None:
                        found.append(event)
        return found

    def _forget(self, before: float) -> None:
        """Drop series not seen for ten intervals, so label churn (pods, jobs) cannot grow
        the memory without end; a series that comes back starts a new baseline."""
        self._last = {key: seen for key, seen in self._last.items() if seen[0] >= before}

    def _event(self, page: Page, sample: Sample, index: int, rule: SeriesMapping, now: float
               ) -> UsageEvent | UtilizationEvent | None:
        labels = {"instance": self.instance, **sample.labels, "__name__": sample.name}
        resource_id = render(rule.resource_id, labels)
        if resource_id is None:
            self.skipped["missing_label"] += 1
            return None
        if math.isnan(sample.value) or math.isinf(sample.value):
            self.skipped["not_a_number"] += 1
            return None
        key = f"{self.instance}|{index}|{series_key(sample)}"
        digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
        ts = round(sample.timestamp_s if sample.timestamp_s is not None else now, 3)
        tags = self._tags(rule, labels)
        if rule.kind == "utilization":
            assert rule.metric is not None
            return UtilizationEvent(
                event_id=f"prom:{digest}:{int(ts * 1000)}", kind="utilization", ts=ts,
                resource_id=resource_id, resource_type=rule.resource_type, metric=rule.metric,
                value=sample.value * rule.scale, tags=tags)
        return self._usage(page, sample, key, digest, rule, resource_id, tags, ts)

    def _usage(self, page: Page, sample: Sample, key: str, digest: str, rule: SeriesMapping,
               resource_id: str, tags: dict[str, str], ts: float) -> UsageEvent | None:
        previous = self._last.get(key)
        self._last[key] = (ts, sample.value)
        counter = (rule.type or page.type_of(sample.name)) == "counter"
        if counter:
            if previous is None:
                self.skipped["counter_baseline"] += 1
                return None
            since = previous[0]
            grown = sample.value - previous[1]
            amount = sample.value if grown < 0 else grown  # a reset restarts from zero
        else:
            since = previous[0] if previous is not None else ts - self.interval_s
            amount = sample.value * (ts - since) / 3600
        quantity = amount * rule.scale
        if quantity < 0 or ts <= since:
            self.skipped["negative_or_empty"] += 1
            return None
        assert rule.unit is not None
        return UsageEvent(
            event_id=f"prom:{digest}:{int(ts * 1000)}", kind="usage", ts=round(since, 3),
            resource_id=resource_id, resource_type=rule.resource_type, quantity=quantity,
            unit=rule.unit, tags=tags)

    def _tags(self, rule: SeriesMapping, labels: Mapping[str, str]) -> dict[str, str]:
        tags: dict[str, str] = {}
        for templates in (self.mapping.tags, rule.tags):
            for key, template in templates.items():
                value = render(template, labels)
                if value is not None:
                    tags[key] = value
        return dict(list(tags.items())[:MAX_TAGS])


def scrape(scraper: PrometheusScraper, now: float, timeout_s: float = 10.0
           ) -> Iterator[UsageEvent | UtilizationEvent]:
    """Fetch the target once and yield its events."""
    yield from scraper.events(parse_page(fetch_page(scraper.url, timeout_s)), now)
