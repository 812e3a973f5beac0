"""The webhook connector against a local release API that checks every signature."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from costline.connectors.plugins import PLUGINS
from costline.connectors.reclaim.webhook import WebhookReclaimer
from costline.connectors.reclaim_ledger_memory import MemoryReclaimLedger
from costline.rules.events import UtilizationEvent
from costline.rules.findings import ReclaimRequest
from costline.rules.loader import load_rule_text
from costline.rules.memory_state import InMemoryState
from costline.rules.prices import PriceBook
from costline.rules.reclaim import Plan, make_plan
from costline.streams.settings import DEFAULT_PRICES
from costline.streams.worker.reclaimer import Reclaimer

SECRET = "whsec-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
ENV = {"PLATFORM_RELEASE_SECRET": SECRET}


@dataclass
class ReleaseApi:
    """Plays a platform's release API: verifies the signature, answers from a script."""

    answers: list[int] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    delay_s: float = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        timestamp = request.headers.get("X-Costline-Timestamp", "")
        signature = request.headers.get("X-Costline-Signature", "")
        expected = "v1=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body,
                                    hashlib.sha256).hexdigest()
        valid = hmac.compare_digest(signature, expected) and abs(time.time() - int(timestamp)) < 300
        self.received.append({"valid": valid, "body": json.loads(body),
                              "idempotency_key": request.headers.get("Idempotency-Key")})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not valid:
            return web.json_response({"error": "bad signature"}, status=401)
        status = self.answers.pop(0) if self.answers else 200
        return web.json_response({"ok": status < 400}, status=status)


@pytest.fixture
async def api() -> AsyncIterator[tuple[ReleaseApi, str]]:
    release = ReleaseApi()
    app = web.Application()
    app.router.add_post("/v1/release", release.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield release, str(server.make_url("/v1/release"))
    await server.close()


def plan(url: str, **params: Any) -> Plan:
    request = ReclaimRequest(
        resource_id="cluster-a/notebook-3", resource_type="gpu.h100", tags={"team": "ml"},
        connector="webhook",
        params={"url": url, "secret_env": "PLATFORM_RELEASE_SECRET", "timeout": "5s",
                "retries": 3, "backoff": "1s", **params},
        grace=900, mode="live", idle_since=time.time() - 3600, requested_at=time.time())
    return make_plan(request, "notebook-idle", {"url": url}, 0, "USD", time.time())


@dataclass
class Waits:
    seconds: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


async def test_a_5xx_is_retried_with_backoff_then_accepted(api: tuple[ReleaseApi, str]) -> None:
    release, url = api
    release.answers = [500, 503, 200]
    waits = Waits()
    found = plan(url)
    outcome = await WebhookReclaimer(environ=ENV, sleep=waits).release(found)
    assert (outcome.step, outcome.reason) == ("executed", "release API accepted: HTTP 200")
    assert outcome.detail == {"http_status": 200, "attempts": 3}
    assert waits.seconds == [1, 2]
    assert [r["valid"] for r in release.received] == [True, True, True]
    assert {r["idempotency_key"] for r in release.received} == {found.plan_id}
    assert release.received[0]["body"]["resource_id"] == "cluster-a/notebook-3"


async def test_a_4xx_is_not_retried(api: tuple[ReleaseApi, str]) -> None:
    release, url = api
    release.answers = [400]
    waits = Waits()
    outcome = await WebhookReclaimer(environ=ENV, sleep=waits).release(plan(url))
    assert outcome.step == "failed"
    assert outcome.reason == 'release API refused: HTTP 400 {"ok": false}'
    assert len(release.received) == 1 and waits.seconds == []


async def test_a_wrong_secret_is_refused_by_the_platform(api: tuple[ReleaseApi, str]) -> None:
    release, url = api
    outcome = await WebhookReclaimer(environ={"PLATFORM_RELEASE_SECRET": "guess"},
                                     sleep=Waits()).release(plan(url))
    assert (outcome.step, outcome.detail["http_status"]) == ("failed", 401)
    assert release.received[0]["valid"] is False


async def test_no_answer_is_retried_then_reported(api: tuple[ReleaseApi, str]) -> None:
    _, url = api
    closed = url.replace(url.split(":")[2].split("/")[0], "1")
    waits = Waits()
    outcome = await WebhookReclaimer(environ=ENV, sleep=waits).release(plan(closed))
    assert outcome.step == "failed"
    assert outcome.reason.startswith("release API did not accept after 4 tries: Client")
    assert waits.seconds == [1, 2, 4]


async def test_a_slow_platform_times_out_and_is_retried(api: tuple[ReleaseApi, str]) -> None:
    release, url = api
    release.delay_s = 1.5
    outcome = await WebhookReclaimer(environ=ENV, sleep=Waits()).release(
        plan(url, timeout="1s", retries=1))
    assert (outcome.step, outcome.reason) == (
        "failed", "release API did not accept after 2 tries: TimeoutError; a request went "
        "unanswered, so it may have acted: check the target (the Idempotency-Key is the "
        "plan id)")
    assert len(release.received) == 2


async def test_through_the_flow_the_secret_is_never_published_or_logged(
        api: tuple[ReleaseApi, str], caplog: pytest.LogCaptureFixture) -> None:
    release, url = api
    release.answers = [502, 200]
    caplog.set_level(logging.DEBUG)
    rules = load_rule_text(f"""
rules:
  - name: notebook-idle
    kind: idle
    below: 0.05
    for: 10m
    reclaim: {{connector: webhook, grace: 1m, url: "{url}",
               secret_env: PLATFORM_RELEASE_SECRET, backoff: 1s}}
""", plugins=PLUGINS)
    prices = PriceBook.load(DEFAULT_PRICES)
    state = InMemoryState(prices)
    t0 = time.time() - 20 * 60
    state.add_all(UtilizationEvent(event_id=f"m-{i}", kind="utilization", ts=t0 + i * 60,
                                   resource_id="cluster-a/notebook-3", resource_type="gpu.h100",
                                   metric="gpu_util", value=0.0, tags={"team": "ml"})
                  for i in range(21))
    published: list[dict[str, Any]] = []

    async def sink(record: dict[str, Any]) -> None:
        published.append(record)

    reclaimer = Reclaimer(rules=rules, state=state, ledger=MemoryReclaimLedger(),
                          prices=prices, sink=sink,
                          connectors={"webhook": WebhookReclaimer(environ=ENV, sleep=Waits())})
    now = t0 + 19 * 60
    await reclaimer.submit({r.name: r.evaluate(state, now) for r in rules}, now)
    await reclaimer.tick(t0 + 20 * 60)
    assert [r["step"] for r in published] == ["planned", "warned", "executed"]
    assert published[-1]["attempts"] == 2 and float(published[-1]["saved"]) > 0
    everything = json.dumps(published) + caplog.text
    assert SECRET not in everything and SECRET[:12] not in everything
