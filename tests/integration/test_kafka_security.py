"""TLS and SASL against real services: a private Apache Kafka with SASL_SSL, SASL_PLAINTEXT and
mutual-TLS listeners, and a private redis-server that speaks only TLS and wants a client
certificate. Certificates come from ``openssl`` in a temporary folder; SCRAM users are created
when the broker's log is formatted, PLAIN users in its JAAS configuration.

The worker aggregates over SASL_SSL (SCRAM-SHA-512) into Redis over TLS and ``costline spend``
shows the exact totals; wrong passwords and clients without TLS are refused, and no password
appears in anything costline printed or logged.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from costline.connectors.kafka import KafkaUnavailable, api_versions, consumer
from costline.connectors.kafka_security import KafkaSecurity
from costline.streams.stack import StackError
from costline.streams.stack.brokers import ApacheKafka, kafka_cluster_id
from costline.streams.stack.layout import Layout
from costline.streams.stack.process import free_port, spawn_detached, terminate, wait_until
from tests.conftest import unavailable
from tests.integration.streamkit import (
    REPO,
    Ledger,
    Worker,
    redis_answers,
    rows_by_group,
    run_cli,
    spend_json,
    usage_event,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
DAY = 1795824000  # 2026-11-28T00:00:00Z
AT = "2026-11-28T12:00:00Z"
# Distinctive, so that finding any 8 characters of one in an output means it leaked.
SCRAM_PASSWORD = "scram-Pw-7f3c91d2e8a4b6"
PLAIN_PASSWORD = "plain-Pw-0b5e2d8c17f94a"
KEY_PASSWORD = "key-Pw-93c0a7e15d2f68"
WRONG_PASSWORD = "wrong-Pw-6d1f0c8b2e7a94"
USER = "costline"


# -- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """A private CA, a server certificate for 127.0.0.1/localhost and a client certificate
    whose key is encrypted with ``KEY_PASSWORD``."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    @property
    def server_keystore(self) -> Path:
        """Key then certificate in one file: Kafka's PEM key store."""
        return self.folder / "server-keystore.pem"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"


def _openssl(folder: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def _signed(folder: Path, name: str, subject: str, extensions: str,
            key_options: tuple[str, ...] = ("-nodes",)) -> None:
    (folder / f"{name}.ext").write_text(extensions)
    _openssl(folder, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             *key_options, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
    _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext")


def make_certificates(folder: Path) -> Certificates:
    if shutil.which("openssl") is None:
        unavailable("TLS certificates", "'openssl' is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=costline test CA")
    _signed(folder, "server", "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
            "extendedKeyUsage=serverAuth,clientAuth\n")
    _signed(folder, "client", f"/CN={USER}", "extendedKeyUsage=clientAuth\n",
            key_options=("-passout", f"pass:{KEY_PASSWORD}"))
    certs = Certificates(folder)
    certs.server_keystore.write_text(certs.server_key.read_text() + certs.server_cert.read_text())
    return certs


# -- the broker -----------------------------------------------------------------------------


class SecureKafka(ApacheKafka):
    """The stack's Apache Kafka with three client listeners (ports ``port`` .. ``port+3``):

    * ``SASL_SSL`` on ``port``: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512;
    * ``MTLS`` (SSL, client certificate required) on ``port + 2``;
    * ``SASL_PLAINTEXT`` on ``port + 3``;

    the controller on ``port + 1`` and a loopback PLAINTEXT listener for the broker's own
    traffic on ``port + 4``. Not registered: ``costline stack`` never offers it.
    """

    name: ClassVar[str] = "secure-kafka"
    certs: Certificates

    def ports(self) -> tuple[int, ...]:
        return tuple(self.port + offset for offset in range(5))

    def listener(self, offset: int) -> str:
        return f"{self.host}:{self.port + offset}"

    def server_properties(self) -> str:
        settings = dict(line.split("=", 1) for line in super().server_properties().splitlines())
        listeners = {"SASL_SSL": 0, "CONTROLLER": 1, "MTLS": 2, "SASL_PLAINTEXT": 3,
                     "INTERNAL": 4}
        plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                 f'user_{USER}="{PLAIN_PASSWORD}";')
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        certs = self.certs
        settings.update({
            "listeners": ",".join(f"{name}://{self.listener(offset)}"
                                  for name, offset in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://{self.listener(offset)}"
                                             for name, offset in listeners.items()
                                             if name != "CONTROLLER"),
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT,"
                                              "MTLS:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                              "INTERNAL:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "listener.name.mtls.ssl.client.auth": "required",
        })
        for listener in ("sasl_ssl", "sasl_plaintext"):
            settings[f"listener.name.{listener}.plain.sasl.jaas.config"] = plain
            for mechanism in ("scram-sha-256", "scram-sha-512"):
                settings[f"listener.name.{listener}.{mechanism}.sasl.jaas.config"] = scram
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _format(self, java: str) -> None:
        """Format with the SCRAM users (Kafka 4 stores them in the metadata log)."""
        command = [
            java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", self._classpath(),
            "kafka.tools.StorageTool", "format", "-t", kafka_cluster_id(),
            "-c", str(self.properties),
            "--add-scram", f"SCRAM-SHA-256=[name={USER},password={SCRAM_PASSWORD}]",
            "--add-scram", f"SCRAM-SHA-512=[name={USER},password={SCRAM_PASSWORD}]",
        ]
        with self.log_file.open("ab") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=180)
        assert done.returncode == 0, f"formatting failed; see {self.log_file}"


@dataclass(frozen=True)
class Broker:
    kafka: SecureKafka
    certs: Certificates

    @property
    def sasl_ssl(self) -> str:
        return self.kafka.listener(0)

    @property
    def mtls(self) -> str:
        return self.kafka.listener(2)

    @property
    def sasl_plaintext(self) -> str:
        return self.kafka.listener(3)

    def env(self, protocol: str = "SASL_SSL", mechanism: str = "SCRAM-SHA-512",
            password: str = SCRAM_PASSWORD) -> dict[str, str]:
        """The ``COSTLINE_KAFKA_*`` variables of one way of connecting."""
        env = {"COSTLINE_KAFKA_SECURITY_PROTOCOL": protocol}
        if "SASL" in protocol:
            env.update(COSTLINE_KAFKA_SASL_MECHANISM=mechanism,
                       COSTLINE_KAFKA_SASL_USERNAME=USER, COSTLINE_KAFKA_SASL_PASSWORD=password)
        if "SSL" in protocol:
            env["COSTLINE_KAFKA_SSL_CAFILE"] = str(self.certs.ca)
        return env

    def security(self) -> KafkaSecurity:
        return KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                             sasl_username=USER, sasl_password=SCRAM_PASSWORD,
                             ssl_cafile=self.certs.ca)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(kafka_libs: Path, certs: Certificates,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A private Apache Kafka for this module, stopped afterwards."""
    state = tmp_path_factory.mktemp("secure-kafka")
    layout = Layout.of(state, kafka_libs)
    layout.create()
    kafka = SecureKafka(layout, HOST, free_port(HOST, span=5))
    kafka.certs = certs
    try:
        kafka.prepare()
    except StackError as exc:
        unavailable("Apache Kafka", str(exc))
    record = spawn_detached(kafka.argv(), cwd=kafka.data_dir, log=kafka.log_file)
    ready = Broker(kafka, certs)
    probe = KafkaSecurity(protocol="SSL", ssl_cafile=certs.ca)
    try:
        if not wait_until(lambda: _answers(ready.sasl_ssl, probe), 90, interval_s=0.2):
            pytest.fail(f"the SASL_SSL broker did not start; see {kafka.log_file}")
        yield ready
    finally:
        terminate([record])


def _answers(bootstrap: str, security: KafkaSecurity) -> bool:
    try:
        api_versions(bootstrap, timeout_s=1.0, security=security)
    except KafkaUnavailable:
        return False
    return True


# -- Redis over TLS -------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsRedis:
    port: int
    certs: Certificates

    def url(self, client_cert: bool = True) -> str:
        """A ``rediss://`` URL with redis-py's TLS parameters in its query."""
        query = f"ssl_ca_certs={self.certs.ca}&ssl_cert_reqs=required"
        if client_cert:
            # redis-py wants an unencrypted client key: the server's pair serves as one here.
            query += f"&ssl_certfile={self.certs.server_cert}&ssl_keyfile={self.certs.server_key}"
        return f"rediss://{HOST}:{self.port}/0?{query}"


@pytest.fixture(scope="module")
def tls_redis(certs: Certificates, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[TlsRedis]:
    """A redis-server with no plain port, only TLS, requiring a client certificate."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server", "not installed")
    port = free_port(HOST)
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", HOST,
         "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
         "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "yes",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path_factory.mktemp("redis"))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = TlsRedis(port, certs)
    try:
        if not redis_answers(server.url(), 10):
            unavailable("redis-server with TLS", "it did not answer over TLS (built without "
                        "TLS support?)")
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- helpers --------------------------------------------------------------------------------


def leaked(text: str, *secrets: str) -> list[str]:
    """Every 8-character piece of a secret found in ``text``."""
    return [secret[i:i + 8] for secret in secrets for i in range(len(secret) - 7)
            if secret[i:i + 8] in text]


def costline(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = run_cli(env, *args, timeout=90)
    assert not leaked(done.stdout + done.stderr, SCRAM_PASSWORD, PLAIN_PASSWORD,
                      KEY_PASSWORD, WRONG_PASSWORD)
    return done


def events_file(folder: Path, count: int) -> tuple[Path, Ledger]:
    rng = random.Random(11)
    ledger = Ledger()
    lines = []
    for i in range(count):
        event = usage_event(rng, f"s{i}", DAY + rng.randrange(86400))
        ledger.count(event)
        lines.append(json.dumps(event))
    path = folder / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, ledger


def input_ends(broker: Broker, topic: str) -> dict[int, int]:
    from kafka import TopicPartition

    client = consumer(broker.sasl_ssl, security=broker.security())
    try:
        parts = client.partitions_for_topic(topic) or set()
        ends = client.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        client.close()


class DebugWorker(Worker):
    """The worker at its most talkative: a password must not be in its debug log either."""

    def start(self) -> None:
        self.starts += 1
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "costline.streams", "worker", "--loglevel", "debug"],
            cwd=REPO, env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True)


# -- tests ----------------------------------------------------------------------------------


def test_worker_aggregates_over_sasl_ssl_into_redis_over_tls(
        broker: Broker, tls_redis: TlsRedis, namespace: str, tmp_path: Path) -> None:
    """topics create, produce, the worker and spend: SCRAM-SHA-512 over TLS to Kafka, TLS with a
    client certificate to Redis; exact totals, and the password in no output or log."""
    env = worker_env(namespace, broker.sasl_ssl, tls_redis.url(), **broker.env())
    created = costline(env, "topics", "create", "--json")
    assert created.returncode == 0, created.stderr
    assert len(json.loads(created.stdout)["created"]) == 6  # inputs, ledger, outputs

    path, ledger = events_file(tmp_path, 400)
    sent = costline(env, "produce", "--batch", "20", "--json", str(path))
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["sent_events"] == 400

    worker = DebugWorker(env, tmp_path / "worker.log")
    worker.start()
    try:
        wait_caught_up(worker.env, worker, timeout=120)
        for by in ((), ("team",), ("team", "env")):
            args = ["--period", "day", "--at", AT] + (["--by", ",".join(by)] if by else [])
            report = spend_json(env, *args)
            expected = ledger.total("cost", by, {}, DAY, DAY + 86400)
            assert rows_by_group(report, by, "cost") == {k: v for k, v in expected.items() if v}
    finally:
        worker.stop()
    log = worker.log.read_text(errors="replace")
    assert not leaked(log, SCRAM_PASSWORD, KEY_PASSWORD), "a password is in the worker's log"


@pytest.mark.parametrize("way", ["PLAIN over SASL_SSL", "SCRAM-SHA-256 over SASL_PLAINTEXT",
                                 "mutual TLS with an encrypted key"])
def test_every_protocol_and_mechanism_connects(broker: Broker, namespace: str, way: str) -> None:
    envs = {
        "PLAIN over SASL_SSL": (broker.sasl_ssl,
                                broker.env(mechanism="PLAIN", password=PLAIN_PASSWORD)),
        "SCRAM-SHA-256 over SASL_PLAINTEXT": (
            broker.sasl_plaintext, broker.env("SASL_PLAINTEXT", "SCRAM-SHA-256")),
        "mutual TLS with an encrypted key": (broker.mtls, {
            **broker.env("SSL"), "COSTLINE_KAFKA_SSL_CERTFILE": str(broker.certs.client_cert),
            "COSTLINE_KAFKA_SSL_KEYFILE": str(broker.certs.client_key),
            "COSTLINE_KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD}),
    }
    bootstrap, security = envs[way]
    done = costline(worker_env(namespace, bootstrap, "redis://127.0.0.1:1/0", **security),
                    "topics", "create", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["created"]) == 6  # inputs, ledger, outputs


def test_a_wrong_password_is_refused_clearly(broker: Broker, namespace: str,
                                             tmp_path: Path) -> None:
    env = worker_env(namespace, broker.sasl_ssl, "redis://127.0.0.1:1/0",
                     **broker.env(password=WRONG_PASSWORD))
    done = costline(env, "topics", "create")
    assert done.returncode == 1
    assert f"refused the login of '{USER}' (SCRAM-SHA-512)" in done.stderr, done.stderr
    assert "authentication failed" in done.stderr.lower(), done.stderr

    path, _ = events_file(tmp_path, 3)
    sent = costline(env, "produce", str(path))
    assert sent.returncode == 2
    assert "authentication failed" in sent.stderr.lower(), sent.stderr


def test_clients_without_tls_or_a_certificate_are_refused(broker: Broker, namespace: str) -> None:
    plain = worker_env(namespace, broker.sasl_ssl, "redis://127.0.0.1:1/0",
                       COSTLINE_KAFKA_SECURITY_PROTOCOL="PLAINTEXT")
    done = costline(plain, "topics", "create")
    assert done.returncode == 1 and "no Kafka broker answered" in done.stderr, done.stderr

    untrusted = {**broker.env(), "COSTLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}
    del untrusted["COSTLINE_KAFKA_SSL_CAFILE"]  # the system's CAs do not know the private one
    done = costline(worker_env(namespace, broker.sasl_ssl, "redis://127.0.0.1:1/0",
                               **untrusted), "topics", "create")
    assert done.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr

    no_certificate = worker_env(namespace, broker.mtls, "redis://127.0.0.1:1/0",
                                **broker.env("SSL"))
    done = costline(no_certificate, "topics", "create")
    assert done.returncode == 1, done.stdout


def test_incomplete_settings_name_the_missing_variable(broker: Broker, namespace: str) -> None:
    env = worker_env(namespace, broker.sasl_ssl, "redis://127.0.0.1:1/0", **broker.env())
    del env["COSTLINE_KAFKA_SASL_USERNAME"]
    done = costline(env, "topics", "create")
    assert done.returncode == 2
    assert "COSTLINE_KAFKA_SASL_USERNAME must be set" in done.stderr, done.stderr

    env = worker_env(namespace, broker.sasl_ssl, "redis://127.0.0.1:1/0",
                     **{**broker.env(), "COSTLINE_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"})
    done = costline(env, "topics", "create")
    assert done.returncode == 2 and "no such file /nonexistent/ca.pem" in done.stderr

    env = worker_env(namespace, broker.mtls, "redis://127.0.0.1:1/0", **{
        **broker.env("SSL"), "COSTLINE_KAFKA_SSL_CERTFILE": str(broker.certs.client_cert),
        "COSTLINE_KAFKA_SSL_KEYFILE": str(broker.certs.client_key),
        "COSTLINE_KAFKA_SSL_KEY_PASSWORD": WRONG_PASSWORD})
    done = costline(env, "topics", "create")
    assert done.returncode == 2 and "wrong key password" in done.stderr, done.stderr


def test_redis_over_tls_needs_tls_and_the_client_certificate(
        tls_redis: TlsRedis, namespace: str) -> None:
    env = worker_env(namespace, "127.0.0.1:1", tls_redis.url())
    report = spend_json(env, "--period", "day", "--at", AT)
    assert report["rows"] == []

    for url in (f"redis://{HOST}:{tls_redis.port}/0", tls_redis.url(client_cert=False)):
        done = costline(worker_env(namespace, "127.0.0.1:1", url), "spend", "--json")
        assert done.returncode != 0, url
