"""Integration fixtures: private stacks on spare ports, and the cached Apache Kafka jars.

Every test in this folder is marked ``integration`` (``pytest -m "not integration"`` runs the
fast suite alone).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from costline.streams import stack
from costline.streams.settings import Settings
from costline.streams.stack.maven import ensure_kafka_jars
from costline.streams.stack.process import ProcessRecord, is_running, read_record
from tests.conftest import unavailable
from tests.integration.redis_stores import redis_store  # noqa: F401 - a fixture
from tests.integration.redis_writer import redis_writer  # noqa: F401 - a fixture

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


def _libs_candidates() -> list[Path]:
    """Where jars may already be: the CI cache, the repo's stack, the user's state folder."""
    named = os.environ.get("COSTLINE_KAFKA_LIBS")
    folders = [Path(named)] if named else []
    folders += [Settings().state_dir / "kafka-libs", REPO / ".costline" / "ci" / "kafka-libs"]
    return folders


@pytest.fixture(scope="session")
def kafka_libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Apache Kafka jars, shared by every apache stack of the session (fetched once)."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            unavailable("Apache Kafka", f"{tool!r} is not installed")
    candidates = _libs_candidates()
    ready = [folder for folder in candidates if any(folder.glob("kafka_2.13-*.jar"))]
    libs = ready[0] if ready else candidates[0]
    log = tmp_path_factory.mktemp("maven") / "fetch.log"
    try:
        return ensure_kafka_jars(libs, log)
    except stack.StackError as exc:
        unavailable("Apache Kafka", str(exc))


def pids_of(state_dir: Path) -> list[ProcessRecord]:
    run = state_dir / "run"
    records = [read_record(path) for path in run.glob("*.pid")] if run.is_dir() else []
    return [record for record in records if record is not None]


StackUp = Callable[..., stack.StackInfo]


@pytest.fixture
def private_stack(tmp_path: Path) -> Iterator[tuple[Path, StackUp]]:
    """A stack of the test's own in a temporary state folder, on free ports.

    Yields the folder and an ``up(**options)`` function; whatever it started is taken down
    afterwards, and the test fails if any of its processes survived.
    """
    state_dir = tmp_path / "stack"
    seen: list[ProcessRecord] = []

    def up(**options: object) -> stack.StackInfo:
        options.setdefault("kafka_port", 0)
        options.setdefault("redis_port", 0)
        info = stack.up(state_dir, **options)  # type: ignore[arg-type]
        seen.extend(pids_of(state_dir))
        return info

    yield state_dir, up
    seen.extend(pids_of(state_dir))
    stack.down(state_dir)
    survivors = [record.pid for record in seen if is_running(record)]
    assert not survivors, f"processes left running after stack down: {survivors}"


@pytest.fixture(scope="session")
def apache_kafka(kafka_bootstrap: str) -> str:
    """The broker under test, when it is Apache Kafka: what a test of transactions needs.

    Other brokers are skipped (even under ``REQUIRE_SERVICES=1``, CI's broker being Apache
    Kafka): the embedded one gives consumers what a transaction aborted, which
    ``costline topics check`` reports, so such tests would only find that again.
    """
    from costline.connectors.kafka import broker_info

    info = broker_info(kafka_bootstrap)
    if not info.implementation.startswith("Apache Kafka"):
        pytest.skip(f"needs Apache Kafka; the broker under test is {info.describe()}")
    return kafka_bootstrap
