"""A real Prometheus (Debian's ``prometheus``) scrapes a real worker: PromQL answers the budget
gauges with the API's figures, one series per budget rule × group, and the spend counters
by the configured tag keys."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import forget_redis_keys, unavailable
from tests.integration.opendata import Site, open_site
from tests.integration.streamkit import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    namespace = "t" + secrets.token_hex(5)
    yield from open_site(services, namespace, tmp_path_factory.mktemp("prometheus"))
    forget_redis_keys(services.redis_url, namespace)


@pytest.fixture
def prometheus(site: Site, tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping the worker every second; its HTTP API's URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        unavailable("Prometheus", "not installed (Debian: apt-get install prometheus)")
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: costline
    static_configs: [{{targets: ["127.0.0.1:{site.env['COSTLINE_WEB_PORT']}"]}}]
""")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def promql(url: str, query: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
                {"query": query}), timeout=5) as answer:
            found: list[dict[str, Any]] = json.load(answer)["data"]["result"]
            return found
    except OSError:
        return []  # not up yet


def test_prometheus_reads_the_budget_gauges_of_a_worker(site: Site, prometheus: str) -> None:
    usage, faults = site.events(120, seed=3)
    site.send(usage, faults)
    budgets = site.api("/api/v1/budgets")["budgets"]
    expected = {row["group"]["team"]: Decimal(row["spent"]) for row in budgets}
    assert expected

    def answered() -> dict[str, Decimal] | None:
        found = {series["metric"]["team"]: Decimal(series["value"][1]) for series in promql(
            prometheus, 'costline_budget_spent{rule="prod-monthly"}')}
        return found if found == expected else None
    site.wait_for("PromQL's budget spend equals the API's", answered, 60)

    states = promql(prometheus, 'count by (rule) (costline_budget_state)')
    assert [(s["metric"]["rule"], s["value"][1]) for s in states] == [
        ("prod-monthly", str(len(budgets)))]
    over = promql(prometheus, 'costline_budget_spent >= on (rule, team) costline_budget_limit')
    assert {s["metric"]["team"] for s in over} == {
        row["group"]["team"] for row in budgets if row["state"] == "over"}
    spend = promql(prometheus, 'sum by (team) (costline_spend_total{env="prod"})')
    rows = site.api("/api/v1/spend?by=team&where=env=prod")["rows"]
    assert {s["metric"]["team"]: Decimal(s["value"][1]) for s in spend} == {
        row["group"]["team"]: Decimal(row["cost"]) for row in rows}
