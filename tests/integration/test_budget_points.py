"""The spend lines of budget charts (the report, ``/api/v1/budgets?points=true``) read from the
real Redis, single and clustered: each ends at what the rule's period spent, also where the
period ends off the UTC hour."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from costline.connectors.redis_client import connect
from costline.connectors.redis_state import RedisState
from costline.rules.alerts import AlertBook
from costline.rules.loader import load_rules
from costline.streams.cli.report import ReportRequest, budget_charts
from tests.integration.redis_writer import ZONE, Writer
from tests.unit.rulefiles.builders import usage

pytestmark = pytest.mark.integration

RULES = """
rules:
  - name: kolkata-daily
    kind: budget
    period: day
    timezone: Asia/Kolkata
    group_by: [team]
    limit: 1000
  - name: utc-monthly
    kind: budget
    period: month
    timezone: UTC
    group_by: [team]
    limit: 100000
"""
DAY = datetime(2026, 11, 10, tzinfo=UTC).timestamp()  # Kolkata's 10th: [9th 18:30Z, 18:30Z)


async def test_a_budget_line_ends_at_its_periods_spend_when_the_period_ends_off_the_hour(
        redis_writer: Writer, any_redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    rules = load_rules([tmp_path / "rules.yaml"])
    await redis_writer.write([usage(DAY + 12 * 3600, 4, team="a"),  # $9.96, Kolkata's 10th
                              usage(DAY + 18 * 3600 + 45 * 60, 200, team="a")])  # 00:15 IST
    state = RedisState(connect(any_redis_url), redis_writer.namespace, ZONE)
    request = ReportRequest("month", DAY + 12 * 3600, DAY + 5 * 86400, "UTC")
    charts = {chart.rule: chart for chart in budget_charts(state, rules, AlertBook(), request)}
    day, month = charts["kolkata-daily"].groups[0], charts["utc-monthly"].groups[0]
    assert (day.spent, day.points[-1]) == (9_960_000, (DAY + 18.5 * 3600, 9_960_000))
    assert (month.spent, month.points[-1][1]) == (507_960_000, 507_960_000)
