"""The HTTP API of a real worker (and of ``costline serve``) against real Kafka and Redis: its
answers are the command line's for the same questions, byte for byte; the bearer token is
required and never logged; a bad question is a 400 in JSON; refused input is shown, and
replayed once the price book is fixed, counted once however often it is replayed."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from costline.rules.durations import period_bounds
from costline.rules.prices import format_micro
from tests.conftest import forget_redis_keys
from tests.integration.opendata import LIMIT, TOKEN, Site, open_site, start_serve
from tests.integration.streamkit import PRICES, cli_json, run_cli, wait_caught_up

pytestmark = pytest.mark.integration

QUESTIONS: tuple[list[tuple[str, str]], ...] = (
    [],
    [("by", "team")],
    [("by", "team,category"), ("where", "env=prod")],
    [("by", "job"), ("where", "team=eval"), ("where", "team=pretrain"), ("period", "day")],
    [("by", "billing"), ("period", "week"), ("tz", "Asia/Kolkata")],
    [("by", "team"), ("at", "yesterday"), ("period", "day"), ("peaks", "true")],
    [("by", "fault")],
    [("by", "job"), ("per", "tokens")],
)


@pytest.fixture(scope="module")
def site(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    namespace = "t" + secrets.token_hex(5)
    folder = tmp_path_factory.mktemp("api")
    yield from open_site(services, namespace, folder)
    forget_redis_keys(services.redis_url, namespace)
    from costline.connectors.kafka import admin

    client = admin(services.bootstrap, timeout_s=10.0)
    try:
        client.delete_topics([n for n in client.list_topics()
                              if n.startswith(f"{namespace}.")], raise_errors=False)
    finally:
        client.close()


def cli_args(question: list[tuple[str, str]]) -> list[str]:
    args = []
    for name, value in question:
        flag = f"--{name}"
        args += [flag] if name == "peaks" else [flag, value]
    return args


def test_spend_answers_as_the_command_line(site: Site) -> None:
    usage, faults = site.events(240, seed=1)
    site.send(usage, faults)
    served = start_serve(site)
    try:
        for question in QUESTIONS:
            done = run_cli(site.env, "spend", *cli_args(question), "--json")
            assert done.returncode == 0, done.stderr
            path = "/api/v1/spend" + (f"?{urlencode(question)}" if question else "")
            for base in (site.url, served.url):
                status, body = site.get(path, base=base)
                assert status == 200, body
                assert body.decode() == done.stdout, question
    finally:
        served.stop()
    now = time.time()
    start, end = period_bounds(now, "month", "UTC")
    expected = site.usage.total("cost", ["team"], {}, start, end)
    rows = site.api("/api/v1/spend?by=team")["rows"]
    assert {(r["group"]["team"],): Decimal(r["cost"]) for r in rows} == {
        group: Decimal(micro) / 1_000_000 for group, micro in expected.items()}


def test_budgets_alerts_and_actions_are_the_command_line_s(site: Site) -> None:
    now = time.time()
    start, end = period_bounds(now, "month", "UTC")
    per_team = site.usage.total("cost", ["team"], {"env": "prod"}, start, end)
    budgets = site.api("/api/v1/budgets")["budgets"]
    assert {(b["group"]["team"],): b["spent"] for b in budgets} == {
        team: format_micro(amount) for team, amount in per_team.items()}
    for budget in budgets:
        assert budget["limit"] == format_micro(LIMIT * 1_000_000)
        assert [line["name"] for line in budget["lines"]] == ["warn_50", "warn_80", "limit"]
        spent = Decimal(budget["spent"])
        if spent >= LIMIT:
            assert budget["state"] == "over" and budget["line"] == "limit"
        elif spent >= Decimal("0.5") * LIMIT:
            assert budget["state"] == "warning"
        else:
            assert budget["state"] in ("ok", "forecast")
    with_points = site.api("/api/v1/budgets?points=true")["budgets"]
    for budget in with_points:
        assert budget["points"][-1][1] == budget["spent"]

    def same_alerts() -> bool:
        return site.api("/api/v1/alerts")["alerts"] == cli_json(site.env, "alerts")
    site.wait_for("the API's alerts equal costline alerts --json", same_alerts)
    assert site.api("/api/v1/actions?limit=20") == cli_json(site.env, "actions", "--limit", "20")
    assert site.api("/api/v1/openapi.json")["openapi"].startswith("3.")


def test_the_token_is_required_and_never_logged(site: Site) -> None:
    for token in (None, "wrong", TOKEN + "x", ""):
        status, body = site.get("/api/v1/spend", token=token)
        assert status == 401, token
        assert json.loads(body)["status"] == 401
    assert site.get("/", token=None)[0] == 200  # the page holds no data
    assert TOKEN not in site.worker.log.read_text()


@pytest.mark.parametrize("query", [
    "by=Team", "period=year", "at=not-a-time", "tz=Mars/Olympus", "where=novalue",
    "peaks=maybe", "unknown=1", "period=day&period=week", "at=99999999999999999999",
])
def test_a_bad_question_is_a_400_in_json(site: Site, query: str) -> None:
    status, body = site.get(f"/api/v1/spend?{query}")
    assert status == 400, (query, body)
    assert json.loads(body)["error"]


def _unknown_type(event_id: str, ts: float) -> dict[str, Any]:
    return {"event_id": event_id, "kind": "usage", "ts": ts, "resource_id": "lab/n1",
            "resource_type": "gpu.b300", "quantity": 16, "unit": "gpu_hour",
            "tags": {"team": "research", "env": "dev"}}


def test_refused_money_is_said_and_replayed_once(site: Site) -> None:
    now = time.time()
    ts = max(period_bounds(now, "month", "UTC")[0], now - 1800)
    unknown = [_unknown_type(f"r{i}", ts) for i in range(2)]
    mismatch = {**_unknown_type("m1", ts), "resource_type": "gpu.h100", "unit": "gpu_minute"}
    site.send([unknown[0]], counted=False)
    site.send([unknown[1], mismatch], counted=False)
    done = run_cli(site.env, "spend", "--json")
    assert "unknown_resource_type: 2 message(s), 2 event(s): 32 gpu_hour of gpu.b300 (not " \
           "in the price book)" in done.stderr
    assert "unit_mismatch: 1 message(s), 1 event(s)" in done.stderr
    refused = {r["code"]: r for r in site.api("/api/v1/refused")["reasons"]}
    assert refused["unknown_resource_type"]["unpriced"] == [
        {"resource_type": "gpu.b300", "unit": "gpu_hour", "quantity": "32.000000"}]
    listed = cli_json(site.env, "dead-letters", "list")
    assert site.api("/api/v1/dead-letters") == listed
    assert {row["code"] for row in listed} == {"unknown_resource_type", "unit_mismatch"}
    before = Decimal(site.api("/api/v1/spend")["rows"][0]["cost"])

    # The price book learns the type; the worker restarts with it; the dead letters are sent
    # again, twice: the second replay sends nothing, and a resend counts nothing twice.
    prices = Path(site.env["COSTLINE_PRICES"])
    prices.write_text(prices.read_text() + "\n  gpu.b300: {unit: gpu_hour, price: 5.25, "
                      "category: compute, billing: elastic}\n")
    site.worker.stop()
    site.worker.start()
    for attempt in range(2):
        done = run_cli(site.env, "dead-letters", "replay", "--reason", "unknown_resource_type")
        assert done.returncode == 0, done.stderr
        assert f"sent {2 if attempt == 0 else 0} message(s)" in done.stdout, done.stdout
        wait_caught_up(site.env, site.worker)
    spent = site.wait_for("the replayed money counted", lambda: (
        Decimal(site.api("/api/v1/spend")["rows"][0]["cost"]) - before) or None)
    assert spent == Decimal("168")  # 2 × 16 gpu_hour × 5.25, once
    refused = {r["code"] for r in site.api("/api/v1/refused")["reasons"]}
    assert refused == {"unit_mismatch"}
    states = {row["code"]: row["state"] for row in cli_json(site.env, "dead-letters", "list")}
    assert states == {"unknown_resource_type": "replayed", "unit_mismatch": "counted"}
    assert PRICES.currency == "USD"
