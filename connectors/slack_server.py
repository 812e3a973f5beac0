"""A local Slack-compatible Web API, so the notifier runs end to end where Slack is unreachable.

It answers the five methods costline uses (``auth.test``, ``chat.postMessage``,
``chat.update``, ``conversations.list``, ``conversations.info``) the way Slack does: HTTP 200
with ``{"ok": false, "error": ...}`` for API errors, HTTP 429 with ``Retry-After`` when rate
limited, Slack-shaped ``ts`` values, Block Kit limits enforced. Tests steer it (rate limits and
failures for the next N calls) and read back every call and every channel's messages; the demo
prints each message as plain text.

Channel lookup follows Slack: ``chat.postMessage`` takes a name (``#ml-platform`` or
``ml-platform``) or an id; ``chat.update`` and ``conversations.info`` take an id only.

Run on its own: ``python -m costline.connectors.slack_server --port 8099 --echo``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from costline.connectors.slack_blocks import Block, block_errors, print_messages

DEFAULT_TOKEN = "xoxb-costline-local"
DEFAULT_CHANNELS = ("general", "ml-platform", "costline-alerts")
MAX_TEXT = 40_000
TEAM = {"team": "costline-local", "team_id": "T0COSTLINE", "user": "costline",
        "user_id": "U0COSTLINE", "bot_id": "B0COSTLINE"}


class ApiError(Exception):
    """An ``ok: false`` answer; Slack reports these with HTTP 200."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[Block]
    thread_ts: str | None = None
    edits: int = 0
    replies: list[Message] = field(default_factory=list)

    def as_slack(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text,
                                 "user": TEAM["user_id"], "bot_id": TEAM["bot_id"]}
        if self.blocks:
            shape["blocks"] = self.blocks
        if self.thread_ts:
            shape["thread_ts"] = self.thread_ts
        if self.edits:
            shape["edited"] = {"user": TEAM["user_id"], "ts": self.ts}
        return shape


@dataclass
class Channel:
    id: str
    name: str
    archived: bool = False
    messages: list[Message] = field(default_factory=list)

    def find(self, ts: str) -> Message | None:
        for message in self.messages:
            if message.ts == ts:
                return message
            for reply in message.replies:
                if reply.ts == ts:
                    return reply
        return None

    def as_slack(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "is_channel": True, "is_private": False,
                "is_archived": self.archived, "is_member": True,
                "name_normalized": self.name}


@dataclass
class RecordedCall:
    """One request as the server saw it, the token removed."""

    method: str
    params: dict[str, Any]
    at: float
    status: int = 200
    error: str | None = None


@dataclass
class Injection:
    remaining: int
    method: str | None
    status: int
    error: str
    retry_after: int | None = None

    def applies_to(self, method: str) -> bool:
        return self.remaining > 0 and self.method in (None, method)


MessageListener = Callable[[str, Channel, Message], None]


def channel_id(name: str) -> str:
    """Stable ids, so a restarted demo server keeps the same channels."""
    return "C0" + hashlib.sha1(name.encode()).hexdigest()[:9].upper()


class LocalSlack:
    """The server: an aiohttp app plus the state tests inspect."""

    def __init__(self, *, tokens: Iterable[str] = (DEFAULT_TOKEN,),
                 channels: Iterable[str] = DEFAULT_CHANNELS, host: str = "127.0.0.1",
                 port: int = 0, on_message: MessageListener | None = None,
                 delay_s: float = 0.0) -> None:
        self._tokens = frozenset(tokens)
        self.host = host
        self.port = port
        self.on_message = on_message
        self.delay_s = delay_s
        """How long every answer takes, as over a real network."""
        self.calls: list[RecordedCall] = []
        self.channels: dict[str, Channel] = {}
        self._injections: list[Injection] = []
        self._last_ts = 0.0
        self._runner: web.AppRunner | None = None
        for name in channels:
            self.add_channel(name)
        self.app = web.Application()
        self.app.router.add_route("*", "/api/{method}", self._handle)

    # ── lifecycle ─────────────────────────────────────────────────────────────────────────

    @property
    def url(self) -> str:
        """The ``base_url`` for slack-sdk (``SLACK_API_URL``)."""
        return f"http://{self.host}:{self.port}/api/"

    async def start(self) -> LocalSlack:
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

    async def __aenter__(self) -> LocalSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ── steering and inspection ───────────────────────────────────────────────────────────

    def add_channel(self, name: str) -> Channel:
        name = name.lstrip("#")
        channel = Channel(channel_id(name), name)
        self.channels[channel.id] = channel
        return channel

    def archive(self, name_or_id: str) -> None:
        self.channel(name_or_id).archived = True

    def rate_limit_next(self, calls: int, *, retry_after: int = 1,
                        method: str | None = None) -> None:
        """Answer the next ``calls`` calls (of ``method``, or any) with 429 + Retry-After."""
        self._injections.append(Injection(calls, method, 429, "ratelimited", retry_after))

    def fail_next(self, calls: int, *, method: str | None = None, status: int = 500,
                  error: str = "internal_error") -> None:
        """Fail the next ``calls`` calls: HTTP ``status`` (200 means ``ok: false``)."""
        self._injections.append(Injection(calls, method, status, error))

    def channel(self, name_or_id: str) -> Channel:
        found = self._resolve(name_or_id, names=True)
        if found is None:
            raise KeyError(name_or_id)
        return found

    def messages(self, name_or_id: str) -> list[Message]:
        """Top-level messages of a channel, oldest first; replies hang off each."""
        return list(self.channel(name_or_id).messages)

    def replies(self, name_or_id: str, thread_ts: str) -> list[Message]:
        root = self.channel(name_or_id).find(thread_ts)
        return list(root.replies) if root else []

    def calls_to(self, method: str) -> list[RecordedCall]:
        return [call for call in self.calls if call.method == method]

    # ── request handling ──────────────────────────────────────────────────────────────────

    async def _handle(self, request: web.Request) -> web.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        method = request.match_info["method"]
        call = RecordedCall(method, {}, time.time())
        self.calls.append(call)
        try:
            params, token = await _read_request(request)
            call.params = params
            injected = self._injected(method)
            if injected is not None:
                return _injected_response(call, injected)
            self._authenticate(token)
            body = self._dispatch(method, params)
        except ApiError as exc:
            call.error = exc.error
            return web.json_response({"ok": False, "error": exc.error, **exc.extra})
        return web.json_response({"ok": True, **body})

    def _injected(self, method: str) -> Injection | None:
        for injection in self._injections:
            if injection.applies_to(method):
                injection.remaining -= 1
                return injection
        return None

    def _authenticate(self, token: str | None) -> None:
        if not token:
            raise ApiError("not_authed")
        if not any(hmac.compare_digest(token, known) for known in self._tokens):
            raise ApiError("invalid_auth")

    def _dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        handler = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "conversations.list": self._list,
            "conversations.info": self._info,
        }.get(method)
        if handler is None:
            raise ApiError("unknown_method")
        return handler(params)

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"url": "https://costline-local.slack.com/", **TEAM}

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._target(params, names=True)
        if channel.archived:
            raise ApiError("is_archived")
        text, blocks = _content(params)
        thread_ts = _optional_str(params.get("thread_ts"))
        message = Message(channel.id, self._next_ts(), text, blocks, thread_ts)
        if thread_ts:
            root = next((m for m in channel.messages if m.ts == thread_ts), None)
            if root is None:
                raise ApiError("thread_not_found")
            root.replies.append(message)
        else:
            channel.messages.append(message)
        self._announce("replied" if thread_ts else "posted", channel, message)
        return {"channel": channel.id, "ts": message.ts, "message": message.as_slack()}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._target(params, names=False)
        message = channel.find(_optional_str(params.get("ts")) or "")
        if message is None:
            raise ApiError("message_not_found")
        text, blocks = _content(params)
        message.text, message.blocks = text, blocks
        message.edits += 1
        self._announce("updated", channel, message)
        return {"channel": channel.id, "ts": message.ts, "text": text,
                "message": message.as_slack()}

    def _list(self, params: dict[str, Any]) -> dict[str, Any]:
        try:
            limit = max(1, min(1000, int(params.get("limit") or 100)))
            cursor = _optional_str(params.get("cursor"))
            start = int(base64.b64decode(cursor).decode().split(":")[1]) if cursor else 0
        except (ValueError, IndexError):
            raise ApiError("invalid_cursor") from None
        listed = [c for c in self.channels.values()
                  if not (c.archived and _truthy(params.get("exclude_archived")))]
        page = listed[start:start + limit]
        more = start + limit < len(listed)
        next_cursor = base64.b64encode(f"offset:{start + limit}".encode()).decode() if more else ""
        return {"channels": [c.as_slack() for c in page],
                "response_metadata": {"next_cursor": next_cursor}}

    def _info(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"channel": self._target(params, names=False).as_slack()}

    def _target(self, params: Mapping[str, Any], *, names: bool) -> Channel:
        raw = _optional_str(params.get("channel"))
        channel = self._resolve(raw, names=names) if raw else None
        if channel is None:
            raise ApiError("channel_not_found")
        return channel

    def _resolve(self, raw: str, *, names: bool) -> Channel | None:
        if raw in self.channels:
            return self.channels[raw]
        if not names:
            return None
        name = raw.lstrip("#")
        return next((c for c in self.channels.values() if c.name == name), None)

    def _next_ts(self) -> str:
        """Unique and increasing per server, like Slack's per-channel ``ts``."""
        self._last_ts = max(time.time(), self._last_ts + 0.000001)
        return f"{self._last_ts:.6f}"

    def _announce(self, event: str, channel: Channel, message: Message) -> None:
        if self.on_message is not None:
            self.on_message(event, channel, message)


# ── request parsing and validation ─────────────────────────────────────────────────────────


async def _read_request(request: web.Request) -> tuple[dict[str, Any], str | None]:
    """Params from query, form or JSON; the token from the header or the form, then dropped."""
    params: dict[str, Any] = dict(request.query)
    form_token: str | None = None
    if request.method == "POST" and request.content_type == "application/json":
        try:
            body = await request.json()
        except ValueError:
            raise ApiError("invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError("invalid_json")
        params.update(body)
    elif request.method == "POST":
        form = await request.post()
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
        form_token = _optional_str(params.get("token"))
    params.pop("token", None)
    header = request.headers.get("Authorization", "")
    bearer = header[7:].strip() if header.lower().startswith("bearer ") else None
    return params, bearer or form_token


def _injected_response(call: RecordedCall, injected: Injection) -> web.Response:
    call.status, call.error = injected.status, injected.error
    headers = {"Retry-After": str(injected.retry_after)} if injected.retry_after else None
    return web.json_response({"ok": False, "error": injected.error},
                             status=injected.status, headers=headers)


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _truthy(value: Any) -> bool:
    return value in (True, "true", "1", 1)


def _content(params: Mapping[str, Any]) -> tuple[str, list[Block]]:
    text = params.get("text")
    raw_blocks = params.get("blocks")
    if isinstance(raw_blocks, str):
        try:
            raw_blocks = json.loads(raw_blocks)
        except ValueError:
            raise ApiError("invalid_blocks", errors=["invalid JSON"]) from None
    if not text and not raw_blocks:
        raise ApiError("no_text")
    if text is not None and not isinstance(text, str):
        raise ApiError("invalid_arguments")
    if text and len(text) > MAX_TEXT:
        raise ApiError("msg_too_long")
    blocks: list[Block] = []
    if raw_blocks:
        errors = block_errors(raw_blocks)
        if errors:
            raise ApiError("invalid_blocks", errors=errors)
        blocks = raw_blocks
    return text or "", blocks


# ── command line ───────────────────────────────────────────────────────────────────────────


class LocalSlackThread:
    """The server on an event loop of its own thread: for the demo and for tests that run
    the worker as a separate process. ``echo`` prints every message as it arrives."""

    def __init__(self, channels: Iterable[str] = DEFAULT_CHANNELS, echo: bool = False,
                 delay_s: float = 0.0) -> None:
        self.channels = list(channels)
        self.echo = echo
        self.delay_s = delay_s
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.server: LocalSlack | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = LocalSlack(channels=self.channels,
                                 on_message=print_messages if self.echo else None,
                                 delay_s=self.delay_s)
        self.loop.run_until_complete(self.server.start())
        self.ready.set()
        self.loop.run_forever()

    @property
    def start_url(self) -> str:
        """The API base URL (``SLACK_API_URL``), starting the server on first use."""
        if not self.thread.is_alive():
            return self.start()
        assert self.server is not None
        return str(self.server.url)

    def start(self) -> str:
        """Start serving; returns the API base URL for ``SLACK_API_URL``."""
        self.thread.start()
        if not self.ready.wait(10) or self.server is None:
            raise RuntimeError("the local Slack server did not start")
        return str(self.server.url)

    def posted(self) -> int:
        return len(self.server.calls_to("chat.postMessage")) if self.server else 0

    def stop(self) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)



def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m costline.connectors.slack_server",
                                     description="Local Slack-compatible Web API for costline.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--channel", action="append", dest="channels",
                        help="a channel to create (repeatable)")
    parser.add_argument("--echo", action="store_true", help="print each message as text")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    token = os.environ.get("SLACK_BOT_TOKEN") or DEFAULT_TOKEN
    server = LocalSlack(tokens=[token], channels=args.channels or DEFAULT_CHANNELS,
                        host=args.host, port=args.port,
                        on_message=print_messages if args.echo else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    async with server:
        names = ", ".join(f"#{c.name}" for c in server.channels.values())
        print(f"Slack-compatible API on {server.url} (channels: {names}); token from "
              f"{'SLACK_BOT_TOKEN' if 'SLACK_BOT_TOKEN' in os.environ else 'the default'}",
              file=sys.stderr, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(_arguments(argv)))


if __name__ == "__main__":
    main()
