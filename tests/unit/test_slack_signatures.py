"""``POST /slack/actions`` refuses every request Slack did not sign, and never answers 500.

The handler runs in an aiohttp server on a loopback port of its own thread, with a clock the
test sets, so a request is exactly as fresh as the test says. Requests are sent as raw HTTP
with ``http.client``: header and body bytes reach the server unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from costline.connectors.slack_actions import (
    ActionRequest,
    ApproverPolicy,
    MemoryReplayGuard,
    add_actions_route,
    make_actions_handler,
)

# Slack's worked example ("Verifying requests from Slack"): a slash command request.
DOC_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
DOC_TIMESTAMP = 1531420618
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow"
    b"&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner"
    b"&command=%2Fwebhook-collect&text="
    b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554"
    b"%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"

NOW = 1_796_025_900  # 2026-11-30T08:05:00Z
VALUE = {"alert_id": "team-monthly/f3896626dfa3e0d1", "rule": "team-monthly"}


@dataclass
class Clock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


@dataclass
class CountingActions:
    """The worker's side: counts what the buttons asked for."""

    done: list[str] = field(default_factory=list)

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        self.done.append("snooze")
        return None

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        self.done.append("keep")
        return None

    async def approve(self, request: ActionRequest) -> str | None:
        self.done.append("approve")
        return None


class Endpoint:
    """``/slack/actions`` served from a thread, for synchronous (and hypothesis) tests."""

    def __init__(self, secret: str, clock: Clock, approvers: ApproverPolicy) -> None:
        self.clock = clock
        self.actions = CountingActions()
        self.handler = make_actions_handler(
            signing_secret=secret, actions=self.actions, approvers=approvers,
            replay_guard=MemoryReplayGuard(clock), clock=clock)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._runner: web.AppRunner | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the endpoint did not start")

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        add_actions_route(app, self.handler)
        self._runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        ready.set()
        self.loop.run_forever()

    def post(self, body: bytes, headers: dict[str, str | bytes]) -> tuple[int, dict[str, Any]]:
        """One raw POST; the answer's status and JSON body (the handler's work awaited)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.putrequest("POST", "/slack/actions", skip_accept_encoding=True)
            connection.putheader("Content-Type", "application/x-www-form-urlencoded")
            connection.putheader("Content-Length", str(len(body)))
            for name, value in headers.items():
                connection.putheader(name, value)
            connection.endheaders(body)
            response = connection.getresponse()
            status, raw = response.status, response.read()
        finally:
            connection.close()
        asyncio.run_coroutine_threadsafe(self.handler.drain(), self.loop).result(10)
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"raw": raw.decode("utf-8", "replace")}
        return status, answer

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint(DOC_SECRET, Clock(), ApproverPolicy(by_channel={"C0ML": frozenset({"U1"})}))
    yield served
    served.stop()


@pytest.fixture(autouse=True)
def fresh_clock(endpoint: Endpoint) -> None:
    endpoint.clock.now = NOW


_nonce = itertools.count()


def press(user: str = "U1", **extra: Any) -> bytes:
    """A Snooze press as Slack posts it: the JSON payload, form-encoded; unique per call, so
    no two requests of a test share a signature."""
    payload: dict[str, Any] = {
        "type": "block_actions", "user": {"id": user, "username": "ada"},
        "api_app_id": "A0COSTLINE", "token": "verification-token-unused",
        "container": {"type": "message", "message_ts": "1796025600.000100",
                      "channel_id": "C0ML", "is_ephemeral": False},
        "trigger_id": f"1796025900.{next(_nonce)}", "team": {"id": "T0COSTLINE"},
        "channel": {"id": "C0ML", "name": "ml-budgets"},
        "actions": [{"action_id": "costline.snooze.1h", "block_id": "costline.actions",
                     "type": "button", "value": json.dumps(VALUE),
                     "text": {"type": "plain_text", "text": "Snooze 1h"},
                     "action_ts": "1796025900.123456"}],
    }
    payload.update(extra)
    return urlencode({"payload": json.dumps(payload)}).encode()


def sign(body: bytes, timestamp: int | str = NOW, secret: str = DOC_SECRET) -> dict[str, str]:
    """Slack's v0 scheme, written out here rather than borrowed from the code under test."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": f"v0={digest}"}


# ── Slack's own example ─────────────────────────────────────────────────────────────────────


def test_slacks_documented_example_passes_the_signature_check(endpoint: Endpoint) -> None:
    endpoint.clock.now = DOC_TIMESTAMP
    status, answer = endpoint.post(DOC_BODY, {"X-Slack-Request-Timestamp": str(DOC_TIMESTAMP),
                                              "X-Slack-Signature": DOC_SIGNATURE})
    assert (status, answer["error"]) == (400, "malformed payload"), (
        "authentic, and refused only because a slash command is not a button press")


def test_the_documented_example_is_refused_once_its_body_changes(endpoint: Endpoint) -> None:
    endpoint.clock.now = DOC_TIMESTAMP
    changed = DOC_BODY.replace(b"roadrunner", b"roadrunneR")
    status, answer = endpoint.post(changed, {"X-Slack-Request-Timestamp": str(DOC_TIMESTAMP),
                                             "X-Slack-Signature": DOC_SIGNATURE})
    assert (status, answer["error"]) == (401, "bad signature")


def test_a_signed_press_is_accepted_and_acted_on(endpoint: Endpoint) -> None:
    before = len(endpoint.actions.done)
    body = press()
    status, answer = endpoint.post(body, sign(body))
    assert status == 200
    assert answer["text"] == "Snoozing for 1h: team-monthly…"
    assert endpoint.actions.done[before:] == ["snooze"]


# ── each way of being inauthentic is a 401 ─────────────────────────────────────────────────


def test_a_wrong_secret_is_refused(endpoint: Endpoint) -> None:
    body = press()
    status, answer = endpoint.post(body, sign(body, secret=DOC_SECRET[:-1] + "6"))
    assert (status, answer["error"]) == (401, "bad signature")


def test_a_body_changed_after_signing_is_refused(endpoint: Endpoint) -> None:
    body = press()
    headers = sign(body)
    status, answer = endpoint.post(body.replace(b"snooze.1h", b"snooze.1d"), headers)
    assert (status, answer["error"]) == (401, "bad signature")


@pytest.mark.parametrize("age", [301, 3600, -301, -86400])
def test_a_stale_or_future_timestamp_is_refused_even_when_signed(endpoint: Endpoint,
                                                                 age: int) -> None:
    body = press()
    status, answer = endpoint.post(body, sign(body, timestamp=NOW - age))
    assert (status, answer["error"]) == (401, "stale request")


def test_a_replayed_request_is_refused(endpoint: Endpoint) -> None:
    before = len(endpoint.actions.done)
    body = press()
    headers = sign(body)
    assert endpoint.post(body, headers)[0] == 200
    endpoint.clock.now += 60
    status, answer = endpoint.post(body, headers)
    assert (status, answer["error"]) == (401, "replayed request")
    assert len(endpoint.actions.done) == before + 1


def _without(headers: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != name}


MALFORMED: dict[str, Any] = {
    "no headers": lambda h: {},
    "no timestamp": lambda h: _without(h, "X-Slack-Request-Timestamp"),
    "no signature": lambda h: _without(h, "X-Slack-Signature"),
    "empty timestamp": lambda h: {**h, "X-Slack-Request-Timestamp": ""},
    "empty signature": lambda h: {**h, "X-Slack-Signature": ""},
    "timestamp in words": lambda h: {**h, "X-Slack-Request-Timestamp": "now"},
    "negative timestamp": lambda h: {**h, "X-Slack-Request-Timestamp": f"-{NOW}"},
    "fractional timestamp": lambda h: {**h, "X-Slack-Request-Timestamp": f"{NOW}.5"},
    "huge timestamp": lambda h: {**h, "X-Slack-Request-Timestamp": "9" * 5000},
    "non-ascii digits": lambda h: {**h, "X-Slack-Request-Timestamp": "١٧٩٦٠٢٥٩٠٠".encode()},
    "superscript digit": lambda h: {**h, "X-Slack-Request-Timestamp": "²".encode()},
    "signature without v0=": lambda h: {**h, "X-Slack-Signature": h["X-Slack-Signature"][3:]},
    "signature of v1": lambda h: {**h, "X-Slack-Signature": "v1" + h["X-Slack-Signature"][2:]},
    "signature truncated": lambda h: {**h, "X-Slack-Signature": h["X-Slack-Signature"][:-1]},
    "signature upper case": lambda h: {**h, "X-Slack-Signature": h["X-Slack-Signature"].upper()},
    "signature non-ascii": lambda h: {**h, "X-Slack-Signature": "v0=é".encode()},
    "signature latin-1 byte": lambda h: {**h, "X-Slack-Signature": b"v0=\xe9"},
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_missing_or_malformed_headers_are_refused(endpoint: Endpoint, case: str) -> None:
    before = len(endpoint.actions.done)
    body = press()
    status, answer = endpoint.post(body, MALFORMED[case](sign(body)))
    assert status == 401, answer
    assert len(endpoint.actions.done) == before


# ── fuzzing: whatever arrives, the answer is never a 500 ───────────────────────────────────

header_text = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80),
    st.binary(max_size=80).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b"")),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
)

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(timestamp=header_text, signature=header_text, body=st.binary(max_size=512))
def test_fuzzed_headers_never_get_past_the_check_nor_a_500(
        endpoint: Endpoint, timestamp: str | bytes, signature: str | bytes,
        body: bytes) -> None:
    before = len(endpoint.actions.done)
    status, _ = endpoint.post(body, {"X-Slack-Request-Timestamp": timestamp,
                                     "X-Slack-Signature": signature})
    assert status in (400, 401)
    assert len(endpoint.actions.done) == before


@FUZZ
@given(age=st.integers(min_value=-10**6, max_value=10**6))
def test_exactly_the_requests_within_five_minutes_are_fresh(endpoint: Endpoint,
                                                            age: int) -> None:
    body = press()
    status, _ = endpoint.post(body, sign(body, timestamp=NOW - age))
    assert status == (200 if abs(age) <= 300 else 401)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8,
)
PAYLOAD_KEYS = ["type", "user", "channel", "container", "message", "actions"]


@FUZZ
@given(raw=st.binary(max_size=1024))
@example(raw=b"payload=" + b"[" * 5_000)
@example(raw=b"payload=%7B%22type%22%3A%22block_actions%22%2C%22actions%22%3A" + b"[" * 5_000)
def test_signed_fuzzed_bodies_are_answered_400_or_200_never_500(endpoint: Endpoint,
                                                                 raw: bytes) -> None:
    status, _ = endpoint.post(raw, sign(raw))
    assert status in (200, 400)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(PAYLOAD_KEYS), json_values, max_size=4),
       value=json_values, action_id=st.sampled_from(
           ["costline.snooze.4h", "costline.keep", "costline.approve", "costline.menu", "x"]))
@example(changes={"channel": {"id": ["C0ML"]}}, value=VALUE, action_id="costline.snooze.4h")
@example(changes={"channel": {"id": {"C0ML": 1}}}, value=VALUE, action_id="costline.snooze.4h")
@example(changes={"container": {"message_ts": ["1"]}}, value=VALUE,
         action_id="costline.snooze.4h")
@example(changes={"user": {"id": "U1", "username": ["ada"]}}, value=VALUE,
         action_id="costline.snooze.4h")
@example(changes={}, value="[" * 5000, action_id="costline.snooze.4h")
def test_signed_button_presses_with_odd_fields_are_never_a_500(
        endpoint: Endpoint, changes: dict[str, Any], value: Any, action_id: str) -> None:
    pressed = {"action_id": action_id, "type": "button",
               "value": value if isinstance(value, str) else json.dumps(value),
               "selected_option": {"value": json.dumps(value)}}
    body = press(**{"actions": [pressed], **changes})
    status, answer = endpoint.post(body, sign(body))
    assert status in (200, 400), answer
