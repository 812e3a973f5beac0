"""A real Prometheus Alertmanager on loopback, from Debian's ``prometheus-alertmanager``.

``.ci/run`` installs the package; where the binary is missing the tests that need it are
unavailable (skipped, or failed under ``REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.conftest import unavailable
from tests.integration.streamkit import free_port

BINARIES = ("prometheus-alertmanager", "alertmanager")
CONFIG = """
route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: "null"
"""


def binary() -> str:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    unavailable("Alertmanager", "prometheus-alertmanager is not installed "
                "(apt-get install prometheus-alertmanager)")


@contextmanager
def running_alertmanager(folder: Path) -> Iterator[str]:
    """An Alertmanager of its own on a spare port, alone (no cluster); yields its URL."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "alertmanager.yml"
    config.write_text(CONFIG)
    port = free_port()
    log = (folder / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [binary(), f"--config.file={config}", f"--storage.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                unavailable("Alertmanager", f"did not start; see {folder / 'alertmanager.log'}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def alerts(url: str) -> list[dict[str, Any]]:
    """The alerts the Alertmanager holds now (``GET /api/v2/alerts``: active, silenced and
    inhibited; an alert whose ``endsAt`` has passed is resolved and not listed)."""
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5) as answer:
        found: list[dict[str, Any]] = json.load(answer)
    return found


def received_total(url: str) -> int:
    """``alertmanager_alerts_received_total``, over firing and resolved."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("alertmanager_alerts_received_total{")))


def amtool(url: str, *args: str) -> Any:
    """``amtool --output=json ARGS`` against the Alertmanager at ``url``."""
    tool = shutil.which("amtool")
    if tool is None:
        unavailable("amtool", "not installed (it comes with prometheus-alertmanager)")
    done = subprocess.run([tool, f"--alertmanager.url={url}", "--output=json", *args],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class SlowFront:
    """A proxy before an Alertmanager that answers each ``POST /api/v2/alerts`` only after
    ``delay_s`` (as a distant Alertmanager would) and keeps every body it forwarded with its
    ``Idempotency-Key``, on an event loop of its own thread."""

    def __init__(self, target: str, delay_s: float) -> None:
        self.target = target
        self.delay_s = delay_s
        self.posted: list[tuple[int, list[dict[str, Any]]]] = []
        self.keys: list[str | None] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = free_port()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/api/v2/alerts", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _forward(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay_s)
        body = await request.read()
        async with aiohttp.ClientSession() as session, session.post(
                f"{self.target}/api/v2/alerts", data=body,
                headers={"Content-Type": "application/json"}) as answer:
            text = await answer.text()
            self.posted.append((answer.status, json.loads(body)))
            self.keys.append(request.headers.get("Idempotency-Key")
                             if answer.status == 200 else None)
            return web.Response(status=answer.status, text=text)

    def start(self) -> str:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self.url

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
