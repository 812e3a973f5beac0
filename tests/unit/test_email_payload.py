"""The exact email messages the email notifier sends, from alert changes the rule engine
produced (``tests/unit/notify_scenario.py``): parsed back as a mail server receives them."""

from __future__ import annotations

from email import message_from_bytes, policy
from email.message import EmailMessage

from costline.connectors.email_render import alert_email, change_email, digest_email
from costline.connectors.notify.email import EmailNotifier
from tests.unit.notify_scenario import ALERT_ID, FIRST_SUMMARY, SITE, another, changes


def received(message: EmailMessage) -> EmailMessage:
    """The message as a mail server receives it, parsed back."""
    parsed = message_from_bytes(message.as_bytes(), policy=policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def parts(message: EmailMessage) -> dict[str, str]:
    return {part.get_content_type(): str(part.get_content())
            for part in message.walk() if not part.is_multipart()}


def notifier() -> EmailNotifier:
    return EmailNotifier(None, None, sender="costline@example.com", external_url=SITE)


def test_the_engine_routes_the_alert_to_its_tag_values_recipients() -> None:
    first, _, _ = changes()
    assert first.notify["email"] == {"to": ["pretrain-leads@example.com"]}


def test_an_alert_email_names_rule_group_figure_and_line_in_text_and_html() -> None:
    first, _, _ = changes()
    email = alert_email(first, f"{SITE}/?alert={ALERT_ID}")
    message = received(notifier().message("pretrain-leads@example.com", email,
                                          "<a@example.com>"))
    assert message["Subject"] == FIRST_SUMMARY
    assert (message["From"], message["To"], message["Message-ID"]) == (
        "costline@example.com", "pretrain-leads@example.com", "<a@example.com>")
    assert message["In-Reply-To"] is None and message["References"] is None
    assert message["Auto-Submitted"] == "auto-generated"
    body = parts(message)
    assert set(body) == {"text/plain", "text/html"}
    assert body["text/plain"] == (
        "team-monthly · team=pretrain\n"
        "$8,123.45 crossed warn_80 ($8,000.00)\n"
        f"{first.summary}\n"
        "Lines: warn_80 $8,000.00 · limit $10,000.00\n"
        "Top: job=run-42 $7,500.00\n"
        "Top: job=run-7 $623.45\n"
        f"Alert {ALERT_ID} · firing since Nov 30 09:00 UTC\n"
        f"{SITE}/?alert={ALERT_ID}\n")
    assert "<p>$8,123.45 crossed warn_80 ($8,000.00)</p>" in body["text/html"]
    assert f'<a href="{SITE}/?alert={ALERT_ID}">' in body["text/html"]


def test_a_later_change_replies_in_the_alerts_thread() -> None:
    first, escalated, resolved = changes()
    email = change_email(escalated, first, FIRST_SUMMARY, SITE)
    message = received(notifier().message("finops@example.com", email, "<b@example.com>",
                                          in_reply_to="<a@example.com>"))
    assert message["Subject"] == f"Re: {FIRST_SUMMARY}"
    assert (message["In-Reply-To"], message["References"]) == ("<a@example.com>",
                                                               "<a@example.com>")
    assert parts(message)["text/plain"].startswith(
        "Escalated from warn_80 to limit: $10,623.45 crossed limit ($10,000.00).\n\n")
    closing = change_email(resolved, escalated, f"Re: {FIRST_SUMMARY}", SITE, again=True)
    assert closing.subject == f"Re: {FIRST_SUMMARY}"
    assert closing.text.startswith("Resolved: $10,623.45, back within limit ($10,000.00). "
                                   "(sent again: an earlier attempt was interrupted)")


def test_a_burst_is_one_digest_listing_each_alert() -> None:
    first, _, _ = changes()
    email = digest_email([first, another(first, "other", "eval")], SITE)
    assert email.subject == "2 cost alerts: team-monthly, other"
    assert email.text == (
        "Alerts\n"
        f"{FIRST_SUMMARY}\n"
        "[WARNING] other · team=eval: $8,123.45 crossed warn_80 ($8,000.00)\n\n"
        "Each alert's changes follow in this thread.\n"
        f"{SITE}\n")


def test_the_message_id_of_a_step_is_the_same_on_every_attempt() -> None:
    first, escalated, _ = changes()
    sender = EmailNotifier(None, None, sender="alerts@costline.example.com",
                           external_url=SITE)
    ids = {sender._message_id(first, "root") for _ in range(3)}
    [only] = ids
    assert only.endswith("@costline.example.com>")
    assert sender._message_id(escalated, "reply") != only
