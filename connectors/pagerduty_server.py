"""A local stand-in for PagerDuty's Events API v2, so the notifier runs end to end offline.

``POST /v2/enqueue`` checks an event the way the documented API does and answers like it: 202
``{"status": "success", "message": "Event processed", "dedup_key": ...}`` for an event it took;
400 ``{"status": "invalid event", "message": "Event object is invalid", "errors": [...]}`` for
one it never will (a routing key that is not 32 characters, an unknown ``event_action``, a
trigger without ``payload.summary``, ``source`` or a known ``severity``, ...); 429 when the
service's events arrive too quickly (``rate_limit`` per minute per routing key, or as a test
asks). Alerts follow PagerDuty's de-duplication: a trigger opens an alert or adds to the open
one with its ``dedup_key``; acknowledge and resolve act on an open alert and are dropped
otherwise; a trigger after a resolve opens a new alert.

Tests steer it (throttle or fail the next N events, slow every answer) and read back every
event and every alert. Run on its own: ``python -m costline.connectors.pagerduty_server``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

MAX_BYTES = 512 * 1024
ACTIONS = ("trigger", "acknowledge", "resolve")
SEVERITIES = ("critical", "error", "warning", "info")
THROTTLED = {"status": "throttle event",
             "message": "Requests for this service are arriving too quickly. Please retry later."}


@dataclass
class Event:
    """One request as the server saw it; the routing key is kept only as its last four
    characters."""

    at: float
    status: int
    action: str | None
    dedup_key: str | None
    key_tail: str | None
    body: dict[str, Any]


@dataclass
class Alert:
    """A PagerDuty alert: opened by a trigger, closed by a resolve."""

    number: int
    routing_key_tail: str
    dedup_key: str
    status: str = "triggered"
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.status != "resolved"


@dataclass
class Injection:
    remaining: int
    status: int
    retry_after: int | None = None


class LocalPagerDuty:
    """The server: an aiohttp app plus the state tests inspect."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 rate_limit: int | None = None, delay_s: float = 0.0) -> None:
        self.host = host
        self.port = port
        self.rate_limit = rate_limit
        self.delay_s = delay_s
        self.events: list[Event] = []
        self.alerts: list[Alert] = []
        self._injections: deque[Injection] = deque()
        self._recent: dict[str, deque[float]] = {}
        self.app = web.Application(client_max_size=MAX_BYTES * 2)
        self.app.router.add_post("/v2/enqueue", self._enqueue)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The base URL (``COSTLINE_PAGERDUTY_URL``)."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> LocalPagerDuty:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> LocalPagerDuty:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ── steering and reading back ─────────────────────────────────────────────────────────

    def throttle_next(self, events: int, *, retry_after: int | None = None) -> None:
        """Answer the next ``events`` with 429 (with ``Retry-After`` when given)."""
        self._injections.append(Injection(events, 429, retry_after))

    def fail_next(self, events: int, *, status: int = 500) -> None:
        self._injections.append(Injection(events, status))

    def accepted(self) -> list[Event]:
        return [event for event in self.events if event.status == 202]

    def alert(self, dedup_key: str) -> Alert | None:
        """The latest alert with this ``dedup_key``."""
        found = [alert for alert in self.alerts if alert.dedup_key == dedup_key]
        return found[-1] if found else None

    # ── the API ───────────────────────────────────────────────────────────────────────────

    async def _enqueue(self, request: web.Request) -> web.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        raw = await request.read()
        body, errors = _parse(raw)
        key = body.get("routing_key") if isinstance(body.get("routing_key"), str) else None
        event = Event(time.time(), 202, body.get("event_action"), body.get("dedup_key"),
                      key[-4:] if key else None,
                      {k: v for k, v in body.items() if k != "routing_key"})
        self.events.append(event)
        injected = self._injected()
        if injected is not None:
            event.status = injected.status
            headers = ({"Retry-After": str(injected.retry_after)}
                       if injected.retry_after is not None else {})
            answer = THROTTLED if injected.status == 429 else {"status": "error"}
            return web.json_response(answer, status=injected.status, headers=headers)
        if errors:
            event.status = 400
            return web.json_response({"status": "invalid event",
                                      "message": "Event object is invalid",
                                      "errors": errors}, status=400)
        assert key is not None
        if self._throttled(key):
            event.status = 429
            return web.json_response(THROTTLED, status=429)
        dedup_key = body.get("dedup_key") or uuid.uuid4().hex
        self._apply(key, dedup_key, body)
        return web.json_response({"status": "success", "message": "Event processed",
                                  "dedup_key": dedup_key}, status=202)

    def _injected(self) -> Injection | None:
        while self._injections and self._injections[0].remaining <= 0:
            self._injections.popleft()
        if not self._injections:
            return None
        injection = self._injections[0]
        injection.remaining -= 1
        return injection

    def _throttled(self, key: str) -> bool:
        if self.rate_limit is None:
            return False
        now = time.monotonic()
        recent = self._recent.setdefault(key, deque())
        while recent and recent[0] < now - 60:
            recent.popleft()
        if len(recent) >= self.rate_limit:
            return True
        recent.append(now)
        return False

    def _apply(self, key: str, dedup_key: str, body: dict[str, Any]) -> None:
        """PagerDuty's de-duplication by routing key and ``dedup_key``."""
        action = body["event_action"]
        current = next((a for a in reversed(self.alerts) if a.dedup_key == dedup_key
                        and a.routing_key_tail == key[-4:] and a.open), None)
        if current is None:
            if action != "trigger":
                return  # dropped: nothing open to acknowledge or resolve
            current = Alert(len(self.alerts) + 1, key[-4:], dedup_key)
            self.alerts.append(current)
        current.events.append({k: v for k, v in body.items() if k != "routing_key"})
        if action == "acknowledge":
            current.status = "acknowledged"
        elif action == "resolve":
            current.status = "resolved"


def _parse(raw: bytes) -> tuple[dict[str, Any], list[str]]:
    """The event and what is wrong with it, as the Events API documents it."""
    if len(raw) > MAX_BYTES:
        return {}, ["Event object is larger than 512 KB"]
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}, ["Event object is not valid JSON"]
    if not isinstance(body, dict):
        return {}, ["Event object must be a JSON object"]
    errors: list[str] = []
    key = body.get("routing_key")
    if not isinstance(key, str):
        errors.append("'routing_key' is missing or blank")
    elif len(key) != 32:
        errors.append("Length of 'routing_key' is incorrect (should be 32 characters)")
    action = body.get("event_action")
    if action not in ACTIONS:
        errors.append("'event_action' is invalid (must be one of: trigger, acknowledge, "
                      "resolve)")
    dedup = body.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or not dedup or len(dedup) > 255):
        errors.append("'dedup_key' must be a string of at most 255 characters")
    if action in ("acknowledge", "resolve") and not dedup:
        errors.append("'dedup_key' is required for acknowledge and resolve events")
    if action == "trigger":
        errors += _payload_errors(body.get("payload"))
    for name in ("client", "client_url"):
        if name in body and not isinstance(body[name], str):
            errors.append(f"'{name}' must be a string")
    for name, needed in (("links", "href"), ("images", "src")):
        items = body.get(name, [])
        if not isinstance(items, list) or not all(
                isinstance(item, dict) and isinstance(item.get(needed), str) for item in items):
            errors.append(f"'{name}' must be a list of objects with '{needed}'")
    return body, errors


def _payload_errors(payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        return ["'payload' is missing or not an object"]
    errors = []
    summary = payload.get("summary")
    if not isinstance(summary, str) or not summary:
        errors.append("'payload.summary' is missing or blank")
    elif len(summary) > 1024:
        errors.append("'payload.summary' is longer than 1024 characters")
    if not isinstance(payload.get("source"), str) or not payload.get("source"):
        errors.append("'payload.source' is missing or blank")
    if payload.get("severity") not in SEVERITIES:
        errors.append("'payload.severity' is invalid (must be one of: critical, error, "
                      "warning, info)")
    stamp = payload.get("timestamp")
    if stamp is not None:
        try:
            datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            errors.append("'payload.timestamp' is not an ISO 8601 timestamp")
    for name in ("component", "group", "class"):
        if name in payload and not isinstance(payload[name], str):
            errors.append(f"'payload.{name}' must be a string")
    if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
        errors.append("'payload.custom_details' must be an object")
    return errors


class LocalPagerDutyThread:
    """The server on an event loop of its own thread, for tests that run the worker as a
    separate process."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.server: LocalPagerDuty | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = LocalPagerDuty(**self._options)
        self.loop.run_until_complete(self.server.start())
        self.ready.set()
        self.loop.run_forever()

    def start(self) -> str:
        """Start serving; returns the base URL for ``COSTLINE_PAGERDUTY_URL``."""
        self.thread.start()
        if not self.ready.wait(10) or self.server is None:
            raise RuntimeError("the local PagerDuty server did not start")
        return self.server.url

    def stop(self) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _serve(args: argparse.Namespace) -> None:
    server = LocalPagerDuty(host=args.host, port=args.port, rate_limit=args.rate_limit)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    async with server:
        print(f"PagerDuty Events API v2 stand-in on {server.url}/v2/enqueue",
              file=sys.stderr, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m costline.connectors.pagerduty_server",
                                     description="Local PagerDuty Events API v2 stand-in.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8098)
    parser.add_argument("--rate-limit", type=int, default=None,
                        help="events per minute per routing key before answering 429")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
