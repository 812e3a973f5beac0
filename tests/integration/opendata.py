"""A worker serving the API, the dashboard and the gauges, for the tests that read them: its
namespace, a price book and rules of its own, a bearer token, and HTTP helpers."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costline.rules.durations import period_bounds
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import (
    REPO,
    Ledger,
    Worker,
    free_port,
    produce,
    usage_event,
    wait_caught_up,
    worker_env,
)

TOKEN = "test-token-5a1f0c"  # noqa: S105 - a test's own token
LIMIT = 150
RULES = f"""
rules:
  - name: prod-monthly
    kind: budget
    match: {{env: prod}}
    group_by: [team]
    period: month
    limit: {LIMIT}
    warn_at: [0.5, 0.8]
    forecast: true
    notify: {{slack: "#ml-budgets"}}
"""
FAULTS = ("node_failure", "comm_timeout", "oom")


@dataclass
class Site:
    """The worker and what was sent to it."""

    env: dict[str, str]
    worker: Worker
    folder: Path
    usage: Ledger = field(default_factory=Ledger)
    faults: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['COSTLINE_WEB_PORT']}"

    @property
    def namespace(self) -> str:
        return self.env["COSTLINE_NAMESPACE"]

    def get(self, path: str, token: str | None = TOKEN, base: str | None = None
            ) -> tuple[int, bytes]:
        request = urllib.request.Request((base or self.url) + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def api(self, path: str, base: str | None = None) -> Any:
        status, body = self.get(path, base=base)
        assert status == 200, (path, status, body[:500])
        return json.loads(body)

    def send(self, usage: list[dict[str, Any]], faults: Sequence[dict[str, Any]] = (),
             counted: bool = True) -> None:
        """Produce events and wait until the worker has taken them in; ``counted``: they
        are valid, and the independent ledger counts them."""
        bootstrap = self.env["COSTLINE_KAFKA_BOOTSTRAP"]
        produce(bootstrap, f"{self.namespace}.usage.v1",
                [(e["event_id"].encode(), json.dumps(e).encode()) for e in usage])
        if faults:
            produce(bootstrap, f"{self.namespace}.faults.v1",
                    [(e["event_id"].encode(), json.dumps(e).encode()) for e in faults])
        for event in usage if counted else ():
            self.usage.count(event)
        self.faults.extend(faults)
        wait_caught_up(self.env, self.worker)

    def events(self, count: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``count`` usage events and a few faults in the last 30 hours of this month."""
        rng = random.Random(seed)
        now = time.time()
        first, last = max(period_bounds(now, "month", "UTC")[0], now - 30 * 3600), now - 120
        usage = [usage_event(rng, f"u{seed}-{i}", rng.uniform(first, last))
                 for i in range(count)]
        faults = [{"event_id": f"f{seed}-{i}", "kind": "fault", "ts": rng.uniform(first, last),
                   "fault": rng.choice(FAULTS), "resource_type": "gpu.h100",
                   "units": rng.choice([8, 16]), "lost_seconds": rng.randrange(60, 1800),
                   "recovery_seconds": rng.randrange(30, 600),
                   "tags": {"team": rng.choice(["pretrain", "eval"]), "env": "prod",
                            "job": f"run-{rng.randrange(9)}"}}
                  for i in range(count // 20)]
        return usage, faults

    def wait_for(self, what: str, check: Any, timeout: float = 60) -> Any:
        deadline = time.time() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.time() > deadline:
                raise AssertionError(f"{what}: not after {timeout} s")
            time.sleep(0.3)


def open_site(services: Any, namespace: str, folder: Path) -> Iterator[Site]:
    """A worker with the API's token, the rules above and a price book of its own."""
    rules, prices = folder / "rules.yaml", folder / "prices.yaml"
    rules.write_text(RULES)
    shutil.copy(REPO / "rules" / "prices" / "example.yaml", prices)
    env = worker_env(namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_PRICES=str(prices),
                     COSTLINE_RULES_TICK_S="1", COSTLINE_METRICS_REFRESH_S="1",
                     COSTLINE_API_TOKEN=TOKEN, COSTLINE_METRICS_SPEND_KEYS="team,env")
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=namespace,
                           partitions=4))
    worker = Worker(env, folder / "worker.log")
    worker.start()
    site = Site(env, worker, folder)
    try:
        site.wait_for("the worker's web port", lambda: _answers(site.url + "/healthz"), 90)
        yield site
    finally:
        worker.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # 503 while degraded: the server is up
    except OSError:
        return False


@dataclass
class Serve:
    """``costline serve`` beside the worker, on its own port."""

    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)


def start_serve(site: Site) -> Serve:
    port = free_port()
    log = (site.folder / "serve.log").open("ab")
    process = subprocess.Popen([sys.executable, "-m", "costline.streams", "serve", "--host",
                                "127.0.0.1", "--port", str(port)], cwd=REPO, env=site.env,
                               stdout=log, stderr=subprocess.STDOUT)
    served = Serve(process, f"http://127.0.0.1:{port}")
    site.wait_for("costline serve", lambda: _answers(served.url + "/healthz"), 60)
    return served
