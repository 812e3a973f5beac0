"""How costline connects to Kafka securely: TLS, SASL, or both, the same for every client.

One ``KafkaSecurity`` value describes the connection (Kafka's ``security.protocol``, the SASL
mechanism and credentials, the CA bundle and an optional client certificate) and turns it
into what each client library wants:

* ``client_kwargs()`` — keyword arguments that kafka-python (admin, producer, consumer) and
  aiokafka accept alike: both take a ready ``ssl_context``, so one context built here decides
  verification for all of them instead of two libraries' defaults;
* ``faust_credentials()`` — Faust's ``broker_credentials``, which faust-streaming maps to the
  same aiokafka arguments for its consumer, producer and topic creation;
* ``wrap()`` — TLS around the bare socket of the readiness probe. Kafka answers ApiVersions
  before SASL authentication, so the probe needs TLS but never the credentials.

Plain values only (no settings object), so ``connectors`` stays independent of ``streams``.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class KafkaSecurityError(ValueError):
    """The TLS material cannot be used (unreadable file, wrong key password, not PEM)."""


@dataclass(frozen=True)
class Protocol:
    """What one ``security.protocol`` value asks of the connection."""

    tls: bool
    sasl: bool


PROTOCOLS: dict[str, Protocol] = {
    "PLAINTEXT": Protocol(tls=False, sasl=False),
    "SSL": Protocol(tls=True, sasl=False),
    "SASL_PLAINTEXT": Protocol(tls=False, sasl=True),
    "SASL_SSL": Protocol(tls=True, sasl=True),
}
# OAUTHBEARER and GSSAPI need token providers or Kerberos: not offered.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaSecurity:
    """A Kafka connection's security; the default is PLAINTEXT (no TLS, no authentication).

    Passwords are kept out of ``repr`` so that logging this value never reveals them.
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise KafkaSecurityError(f"unknown Kafka security protocol {self.protocol!r}: "
                                     f"one of {', '.join(PROTOCOLS)}")
        if self.uses_sasl and self.sasl_mechanism not in SASL_MECHANISMS:
            raise KafkaSecurityError(f"unsupported SASL mechanism {self.sasl_mechanism!r}: "
                                     f"one of {', '.join(SASL_MECHANISMS)}")

    @property
    def uses_tls(self) -> bool:
        return PROTOCOLS[self.protocol].tls

    @property
    def uses_sasl(self) -> bool:
        return PROTOCOLS[self.protocol].sasl

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client-side TLS context, or None without TLS.

        aiokafka's helper gives TLS 1.2+, the CA bundle (the system's when none is named) and
        the client certificate; hostname checking can only be relaxed afterwards.
        """
        if not self.uses_tls:
            return None
        from aiokafka.helpers import create_ssl_context

        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile,
                password=self.ssl_key_password)
        except (OSError, ssl.SSLError) as exc:
            raise KafkaSecurityError(self._tls_failure(exc)) from None
        context.check_hostname = self.ssl_check_hostname
        return context

    def _tls_failure(self, exc: BaseException) -> str:
        """Which file could not be used, without the library's text (it never holds secrets,
        but names only OpenSSL internals)."""
        if self.ssl_certfile is not None:
            return (f"cannot load the Kafka client certificate {self.ssl_certfile} with key "
                    f"{self.ssl_keyfile or self.ssl_certfile} (not PEM, key not matching, or "
                    f"wrong key password): {type(exc).__name__}")
        return f"cannot load the Kafka CA bundle {self.ssl_cafile}: {type(exc).__name__}"

    def client_kwargs(self) -> dict[str, Any]:
        """Arguments for kafka-python's ``KafkaAdminClient``/``KafkaProducer``/``KafkaConsumer``
        and aiokafka's clients (the names are the same in both libraries)."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs.update(sasl_mechanism=self.sasl_mechanism,
                          sasl_plain_username=self.sasl_username,
                          sasl_plain_password=self.sasl_password)
        return kwargs

    def faust_credentials(self) -> Any:
        """Faust's ``broker_credentials``: None, ``SSLCredentials`` or ``SASLCredentials``.

        faust-streaming derives the protocol from the credentials' type (and, for SASL,
        from whether an ``ssl_context`` is given), so each protocol has its own builder.
        """
        return _FAUST_CREDENTIALS[self.protocol](self)

    def wrap(self, sock: socket.socket, host: str) -> socket.socket:
        """The probe's socket, inside TLS when the protocol asks for it."""
        context = self.ssl_context()
        if context is None:
            return sock
        return context.wrap_socket(sock, server_hostname=host)


def _no_credentials(_: KafkaSecurity) -> None:
    return None


def _ssl_credentials(security: KafkaSecurity) -> Any:
    import faust

    return faust.SSLCredentials(security.ssl_context())


def _sasl_credentials(security: KafkaSecurity) -> Any:
    import faust

    return faust.SASLCredentials(
        username=security.sasl_username, password=security.sasl_password,
        mechanism=security.sasl_mechanism, ssl_context=security.ssl_context())


_FAUST_CREDENTIALS: dict[str, Callable[[KafkaSecurity], Any]] = {
    "PLAINTEXT": _no_credentials,
    "SSL": _ssl_credentials,
    "SASL_PLAINTEXT": _sasl_credentials,  # no context: Faust picks SASL_PLAINTEXT
    "SASL_SSL": _sasl_credentials,
}

PLAINTEXT = KafkaSecurity()
