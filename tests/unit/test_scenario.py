"""The demo's scenario tells the same true story at any hour of any day of a month: the days
it says it plays, ending now; every alert it advertises fires under the rules as the demo runs
them; the faults its day-long fault-waste rule is shown firing on fall on the day the demo
runs, never after it runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from costline.connectors.plugins import PLUGINS
from costline.rules.alerts import AlertBook
from costline.rules.engine import Engine
from costline.rules.events import Parsed, parse_message
from costline.rules.loader import load_rules
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PriceBook
from costline.rules.reclaim import hourly_cost
from costline.streams.demo.run import Demo
from costline.streams.demo.scenario import training_cluster
from costline.streams.settings import Settings

MIDNIGHT = 1796169600.0  # 2026-12-02T00:00:00Z
HEADLINE = ("pt-nccl-0", "pt-sdc-0")


@pytest.mark.parametrize("after_midnight", [15 * 60, 2 * 3600, 12 * 3600, 23 * 3600 + 59 * 60])
def test_the_headline_faults_fall_on_the_day_the_demo_runs(after_midnight: float) -> None:
    now = MIDNIGHT + after_midnight
    faults = {f["event_id"]: f["ts"] for f in training_cluster(now).faults}
    for event_id in HEADLINE:
        assert MIDNIGHT <= faults[event_id] <= now, event_id


# ── the same true story on any day of a month ─────────────────────────────────────────────

PRICES = PriceBook.load(Path(__file__).parents[2] / "rules" / "prices" / "example.yaml")
DAYS = 10
ANY_DAY = {
    "the 1st, just after midnight": datetime(2026, 12, 1, 0, 30, tzinfo=UTC).timestamp(),
    "the 3rd": datetime(2026, 12, 3, 23, 16, tzinfo=UTC).timestamp(),
    "the last day, minutes before the next month": datetime(2026, 12, 31, 23, 50,
                                                             tzinfo=UTC).timestamp(),
    "the last day of February": datetime(2027, 2, 28, 12, 0, tzinfo=UTC).timestamp(),
}


def played(now: float) -> InMemoryState:
    """The scenario's messages through the worker's own parser, counted as the worker would."""
    state = InMemoryState(PRICES)
    scenario = training_cluster(now, days=DAYS)
    for message in [*scenario.usage, *scenario.faults]:
        parsed = parse_message(json.dumps(message).encode(), now=now)
        assert isinstance(parsed, Parsed), parsed
        state.add_all(parsed.events)
    return state


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The shipped rules as the demo runs them (dry run, time compressed)."""
    demo = Demo(Settings(state_dir=tmp_path_factory.mktemp("demo")), days=DAYS,
                use_running=False, keep=False, quiet=True)
    return Engine.for_prices(load_rules([demo._rules(live=False)], "UTC", plugins=PLUGINS),
                             PRICES)


@pytest.mark.parametrize("now", ANY_DAY.values(), ids=ANY_DAY.keys())
def test_the_story_plays_the_same_days_ending_now_whatever_the_day(now: float) -> None:
    scenario = training_cluster(now, days=DAYS)
    times = [e["ts"] for m in scenario.usage for e in (m if isinstance(m, list) else [m])]
    times += [f["ts"] for f in scenario.faults]
    assert scenario.start == now - DAYS * 86400
    assert scenario.start <= min(times) < scenario.start + 3600 and max(times) <= now


@pytest.mark.parametrize("now", ANY_DAY.values(), ids=ANY_DAY.keys())
def test_every_advertised_alert_fires_whatever_the_day(engine: Engine, now: float) -> None:
    """The log explosion fires (not pending), the checkpoint growth raises an alert, the
    day's fault waste, the three idle boxes, and research's sweep past its daily GPU line on
    the Slurm partition (the team the demo holds) too; run-42's cost per token regressed, its
    checkpoint interval costs far more than the optimum, and checkpoints are past their
    retention."""
    book = engine.evaluate(played(now), now, AlertBook()).book
    states = sorted((alert.rule, alert.state) for alert in book.active()
                    if alert.rule != "team-monthly")  # a calendar month: see the next test
    assert states == [("checkpoint-growth", "firing"), ("checkpoint-interval", "firing"),
                      ("checkpoint-retention", "firing"), ("fault-waste-share", "firing"),
                      ("gpu-idle", "firing"), ("gpu-idle", "firing"), ("gpu-idle", "firing"),
                      ("log-explosion", "firing"), ("slurm-daily-gpu", "firing"),
                      ("token-cost-regression", "firing")]


def test_the_monthly_budget_sees_only_this_months_part_of_the_days_played(
        engine: Engine) -> None:
    """On the 1st just after midnight the month holds half an hour: too little for a forecast;
    on the last day it holds all ten days, past the budget line."""
    first, last = ANY_DAY["the 1st, just after midnight"], ANY_DAY[
        "the last day, minutes before the next month"]
    assert "team-monthly" not in {a.rule for a in engine.evaluate(
        played(first), first, AlertBook()).book.active()}
    [budget] = [a for a in engine.evaluate(played(last), last, AlertBook()).book.active()
                if a.rule == "team-monthly"]
    assert budget.payload["line"] == "limit"
    assert budget.payload["period"]["start"] == "2026-12-01T00:00:00Z"


def test_the_idle_boxes_are_priced_for_their_eight_gpus() -> None:
    now = ANY_DAY["the 3rd"]
    scenario = training_cluster(now)
    samples = [m for m in scenario.usage if isinstance(m, list) and
               m[0]["kind"] == "utilization"]
    assert len(samples) == 4
    for batch in samples:
        tags = batch[0]["tags"]
        assert tags["units"] == "8"
        assert hourly_cost(PRICES, "gpu.a100", tags) == 8 * 1_290_000


def test_the_story_says_what_the_checkpoints_and_logs_show() -> None:
    now = ANY_DAY["the 3rd"]
    scenario = training_cluster(now)
    checkpoints = [m["quantity"] for m in scenario.usage
                   if isinstance(m, dict) and m.get("resource_type") == "storage.checkpoint"]
    said = " ".join(scenario.story)
    assert "40 TB kept became 160 TB" in said
    assert 40_000 * 0.98 < checkpoints[0] < 40_000 * 1.02
    assert 150_000 < checkpoints[-1] <= 160_000  # the last whole hour
    burst = [m for m in scenario.usage if isinstance(m, dict) and
             m["event_id"].startswith("log-burst-")]
    assert len(burst) == 40 and {m["quantity"] for m in burst} == {4.0}  # 240 GB an hour
    assert "240 GB of logs an hour" in said
