"""A receiver of Alertmanager webhook payloads that checks costline's signature, as an
integration (Grafana OnCall, a Teams bridge) behind a verifying proxy would."""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from costline.connectors.signature import sign

MAX_AGE_S = 300


@dataclass
class Received:
    at: float
    status: int
    idempotency_key: str | None
    payload: dict[str, Any]


@dataclass
class WebhookReceiver:
    """Answers 200 to signed payloads, 401 to anything else; ``refuse_next`` and
    ``fail_next`` make it answer 4xx or 5xx; ``delay_s`` slows every answer."""

    secret: str
    delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    _injected: list[int] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    async def start(self) -> WebhookReceiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> WebhookReceiver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def refuse_next(self, status: int = 422) -> None:
        self._injected.append(status)

    def fail_next(self, times: int, status: int = 503) -> None:
        self._injected.extend([status] * times)

    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.status == 200]

    async def _handle(self, request: web.Request) -> web.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        body = await request.read()
        timestamp = request.headers.get("X-Costline-Timestamp", "")
        signature = request.headers.get("X-Costline-Signature", "")
        fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) <= MAX_AGE_S
        valid = fresh and hmac.compare_digest(sign(self.secret, timestamp, body), signature)
        status = 200 if valid else 401
        if valid and self._injected:
            status = self._injected.pop(0)
        payload = json.loads(body) if valid else {}
        self.received.append(Received(time.time(), status, request.headers.get(
            "Idempotency-Key"), payload))
        return web.json_response({"ok": status == 200}, status=status)


class WebhookReceiverThread:
    """The receiver on an event loop of its own thread, for the worker's tests."""

    def __init__(self, secret: str, delay_s: float = 0.0) -> None:
        self.receiver = WebhookReceiver(secret, delay_s)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.ready = threading.Event()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.receiver.start())
        self.ready.set()
        self.loop.run_forever()

    def start(self) -> str:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("the webhook receiver did not start")
        return self.receiver.url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.receiver.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
