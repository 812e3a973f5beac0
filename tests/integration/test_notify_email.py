"""The email notifier against a real SMTP server (aiosmtpd) that requires STARTTLS or SMTPS
and a login, with its Redis ledger: the received messages are parsed and checked — plain text
and HTML, one thread per alert (``Message-ID``, ``In-Reply-To``, ``References``), a burst as
one digest; 4xx tried again, 5xx refused; a message sent again carries its first id."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.delivery_ledger import DeliveryLedger
from costline.connectors.notify import DeliveryError
from costline.connectors.notify.email import EmailNotifier, SmtpServer
from costline.connectors.redis_client import connect_async
from tests.integration.smtp_server import PASSWORD, USER, Mailbox, smtp_server

SITE = "https://costline.example.com"
SENDER = "costline@alerts.example.com"


@pytest.fixture
async def ledger(any_redis_url: str, namespace: str) -> AsyncIterator[DeliveryLedger]:
    """On a single Redis and on a Redis Cluster: a root and its subject share a slot."""
    client = connect_async(any_redis_url)
    yield DeliveryLedger(client, namespace, "email")
    await client.aclose()


@pytest.fixture
def mailbox() -> Mailbox:
    return Mailbox()


@pytest.fixture(params=["starttls", "tls"])
def server(request: pytest.FixtureRequest, tmp_path: Path, mailbox: Mailbox
           ) -> Iterator[SmtpServer]:
    security = request.param
    with smtp_server(tmp_path, security, mailbox) as (port, ca_file):
        yield SmtpServer("127.0.0.1", port, security, USER, PASSWORD, ca_file)


def notifier(ledger: DeliveryLedger, server: SmtpServer) -> EmailNotifier:
    return EmailNotifier(ledger, server, sender=SENDER, external_url=SITE, backoff_s=0.05)


def record(team: str = "pretrain", state: str = "firing", line: str = "warn_80",
           at: str = "2026-11-30T08:05:00Z", to: tuple[str, ...] = ("finops@example.com",)
           ) -> dict[str, Any]:
    return {
        "alert_id": f"team-monthly/{team}", "rule": "team-monthly", "kind": "budget",
        "severity": "warning", "state": state, "previous_state": "firing",
        "group": {"team": team}, "since": "2026-11-30T08:00:00Z", "at": at,
        "value": "8123.450000" if line == "warn_80" else "10240.000000",
        "threshold": "8000.000000" if line == "warn_80" else "10000.000000", "line": line,
        "lines": [{"name": "warn_80", "value": "8000.000000"},
                  {"name": "limit", "value": "10000.000000"}],
        "currency": "USD", "unit": "currency",
        "period": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        "forecast": None, "rate_per_hour": None, "top": [], "faults": None, "reclaim": None,
        "notify": {"email": {"to": list(to)}},
        "mode": "live", "summary": f"team={team} is past a line of its November budget.",
    }


def bodies(message: Any) -> dict[str, str]:
    return {part.get_content_type(): str(part.get_content())
            for part in message.walk() if not part.is_multipart()}


async def test_an_alert_is_one_thread_of_plain_text_and_html_messages(
        ledger: DeliveryLedger, server: SmtpServer, mailbox: Mailbox) -> None:
    async with notifier(ledger, server) as email:
        outcomes = [await email.deliver([change]) for change in (
            record(to=("finops@example.com", "lead@example.com")),
            record(line="limit", at="2026-11-30T11:40:00Z"),
            record(state="resolved", line="limit", at="2026-12-01T00:00:00Z"))]
    assert [d.outcome for [d] in outcomes] == ["posted", "updated", "updated"]
    assert all(ok for _, ok in mailbox.logins) and mailbox.logins, "logged in over TLS"
    first, escalated, resolved = (r.message for r in mailbox.received)
    assert mailbox.received[0].recipients == ["finops@example.com", "lead@example.com"]
    subject = "[WARNING] team-monthly · team=pretrain: $8,123.45 crossed warn_80 ($8,000.00)"
    assert first["Subject"] == subject and first["From"] == SENDER
    assert first["Message-ID"].endswith("@alerts.example.com>")
    for reply in (escalated, resolved):
        assert reply["Subject"] == f"Re: {subject}"
        assert reply["In-Reply-To"] == first["Message-ID"]
        assert reply["References"] == first["Message-ID"]
    assert len({m["Message-ID"] for m in (first, escalated, resolved)}) == 3
    text = bodies(escalated)
    assert set(text) == {"text/plain", "text/html"}
    assert text["text/plain"].startswith(
        "Escalated from warn_80 to limit: $10,240.00 crossed limit ($10,000.00).")
    assert "<p>Escalated from warn_80 to limit: $10,240.00 crossed limit ($10,000.00).</p>" \
        in text["text/html"]
    assert bodies(resolved)["text/plain"].startswith(
        "Resolved: $10,240.00, back within limit ($10,000.00).")


async def test_a_burst_for_the_same_recipients_is_one_digest_and_replies_follow_it(
        ledger: DeliveryLedger, server: SmtpServer, mailbox: Mailbox) -> None:
    teams = ["pretrain", "posttrain", "eval", "infra"]
    async with notifier(ledger, server) as email:
        burst = await email.deliver([record(team) for team in teams])
        [later] = await email.deliver([record("eval", line="limit", at="2026-11-30T11:00:00Z")])
    assert [d.outcome for d in burst] == ["digested"] * 4 and later.outcome == "updated"
    digest, reply = (r.message for r in mailbox.received)
    assert digest["Subject"] == "4 cost alerts: team-monthly"
    assert all(f"team={team}" in bodies(digest)["text/plain"] for team in teams)
    assert reply["In-Reply-To"] == digest["Message-ID"]
    assert reply["Subject"] == "Re: 4 cost alerts: team-monthly"


async def test_a_4xx_is_tried_again_and_a_5xx_refused_for_good(
        ledger: DeliveryLedger, server: SmtpServer, mailbox: Mailbox) -> None:
    async with notifier(ledger, server) as email:
        mailbox.answers = ["451 4.3.0 try again later"]
        [taken] = await email.deliver([record("pretrain")])
        mailbox.answers = ["554 5.7.1 message refused", "250 2.0.0 not asked again"]
        [refused] = await email.deliver([record("eval")])
    assert (taken.outcome, refused.outcome) == ("posted", "failed")
    assert [r.message["Subject"].split(" · ")[1][:13] for r in mailbox.received] == [
        "team=pretrain"]
    assert mailbox.answers == ["250 2.0.0 not asked again"], "a 5xx is not retried"
    assert "ambiguous" not in await ledger.counts()


async def test_a_login_the_server_refuses_keeps_the_alerts_waiting(
        ledger: DeliveryLedger, server: SmtpServer, mailbox: Mailbox,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = SmtpServer(server.host, server.port, server.security, USER, "not-the-password",
                       server._ca_file)
    async with notifier(ledger, wrong) as email:
        with pytest.raises(DeliveryError):
            await email.deliver([record()])
    assert mailbox.received == [] and "ambiguous" not in await ledger.counts()
    async with notifier(ledger, server) as email:
        [delivery] = await email.deliver([record()])
    assert delivery.outcome == "posted" and len(mailbox.received) == 1
    assert PASSWORD not in caplog.text and "not-the-password" not in caplog.text


async def test_a_message_sent_again_after_a_crash_keeps_its_id_and_is_counted(
        ledger: DeliveryLedger, server: SmtpServer, mailbox: Mailbox,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with notifier(ledger, server) as doomed:
        async def crash(*args: object) -> None:
            raise SystemExit("killed after the server took the message")

        monkeypatch.setattr(ledger, "save_root", crash)
        with pytest.raises(SystemExit):
            await doomed.deliver([record()])
        monkeypatch.undo()
    async with notifier(ledger, server) as restarted:
        [delivery] = await restarted.deliver([record()])
    assert delivery.outcome == "posted"
    assert (await ledger.counts())["ambiguous"] == 1
    [(message_id, copies)] = mailbox.by_id().items()
    assert len(copies) == 2, "sent twice, as the ledger counted: one id, one message to read"
