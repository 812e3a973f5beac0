"""``POST /slack/actions``: the Snooze, Keep and Approve buttons, verified and dispatched.

Slack signs every interactive request with the app's signing secret. A request is accepted
only when its ``X-Slack-Signature`` matches, its ``X-Slack-Request-Timestamp`` is within five
minutes, and the same signature has not been seen before (a captured request replayed inside
the window is refused): all three failures answer 401. A body that is signed but makes no sense
answers 400; nothing a client sends produces a 500.

Slack gives up on an answer after three seconds, so the handler only checks, answers with an
ephemeral line, and does the work (the callback, then a note on the message saying who did
what) in a background task.

Who may press what: when an allow-list exists for the alert's rule (else for its channel), only
the people on it may act. Without any list, anyone in the channel may snooze or keep, and nobody
may approve: approving releases a resource, so it fails closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import parse_qs

from aiohttp import web
from slack_sdk.signature import Clock, SignatureVerifier

from costline.connectors.alert_change import duration
from costline.connectors.redis_client import FAILURES, AsyncRedisClient
from costline.connectors.slack_render import (
    APPROVE_ACTION,
    DIGEST_MENU_ACTION,
    KEEP_ACTION,
    LIFT_ACTION,
    SNOOZE_ACTIONS,
)

log = logging.getLogger(__name__)

MAX_AGE_S = 300
MAX_TIMESTAMP_DIGITS = 12
"""Unix seconds have 10 digits until the year 2286; anything far longer is not a time."""
MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class ActionRequest:
    """A button press, checked and decoded: what the worker needs to act on it."""

    action: str
    alert_id: str
    rule: str
    resource_id: str | None
    duration_s: int | None
    user_id: str
    user_name: str
    channel_id: str | None
    message_ts: str | None


class AlertActions(Protocol):
    """What the worker does for each button. Each returns an optional detail for the note
    (e.g. ``"until 15:30 UTC"``) and raises to report that the action failed."""

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None: ...

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None: ...

    async def approve(self, request: ActionRequest) -> str | None: ...

    async def lift(self, request: ActionRequest) -> str | None: ...


class MessageNotes(Protocol):
    """Puts a line on an alert message; :class:`SlackNotifier` is one."""

    async def annotate(self, channel: str, ts: str, note: str) -> None: ...


class ReplayGuard(Protocol):
    async def first_seen(self, signature: str, ttl_s: int) -> bool:
        """True the first time a signature is presented within ``ttl_s``."""
        ...


class RedisReplayGuard:
    """Remembers signatures in Redis (``SET NX EX``), so every worker refuses a replay."""

    def __init__(self, redis: AsyncRedisClient, namespace: str = "costline") -> None:
        self._redis = redis
        self._prefix = f"{namespace}:slack:seen:"

    async def first_seen(self, signature: str, ttl_s: int) -> bool:
        return bool(await self._redis.set(self._prefix + signature, "1", nx=True, ex=ttl_s))


class MemoryReplayGuard:
    """Remembers signatures in this process: for one worker, or tests."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._seen: dict[str, float] = {}

    async def first_seen(self, signature: str, ttl_s: int) -> bool:
        now = self._clock()
        self._seen = {s: until for s, until in self._seen.items() if until > now}
        if signature in self._seen:
            return False
        self._seen[signature] = now + ttl_s
        return True


@dataclass(frozen=True)
class ApproverPolicy:
    """Allow-lists of Slack user ids (or names), per rule and per channel id."""

    by_rule: Mapping[str, frozenset[str]] = field(default_factory=dict)
    by_channel: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def allows(self, request: ActionRequest) -> bool:
        listed = self.by_rule.get(request.rule)
        if listed is None and request.channel_id is not None:
            listed = self.by_channel.get(request.channel_id)
        if listed is None:
            return request.action not in ("approve", "lift")
        return request.user_id in listed or request.user_name in listed


class BadRequest(ValueError):
    """Signed, but not a costline button press."""


class _Clock(Clock):
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class SlackActionsHandler:
    """The aiohttp handler; keep one per app and :meth:`drain` it on shutdown."""

    def __init__(self, *, signing_secret: str, actions: AlertActions,
                 approvers: ApproverPolicy, replay_guard: ReplayGuard,
                 notes: MessageNotes | None = None, keep_for: timedelta = timedelta(days=1),
                 clock: Callable[[], float] = time.time) -> None:
        self._verifier = SignatureVerifier(signing_secret, clock=_Clock(clock))
        self._actions = actions
        self._approvers = approvers
        self._replay_guard = replay_guard
        self._notes = notes
        self._keep_for = keep_for
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return "SlackActionsHandler()"

    async def __call__(self, request: web.Request) -> web.Response:
        try:
            body = await _read_body(request)
        except BadRequest as exc:
            return _plain(400, str(exc))
        refusal = self._refusal(body, request.headers)
        if refusal:
            log.warning("Slack action refused: %s", refusal)
            return _plain(401, refusal)
        try:
            if not await self._replay_guard.first_seen(
                    request.headers["X-Slack-Signature"], 2 * MAX_AGE_S):
                log.warning("Slack action refused: replayed request")
                return _plain(401, "replayed request")
        except FAILURES + (OSError,) as exc:
            log.error("cannot check for replays: %s", type(exc).__name__)
            return _plain(503, "try again")
        try:
            action = parse_action(body, self._keep_for)
        except BadRequest as exc:
            return _plain(400, str(exc))
        return self._accept(action)

    def _refusal(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """Why a request is not authentic, or None."""
        timestamp = headers.get("X-Slack-Request-Timestamp", "")
        signature = headers.get("X-Slack-Signature", "")
        if not timestamp or not signature:
            return "missing signature headers"
        if not (timestamp.isascii() and timestamp.isdigit()):
            return "bad timestamp"
        if len(timestamp) > MAX_TIMESTAMP_DIGITS or abs(self._clock() - int(timestamp)) > MAX_AGE_S:
            return "stale request"
        if not signature.isascii() or not self._verifier.is_valid(body, timestamp, signature):
            return "bad signature"
        return None

    def _accept(self, action: ActionRequest) -> web.Response:
        if not self._approvers.allows(action):
            log.info("Slack action %s on %s refused for %s: not on the allow-list",
                     action.action, action.alert_id, action.user_id)
            return _ephemeral(f"You are not on the approver list for {action.rule}.")
        task = asyncio.create_task(self._perform(action))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return _ephemeral(f"{_doing(action)} {action.rule}…")

    async def _perform(self, action: ActionRequest) -> None:
        """The slow part, after Slack has its answer: act, then say so on the message."""
        try:
            detail = await self._dispatch(action)
            note = _note(action, detail)
        except Exception as exc:
            log.error("Slack action %s on %s failed: %s", action.action, action.alert_id,
                      type(exc).__name__)
            note = f":x: {action.action} by <@{action.user_id}> failed; see the worker's log"
        if self._notes is None or not action.channel_id or not action.message_ts:
            return
        try:
            await self._notes.annotate(action.channel_id, action.message_ts, note)
        except Exception as exc:
            log.error("could not note Slack action on the message: %s", exc)

    async def _dispatch(self, action: ActionRequest) -> str | None:
        if action.action == "snooze":
            return await self._actions.snooze(action, timedelta(seconds=action.duration_s or 0))
        if action.action == "keep":
            return await self._actions.keep(action, timedelta(seconds=action.duration_s or 0))
        if action.action == "lift":
            return await self._actions.lift(action)
        return await self._actions.approve(action)

    async def drain(self) -> None:
        """Wait for the actions still in flight (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def make_actions_handler(*, signing_secret: str, actions: AlertActions,
                         approvers: ApproverPolicy, replay_guard: ReplayGuard,
                         notes: MessageNotes | None = None,
                         keep_for: timedelta = timedelta(days=1),
                         clock: Callable[[], float] = time.time) -> SlackActionsHandler:
    """The handler for ``POST /slack/actions`` (``SLACK_SIGNING_SECRET`` as ``signing_secret``;
    the notifier as ``notes``, so the message says who pressed what)."""
    return SlackActionsHandler(signing_secret=signing_secret, actions=actions,
                               approvers=approvers, replay_guard=replay_guard, notes=notes,
                               keep_for=keep_for, clock=clock)


def add_actions_route(app: web.Application, handler: SlackActionsHandler,
                      path: str = "/slack/actions") -> None:
    app.router.add_post(path, handler)


# ── parsing ────────────────────────────────────────────────────────────────────────────────


async def _read_body(request: web.Request) -> bytes:
    if (request.content_length or 0) > MAX_BODY:
        raise BadRequest("body too large")
    try:
        body = await request.content.read(MAX_BODY + 1)
    except (OSError, ValueError, web.RequestPayloadError):  # e.g. a gzip body that is not gzip
        raise BadRequest("unreadable body") from None
    if len(body) > MAX_BODY:
        raise BadRequest("body too large")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body is not UTF-8") from None
    return body


def parse_action(body: bytes, keep_for: timedelta) -> ActionRequest:
    """A signed form body → the button press it describes, or :class:`BadRequest`."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(form["payload"][0])
        if not isinstance(payload, dict) or payload.get("type") != "block_actions":
            raise BadRequest("not a block_actions payload")
        pressed = payload["actions"][0]
        action_id, value = _action_and_value(pressed)
        user = payload["user"]
        channel = _optional_text((payload.get("channel") or {}).get("id"))
        container = payload.get("container") or {}
        message_ts = _optional_text(container.get("message_ts")
                                    or (payload.get("message") or {}).get("ts"))
        return ActionRequest(
            action=_verb(action_id), alert_id=_field(value, "alert_id"),
            rule=_field(value, "rule"), resource_id=_optional_text(value.get("resource_id")),
            duration_s=SNOOZE_ACTIONS.get(action_id) or
            (int(keep_for.total_seconds()) if action_id == KEEP_ACTION else None),
            user_id=_field(user, "id"), user_name=str(user.get("username") or user["id"]),
            channel_id=channel, message_ts=message_ts)
    except BadRequest:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, UnicodeError,
            RecursionError):
        raise BadRequest("malformed payload") from None


def _action_and_value(pressed: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Buttons name the action in ``action_id``; a digest's menu names it in the value."""
    action_id = str(pressed["action_id"])
    raw = pressed["selected_option"]["value"] if action_id == DIGEST_MENU_ACTION else pressed[
        "value"]
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise BadRequest("malformed action value")
    if action_id == DIGEST_MENU_ACTION:
        action_id = str(value.get("action"))
    if action_id not in (*SNOOZE_ACTIONS, KEEP_ACTION, APPROVE_ACTION, LIFT_ACTION):
        raise BadRequest(f"unknown action {action_id[:64]!r}")
    if action_id in (KEEP_ACTION, APPROVE_ACTION, LIFT_ACTION) and not value.get("resource_id"):
        raise BadRequest("keep, approve and lift need a resource or a group")
    return action_id, value


def _field(obj: Mapping[str, Any], name: str) -> str:
    value = obj[name]
    if not isinstance(value, str) or not value:
        raise BadRequest(f"missing {name}")
    return value


def _optional_text(value: Any) -> str | None:
    """An id Slack sends as a string, or nothing; any other type is a forged payload."""
    if value is None or isinstance(value, str):
        return value or None
    raise BadRequest("malformed payload")


def _verb(action_id: str) -> str:
    if action_id in SNOOZE_ACTIONS:
        return "snooze"
    return {KEEP_ACTION: "keep", LIFT_ACTION: "lift"}.get(action_id, "approve")


def _doing(action: ActionRequest) -> str:
    if action.action == "snooze":
        return f"Snoozing for {duration(action.duration_s or 0)}:"
    if action.action == "keep":
        return f"Keeping {action.resource_id} for {duration(action.duration_s or 0)}:"
    if action.action == "lift":
        return f"Lifting the enforcement on {action.resource_id}:"
    if _is_enforcement(action):
        return f"Approving the enforcement on {action.resource_id}:"
    return f"Approving the release of {action.resource_id}:"


def _note(action: ActionRequest, detail: str | None) -> str:
    """Who did what, for everyone reading the message."""
    who = f"<@{action.user_id}>"
    if action.action == "snooze":
        text = f":no_bell: Snoozed for {duration(action.duration_s or 0)} by {who}"
    elif action.action == "keep":
        text = (f":raised_hand: `{action.resource_id}` kept for "
                f"{duration(action.duration_s or 0)} by {who}")
    elif action.action == "lift":
        text = f":unlock: Enforcement on `{action.resource_id}` lifted by {who}"
    elif _is_enforcement(action):
        text = f":white_check_mark: Enforcement on `{action.resource_id}` approved by {who}"
    else:
        text = f":white_check_mark: Release of `{action.resource_id}` approved by {who}"
    return f"{text} ({detail})" if detail else text


def _is_enforcement(action: ActionRequest) -> bool:
    """An enforcement's alert (``<rule>/enforce/<group>``), not a reclamation's."""
    return "/enforce/" in action.alert_id


def _plain(status: int, reason: str) -> web.Response:
    return web.json_response({"ok": False, "error": reason}, status=status)


def _ephemeral(text: str) -> web.Response:
    return web.json_response({"response_type": "ephemeral", "replace_original": False,
                              "text": text})
