"""Secrets never leave the worker: not in its log, ``/metrics``, ``/healthz``, Kafka, Slack or
what the other notifiers send.

The real worker runs at debug log level with a distinctive ``SLACK_BOT_TOKEN``,
``SLACK_SIGNING_SECRET``, webhook signing secrets, PagerDuty routing key, SMTP password and Redis
password (a ``redis-server --requirepass`` of the test's own on a spare port). Usage drives a
budget alert to a local Slack server that accepts only that token, to PagerDuty's stand-in, a
webhook receiver and a mail server that requires that password; a button press signed with the
secret snoozes it, idle
samples make a webhook reclaim plan (its grace outlasts the test, so nothing is released), a bad
message goes to the dead-letter topic; then the Redis server is stopped so ``/healthz`` reports it
down. Everything captured is searched for every 12-character piece of each secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from pydantic import ValidationError

from costline.connectors.kafka import admin
from costline.connectors.pagerduty_server import LocalPagerDuty, LocalPagerDutyThread
from costline.connectors.slack_server import LocalSlack, LocalSlackThread, Message
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.conftest import unavailable
from tests.integration.smtp_server import USER, Mailbox, smtp_server
from tests.integration.streamkit import REPO, Worker, free_port, produce, read_all, worker_env
from tests.integration.webhook_receiver import WebhookReceiver, WebhookReceiverThread

pytestmark = pytest.mark.integration

TOKEN = "xoxb-" + secrets.token_hex(16)
SIGNING_SECRET = "sign" + secrets.token_hex(16)
REDIS_PASSWORD = "redispw" + secrets.token_hex(16)
WEBHOOK_SECRET = "whsec" + secrets.token_hex(16)
PAGERDUTY_KEY = secrets.token_hex(16)
NOTIFY_SECRET = "notify" + secrets.token_hex(16)
SMTP_PASSWORD = "smtppw" + secrets.token_hex(16)
SECRETS = {"SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
           "Redis password": REDIS_PASSWORD, "COSTLINE_WEBHOOK_SECRET": WEBHOOK_SECRET,
           "PagerDuty routing key": PAGERDUTY_KEY, "notify webhook secret": NOTIFY_SECRET,
           "SMTP password": SMTP_PASSWORD}
PIECE = 12
RULES = """
rules:
  - name: secret-daily
    kind: budget
    match: {{team: vault}}
    group_by: [team]
    period: day
    limit: 100
    warn_at: [0.5]
    severity: warning
    notify:
      slack: "#ml-budgets"
      pagerduty: {{routing_key_env: PD_VAULT_KEY}}
      webhook: {{url: "{webhook}", secret_env: VAULT_HOOK_SECRET}}
      email: [vault@example.com]
  - name: vault-idle
    kind: idle
    match: {{team: vault}}
    group_by: [team]
    metric: gpu_util
    below: 0.05
    for: 2m
    reclaim: {{connector: webhook, url: "http://127.0.0.1:9/release", grace: 1h}}
    notify: {{slack: "#ml-budgets"}}
"""


class TokenSlack(LocalSlackThread):
    """The local Slack server, accepting one bot token only."""

    def __init__(self, token: str, channels: Iterable[str]) -> None:
        super().__init__(channels)
        self.token = token

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = LocalSlack(tokens=[self.token], channels=self.channels)
        self.loop.run_until_complete(self.server.start())
        self.ready.set()
        self.loop.run_forever()


class DebugWorker(Worker):
    """``costline worker`` at debug level: the most a log can say."""

    def start(self) -> None:
        self.starts += 1
        handle = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "costline.streams", "worker", "--loglevel", "debug"],
            cwd=REPO, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True)


class PasswordRedis:
    """A ``redis-server`` of the test's own that requires a password."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis-server", "not installed")
        self.port = free_port()
        self.url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--requirepass", REDIS_PASSWORD, "--save", "", "--appendonly", "no",
             "--dir", str(folder)],
            stdout=(folder / "redis.log").open("ab"), stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.time() + 20
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                assert time.time() < deadline, "redis-server did not start"
                time.sleep(0.1)
        client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[PasswordRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = PasswordRedis(folder)
    yield server
    server.stop()


@pytest.fixture
def slack() -> Iterator[TokenSlack]:
    server = TokenSlack(TOKEN, ["ml-budgets", "costline-alerts"])
    server.start()
    yield server
    server.stop()


class Others:
    """The other channels' receiving ends, and the worker's environment that reaches them."""

    def __init__(self, pagerduty: LocalPagerDuty, webhook: WebhookReceiver, mailbox: Mailbox,
                 env: dict[str, str]) -> None:
        self.pagerduty, self.webhook, self.mailbox, self.env = pagerduty, webhook, mailbox, env

    def all_got_it(self) -> bool:
        return bool(self.pagerduty.accepted() and self.webhook.accepted()
                    and self.mailbox.received)


@pytest.fixture
def others(tmp_path: Path) -> Iterator[Others]:
    pagerduty = LocalPagerDutyThread()
    webhook = WebhookReceiverThread(NOTIFY_SECRET)
    mailbox = Mailbox()
    with smtp_server(tmp_path, "starttls", mailbox, SMTP_PASSWORD) as (port, ca_file):
        env = {"COSTLINE_PAGERDUTY_URL": pagerduty.start(), "PD_VAULT_KEY": PAGERDUTY_KEY,
               "VAULT_HOOK_SECRET": NOTIFY_SECRET, "WEBHOOK_URL": webhook.start(),
               "COSTLINE_SMTP_HOST": "127.0.0.1", "COSTLINE_SMTP_PORT": str(port),
               "COSTLINE_SMTP_USERNAME": USER, "COSTLINE_SMTP_PASSWORD": SMTP_PASSWORD,
               "COSTLINE_SMTP_CA_FILE": str(ca_file)}
        assert pagerduty.server is not None
        try:
            yield Others(pagerduty.server, webhook.receiver, mailbox, env)
        finally:
            pagerduty.stop()
            webhook.stop()


def wait(condition: Callable[[], Any], what: str, worker: Worker, timeout: float = 120.0) -> Any:
    deadline = time.time() + timeout
    while True:
        found = condition()
        if found:
            return found
        assert worker.alive(), f"the worker died; see {worker.log}"
        assert time.time() < deadline, f"timed out waiting for {what}; see {worker.log}"
        time.sleep(0.25)


def get(port: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def press(port: str, message: Message, channel_id: str, secret: str) -> tuple[int, str]:
    """Press the message's first Snooze button the way Slack posts it, signed with ``secret``."""
    actions = next(block for block in message.blocks if block["type"] == "actions")
    button = next(e for e in actions["elements"] if e["action_id"].startswith("costline.snooze"))
    payload = {"type": "block_actions", "user": {"id": "U0ADA", "username": "ada"},
               "channel": {"id": channel_id}, "message": message.as_slack(),
               "container": {"type": "message", "message_ts": message.ts,
                             "channel_id": channel_id},
               "actions": [{"type": "button", "block_id": actions["block_id"],
                            "action_id": button["action_id"], "value": button["value"]}]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = str(int(time.time()))
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/slack/actions", data=body, method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded",
                 "X-Slack-Request-Timestamp": timestamp,
                 "X-Slack-Signature": f"v0={digest.hexdigest()}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def pieces(secret: str) -> set[str]:
    return {secret[i:i + PIECE] for i in range(len(secret) - PIECE + 1)}


def leaks(captured: dict[str, str]) -> list[str]:
    """``"<secret> in <where>"`` for every secret of which any piece shows anywhere."""
    return [f"{name} in {where}" for where, text in captured.items()
            for name, secret in SECRETS.items() if any(p in text for p in pieces(secret))]


def usage(event_id: str, quantity: float) -> tuple[bytes, bytes]:
    event = {"event_id": event_id, "kind": "usage", "ts": time.time() - 60,
             "resource_id": "vault-pool", "resource_type": "gpu.h100", "unit": "gpu_hour",
             "quantity": quantity, "tags": {"team": "vault", "job": "sweep"}}
    return event_id.encode(), json.dumps(event).encode()


def idle_samples(node: str) -> list[tuple[bytes, bytes]]:
    """Three minutes below the line, and samples up to four minutes ahead."""
    now = time.time()
    return [(node.encode(), json.dumps({
        "event_id": f"util-{node}-{i}", "kind": "utilization", "ts": now - 180 + 30 * i,
        "resource_id": node, "resource_type": "gpu.h100", "metric": "gpu_util",
        "value": 0.01, "tags": {"team": "vault", "job": "notebook"}}).encode())
        for i in range(15)]


def steps(bootstrap: str, topic: str) -> set[str]:
    return {json.loads(record.value).get("step") for record in read_all(bootstrap, topic, 2)}


def test_no_secret_reaches_the_log_metrics_health_kafka_or_any_channel(
        kafka_bootstrap: str, kafka_namespace: str, password_redis: PasswordRedis,
        slack: TokenSlack, others: Others, tmp_path: Path) -> None:
    namespace = kafka_namespace
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(webhook=others.env.pop("WEBHOOK_URL")))
    env = worker_env(namespace, kafka_bootstrap, password_redis.url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="2",
                     COSTLINE_STATE_DIR=str(tmp_path / "state"),
                     SLACK_BOT_TOKEN=TOKEN, SLACK_API_URL=slack.start_url,
                     SLACK_SIGNING_SECRET=SIGNING_SECRET, COSTLINE_WEBHOOK_SECRET=WEBHOOK_SECRET,
                     **others.env)
    port = env["COSTLINE_WEB_PORT"]
    create_topics(Settings(kafka_bootstrap=kafka_bootstrap, namespace=namespace, partitions=2))
    server = slack.server
    assert server is not None
    worker = DebugWorker(env, tmp_path / "worker.log")
    worker.start()
    captured: dict[str, str] = {}
    try:
        produce(kafka_bootstrap, f"{namespace}.usage.v1", [
            usage("v-1", 24.1),  # 60.01 USD: past the 50% line of 100
            (b"bad", b'{"event_id": "v-2", "kind": "usage", "quantity": -1}'),
            *idle_samples("vault-node-1"),
        ])
        root = wait(lambda: next(iter(server.messages("ml-budgets")), None),
                    "the alert in Slack", worker)
        assert "secret-daily" in root.text
        wait(others.all_got_it, "the alert on PagerDuty, the webhook and in email", worker)
        assert others.mailbox.logins == [("PLAIN", True)] * len(others.mailbox.logins)

        status, answer = press(port, root, server.channel("ml-budgets").id, SIGNING_SECRET)
        assert status == 200 and "Snoozing" in answer, answer
        wait(lambda: any("Snoozed" in reply.text for reply in root.replies),
             "the note of the snooze", worker)
        forged = press(port, root, server.channel("ml-budgets").id, "not-" + SIGNING_SECRET)
        assert forged[0] == 401
        captured["/slack/actions answers"] = answer + forged[1]
        wait(lambda: "warned" in steps(kafka_bootstrap, f"{namespace}.actions.v1"),
             "the webhook reclaim plan and its warning", worker)

        status, metrics = get(port, "/metrics")
        assert status == 200 and 'costline_rejected_total{reason="missing_field"} 1' in metrics
        captured["/metrics"] = metrics
        status, health = get(port, "/healthz")
        assert status == 200, health
        captured["/healthz"] = health

        password_redis.stop()
        seen: list[str] = []

        def refused() -> bool:
            """Until /healthz says the connection to Redis's host and port is refused."""
            status, health = get(port, "/healthz")
            seen.append(health)
            problem = json.loads(health or "{}").get("problems", {}).get("redis", {})
            return status == 503 and f":{password_redis.port}" in problem.get("error", "")

        wait(refused, "/healthz to report Redis down", worker, timeout=60)
        captured["/healthz with Redis down"] = "\n".join(seen)
        time.sleep(3)  # a few failed Redis calls for the log
    finally:
        worker.stop()

    log = worker.log.read_text(errors="replace")
    assert "DEBUG" in log and len(log) > 10_000  # the worker did talk at debug level
    captured["worker log"] = log
    client = admin(kafka_bootstrap, timeout_s=10.0)
    try:
        topics = sorted(t for t in client.list_topics() if t.startswith(f"{namespace}."))
    finally:
        client.close()
    records = {topic: read_all(kafka_bootstrap, topic, timeout_s=3) for topic in topics}
    assert all(records[f"{namespace}.{name}.v1"] for name in ("usage", "alerts", "actions", "dlq"))
    for topic, found in records.items():
        captured[f"topic {topic}"] = "\n".join(
            repr((r.key, r.value, r.headers)) for r in found)
    methods = {call.method for call in server.calls}
    assert {"chat.postMessage", "chat.update"} <= methods
    assert not [call for call in server.calls if call.error in ("not_authed", "invalid_auth")]
    captured["Slack calls"] = json.dumps(
        [[call.method, call.params, call.error] for call in server.calls], default=str)
    captured["Slack messages"] = json.dumps(
        [[m.text, m.blocks, [r.text for r in m.replies]] for m in server.messages("ml-budgets")])
    captured["PagerDuty events"] = json.dumps([e.body for e in others.pagerduty.events])
    captured["webhook payloads"] = json.dumps([r.payload for r in others.webhook.received])
    captured["email"] = "\n".join(r.message.as_string() for r in others.mailbox.received)

    assert leaks(captured) == []


def test_the_leak_search_finds_a_piece_of_a_secret_anywhere() -> None:
    assert leaks({"log": f"connecting with ...{REDIS_PASSWORD[3:3 + PIECE]}..."}) == [
        "Redis password in log"]
    assert leaks({"log": TOKEN[: PIECE - 1], "page": SIGNING_SECRET[::-1]}) == []


def test_a_redis_url_redis_py_cannot_read_is_refused_without_quoting_it() -> None:
    url = f"redis://:{REDIS_PASSWORD[:9]}/{REDIS_PASSWORD[9:]}@127.0.0.1:6379/0"
    with pytest.raises(ValidationError) as caught:
        Settings(redis_url=url, web_port="not-a-port")
    said = str(caught.value)
    assert "redis_url" in said and "not a Redis URL" in said and "web_port" in said
    assert REDIS_PASSWORD[:9] not in said and REDIS_PASSWORD[9:] not in said


@pytest.mark.parametrize("url", [
    f"redis://:{REDIS_PASSWORD}@127.0.0.1:6379/0",
    f"rediss://costline:{REDIS_PASSWORD}@redis.internal:6380/0?ssl_ca_certs={{ca}}",
    "unix:///run/redis.sock?db=2",
])
def test_a_readable_redis_url_is_kept_as_given(url: str, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"  # the settings check that a named CA file exists
    ca.write_text("")
    url = url.replace("{ca}", str(ca))
    assert Settings(redis_url=url).redis_url == url
