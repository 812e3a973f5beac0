"""Email: alert changes as mail, plain text and HTML, one thread per alert.

The first firing of an alert sends a message whose ``Message-ID`` becomes its thread; every
later change is a reply (``In-Reply-To`` and ``References`` name the first message, the
subject is ``Re:`` the first one's), so a mail client shows one conversation per alert. A
burst of new alerts for the same recipients is one digest message, and each alert's changes
reply to it. Message ids are made from the alert and the change, so a message sent again
after an interrupted attempt carries the id of the first: a mail client shows it once.

The mail server is the worker's (``COSTLINE_SMTP_*``): STARTTLS, or TLS from the first byte
(SMTPS), or neither; AUTH when a user name is set. Without ``COSTLINE_SMTP_HOST`` email alerts
are logged, not sent. A 4xx answer is tried again with backoff, a 5xx answer is a refusal
(logged, not retried); a server that cannot be reached, or refuses the login, keeps the alerts
waiting in Kafka until it can.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import smtplib
import ssl
from collections.abc import Awaitable, Callable, Sequence
from email.message import EmailMessage
from email.utils import formatdate
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field

from costline.connectors.alert_change import AlertChange
from costline.connectors.delivery_ledger import DeliveryLedger, ThreadRef
from costline.connectors.email_render import (
    Email,
    alert_email,
    change_email,
    digest_email,
)
from costline.connectors.notify import Refused, Setup, Unavailable, notifier, params_of
from costline.connectors.notify._threads import Threaded
from costline.rules.notify_params import NotifierParams

Address = Annotated[str, Field(pattern=r"^[^@\s,<>]+@[^@\s,<>]+$", max_length=254)]
PORTS = {"starttls": 587, "tls": 465, "none": 25}
SUBJECT = "subject"
LOGIN = "AUTH"
Sleep = Callable[[float], Awaitable[None]]


class EmailParams(NotifierParams):
    """Who gets the alerts, and who gets them for each value of the ``route_by_tag`` tag."""

    shorthand: ClassVar[str | None] = "to"

    to: list[Address] = Field(
        min_length=1, description="recipients of every alert (unless by_tag names others "
        "for the alert's tag value)")
    by_tag: dict[str, list[Address]] = Field(
        default_factory=dict, description="tag value → recipients, for route_by_tag (a value "
        "that is itself an address needs no entry)")

    def published(self, name: str, tag: str | None, value: str | None) -> dict[str, object]:
        """The recipients of this alert: its tag value's, else ``to``."""
        itself = value is not None and "@" in value and " " not in value
        routed = None
        if tag is not None and value is not None:
            routed = self.by_tag.get(value) or ([value] if itself else None)
        return {name: {"to": list(routed or self.to)}}


class SmtpServer:
    """The mail server, as ``COSTLINE_SMTP_*`` describe it."""

    def __init__(self, host: str, port: int | None = None, security: str = "starttls",
                 username: str | None = None, password: str | None = None,
                 ca_file: Path | None = None, timeout_s: float = 20.0) -> None:
        self.host = host
        self.port = port or PORTS[security]
        self.security = security
        self.username = username
        self._password = password
        self._ca_file = ca_file
        self._timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"SmtpServer({self.host}:{self.port}, {self.security})"

    def send(self, message: EmailMessage) -> None:
        """One message, on a connection of its own (blocking: run it in a thread)."""
        context = ssl.create_default_context(
            cafile=str(self._ca_file) if self._ca_file else None)
        connected = False
        try:
            smtp: smtplib.SMTP
            if self.security == "tls":
                smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=self._timeout_s,
                                        context=context)
            else:
                smtp = smtplib.SMTP(self.host, self.port, timeout=self._timeout_s)
            connected = True
            with smtp:
                if self.security == "starttls":
                    smtp.starttls(context=context)
                if self.username:
                    smtp.login(self.username, self._password or "")
                smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            raise _answer("RCPT", min(codes), "every recipient refused") from None
        except (smtplib.SMTPAuthenticationError, smtplib.SMTPNotSupportedError) as exc:
            # The server cannot be used as configured: the alerts wait until it can.
            raise Unavailable(LOGIN, _words(exc), None, channel="SMTP") from None
        except smtplib.SMTPResponseException as exc:
            raise _answer("SEND", exc.smtp_code, _words(exc)) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise Unavailable("SEND", type(exc).__name__, None, answered=not connected,
                              channel="SMTP") from None


@notifier("email")
class EmailNotifier(Threaded):
    """Sends each alert's changes as one email thread (plain text and HTML).

    ```yaml
    rules:
      - name: team-monthly
        kind: budget
        group_by: [owner]
        period: month
        limit: 250000
        notify:
          route_by_tag: owner
          email:
            to: [finops@example.com]
            by_tag: {alice: [alice@example.com, alice-lead@example.com]}
    ```
    """

    params_model = EmailParams

    def __init__(self, ledger: DeliveryLedger | None, server: SmtpServer | None, *,
                 sender: str, external_url: str, retries: int = 3, backoff_s: float = 1.0,
                 sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(ledger if server is not None else None)
        self._server = server
        self._sender = sender
        self._domain = sender.rsplit("@", 1)[-1] or "localhost"
        self._external_url = external_url
        self._retries = retries
        self._backoff_s = backoff_s
        self._sleep = sleep

    @classmethod
    def build(cls, setup: Setup) -> EmailNotifier:
        """Sends when ``COSTLINE_SMTP_HOST`` is set, and only logs otherwise."""
        settings = setup.settings
        server = None
        if settings.smtp_host:
            password = settings.smtp_password
            server = SmtpServer(settings.smtp_host, settings.smtp_port, settings.smtp_security,
                                settings.smtp_username,
                                password.get_secret_value() if password else None,
                                settings.smtp_ca_file)
        return cls(setup.ledger("email") if server else None, server,
                   sender=settings.smtp_from, external_url=setup.external_url)

    def route(self, change: AlertChange) -> str:
        params = params_of(change, type(self))
        assert isinstance(params, EmailParams)
        return ",".join(sorted(set(params.to))) or "nobody"

    async def open(self, changes: Sequence[AlertChange], destination: str) -> ThreadRef:
        first = changes[0]
        email = (alert_email(first, self._link(first)) if len(changes) == 1
                 else digest_email(changes, self._external_url))
        message_id = self._message_id(first, "root")
        await self._send(destination, email, message_id)
        thread = ThreadRef(destination, message_id)
        await self.ledger.set_field(thread, SUBJECT, email.subject)
        return thread

    async def follow(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None, again: bool) -> str:
        subject = await self.ledger.field(thread, SUBJECT) or change.rule
        email = change_email(change, previous, subject, self._link(change), again)
        message_id = self._message_id(change, "reply")
        await self._send(thread.destination, email, message_id, in_reply_to=thread.ref)
        return message_id

    # ── the message ───────────────────────────────────────────────────────────────────────

    def message(self, destination: str, email: Email, message_id: str,
                in_reply_to: str | None = None) -> EmailMessage:
        message = EmailMessage()
        message["From"] = self._sender
        message["To"] = ", ".join(destination.split(","))
        message["Subject"] = email.subject
        message["Message-ID"] = message_id
        message["Date"] = formatdate(usegmt=True)
        if in_reply_to:
            message["In-Reply-To"] = in_reply_to
            message["References"] = in_reply_to
        message["Auto-Submitted"] = "auto-generated"
        message.set_content(email.text)
        message.add_alternative(email.html, subtype="html")
        return message

    def _message_id(self, change: AlertChange, step: str) -> str:
        """The same for every attempt at one step of one change."""
        key = f"{change.thread_key}|{change.change_key}|{step}".encode()
        return f"<{hashlib.sha256(key).hexdigest()[:32]}@{self._domain}>"

    def _link(self, change: AlertChange) -> str:
        return f"{self._external_url}/?alert={change.alert_id}"

    async def _send(self, destination: str, email: Email, message_id: str,
                    in_reply_to: str | None = None) -> None:
        server = self._server
        assert server is not None
        message = self.message(destination, email, message_id, in_reply_to)
        for attempt in range(self._retries + 1):
            try:
                await asyncio.to_thread(server.send, message)
                return
            except Unavailable as exc:
                # A message that may have arrived is not sent again here: the ledger counts
                # it as ambiguous when the batch is retried. A refused login waits for the
                # batch's retry too: it does not mend in seconds.
                if attempt == self._retries or not exc.answered or exc.method == LOGIN:
                    raise
                delay = self._backoff_s * 2 ** attempt * (1.0 + random.random())
                await self._sleep(delay)


def _answer(command: str, code: int, words: str) -> Unavailable | Refused:
    """4xx: try again later; 5xx: the server will not take it."""
    kind = Unavailable if 400 <= code < 500 else Refused
    return kind(command, f"{code} {words}".strip(), None, channel="SMTP")


def _words(exc: Exception) -> str:
    """What the server said, without the request (a login's answer can quote it)."""
    raw = getattr(exc, "smtp_error", b"")
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return " ".join(text.split())[:200]
