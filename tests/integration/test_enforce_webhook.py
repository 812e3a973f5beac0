"""The enforcement webhook against a local enforcement API that checks every signature: an
enforce request, then the lift when the period ends, each signed and keyed for idempotency."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from costline.connectors.enforce.webhook import WebhookEnforcer
from costline.connectors.enforce_ledger import memory_enforce_ledger
from costline.connectors.plugins import PLUGINS
from costline.rules.durations import period_bounds
from costline.rules.findings import Finding
from costline.rules.loader import load_rule_text
from costline.streams.worker.enforcer import Enforcer
from tests.integration.test_reclaim_webhook import ENV, ReleaseApi

RULES = """
rules:
  - name: project-monthly
    kind: budget
    group_by: [project]
    period: day
    limit: 100
    enforce: {connector: webhook, url: "%s", secret_env: PLATFORM_RELEASE_SECRET, grace: 1s,
              backoff: 1s}
"""


@pytest.fixture
async def api() -> AsyncIterator[tuple[ReleaseApi, str]]:
    receiver = ReleaseApi()
    app = web.Application()
    app.router.add_post("/v1/budget-actions", receiver.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield receiver, str(server.make_url("/v1/budget-actions"))
    await server.close()


async def test_enforce_then_lift_are_signed_requests(api: tuple[ReleaseApi, str]) -> None:
    receiver, url = api
    now = time.time()
    published: list[dict[str, Any]] = []

    async def sink(record: dict[str, Any]) -> None:
        published.append(record)

    enforcer = Enforcer(rules=load_rule_text(RULES % url, plugins=PLUGINS),
                        ledger=memory_enforce_ledger(), sink=sink,
                        connectors={"webhook": WebhookEnforcer(environ=ENV)})
    start, end = period_bounds(now, "day", "UTC")
    finding = Finding(group={"project": "llm"}, value=150_000_000, line="limit",
                      threshold=100_000_000, rank=0, lines=(), period=(start, end))
    await enforcer.submit({"project-monthly": [finding]}, now)
    await enforcer.submit({"project-monthly": [finding]}, now + 2)  # the re-check after grace
    await enforcer.tick(now + 2)
    assert published[-1]["step"] == "executed"
    assert published[-1]["reason"] == "enforce API accepted: HTTP 200"
    await enforcer.tick(end + 1)
    assert published[-1]["step"] == "lifted"
    assert [(r["valid"], r["body"]["action"], r["body"]["group"]) for r in receiver.received] \
        == [(True, "enforce", {"project": "llm"}), (True, "lift", {"project": "llm"})]
    plan_id = published[-1]["plan_id"]
    assert [r["idempotency_key"] for r in receiver.received] == [plan_id, f"{plan_id}:lift"]
    assert receiver.received[0]["body"]["spent"] == "150.000000"
