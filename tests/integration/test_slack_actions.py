"""POST /slack/actions over loopback HTTP: signatures, replays, allow-lists, dispatch."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from costline.connectors.slack_actions import (
    ActionRequest,
    ApproverPolicy,
    MemoryReplayGuard,
    SlackActionsHandler,
    add_actions_route,
    make_actions_handler,
)

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
VALUE = {"alert_id": "idle-gpus/77c2d1", "rule": "idle-gpus",
         "resource_id": "cluster-a/node-017"}


@dataclass
class RecordingActions:
    """Stands in for the worker: remembers what it was asked to do."""

    calls: list[tuple[str, ActionRequest, timedelta | None]] = field(default_factory=list)
    release: asyncio.Event | None = None
    fail: bool = False

    async def _record(self, verb: str, request: ActionRequest,
                      duration: timedelta | None) -> str | None:
        if self.release is not None:
            await self.release.wait()
        if self.fail:
            raise RuntimeError("silence store unavailable")
        self.calls.append((verb, request, duration))
        return "until 15:30 UTC" if verb == "snooze" else None

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        return await self._record("snooze", request, duration)

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        return await self._record("keep", request, duration)

    async def approve(self, request: ActionRequest) -> str | None:
        return await self._record("approve", request, None)


@dataclass
class RecordingNotes:
    notes: list[tuple[str, str, str]] = field(default_factory=list)

    async def annotate(self, channel: str, ts: str, note: str) -> None:
        self.notes.append((channel, ts, note))


def payload(action_id: str = "costline.snooze.4h", value: dict[str, Any] | None = None,
            user: str = "U042", **extra: Any) -> dict[str, Any]:
    pressed: dict[str, Any] = {"action_id": action_id, "block_id": "costline.actions",
                               "type": "button", "value": json.dumps(value or VALUE)}
    body = {"type": "block_actions", "user": {"id": user, "username": "ada"},
            "channel": {"id": "C0ML", "name": "ml-platform"},
            "container": {"type": "message", "message_ts": "1796025900.000100",
                          "channel_id": "C0ML"},
            "actions": [pressed]}
    body.update(extra)
    return body


def signed(body: bytes, *, at: float | None = None,
           secret: str = SECRET) -> dict[str, str]:
    """Slack's v0 signature, computed independently of the code under test."""
    timestamp = str(int(time.time() if at is None else at))
    basestring = b"v0:" + timestamp.encode() + b":" + body
    signature = "v0=" + hmac.new(secret.encode(), basestring, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature,
            "Content-Type": "application/x-www-form-urlencoded"}


def form(body: dict[str, Any]) -> bytes:
    return urlencode({"payload": json.dumps(body)}).encode()


@dataclass
class Endpoint:
    client: TestClient[Any, Any]
    handler: SlackActionsHandler
    actions: RecordingActions
    notes: RecordingNotes

    async def press(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[
            int, dict[str, Any]]:
        response = await self.client.post("/slack/actions", data=body,
                                          headers=signed(body) if headers is None else headers)
        answer = await response.json()
        await self.handler.drain()
        return response.status, answer


async def endpoint_with(approvers: ApproverPolicy) -> tuple[TestClient[Any, Any], Endpoint]:
    actions, notes = RecordingActions(), RecordingNotes()
    handler = make_actions_handler(signing_secret=SECRET, actions=actions,
                                   approvers=approvers, replay_guard=MemoryReplayGuard(),
                                   notes=notes, keep_for=timedelta(hours=12))
    app = web.Application()
    add_actions_route(app, handler)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client, Endpoint(client, handler, actions, notes)


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    policy = ApproverPolicy(by_rule={"idle-gpus": frozenset({"U042", "U077"})})
    client, built = await endpoint_with(policy)
    yield built
    await client.close()


async def test_a_signed_snooze_creates_a_silence_and_notes_who(endpoint: Endpoint) -> None:
    status, answer = await endpoint.press(form(payload()))
    assert status == 200
    assert answer == {"response_type": "ephemeral", "replace_original": False,
                      "text": "Snoozing for 4h: idle-gpus…"}
    [(verb, request, duration)] = endpoint.actions.calls
    assert (verb, duration) == ("snooze", timedelta(hours=4))
    assert (request.alert_id, request.rule, request.user_id, request.channel_id,
            request.message_ts) == ("idle-gpus/77c2d1", "idle-gpus", "U042", "C0ML",
                                    "1796025900.000100")
    assert endpoint.notes.notes == [("C0ML", "1796025900.000100",
                                     ":no_bell: Snoozed for 4h by <@U042> (until 15:30 UTC)")]


async def test_keep_and_approve_reach_the_worker(endpoint: Endpoint) -> None:
    await endpoint.press(form(payload("costline.keep")))
    await endpoint.press(form(payload("costline.approve")))
    assert [(verb, d) for verb, _, d in endpoint.actions.calls] == [
        ("keep", timedelta(hours=12)), ("approve", None)]
    assert endpoint.notes.notes[1][2] == (
        ":white_check_mark: Release of `cluster-a/node-017` approved by <@U042>")


async def test_a_digest_menu_choice_is_dispatched_like_its_button(endpoint: Endpoint) -> None:
    body = payload("costline.menu")
    body["actions"] = [{"action_id": "costline.menu", "type": "overflow",
                        "selected_option": {"value": json.dumps(
                            {**VALUE, "action": "costline.snooze.1d"})}}]
    status, _ = await endpoint.press(form(body))
    assert status == 200
    assert endpoint.actions.calls[0][2] == timedelta(days=1)


async def test_a_bad_signature_is_refused(endpoint: Endpoint) -> None:
    body = form(payload())
    status, _ = await endpoint.press(body, signed(body, secret="not-the-secret"))
    assert status == 401
    assert endpoint.actions.calls == []


async def test_a_stale_request_is_refused_even_when_signed(endpoint: Endpoint) -> None:
    body = form(payload())
    status, answer = await endpoint.press(body, signed(body, at=time.time() - 301))
    assert (status, answer["error"]) == (401, "stale request")


async def test_a_replayed_request_is_refused(endpoint: Endpoint) -> None:
    body = form(payload())
    headers = signed(body)
    assert (await endpoint.press(body, headers))[0] == 200
    status, answer = await endpoint.press(body, headers)
    assert (status, answer["error"]) == (401, "replayed request")
    assert len(endpoint.actions.calls) == 1


async def test_missing_or_garbled_headers_are_refused(endpoint: Endpoint) -> None:
    body = form(payload())
    assert (await endpoint.press(body, {}))[0] == 401
    assert (await endpoint.press(body, {"X-Slack-Request-Timestamp": "soon",
                                        "X-Slack-Signature": "v0=00"}))[0] == 401


@pytest.mark.parametrize("body", [
    b"\xff\xfe garbage",
    b"",
    b"payload=not-json",
    urlencode({"payload": json.dumps(["a list"])}).encode(),
    form({"type": "view_submission"}),
    form(payload("costline.delete-everything")),
    form(payload(value={"rule": "idle-gpus"})),
    form(payload("costline.keep", value={"alert_id": "a/1", "rule": "a"})),
    urlencode({"payload": json.dumps(payload())[:40]}).encode(),
], ids=["bytes", "empty", "not-json", "not-object", "other-type", "unknown-action",
        "no-alert", "keep-without-resource", "truncated"])
async def test_signed_nonsense_is_a_400_never_a_500(endpoint: Endpoint, body: bytes) -> None:
    status, _ = await endpoint.press(body)
    assert status == 400
    assert endpoint.actions.calls == []


async def test_someone_off_the_rules_list_is_told_so(endpoint: Endpoint) -> None:
    status, answer = await endpoint.press(form(payload(user="U999")))
    assert status == 200
    assert answer["text"] == "You are not on the approver list for idle-gpus."
    assert endpoint.actions.calls == []


async def test_without_any_list_anyone_may_snooze_but_nobody_approves() -> None:
    client, open_endpoint = await endpoint_with(ApproverPolicy())
    try:
        await open_endpoint.press(form(payload(user="U999")))
        status, answer = await open_endpoint.press(form(payload("costline.approve",
                                                                user="U999")))
    finally:
        await client.close()
    assert [verb for verb, _, _ in open_endpoint.actions.calls] == ["snooze"]
    assert answer["text"].startswith("You are not on the approver list")


async def test_a_channel_list_applies_when_the_rule_has_none() -> None:
    client, guarded = await endpoint_with(ApproverPolicy(by_channel={"C0ML": frozenset({"ada"})}))
    try:
        await guarded.press(form(payload("costline.approve", user="U555")))
    finally:
        await client.close()
    assert [verb for verb, _, _ in guarded.actions.calls] == ["approve"], "matched by username"


async def test_slack_gets_its_answer_before_slow_work_finishes(endpoint: Endpoint) -> None:
    endpoint.actions.release = asyncio.Event()
    body = form(payload())
    started = time.monotonic()
    response = await endpoint.client.post("/slack/actions", data=body, headers=signed(body))
    assert response.status == 200
    assert time.monotonic() - started < 1.0
    assert endpoint.actions.calls == []
    endpoint.actions.release.set()
    await endpoint.handler.drain()
    assert len(endpoint.actions.calls) == 1


async def test_a_failed_action_is_noted_on_the_message(endpoint: Endpoint) -> None:
    endpoint.actions.fail = True
    status, _ = await endpoint.press(form(payload()))
    assert status == 200
    assert endpoint.notes.notes[0][2] == (
        ":x: snooze by <@U042> failed; see the worker's log")
