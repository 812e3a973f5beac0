"""Fuzzing ``POST /slack/actions`` through aiohttp's test client: nothing a client sends gets a 500.

Unsigned, badly signed or stale requests with any headers and body answer 401 (or 400 when the
body cannot even be read); correctly signed requests whose form, payload or button value is
mutated answer 400, or 200 with an ephemeral line, and then act only on a well-formed request.
The handler runs on an event loop of its own thread, so hypothesis drives it synchronously.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import hmac
import json
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from costline.connectors.slack_actions import (
    MAX_AGE_S,
    MAX_BODY,
    ActionRequest,
    ApproverPolicy,
    add_actions_route,
    make_actions_handler,
)
from costline.connectors.slack_render import (
    APPROVE_ACTION,
    DIGEST_MENU_ACTION,
    KEEP_ACTION,
    SNOOZE_ACTIONS,
)

SECRET = "fuzz-signing-secret-4f1c2e"
NOW = 1_796_025_900  # 2026-11-30T08:05:00Z
BOSS = "U0BOSS"
VALUE = {"alert_id": "idle-gpus/77c2d1", "rule": "idle-gpus",
         "resource_id": "cluster-a/node-017"}
FUZZ = settings(deadline=None, max_examples=100,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def payload(action_id: str = "costline.snooze.4h", value: Any = None) -> dict[str, Any]:
    """A ``block_actions`` payload as Slack sends it for one of costline's buttons."""
    pressed = {"type": "button", "block_id": "costline.actions", "action_id": action_id,
               "value": json.dumps(VALUE if value is None else value),
               "action_ts": "1796025899.000100"}
    return {"type": "block_actions", "user": {"id": BOSS, "username": "boss", "name": "boss"},
            "channel": {"id": "C0ML", "name": "ml-platform"},
            "container": {"type": "message", "message_ts": "1796025800.000100",
                          "channel_id": "C0ML"},
            "message": {"ts": "1796025800.000100", "text": "idle"},
            "actions": [pressed]}


def form(data: Any) -> bytes:
    return urlencode({"payload": json.dumps(data)}).encode()


def sign(body: bytes, timestamp: int | str = NOW, secret: str = SECRET) -> dict[str, str]:
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256)
    return {"X-Slack-Request-Timestamp": str(timestamp),
            "X-Slack-Signature": f"v0={digest.hexdigest()}",
            "Content-Type": "application/x-www-form-urlencoded"}


SEED_BODIES = [form(payload(action)) for action in (*SNOOZE_ACTIONS, KEEP_ACTION,
                                                     APPROVE_ACTION)]
SEED_BODIES.append(form({**payload(DIGEST_MENU_ACTION), "actions": [{
    "action_id": DIGEST_MENU_ACTION, "type": "overflow",
    "selected_option": {"value": json.dumps({**VALUE, "action": "costline.snooze.1h"})}}]}))


@dataclass
class Recorder:
    """The worker's side: what it was asked to do, and the notes put on messages."""

    calls: list[tuple[str, ActionRequest]] = field(default_factory=list)
    notes: list[tuple[str, str, str]] = field(default_factory=list)

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        self.calls.append(("snooze", request))
        return None

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        self.calls.append(("keep", request))
        return None

    async def approve(self, request: ActionRequest) -> str | None:
        self.calls.append(("approve", request))
        return None

    async def annotate(self, channel: str, ts: str, note: str) -> None:
        self.notes.append((channel, ts, note))


class Forgetful:
    """A replay guard the test empties before each example, so hypothesis may repeat one."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    async def first_seen(self, signature: str, ttl_s: int) -> bool:
        fresh = signature not in self.seen
        self.seen.add(signature)
        return fresh


class Endpoint:
    """The handler behind aiohttp's test server, on a loop of its own thread."""

    def __init__(self) -> None:
        self.recorder = Recorder()
        self.guard = Forgetful()
        self.handler = make_actions_handler(
            signing_secret=SECRET, actions=self.recorder, notes=self.recorder,
            approvers=ApproverPolicy(by_rule={"idle-gpus": frozenset({BOSS})}),
            replay_guard=self.guard, clock=lambda: NOW)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client: TestClient = self._run(self._start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> TestClient:
        app = web.Application()
        add_actions_route(app, self.handler)
        # A refused body may leave the connection unusable: one connection per request.
        client = TestClient(TestServer(app), connector=aiohttp.TCPConnector(force_close=True))
        await client.start_server()
        return client

    def reset(self) -> None:
        self.guard.seen.clear()
        self.recorder.calls.clear()
        self.recorder.notes.clear()

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        async def send() -> tuple[int, str]:
            async with self.client.post("/slack/actions", data=body, headers=headers) as answer:
                text = await answer.text()
            await self.handler.drain()
            return answer.status, text
        return self._run(send())  # type: ignore[no-any-return]

    def close(self) -> None:
        self._run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    yield served
    served.close()


# ── strategies ──────────────────────────────────────────────────────────────────────────────

header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
timestamps = st.one_of(
    st.sampled_from([str(NOW), str(NOW - MAX_AGE_S - 1), str(NOW + MAX_AGE_S + 1), "", "0",
                     "-1", "+1796025900", " 1796025900", "1796025900.0", "9" * 40,
                     "1796025900\u00a0", "\uff11\uff17\uff19\uff16", "\u0661\u0662", "1e9"]),
    header_text,
)
signatures = st.one_of(
    st.sampled_from(["", "v0=", "v1=" + "0" * 64, "v0=" + "0" * 64, "v0=" + "g" * 64,
                     "V0=" + "0" * 64, "v0=\u00e9" + "0" * 63]),
    st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: "v0=" + h),
    header_text,
)
content_types = st.sampled_from(["application/x-www-form-urlencoded", "application/json",
                                 "multipart/form-data; boundary=x", "text/plain", ""])
encodings = st.sampled_from(["gzip", "deflate", "identity", "x-unknown", "gzip, deflate"])


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A seed body, a mutant of one, or any bytes."""
    kind = draw(st.sampled_from(["seed", "bytes", "mutant"]))
    if kind == "bytes":
        return draw(st.binary(max_size=512))
    body = bytearray(draw(st.sampled_from(SEED_BODIES)))
    if kind == "mutant":
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(body)))
            op = draw(st.sampled_from(["flip", "cut", "insert"]))
            if op == "flip" and at < len(body):
                body[at] ^= 1 << draw(st.integers(0, 7))
            elif op == "cut":
                del body[at:]
            else:
                body[at:at] = draw(st.sampled_from(
                    [b"%", b"%zz", b"%ff", b"&", b"=", b"&payload=", b"\xff", b"%00", b"+"]))
    return bytes(body)


ODD_JSON = st.one_of(
    st.sampled_from([None, True, 0, -1, 2**70, 1e308, "", "x" * 2000, [], {}, [[]], {"id": {}},
                     "costline.approve", "\ud800", "\u202e", "1" * 5000])
    .map(lambda v: json.dumps(v) if not (isinstance(v, str) and v == "1" * 5000) else v),
    st.sampled_from([100, 10_000, 100_000]).map(lambda depth: "[" * depth + "]" * depth),
    st.text(max_size=20).map(json.dumps),
)
"""Replacement values as JSON text (deep nesting and 5,000-digit numbers stay text)."""


def paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from paths(value, (*prefix, index))


def replaced(data: Any, path: tuple[Any, ...], raw_json: str | None) -> str:
    """JSON of ``data`` with the node at ``path`` replaced by ``raw_json`` (or removed)."""
    if not path:
        return raw_json if raw_json is not None else "{}"
    marker = "\u0000here\u0000"
    copy = json.loads(json.dumps(data))
    node = copy
    for step in path[:-1]:
        node = node[step]
    if raw_json is None:
        del node[path[-1]]
        return json.dumps(copy)
    node[path[-1]] = marker
    return json.dumps(copy).replace(json.dumps(marker), raw_json, 1)


@st.composite
def payload_mutants(draw: st.DrawFn) -> bytes:
    """A signed-body-to-be: one node of the payload, or of the button's value, replaced."""
    action = draw(st.sampled_from([*SNOOZE_ACTIONS, KEEP_ACTION, APPROVE_ACTION]))
    if draw(st.booleans()):
        value = dict(VALUE)
        path = draw(st.sampled_from(list(paths(value))))
        raw = draw(st.one_of(st.none(), ODD_JSON))
        data = payload(action)
        data["actions"][0]["value"] = replaced(value, path, raw)
        return form(data)
    data = payload(action)
    path = draw(st.sampled_from(list(paths(data))))
    raw = draw(st.one_of(st.none(), ODD_JSON))
    return urlencode({"payload": replaced(data, path, raw)}, quote_via=quote).encode()


# ── tests ───────────────────────────────────────────────────────────────────────────────────


@FUZZ
@given(bodies(), timestamps, signatures, content_types,
       st.dictionaries(st.sampled_from(["Content-Encoding", "X-Slack-Retry-Num",
                                        "X-Forwarded-For", "Authorization", "Cookie"]),
                       header_text, max_size=2))
def test_requests_without_a_valid_signature_are_refused_with_401_or_400(
        endpoint, body, timestamp, signature, content_type, extra):
    endpoint.reset()
    headers = {**extra, "X-Slack-Request-Timestamp": timestamp,
               "X-Slack-Signature": signature, "Content-Type": content_type}
    if headers["X-Slack-Signature"] == sign(body, timestamp)["X-Slack-Signature"]:
        return  # hypothesis did forge it: nothing to refuse
    status, _ = endpoint.post(body, headers)
    assert status in (400, 401)
    assert endpoint.recorder.calls == []


@FUZZ
@given(bodies(), st.sampled_from([NOW, NOW - MAX_AGE_S - 1, NOW + MAX_AGE_S + 1]),
       st.sampled_from([SECRET, SECRET.upper(), SECRET[:-1], ""]))
def test_a_signature_made_with_another_secret_or_a_stale_timestamp_is_401(
        endpoint, body, timestamp, secret):
    endpoint.reset()
    if (secret, timestamp) == (SECRET, NOW):
        secret = "not-" + SECRET
    status, answer = endpoint.post(body, sign(body, timestamp, secret))
    assert (status, endpoint.recorder.calls) in ((401, []), (400, []))
    assert status == 401 or json.loads(answer)["error"] in ("body is not UTF-8",
                                                           "body too large")


@FUZZ
@given(st.one_of(bodies(), payload_mutants()))
@example(form({**payload(KEEP_ACTION, {**VALUE, "resource_id": 7}), "user": {"id": BOSS}}))
@example(form(payload(APPROVE_ACTION, {**VALUE, "resource_id": ["a"]})))
@example(b"payload=" + b"%5B" * 100_000)
def test_signed_requests_with_mutated_bodies_get_400_or_act_on_a_well_formed_press(
        endpoint, body):
    endpoint.reset()
    status, answer = endpoint.post(body, sign(body))
    assert status in (200, 400), answer
    reply = json.loads(answer)
    if status == 400:
        assert reply["ok"] is False and reply["error"]
        assert endpoint.recorder.calls == []
        return
    assert reply["response_type"] == "ephemeral" and reply["text"]
    for verb, request in endpoint.recorder.calls:
        assert verb == request.action
        assert all(isinstance(text, str) and text for text in
                   (request.alert_id, request.rule, request.user_id, request.user_name))
        for optional in (request.resource_id, request.channel_id, request.message_ts):
            assert optional is None or (isinstance(optional, str) and optional)
        if verb in ("keep", "approve"):
            assert request.resource_id
        if verb == "approve":
            assert request.rule == "idle-gpus" and BOSS in (request.user_id, request.user_name)


@pytest.mark.parametrize("encoding, body", [
    ("gzip", b"this is not gzip"),
    ("deflate", b"nor deflate"),
    ("gzip", b"\x1f\x8b" + b"\x00" * 30),
])
def test_a_body_that_does_not_decode_as_its_content_encoding_is_400(endpoint, encoding, body):
    endpoint.reset()
    status, answer = endpoint.post(body, {**sign(body), "Content-Encoding": encoding})
    assert (status, json.loads(answer)) == (400, {"ok": False, "error": "unreadable body"})


@pytest.mark.parametrize("encoding, body", [
    ("gzip", gzip.compress(b"payload=x")[:-6]),
    ("gzip", gzip.compress(b"payload=x")[:12]),
    ("deflate", zlib.compress(b"payload=x")[:5]),
])
def test_a_truncated_compressed_body_is_refused_without_acting(endpoint, encoding, body):
    endpoint.reset()
    status, _ = endpoint.post(body, {**sign(body), "Content-Encoding": encoding})
    assert status in (400, 401) and endpoint.recorder.calls == []


def test_a_compressed_body_larger_than_the_limit_once_inflated_is_400(endpoint):
    endpoint.reset()
    body = gzip.compress(b"payload=" + b"a" * (MAX_BODY * 20))
    assert len(body) < MAX_BODY
    status, answer = endpoint.post(body, {**sign(body), "Content-Encoding": "gzip"})
    assert (status, json.loads(answer)["error"]) == (400, "body too large")


def test_a_seed_request_is_accepted_so_the_fuzzing_reaches_the_actions(endpoint):
    endpoint.reset()
    results = [endpoint.post(body, sign(body))[0] for body in SEED_BODIES]
    assert results == [200] * len(SEED_BODIES)
    verbs = [verb for verb, _ in endpoint.recorder.calls]
    assert sorted(set(verbs)) == ["approve", "keep", "snooze"]
