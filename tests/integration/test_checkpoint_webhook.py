"""The checkpoint webhook against a local lifecycle API that checks every signature: a move
is asked once, signed, retried on 5xx, and the new location it answers is recorded."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from costline.connectors.checkpoints.webhook import WebhookCheckpoints
from costline.rules.inventory import Checkpoint, Stay
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_flow import target_of
from costline.rules.reclaim import Plan

pytestmark = pytest.mark.integration

SECRET = "ckpt-3c2b1a09f8e7d6c5b4a3928170"
ENV = {"CHECKPOINT_API_SECRET": SECRET}


@dataclass
class LifecycleApi:
    answers: list[int] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        timestamp = request.headers["X-Costline-Timestamp"]
        expected = "v1=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body,
                                    hashlib.sha256).hexdigest()
        valid = hmac.compare_digest(request.headers["X-Costline-Signature"], expected)
        self.received.append({"valid": valid, "body": json.loads(body),
                              "key": request.headers.get("Idempotency-Key")})
        status = self.answers.pop(0) if self.answers else 200
        return web.json_response({"location": "s3://archive/run-42/step-1000"}, status=status)


@pytest.fixture
async def api() -> AsyncIterator[tuple[LifecycleApi, str]]:
    found = LifecycleApi()
    app = web.Application()
    app.router.add_post("/lifecycle", found.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield found, str(server.make_url("/lifecycle"))
    await server.close()


async def test_a_move_is_signed_retried_and_its_new_location_kept(api) -> None:  # type: ignore[no-untyped-def]
    lifecycle, url = api
    lifecycle.answers = [503, 200]
    params = {"url": url, "secret_env": "CHECKPOINT_API_SECRET", "retries": 2, "backoff": "1s"}
    checkpoint = Checkpoint("run-42/step-1000", "run-42", 1000, 10**12, time.time(), 60.0,
                            {"job": "run-42"}, (Stay(0, "storage.object",
                                                     "s3://hot/run-42/step-1000", 31_500),))
    action = LifecycleAction(checkpoint, "move", "storage.archive", "older")
    connector = WebhookCheckpoints(environ=ENV, sleep=_no_wait)
    identity = await connector.identify(action, params)
    plan = Plan("plan-1", "retention", checkpoint.checkpoint_id, "storage.object", {},
                "webhook", params, "live", 60, 0, time.time(), time.time(),
                target_of(action, identity), 30_130, "USD")
    outcome = await connector.act(plan)
    assert outcome.step == "executed" and outcome.detail["location"] == (
        "s3://archive/run-42/step-1000")
    assert [r["valid"] for r in lifecycle.received] == [True, True]
    assert {r["key"] for r in lifecycle.received} == {"plan-1"}
    body = lifecycle.received[0]["body"]
    assert (body["action"], body["to_tier"], body["location"], body["step"]) == (
        "move", "storage.archive", "s3://hot/run-42/step-1000", 1000)


async def test_the_owner_saying_no_is_a_failure_not_retried(api) -> None:  # type: ignore[no-untyped-def]
    lifecycle, url = api
    lifecycle.answers = [409]
    params = {"url": url, "secret_env": "CHECKPOINT_API_SECRET"}
    checkpoint = Checkpoint("c", "run-42", 1, 1, 0.0, 0.0, {}, (Stay(0, "storage.object",
                                                                     "s3://x", 0),))
    plan = Plan("plan-2", "r", "c", "storage.object", {}, "webhook", params, "live", 60, 0, 0,
                0, target_of(LifecycleAction(checkpoint, "delete", None, "expired"), {}), 0,
                "USD")
    outcome = await WebhookCheckpoints(environ=ENV, sleep=_no_wait).act(plan)
    assert outcome.step == "failed" and "HTTP 409" in outcome.reason
    assert len(lifecycle.received) == 1


async def _no_wait(seconds: float) -> None:
    return None
