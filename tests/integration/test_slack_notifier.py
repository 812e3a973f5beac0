"""SlackNotifier + Redis ledger against the local Slack server, through the real slack-sdk; the
ledger on a single Redis and on a Redis Cluster."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from itertools import pairwise
from typing import Any
from urllib.parse import urlencode

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from costline.connectors.delivery_ledger import DeliveryLedger, ThreadRef
from costline.connectors.notify import DeliveryError
from costline.connectors.notify.slack import SlackNotifier
from costline.connectors.redis_client import AsyncRedisClient, connect_async
from costline.connectors.slack_actions import (
    ActionRequest,
    ApproverPolicy,
    RedisReplayGuard,
    add_actions_route,
    make_actions_handler,
)
from costline.connectors.slack_render import KEEP_ACTION
from costline.connectors.slack_server import LocalSlack, channel_id
from tests.integration.streamkit import configured_or_private_redis

TOKEN = "xoxb-notifier-test-7f3c"


def record(alert_id: str = "team-monthly/3f2a9c", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "alert_id": alert_id, "rule": alert_id.split("/")[0], "kind": "budget",
        "severity": "warning", "state": "firing", "previous_state": "pending",
        "group": {"team": "pretrain"}, "since": "2026-11-30T08:00:00Z",
        "at": "2026-11-30T08:05:00Z", "value": "8123.450000", "threshold": "8000.000000",
        "line": "warn_80",
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD",
        "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        "forecast": None, "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"slack": "#ml-platform"}, "mode": "live",
        "summary": "Team pretrain has spent $8,123.45 of its November budget.",
    }
    base.update(fields)
    return base


ESCALATED = {"line": "limit", "threshold": "10000.000000", "value": "10240.000000",
             "severity": "critical", "at": "2026-11-30T11:40:00Z"}
RESOLVED = {"state": "resolved", "previous_state": "firing", "value": "10240.000000",
            "at": "2026-12-01T00:00:00Z"}


# ── services ────────────────────────────────────────────────────────────────────────────────


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def ledger_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``COSTLINE_REDIS_URL`` when set, else a private redis-server on a spare port."""
    with configured_or_private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def redis_url(ledger_redis_url: str) -> str:
    """The single Redis of ``any_redis_url``."""
    return ledger_redis_url


@pytest.fixture
async def redis_client(any_redis_url: str) -> AsyncIterator[AsyncRedisClient]:
    client = connect_async(any_redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def ledger(redis_client: AsyncRedisClient, namespace: str) -> DeliveryLedger:
    return DeliveryLedger(redis_client, namespace=namespace)


@pytest.fixture
async def slack() -> AsyncIterator[LocalSlack]:
    async with LocalSlack(tokens=[TOKEN], channels=["ml-platform", "alerts", "ml-infra"]
                          ) as server:
        yield server


def make_notifier(slack: LocalSlack, ledger: DeliveryLedger, **options: Any) -> SlackNotifier:
    settings: dict[str, Any] = {"token": TOKEN, "ledger": ledger, "fallback_channel": "#alerts",
                                "base_url": slack.url, "min_interval_s": 0.0,
                                "retry_backoff_s": 0.05}
    settings.update(options)
    return SlackNotifier(**settings)


@pytest.fixture
async def notifier(slack: LocalSlack, ledger: DeliveryLedger) -> AsyncIterator[SlackNotifier]:
    async with make_notifier(slack, ledger) as built:
        yield built


# ── one thread per alert ────────────────────────────────────────────────────────────────────


async def test_first_change_posts_one_message_with_blocks_and_text(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    [delivery] = await notifier.deliver([record()])
    [message] = slack.messages("ml-platform")
    assert delivery.outcome == "posted" and delivery.ref == message.ts
    assert message.text == ("[WARNING] team-monthly · team=pretrain: "
                            "$8,123.45 crossed warn_80 ($8,000.00)")
    assert message.blocks[0]["text"]["text"] == ":warning: team-monthly"


async def test_escalation_and_resolution_update_the_root_and_reply_in_its_thread(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    await notifier.deliver([record()])
    await notifier.deliver([record(**ESCALATED)])
    await notifier.deliver([record(**{**ESCALATED, **RESOLVED})])
    [root] = slack.messages("ml-platform")
    assert root.edits == 2
    assert root.text.startswith("[RESOLVED] team-monthly")
    assert [r.text for r in root.replies] == [
        ":rotating_light: Escalated from warn_80 to *limit*: "
        "$10,240.00 crossed limit ($10,000.00).",
        ":white_check_mark: Resolved: $10,240.00, back within limit ($10,000.00).",
    ]


async def test_a_new_period_starts_a_new_thread(notifier: SlackNotifier,
                                                slack: LocalSlack) -> None:
    await notifier.deliver([record()])
    december = {"start": "2026-12-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"}
    await notifier.deliver([record(period=december, at="2026-12-20T08:00:00Z")])
    assert len(slack.messages("ml-platform")) == 2


async def test_redelivered_records_are_not_sent_twice(notifier: SlackNotifier,
                                                      slack: LocalSlack) -> None:
    first = await notifier.deliver([record(), record(**ESCALATED)])
    again = await notifier.deliver([record(), record(**ESCALATED)])
    assert [d.outcome for d in first] == ["posted", "updated"]
    assert [d.outcome for d in again] == ["duplicate", "duplicate"]
    assert len(slack.calls_to("chat.postMessage")) == 2


async def test_an_older_change_arriving_late_does_not_overwrite_a_newer_one(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    await notifier.deliver([record(), record(**ESCALATED)])
    late = record(at="2026-11-30T09:00:00Z", value="8500.000000")
    assert [d.outcome for d in await notifier.deliver([late])] == ["stale"]
    assert slack.messages("ml-platform")[0].text.startswith("[CRITICAL]")


# ── restarts and ambiguity ──────────────────────────────────────────────────────────────────


async def test_a_restarted_notifier_does_not_repost(slack: LocalSlack,
                                                    ledger: DeliveryLedger) -> None:
    async with make_notifier(slack, ledger) as before:
        await before.deliver([record()])
    async with make_notifier(slack, ledger) as after:
        outcomes = await after.deliver([record(), record(**ESCALATED)])
    assert [d.outcome for d in outcomes] == ["duplicate", "updated"]
    assert len(slack.messages("ml-platform")) == 1
    assert len(slack.messages("ml-platform")[0].replies) == 1


async def test_death_between_slacks_ok_and_the_marker_is_counted_ambiguous(
        slack: LocalSlack, ledger: DeliveryLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    async with make_notifier(slack, ledger) as doomed:
        async def crash(*args: object) -> None:
            raise SystemExit("killed after Slack said ok")

        monkeypatch.setattr(ledger, "save_root", crash)
        with pytest.raises(SystemExit):
            await doomed.deliver([record()])
        monkeypatch.undo()
    async with make_notifier(slack, ledger) as restarted:
        [delivery] = await restarted.deliver([record()])
        assert delivery.outcome == "posted"
        assert restarted.stats["ambiguous"] == 1
    assert (await ledger.counts())["ambiguous"] == 1
    assert len(slack.messages("ml-platform")) == 2, "re-sent: a duplicate, never a loss"


async def test_a_reply_slack_refused_is_retried_without_doubt(
        slack: LocalSlack, ledger: DeliveryLedger, notifier: SlackNotifier) -> None:
    await notifier.deliver([record()])
    escalated = record(**ESCALATED)
    slack.fail_next(5, method="chat.postMessage", status=500)
    with pytest.raises(DeliveryError):
        await notifier.deliver([escalated])
    assert "ambiguous" not in await ledger.counts(), "Slack said no: nothing in doubt"
    await notifier.deliver([escalated])
    [reply] = slack.messages("ml-platform")[0].replies
    assert "sent again" not in reply.text


async def test_an_interrupted_thread_reply_is_resent_and_marked(
        slack: LocalSlack, ledger: DeliveryLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    async with make_notifier(slack, ledger) as doomed:
        await doomed.deliver([record()])
        finish = ledger.finish

        async def crash_on_reply(thread_key: str, change_key: str, step: str, ts: str) -> None:
            if step == "reply":
                raise SystemExit("killed after Slack said ok")
            await finish(thread_key, change_key, step, ts)

        monkeypatch.setattr(ledger, "finish", crash_on_reply)
        with pytest.raises(SystemExit):
            await doomed.deliver([record(**ESCALATED)])
        monkeypatch.undo()
    async with make_notifier(slack, ledger) as restarted:
        [delivery] = await restarted.deliver([record(**ESCALATED)])
    [root] = slack.messages("ml-platform")
    assert delivery.outcome == "updated"
    assert root.edits == 1, "the update was done: not repeated"
    first, second = root.replies
    assert first.text.startswith(":rotating_light: Escalated from warn_80 to *limit*")
    assert second.text == first.text + "\n_(sent again: an earlier attempt was interrupted)_"
    assert (await ledger.counts())["ambiguous"] == 1


# ── Slack misbehaving ───────────────────────────────────────────────────────────────────────


async def test_retry_after_is_honoured_and_the_message_still_arrives(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    slack.rate_limit_next(1, retry_after=2, method="chat.postMessage")
    [delivery] = await notifier.deliver([record()])
    limited, accepted = slack.calls_to("chat.postMessage")
    assert (limited.status, accepted.status) == (429, 200)
    assert accepted.at - limited.at >= 2.0
    assert delivery.outcome == "posted"


async def test_rate_limited_past_the_retries_asks_for_redelivery(
        slack: LocalSlack, ledger: DeliveryLedger) -> None:
    slack.rate_limit_next(2, retry_after=1, method="chat.postMessage")
    async with make_notifier(slack, ledger, rate_limit_retries=1) as notifier:
        with pytest.raises(DeliveryError):
            await notifier.deliver([record()])
        [delivery] = await notifier.deliver([record()])
    assert delivery.outcome == "posted"
    assert len(slack.messages("ml-platform")) == 1


async def test_server_errors_are_retried_with_backoff(notifier: SlackNotifier,
                                                      slack: LocalSlack) -> None:
    slack.fail_next(1, status=500)
    slack.fail_next(1, status=200, error="service_unavailable")
    [delivery] = await notifier.deliver([record()])
    assert delivery.outcome == "posted"
    assert [c.status for c in slack.calls_to("chat.postMessage")] == [500, 200, 200]


async def test_unknown_channel_falls_back_instead_of_losing_the_alert(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    [delivery] = await notifier.deliver([record(notify={"slack": "#no-such-channel"})])
    assert delivery.destination == channel_id("alerts")
    assert len(slack.messages("alerts")) == 1
    assert notifier.stats["fallbacks"] == 1


async def test_invalid_token_fails_without_leaking_it(
        slack: LocalSlack, ledger: DeliveryLedger, caplog: pytest.LogCaptureFixture) -> None:
    secret = "xoxb-revoked-9d2e41"
    caplog.set_level(logging.DEBUG)
    async with make_notifier(slack, ledger, token=secret) as notifier:
        [delivery] = await notifier.deliver([record()])
        assert delivery.outcome == "failed"
        slack.fail_next(10, status=500)
        with pytest.raises(DeliveryError) as caught:
            await notifier.deliver([record("other/1")])
        assert secret not in repr(notifier)
    assert "invalid_auth" in caplog.text
    assert secret not in caplog.text
    assert secret not in "".join(traceback.format_exception(caught.value))


async def test_a_slack_error_raised_to_the_caller_carries_no_request(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    slack.fail_next(10, status=500)
    with pytest.raises(DeliveryError) as caught:
        await notifier.deliver([record()])
    assert caught.value.__context__ is None and caught.value.__cause__ is None


# ── bursts, routing, pacing, no token ───────────────────────────────────────────────────────


async def test_a_burst_for_one_channel_becomes_one_digest_thread(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    burst = [record(f"team-monthly/{i:04x}", group={"team": f"team-{i}"}) for i in range(6)]
    outcomes = await notifier.deliver(burst)
    assert {d.outcome for d in outcomes} == {"digested"}
    [digest] = slack.messages("ml-platform")
    assert digest.blocks[0]["text"]["text"] == ":bell: 6 cost alerts"
    await notifier.deliver([record("team-monthly/0003", group={"team": "team-3"},
                                   **ESCALATED)])
    [digest] = slack.messages("ml-platform")
    assert digest.edits == 1
    assert ":rotating_light: *team-monthly* · team `team-3`" in digest.blocks[4]["text"]["text"]
    assert len(digest.replies) == 1


async def test_route_by_tag_picks_the_owners_channel(slack: LocalSlack,
                                                     ledger: DeliveryLedger) -> None:
    routes = {"infra-team": "#ml-infra"}
    notify = {"slack": "#ml-platform", "route_by_tag": "owner"}
    async with make_notifier(slack, ledger, channel_by_tag_value=routes) as notifier:
        await notifier.deliver([
            record("a/1", group={"owner": "infra-team"}, notify=notify),
            record("a/2", group={"owner": "unknown-team"}, notify=notify),
            record("a/3", group={"team": "x"}, notify={"route_by_tag": "owner"}),
        ])
    assert [len(slack.messages(c)) for c in ("ml-infra", "ml-platform", "alerts")] == [1, 1, 1]


async def test_at_most_one_message_per_second_per_channel(slack: LocalSlack,
                                                          ledger: DeliveryLedger) -> None:
    async with make_notifier(slack, ledger, min_interval_s=1.0) as notifier:
        await notifier.deliver([record(f"r/{i}") for i in range(3)])
    times = [c.at for c in slack.calls_to("chat.postMessage")]
    assert len(times) == 3
    assert all(later - earlier >= 0.95 for earlier, later in pairwise(times))


async def test_without_a_token_the_text_is_logged_and_nothing_sent(
        slack: LocalSlack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="costline.connectors.notify.slack")
    async with SlackNotifier(token=None, ledger=None, fallback_channel="#alerts",
                             base_url=slack.url) as notifier:
        [delivery] = await notifier.deliver([record()])
    assert delivery.outcome == "logged"
    assert "#ml-platform would get: [WARNING] team-monthly · team=pretrain" in caplog.text
    assert slack.calls == []


async def test_a_malformed_record_is_refused_not_retried(notifier: SlackNotifier) -> None:
    [delivery] = await notifier.deliver([{"alert_id": "x/1", "state": "firing"}])
    assert delivery.outcome == "failed"


async def test_a_note_from_a_button_updates_the_root_and_replies(
        notifier: SlackNotifier, slack: LocalSlack) -> None:
    [delivery] = await notifier.deliver([record()])
    assert delivery.destination and delivery.ref
    await notifier.annotate(delivery.destination, delivery.ref,
                            ":no_bell: Snoozed for 4h by <@U042>")
    await notifier.deliver([record(**ESCALATED)])
    [root] = slack.messages("ml-platform")
    assert root.blocks[-1]["elements"][-1]["text"] == ":no_bell: Snoozed for 4h by <@U042>"
    assert root.replies[0].text == ":no_bell: Snoozed for 4h by <@U042>"


# ── buttons, end to end ─────────────────────────────────────────────────────────────────────


class KeepEverything:
    """A worker that grants every exemption."""

    async def snooze(self, request: ActionRequest, duration: timedelta) -> str | None:
        return None

    async def keep(self, request: ActionRequest, duration: timedelta) -> str | None:
        return "until Dec 1 08:05 UTC"

    async def approve(self, request: ActionRequest) -> str | None:
        return None


def signed_press(secret: str, message_ts: str, channel: str, value: str) -> tuple[
        bytes, dict[str, str]]:
    payload = {"type": "block_actions", "user": {"id": "U042", "username": "ada"},
               "channel": {"id": channel}, "container": {"message_ts": message_ts},
               "actions": [{"action_id": KEEP_ACTION, "value": value}]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = str(int(time.time()))
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256)
    return body, {"X-Slack-Request-Timestamp": timestamp,
                  "X-Slack-Signature": f"v0={digest.hexdigest()}",
                  "Content-Type": "application/x-www-form-urlencoded"}


async def test_pressing_keep_notes_who_on_the_alert_message(
        notifier: SlackNotifier, slack: LocalSlack, redis_client: AsyncRedisClient) -> None:
    reclaim = {"resource_id": "cluster-a/node-017", "connector": "slurm", "grace": 900,
               "execute_at": "2026-11-30T14:30:00Z", "mode": "live", "approval": "auto"}
    idle = record("idle-gpus/77c2d1", kind="idle", value="0.020000", threshold="0.050000",
                  line="idle", lines=[{"name": "idle", "value": "0.050000"}], reclaim=reclaim)
    [delivery] = await notifier.deliver([idle])
    assert delivery.destination and delivery.ref
    [root] = slack.messages("ml-platform")
    keep = next(e for b in root.blocks if b["type"] == "actions" for e in b["elements"]
                if e["action_id"] == KEEP_ACTION)
    handler = make_actions_handler(
        signing_secret="signing-secret", actions=KeepEverything(), approvers=ApproverPolicy(),
        replay_guard=RedisReplayGuard(redis_client, "replays"), notes=notifier)
    app = web.Application()
    add_actions_route(app, handler)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        body, headers = signed_press("signing-secret", delivery.ref, delivery.destination,
                                     keep["value"])
        assert (await client.post("/slack/actions", data=body, headers=headers)).status == 200
        await handler.drain()
        replayed = await client.post("/slack/actions", data=body, headers=headers)
        assert replayed.status == 401
    note = ":raised_hand: `cluster-a/node-017` kept for 1d by <@U042> (until Dec 1 08:05 UTC)"
    assert root.blocks[-1]["elements"][-1]["text"] == note
    assert [r.text for r in root.replies] == [note]


async def test_a_ledger_written_before_its_hash_tag_is_taken_over_on_a_single_redis(
        ledger_redis_url: str, namespace: str) -> None:
    """Keys an earlier version wrote as ``NS:slack:...`` are renamed when first used, so an
    alert posted before an upgrade is still updated in its own thread after it."""
    client = connect_async(ledger_redis_url)
    old, alert = f"{namespace}:slack", "team-monthly/3f2a9c"
    entry = {"order": 0, "record": record(), "previous": None}
    await client.set(f"{old}:thread:{alert}", "C0ALERTS 1700000000.000100")
    await client.hset(f"{old}:root:C0ALERTS:1700000000.000100", f"m:{alert}", json.dumps(entry))
    await client.hset(f"{old}:change:{alert}:warn_80", "root", "done 1700000000.000100")
    await client.hset(f"{old}:counts", "ambiguous", 2)
    ledger = DeliveryLedger(client, namespace)
    try:
        ref = await ledger.thread(alert)
        assert ref == ThreadRef("C0ALERTS", "1700000000.000100")
        [member] = await ledger.members(ref)
        assert member.record == record()
        assert await ledger.steps(alert, "warn_80") == {"root": "done 1700000000.000100"}
        assert await ledger.counts() == {"ambiguous": 2}
        assert [key async for key in client.scan_iter(match=f"{old}:*")] == []
    finally:
        await client.aclose()


async def test_redis_replay_guard_remembers_signatures_across_handlers(
        redis_client: AsyncRedisClient, namespace: str) -> None:
    first = RedisReplayGuard(redis_client, namespace)
    second = RedisReplayGuard(redis_client, namespace)
    assert await first.first_seen("v0=abc", 600) is True
    assert await second.first_seen("v0=abc", 600) is False
    assert await second.first_seen("v0=def", 600) is True


async def test_a_ledger_that_cannot_be_reached_asks_for_redelivery(slack: LocalSlack) -> None:
    unreachable = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0",
                                    socket_connect_timeout=1)
    try:
        async with make_notifier(slack, DeliveryLedger(unreachable)) as notifier:
            with pytest.raises(DeliveryError, match="ledger is unavailable"):
                await notifier.deliver([record()])
    finally:
        await unreachable.aclose()
    assert slack.calls == [], "nothing is sent that could not be recorded"


async def test_an_alert_that_never_fired_in_slack_is_not_posted(notifier: SlackNotifier,
                                                                 slack: LocalSlack) -> None:
    outcomes = await notifier.deliver([
        record("a/1", state="pending", previous_state=None),
        record("a/2", state="resolved", previous_state="pending"),
    ])
    assert [d.outcome for d in outcomes] == ["unposted", "unposted"]
    assert slack.calls == []
