"""``costline report`` on what the real worker aggregated, checked in the file and in Chromium.

The worker folds a few hundred usage and fault events from Kafka into Redis and evaluates a
budget rule; two releases are recorded in the reclamation ledger. The page must carry the
totals an independent ledger computes, one chart per figure, and render in headless
Chromium (Debian's ``chromium`` package): the DOM Chromium builds holds the same charts, and
a screenshot is taken (kept in the test's temporary folder).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.reclaim_ledger import RedisReclaimLedger
from costline.connectors.redis_client import connect_async
from costline.rules.durations import period_bounds
from costline.rules.findings import ReclaimRequest
from costline.rules.money import money_micro
from costline.rules.prices import format_micro
from costline.rules.reclaim import (
    Outcome,
    dry_run_record,
    hourly_cost,
    make_plan,
    outcome_record,
    planned,
    saving,
    warned,
)
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import unavailable
from tests.integration.streamkit import (
    PRICES,
    Ledger,
    Worker,
    cli_json,
    produce,
    run_cli,
    usage_event,
    wait_caught_up,
    worker_env,
)
from tests.unit.test_report_html import Node, dom

pytestmark = pytest.mark.integration

LIMIT = 150
RULES = f"""
rules:
  - name: prod-monthly
    kind: budget
    match: {{env: prod}}
    group_by: [team]
    period: month
    limit: {LIMIT}
    warn_at: [0.5, 0.8]
    forecast: true
    severity: warning
    notify: {{slack: "#ml-budgets"}}
"""
FAULTS = ("node_failure", "comm_timeout", "oom")
BY = ("team", "job", "resource_type")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")


@pytest.fixture
def chromium() -> str:
    """Debian's headless-capable Chromium (``apt-get install chromium``)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("Chromium", "no chromium on PATH (Debian: apt-get install -y chromium)")
    return found


@pytest.fixture
def worker(services: Any, kafka_namespace: str, tmp_path: Path) -> Iterator[Worker]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="1")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    yield proc
    proc.stop()


# ── the events ────────────────────────────────────────────────────────────────────────────


def _window(now: float) -> tuple[float, float]:
    """Event times: the last 30 hours, within the current month."""
    month_start, _ = period_bounds(now, "month", "UTC")
    return max(month_start, now - 30 * 3600), now - 120


def _fault_event(rng: random.Random, event_id: str, ts: float) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "fault", "ts": ts, "fault": rng.choice(FAULTS),
            "resource_type": "gpu.h100", "units": rng.choice([8, 16, 64]),
            "lost_seconds": rng.randrange(60, 1800), "recovery_seconds": rng.randrange(30, 600),
            "tags": {"team": rng.choice(["pretrain", "eval"]), "env": "prod",
                     "job": f"run-{rng.randrange(40)}"}}


def _events(now: float, seed: int = 7) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    first, last = _window(now)
    usage = [usage_event(rng, f"u{i}", rng.uniform(first, last)) for i in range(360)]
    usage[0]["tags"]["team"] = "<ops & co>"  # a tag value that must be escaped
    usage[0]["tags"]["env"] = "prod"
    faults = [_fault_event(rng, f"f{i}", rng.uniform(first, last)) for i in range(24)]
    return usage, faults


def _messages(events: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [(e["event_id"].encode(), json.dumps(e).encode()) for e in events]


# ── the reclamation ledger ────────────────────────────────────────────────────────────────


async def _record_releases(url: str, namespace: str, now: float) -> list[tuple[int, int]]:
    """Two executed releases and one dry run; (saved, hourly cost) of each, the dry run's
    what it would have saved, last."""
    client = connect_async(url)
    ledger = RedisReclaimLedger(client, namespace)
    done = []
    try:
        for index, mode in enumerate(("live", "live", "dry_run")):
            tags = {"team": "eval", "units": "8"}
            request = ReclaimRequest(resource_id=f"slurm/42{index}", resource_type="gpu.h100",
                                     tags=tags, connector="slurm", params={"action": "cancel"},
                                     grace=900, mode=mode, idle_since=now - 5400,
                                     requested_at=now - 1800)
            hourly = hourly_cost(PRICES, "gpu.h100", tags)
            plan = make_plan(request, "gpu-idle", {"job_id": f"42{index}"}, hourly, "USD",
                             now - 1800)
            assert await ledger.open(plan, planned(plan, 0).to_dict())
            assert await ledger.advance(plan.plan_id, "planned", "warned",
                                        warned(plan, now - 1800).to_dict(), now - 1800)
            if mode == "dry_run":
                would_save = saving(plan, now - 60, "UTC")
                record = dry_run_record(plan, "cancel Slurm job 422", now - 60, would_save)
                assert await ledger.close(plan.plan_id, "warned", record.to_dict(), 0)
                done.append((would_save, hourly))
                continue
            assert await ledger.claim(plan.plan_id, "test", now - 600) == "claimed"
            saved = saving(plan, now - 600, "UTC")
            record = outcome_record(plan, Outcome("executed", "cancelled"), now - 600, saved)
            assert await ledger.close(plan.plan_id, "executing", record.to_dict(), 0)
            done.append((saved, hourly))
    finally:
        await client.aclose()
    return done


# ── reading the page ──────────────────────────────────────────────────────────────────────


def _rows(table_owner: Node, index: int = 0) -> list[list[str]]:
    body = table_owner.all("tbody")[index]
    return [[cell.content() for cell in row.all("td")] for row in body.all("tr")]


def _cards(root: Node) -> dict[str, str]:
    return {card.all("dt")[0].content(): card.all("dd")[0].content()
            for card in root.all("div", "card")}


def _expected_waste(faults: list[dict[str, Any]], start: float, end: float) -> dict[str, int]:
    out = {}
    for name in FAULTS:
        ledger = Ledger()
        for event in faults:
            if event["fault"] == name:
                ledger.count(event)
        total = ledger.total("waste", [], {}, start, end).get((), 0)
        if total:
            out[name] = total
    return out


def _ranked(amounts: Mapping[tuple[str, ...], int]) -> list[tuple[str, int]]:
    return sorted(((group[0], amount) for group, amount in amounts.items()),
                  key=lambda item: (-item[1], item[0]))


def _crossed(spent: int) -> str | None:
    """The budget line a group's alert reports for this spend (forecasts aside)."""
    for fraction, line in ((1, "limit"), (0.8, "warn_80"), (0.5, "warn_50")):
        if spent >= fraction * LIMIT * 1_000_000:
            return line
    return None


def _settled(env: Mapping[str, str], per_team: Mapping[tuple[str, ...], int]) -> bool:
    """Every group past a line has an alert that saw all of its spend."""
    values = {alert["group"]["team"]: alert["value"] for alert in cli_json(env, "alerts")
              if alert["rule"] == "prod-monthly"}
    return all(values.get(team) == format_micro(amount)
               for (team,), amount in per_team.items() if _crossed(amount))


def _check_page(root: Node, usage: Ledger, faults: list[dict[str, Any]], start: float,
                end: float, releases: list[tuple[int, int]]) -> None:
    cards = _cards(root)
    spend = usage.total("cost", [], {}, start, end)[()]
    assert cards["Spend"] == money_micro(spend, "USD")
    waste = _expected_waste(faults, start, end)
    assert cards["Waste"].startswith(money_micro(sum(waste.values()), "USD"))
    billing = usage.total("cost", ["billing"], {}, start, end)
    assert cards["Fixed"].startswith(money_micro(billing[("fixed",)], "USD"))
    assert cards["Elastic"].startswith(money_micro(billing[("elastic",)], "USD"))

    budget = root.by_id("budgets")
    per_team = usage.total("cost", ["team"], {"env": "prod"}, start, end)
    table = _rows(budget)
    assert [(row[0], row[1]) for row in table] == [
        (f"team={team}", money_micro(amount, "USD")) for team, amount in _ranked(per_team)]
    for row, (_, amount) in zip(table, _ranked(per_team), strict=True):
        line = _crossed(amount)
        if line is None:
            assert row[5] in ("—", "firing: forecast"), row
        else:
            assert row[5] == f"firing: {line}", row
    shown = {row[2]: row[0] for row in _rows(root.by_id("alerts"))}
    for team, amount in per_team.items():
        if _crossed(amount):
            assert shown[f"team={team[0]}"] == "firing"
    [chart] = budget.all("svg")
    assert len(chart.all("path", "series")) == min(8, len(per_team))
    assert len(chart.all("line", "limit")) == 1 and len(chart.all("line", "warn")) == 2

    [waste_chart] = root.by_id("waste").all("svg")
    assert [t.content() for t in waste_chart.all("text", "bar-label")] == [
        name for name, _ in sorted(waste.items(), key=lambda i: (-i[1], i[0]))]
    assert [row[1] for row in _rows(root.by_id("waste"))] == [
        money_micro(amount, "USD")
        for _, amount in sorted(waste.items(), key=lambda i: (-i[1], i[0]))]

    spenders = root.by_id("spenders")
    for index, key in enumerate(BY):
        ranked = _ranked(usage.total("cost", [key], {}, start, end))
        rows = _rows(spenders, index)
        assert [(r[0], r[1]) for r in rows[:10]] == [
            (label or f"(no {key})", money_micro(amount, "USD"))
            for label, amount in ranked[:10]]
    assert "<ops & co>" in [t.content() for t in spenders.all("text", "bar-label")]

    reclaimed = root.by_id("reclaimed")
    executed, dry_run = releases[:-1], releases[-1]
    saved = sum(amount for amount, _ in executed)
    assert f"{len(executed)} release(s)" in reclaimed.content()
    assert f"{money_micro(saved, 'USD')} saved" in reclaimed.content()
    assert "1 dry-run release(s) would have reclaimed" in reclaimed.content()
    assert [row[3:] for row in _rows(reclaimed)] == [
        ["released", f"{Decimal(s) / Decimal(hourly):.2f}", money_micro(s, "USD")]
        for s, hourly in executed] + [
        ["dry run", f"{Decimal(dry_run[0]) / Decimal(dry_run[1]):.2f}",
         f"{money_micro(dry_run[0], 'USD')} (would have)"]]


# ── Chromium ──────────────────────────────────────────────────────────────────────────────


def _chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _check_in_chromium(binary: str, page: Path, tmp_path: Path, titles: list[str],
                       least: Mapping[str, int]) -> Path:
    url = page.resolve().as_uri()
    dumped = _chromium(binary, tmp_path / "profile-dom", "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    rendered = dom(dumped.stdout)
    charts = rendered.all("svg")
    assert [svg.all("title")[0].content() for svg in charts] == titles
    assert [svg.attrs["aria-label"] for svg in charts] == titles
    assert len(rendered.all("path")) >= least["path"]
    assert len(rendered.all("rect")) >= least["rect"]
    png = tmp_path / "report.png"
    shot = _chromium(binary, tmp_path / "profile-png", f"--screenshot={png}",
                     "--window-size=1280,2000", url)
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    assert _png_size(png) == (1280, 2000)
    assert png.stat().st_size > 40_000  # a blank page is a few kB
    return png


# ── the tests ─────────────────────────────────────────────────────────────────────────────


def test_report_of_a_real_pipeline_renders_in_chromium(
        chromium: str, services: Any, kafka_namespace: str, worker: Worker,
        tmp_path: Path) -> None:
    now = time.time()
    usage_events, fault_events = _events(now)
    usage = Ledger()
    for event in usage_events:
        usage.count(event)
    env = worker.env
    for source, events in (("usage", usage_events), ("faults", fault_events)):
        topic = f"{kafka_namespace}.{source}.v1"
        produce(services.bootstrap, topic, _messages(events))
        wait_caught_up(worker.env, worker)
    releases = asyncio.run(_record_releases(services.redis_url, kafka_namespace, now))
    start, end = period_bounds(now, "month", "UTC")
    per_team = usage.total("cost", ["team"], {"env": "prod"}, start, end)
    assert any(_crossed(amount) for amount in per_team.values())
    deadline = time.time() + 90
    while not _settled(env, per_team):
        assert time.time() < deadline, "the budget alerts did not catch up"
        time.sleep(1)

    page = tmp_path / "report.html"
    done = run_cli(env, "report", "--html", str(page), "--period", "month",
                   "--by", ",".join(BY))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"report written to {page}")
    root = dom(page.read_text(encoding="utf-8"))
    _check_page(root, usage, fault_events, start, end, releases)

    titles = [svg.attrs["aria-label"] for svg in root.all("svg")]
    assert len(titles) == 1 + 1 + len(BY) + 1
    assert titles[0].startswith("Cumulative spend of prod-monthly")
    least = {"path": len(root.all("path", "series")) + len(root.all("path", "forecast")),
             "rect": len(root.all("rect", "bar"))}
    png = _check_in_chromium(chromium, page, tmp_path, titles, least)
    print(f"screenshot: {png}")


def test_an_empty_namespace_reports_every_section(redis_url: str, namespace: str,
                                                  tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = worker_env(namespace, "127.0.0.1:1", redis_url, COSTLINE_RULES=str(rules))
    page = tmp_path / "empty.html"
    done = run_cli(env, "report", "--html", str(page), "--period", "day")
    assert done.returncode == 0, done.stderr
    root = dom(page.read_text(encoding="utf-8"))
    assert root.all("svg") == []
    assert _cards(root)["Spend"] == "$0.00"
    assert "No spend matches this rule" in root.by_id("budgets").content()
    assert root.by_id("reclaimed").all("p", "none")[0].content().startswith("None yet")


def test_report_refuses_a_bad_period_and_an_invalid_rule_set(redis_url: str, namespace: str,
                                                             tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace(f"limit: {LIMIT}", "limit: lots"))
    env = worker_env(namespace, "127.0.0.1:1", redis_url, COSTLINE_RULES=str(rules))
    page = tmp_path / "never.html"
    bad_period = run_cli(env, "report", "--html", str(page), "--period", "year")
    assert bad_period.returncode == 2 and "one of day, week, month" in bad_period.stderr
    bad_rules = run_cli(env, "report", "--html", str(page))
    assert bad_rules.returncode == 1
    assert f"{rules}:" in bad_rules.stderr and "does not load" in bad_rules.stderr
    assert not page.exists()
