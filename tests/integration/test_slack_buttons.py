"""Slack's buttons against the real worker: a signed ``block_actions`` request, built as Slack
builds it from the message the worker posted, sent to the worker's ``/slack/actions``.

One worker serves the module: a budget rule (Snooze) and an idle rule whose releases need an
approver (Keep, Approve), with ``COSTLINE_SLACK_APPROVERS`` naming who may act on it.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import costline.streams.worker.app
from costline.connectors.slack_server import DEFAULT_TOKEN, LocalSlack, LocalSlackThread, Message
from costline.rules.engine import alert_id
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import Worker, cli_json, produce, read_all, worker_env

SIGNING_SECRET = "costline-buttons-" + secrets.token_hex(8)
BOSS = {"id": "U0BOSS", "username": "boss"}
EVE = {"id": "U0EVE", "username": "eve"}
ADA = {"id": "U0ADA", "username": "ada"}
RULES = """
rules:
  - name: team-daily
    kind: budget
    group_by: [team]
    period: day
    limit: 100
    warn_at: [0.5]
    notify: {slack: "#ml-budgets"}
  - name: idle-gpus
    kind: idle
    group_by: [team]
    metric: gpu_util
    below: 0.05
    for: 2m
    reclaim: {connector: dry_run, grace: 1h, approval: manual}
    notify: {slack: "#ml-gpu-idle"}
"""
IDLE_NODES = ("cluster-a/node-017", "cluster-a/node-018")


@dataclass
class Cluster:
    """The worker, its Slack, and what the tests need to reach them."""

    env: dict[str, str]
    worker: Worker
    slack: LocalSlack
    namespace: str
    bootstrap: str

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        deadline = time.time() + timeout
        while True:
            found = condition()
            if found:
                return found
            assert self.worker.alive(), f"the worker died; see {self.worker.log}"
            assert time.time() < deadline, f"timed out waiting for {what}; see {self.worker.log}"
            time.sleep(0.25)

    def root(self, channel: str, alert: str) -> Message | None:
        """The thread root that shows ``alert`` (its id is in the footer)."""
        for message in self.slack.messages(channel):
            if any(alert in json.dumps(block) for block in message.blocks):
                return message
        return None

    def alert_changes(self, alert: str) -> list[dict[str, Any]]:
        records = read_all(self.bootstrap, f"{self.namespace}.alerts.v1", timeout_s=3)
        return [r for r in (json.loads(m.value) for m in records) if r["alert_id"] == alert]

    def press(self, message: Message, action_id: str, user: dict[str, str]
              ) -> tuple[int, dict[str, Any]]:
        """Press a button of ``message`` the way Slack reports it, signed with the secret."""
        actions = next(b for b in message.blocks if b["type"] == "actions")
        button = next(e for e in actions["elements"] if e["action_id"] == action_id)
        channel = self.slack.channels[message.channel]
        pressed = {"type": "button", "block_id": actions["block_id"], "action_id": action_id,
                   "text": button["text"], "value": button["value"],
                   "action_ts": f"{time.time():.6f}"}
        if "style" in button:
            pressed["style"] = button["style"]
        payload = {
            "type": "block_actions",
            "user": {**user, "name": user["username"], "team_id": "T0COSTLINE"},
            "api_app_id": "A0COSTLINE", "token": "unused-verification-token",
            "container": {"type": "message", "message_ts": message.ts,
                          "channel_id": channel.id, "is_ephemeral": False},
            "trigger_id": f"{int(time.time())}.1234.{secrets.token_hex(8)}",
            "team": {"id": "T0COSTLINE", "domain": "costline-local"},
            "enterprise": None, "is_enterprise_install": False,
            "channel": {"id": channel.id, "name": channel.name},
            "message": message.as_slack(), "state": {"values": {}},
            "response_url": "https://hooks.slack.com/actions/T0COSTLINE/1/unused",
            "actions": [pressed],
        }
        body = urlencode({"payload": json.dumps(payload)}).encode()
        timestamp = str(int(time.time()))
        signature = hmac.new(SIGNING_SECRET.encode(), f"v0:{timestamp}:".encode() + body,
                             hashlib.sha256).hexdigest()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.env['COSTLINE_WEB_PORT']}/slack/actions", data=body,
            method="POST", headers={"Content-Type": "application/x-www-form-urlencoded",
                                    "X-Slack-Request-Timestamp": timestamp,
                                    "X-Slack-Signature": f"v0={signature}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def _usage(team: str, quantity: float) -> tuple[bytes, bytes]:
    event = {"event_id": f"usage-{team}", "kind": "usage", "ts": time.time() - 60,
             "resource_id": f"{team}-pool", "resource_type": "gpu.h100", "unit": "gpu_hour",
             "quantity": quantity, "tags": {"team": team, "job": f"{team}-sweep"}}
    return team.encode(), json.dumps(event).encode()


def _idle_samples(node: str, team: str) -> list[tuple[bytes, bytes]]:
    """Three minutes below the line, and samples up to four minutes ahead (within what the
    worker accepts from the future), so the GPU stays idle while the module runs."""
    now = time.time()
    return [(node.encode(), json.dumps({
        "event_id": f"util-{node}-{i}", "kind": "utilization", "ts": now - 180 + 30 * i,
        "resource_id": node, "resource_type": "gpu.h100", "metric": "gpu_util",
        "value": 0.01, "tags": {"team": team, "job": f"{team}-notebook"}}).encode())
        for i in range(15)]


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, redis_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("buttons")
    namespace = "t" + secrets.token_hex(5)
    rules = folder / "rules.yaml"
    rules.write_text(RULES)
    slack = LocalSlackThread(["ml-budgets", "ml-gpu-idle", "costline-alerts"])
    env = worker_env(namespace, kafka_bootstrap, redis_url, COSTLINE_RULES=str(rules),
                     COSTLINE_RULES_TICK_S="2", SLACK_BOT_TOKEN=DEFAULT_TOKEN,
                     SLACK_API_URL=slack.start(), SLACK_SIGNING_SECRET=SIGNING_SECRET,
                     COSTLINE_SLACK_APPROVERS=json.dumps({"idle-gpus": [BOSS["id"]]}))
    create_topics(Settings(kafka_bootstrap=kafka_bootstrap, namespace=namespace, partitions=2))
    assert slack.server is not None
    worker = Worker(env, Path(folder) / "worker.log")
    worker.start()
    built = Cluster(env, worker, slack.server, namespace, kafka_bootstrap)
    try:
        produce(kafka_bootstrap, f"{namespace}.usage.v1", [
            _usage("eval", 24.1),
            *_idle_samples(IDLE_NODES[0], "research"), *_idle_samples(IDLE_NODES[1], "vision"),
        ])
        yield built
    finally:
        worker.stop()
        slack.stop()
        from costline.connectors.kafka import admin

        client = admin(kafka_bootstrap, timeout_s=10.0)
        try:
            client.delete_topics([t for t in client.list_topics()
                                  if t.startswith(f"{namespace}.")], raise_errors=False)
        finally:
            client.close()


def idle_alert(team: str, node: str) -> str:
    return alert_id("idle-gpus", {"team": team, "resource_id": node})


def test_snooze_creates_a_silence_and_the_alerts_next_change_is_silenced(
        cluster: Cluster) -> None:
    budget = alert_id("team-daily", {"team": "eval"})
    root = cluster.wait(lambda: cluster.root("ml-budgets", budget), "the budget alert")

    status, answer = cluster.press(root, "costline.snooze.1h", ADA)

    assert (status, answer["text"]) == (200, "Snoozing for 1h: team-daily…")
    [silence] = cluster.wait(lambda: cli_json(cluster.env, "silence", "list"), "the silence")
    assert (silence["rule"], silence["matchers"], silence["created_by"]) == (
        "team-daily", {"team": "eval"}, "ada")
    assert 3500 < silence["ends_at"] - silence["starts_at"] <= 3600
    states = cluster.wait(lambda: [c["state"] for c in cluster.alert_changes(budget)][1:],
                          "the change after the snooze")
    assert states == ["silenced"]
    cluster.wait(lambda: len(root.replies) >= 2, "the note and the silenced change in Slack")
    note = f":no_bell: Snoozed for 1h by <@{ADA['id']}> (until "
    assert sorted(r.text.startswith(note) for r in root.replies) == [False, True]
    assert sorted(r.text.startswith(":no_bell: Silenced: ") for r in root.replies) == [
        False, True]
    assert root.blocks[0]["text"]["text"] == ":no_bell: Silenced: team-daily"
    assert root.blocks[-1]["elements"][-1]["text"].startswith(note)


def test_approve_by_someone_off_the_allow_list_does_nothing_and_says_so(
        cluster: Cluster) -> None:
    alert = idle_alert("research", IDLE_NODES[0])
    root = cluster.wait(lambda: cluster.root("ml-gpu-idle", alert), "the idle alert")
    cluster.wait(lambda: [p for p in cli_json(cluster.env, "reclaim", "status")["plans"]
                          if p["resource_id"] == IDLE_NODES[0] and p["state"] == "warned"],
                 "the planned release")
    edits, calls = root.edits, len(cluster.slack.calls)

    status, answer = cluster.press(root, "costline.approve", EVE)

    assert (status, answer["text"]) == (200, "You are not on the approver list for idle-gpus.")
    assert answer["response_type"] == "ephemeral"
    [plan] = [p for p in cli_json(cluster.env, "reclaim", "status")["plans"]
              if p["resource_id"] == IDLE_NODES[0]]
    assert (plan["state"], plan["approved_by"]) == ("warned", None)
    assert not [s for s in cli_json(cluster.env, "silence", "list") if s["rule"] == "idle-gpus"]
    assert (root.edits, root.replies) == (edits, [])
    assert not [c for c in cluster.slack.calls[calls:]
                if c.params.get("ts") == root.ts or c.params.get("thread_ts") == root.ts]


def _keep_is_wired() -> bool:
    """Keep reaches reclamation only when the worker hands its reclaimer to the buttons."""
    source = inspect.getsource(costline.streams.worker.app)
    return "ReclaimActions(" in source and "reclaim=" in source


@pytest.mark.skipif(not _keep_is_wired(),
                    reason="streams/app.py does not hand a reclaimer to the Slack buttons, so "
                    "Keep has nothing to act on in this worker")
def test_keep_on_a_reclaim_alert_cancels_the_planned_release_and_notes_who(
        cluster: Cluster) -> None:
    alert = idle_alert("vision", IDLE_NODES[1])
    root = cluster.wait(lambda: cluster.root("ml-gpu-idle", alert), "the idle alert")
    cluster.wait(lambda: [p for p in cli_json(cluster.env, "reclaim", "status")["plans"]
                          if p["resource_id"] == IDLE_NODES[1] and p["state"] == "warned"],
                 "the planned release")

    status, answer = cluster.press(root, "costline.keep", BOSS)

    assert (status, answer["text"]) == (200, f"Keeping {IDLE_NODES[1]} for 1d: idle-gpus…")
    skipped = cluster.wait(lambda: [r for r in cli_json(cluster.env, "actions")
                                    if r["resource_id"] == IDLE_NODES[1]
                                    and r["step"] == "skipped"], "the cancelled release")
    assert [r["reason"].split(" until ")[0] for r in skipped] == ["kept by boss"]
    assert not [p for p in cli_json(cluster.env, "reclaim", "status")["plans"]
                if p["resource_id"] == IDLE_NODES[1]]
    cluster.wait(lambda: root.replies, "the note on the message")
    note = f":raised_hand: `{IDLE_NODES[1]}` kept for 1d by <@{BOSS['id']}> (until "
    assert root.replies[0].text.startswith(note)
    assert root.blocks[-1]["elements"][-1]["text"].startswith(note)
