"""The Grafana dashboard in docs/ reads only series a worker exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from costline.streams.worker.budget_gauges import GAUGE_HELP
from costline.streams.worker.metric_help import DESCRIPTIONS

ROOT = Path(__file__).parents[2]


def test_every_series_the_dashboard_queries_is_one_a_worker_exposes() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana-costline.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries.append(dashboard["templating"]["list"][0]["query"]["query"])
    named = {name for query in queries for name in re.findall(r"costline_[a-z_]+", query)}
    exposed = {f"costline_{name}" for name in (*GAUGE_HELP, *DESCRIPTIONS)}
    assert named and named <= exposed, named - exposed
