"""The demo runs the shipped rules with its own reclamation settings and a compressed clock:
they must still load, and the demo must say what it changed and what its figures count."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from costline.connectors.plugins import PLUGINS
from costline.rules.loader import load_rules
from costline.rules.prices import PriceBook
from costline.streams.demo.run import Demo, compress
from costline.streams.demo.summary import (
    alerts_table,
    amounts_table,
    period_words,
    reclamation,
    reclamation_text,
    span_text,
)
from costline.streams.settings import DEFAULT_PRICES, Settings

THURSDAY = datetime(2026, 12, 3, 23, 16, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("live", [True, False])
def test_the_demo_rules_load_with_or_without_slurm(tmp_path, live):
    demo = Demo(Settings(state_dir=tmp_path), days=1, use_running=False, keep=False, quiet=True)
    rules = load_rules([demo._rules(live)], "UTC", plugins=PLUGINS)
    idle = [rule for rule in rules if rule.kind == "idle" and rule.reclaim is not None]
    assert idle, "the shipped rules reclaim idle GPUs"
    for rule in idle:
        assert rule.mode == ("live" if live else "dry_run")
        assert rule.reclaim.connector == ("slurm" if live else "dry_run")


def test_what_waits_on_the_clock_is_shortened_and_said() -> None:
    rules: list[dict[str, Any]] = [
        {"name": "gpu-idle", "kind": "idle", "for": "30m",
         "reclaim": {"connector": "slurm", "grace": "15m", "action": "cancel"}},
        {"name": "checkpoint-growth", "kind": "growth", "for": "30m"},
        {"name": "log-explosion", "kind": "log_explosion", "for": "10m"},
        {"name": "team-monthly", "kind": "budget"},
    ]
    said = compress(rules, live=False)
    assert said == ["gpu-idle grace 15m → 30s", "checkpoint-growth for 30m → 0s",
                    "log-explosion for 10m → 0s"]
    assert rules[0]["for"] == "30m"  # counted in the idle samples, not on the clock
    assert rules[0]["reclaim"] == {"connector": "dry_run", "grace": "30s"}
    assert "for" not in rules[3]


def dry_run(box: str, would_save: str) -> dict[str, Any]:
    return {"step": "skipped", "resource_id": f"lab/{box}", "resource_type": "gpu.a100",
            "tags": {"units": "8"}, "at": "2026-12-03T23:16:00Z", "would_save": would_save}


def test_the_idle_saving_counts_each_boxs_gpus_until_the_next_business_morning() -> None:
    records = [dry_run(box, "95.460000") for box in ("dev-gpu-01", "dev-gpu-02", "dev-gpu-03")]
    records.append({"step": "planned", "resource_id": "lab/dev-gpu-01", "at": "x"})
    found = reclamation(records, PriceBook.load(DEFAULT_PRICES), "UTC", live=False)
    assert found["units"] == 24
    assert found["hourly"] == "30.960000"  # 3 boxes × 8 GPUs × 1.29
    assert found["until"] == "2026-12-04T09:00:00Z"  # Friday
    assert found["would_save"] == "286.380000"
    text = reclamation_text(found, "USD", "UTC")
    assert text == (
        "Idle resources lab/dev-gpu-01, lab/dev-gpu-02, lab/dev-gpu-03 (24 GPUs, 3 boxes) would "
        "be released (dry run: nothing touched): that would save $286.38 — $30.96/h until Fri "
        "Dec 04 09:00 UTC, 09:00 on the next business day, when someone would have noticed "
        "them.")


def test_each_table_says_the_period_it_covers_and_ends_with_its_total() -> None:
    played = span_text(THURSDAY - 10 * 86400, THURSDAY, "UTC")
    assert played == "Nov 23 23:16 → Dec 03 23:16 UTC"
    assert span_text(THURSDAY - 3600, THURSDAY, "UTC") == "Dec 03 22:16 → 23:16 UTC"
    console = Console(width=100, record=True)
    console.print(amounts_table(f"Spend by team, {played}", "spend",
                                {"pretrain": "306012.500000", "research": "577.920000"}, "USD"))
    shown = console.export_text()
    assert "Spend by team, Nov 23 23:16 → Dec 03 23:16 UTC" in shown
    assert "$306,012.50" in shown and "$577.92" in shown
    assert [line.split() for line in shown.splitlines() if "total" in line] == [
        ["│", "total", "│", "$306,590.42", "│"]]


def test_each_alert_says_the_period_its_rule_counts() -> None:
    def at(*day: int) -> float:
        return datetime(*day, tzinfo=UTC).timestamp()

    assert period_words(at(2026, 12, 1), at(2027, 1, 1), THURSDAY, "UTC") == "Dec 2026"
    assert period_words(at(2026, 12, 3), at(2026, 12, 4), THURSDAY, "UTC") == "Dec 03"
    minutes_to_midnight = at(2026, 12, 4) - 240
    assert period_words(at(2026, 12, 3), at(2026, 12, 4), minutes_to_midnight, "UTC") == \
        "Dec 03"  # a calendar day, not "last 1d"
    assert period_words(at(2026, 11, 30), at(2026, 12, 7), THURSDAY, "UTC") == \
        "week of Nov 30"
    assert period_words(THURSDAY - 6 * 3600 - 60, THURSDAY - 60, THURSDAY, "UTC") == "last 6h"
    assert period_words(THURSDAY - 35 * 60, THURSDAY, THURSDAY, "UTC") == "last 35m"
    assert period_words(THURSDAY - 8 * 86_400 - 70, THURSDAY, THURSDAY, "UTC") == "last 1w1d"
    rows = [{"rule": "team-monthly", "group": {"team": "pretrain"}, "state": "firing",
             "kind": "budget", "unit": "currency", "currency": "USD", "value": "98031.210000",
             "threshold": "250000.000000", "muted_by": None,
             "period": {"start": "2026-12-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"}},
            {"rule": "checkpoint-growth", "group": {"project": "llm-70b"}, "state": "pending",
             "kind": "growth", "unit": "gb_hour", "currency": "USD", "value": "636369.500000",
             "threshold": "493889.860000", "muted_by": None,
             "period": {"start": "2026-12-03T17:15:00Z", "end": "2026-12-03T23:15:00Z"}}]
    console = Console(width=80, record=True)
    console.print(alerts_table(rows, THURSDAY, "UTC"))
    shown = console.export_text()
    assert "…" not in shown, "nothing cut short on an 80-column terminal"
    lines = [line.replace("│", " ").split() for line in shown.splitlines()]
    assert ["team-monthly", "$98,031.21", "$250,000.00", "Dec", "2026"] in lines
    assert ["pretrain"] in lines
    assert ["checkpoint-growth", "636,369.5", "gb_hour", "493,889.86", "gb_hour", "last",
            "6h"] in lines
    assert ["(pending)"] in lines
