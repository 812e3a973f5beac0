"""Counters and gauges for ``/metrics`` in the Prometheus text format.

Small on purpose: a handful of series the worker updates on its hot path with a dict
increment, rendered on scrape.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

Labels = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self, name: str) -> Iterable[str]:
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            yield f'{name}_bucket{{le="{bound}"}} {running}'
        yield f'{name}_bucket{{le="+Inf"}} {self.n}'
        yield f"{name}_sum {self.total}"
        yield f"{name}_count {self.n}"


class Metrics:
    """The worker's series. ``gauges`` (and ``read_counters``, counters kept elsewhere) are
    callables read at scrape time."""

    PREFIX = "costline_"

    def __init__(self) -> None:
        self.counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self.help: dict[str, str] = {}
        self.histograms: dict[str, Histogram] = {}
        self.gauges: dict[str, Callable[[], dict[Labels, float]]] = {}
        self.read_counters: dict[str, Callable[[], dict[Labels, float]]] = {}

    def describe(self, name: str, text: str) -> None:
        self.help[name] = text

    def describe_all(self, texts: Mapping[str, str]) -> None:
        self.help.update(texts)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self.counters[name][tuple(sorted(labels.items()))] += value

    def observe(self, name: str, value: float) -> None:
        hist = self.histograms.get(name)
        if hist is None:
            hist = self.histograms[name] = Histogram()
        hist.observe(value)

    def gauge(self, name: str, read: Callable[[], dict[Labels, float]]) -> None:
        self.gauges[name] = read

    def counter_read(self, name: str, read: Callable[[], dict[Labels, float]]) -> None:
        """A counter whose values something else keeps (Redis), read at scrape time."""
        self.read_counters[name] = read

    def value(self, name: str, **labels: str) -> float:
        return self.counters[name][tuple(sorted(labels.items()))]

    def render(self) -> str:
        lines: list[str] = []
        for name, series in sorted(self.counters.items()):
            lines += self._head(name, "counter")
            lines += [f"{self.PREFIX}{name}{_labels(k)} {v:g}" for k, v in sorted(series.items())]
        for name, hist in sorted(self.histograms.items()):
            lines += self._head(name, "histogram")
            lines += list(hist.render(self.PREFIX + name))
        for kind, reads in (("counter", self.read_counters), ("gauge", self.gauges)):
            for name, read in sorted(reads.items()):
                lines += self._head(name, kind)
                lines += [f"{self.PREFIX}{name}{_labels(k)} {v!r}"
                          for k, v in sorted(read().items())]
        return "\n".join(lines) + "\n"

    def _head(self, name: str, kind: str) -> list[str]:
        full = self.PREFIX + name
        head = [f"# TYPE {full} {kind}"]
        if name in self.help:
            head.insert(0, f"# HELP {full} {self.help[name]}")
        return head
