"""kill -9 of the worker while its notifiers are sending a burst of 200 alerts, on every
channel at once: Slack, email (a real SMTP server), PagerDuty (the Events API stand-in), a
real Alertmanager and a webhook receiver. After a restart no alert change is lost on any
channel, and every message a channel got twice is one its ledger counted as ambiguous (the
channel may have taken a request whose answer died with the process). A notifier stopped
before its request left is not in doubt: nothing reached the channel, so nothing is counted or
marked as sent again."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from costline.connectors.alert_change import AlertChange
from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify.slack import AMBIGUOUS_MARK, SlackNotifier
from costline.connectors.pagerduty_server import LocalPagerDutyThread
from costline.connectors.redis_client import connect_async
from costline.connectors.slack_server import DEFAULT_TOKEN, LocalSlack, LocalSlackThread
from costline.rules.engine import alert_id
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.alertmanager import SlowFront, alerts, running_alertmanager
from tests.integration.smtp_server import PASSWORD, USER, Mailbox, smtp_server
from tests.integration.streamkit import Worker, produce, read_all, worker_env
from tests.integration.webhook_receiver import WebhookReceiverThread

OWNERS = [f"o-{i:03d}" for i in range(200)]
PD_KEY = "5e2c4a7f0b9d41e3a6c8f1d2b3e4a5c6"
HOOK_SECRET = "whsec-kill9-3c1e"
DELAY_S = 0.03
"""Every channel answers this late, as over a real network: the burst takes seconds, and
the kill lands in the middle of it."""
RULES = """
rules:
  - name: owner-daily
    kind: budget
    group_by: [owner]
    period: day
    limit: 100
    warn_at: [0.5]
    notify:
      route_by_tag: owner
      slack: "#costline-alerts"
      email: [finops@example.com]
      pagerduty: {{routing_key_env: PD_KEY}}
      alertmanager: {{url: "{alertmanager}", resolve_timeout: 1h}}
      webhook: {{url: "{webhook}", secret_env: HOOK_SECRET}}
"""
CHANNELS = ("slack", "email", "pagerduty", "alertmanager", "webhook")


@dataclass
class Channels:
    """Every channel's receiving end, as the test reads them."""

    slack: LocalSlack
    mailbox: Mailbox
    pagerduty: Any
    front: SlowFront
    webhook: Any

    def escalations(self) -> dict[str, int]:
        """Messages each channel got about an alert reaching its budget line."""
        slack = sum(len(m.replies) for o in OWNERS for m in self.slack.messages(o))
        mails = sum(1 for r in self.mailbox.received if r.message["In-Reply-To"])
        pages = sum(1 for e in self.pagerduty.accepted()
                    if e.body.get("payload", {}).get("class") == "limit")
        pushed = sum(1 for status, body in list(self.front.posted)
                     if status == 200 and len(body) == 1
                     and body[0]["annotations"]["line"] == "limit")
        hooks = sum(1 for r in self.webhook.accepted()
                    if r.idempotency_key and "|firing|limit|" in r.idempotency_key)
        return {"slack": slack, "email": mails, "pagerduty": pages, "alertmanager": pushed,
                "webhook": hooks}

    def firsts(self) -> dict[str, int]:
        """Alerts each channel got their first message about."""
        slack = sum(1 for o in OWNERS if self.slack.messages(o))
        mails = {o for r in self.mailbox.received if not r.message["In-Reply-To"]
                 for o in OWNERS if f"owner=#{o}" in str(r.message.get_body(("plain",))
                                                        .get_content())}
        pages = {e.dedup_key for e in self.pagerduty.accepted()
                 if e.body.get("payload", {}).get("class") == "warn_50"}
        pushed = {a["annotations"]["alert_id"] for status, body in list(self.front.posted)
                  if status == 200 for a in body if a["annotations"].get("line") == "warn_50"}
        hooks = {a["annotations"]["alert_id"] for r in self.webhook.accepted()
                 for a in r.payload["alerts"] if a["annotations"].get("line") == "warn_50"}
        return {"slack": slack, "email": len(mails), "pagerduty": len(pages),
                "alertmanager": len(pushed), "webhook": len(hooks)}


class Ledgers:
    """Every change the rule engine published, against what each channel's ledger says."""

    def __init__(self, bootstrap: str, redis_url: str, namespace: str) -> None:
        self.bootstrap, self.namespace = bootstrap, namespace
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)

    def published(self) -> list[AlertChange]:
        found = read_all(self.bootstrap, f"{self.namespace}.alerts.v1", timeout_s=3)
        return [AlertChange.from_record(json.loads(message.value)) for message in found]

    def steps(self, channel: str, change: AlertChange) -> dict[str, str]:
        key = f"{{{self.namespace}:{channel}}}:change:{change.thread_key}:{change.change_key}"
        return self.redis.hgetall(key)  # type: ignore[return-value]

    def undelivered(self, channel: str, published: list[AlertChange]) -> list[str]:
        """Changes with neither a root sent nor every later step done."""
        follow = {"update", "reply"} if channel == "slack" else {"reply"}
        missing = []
        for change in published:
            done = {s for s, m in self.steps(channel, change).items() if m.startswith("done")}
            if "root" not in done and not follow <= done:
                missing.append(f"{change.alert_id} {change.change_key}")
        return missing

    def sent(self, channel: str, published: list[AlertChange]) -> int:
        """Messages the ledger recorded as taken: each root once, each reply."""
        roots: set[str] = set()
        replies = 0
        for change in published:
            for step, marker in self.steps(channel, change).items():
                if marker.startswith("done ") and step == "root":
                    roots.add(marker)
                elif marker.startswith("done ") and step == "reply":
                    replies += 1
        return len(roots) + replies

    def sent_slack_ts(self, published: list[AlertChange]) -> set[str]:
        return {marker.split(" ", 1)[1] for change in published
                for step, marker in self.steps("slack", change).items()
                if step in ("root", "reply") and marker.startswith("done ")}

    def ambiguous(self, channel: str) -> int:
        return int(self.redis.hget(f"{{{self.namespace}:{channel}}}:counts", "ambiguous") or 0)


def wait_for(condition: Callable[[], bool], what: str, worker: Worker,
             timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert worker.alive(), f"the worker died; see {worker.log}"
        assert time.time() < deadline, f"timed out waiting for {what}; see {worker.log}"
        time.sleep(0.05)


def usage(stage: str, owner: str, quantity: float) -> tuple[bytes, bytes]:
    event = {"event_id": f"{stage}-{owner}", "kind": "usage", "ts": time.time() - 60,
             "resource_id": f"{owner}-node", "resource_type": "gpu.h100", "unit": "gpu_hour",
             "quantity": quantity, "tags": {"owner": f"#{owner}", "job": f"{owner}-run"}}
    return owner.encode(), json.dumps(event).encode()


@pytest.fixture
def channels(tmp_path: Path) -> Iterator[tuple[Channels, dict[str, str]]]:
    """Every channel on loopback, and the worker's environment that reaches them."""
    slack = LocalSlackThread([*OWNERS, "costline-alerts"], delay_s=DELAY_S)
    pagerduty = LocalPagerDutyThread(delay_s=DELAY_S)
    webhook = WebhookReceiverThread(HOOK_SECRET, delay_s=DELAY_S)
    mailbox = Mailbox(delay_s=DELAY_S)
    with running_alertmanager(tmp_path / "alertmanager") as am_url, \
            smtp_server(tmp_path, "starttls", mailbox) as (smtp_port, ca_file):
        front = SlowFront(am_url, DELAY_S)
        env = {"SLACK_BOT_TOKEN": DEFAULT_TOKEN, "SLACK_API_URL": slack.start_url,
               "COSTLINE_PAGERDUTY_URL": pagerduty.start(), "PD_KEY": PD_KEY,
               "HOOK_SECRET": HOOK_SECRET, "COSTLINE_SMTP_HOST": "127.0.0.1",
               "COSTLINE_SMTP_PORT": str(smtp_port), "COSTLINE_SMTP_USERNAME": USER,
               "COSTLINE_SMTP_PASSWORD": PASSWORD, "COSTLINE_SMTP_CA_FILE": str(ca_file),
               "AM_URL": front.start(), "HOOK_URL": webhook.start(), "AM_DIRECT": am_url}
        assert slack.server is not None and pagerduty.server is not None
        try:
            yield Channels(slack.server, mailbox, pagerduty.server, front,
                           webhook.receiver), env
        finally:
            for stop in (slack.stop, pagerduty.stop, webhook.stop, front.stop):
                stop()


def test_a_worker_killed_mid_burst_loses_nothing_on_any_channel(
        services: Any, kafka_namespace: str, tmp_path: Path,
        channels: tuple[Channels, dict[str, str]]) -> None:
    receivers, reach = channels
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(alertmanager=reach.pop("AM_URL"),
                                  webhook=reach.pop("HOOK_URL")))
    am_url = reach.pop("AM_DIRECT")
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_RULES=str(rules), COSTLINE_RULES_TICK_S="2", **reach)
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=2))
    ledgers = Ledgers(services.bootstrap, services.redis_url, kafka_namespace)
    usage_topic = f"{kafka_namespace}.usage.v1"
    worker = Worker(env, tmp_path / "worker.log")
    at_kill: dict[str, dict[str, int]] = {}

    def delivered(changes: int) -> bool:
        published = ledgers.published()
        return len(published) >= changes and not any(
            ledgers.undelivered(channel, published) for channel in CHANNELS)

    def started(read: Callable[[], dict[str, int]]) -> bool:
        return min(read().values()) >= 5

    worker.start()
    try:
        produce(services.bootstrap, usage_topic, [usage("warn", o, 24.1) for o in OWNERS])
        wait_for(lambda: started(receivers.firsts), "the first messages to start", worker)
        worker.kill9()
        at_kill["firing"] = receivers.firsts()
        worker.start()
        wait_for(lambda: delivered(len(OWNERS)), "every first message after a restart",
                 worker)

        produce(services.bootstrap, usage_topic, [usage("over", o, 20.0) for o in OWNERS])
        wait_for(lambda: started(receivers.escalations), "the escalations to start", worker)
        worker.kill9()
        at_kill["escalated"] = receivers.escalations()
        worker.start()
        wait_for(lambda: delivered(2 * len(OWNERS)), "every escalation after a restart",
                 worker)
        time.sleep(5)  # redelivered batches settle: nothing may be sent again
    finally:
        worker.stop()

    published = ledgers.published()
    # A leader killed between publishing changes and saving its alert book publishes some
    # again, later: changes of their own, which every channel must have too.
    assert len(published) >= 2 * len(OWNERS)
    assert {c.group["owner"] for c in published if c.line == "limit"} == {
        f"#{o}" for o in OWNERS}
    figures = _figures(receivers, ledgers, published, am_url)
    print(f"\nkill -9 mid-burst, {len(OWNERS)} alerts and their escalations:")
    print(f"{'channel':<13}{'at kill (firing/escalated)':>28}{'sent':>7}{'received':>10}"
          f"{'duplicates':>12}{'ambiguous':>11}")
    for channel in CHANNELS:
        row = figures[channel]
        kills = f"{at_kill['firing'][channel]}/{at_kill['escalated'][channel]}"
        print(f"{channel:<13}{kills:>28}{row['sent']:>7}{row['received']:>10}"
              f"{row['duplicates']:>12}{row['ambiguous']:>11}")
    for channel in CHANNELS:
        row = figures[channel]
        assert row["lost"] == 0, f"{channel}: {row['lost']} change(s) never arrived"
        assert row["duplicates"] <= row["ambiguous"], (
            f"{channel}: {row['duplicates']} sent twice, {row['ambiguous']} ambiguous")


def _figures(receivers: Channels, ledgers: Ledgers, published: list[AlertChange],
             am_url: str) -> dict[str, dict[str, int]]:
    """Per channel: messages sent as the ledger recorded them, messages received, the
    duplicates among them, the ambiguous count, and the changes that never arrived."""
    found: dict[str, dict[str, int]] = {}
    firsts = receivers.firsts()

    def row(channel: str, identities: list[Any], lost: int) -> None:
        """``identities``: what names each received message's change (the same for a
        message received twice)."""
        counts = Counter(identities)
        found[channel] = {"sent": ledgers.sent(channel, published),
                          "received": len(identities),
                          "duplicates": sum(n - 1 for n in counts.values()),
                          "ambiguous": ledgers.ambiguous(channel), "lost": lost}

    def missing(channel: str) -> int:
        """Alerts without a first message, plus alerts without their escalation."""
        escalated = set(_escalated(receivers, channel))
        return (len(OWNERS) - firsts[channel]) + (len(OWNERS) - len(escalated))

    roots = receivers.slack
    shown = {m.ts for o in OWNERS for m in roots.messages(o)} | {
        r.ts for o in OWNERS for m in roots.messages(o) for r in m.replies}
    accepted = ledgers.sent_slack_ts(published)
    # Slack gives every message a ts of its own: one the ledger never recorded is a copy.
    found["slack"] = {"sent": len(accepted), "received": len(shown),
                      "duplicates": len(shown - accepted), "ambiguous": ledgers.ambiguous("slack"),
                      "lost": missing("slack") + len(accepted - shown)}
    ids = [str(r.message["Message-ID"]) for r in receivers.mailbox.received]
    row("email", ids, missing("email"))
    pages = [(e.dedup_key, e.action, e.body.get("payload", {}).get("timestamp"))
             for e in receivers.pagerduty.accepted()]
    row("pagerduty", pages, missing("pagerduty"))
    pushed = [key for key in receivers.front.keys if key is not None]
    held = {a["annotations"]["alert_id"]: a["annotations"]["line"] for a in alerts(am_url)
            if a["labels"].get("alertname") == "owner-daily"}
    gone = sum(1 for o in OWNERS if held.get(alert_id("owner-daily", {"owner": f"#{o}"}))
               != "limit")
    row("alertmanager", pushed, missing("alertmanager") + gone)
    hooks = [r.idempotency_key for r in receivers.webhook.accepted()]
    row("webhook", hooks, missing("webhook"))
    return found


def _escalated(receivers: Channels, channel: str) -> list[str]:
    """The alerts whose escalation the channel got."""
    if channel == "slack":
        return [o for o in OWNERS for m in receivers.slack.messages(o) for r in m.replies
                if "Escalated" in r.text]
    if channel == "email":
        return [o for r in receivers.mailbox.received if r.message["In-Reply-To"]
                for o in OWNERS if f"owner=#{o}" in str(r.message.get_body(("plain",))
                                                       .get_content())]
    if channel == "pagerduty":
        return [str(e.dedup_key) for e in receivers.pagerduty.accepted()
                if e.body.get("payload", {}).get("class") == "limit"]
    if channel == "alertmanager":
        return [body[0]["annotations"]["alert_id"] for status, body in receivers.front.posted
                if status == 200 and len(body) == 1
                and body[0]["annotations"]["line"] == "limit"]
    return [str(r.idempotency_key).split("@", 1)[0] for r in receivers.webhook.accepted()
            if r.idempotency_key and "|firing|limit|" in r.idempotency_key]


# ── a notifier stopped before its request left ───────────────────────────────────────────

NOVEMBER = {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"}


def change(line: str, value: str, at: str) -> dict[str, Any]:
    group = {"team": "pretrain"}
    return {
        "alert_id": alert_id("team-monthly", group), "rule": "team-monthly", "kind": "budget",
        "severity": "warning", "state": "firing", "previous_state": "firing", "group": group,
        "since": "2026-11-30T08:00:00Z", "at": at, "value": value,
        "threshold": "8000.000000" if line == "warn_80" else "10000.000000", "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD", "unit": "currency", "period": NOVEMBER, "forecast": None,
        "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"slack": "#ml-budgets", "route_by_tag": None, "channel": "#ml-budgets"},
        "mode": "live", "summary": "team=pretrain is past a line of its November budget.",
    }


@pytest.fixture
async def local_slack() -> AsyncIterator[LocalSlack]:
    async with LocalSlack(channels=["ml-budgets", "costline-alerts"]) as server:
        yield server


@pytest.fixture
async def slack_ledger(redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    client = connect_async(redis_url)
    yield DeliveryLedger(client, namespace)
    await client.aclose()


async def test_a_notifier_stopped_while_pacing_leaves_nothing_in_doubt(
        local_slack: LocalSlack, slack_ledger: DeliveryLedger) -> None:
    def notifier() -> SlackNotifier:
        return SlackNotifier(token=DEFAULT_TOKEN, ledger=slack_ledger,
                             fallback_channel="#costline-alerts", base_url=local_slack.url,
                             min_interval_s=30.0)

    escalation = change("limit", "10240.000000", "2026-11-30T11:00:00Z")
    async with notifier() as first:
        await first.deliver([change("warn_80", "8123.450000", "2026-11-30T08:05:00Z")])
        sending = asyncio.create_task(first.deliver([escalation]))
        while not local_slack.calls_to("chat.update"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not sending.done(), "the reply waits for the channel's pace"
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
    assert len(local_slack.calls_to("chat.postMessage")) == 1, "the reply never left"

    async with notifier() as restarted:
        [delivery] = await restarted.deliver([escalation])
    [root] = local_slack.messages("ml-budgets")
    assert delivery.outcome == "updated"
    assert [r.text for r in root.replies] == [
        ":warning: Escalated from warn_80 to *limit*: $10,240.00 crossed limit ($10,000.00)."]
    assert AMBIGUOUS_MARK not in root.replies[0].text
    assert "ambiguous" not in await slack_ledger.counts()
