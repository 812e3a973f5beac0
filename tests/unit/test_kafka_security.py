"""The Kafka security settings: what each protocol gives the clients, and refusals that name
variables, never values."""

from __future__ import annotations

import faust
import pytest
from pydantic import ValidationError

from costline.connectors.kafka_security import KafkaSecurity
from costline.streams.settings import Settings

PASSWORD = "unit-Pw-5e0c9a3f71"


def refusal(**settings: object) -> str:
    with pytest.raises(ValidationError) as caught:
        Settings(**settings)  # type: ignore[arg-type]
    text = str(caught.value)
    assert PASSWORD not in text
    return text


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    security = Settings().kafka_security()
    assert security.client_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert security.faust_credentials() is None


def test_sasl_ssl_gives_every_client_the_same_context_and_credentials() -> None:
    settings = Settings(kafka_security_protocol="sasl_ssl", kafka_sasl_mechanism="scram-sha-512",
                        kafka_sasl_username="costline", kafka_sasl_password=PASSWORD)
    security = settings.kafka_security()
    kwargs = security.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("costline", PASSWORD)
    assert kwargs["ssl_context"].check_hostname
    credentials = security.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL" and credentials.ssl_context is not None
    assert PASSWORD not in repr(security) + repr(settings) + repr(credentials)


def test_sasl_plaintext_and_ssl_map_to_their_faust_credentials() -> None:
    sasl = KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="p")
    assert sasl.faust_credentials().protocol.value == "SASL_PLAINTEXT"
    assert "ssl_context" not in sasl.client_kwargs()
    tls = KafkaSecurity(protocol="SSL", ssl_check_hostname=False)
    assert isinstance(tls.faust_credentials(), faust.SSLCredentials)
    assert not tls.client_kwargs()["ssl_context"].check_hostname


def test_refusals_name_the_variables() -> None:
    assert "COSTLINE_KAFKA_SASL_USERNAME must be set" in refusal(
        kafka_security_protocol="SASL_SSL", kafka_sasl_password=PASSWORD)
    assert "COSTLINE_KAFKA_SASL_PASSWORD" in refusal(
        kafka_sasl_username="costline", kafka_sasl_password=PASSWORD)  # PLAINTEXT: unused
    assert "no such file /nonexistent/ca.pem" in refusal(
        kafka_security_protocol="SSL", kafka_ssl_cafile="/nonexistent/ca.pem")
    assert "need COSTLINE_KAFKA_SSL_CERTFILE" in refusal(
        kafka_security_protocol="SSL", kafka_ssl_key_password=PASSWORD)
    assert "Input should be" in refusal(kafka_security_protocol="TLS")


def test_redis_tls_options_need_rediss_and_existing_files() -> None:
    assert "need a rediss:// URL" in refusal(
        redis_url=f"redis://:{PASSWORD}@h/0?ssl_ca_certs=/etc/hosts")
    assert "no such file /nonexistent.pem" in refusal(
        redis_url=f"rediss://:{PASSWORD}@h/0?ssl_ca_certs=/nonexistent.pem")
    Settings(redis_url="rediss://h:6380/0?ssl_ca_certs=/etc/hosts&ssl_cert_reqs=required")
