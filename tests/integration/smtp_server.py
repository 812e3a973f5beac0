"""A real SMTP server on loopback (aiosmtpd, from PyPI) that requires TLS and a login, and
keeps what it receives for the tests to parse.

``starttls``: a plain connection that must be upgraded before AUTH and MAIL; ``tls``: TLS from
the first byte (SMTPS). The certificate is a fresh self-signed one for 127.0.0.1, made with
``openssl``; the client trusts it through ``COSTLINE_SMTP_CA_FILE``.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from tests.conftest import unavailable
from tests.integration.streamkit import free_port

USER, PASSWORD = "costline", "smtp-pass-4e7a"


@dataclass(frozen=True)
class Received:
    recipients: list[str]
    message: EmailMessage


@dataclass
class Mailbox:
    """What the server took, and what it is to answer next."""

    received: list[Received] = field(default_factory=list)
    delay_s: float = 0.0
    answers: list[str] = field(default_factory=list)
    """Answers to the next DATA commands instead of 250 (``451 ...``, ``554 ...``)."""
    logins: list[tuple[str, bool]] = field(default_factory=list)

    def by_id(self) -> dict[str, list[Received]]:
        found: dict[str, list[Received]] = {}
        for item in self.received:
            found.setdefault(str(item.message["Message-ID"]), []).append(item)
        return found


class _Handler:
    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.mailbox.delay_s:
            await asyncio.sleep(self.mailbox.delay_s)
        if self.mailbox.answers:
            return self.mailbox.answers.pop(0)
        message = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(message, EmailMessage)
        self.mailbox.received.append(Received(list(envelope.rcpt_tos), message))
        return "250 2.0.0 OK"


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    cert, key = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    try:
        done = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        unavailable("openssl", "not installed")
    assert done.returncode == 0, done.stderr
    return cert, key


@contextmanager
def smtp_server(folder: Path, security: str, mailbox: Mailbox, password: str = PASSWORD
                ) -> Iterator[tuple[int, Path]]:
    """An SMTP server requiring ``security`` and a login (``USER``, ``password``); yields its
    port and its CA file."""
    try:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword
    except ImportError:
        unavailable("aiosmtpd", "not installed (pip install aiosmtpd)")
    cert, key = certificate(folder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str,
                     data: Any) -> Any:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            USER.encode(), password.encode())
        mailbox.logins.append((mechanism, ok))
        return AuthResult(success=ok, handled=False)  # not handled: the server answers 535

    options: dict[str, Any] = {"authenticator": authenticate, "auth_required": True}
    if security == "tls":
        # TLS from the first byte; aiosmtpd only counts a STARTTLS upgrade as TLS for AUTH.
        options.update(ssl_context=context, auth_require_tls=False)
    else:
        options.update(tls_context=context, require_starttls=True)
    port = free_port()
    controller = Controller(_Handler(mailbox), hostname="127.0.0.1", port=port, **options)
    controller.start()
    try:
        yield port, cert
    finally:
        controller.stop()
